"""A worker process: `runstate.serve()` for the queue of `_queue_jobs`; prints `serving`, then
`stopped` when serve() returns (the run stopped, or SIGTERM/SIGINT drained it). RS_TEST_DRAIN_S,
if set, replaces the SDK's 30 s drain (how long a stop waits for running handlers)."""

from __future__ import annotations

import os

import _queue_jobs  # noqa: F401  (defines the queue)
import runstate
from runstate.sdk import _consume

if __name__ == "__main__":
    if "RS_TEST_DRAIN_S" in os.environ:
        _consume.CONSUME_DRAIN_TIMEOUT_S = float(os.environ["RS_TEST_DRAIN_S"])
    print("serving", flush=True)
    runstate.serve()
    print("stopped", flush=True)
