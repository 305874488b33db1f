"""The chaos harness's short form, as CI runs it: a fixed seed and one random seed (printed), each
a fresh three-node cluster under kill -9, SIGSTOP, partitions and restarts while the workload
runs; any violation the checker finds fails the test. The long form is in docs/chaos.md."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

FIXED_SEED = 7
DURATION = "50s"
RUN_TIMEOUT_S = 600
# The interrupted run: long enough never to end by itself; its cluster's start; its stop.
INTERRUPTED_DURATION = "600s"
CLUSTER_UP_TIMEOUT_S = 120.0
INTERRUPT_EXIT_TIMEOUT_S = 60.0
EXIT_INTERRUPTED = 130
ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize("seed", [FIXED_SEED, random.SystemRandom().randrange(2**31 - 1)], ids=["fixed", "random"])
def test_chaos_short_form_finds_no_violation(seed: int, tmp_path: Path) -> None:
    print(f"chaos seed {seed} (replay: python -m chaos run --seed {seed} --duration {DURATION})")
    finished = subprocess.run(
        [sys.executable, "-m", "chaos", "run", "--seed", str(seed), "--duration", DURATION,
         "--faults", "kill,pause,partition,restart", "--report", str(tmp_path / "report")],
        cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )
    print(finished.stdout[-20_000:])
    print(finished.stderr[-5_000:], file=sys.stderr)
    assert finished.returncode == 0, f"seed {seed}: violations or harness errors (report in {tmp_path / 'report'})"
    assert f"seed {seed}" in finished.stdout
    assert "no violations" in finished.stdout


def _pids_with_argument(text: str) -> set[int]:
    """Live processes whose command line holds `text`."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.add(int(entry.name))
        except OSError:  # ended meanwhile
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_ends_a_run_and_kills_its_nodes(tmp_path: Path) -> None:
    report = tmp_path / "report"
    process = subprocess.Popen(
        [sys.executable, "-m", "chaos", "run", "--seed", str(FIXED_SEED), "--duration", INTERRUPTED_DURATION,
         "--report", str(report)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    nodes: set[int] = set()
    try:
        deadline = time.monotonic() + CLUSTER_UP_TIMEOUT_S
        history = report / "history.jsonl"
        while not (history.exists() and '"start"' in history.read_text()):  # the cluster is up
            assert process.poll() is None, "the run ended by itself"
            assert time.monotonic() < deadline, "the cluster did not come up"
            time.sleep(0.2)
        nodes = _pids_with_argument(str(report / "cluster")) - {process.pid}
        assert len(nodes) == 3
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=INTERRUPT_EXIT_TIMEOUT_S)
        left = [pid for pid in nodes if _alive(pid)]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in nodes:  # whatever the outcome, no node outlives the test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert process.returncode == EXIT_INTERRUPTED, output[-5_000:]
    assert "interrupted" in output
    assert left == []
