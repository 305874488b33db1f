"""The compiled core (README, "A compiled core") behaves as the interpreted one: the short form of
compat/compiled/run.sh builds the wheel as a user would (`RUNSTATE_COMPILE=1 pip wheel`, so the
build backend, setup.py and mypyc's type checks of the core are exercised) and runs the core's own
tests, the replicated log's and a real node's API tests against it. At mypyc's -O0, to keep the
default run short: the optimisation level changes the C compiler's work, not what the code does.
(`compat/compiled/run.sh --full` runs the whole suite against it.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The build (~1 minute of CPU at -O0, plus fetching setuptools and mypy into its environment) and
# about a thousand tests, on a machine that runs the rest of the suite beside them.
BUILD_AND_TESTS_TIMEOUT_S = 1200
# The short form runs about a thousand tests: far fewer would mean its test files moved.
SHORT_FORM_TESTS_MIN = 500


@pytest.mark.slow
@pytest.mark.timeout(BUILD_AND_TESTS_TIMEOUT_S + 60)
def test_the_compiled_core_passes_the_cores_tests() -> None:
    # The inner pytest is a run of its own: none of this run's variables (its xdist worker's among them).
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    env.update(MYPYC_OPT_LEVEL="0", PYTHON=sys.executable)
    # A session of its own: past the timeout the script, its pytest and the nodes they started all go.
    script = subprocess.Popen(
        [str(ROOT / "compat" / "compiled" / "run.sh")], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        output, _ = script.communicate(timeout=BUILD_AND_TESTS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(script.pid, signal.SIGKILL)
        output, _ = script.communicate()
        pytest.fail(f"the build and tests took over {BUILD_AND_TESTS_TIMEOUT_S} s:\n{output[-6000:]}")
    assert script.returncode == 0, output[-6000:]
    # The script checked that the copy's core is compiled, and said which file it imported.
    assert re.search(r"\[compiled\] core: \S+/runstate_server/actors/tasks\.\S+\.so", output), output[-2000:]
    passed = re.search(r"(\d+) passed", output)
    assert passed is not None and int(passed.group(1)) >= SHORT_FORM_TESTS_MIN, output[-2000:]
    assert "failed" not in output.splitlines()[-1], output[-2000:]
