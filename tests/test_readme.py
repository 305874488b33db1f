"""The README as a user's first read: its quickstarts are the sample files a test runs, it stays
short and readable, and every link of it and of docs/ leads somewhere, as does every reference to
one of their sections in the code ("README, \"Section\"").

Fast and offline: files are read, nothing is started (the samples run in test_node_process.py,
test_sdk_integration.py and test_typescript_sdk.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

LINE_CHARS_MAX = 110
README_LINES_MAX = 950

# The quickstarts' files, in the fence language the README shows them in.
QUICKSTART_FILES = {
    ROOT / "tests" / "quickstart" / "producer.py": "python",
    ROOT / "tests" / "quickstart" / "worker.py": "python",
    ROOT / "sdk" / "typescript" / "samples" / "quickstart" / "producer.ts": "ts",
    ROOT / "sdk" / "typescript" / "samples" / "quickstart" / "worker.ts": "ts",
}

FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```$", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")
# `README, "Set up"`, `README "TLS"`, `the README's "A compiled core"`, `docs/tls.md, "A cluster over TLS"`.
SECTION_REFERENCE = re.compile(r"""(?<![\w/])(README(?:\.md)?|docs/[\w-]+\.md)(?:'s)?,? "([^"\n]+)\"""")
# Where such references live: code, scripts, tests, docs (not the built console, nor vendored trees).
REFERENCE_SUFFIXES = {".py", ".md", ".sh", ".ts", ".tsx", ".toml", ".yml", ".yaml", ".txt", ""}
SKIPPED_PARTS = {".git", ".venv", "node_modules", "static", "dist", "build", "__pycache__"}


def blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced code block as (language, content)."""
    return [(match[1], match[2]) for match in FENCE.finditer(text)]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    found, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            found.append((number, line))
    return found


def long_lines(text: str) -> list[str]:
    return [f"{number}: {len(line)} characters" for number, line in prose_lines(text) if len(line) > LINE_CHARS_MAX]


def headings(text: str) -> list[str]:
    return [line.lstrip("#").strip() for _, line in prose_lines(text) if re.match(r"#{1,6} ", line)]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(text):
        slug = anchor(heading)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(path: Path, text: str) -> list[str]:
    """Relative links of a Markdown file whose file, or whose heading, does not exist."""
    problems = []
    for _, line in prose_lines(text):
        for target in LINK.findall(line):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not ours to check
            file_part, _, fragment = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                problems.append(f"{path.relative_to(ROOT)}: {target}: no such file")
            elif fragment and linked.suffix == ".md" and fragment not in anchors(linked.read_text()):
                problems.append(f"{path.relative_to(ROOT)}: {target}: no such heading")
    return problems


def missing_sections(source: str, text: str, documents: dict[str, str]) -> list[str]:
    """References like `README, "Set up"` in text whose document has no heading starting so."""
    problems = []
    for document, section in SECTION_REFERENCE.findall(text):
        name = "README.md" if document.startswith("README") else document
        if name not in documents:
            problems.append(f"{source}: {document}, {section!r}: no such file")
        elif not any(heading.startswith(section) for heading in headings(documents[name])):
            problems.append(f"{source}: {document}, {section!r}: no such heading")
    return problems


def test_the_readme_quickstarts_are_the_sample_files_verbatim() -> None:
    readme = README.read_text()
    shown = blocks(readme)
    for path, language in QUICKSTART_FILES.items():
        assert (language, path.read_text()) in shown, f"README does not show {path.relative_to(ROOT)} as it is"
        assert f"`{path.parent.relative_to(ROOT)}/`" in readme, f"README does not name {path.parent}"
    # A copy that drifts by one line is caught.
    sample = next(iter(QUICKSTART_FILES))
    drifted = readme.replace(sample.read_text(), sample.read_text().replace("flush=True", "flush=False", 1))
    assert ("python", sample.read_text()) not in blocks(drifted)


def test_no_readme_line_outside_code_is_over_110_characters() -> None:
    readme = README.read_text()
    assert long_lines(readme) == []
    assert long_lines(readme + "\n" + "x" * (LINE_CHARS_MAX + 1) + "\n")
    assert not long_lines(readme + "\n```sh\n" + "x" * (LINE_CHARS_MAX + 1) + "\n```\n")


def test_the_readme_stays_a_first_read() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_LINES_MAX, f"README.md has {lines} lines: move reference material into docs/"


def test_every_link_of_the_readme_the_changelog_and_docs_leads_somewhere() -> None:
    problems = []
    for path in [README, ROOT / "CHANGELOG.md", *DOCS]:
        problems += broken_links(path, path.read_text())
    assert problems == []
    assert broken_links(README, "[a](docs/no-such-file.md) [b](docs/limits.md#no-such-heading)") == [
        "README.md: docs/no-such-file.md: no such file",
        "README.md: docs/limits.md#no-such-heading: no such heading",
    ]
    assert broken_links(README, "[c](docs/limits.md#what-a-task-costs) [d](#set-up)") == []


def test_every_reference_to_a_section_names_a_heading() -> None:
    documents = {"README.md": README.read_text()} | {f"docs/{path.name}": path.read_text() for path in DOCS}
    problems = []
    for path in ROOT.rglob("*"):
        relative = path.relative_to(ROOT)
        if SKIPPED_PARTS & set(relative.parts) or not path.is_file() or path.suffix not in REFERENCE_SUFFIXES:
            continue
        if path == Path(__file__):
            continue  # its own examples
        if path.suffix == "" and path.name not in {"Dockerfile", "run"}:
            continue
        problems += missing_sections(str(relative), path.read_text(errors="replace"), documents)
    assert problems == []
    assert missing_sections("x.py", 'see README, "Benchmarks"', documents) == [
        "x.py: README, 'Benchmarks': no such heading"
    ]
    assert missing_sections("x.py", 'see docs/tls.md, "A cluster over TLS"', documents) == []
    assert missing_sections("x.py", 'see docker/README.md, "TLS"', documents) == []  # not ours
