"""The TypeScript SDK's package (sdk/typescript) for the tests: npm, and its build once per session
(`npm ci` installs the lockfile's dev dependencies, `npm run build` writes dist/)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sdk" / "typescript"
NPM_TIMEOUT_S = 300.0  # npm ci downloads the dev dependencies on a cold cache


def npm() -> str:
    found = shutil.which("npm")
    assert found is not None, "npm is needed for the TypeScript SDK's tests (Node.js 20 or later)"
    return found


def run_npm(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [npm(), *args], cwd=cwd, capture_output=True, text=True, timeout=NPM_TIMEOUT_S,
        env={**os.environ, "NO_UPDATE_NOTIFIER": "1", "npm_config_fund": "false", "npm_config_audit": "false"},
    )
    assert done.returncode == 0, f"npm {' '.join(args)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def build_package(shared: Path) -> Path:
    """sdk/typescript with its dev dependencies installed and dist/ built from its sources, once
    per test run: `shared` is a folder every worker of the run sees; the first builds under its
    lock and leaves a mark there, the others wait on the lock and find the mark."""
    with open(shared / "typescript-build.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = shared / "typescript-built"
        if not built.exists():
            run_npm("ci", cwd=PACKAGE)
            run_npm("run", "build", cwd=PACKAGE)
            built.touch()
    return PACKAGE
