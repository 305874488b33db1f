"""The whole cascade of "Cancel a run", for every kind of work, in the core and against a real node.

One cancel of the top run of a tree (top -> shard -> leaf) must, in that one command, end every
kind of work below it: unfinished tasks (plain and group members) CANCELLED, the group FINALIZED
with `cancelled`, waiting barriers and armed timers CANCELLED, a running job's slot returned;
afterwards every kind of new work on every run of the tree is refused (SCOPE_CANCELLED, changing
nothing), renewals and completes are refused, handing back stays allowed, and recorded results
stay readable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import runstate
from runstate import AsyncRunstate

from runstate_server.actors import errors, resources
from runstate_server.actors.state import RunState
from runstate_server.actors.storage import json_value
from tests._http import new_space
from tests._nodes import DevNode
from tests.test_actors_harness import MAILBOX, RETENTION_MS, Harness

LEASE_MS = 60_000


class Tree:
    """top -> shard -> leaf, with every kind of work in the leaf (and some in the top)."""

    def __init__(self, h: Harness, top_deadline_ms: int | None = None) -> None:
        self.h = h
        h.ok("pool.ensure", name="browser", size=4)
        h.ok("limit.ensure", name="api", units=100, interval_ms=1_000)
        h.ok("budget.ensure", name="usd", total_micros=resources.to_micros(10.0))
        self.top = h.create_run(deadline_ms=top_deadline_ms)
        self.shard = h.create_run(parent_id=self.top)
        self.leaf = h.create_run(parent_id=self.shard)
        leaf = self.leaf
        self.queued = h.submit(leaf, "queued")
        self.running = h.submit(leaf, "running")
        self.done = h.submit(leaf, "done")
        self.to_retry = h.submit(leaf, "to_retry")
        self.to_reject = h.submit(leaf, "to_reject")
        delivered = {h.task_of(d).key: d for d in h.receive(leaf, max=5, lease_ms=LEASE_MS)}
        h.delivery("complete", delivered["done"], payload="kept")
        h.delivery("release", delivered["queued"])
        self.held_delivery = delivered["running"]
        self.retry_delivery, self.reject_delivery = delivered["to_retry"], delivered["to_reject"]
        # A job that holds a slot while it runs, in the shard.
        self.job = h.ok("task.submit", **{**h.submit_args(self.shard, "job"), "needs": {"slots": ["browser"]}})["task_id"]
        (self.job_delivery,) = h.receive(self.shard, lease_ms=LEASE_MS)
        token = h.ok("once.acquire", run_id=leaf, key="c", lease_ms=LEASE_MS, holder="w")["token"]
        self.once_lease = {"run_id": leaf, "key": "c", "token": token}
        self.claim_lease = {"key": "m", "token": h.ok("claim.acquire", run_id=leaf, key="m", lease_ms=LEASE_MS)["token"]}
        group = h.ok(
            "group.create", run_id=leaf, parent_id=leaf, mailbox=MAILBOX, condition="ALL_TERMINAL",
            retention_ms=RETENTION_MS,
        )
        self.group, self.group_run = group["group_id"], group["run_id"]
        self.member = h.ok("group.submit", group_id=self.group, key="m", input=1, input_hash="m")["task_id"]
        self.waiting_barrier = h.ok("barrier.create", run_id=leaf, target=2)["barrier_id"]
        h.ok("barrier.arrive", barrier_id=self.waiting_barrier, key="a")
        self.released_barrier = h.ok("barrier.create", run_id=leaf, target=1)["barrier_id"]
        h.ok("barrier.arrive", barrier_id=self.released_barrier, key="a")
        self.armed_timer = h.ok("timer.create", run_id=leaf, after_ms=3_600_000)["timer_id"]
        self.fired_timer = h.ok("timer.create", run_id=leaf, after_ms=0)["timer_id"]
        h.tick()
        self.slot = h.ok("pool.acquire", name="browser", run_id=leaf, lease_ms=LEASE_MS, holder="w")["lease_id"]
        self.reservation = h.ok(
            "budget.reserve", name="usd", run_id=leaf, amount_micros=resources.to_micros(1.0), lease_ms=LEASE_MS,
            holder="w",
        )["reservation_id"]

    def pool_in_use(self) -> int:
        view = resources.pool_view(self.h.state, self.h.space, "browser")
        assert view is not None
        return int(view["inUse"])


STOPS = {
    # how the top run stops: (its stored state, what its unfinished tasks become, the refusal code)
    "run.cancel": (RunState.CANCELLED, "CANCELLED", errors.SCOPE_CANCELLED),
    "run.complete": (RunState.COMPLETED, "CANCELLED", errors.SCOPE_CANCELLED),
    "deadline": (RunState.ACTIVE, "EXPIRED", errors.DEADLINE_EXCEEDED),
}
DEADLINE_MS = 1_000  # well inside every lease: the deadline, not a lapse, stops the work


def stopped_tree(h: Harness, stop: str) -> Tree:
    """A tree whose top run was just stopped by `stop`, in one command."""
    h.ensure()
    tree = Tree(h, top_deadline_ms=h.now_ms + DEADLINE_MS if stop == "deadline" else None)
    commands = h.commands
    if stop == "deadline":
        h.advance(DEADLINE_MS)
        h.tick()
    else:
        h.ok(stop, run_id=tree.top, retention_ms=RETENTION_MS)
    assert h.commands == commands + 1  # everything below happened in this one command
    return tree


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_one_stop_ends_every_kind_of_work_below_in_one_command(h: Harness, stop: str) -> None:
    stored, ended, _ = STOPS[stop]
    tree = stopped_tree(h, stop)
    state = h.state
    assert h.run(tree.top).stored_state == stored
    for below in (tree.shard, tree.leaf, tree.group_run):
        assert h.run(below).stored_state == RunState.ACTIVE  # its own state; inactive through the top
    unfinished = (tree.queued, tree.running, tree.to_retry, tree.to_reject, tree.job, tree.member)
    assert {h.task(task_id).state for task_id in unfinished} == {ended}
    assert (h.task(tree.done).state, json_value(h.task(tree.done).outcome)) == ("SUCCEEDED", "kept")  # recorded results stay
    group = state.groups[tree.group]
    assert (group.state, group.outcome, group.outcome_reason) == ("FINALIZED", "FAILURE", "cancelled")
    assert state.barriers[tree.waiting_barrier].state == "CANCELLED"
    assert state.barriers[tree.released_barrier].state == "RELEASED"  # released before: stays
    assert state.timers[tree.armed_timer].state == "CANCELLED"
    assert state.timers[tree.fired_timer].state == "FIRED"  # fired before: stays, can be acknowledged
    assert tree.pool_in_use() == 1  # the job's slot came back; the direct lease is handed back by its holder


@pytest.mark.parametrize("stop", sorted(STOPS))
def test_after_the_stop_new_work_on_every_run_of_the_tree_is_refused_and_changes_nothing(h: Harness, stop: str) -> None:
    tree = stopped_tree(h, stop)
    cancelled = STOPS[stop][2]
    for run_id in (tree.top, tree.shard, tree.leaf, tree.group_run):
        new_work: dict[str, dict[str, Any]] = {
            "task.submit": h.submit_args(run_id, "new"),
            "task.receive": {"run_id": run_id, "mailbox": MAILBOX, "max": 1, "lease_ms": LEASE_MS, "holder": "w"},
            "once.acquire": {"run_id": run_id, "key": "new", "lease_ms": LEASE_MS, "holder": "w"},
            "claim.acquire": {"run_id": run_id, "key": "new", "lease_ms": LEASE_MS, "holder": "w"},
            "run.create": {"parent_id": run_id},
            "group.create": {"run_id": run_id, "mailbox": MAILBOX, "condition": "FIRST_ACCEPTED",
                             "retention_ms": RETENTION_MS},
            "barrier.create": {"run_id": run_id, "target": 1},
            "timer.create": {"run_id": run_id, "after_ms": 1_000},
            "pool.acquire": {"name": "browser", "run_id": run_id, "lease_ms": LEASE_MS, "holder": "w"},
            "limit.take": {"name": "api", "run_id": run_id, "units": 1},
            "budget.reserve": {"name": "usd", "run_id": run_id, "amount_micros": 1, "lease_ms": LEASE_MS,
                               "holder": "w"},
        }
        for kind, args in new_work.items():
            assert h.err(kind, **args) == cancelled, (run_id, kind)
    # The group's new members are new work of a stopped run, too; a member already there is returned.
    assert h.err("group.submit", group_id=tree.group, key="new", input=2, input_hash="new") == cancelled
    assert h.ok("group.submit", group_id=tree.group, key="m", input=1, input_hash="m")["task_id"] == tree.member
    assert h.err("barrier.arrive", barrier_id=tree.waiting_barrier, key="b") == errors.BARRIER_CANCELLED
    # Renewals and completes are refused, so holders learn the run stopped.
    assert h.err("delivery.renew", delivery_id=tree.held_delivery, lease_ms=LEASE_MS) == cancelled
    assert h.err("delivery.complete", delivery_id=tree.held_delivery, payload=1) == cancelled
    assert h.err("once.renew", **tree.once_lease, lease_ms=LEASE_MS) == cancelled
    assert h.err("once.complete", **tree.once_lease, result=1) == cancelled
    assert h.err("claim.renew", **tree.claim_lease, lease_ms=LEASE_MS) == cancelled
    assert h.err("pool.renew", lease_id=tree.slot, lease_ms=LEASE_MS) == cancelled
    assert h.err("budget.renew", reservation_id=tree.reservation, lease_ms=LEASE_MS) == cancelled
    # Handing back stays allowed, and changes no finished state.
    h.delivery("release", tree.held_delivery)
    h.delivery("retry", tree.retry_delivery)
    h.delivery("reject", tree.reject_delivery)
    assert {h.task(t).state for t in (tree.running, tree.to_retry, tree.to_reject)} == {STOPS[stop][1]}
    h.ok("once.release", **tree.once_lease)
    h.ok("claim.release", **tree.claim_lease)
    assert h.ok("pool.release", lease_id=tree.slot) == {"released": True}
    h.ok("budget.settle", reservation_id=tree.reservation, spent_micros=0)
    assert tree.pool_in_use() == 0
    h.ok("timer.acknowledge", timer_id=tree.fired_timer)  # a firing from before stays deliverable


def test_a_group_of_a_run_past_a_deadline_above_refuses_members_with_deadline_exceeded(h: Harness) -> None:
    h.ensure()
    top = h.create_run(deadline_ms=h.now_ms + 1_000)
    group = h.ok(
        "group.create", run_id=top, parent_id=top, mailbox=MAILBOX, condition="FIRST_ACCEPTED",
        retention_ms=RETENTION_MS,
    )["group_id"]
    h.advance(1_000)
    assert h.err("group.submit", group_id=group, key="a", input=1, input_hash="a") == errors.DEADLINE_EXCEEDED
    h.tick()  # the deadline stops the run: the group is finalized, and still refuses as the run does
    assert h.state.groups[group].outcome_reason == "cancelled"
    assert h.err("group.submit", group_id=group, key="a", input=1, input_hash="a") == errors.DEADLINE_EXCEEDED


def test_a_group_decided_on_its_own_still_answers_group_closed(h: Harness) -> None:
    h.ensure()
    top = h.create_run()
    group = h.ok(
        "group.create", run_id=top, parent_id=top, mailbox=MAILBOX, condition="N_ACCEPTED", threshold=1,
        retention_ms=RETENTION_MS,
    )["group_id"]
    assert h.ok("group.close", group_id=group)["outcome_reason"] == "threshold_unreachable"
    assert h.err("group.submit", group_id=group, key="a", input=1, input_hash="a") == "CONFLICT"


# -- against a real node, through the SDK ----------------------------------------------------------


def test_the_cascade_through_the_sdk(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=new_space(dev_node.url, "cascade")) as rs:
            await rs.mailboxes.ensure("work")
            await rs.pools.ensure("browser", size=2)
            await rs.limits.ensure("api", units=100, per="1s")
            await rs.budgets.ensure("usd", total=10.0)
            # The spec's sample, with every kind of work below the run.
            run = await rs.scopes.create(deadline=datetime.now(timezone.utc) + timedelta(hours=1))
            shard = await run.child()  # a sub-run, cancelled along with its parent
            leaf = await shard.child()
            queued = await leaf.mailbox("work").submit({"n": 1}, key="queued")
            await leaf.mailbox("work").submit({"n": 2}, key="running")
            (delivery,) = await leaf.mailbox("work").receive(max=1)
            group = await leaf.groups.create(mailbox="work", condition="FIRST_ACCEPTED", parent_scope_id=leaf.id)
            member = await group.submit({"m": 1}, key="m")
            barrier = await leaf.barriers.create(target=2)
            await barrier.arrive(key="a")
            timer = await leaf.timers.create(after_seconds=3600)
            slot = await leaf.pools.acquire("browser")

            # ... later, from any process that knows the run id:
            await rs.scope(run.id).cancel()

            status = await shard.status()
            assert (status["storedState"], status["effective"]) == ("ACTIVE", "INACTIVE")
            assert (await run.status())["storedState"] == "CANCELLED"
            assert (await queued.result(timeout_ms=5_000))["state"] == "CANCELLED"
            decision = await group.wait(timeout_ms=5_000)
            assert (decision["outcome"], decision["outcomeReason"]) == ("FAILURE", "cancelled")
            assert decision["members"][0]["state"] == "CANCELLED"
            assert (await timer.status())["state"] == "CANCELLED"
            with pytest.raises(runstate.ConflictError) as barrier_cancelled:
                await barrier.wait(timeout_ms=5_000)
            assert barrier_cancelled.value.code == "BARRIER_CANCELLED"

            refused: list[Callable[[], Awaitable[Any]]] = []
            for scope in (run, shard, leaf, rs.scope(group.scope_id or "")):
                refused += [
                    lambda scope=scope: scope.mailbox("work").submit({"n": 9}, key="new"),
                    lambda scope=scope: scope.mailbox("work").receive(max=1),
                    lambda scope=scope: scope.child(),
                    lambda scope=scope: scope.groups.create(mailbox="work", condition="FIRST_ACCEPTED"),
                    lambda scope=scope: scope.barriers.create(target=1),
                    lambda scope=scope: scope.timers.create(after_seconds=1),
                    lambda scope=scope: scope.pools.acquire("browser", timeout_ms=1_000),
                    lambda scope=scope: scope.limits.take("api", timeout_ms=1_000),
                    lambda scope=scope: scope.budgets.reserve("usd", 0.1, timeout_ms=1_000),
                    lambda scope=scope: rs.claims.acquire(scope.id, "new"),
                ]
            refused += [
                lambda: group.submit({"m": 2}, key="m2"),
                lambda: delivery.renew(),
                lambda: delivery.complete(result={"payload": 1}),
                lambda: slot.renew(),
            ]
            for index, call in enumerate(refused):
                with pytest.raises(runstate.ScopeCancelledError):
                    await call()
                    pytest.fail(f"call {index} was not refused")
            assert (await group.submit({"m": 1}, key="m")).id == member.id  # an existing member is returned
            # Handing back stays allowed.
            await delivery.release()
            await slot.release()
            assert (await rs.pools.status("browser"))["inUse"] == 0

    asyncio.run(main())
