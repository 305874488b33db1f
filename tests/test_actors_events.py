"""The event log (actors/events.py): an event for each applied change, once, in apply order, none for
a refused command; the log's bounds (count, weight, age) and its cursor; snapshots carry it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runstate_server.actors import events, limits
from runstate_server.actors.state import DueKind, TaskState, from_snapshot, to_snapshot
from tests.test_actors_harness import MAILBOX, SPACE, Harness


def log(h: Harness) -> list[Any]:
    return list(h.state.spaces[SPACE].events)


def task_states(h: Harness, task_id: str) -> list[str]:
    return [e.payload["state"] for e in log(h) if e.aggregate_id == task_id and e.type.startswith("task.")]


def test_a_task_s_life_is_told_once_each_step_in_order(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "a")
    (delivery,) = h.receive(run_id, lease_ms=1_000)
    assert ("wake", events.events_key(SPACE)) in h.all_effects
    h.advance(1_000)
    h.tick()  # the lease lapses: lost, queued again (at once: a lapse has no backoff)
    (delivery,) = h.receive(run_id)
    h.delivery("complete", delivery)
    assert [(e.type, e.payload.get("attempt")) for e in log(h) if e.aggregate_id == task_id] == [
        ("task.created", 0), ("task.running", 1), ("delivery.lease_lost", 1), ("task.queued", 1),
        ("task.running", 2), ("task.succeeded", 2),
    ]
    assert [e.seq for e in log(h)] == list(range(1, len(log(h)) + 1))
    assert log(h)[0].type == "scope.created" and log(h)[0].run_id == run_id


def test_a_refused_command_leaves_no_event(h: Harness, run_id: str) -> None:
    h.cancel(run_id)
    before = h.state.spaces[SPACE].event_seq
    assert h.err("task.submit", **h.submit_args(run_id, "late")) == "SCOPE_CANCELLED"  # err checks the state too
    assert h.state.spaces[SPACE].event_seq == before


def test_a_stop_tells_the_run_then_its_tasks_and_those_below(h: Harness, run_id: str) -> None:
    child = h.create_run(parent_id=run_id)
    a, b = h.submit(run_id, "a"), h.submit(child, "b")
    h.cancel(run_id)
    tail = [(e.type, e.aggregate_id) for e in log(h)][-3:]
    assert tail == [("scope.cancelled", run_id), ("task.cancelled", a), ("task.cancelled", b)]
    found, _ = events.read(h.state.spaces[SPACE], None, 100, events.matcher(h.state, None, None, child))
    assert [e.type for e in found] == ["scope.created", "task.created", "task.cancelled"]
    found, _ = events.read(h.state.spaces[SPACE], None, 100, events.matcher(h.state, frozenset({"scope.cancelled"}), None, run_id))
    assert [e.aggregate_id for e in found] == [run_id]


def test_deadline_and_complete(h: Harness) -> None:
    doomed = h.create_run(deadline_ms=h.now_ms + 1_000)
    done = h.create_run()
    h.complete_run(done)
    h.advance(1_000)
    h.tick()
    assert [(e.type, e.aggregate_id) for e in log(h)][-2:] == [("scope.completed", done), ("scope.expired", doomed)]


def test_the_oldest_go_past_the_count_and_a_cursor_before_them_is_expired(h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "events_per_space_max", 5)
    for key in "abcdef":
        h.submit(run_id, key)
    space = h.state.spaces[SPACE]
    assert [e.seq for e in space.events] == [3, 4, 5, 6, 7] and space.event_seq == 7
    with pytest.raises(events.CursorExpired):
        events.read(space, 1, 10)
    assert [e.seq for e in events.read(space, 2, 10)[0]] == [3, 4, 5, 6, 7]
    assert events.read(space, 7, 10) == ([], 7)
    with pytest.raises(events.CursorAhead):
        events.read(space, 8, 10)
    assert [e.seq for e in events.read(space, None, 2)[0]] == [3, 4]


def test_the_oldest_go_past_the_weight(h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in "abc":
        h.submit(run_id, key)
    space = h.state.spaces[SPACE]
    monkeypatch.setattr(limits, "event_bytes_per_space_max", space.event_bytes)
    h.submit(run_id, "d")
    assert [e.seq for e in space.events] == [3, 4, 5]  # the run's event, smaller, was not room enough
    assert space.event_bytes == sum(events.event_bytes(e) for e in space.events) <= limits.event_bytes_per_space_max


def test_events_age_out_by_the_tick_one_due_entry_per_log(h: Harness, run_id: str) -> None:
    def due_entries() -> int:
        return sum(1 for entry in h.state.due if entry[2] == DueKind.EVENTS_AGE)

    assert due_entries() == 1
    h.advance(limits.event_age_ms_max - 1)
    h.submit(run_id, "a")
    assert due_entries() == 1
    h.advance(1)
    h.tick()  # the run's event is an hour old: dropped; the task's stays, the entry re-armed
    assert [e.type for e in log(h)] == ["task.created"] and due_entries() == 1
    assert h.state.due[0][0] >= h.now_ms + limits.event_prune_interval_ms - 1
    h.advance(limits.event_age_ms_max + limits.event_prune_interval_ms)
    h.tick()
    assert log(h) == [] and due_entries() == 0 and h.state.spaces[SPACE].event_bytes == 0
    with pytest.raises(events.CursorExpired):
        events.read(h.state.spaces[SPACE], 0, 10)
    assert events.read(h.state.spaces[SPACE], None, 10) == ([], 2)
    h.submit(run_id, "b")  # the log starts again: one entry armed
    assert due_entries() == 1 and [e.seq for e in log(h)] == [3]


# -- the model: every applied change has its event, once, in order -------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["submit", "receive", "complete", "retry", "reject", "cancel_task", "cancel_run", "child", "tick"]),
        st.integers(0, 3),
    ),
    max_size=30,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_every_change_of_a_task_has_its_event_once_in_order(ops: list[tuple[str, int]]) -> None:
    h = Harness()
    h.ensure()
    runs = [h.create_run()]
    deliveries: list[str] = []
    seen: dict[str, str] = {}  # task id -> the state its events last told
    for op, n in ops:
        before = {task_id: task.state for task_id, task in h.state.tasks.items()}
        seq_before = h.state.spaces[SPACE].event_seq
        run_id = runs[n % len(runs)]
        if op == "submit":
            h.apply("task.submit", **h.submit_args(run_id, f"k{n}"))
        elif op == "receive":
            result = h.apply("task.receive", run_id=run_id, mailbox=MAILBOX, max=2, lease_ms=500, holder="w")
            deliveries += [d["token"] for d in result.get("deliveries", [])]
        elif op in ("complete", "retry", "reject") and deliveries:
            h.apply("delivery." + op, delivery_id=deliveries.pop(n % len(deliveries)), delay_ms=0)
        elif op == "cancel_task" and h.state.tasks:
            h.apply("task.cancel", task_id=sorted(h.state.tasks)[n % len(h.state.tasks)])
        elif op == "cancel_run":
            h.apply("run.cancel", run_id=run_id, retention_ms=10**9)
        elif op == "child":
            result = h.apply("run.create", parent_id=run_id)
            if "run_id" in result:
                runs.append(result["run_id"])
        elif op == "tick":
            h.advance(300 * (n + 1))
            h.tick(retention_ms=10**9)
        new = [e for e in log(h) if e.seq > seq_before]
        # Each task that changed state in this step has exactly one event for it, naming the new state.
        changed = {task_id: task.state for task_id, task in h.state.tasks.items() if before.get(task_id) != task.state}
        told = [(e.aggregate_id, e.payload["state"]) for e in new if e.aggregate_type == "task" and "state" in e.payload]
        created = {e.aggregate_id for e in new if e.type == "task.created"}
        for task_id, state in changed.items():
            if task_id in created and state == TaskState.QUEUED:
                continue
            assert told.count((task_id, state)) == 1, (op, task_id, state, told)
        for task_id, state in told:
            assert seen.get(task_id) != state, f"{task_id} told {state} twice in a row"
            seen[task_id] = state
        assert {task_id: h.state.tasks[task_id].state for task_id in seen} == seen  # the log replays to the state
        assert [e.seq for e in log(h)] == list(range(log(h)[0].seq, h.state.spaces[SPACE].event_seq + 1))
    # A snapshot carries the log; a restored state reads the same pages.
    restored = from_snapshot(to_snapshot(h.state))
    assert restored == h.state
    assert restored.spaces[SPACE].event_bytes == h.state.spaces[SPACE].event_bytes
    assert events.read(restored.spaces[SPACE], None, 1_000) == events.read(h.state.spaces[SPACE], None, 1_000)
