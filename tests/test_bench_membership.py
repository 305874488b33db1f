"""The membership benchmark's short form: a node joins a small cluster, and the report holds every
number the benchmark promises (no timing assertions: `python -m bench.membership` measures)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_TIMEOUT_S = 120
INTERRUPTED_EXIT_TIMEOUT_S = 30  # after Ctrl-C the benchmark stops its nodes and exits
TASKS = 2000
RUN_FIELDS = {
    "node", "leader", "join_answered_s", "caught_up_s", "voter_s", "catch_up_s", "target_index",
    "entries_per_s", "tasks_per_s", "leader_dump_bytes", "leader_journal_file_bytes",
}


@pytest.mark.slow
def test_membership_bench_short_form() -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench.membership", "--tasks", str(TASKS), "--runs", "2"],
        cwd=Path(__file__).parent.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        stdout, stderr = bench.communicate(timeout=BENCH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # Ctrl-C, not a kill: the benchmark then stops the nodes it started.
        bench.send_signal(signal.SIGINT)
        stdout, stderr = bench.communicate(timeout=INTERRUPTED_EXIT_TIMEOUT_S)
        pytest.fail(f"bench.membership ran over {BENCH_TIMEOUT_S} s\n{stderr}")
    assert bench.returncode == 0, stderr
    report = json.loads(stdout.strip().splitlines()[-1])
    assert report["benchmark"] == "membership" and report["submitted"] == TASKS and report["fsync"] == "always"
    # Two runs: the first joined node is removed before the second joins (a fresh node each time).
    runs = report["runs"]
    assert [set(run) for run in runs] == [RUN_FIELDS, RUN_FIELDS]
    assert [run["node"] for run in runs] == ["n4", "n5"]
    for run in runs:
        assert 0 < run["join_answered_s"] <= run["caught_up_s"] <= run["voter_s"]
        assert run["target_index"] > 0 and run["leader_journal_file_bytes"] > 0
    for name in ("join_answered_s", "caught_up_s", "voter_s", "catch_up_s", "tasks_per_s"):
        assert set(report[name]) == {"median", "max"}
