"""The lock (README, "Dependencies and the lock"): requirements/*.txt pin every dependency of
pyproject.toml within its range, for every Python the project supports, each with its files'
hashes; the README's set-up commands, .ci/run and the Dockerfile install from it.

Fast and offline: the files are read, nothing is installed (the README's commands install them).
Each check returns what it found wrong, and the `test_*_catches_*` tests show it finds each fault."""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SDK_PYPROJECT = tomllib.loads((ROOT / "sdk" / "python" / "pyproject.toml").read_text())
README = (ROOT / "README.md").read_text()

BUILD = PYPROJECT["build-system"]["requires"]
RUNTIME = PYPROJECT["project"]["dependencies"] + SDK_PYPROJECT["project"]["dependencies"]
DEV = PYPROJECT["project"]["optional-dependencies"]["dev"]
# What each lock file must hold: the build requirements are in all three, so that the project's own
# editable installs (--no-build-isolation) and pysyncobj's build (an sdist) fetch nothing unlocked.
LOCKS = {"build.txt": BUILD, "server.txt": RUNTIME + BUILD, "dev.txt": RUNTIME + DEV + BUILD}
# The Pythons the lock must serve (requires-python >= 3.10), on the platforms we run on.
ENVIRONMENTS = [
    {"python_version": f"3.{minor}", "python_full_version": f"3.{minor}.0", "sys_platform": platform,
     "platform_system": system, "os_name": os_name, "implementation_name": "cpython",
     "platform_python_implementation": "CPython", "platform_machine": "x86_64"}
    for minor in (10, 11, 12, 13, 14)
    for platform, system, os_name in (("linux", "Linux", "posix"), ("darwin", "Darwin", "posix"), ("win32", "Windows", "nt"))
]


@dataclass(frozen=True)
class Pin:
    name: str  # canonical
    version: str
    marker: Marker | None
    hashes: tuple[str, ...]

    def applies(self, environment: dict[str, str]) -> bool:
        return self.marker is None or self.marker.evaluate(environment)


PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)\s*(?:;\s*(?P<marker>[^\\]+?))?\s*$")


def parse_lock(text: str) -> tuple[list[Pin], list[str]]:
    """The pins of a requirements file (continuation lines joined), and the lines that are no pin."""
    pins, problems = [], []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if not line:
            continue
        words = line.split(" --hash=")
        match = PIN.match(words[0].strip())
        if not match:
            problems.append(f"not an exact pin: {line[:80]!r}")
            continue
        hashes = tuple(word.strip() for word in words[1:])
        pins.append(Pin(canonicalize_name(match["name"]), match["version"],
                        Marker(match["marker"]) if match["marker"] else None, hashes))
    return pins, problems


def lock_problems(text: str, requirements: list[str]) -> list[str]:
    """What is wrong with a lock file's text for these requirements (pyproject's strings)."""
    pins, problems = parse_lock(text)
    for pin in pins:
        if not pin.hashes or not all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in pin.hashes):
            problems.append(f"{pin.name}=={pin.version}: no sha256 hash")
    for text_requirement in requirements:
        requirement = Requirement(text_requirement)
        name = canonicalize_name(requirement.name)
        for environment in ENVIRONMENTS:
            if requirement.marker and not requirement.marker.evaluate(environment):
                continue
            applying = [pin for pin in pins if pin.name == name and pin.applies(environment)]
            where = f"Python {environment['python_version']} on {environment['sys_platform']}"
            if len(applying) != 1:
                problems.append(f"{name}: {len(applying)} pins apply on {where}, not 1")
            elif not requirement.specifier.contains(Version(applying[0].version), prereleases=True):
                problems.append(f"{name}=={applying[0].version} is outside {text_requirement!r} ({where})")
    return sorted(set(problems))


def lock_text(name: str) -> str:
    return (REQUIREMENTS / name).read_text()


@pytest.mark.parametrize("name", sorted(LOCKS))
def test_each_lock_pins_every_dependency_within_its_range_with_hashes(name: str) -> None:
    assert lock_problems(lock_text(name), LOCKS[name]) == []


def test_the_three_locks_agree_on_every_version() -> None:
    dev = {(pin.name, pin.marker and str(pin.marker)): pin for pin in parse_lock(lock_text("dev.txt"))[0]}
    for name in ("build.txt", "server.txt"):
        for pin in parse_lock(lock_text(name))[0]:
            same = [p for p in dev.values() if p.name == pin.name and p.version == pin.version]
            assert same, f"{name}: {pin.name}=={pin.version} is not dev.txt's"
            assert set(pin.hashes) == set(same[0].hashes), f"{name}: {pin.name}'s hashes are not dev.txt's"


def test_lock_check_catches_a_missing_hash_a_version_out_of_range_and_a_missing_dependency() -> None:
    text = lock_text("dev.txt")
    assert lock_problems(text, LOCKS["dev.txt"]) == []
    aiohttp = next(pin for pin in parse_lock(text)[0] if pin.name == "aiohttp")
    # A pin without its hashes.
    unhashed = re.sub(r"(aiohttp==\S+)( \\\n\s+--hash=\S+)+", r"\1", text)
    assert any("aiohttp" in p and "hash" in p for p in lock_problems(unhashed, LOCKS["dev.txt"]))
    # A version that the range does not allow.
    newer = text.replace(f"aiohttp=={aiohttp.version}", "aiohttp==3.15.0")
    assert any("aiohttp==3.15.0 is outside" in p for p in lock_problems(newer, LOCKS["dev.txt"]))
    # A dependency that pyproject.toml gained and the lock lacks.
    assert any(p.startswith("left-pad: 0 pins") for p in lock_problems(text, [*LOCKS["dev.txt"], "left-pad>=1"]))
    # A dependency only for old Pythons, locked for none of them.
    no_tomli = re.sub(r"(?m)^tomli==.*(\n {4}.*)*", "", text)
    assert any(p.startswith("tomli: 0 pins apply on Python 3.10") for p in lock_problems(no_tomli, RUNTIME))
    # A line that is no exact pin.
    assert any("not an exact pin" in p for p in lock_problems(text + "\nrequests>=2\n", []))


# -- where the lock is installed -------------------------------------------------------------------


def set_up_commands() -> list[str]:
    """The README's two set-up commands: the sh blocks of its "Set up" section that install (the
    TLS way's block beside them makes certificates only), dev node first."""
    section = README.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S) if "pip install" in block]


def ci_command() -> str:
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    return lines[-1].strip()


def pip_installs(command: str) -> list[list[str]]:
    """The arguments of each `pip install` in a shell command, up to the end of that command."""
    found = []
    for match in re.finditer(r"(?:^|[\s/])pip\s+install\s([^&;|\n)]*)", re.sub(r"\\\n", " ", command)):
        try:
            found.append(shlex.split(match[1]))
        except ValueError:  # a quote closed past this command's end
            found.append(match[1].split())
    return found


def mutated(text: str, old: str, new: str) -> str:
    """text with old replaced: a check's fault, which must be there to be put in."""
    assert old in text, old
    return text.replace(old, new)


def install_problems(command: str, lock: str) -> list[str]:
    """A set-up command installs build.txt, then `lock` (both hashed), then the local packages
    without dependencies or build isolation; it installs nothing else."""
    installs = pip_installs(command)
    expected = [
        ["--require-hashes", "-r", "requirements/build.txt"],
        ["--require-hashes", "--no-build-isolation", "-r", f"requirements/{lock}"],
        ["--no-deps", "--no-build-isolation", "-e", ".", "-e", "./sdk/python"],
    ]
    return [] if installs == expected else [f"installs {installs}, not {expected}"]


def test_the_readme_set_up_commands_install_from_the_lock() -> None:
    dev_node, tests = set_up_commands()
    assert dev_node.endswith(".venv/bin/runstate dev") and tests.endswith(".venv/bin/python -m pytest")
    assert install_problems(dev_node, "server.txt") == []
    assert install_problems(tests, "dev.txt") == []


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    assert ci_command() == set_up_commands()[1]


def readme_install_problems(readme: str) -> list[str]:
    """Every sh block's pip install is of a lock file (hashed) or without dependencies."""
    problems = []
    for block in re.findall(r"```sh\n(.*?)```", readme, re.S):
        for args in pip_installs(block):
            hashed = "--require-hashes" in args and "-r" in args and args[args.index("-r") + 1].startswith("requirements/")
            if not (hashed or "--no-deps" in args):
                problems.append(f"pip install {' '.join(args)}")
    return problems


def test_every_readme_command_that_installs_the_project_uses_the_lock() -> None:
    assert readme_install_problems(README) == []


def test_install_checks_catch_an_unlocked_install_and_a_ci_that_differs() -> None:
    dev_node, tests = set_up_commands()
    assert install_problems(mutated(dev_node, "--no-deps ", ""), "server.txt")
    assert install_problems(mutated(tests, "--require-hashes --no-build-isolation -r requirements/dev.txt", "-e '.[dev]'"), "dev.txt")
    assert install_problems(mutated(tests, "--require-hashes -r requirements/build.txt", "setuptools"), "dev.txt")
    assert install_problems(tests, "server.txt")
    assert install_problems("python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/runstate dev", "server.txt")
    assert ci_command() != mutated(tests, "dev.txt", "server.txt")
    unlocked = "```sh\npython3 -m venv .venv && .venv/bin/pip install -e '.[dev]'\n```"
    assert readme_install_problems(README + unlocked) and not readme_install_problems(README)


# -- the Docker image ------------------------------------------------------------------------------


def dockerfile_runs() -> list[str]:
    text = (ROOT / "docker" / "Dockerfile").read_text()
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [line.strip()[4:] for line in joined.splitlines() if line.strip().upper().startswith("RUN ")]


def dockerfile_problems(runs: list[str]) -> list[str]:
    installs = [args for run in runs for args in pip_installs(run)]
    server = [args for args in installs if "requirements/server.txt" in args]
    problems = []
    if not server or not all("--require-hashes" in args and args[args.index("-r") + 1] == "requirements/server.txt" for args in server):
        problems.append(f"requirements/server.txt is not installed with --require-hashes: {installs}")
    for args in installs:
        if "-r" not in args and "--no-deps" not in args:
            problems.append(f"an install that resolves dependencies outside the lock: {args}")
    return problems


def test_the_dockerfile_installs_the_server_lock_with_hashes() -> None:
    runs = dockerfile_runs()
    assert dockerfile_problems(runs) == []
    joined = "\n".join(runs)
    unhashed = mutated(joined, "--require-hashes --no-build-isolation -r requirements/server.txt", "--no-build-isolation -r requirements/server.txt")
    assert dockerfile_problems(unhashed.split("\n"))
    assert dockerfile_problems(mutated(joined, "--no-deps", "").split("\n"))
    assert dockerfile_problems([run for run in runs if "requirements/server.txt" not in run])
