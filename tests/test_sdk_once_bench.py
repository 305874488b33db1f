"""The once benchmark's short form: it runs end to end and prints the numbers it promises (no
timing assertions: `python -m bench.once` measures, this only checks it works)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH_TIMEOUT_S = 120


@pytest.mark.slow
def test_once_bench_short_form() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "bench.once", "--rounds", "2", "--callers", "10", "--processes", "2", "--settle-s", "0.2"],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert report["callers"] == 10 and report["rounds"] == 2 and len(report["rounds_ms"]) == 2
    assert set(report["last_caller_ms"]) == {"median", "p99", "max"}
    assert report["last_caller_ms"]["max"] >= 0
