import asyncio
import os

from runstate import AsyncRunstate


async def main() -> None:
    run_id = os.environ["RUNSTATE_SCOPE_ID"]  # the id the producer printed
    async with AsyncRunstate(holder="quickstart-worker") as rs:
        queue = rs.scope(run_id).mailbox("work")
        print(f"worker listening on run {run_id}", flush=True)

        async def handle(data, delivery):
            # Completing with a payload records it as the task's result.
            await delivery.complete(result={"payload": {"doubled": data["n"] * 2}})
            print(f"completed {delivery.id} (attempt {delivery.attempt})", flush=True)

        # Runs until the process is stopped.
        await queue.consume(handle)


asyncio.run(main())
