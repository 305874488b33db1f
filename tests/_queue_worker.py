"""A worker process: `runstate.serve()` for the queue of `_queue_jobs`; prints `serving`, then
`stopped` when serve() returns (the run stopped, or SIGTERM/SIGINT drained it)."""

from __future__ import annotations

import _queue_jobs  # noqa: F401  (defines the queue)
import runstate

if __name__ == "__main__":
    print("serving", flush=True)
    runstate.serve()
    print("stopped", flush=True)
