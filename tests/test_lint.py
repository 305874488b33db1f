"""ruff and mypy run with the tests, so CI and a new user's test command both run them."""

from __future__ import annotations

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
    finished = run_tool("mypy", "runstate_server", "sdk/python/runstate", "chaos")
    assert finished.returncode == 0, finished.stdout + finished.stderr
