"""A reviewer's worker process for tests/test_sdk_groups.py: consumes the mailbox `reviews` of the
run RUNSTATE_SCOPE_ID (a group's run), answers `{"draft": n, "good": n is even}` for each draft,
prints `consuming`, then `stopped` once consume() returns (the group finalized and cancelled its
run)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from runstate import AsyncRunstate


def review(data: dict[str, Any], delivery: Any) -> dict[str, Any]:
    return {"draft": data["draft"], "good": data["draft"] % 2 == 0}


async def main() -> None:
    async with AsyncRunstate(holder="group-worker") as rs:
        print("consuming", flush=True)
        await rs.scope(os.environ["RUNSTATE_SCOPE_ID"]).mailbox("reviews").consume(review, concurrency=4)
    print("stopped", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
