"""The SDK on runs, named runs, mailboxes, messages and tasks: what it adds over the wire
(named runs, INBOX and backlogLimit, ticket cancel/join/detach, consume below a run) in the async
and the blocking client, against a real node."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
import runstate
from runstate import AsyncRunstate, Runstate

from tests._http import new_space
from tests._nodes import DevNode


def space(node: DevNode) -> str:
    return new_space(node.url, "sdk-rt")


def test_named_runs_and_child_runs(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            first = await rs.scopes.named("nightly")
            assert (await rs.scopes.named("nightly")).id == first.id
            assert (await rs.default_scope()).view["name"] == "default"  # type: ignore[index]
            child = await first.child(name="shard")
            assert (await child.status())["parentId"] == first.id
            await first.cancel()
            assert (await child.status())["effective"] == "INACTIVE"
            assert (await rs.scopes.named("nightly")).id not in (first.id, child.id)

    asyncio.run(main())


def test_mailbox_modes_and_backlog_limit(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            created = await rs.mailboxes.ensure("bounded", backlog_limit=1)
            assert created["created"] is True and created["id"].startswith("mbx_")
            again = await rs.mailboxes.ensure("bounded")
            assert (again["created"], again["id"]) == (False, created["id"])
            assert (await rs.mailboxes.ensure("notes", mode="INBOX"))["mode"] == "INBOX"
            with pytest.raises(runstate.ConflictError):
                await rs.mailboxes.ensure("notes", mode="WORK")
            run = await rs.scopes.create()
            await run.mailbox("bounded").submit(1)
            with pytest.raises(runstate.BacklogFullError) as full:
                await run.mailbox("bounded").submit(2)
            assert full.value.code == "BACKLOG_FULL"
            with pytest.raises(runstate.ValidationError):
                await run.mailbox("notes").submit(1)  # an INBOX takes messages only
            with pytest.raises(runstate.NotFoundError):
                await run.mailbox("absent").submit(1)

    asyncio.run(main())


def test_ticket_cancel_join_detach_and_outcome_reason(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            await rs.mailboxes.ensure("work")
            run = await rs.scopes.create()
            ticket = await run.mailbox("work").submit({"n": 1})
            assert (await ticket.join("me", run.id))["subscribers"] == ["me"]
            assert (await ticket.detach("me"))["subscribers"] == []
            cancelled = await ticket.cancel("not needed")
            assert (cancelled["state"], cancelled["outcomeReason"]) == ("CANCELLED", "cancelled: not needed")
            result = await ticket.result(timeout_ms=1_000)
            assert (result["state"], result["outcomeReason"]) == ("CANCELLED", "cancelled: not needed")

            failing = await run.mailbox("work").submit({"n": 2}, attempts=1)

            def fail(data: Any, delivery: Any) -> None:
                raise ValueError("boom")

            worker = asyncio.create_task(run.mailbox("work").consume(fail))
            result = await failing.result(timeout_ms=30_000)
            assert (result["state"], result["outcomeReason"]) == ("FAILED", "handler_error: ValueError: boom")
            await run.cancel()
            await asyncio.wait_for(worker, 30)

    asyncio.run(main())


def test_consume_below_a_run_takes_the_tasks_of_its_child_runs(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            await rs.mailboxes.ensure("work")
            run = await rs.scopes.create()
            child = await run.child()
            ticket = await child.mailbox("work").submit({"n": 21})

            async def double(data: Any, delivery: Any) -> int:
                return int(data["n"]) * 2

            worker = asyncio.create_task(run.mailbox("work").consume(double, include_descendants=True))
            assert (await ticket.result(timeout_ms=30_000))["outcome"] == 42
            await run.cancel()
            await asyncio.wait_for(worker, 30)

    asyncio.run(main())


def test_delivery_settles_through_nack_and_a_stale_token_is_lease_lost(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            await rs.mailboxes.ensure("work")
            run = await rs.scopes.create()
            queue = run.mailbox("work")
            ticket = await queue.submit({"n": 1}, attempts=3)
            (first,) = await queue.receive(lease_ms=5_000)
            assert (await first.release())["state"] == "QUEUED"
            (second,) = await queue.receive(lease_ms=5_000)
            assert second.attempt == 1 and second.id != first.id  # a release counts no attempt
            assert (await second.retry(error="flaky", delay_ms=0))["state"] == "QUEUED"
            (third,) = await queue.receive(lease_ms=5_000)
            assert third.attempt == 2
            with pytest.raises(runstate.LeaseLostError):
                await second.complete(result={"payload": "late"})
            await third.renew(lease_ms=10_000)
            assert (await third.reject(error="bad"))["state"] == "FAILED"
            assert (await ticket.result(timeout_ms=1_000))["outcomeReason"] == "rejected: bad"

    asyncio.run(main())


def test_the_blocking_client_mirrors_the_new_calls(dev_node: DevNode) -> None:
    with Runstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
        run = rs.scopes.named("blocking")
        assert rs.scopes.named("blocking").id == run.id
        rs.mailboxes.ensure("work", backlog_limit=10)
        ticket = run.mailbox("work").submit({"n": 1})
        assert ticket.join("me", run.id)["subscribers"] == ["me"]
        assert ticket.detach("me")["subscribers"] == []
        child = run.child()
        below = child.mailbox("work").submit({"n": 2})
        stop = threading.Event()
        seen: list[Any] = []

        def handle(data: Any, delivery: Any) -> Any:
            seen.append(data["n"])
            if len(seen) == 2:
                stop.set()
            return data["n"]

        run.mailbox("work").consume(handle, stop=stop, include_descendants=True)
        assert sorted(seen) == [1, 2]
        assert below.result(timeout_ms=10_000)["outcome"] == 2
        assert ticket.cancel()["state"] == "SUCCEEDED"  # a finished task stays as it is


def test_the_module_api_uses_the_configured_named_run(dev_node: DevNode) -> None:
    from runstate.sdk import _runtime

    space_id, name = space(dev_node), f"nightly-{uuid.uuid4().hex[:6]}"
    with pytest.raises(runstate.ConfigError):
        runstate.configure(base_url=dev_node.url, space_id=space_id, run="")
    runstate.configure(base_url=dev_node.url, space_id=space_id, run=name)
    try:
        scope_id, is_default = _runtime.runtime().submit(_runtime.runtime().scope_id()).result(30)
        with Runstate(base_url=dev_node.url, space_id=space_id) as rs:
            assert (scope_id, is_default) == (rs.scopes.named(name).id, True)
            assert rs.default_scope().id != scope_id
    finally:
        runstate.close()
