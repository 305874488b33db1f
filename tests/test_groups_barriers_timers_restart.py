"""Groups, barriers and timers survive a kill -9 of the node: a new client re-attaches by id
(`run.groups.by_id`, `scope(id).barriers.get`, `run.timers.get`) and carries on; a timer fires on
the server whether or not anyone waits, and one that fell due while the node was down fires once
after the restart."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from runstate import AsyncRunstate

from tests._nodes import DevNode

WAIT_MS = 10_000
DOWN_S = 1.5  # the node stays down past timer `due_while_down`'s time


def test_a_new_client_re_attaches_by_id_after_a_kill_and_restart(node_factory: Any) -> None:
    node: DevNode = node_factory().start()
    ids: dict[str, str] = {}

    async def before() -> dict[str, Any]:
        async with AsyncRunstate(base_url=node.url, holder="before") as rs:
            await rs.mailboxes.ensure("reviews")
            run = await rs.scopes.create()
            ids["run"] = run.id
            group = await run.groups.create(mailbox="reviews", condition="N_ACCEPTED", threshold=2, parent_scope_id=run.id)
            ids["group"] = group.id
            tickets = [await group.submit({"draft": n}, key=f"draft-{n}") for n in range(3)]
            ids.update({f"draft-{n}": ticket.id for n, ticket in enumerate(tickets)})
            assert (await group.close())["state"] == "SEALED"
            queue = rs.scope(group.scope_id or "").mailbox("reviews")
            for delivery in await queue.receive(max=2):
                await delivery.complete(result={"payload": "ok"})
            assert (await group.accept(tickets[0]))["groupState"] == "SEALED"

            barrier = await run.barriers.create(target=2)
            ids["barrier"] = barrier.id
            await barrier.arrive(key="a")

            unwatched = await run.timers.create(after_seconds=0)
            ids["unwatched"] = unwatched.id
            ids["due_while_down"] = (await run.timers.create(after_seconds=DOWN_S / 2)).id
            ids["armed"] = (await run.timers.create(after_seconds=3600)).id
            # Nobody waits on `unwatched`: the server fires it anyway (its status says so).
            deadline = time.monotonic() + WAIT_MS / 1000
            while (status := await unwatched.status())["state"] != "FIRED":
                assert time.monotonic() < deadline, status
                await asyncio.sleep(0.05)
            return status

    unwatched_before = asyncio.run(before())
    node.kill()
    time.sleep(DOWN_S)
    node.start()

    async def after() -> None:
        async with AsyncRunstate(base_url=node.url, holder="after") as rs:
            run = rs.scope(ids["run"])
            group = run.groups.by_id(ids["group"])
            status = await group.status()
            assert (status["state"], [m["verdict"] for m in status["members"]]) == ("SEALED", ["ACCEPTED", None, None])
            decided = await group.accept(ids["draft-1"])
            assert (decided["groupState"], decided["outcomeReason"], decided["late"]) == (
                "FINALIZED", "threshold_reached", False
            )
            assert (await group.wait(timeout_ms=WAIT_MS))["members"][2]["state"] == "CANCELLED"

            barrier = rs.scope(ids["run"]).barriers.get(ids["barrier"])
            assert (await barrier.arrive(key="a"))["arrived"] is False  # still counted from before
            await barrier.arrive(key="b")
            view = await barrier.wait(timeout_ms=WAIT_MS)
            assert (view["state"], view["arrivals"], view["target"]) == ("RELEASED", 2, 2)

            fired = await run.timers.get(ids["unwatched"]).wait(timeout_ms=WAIT_MS)
            assert (fired["state"], fired["firedAt"]) == ("ACKED", unwatched_before["firedAt"])
            late = run.timers.get(ids["due_while_down"])
            fired_late = await late.wait(timeout_ms=WAIT_MS)
            assert late.fire_at is not None and fired_late["fired_at"] >= late.fire_at
            assert (await late.wait(timeout_ms=WAIT_MS))["firedAt"] == fired_late["firedAt"]  # once
            assert (await run.timers.get(ids["armed"]).status())["state"] == "ARMED"

    asyncio.run(after())
