"""ruff and mypy run with the tests, so CI and a new user's test command both run them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
LINT_TIMEOUT_S = 300


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=LINT_TIMEOUT_S
    )


def test_ruff() -> None:
    finished = run_tool("ruff", "check", "runstate_server", "sdk/python", "tests", "bench", "chaos")
    assert finished.returncode == 0, finished.stdout + finished.stderr


def test_mypy() -> None:
    finished = run_tool("mypy", "runstate_server", "sdk/python/runstate", "chaos", "bench")
    assert finished.returncode == 0, finished.stdout + finished.stderr


# The layers, lowest first: a module of a layer imports nothing of a layer above it. The node's
# process (Node, routing, ticker, ...) sits below its HTTP API; cli.py, the entry point that wires
# them together, is the one exception.
LAYERS = (
    ("runstate_server/actors", ("runstate_server.cluster", "runstate_server.node")),
    ("runstate_server/cluster", ("runstate_server.node",)),
    ("runstate_server/node", ("runstate_server.node.api",)),
)
LAYER_EXCEPTIONS = {"runstate_server/node/cli.py"}


def imported_modules(path: Path) -> set[str]:
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_no_layer_imports_a_layer_above_it() -> None:
    broken = []
    for folder, above in LAYERS:
        for path in sorted((ROOT / folder).glob("*.py")):  # the folder itself, not its subpackages
            relative = str(path.relative_to(ROOT))
            if relative in LAYER_EXCEPTIONS:
                continue
            for module in imported_modules(path):
                if module.startswith(above):
                    broken.append(f"{relative} imports {module}")
    assert not broken, broken


def test_the_core_never_iterates_a_set_it_builds() -> None:
    """Every node applies the same commands to the same state, so the core must do the same steps
    in the same order: a set of strings iterates in an order that differs between processes (hash
    randomization), so `for x in {...}` in runstate_server/actors/ could make nodes tell events, or
    fill lists, in different orders. Iterate a list or `dict.fromkeys(...)` instead."""
    found = []
    for path in sorted((ROOT / "runstate_server" / "actors").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            iterables = [node.iter] if isinstance(node, (ast.For, ast.comprehension)) else []
            for iterable in iterables:
                if isinstance(iterable, (ast.Set, ast.SetComp)) or (
                    isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name)
                    and iterable.func.id in ("set", "frozenset")
                ):
                    found.append(f"{path.relative_to(ROOT)}:{iterable.lineno}")
    assert not found, found


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    """CI runs exactly what the README tells a new user to run (installs included)."""
    root = Path(__file__).resolve().parent.parent
    command = (root / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert "pytest" in command and "apt-get install" in command
    assert command in (root / "README.md").read_text().splitlines()
