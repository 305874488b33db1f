"""Resources on the three-node cluster: a slot, a budget reservation and a rate limit's window all
survive a leader kill (the new leader extends live leases), and a job's needs are honoured across
it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from runstate import AsyncRunstate, WaitTimeoutError

from tests._cluster import Cluster

LEASE_MS = 30_000


def test_holds_survive_a_leader_kill(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()

    async def main() -> None:
        urls = cluster.urls_from((leader + 1) % cluster.size)
        async with AsyncRunstate(api_key=cluster.admin_key, base_url=urls, holder="agent-1") as rs:
            await rs.pools.ensure("browser", size=1)
            await rs.limits.ensure("search-api", units=2, per="1h")
            await rs.budgets.ensure("model-usd", total=1.0)
            run = await rs.scopes.create()
            slot = await run.pools.acquire("browser", lease_ms=LEASE_MS, timeout_ms=5_000)
            reservation = await run.budgets.reserve("model-usd", 0.75, lease_ms=LEASE_MS, timeout_ms=5_000)
            await run.limits.take("search-api", units=2, timeout_ms=5_000)

            cluster.kill(leader)
            cluster.leader_index(exclude=[leader])

            pool = await rs.pools.status("browser")
            assert [(holder["leaseId"], holder["holder"]) for holder in pool["holders"]] == [(slot.id, "agent-1")]
            with pytest.raises(WaitTimeoutError):
                await run.pools.acquire("browser", timeout_ms=200)
            with pytest.raises(WaitTimeoutError):
                await run.budgets.reserve("model-usd", 0.5, timeout_ms=200)
            with pytest.raises(WaitTimeoutError):
                await run.limits.take("search-api", timeout_ms=200)
            await slot.renew()
            assert (await reservation.settle(0.25)) == {"charged": 0.25, "returned": 0.5}
            await slot.release()
            again = await run.pools.acquire("browser", timeout_ms=5_000)
            await again.release()
            budget = await rs.budgets.status("model-usd")
            assert (budget["spent"], budget["reserved"], budget["remaining"]) == (0.25, 0, 0.75)

    asyncio.run(main())
    cluster.wait_same_digest([index for index in range(cluster.size) if index != leader])
