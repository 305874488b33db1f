"""Worker identity in the core: the holder a client declares is kept with every verdict, and who
finished a task or a once entry is known from the lease that did (runstate_server.actors.groups, tasks,
once),
through snapshots too."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from runstate_server.actors import errors, once, tasks
from runstate_server.actors.groups import Group
from runstate_server.actors.state import OnceState, TaskState, from_snapshot, to_snapshot
from tests.test_actors_harness import MAILBOX, RETENTION_MS, Harness, pack, round_trip, unpack

LEASE_MS = 10_000


def deliver(h: Harness, run_id: str, holder: str | None) -> str:
    """Deliver the next task of the run to `holder` (None: a worker that declared none)."""
    args: dict[str, Any] = {"run_id": run_id, "mailbox": MAILBOX, "max": 1, "lease_ms": LEASE_MS}
    if holder is not None:
        args["holder"] = holder
    (task_id,) = h.ok("task.receive", **args)["task_ids"]
    delivery_id = h.task(task_id).delivery_id
    assert delivery_id is not None
    return delivery_id


class Members:
    """A group whose members `keys` all SUCCEEDED, each finished by worker `w-<key>`."""

    def __init__(self, h: Harness, run_id: str, condition: str, *keys: str) -> None:
        self.h = h
        created = h.ok("group.create", run_id=run_id, mailbox=MAILBOX, condition=condition,
                       retention_ms=RETENTION_MS)
        self.id, self.run_id = created["group_id"], created["run_id"]
        self.tasks: dict[str, str] = {}
        for key in keys:
            input = {"key": key}
            submitted = h.ok("group.submit", group_id=self.id, key=key, input=input, input_hash=f"hash:{input!r}")
            self.tasks[key] = submitted["task_id"]
        for key in keys:
            h.delivery("complete", deliver(h, self.run_id, f"w-{key}"), payload=key)

    @property
    def group(self) -> Group:
        group = self.h.state.groups[self.id]
        assert isinstance(group, Group)
        return group

    def verdict(self, kind: str, key: str, holder: str | None) -> dict[str, Any]:
        args: dict[str, Any] = {"group_id": self.id, "task_id": self.tasks[key]}
        if holder is not None:
            args["holder"] = holder
        return self.h.ok(f"group.{kind}", **args)

    def verdict_by(self) -> dict[str, str | None]:
        return {key: self.group.verdict_by.get(task_id) for key, task_id in self.tasks.items()}


# -- verdicts ------------------------------------------------------------------------------------


def test_each_verdict_records_the_holder_that_gave_it(h: Harness, run_id: str) -> None:
    g = Members(h, run_id, "ALL_TERMINAL", "a", "b", "c")
    g.verdict("accept", "a", "reviewer-1")
    g.verdict("reject", "b", "reviewer-2")
    g.verdict("accept", "c", None)  # a client that declared no holder
    assert g.verdict_by() == {"a": "reviewer-1", "b": "reviewer-2", "c": None}
    assert g.group.verdicts == {g.tasks["a"]: "ACCEPTED", g.tasks["b"]: "REJECTED", g.tasks["c"]: "ACCEPTED"}


def test_a_late_verdict_keeps_its_own_holder(h: Harness, run_id: str) -> None:
    g = Members(h, run_id, "FIRST_ACCEPTED", "a", "b")
    assert g.verdict("accept", "a", "reviewer-1")["state"] == "FINALIZED"
    late = g.verdict("reject", "b", "reviewer-2")
    assert (late["late"], late["outcome"]) == (True, "SUCCESS")
    assert g.verdict_by() == {"a": "reviewer-1", "b": "reviewer-2"}
    assert g.group.late == [g.tasks["b"]]


def test_a_repeated_verdict_keeps_the_first_holder(h: Harness, run_id: str) -> None:
    g = Members(h, run_id, "ALL_TERMINAL", "a", "b")
    g.verdict("accept", "a", "reviewer-1")
    assert g.verdict("accept", "a", "reviewer-3")["verdict"] == "ACCEPTED"  # idempotent: nothing recorded
    assert h.err("group.reject", group_id=g.id, task_id=g.tasks["a"], holder="reviewer-3") == errors.CONFLICT
    assert g.verdict_by() == {"a": "reviewer-1", "b": None}


def test_a_refused_verdict_records_no_holder(h: Harness, run_id: str) -> None:
    g = Members(h, run_id, "ALL_TERMINAL", "a")
    input = {"key": "running"}
    running = h.ok("group.submit", group_id=g.id, key="running", input=input, input_hash=f"hash:{input!r}")
    assert h.err("group.accept", group_id=g.id, task_id=running["task_id"], holder="reviewer-1") == errors.CONFLICT
    assert g.group.verdict_by == {}


# -- who finished a task -------------------------------------------------------------------------


def test_a_task_is_finished_by_the_holder_of_the_delivery_that_recorded_its_result(h: Harness, run_id: str) -> None:
    completed, rejected, retried = h.submit(run_id, "completed"), h.submit(run_id, "rejected"), h.submit(run_id, "retried")
    first = deliver(h, run_id, "w1")
    assert tasks.finisher(h.task(completed)) is None  # RUNNING: not finished yet
    h.delivery("complete", first, payload=1)
    h.delivery("reject", deliver(h, run_id, "w2"), error="bad input")
    h.delivery("retry", deliver(h, run_id, "w1"), error="flaky", delay_ms=0)  # attempt 1 fails, back in the queue
    h.delivery("complete", deliver(h, run_id, "w3"), payload=3)  # attempt 2 by another worker
    assert [h.task(task_id).state for task_id in (completed, rejected, retried)] == [
        TaskState.SUCCEEDED, TaskState.FAILED, TaskState.SUCCEEDED
    ]
    assert [tasks.finisher(h.task(task_id)) for task_id in (completed, rejected, retried)] == ["w1", "w2", "w3"]


def test_a_lapse_of_the_last_attempt_is_finished_by_the_lapsed_holder(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "slow", attempts=1)
    deliver(h, run_id, "w9")
    h.advance(LEASE_MS)
    h.tick()
    task = h.task(task_id)
    assert (task.state, task.error, tasks.finisher(task)) == (TaskState.FAILED, "lease expired (holder w9)", "w9")


def test_a_task_its_run_stopped_or_an_anonymous_worker_finished_has_no_finisher(h: Harness, run_id: str) -> None:
    anonymous = h.submit(run_id, "anonymous")
    h.delivery("complete", deliver(h, run_id, None), payload=1)
    running = h.submit(run_id, "running")
    delivery_id = deliver(h, run_id, "w1")
    queued = h.submit(run_id, "queued")
    h.cancel(run_id)
    h.delivery("release", delivery_id)  # the hand-back after the stop ends nothing more
    assert [h.task(task_id).state for task_id in (anonymous, running, queued)] == [
        TaskState.SUCCEEDED, TaskState.CANCELLED, TaskState.CANCELLED
    ]
    assert h.task(running).holder == "w1"  # it had a holder, but its run's stop ended it
    assert [tasks.finisher(h.task(task_id)) for task_id in (anonymous, running, queued)] == [None, None, None]


# -- who finished a once entry -------------------------------------------------------------------


def acquire(h: Harness, run_id: str, key: str, holder: str, **args: Any) -> dict[str, Any]:
    answer = h.ok("once.acquire", run_id=run_id, key=key, lease_ms=LEASE_MS, holder=holder, **args)
    assert answer["state"] == "GRANTED", answer
    return {"run_id": run_id, "key": key, "token": answer["token"]}


def entry_of(h: Harness, run_id: str, key: str) -> Any:
    return h.state.once[h.run(run_id).once[key]]


def test_an_entry_is_finished_by_the_holder_of_the_lease_that_made_it_final(h: Harness, run_id: str) -> None:
    lease = acquire(h, run_id, "done", "c1")
    assert once.finisher(entry_of(h, run_id, "done")) is None  # HELD
    h.ok("once.release", **lease)
    assert once.finisher(entry_of(h, run_id, "done")) is None  # OPEN
    h.ok("once.complete", **acquire(h, run_id, "done", "c2"), result=42)
    h.ok("once.fail", **acquire(h, run_id, "failed", "c1"), error="first", max_attempts=2)
    h.ok("once.fail", **acquire(h, run_id, "failed", "c3"), error="second", max_attempts=2)
    acquire(h, run_id, "lapsed", "c4", max_attempts=1)
    h.advance(LEASE_MS)
    h.tick()
    found = {key: entry_of(h, run_id, key) for key in ("done", "failed", "lapsed")}
    assert [entry.state for entry in found.values()] == [OnceState.DONE, OnceState.FAILED, OnceState.FAILED]
    assert {key: once.finisher(entry) for key, entry in found.items()} == {"done": "c2", "failed": "c3", "lapsed": "c4"}


# -- snapshots -----------------------------------------------------------------------------------


def identity_harness() -> tuple[Harness, Members, str]:
    h = Harness()
    h.ensure()
    run_id = h.create_run()
    g = Members(h, run_id, "FIRST_ACCEPTED", "a", "b", "c")
    g.verdict("accept", "a", "reviewer-1")
    g.verdict("reject", "b", "reviewer-2")  # late
    h.ok("once.complete", **acquire(h, run_id, "k", "c1"), result="r")
    return h, g, run_id


def test_snapshot_round_trip_keeps_who_did_what() -> None:
    h, g, run_id = identity_harness()
    restored = round_trip(h.state)
    assert restored == h.state
    group = restored.groups[g.id]
    assert group.verdict_by == {g.tasks["a"]: "reviewer-1", g.tasks["b"]: "reviewer-2"}
    assert [tasks.finisher(restored.tasks[task_id]) for task_id in g.tasks.values()] == ["w-a", "w-b", "w-c"]
    entry = restored.once[restored.runs[run_id].once["k"]]
    assert once.finisher(entry) == "c1"


def test_a_snapshot_row_from_before_verdict_holders_still_loads() -> None:
    h, g, _ = identity_harness()
    snapshot = unpack(pack(to_snapshot(h.state)))
    assert snapshot["v"] == 1
    # The layout without verdict_by (and the fields after it), from before creation numbers too.
    verdict_by = [field.name for field in dataclasses.fields(Group)].index("verdict_by")
    snapshot["groups"] = [row[:verdict_by] for row in snapshot["groups"]]
    del snapshot["creation_seq"]
    restored = from_snapshot(snapshot)
    group = restored.groups[g.id]
    assert group.verdict_by == {} and group.outside == {}
    assert group.verdicts == h.state.groups[g.id].verdicts and group.late == h.state.groups[g.id].late
    # An old group takes verdicts with holders from then on, like a new one.
    twin = Harness()
    twin.core.restore(snapshot)
    twin.now_ms, twin.commands = h.now_ms, h.commands
    twin.ok("group.reject", group_id=g.id, task_id=g.tasks["c"], holder="reviewer-3")
    assert twin.state.groups[g.id].verdict_by == {g.tasks["c"]: "reviewer-3"}


def test_a_snapshot_row_with_unknown_fields_is_refused() -> None:
    h, _, _ = identity_harness()
    snapshot = unpack(pack(to_snapshot(h.state)))
    snapshot["groups"] = [[*row, "from the future"] for row in snapshot["groups"]]
    with pytest.raises(ValueError, match="groups row"):
        from_snapshot(snapshot)
