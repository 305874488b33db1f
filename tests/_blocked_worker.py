"""A consume() worker whose handler never returns: kill -9 it mid-task.

argv: run id, lease ms. Prints `started <task id> <attempt>` when its handler starts.
"""

from __future__ import annotations

import asyncio
import sys

from runstate import AsyncRunstate


async def main(run_id: str, lease_ms: int) -> None:
    async with AsyncRunstate(holder="doomed-worker") as rs:
        async def handle(data: object, delivery: object) -> None:
            print(f"started {delivery.task_id} {delivery.attempt}", flush=True)  # type: ignore[attr-defined]
            await asyncio.Event().wait()

        await rs.scope(run_id).mailbox("work").consume(handle, lease_ms=lease_ms)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
