import asyncio
import time

from runstate import AsyncRunstate


async def main() -> None:
    async with AsyncRunstate(holder="quickstart-producer") as rs:
        # Create the work queue if it doesn't exist yet (safe to call every time).
        await rs.mailboxes.ensure("work", mode="WORK")

        # A run groups everything this swarm does, so you can cancel it as one unit.
        run = await rs.scopes.create()
        print(f"RUNSTATE_SCOPE_ID={run.id}", flush=True)

        # Submit a task. The key identifies the logical task: submitting the same
        # key with the same input again returns this task instead of a new one.
        ticket = await run.mailbox("work").submit(
            {"greeting": "runstate", "n": 21},
            key=f"quickstart-task-{int(time.time())}",
        )
        print(f"task {ticket.id} submitted, waiting for a worker...", flush=True)

        # Poll until the task has a recorded result.
        outcome = await ticket.result(timeout_ms=60_000)
        print(outcome["state"], outcome["outcome"])


asyncio.run(main())
