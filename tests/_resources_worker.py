"""A worker process for tests/test_resources_processes.py: consumes the `render` queue of
RUNSTATE_SCOPE_ID with `concurrency` handlers; each handler works WORK_S seconds and appends one
JSON line to RS_TEST_EFFECTS: the job, this pid, when the server handed it out (its receive time,
from the lease), and when the handler started and ended (wall clock, comparable across processes).
Prints `serving`, then `stopped` when consume returns (the run stopped).

argv: concurrency.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from runstate import AsyncRunstate

LEASE_MS = 30_000
WORK_S = 0.15


async def main(concurrency: int) -> None:
    effects = os.environ["RS_TEST_EFFECTS"]

    async def handle(data: dict[str, Any], delivery: Any) -> dict[str, Any]:
        started = time.time()
        await asyncio.sleep(WORK_S)
        received_ms = int(delivery.lease_expires_at.timestamp() * 1000) - LEASE_MS
        line = {"n": data["n"], "pid": os.getpid(), "received_ms": received_ms, "start": started, "end": time.time()}
        with open(effects, "a") as file:
            file.write(json.dumps(line) + "\n")
        return {"rendered": data["n"]}

    async with AsyncRunstate(holder=f"render-worker-{os.getpid()}") as rs:
        print("serving", flush=True)
        await rs.scope(os.environ["RUNSTATE_SCOPE_ID"]).mailbox("render").consume(
            handle, concurrency=concurrency, lease_ms=LEASE_MS
        )
    print("stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
