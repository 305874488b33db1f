"""The published clients' own integration tests against our server: `runstate-sdk` 0.2.0 and 0.3.0
(PyPI) are downloaded when this runs (compat/realsdk/run.sh; nothing of theirs is in the project)
and run against a fresh `runstate dev --auth` of this checkout. Every test listed in
compat/realsdk/expected.txt must pass, so a change that breaks a real client fails here.

The long form also runs them against a three-node cluster: RUNSTATE_REALSDK_CLUSTER=1 (or by
hand: `bash compat/realsdk/cluster.sh 0.3.0`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMPAT = ROOT / "compat" / "realsdk"
VERSIONS = ("0.2.0", "0.3.0")
RUN_TIMEOUT_S = 900  # one release's tests, the download and its venv included
TARGETS = ("dev", "cluster") if os.environ.get("RUNSTATE_REALSDK_CLUSTER") == "1" else ("dev",)

pytestmark = pytest.mark.slow


def expected(version: str) -> set[str]:
    """`file::test` names that must pass for `version` (lines `VERSION file::test` of expected.txt)."""
    names = set()
    for line in (COMPAT / "expected.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            line_version, name = line.split()
            if line_version == version:
                names.add(name)
    return names


def outcomes(runs: Path) -> dict[str, str]:
    """`file::test` -> outcome, from the results.tsv of the one run under `runs`."""
    (results,) = runs.glob("run-*/results.tsv")
    table = {}
    for row in results.read_text().splitlines():
        file, test, outcome, _message = (row.split("\t") + [""])[:4]
        table[f"{file}::{test}"] = outcome
    return table


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("version", VERSIONS)
def test_the_published_client_passes_its_own_tests(
    version: str, target: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if version == "0.3.0":
        # Its cross-language test drives our TypeScript SDK's build (run.sh finds sdk/typescript/dist).
        request.getfixturevalue("typescript_package")
    server = shutil.which("runstate", path=str(Path(sys.executable).parent))
    assert server, "the runstate command of this environment"
    script = COMPAT / ("run.sh" if target == "dev" else "cluster.sh")
    env = {**os.environ, "RUNSTATE_SERVER_CMD": server, "RUNSTATE_REALSDK_RUNS": str(tmp_path)}
    finished = subprocess.run(
        ["bash", str(script), version], cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert finished.returncode == 0, finished.stdout[-3000:] + finished.stderr[-3000:]
    results = outcomes(tmp_path)
    broken = sorted(name for name in expected(version) if results.get(name) != "passed")
    assert not broken, f"{len(broken)} expected to pass did not: {broken}\n{finished.stdout[-4000:]}"
