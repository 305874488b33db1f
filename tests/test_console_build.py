"""The console's committed build is what its sources give: `npm ci && npm run build` in a copy of
console/ writes the same bytes as runstate_server/console/static/ (rebuild and commit after
changing console/src). Node.js 20 or later with npm."""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

from tests._typescript import ROOT, run_npm

CONSOLE = ROOT / "console"
STATIC = ROOT / "runstate_server" / "console" / "static"
BUILT_FILES = ("index.html", "app.js", "app.css")


def _build_copy(run_temp: Path) -> Path:
    """console/ copied (without node_modules) and built into a folder of its own, once per test
    run, under a lock every worker of the run shares."""
    with open(run_temp / "console-build.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        copy, out = run_temp / "console-src", run_temp / "console-built"
        if not (out / "app.js").exists():
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(CONSOLE, copy, ignore=shutil.ignore_patterns("node_modules"))
            run_npm("ci", cwd=copy)
            run_npm("run", "build", "--", str(out), cwd=copy)
    return out


def test_the_committed_build_is_what_the_sources_give(run_temp: Path) -> None:
    out = _build_copy(run_temp)
    assert sorted(path.name for path in out.iterdir()) == sorted(BUILT_FILES)
    assert sorted(path.name for path in STATIC.iterdir()) == sorted(BUILT_FILES)
    stale = [name for name in BUILT_FILES if (out / name).read_bytes() != (STATIC / name).read_bytes()]
    assert stale == [], f"runstate_server/console/static/{stale} differ from a build of console/: run `cd console && npm ci && npm run build` and commit"
    app = (out / "app.js").read_text()
    assert "sourceMappingURL" not in app and "localStorage.setItem" not in app
