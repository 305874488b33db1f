"""submit_many and results: many tasks per call, in the async and the blocking client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import runstate
from runstate import AsyncRunstate, Runstate

from tests._http import new_space
from tests._nodes import DevNode

BODY_DEPTH_MAX = 64  # the node's json_depth_max: a request body's nesting, its own object included


def nested(depth: int) -> list[Any]:
    """A JSON array nesting `depth` levels."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_submit_many_and_results_async(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=new_space(dev_node.url, "batch")) as rs:
            await rs.mailboxes.ensure("work")
            run = await rs.scopes.create()
            queue = run.mailbox("work")
            inputs = [{"n": n} for n in range(250)]  # more than one request's worth
            tickets = await queue.submit_many(inputs, keys=[f"k{n}" for n in range(250)])
            assert [ticket.created for ticket in tickets] == [True] * 250
            again = await queue.submit_many(inputs[:3], keys=["k0", "k1", "k2"])
            assert [t.id for t in again] == [t.id for t in tickets[:3]]
            # Each item carries the run, the mailbox and its own fields (spliced from its encoding).
            other = run.mailbox("other")
            await rs.mailboxes.ensure("other")
            tried = await other.submit_many([{"m": 1}, "two", None], keys=["a", None, "c"], attempts=2)
            views = [await ticket.status() for ticket in tried]
            assert [(view["attempts"], view["input"]) for view in views] == [(2, {"m": 1}), (2, "two"), (2, None)]
            assert [ticket.key for ticket in tried][0::2] == ["a", "c"]
            with pytest.raises(runstate.ConfigError):  # not JSON: refused before any request
                await other.submit_many([{"m": 2}, {"set": {1, 2}}])
            assert len(await other.submit_many([{"m": 2}], keys=["m2"])) == 1
            # 100 inputs of 4 KB: 400 KB, more than a request body may hold (256 KiB): several requests.
            large = [{"n": n, "text": "é" * 2_000} for n in range(100)]
            big = await other.submit_many(large, keys=[f"big{n}" for n in range(100)])
            assert [(await ticket.status())["input"] for ticket in big[::33]] == large[::33]
            # A body may nest 64 levels: an input of 63 passes alone, but a batch nests its tasks two
            # levels deeper. It goes alone; the tasks around it still ride in batches.
            deepest = nested(BODY_DEPTH_MAX - 1)
            around = await other.submit_many([{"n": 0}, deepest, {"n": 2}], keys=["d0", "d1", "d2"])
            assert [(await ticket.status())["input"] for ticket in around] == [{"n": 0}, deepest, {"n": 2}]
            assert [ticket.key for ticket in around] == ["d0", "d1", "d2"]
            # One level more is refused alone, as submit() refuses it; the others are submitted.
            with pytest.raises(runstate.ValidationError, match="deeper"):
                await other.submit_many([{"n": 3}, nested(BODY_DEPTH_MAX), {"n": 5}], keys=["d3", "d4", "d5"])
            assert [(await ticket.status())["input"] for ticket in await other.submit_many([{"n": 3}, {"n": 5}], keys=["d3", "d5"])] == [{"n": 3}, {"n": 5}]

            async def double(data: dict[str, Any], delivery: Any) -> int:
                return int(data["n"]) * 2

            worker = asyncio.create_task(queue.consume(double, concurrency=32))
            results = await rs.results(tickets, timeout_ms=60_000)
            assert [result["outcome"] for result in results] == [n * 2 for n in range(250)]
            await run.cancel()
            await asyncio.wait_for(worker, 30)

            with pytest.raises(runstate.KeyConflictError):
                await (await rs.scopes.create()).mailbox("work").submit_many([1, 2], keys=["same", "same"])
            with pytest.raises(runstate.NotFoundError):
                await rs.results(["tsk_unknown"])
            with pytest.raises(runstate.ResultTimeoutError):
                fresh = await (await rs.scopes.create()).mailbox("work").submit_many([1])
                await rs.results(fresh, timeout_ms=100)

    asyncio.run(main())


def test_submit_many_and_results_blocking(dev_node: DevNode) -> None:
    with Runstate(base_url=dev_node.url, space_id=new_space(dev_node.url, "batch")) as rs:
        rs.mailboxes.ensure("work")
        queue = rs.scopes.create().mailbox("work")
        tickets = queue.submit_many(["a", "b"])
        for delivery in queue.receive(max=2):
            delivery.complete(result={"payload": delivery.input.upper()})
        assert [result["outcome"] for result in rs.results(tickets, timeout_ms=30_000)] == ["A", "B"]
