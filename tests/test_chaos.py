"""The chaos harness's short form, as CI runs it: a fixed seed and one random seed (printed), each
a fresh three-node cluster under kill -9, SIGSTOP, partitions and restarts while the workload
runs; any violation the checker finds fails the test. The long form is in the README."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

FIXED_SEED = 7
DURATION = "50s"
RUN_TIMEOUT_S = 600
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
