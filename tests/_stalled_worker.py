"""A worker that takes one task and then stops renewing: a process that is 'dead' to the server.

argv: run id, lease ms, seconds to stall. Prints `received <delivery id> <attempt>`, stalls without
renewing, then tries to complete and prints `completed` or `refused <error code>`.
"""

from __future__ import annotations

import asyncio
import sys

from runstate import AsyncRunstate, RunstateError


async def main(run_id: str, lease_ms: int, stall_s: float) -> None:
    async with AsyncRunstate(holder="stalled-worker") as rs:
        queue = rs.scope(run_id).mailbox("work")
        deliveries = await queue.receive(max=1, lease_ms=lease_ms, wait_ms=20_000)
        (delivery,) = deliveries
        print(f"received {delivery.id} {delivery.attempt}", flush=True)
        await asyncio.sleep(stall_s)
        try:
            await delivery.complete(result={"payload": "late"})
            print("completed", flush=True)
        except RunstateError as error:
            print(f"refused {error.code}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
