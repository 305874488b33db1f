"""Coalescing (sdk/_coalesce.py): concurrent submits and result waits of one client ride together
in batch calls, and each caller still gets exactly what its own single call would have given."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
import runstate
from runstate import AsyncRunstate, Runstate
from runstate.sdk.client import Ticket

from tests import _prometheus
from tests._cluster import Cluster
from tests._http import new_space
from tests._nodes import DevNode


def _requests(node: DevNode, route: str) -> float:
    """How many requests of `route` (POST) the node has answered, whatever their status."""
    samples, _ = _prometheus.scrape(node.url)
    return sum(
        value for (name, labels), value in samples.items()
        if name == "runstate_http_requests_total" and ("route", "/v1/spaces/{spaceId}" + route) in labels
        and ("method", "POST") in labels
    )


def _space(node: DevNode) -> str:
    return new_space(node.url, "coalesce")


def _shape(error: BaseException) -> tuple[Any, ...]:
    assert isinstance(error, runstate.RunstateError), error
    return type(error), error.code, error.status, error.message


def test_mixed_batch_each_caller_gets_its_own_outcome(dev_node: DevNode) -> None:
    """Good submits and bad ones in one batch: only the bad callers raise, each the error its single
    call raises (same class, code, status and message); the good ones get their tickets."""
    space = _space(dev_node)

    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space) as rs, AsyncRunstate(
            base_url=dev_node.url, space_id=space, coalesce=False
        ) as alone:
            assert rs.coalesce and not alone.coalesce
            await rs.mailboxes.ensure("work")
            await rs.mailboxes.ensure("small", backlog_limit=1)
            run = await rs.scopes.create()
            stopped = await rs.scopes.create()
            await stopped.cancel()
            queue = run.mailbox("work")
            await queue.submit({"n": "taken"}, key="taken")
            await run.mailbox("small").submit("fills the backlog")
            await rs.pools.ensure("coalesce-pool", size=2)
            await rs.limits.ensure("coalesce-limit", units=5, per="1s")

            bad_calls = {
                "conflict": lambda client: client.scope(run.id).mailbox("work").submit({"other": 1}, key="taken"),
                "stopped": lambda client: client.scope(stopped.id).mailbox("work").submit({"n": 1}),
                "backlog": lambda client: client.scope(run.id).mailbox("small").submit("one more"),
                "attempts": lambda client: client.scope(run.id).mailbox("work").submit({"n": 2}, attempts=10_000),
                "never": lambda client: client.scope(run.id).mailbox("work").submit(
                    {"n": 3}, limit={"name": "coalesce-limit", "units": 6}
                ),
                "no pool": lambda client: client.scope(run.id).mailbox("work").submit({"n": 4}, slots="no-such-pool"),
            }
            expected: dict[str, tuple[Any, ...]] = {}
            for name, call in bad_calls.items():
                with pytest.raises(runstate.RunstateError) as raised:
                    await call(alone)
                expected[name] = _shape(raised.value)

            batches_before = _requests(dev_node, "/tasks/batch")
            good = [
                queue.submit({"n": n}, key=f"good-{n}", slots="coalesce-pool" if n % 2 else None) for n in range(20)
            ]
            outcomes = await asyncio.gather(*good, *(call(rs) for call in bad_calls.values()), return_exceptions=True)
            assert _requests(dev_node, "/tasks/batch") > batches_before  # they did ride together

            tickets, errors = outcomes[:20], outcomes[20:]
            for n, ticket in enumerate(tickets):
                assert isinstance(ticket, Ticket), ticket
                assert ticket.created is True and ticket.key == f"good-{n}" and ticket.state == "QUEUED"
                needs = (await ticket.status())["needs"]
                assert bool(needs and needs.get("pools")) is bool(n % 2), needs
            for name, error in zip(bad_calls, errors, strict=True):
                assert isinstance(error, BaseException)
                assert _shape(error) == expected[name], name
            # The good tasks are there once each; the refused ones changed nothing.
            again = await asyncio.gather(*(queue.submit({"n": n}, key=f"good-{n}") for n in range(20)))
            assert [ticket.id for ticket in again] == [ticket.id for ticket in tickets]  # type: ignore[union-attr]
            assert all(ticket.created is False for ticket in again)

    asyncio.run(main())


def test_result_waits_with_a_timeout_inside_a_coalesced_batch(dev_node: DevNode) -> None:
    """Waits that look together: a finished task's caller gets its view (the view GET /tasks/{id}
    gives), an unfinished one with a short timeout gets ResultTimeoutError, an unknown id
    NotFoundError, and an unfinished one with time left keeps waiting until its task finishes."""

    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=_space(dev_node)) as rs:
            await rs.mailboxes.ensure("work")
            run = await rs.scopes.create()
            queue = run.mailbox("work")
            finished = await queue.submit({"n": 1})
            (delivery,) = await queue.receive(max=1)
            await delivery.complete(result={"payload": "done"})
            unfinished = await queue.submit({"n": 2})
            later = await queue.submit({"n": 3})

            looks_before = _requests(dev_node, "/tasks/results")
            waits = [
                asyncio.create_task(wait)
                for wait in (
                    finished.result(timeout_ms=30_000),
                    unfinished.result(timeout_ms=200),
                    rs.task("tsk_unknown").result(timeout_ms=30_000),
                    finished.result(timeout_ms=0),
                    later.result(timeout_ms=60_000),  # finishes only after the others were answered
                )
            ]
            await asyncio.wait(waits[:4], timeout=30)
            assert _requests(dev_node, "/tasks/results") > looks_before
            done_view, _, _, at_once = (wait.result() for wait in (waits[0], waits[0], waits[0], waits[3]))
            timed_out, unknown = waits[1].exception(), waits[2].exception()
            assert isinstance(timed_out, runstate.ResultTimeoutError)
            assert timed_out.task_id == unfinished.id and timed_out.timeout_ms == 200 and timed_out.state == "QUEUED"
            assert isinstance(unknown, runstate.NotFoundError) and unknown.status == 404
            assert done_view["outcome"] == "done" and done_view["state"] == "SUCCEEDED"
            assert done_view == await finished.status()  # the whole task view, as a single wait gives
            assert at_once == done_view
            assert not waits[4].done()

            deliveries = await queue.receive(max=2)
            for given in deliveries:
                await given.complete(result={"payload": given.input["n"]})
            view = await asyncio.wait_for(waits[4], 30)
            assert view["outcome"] == 3 and view["state"] == "SUCCEEDED"

    asyncio.run(main())


def test_exactly_once_with_keys_under_coalescing(dev_node: DevNode) -> None:
    """Many concurrent submits of a few keys, from two clients: one task per key, created once,
    every caller of a key gets that task."""
    space = _space(dev_node)

    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space) as first, AsyncRunstate(
            base_url=dev_node.url, space_id=space
        ) as second:
            await first.mailboxes.ensure("work")
            run = await first.scopes.create()
            calls = [
                client.scope(run.id).mailbox("work").submit({"job": n % 7}, key=f"job-{n % 7}")
                for n in range(140)
                for client in (first, second)
            ]
            tickets = await asyncio.gather(*calls)
            by_key: dict[str, set[str]] = {}
            for ticket in tickets:
                by_key.setdefault(str(ticket.key), set()).add(ticket.id)
            assert {key: len(ids) for key, ids in by_key.items()} == {f"job-{n}": 1 for n in range(7)}
            assert sum(ticket.created is True for ticket in tickets) == 7
            listed = await first._transport.request("GET", "/tasks", params={"scopeId": run.id}, safe=True)
            assert len(listed["tasks"]) == 7

    asyncio.run(main())


def test_blocking_client_coalesces_across_threads(dev_node: DevNode) -> None:
    """Threads sharing one blocking client: their submits and waits ride together too."""
    with Runstate(base_url=dev_node.url, space_id=_space(dev_node)) as rs:
        rs.mailboxes.ensure("work")
        queue = rs.scopes.create().mailbox("work")
        batches_before = _requests(dev_node, "/tasks/batch")
        tickets: list[Any] = [None] * 40
        start = threading.Barrier(40)

        def submit(index: int) -> None:
            start.wait()
            tickets[index] = queue.submit({"n": index}, key=f"t{index}")

        threads = [threading.Thread(target=submit, args=(index,)) for index in range(40)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert all(ticket is not None and ticket.created for ticket in tickets)
        assert len({ticket.id for ticket in tickets}) == 40
        assert _requests(dev_node, "/tasks/batch") > batches_before


def test_coalesced_submits_across_a_leader_kill(make_cluster: Callable[..., Cluster]) -> None:
    """Coalesced submits of the same keys from many callers while the leader is killed: batches
    are retried as single calls are, so each key is one task, created by at most one caller, and
    every caller gets that task or UnavailableError."""
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    keys = [f"key-{n}" for n in range(60)]

    async def main() -> None:
        url = cluster.urls_from((leader + 1) % cluster.size)  # through a follower, then on
        async with AsyncRunstate(api_key=cluster.admin_key, base_url=url) as rs:
            await rs.mailboxes.ensure("work")
            run = await rs.scopes.create()
            queue = rs.scope(run.id).mailbox("work")
            outcomes: list[tuple[str, Any]] = []

            async def producer(offset: int) -> None:
                for index in range(len(keys)):
                    key = keys[(index + offset) % len(keys)]
                    try:
                        outcomes.append((key, await queue.submit({"key": key}, key=key)))
                    except runstate.UnavailableError as error:
                        outcomes.append((key, error))

            producers = [asyncio.create_task(producer(offset * 7)) for offset in range(8)]
            while len(outcomes) < 100:
                await asyncio.sleep(0.01)
            cluster.kill(leader)
            await asyncio.wait_for(asyncio.gather(*producers), 120)

            by_key: dict[str, set[str]] = {}
            created: dict[str, int] = {}
            for key, outcome in outcomes:
                if isinstance(outcome, Ticket):
                    by_key.setdefault(key, set()).add(outcome.id)
                    created[key] = created.get(key, 0) + (outcome.created is True)
            assert all(len(ids) == 1 for ids in by_key.values()), by_key
            assert all(count <= 1 for count in created.values()), created
            listed = await rs._transport.request("GET", "/tasks", params={"scopeId": run.id, "limit": "100"}, safe=True)
            tasks = {task["taskKey"]: task["id"] for task in listed["tasks"]}
            assert len(tasks) == len(listed["tasks"])  # one task per key
            for key, ids in by_key.items():
                assert ids == {tasks[key]}

    asyncio.run(main())
