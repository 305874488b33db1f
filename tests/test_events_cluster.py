"""Events on a real three-node cluster: a watch resumed from its cursor after the leader is killed
misses and repeats nothing (the log and its numbers are replicated state)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from runstate import AsyncRunstate

from tests._cluster import Cluster


def test_a_watch_resumes_across_a_leader_kill_without_loss_or_repeat(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()

    async def main() -> None:
        async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.urls_from((leader + 1) % cluster.size)) as rs:
            runs = [await rs.scopes.create() for _ in range(3)]
            seen: list[dict[str, Any]] = []
            async for event in rs.events.watch(wait_seconds=2):
                seen.append(event)
                if len(seen) == 3:
                    break
            cursor = seen[-1]["cursor"]
            cluster.kill(leader)
            for run in runs:
                await run.cancel()  # acknowledged by the next leader
            async for event in rs.events.watch(cursor=cursor, wait_seconds=2):
                seen.append(event)
                if len(seen) == 6:
                    break
            assert [e["type"] for e in seen] == ["scope.created"] * 3 + ["scope.cancelled"] * 3
            assert [e["cursor"] for e in seen] == [str(n) for n in range(1, 7)]  # none lost, none twice
            assert [e["aggregateId"] for e in seen[3:]] == [run.id for run in runs]
            assert (await rs.events.list(cursor=seen[-1]["cursor"]))["events"] == []

    asyncio.run(main())
