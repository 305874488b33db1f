"""Worker identity end to end against a real dev node: two workers with their own holders, and what
the statuses show of them (who holds what while running, who finished what, who gave each verdict)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from runstate import AsyncRunstate

from tests._http import Api, new_space
from tests._nodes import DevNode

LEASE_MS = 30_000


def space(node: DevNode) -> str:
    return new_space(node.url, "identity")


@contextlib.asynccontextmanager
async def two_workers(url: str, space_id: str) -> AsyncIterator[tuple[AsyncRunstate, AsyncRunstate]]:
    """Two clients of one space, declaring the holders worker-a and worker-b."""
    async with (
        AsyncRunstate(base_url=url, space_id=space_id, holder="worker-a") as a,
        AsyncRunstate(base_url=url, space_id=space_id, holder="worker-b") as b,
    ):
        yield a, b


def test_statuses_show_who_holds_and_who_finished_tasks_once_entries_and_claims(dev_node: DevNode) -> None:
    space_id = space(dev_node)

    async def main() -> None:
        async with two_workers(dev_node.url, space_id) as (a, b):
            await a.mailboxes.ensure("work")
            run = await a.scopes.create()
            first = await run.mailbox("work").submit({"n": 1}, key="first")
            second = await run.mailbox("work").submit({"n": 2}, key="second")
            (delivery_a,) = await a.scope(run.id).mailbox("work").receive(lease_ms=LEASE_MS)
            (delivery_b,) = await b.scope(run.id).mailbox("work").receive(lease_ms=LEASE_MS)
            assert (delivery_a.task_id, delivery_b.task_id) == (first.id, second.id)
            granted_a = await a.once.acquire(run.id, "report", lease_seconds=LEASE_MS // 1000)
            granted_b = await b.once.acquire(run.id, "index", lease_seconds=LEASE_MS // 1000)
            lock = await b.claims.acquire(run.id, "lock", lease_seconds=LEASE_MS // 1000)
            assert (lock["holder"], lock["holderSession"]) == ("worker-b", b._transport.holder_session)
            shown = await a.claims.get(run.id, "lock")
            assert (shown["held"], shown["holder"]) == (True, "worker-b")

            # While running: the holder of each lease, nobody finished anything yet.
            running = [await first.status(), await second.status()]
            assert [(t["state"], t["holder"], t["finishedBy"]) for t in running] == [
                ("RUNNING", "worker-a", None), ("RUNNING", "worker-b", None)
            ]
            held = [await a.once.wait(run.id, key, wait_ms=0) for key in ("report", "index")]
            assert [(c["state"], c["holder"], c["finishedBy"]) for c in held] == [
                ("HELD", "worker-a", None), ("HELD", "worker-b", None)
            ]
            # Another client sees the same (the holder is the worker's, not the reader's).
            assert (await b.task(first.id).status())["holder"] == "worker-a"

            await delivery_a.complete({"payload": "done"})
            await delivery_b.reject(error="bad input")
            await a.once.complete(run.id, "report", granted_a["token"], {"pages": 3})
            await b.once.fail(run.id, "index", granted_b["token"], error="no index", max_attempts=1)

            # Afterwards: no current holder, and who finished each.
            finished = [await first.status(), await second.status()]
            assert [(t["state"], t["holder"], t["finishedBy"]) for t in finished] == [
                ("SUCCEEDED", None, "worker-a"), ("FAILED", None, "worker-b")
            ]
            final = [await a.once.wait(run.id, key, wait_ms=0) for key in ("report", "index")]
            assert [(c["state"], c["holder"], c["finishedBy"]) for c in final] == [
                ("DONE", None, "worker-a"), ("FAILED", None, "worker-b")
            ]
            unknown = await a.once.wait(run.id, "never-acquired", wait_ms=0)
            assert (unknown["state"], unknown["finishedBy"]) == ("OPEN", None)

    asyncio.run(main())


def test_group_status_shows_who_worked_on_and_who_judged_each_member(dev_node: DevNode) -> None:
    space_id = space(dev_node)

    async def main() -> None:
        async with two_workers(dev_node.url, space_id) as (a, b):
            await a.mailboxes.ensure("reviews")
            run = await a.scopes.create()
            group = await run.groups.create(mailbox="reviews", condition="FIRST_ACCEPTED", parent_scope_id=run.id)
            tickets = [await group.submit({"draft": i}, key=f"draft-{i}") for i in range(5)]
            group_run = group.scope_id
            assert group_run is not None
            (delivery_a,) = await a.scope(group_run).mailbox("reviews").receive(lease_ms=LEASE_MS)
            deliveries_b = await b.scope(group_run).mailbox("reviews").receive(max=2, lease_ms=LEASE_MS)
            assert [d.task_id for d in (delivery_a, *deliveries_b)] == [t.id for t in tickets[:3]]

            # Who holds what while running, from the member tasks.
            holders = [(await ticket.status())["holder"] for ticket in tickets]
            assert holders == ["worker-a", "worker-b", "worker-b", None, None]

            await delivery_a.complete({"payload": {"good": True}})
            for delivery in deliveries_b:
                await delivery.complete({"payload": {"good": False}})

            # Each worker judges the other's work; worker-a's accept decides.
            rejected = await a.scope(run.id).groups.by_id(group.id).reject(tickets[1])
            assert (rejected["verdict"], rejected["verdictBy"], rejected["late"]) == ("REJECTED", "worker-a", False)
            accepted = await b.scope(run.id).groups.by_id(group.id).accept(tickets[0])
            assert (accepted["verdictBy"], accepted["groupState"]) == ("worker-b", "FINALIZED")
            late = await group.reject(tickets[2])  # the creating client is worker-a
            assert (late["verdictBy"], late["late"]) == ("worker-a", True)
            # A repeat by someone else records nothing: the verdict keeps its first holder.
            again = await b.scope(run.id).groups.by_id(group.id).reject(tickets[1])
            assert again["verdictBy"] == "worker-a"

            # Over plain HTTP: the X-Runstate-Holder header, a body holder winning over it, and none.
            api = Api(dev_node.url, space_id)
            api.headers["X-Runstate-Holder"] = "ops-console"
            by_header = api.ok("POST", f"/v1/task-groups/{group.id}/tasks/{tickets[3].id}/reject")
            assert by_header["verdictBy"] == "ops-console"
            by_body = api.ok("POST", f"/v1/task-groups/{group.id}/tasks/{tickets[4].id}/reject", {"holder": "auditor"})
            assert by_body["verdictBy"] == "auditor"
            api.headers.pop("X-Runstate-Holder")
            # A holder too long is refused like one on any lease.
            status, answer = api("POST", f"/v1/task-groups/{group.id}/tasks/{tickets[4].id}/reject", {"holder": "x" * 129})
            assert (status, answer["error"]["code"]) == (400, "VALIDATION_FAILED")

            decision = await group.wait(timeout_ms=10_000)
            members: list[dict[str, Any]] = decision["members"]
            assert [(m["key"], m["state"], m["verdict"], m["verdictBy"], m["late"]) for m in members] == [
                ("draft-0", "SUCCEEDED", "ACCEPTED", "worker-b", False),
                ("draft-1", "SUCCEEDED", "REJECTED", "worker-a", False),
                ("draft-2", "SUCCEEDED", "REJECTED", "worker-a", True),
                ("draft-3", "CANCELLED", "REJECTED", "ops-console", True),
                ("draft-4", "CANCELLED", "REJECTED", "auditor", True),
            ]
            assert (await group.status())["members"] == members  # status and wait show the same
            # Who finished each member: the worker that completed it; nobody for a cancelled one.
            finished = [(await ticket.status())["finishedBy"] for ticket in tickets]
            assert finished == ["worker-a", "worker-b", "worker-b", None, None]

            # A client that declares no holder at all gives a verdict with none recorded.
            other = await run.groups.create(mailbox="reviews", condition="ALL_TERMINAL")
            ticket = await other.submit({"draft": "anonymous"})
            assert other.scope_id is not None
            (delivery,) = await a.scope(other.scope_id).mailbox("reviews").receive(lease_ms=LEASE_MS)
            await delivery.complete({"payload": "ok"})
            anonymous = api.ok("POST", f"/v1/task-groups/{other.id}/tasks/{ticket.id}/accept")
            assert anonymous["verdictBy"] is None
            assert [m["verdictBy"] for m in (await other.status())["members"]] == [None]

    asyncio.run(main())
