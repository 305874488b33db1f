"""consume() settles its deliveries with batch completes (sdk/_completes.py): every task settled
exactly once, each delivery with its own outcome, fewer requests than deliveries."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import runstate
from runstate import AsyncRunstate, Runstate
from runstate.sdk._completes import Completes
from runstate.sdk.client import Delivery, Mailbox, Scope, Ticket

from tests._http import new_space
from tests._nodes import DevNode
from tests._prometheus import scrape

TASKS = 300
CONCURRENCY = 40
RESULT_TIMEOUT_MS = 60_000
CONSUMER_EXIT_TIMEOUT_S = 30.0
SINGLE_ROUTE = "/messages/{id}/complete"
BATCH_ROUTE = "/messages/complete"


@pytest.fixture(scope="module")
def dev_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevNode]:
    """A node of this module's own: its request counts are these tests' alone."""
    node = DevNode(tmp_path_factory.mktemp("completes") / "data")
    try:
        yield node.start()
    finally:
        node.stop()


def completes_answered(url: str) -> Counter[str]:
    """How many complete calls the node answered so far, single and batch."""
    samples, _ = scrape(url)
    counts: Counter[str] = Counter()
    for (name, labels), count in samples.items():
        route = dict(labels).get("route", "")
        if name == "runstate_http_requests_total" and route.endswith((SINGLE_ROUTE, BATCH_ROUTE)):
            counts[SINGLE_ROUTE if route.endswith(SINGLE_ROUTE) else BATCH_ROUTE] += int(count)
    return counts


def space(node: DevNode) -> str:
    return new_space(node.url, "completes")


async def queue_of_tasks(rs: AsyncRunstate, count: int) -> tuple[Scope, Mailbox, list[Ticket]]:
    """A new run, its queue "work" and `count` tasks submitted to it, `{"n": 0}` onwards."""
    await rs.mailboxes.ensure("work")
    run = await rs.scopes.create()
    queue = run.mailbox("work")
    return run, queue, await queue.submit_many([{"n": n} for n in range(count)])


def test_consume_settles_every_task_once_with_fewer_requests(dev_node: DevNode) -> None:
    calls: Counter[str] = Counter()

    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            run, queue, tickets = await queue_of_tasks(rs, TASKS)
            before = completes_answered(dev_node.url)

            async def double(data: dict[str, Any], delivery: Any) -> int:
                calls[delivery.task_id] += 1
                await asyncio.sleep(0)
                if data["n"] % 3 == 0:  # a handler may complete its delivery itself, too
                    await delivery.complete(result={"payload": data["n"] * 2})
                    return -1
                return int(data["n"]) * 2

            workers = [asyncio.create_task(queue.consume(double, concurrency=CONCURRENCY)) for _ in range(2)]
            results = await rs.results(tickets, timeout_ms=RESULT_TIMEOUT_MS)
            after = completes_answered(dev_node.url)
            await run.cancel()
            await asyncio.wait_for(asyncio.gather(*workers), CONSUMER_EXIT_TIMEOUT_S)
            assert [(result["state"], result["outcome"], result["attempt"]) for result in results] == [
                ("SUCCEEDED", n * 2, 1) for n in range(TASKS)
            ]
            assert set(calls.values()) == {1} and len(calls) == TASKS  # each task handled once
            assert after[SINGLE_ROUTE] == before[SINGLE_ROUTE]
            assert 0 < after[BATCH_ROUTE] - before[BATCH_ROUTE] < TASKS

    asyncio.run(main())


def test_one_client_waits_on_more_results_than_it_keeps_connections_while_it_consumes(dev_node: DevNode) -> None:
    """120 `Ticket.result()` waits, each a long poll holding its connection, are in flight before
    the same client starts consuming: its receives and completes still go out at once (with its
    connections capped at 100, the completes queued behind the waits and most results timed out)."""
    waits = 120

    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            _, queue, tickets = await queue_of_tasks(rs, waits)
            results = asyncio.gather(*(ticket.result(timeout_ms=RESULT_TIMEOUT_MS) for ticket in tickets))
            await asyncio.sleep(0.5)  # every wait is parked on the node
            stop = asyncio.Event()

            async def double(data: dict[str, Any], delivery: Any) -> int:
                return int(data["n"]) * 2

            worker = asyncio.create_task(queue.consume(double, concurrency=CONCURRENCY, stop=stop))
            views = await results
            stop.set()
            await asyncio.wait_for(worker, CONSUMER_EXIT_TIMEOUT_S)
            assert [(view["state"], view["outcome"]) for view in views] == [("SUCCEEDED", n * 2) for n in range(waits)]

    asyncio.run(main())


def test_blocking_consume_settles_every_task_once(dev_node: DevNode) -> None:
    calls: Counter[str] = Counter()
    lock = threading.Lock()
    with Runstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
        rs.mailboxes.ensure("work")
        run = rs.scopes.create()
        queue = run.mailbox("work")
        tickets = queue.submit_many([{"n": n} for n in range(60)])

        def triple(data: dict[str, Any], delivery: Any) -> int:
            with lock:
                calls[delivery.task_id] += 1
            return int(data["n"]) * 3

        stop = threading.Event()
        worker = threading.Thread(target=lambda: queue.consume(triple, concurrency=8, stop=stop))
        worker.start()
        try:
            results = rs.results(tickets, timeout_ms=RESULT_TIMEOUT_MS)
        finally:
            stop.set()
            worker.join(CONSUMER_EXIT_TIMEOUT_S)
        assert not worker.is_alive()
        assert [(result["state"], result["outcome"]) for result in results] == [("SUCCEEDED", n * 3) for n in range(60)]
        assert set(calls.values()) == {1} and len(calls) == 60


def test_each_delivery_of_a_batch_gets_its_own_outcome(dev_node: DevNode) -> None:
    """Completes asked for together go out in one request; a good one succeeds, a stale token is
    LeaseLostError and an unknown task NotFoundError, each for its own delivery only."""

    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            await rs.mailboxes.ensure("work")
            run = await rs.scopes.create()
            queue = run.mailbox("work")
            await queue.submit_many(["good", "stale", "big"])
            good, stale, big = await queue.receive(max=3)
            # Its token turns stale behind the delivery's back (as when its lease is taken over).
            await rs._transport.request(
                "POST", f"/messages/{stale.task_id}/nack",
                body={"token": stale.id, "retry": True, "countAttempt": False}, safe=True,
            )
            (again,) = await queue.receive()
            unknown = Delivery(rs._transport, {"token": "tsk_nope.1.x", "message": {"id": "tsk_nope"}})
            completes = Completes(rs._transport)
            for delivery in (good, stale, unknown, big, again):
                delivery._completes = completes
            before = completes_answered(dev_node.url)
            outcomes = await asyncio.gather(
                good.complete(result={"payload": "g"}),
                stale.complete(result={"payload": "late"}),
                unknown.complete(),
                big.complete(result={"payload": "x" * 70_000}),  # too large: sent alone, refused alone
                again.complete(result={"payload": "a"}),
                return_exceptions=True,
            )
            after = completes_answered(dev_node.url)
            assert outcomes[0] == {"taskId": good.task_id, "state": "SUCCEEDED", "attempt": 1, "outcomeReason": None}
            assert isinstance(outcomes[1], runstate.LeaseLostError) and outcomes[1].status == 409
            assert isinstance(outcomes[2], runstate.NotFoundError) and outcomes[2].status == 404
            assert isinstance(outcomes[3], runstate.ResultTooLargeError)
            assert outcomes[4]["state"] == "SUCCEEDED"  # type: ignore[index]
            assert [d.settled for d in (good, stale, unknown, big, again)] == [True, True, True, False, True]
            assert after[BATCH_ROUTE] - before[BATCH_ROUTE] == 1
            assert after[SINGLE_ROUTE] - before[SINGLE_ROUTE] == 1  # the result too large
            views = [await rs._transport.request("GET", f"/tasks/{d.task_id}", safe=True) for d in (good, big)]
            assert [(view["state"], view["outcome"]) for view in views] == [("SUCCEEDED", "g"), ("RUNNING", None)]
            with pytest.raises(runstate.ConfigError):  # not JSON: refused before any request
                await big.complete(result={"payload": object()})
            assert (await big.complete(result={"payload": "b"}))["state"] == "SUCCEEDED"

    asyncio.run(main())
