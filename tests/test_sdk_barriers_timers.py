"""Barriers and timers through the SDK, against a real dev node and a real three-node cluster: the
spec's samples in Python, concurrent arrivals, cancellation, and a timer across a leader kill."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import runstate
from runstate import AsyncRunstate, Runstate

from tests._cluster import Cluster
from tests._http import Api, new_space
from tests._nodes import DevNode


def space(node: DevNode) -> str:
    return new_space(node.url, "bt")


def test_the_spec_samples(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            run = await rs.scopes.create()
            # Coordinator:
            barrier = await run.barriers.create(target=3)

            # Each shard, given barrier.id:
            async def shard(n: int) -> str:
                handle = rs.scope(run.id).barriers.get(barrier.id)
                await handle.arrive(key=f"shard-{n}")  # idempotent per key
                view = await handle.wait(timeout_ms=300_000)
                return f"{view['state']} {view['arrivals']}/{view['target']}"

            assert await asyncio.gather(*(shard(n) for n in range(3))) == ["RELEASED 3/3"] * 3

            timer = await run.timers.create(after_seconds=0.3)
            assert timer.fire_at is not None
            fired = await timer.wait(timeout_ms=360_000)
            assert fired["fired_at"] >= timer.fire_at
            again = run.timers.get(timer.id)  # re-attach by id
            assert (await again.status())["state"] == "ACKED"

    asyncio.run(main())


def test_fifty_concurrent_arrivals_with_thirty_keys_release_exactly_once(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            run = await rs.scopes.create()
            barrier = await run.barriers.create(target=30)
            keys = [f"k{n % 30}" for n in range(50)]
            waiters = [asyncio.create_task(rs.scope(run.id).barriers.get(barrier.id).wait(timeout_ms=60_000)) for _ in range(5)]
            answers = await asyncio.gather(*(barrier.arrive(key=key) for key in keys))
            assert sum(answer["arrived"] for answer in answers) == 30  # each distinct key counted once
            views = await asyncio.gather(*waiters)
            assert {(view["state"], view["arrivals"], view["epoch"], view["releasedAt"]) for view in views} == {
                ("RELEASED", 30, 1, views[0]["releasedAt"])
            }
            with pytest.raises(runstate.ConflictError) as released:
                await barrier.arrive(key="late")
            assert released.value.code == "BARRIER_RELEASED"
            assert (await barrier.next_epoch())["epoch"] == 2

    asyncio.run(main())


def test_a_waiter_late_for_a_release_is_not_held_for_the_next_epoch(dev_node: DevNode) -> None:
    """A shard that arrived in epoch 1 but waits only after the release and the coordinator's
    nextEpoch gets epoch 1's release; waiting for epoch 2 would need its own next arrival."""

    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            run = await rs.scopes.create()
            barrier = await run.barriers.create(target=2)
            slow = rs.scope(run.id).barriers.get(barrier.id)
            await slow.arrive(key="slow")
            await rs.scope(run.id).barriers.get(barrier.id).arrive(key="fast")  # releases epoch 1
            assert (await barrier.next_epoch())["epoch"] == 2
            view = await slow.wait(timeout_ms=5_000)
            assert (view["state"], view["epoch"], view["currentEpoch"], view["arrivals"]) == ("RELEASED", 1, 2, 2)
            # Its next round: arrives in epoch 2 and waits for that release.
            await slow.arrive(key="slow")
            waiting = asyncio.create_task(slow.wait(timeout_ms=30_000))
            await rs.scope(run.id).barriers.get(barrier.id).arrive(key="fast")
            view = await waiting
            assert (view["state"], view["epoch"], "currentEpoch" in view) == ("RELEASED", 2, False)
            # Without an arrival, a wait is for the epoch current when it begins.
            await barrier.next_epoch()
            with pytest.raises(runstate.WaitTimeoutError):
                await rs.scope(run.id).barriers.get(barrier.id).wait(timeout_ms=300)

    asyncio.run(main())


def test_waiting_for_an_epoch_over_http(dev_node: DevNode) -> None:
    api = Api(dev_node.url)
    run = api.ok("POST", "/v1/scopes", {})["id"]
    barrier = api.ok("POST", "/v1/barriers", {"scopeId": run, "target": 1})["id"]
    api.ok("POST", f"/v1/barriers/{barrier}/arrive", {"arrivalKey": "a"})
    api.ok("POST", f"/v1/barriers/{barrier}/nextEpoch")
    view = api.ok("GET", f"/v1/barriers/{barrier}/wait?epoch=1")
    assert (view["state"], view["epoch"], view["currentEpoch"], view["releasedAt"]) == ("RELEASED", 1, 2, None)
    assert api.ok("GET", f"/v1/barriers/{barrier}/wait?epoch=2")["state"] == "WAITING"
    for bad in ("3", "0", "x", "-1"):
        assert api.error("GET", f"/v1/barriers/{barrier}/wait?epoch={bad}") == (400, "VALIDATION_FAILED")


def test_cancelling_the_run_cancels_barriers_and_timers(dev_node: DevNode) -> None:
    with Runstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
        run = rs.scopes.create()
        barrier = run.barriers.create(target=2)
        timer = run.timers.create(after_seconds=3600)
        disarmed = run.timers.create(after_seconds=3600)
        assert disarmed.cancel()["state"] == "CANCELLED"
        with pytest.raises(runstate.WaitTimeoutError):
            barrier.wait(timeout_ms=100)
        run.cancel()
        with pytest.raises(runstate.ConflictError) as cancelled:
            barrier.wait(timeout_ms=5_000)
        assert cancelled.value.code == "BARRIER_CANCELLED"
        with pytest.raises(runstate.ConflictError):
            barrier.arrive(key="a")
        assert timer.status()["state"] == "CANCELLED"
        with pytest.raises(runstate.ConflictError):
            timer.wait(timeout_ms=5_000)
        with pytest.raises(runstate.ScopeCancelledError):
            run.timers.create(after_seconds=1)
        with pytest.raises(runstate.ConfigError):
            run.timers.create()


def test_a_timer_fires_once_across_a_leader_kill(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()

    async def main() -> None:
        async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.urls_from((leader + 1) % cluster.size)) as rs:
            run = await rs.scopes.create()
            timer = await run.timers.create(after_seconds=1.5)
            cluster.kill(leader)  # the timer falls due during (or after) the election
            fired: dict[str, Any] = await timer.wait(timeout_ms=30_000)
            assert fired["state"] == "ACKED" and fired["fired_at"] >= timer.fire_at
            cluster.start(leader)
            cluster.wait_same_digest()
            assert (await timer.status())["firedAt"] == fired["firedAt"]  # fired once: the same firing

    asyncio.run(main())


def test_named_barriers_and_timers_poll_and_ack_with_the_blocking_client(dev_node: DevNode) -> None:
    with Runstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
        run = rs.scopes.create()
        barrier = run.barriers.by_name("stage-2", target=2)
        assert run.barriers.by_name("stage-2", target=2).id == barrier.id  # the run's barrier of that name
        with pytest.raises(runstate.ConflictError) as conflict:
            run.barriers.by_name("stage-2", target=3)
        assert conflict.value.code == "CONFLICT"
        barrier.arrive("w1")
        assert barrier.arrive("w2")["state"] == "RELEASED"
        assert barrier.wait(timeout_ms=5_000)["arrivals"] == 2
        with pytest.raises(runstate.ConflictError) as late:
            run.barriers.by_name("stage-2", target=2).arrive("w3")
        assert late.value.code == "BARRIER_RELEASED"

        timer = run.timers.by_name("cooldown", after_seconds=0.2)
        assert timer.view is not None and timer.view["state"] == "ARMED"
        assert run.timers.by_name("cooldown", after_seconds=60).id == timer.id
        deadline = time.monotonic() + 5
        fired: list[dict[str, Any]] = []
        while not fired:
            assert time.monotonic() < deadline
            time.sleep(0.05)
            fired = [row for row in run.timers.poll() if row["id"] == timer.id]
        with pytest.raises(runstate.LeaseLostError):
            timer.ack("not-its-token")
        assert timer.ack(fired[0]["token"])["state"] == "ACKED"
        with pytest.raises(runstate.ConflictError):
            timer.ack(fired[0]["token"])
        assert run.timers.by_name("cooldown", after_seconds=1).view["state"] == "ACKED"  # type: ignore[index]
