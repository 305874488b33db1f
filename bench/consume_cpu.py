"""The SDK's CPU per task of `Mailbox.consume`, without a node or a network; prints one JSON object.

    python -m bench.consume_cpu --tasks 20000 --concurrency 64

One consume() drains `--tasks` tasks through a stand-in for the SDK's transport that answers each
receive with as many deliveries as it asks for and each batch complete with an item per task (their
bodies go through JSON as a node's would). What is measured is the process's CPU from the start of
consume() to its return, per task: the SDK's own work per delivery (receiving, running the handler,
settling, the event loop's tasks and callbacks), without aiohttp's per request. Run it against
another checkout's SDK with `PYTHONPATH=/that/checkout/sdk/python`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

from runstate import AsyncRunstate
from runstate.sdk import _http

# The lease end every delivery carries (parsed by each Delivery).
LEASE_EXPIRES_AT = "2030-01-01T00:00:00.000Z"
# How long an empty receive of the stand-in waits (the node would long-poll).
EMPTY_RECEIVE_WAIT_S = 0.01


class StandIn:
    """Answers the calls consume() makes, for `tasks` tasks; sets `drained` once all are completed."""

    def __init__(self, tasks: int) -> None:
        self.tasks = tasks
        self.given = 0
        self.completed = 0
        self.drained = asyncio.Event()

    async def request(
        self, method: str, path: str, *, body: Mapping[str, Any] | None = None, encoded_body: bytes | None = None,
        **_: Any,
    ) -> dict[str, Any]:
        await asyncio.sleep(0)  # a request always yields to the event loop
        if path.endswith("/recv"):
            assert body is not None
            count = min(int(body["max"]), self.tasks - self.given)
            if count == 0:
                await asyncio.sleep(EMPTY_RECEIVE_WAIT_S)
                return {}
            messages = [self._message(index) for index in range(self.given, self.given + count)]
            self.given += count
            return json.loads(json.dumps({"messages": messages}))
        if path.endswith("/messages/complete"):
            assert encoded_body is not None
            items = json.loads(encoded_body)["items"]
            self.completed += len(items)
            if self.completed >= self.tasks:
                self.drained.set()
            return json.loads(json.dumps({"items": [{"taskId": item["id"], "state": "SUCCEEDED"} for item in items]}))
        raise AssertionError(f"consume() made an unexpected call: {method} {path}")

    @staticmethod
    def _message(index: int) -> dict[str, Any]:
        return {
            "message": {"id": f"msg_{index:020d}", "payload": {"n": index}, "attempt": 1, "attempts": 3},
            "token": f"tok_{index:024d}",
            "leaseExpiresAt": LEASE_EXPIRES_AT,
        }


async def measure(tasks: int, concurrency: int) -> float:
    """CPU seconds of one consume() that drains `tasks` tasks."""
    stand_in = StandIn(tasks)
    async with AsyncRunstate(base_url="http://127.0.0.1:9", space_id="bench", holder="bench-worker") as rs:
        rs._transport.request = stand_in.request  # type: ignore[method-assign]
        rs._transport.mailbox_ids["bench"] = "mbx_bench"

        async def handle(data: dict[str, Any], delivery: Any) -> dict[str, Any]:
            return {"doubled": data["n"] * 2}

        started = time.process_time()
        await rs.scope("run_bench").mailbox("bench").consume(handle, concurrency=concurrency, stop=stand_in.drained)
        return time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.consume_cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks to drain (default 20000)")
    parser.add_argument("--concurrency", type=int, default=64, help="handlers at once (default 64)")
    args = parser.parse_args(argv)
    cpu_s = asyncio.run(measure(args.tasks, args.concurrency))
    print(json.dumps({
        "benchmark": "consume_cpu", "sdk": _http.__file__.rsplit("/runstate/", 1)[0], "tasks": args.tasks,
        "concurrency": args.concurrency, "cpu_s": round(cpu_s, 3), "us_per_task": round(cpu_s / args.tasks * 1e6, 1),
    }), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
