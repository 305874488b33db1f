"""A script's process ends when it is done, even with a blocking client it never closed whose last
call failed: the client was closed at the interpreter's end, after its event loop's thread had
stopped, and the process hung there (issue 43: the first hour of a new user)."""

from __future__ import annotations

import subprocess
import sys

from tests._nodes import free_port

# The script's unreachable call gives up within the client's own retry budget; the process then exits.
EXIT_TIMEOUT_S = 60.0

SCRIPT = """
import sys
from runstate import Runstate
rs = Runstate(sys.argv[1])
try:
    rs.whoami()
except Exception as error:
    print(type(error).__name__, flush=True)
"""


def test_a_script_whose_unclosed_clients_call_failed_exits() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"http://127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=EXIT_TIMEOUT_S,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "UnavailableError"), done.stderr
