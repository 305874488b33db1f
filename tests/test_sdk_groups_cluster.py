"""A task group on the three-node cluster decides once, across a leader kill."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from runstate import AsyncRunstate

from tests._cluster import Cluster

RESULT_TIMEOUT_MS = 30_000


def test_a_group_finalizes_once_across_a_leader_kill(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()

    async def main() -> None:
        async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.urls_from((leader + 1) % cluster.size)) as rs:
            await rs.mailboxes.ensure("reviews", mode="WORK")
            run = await rs.scopes.create()
            group = await run.groups.create(mailbox="reviews", condition="N_ACCEPTED", threshold=2, parent_scope_id=run.id)
            tickets = [await group.submit({"draft": i}, key=f"draft-{i}") for i in range(4)]
            await group.close()
            queue = rs.scope(group.scope_id or "").mailbox("reviews")
            for delivery in await queue.receive(max=4, wait_ms=5_000):
                await delivery.complete(result={"payload": delivery.input["draft"]})
            results = [await ticket.result(timeout_ms=RESULT_TIMEOUT_MS) for ticket in tickets]
            assert [result["state"] for result in results] == ["SUCCEEDED"] * 4
            first = await group.accept(tickets[0].id)
            assert first["groupState"] == "SEALED"

            cluster.kill(leader)  # the next verdicts reach the new leader
            verdicts: list[dict[str, Any]] = list(
                await asyncio.gather(*(group.accept(ticket.id) for ticket in tickets[1:]))
            )
            assert sorted(verdict["late"] for verdict in verdicts) == [False, True, True]
            decision = await group.wait(timeout_ms=RESULT_TIMEOUT_MS)
            assert (decision["state"], decision["outcome"], decision["outcomeReason"]) == (
                "FINALIZED", "SUCCESS", "threshold_reached"
            )
            cluster.start(leader)
            cluster.wait_same_digest()
            again = await rs.scope(run.id).groups.by_id(group.id).status()
            assert (again["outcome"], again["outcomeReason"]) == ("SUCCESS", "threshold_reached")
            accepted = [member for member in again["members"] if member["verdict"] == "ACCEPTED" and not member["late"]]
            assert len(accepted) == 2

    asyncio.run(main())
