"""The event log (actors/events.py): an event for each applied change, once, in apply order, none for
a refused command; the log's bounds (count, weight, age) and its cursor; snapshots carry it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runstate_server.actors import events, limits
from runstate_server.actors.state import DueKind, TaskState, from_snapshot, to_snapshot
from tests.test_actors_harness import MAILBOX, SPACE, Harness, assert_stored_bytes_recount


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
    # Each event weighs what result_bytes makes of its payload (task events are weighed without it).
    assert_stored_bytes_recount(h.state)


def test_a_refused_command_leaves_no_event(h: Harness, run_id: str) -> None:
    h.cancel(run_id)
    before = h.state.spaces[SPACE].event_seq
    assert h.err("task.submit", **h.submit_args(run_id, "late")) == "SCOPE_CANCELLED"  # err checks the state too
    assert h.state.spaces[SPACE].event_seq == before


def test_a_stop_tells_every_run_it_ends_once_then_their_tasks(h: Harness, run_id: str) -> None:
    child = h.create_run(parent_id=run_id)
    grandchild = h.create_run(parent_id=child)
    a, b = h.submit(run_id, "a"), h.submit(grandchild, "b")
    h.cancel(run_id)
    tail = [(e.type, e.aggregate_id, e.payload.get("stoppedBy")) for e in log(h)][-5:]
    assert tail == [
        ("scope.cancelled", run_id, run_id), ("scope.cancelled", child, run_id), ("scope.cancelled", grandchild, run_id),
        ("task.cancelled", a, None), ("task.cancelled", b, None),
    ]
    # The watch of a run below sees its own stop (scopeId: that run and those below it).
    found, _ = events.read(h.state.spaces[SPACE], None, 100, events.matcher(h.state, None, None, grandchild))
    assert [e.type for e in found] == ["scope.created", "task.created", "scope.cancelled", "task.cancelled"]
    found, _ = events.read(h.state.spaces[SPACE], None, 100, events.matcher(h.state, frozenset({"scope.cancelled"}), None, run_id))
    assert [e.aggregate_id for e in found] == [run_id, child, grandchild]
    # A stopped run stops no more: cancelling a run below, or its deadline, tells nothing again.
    seq = h.state.spaces[SPACE].event_seq
    h.cancel(child)
    assert h.state.spaces[SPACE].event_seq == seq


def test_a_run_stopped_before_is_not_told_again_by_the_stop_above(h: Harness, run_id: str) -> None:
    early = h.create_run(parent_id=run_id)
    below_early = h.create_run(parent_id=early)
    late = h.create_run(parent_id=run_id, deadline_ms=h.now_ms + 1_000)
    h.cancel(early)
    assert [(e.type, e.aggregate_id) for e in log(h)][-2:] == [("scope.cancelled", early), ("scope.cancelled", below_early)]
    h.complete_run(run_id)  # a complete cancels what is below it
    assert [(e.type, e.aggregate_id, e.payload["stoppedBy"]) for e in log(h)[-2:]] == [
        ("scope.completed", run_id, run_id), ("scope.cancelled", late, run_id),
    ]
    h.advance(1_000)
    h.tick()  # the deadline of a run stopped already: nothing
    stops = [(e.type, e.aggregate_id) for e in log(h) if e.type.startswith("scope.") and e.type != "scope.created"]
    assert sorted(stops, key=str) == sorted([
        ("scope.cancelled", early), ("scope.cancelled", below_early), ("scope.completed", run_id),
        ("scope.cancelled", late),
    ], key=str)


def test_a_deadline_expires_the_runs_below(h: Harness) -> None:
    root = h.create_run(deadline_ms=h.now_ms + 1_000)
    child = h.create_run(parent_id=root)
    h.advance(1_000)
    h.tick()
    assert [(e.type, e.aggregate_id, e.payload["stoppedBy"]) for e in log(h)[-2:]] == [
        ("scope.expired", root, root), ("scope.expired", child, root),
    ]


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
    assert [e.weight for e in restored.spaces[SPACE].events] == [e.weight for e in log(h)]
    assert_stored_bytes_recount(h.state)  # each event's weight as result_bytes weighs it
    assert events.read(restored.spaces[SPACE], None, 1_000) == events.read(h.state.spaces[SPACE], None, 1_000)


# -- permits, allowances, budgets ----------------------------------------------------------------


def told(h: Harness, since: int, kind: str) -> list[tuple[str, dict[str, Any]]]:
    """The events of aggregate type `kind` after event `since`, as (type, payload)."""
    return [(e.type, dict(e.payload)) for e in log(h) if e.seq > since and e.aggregate_type == kind]


def test_a_permit_tells_its_grants_their_ends_and_its_signals(h: Harness, run_id: str) -> None:
    permit_id = h.ok("permit.create", name="gpu", units=2)["permit_id"]
    grant_args = {"permit_id": permit_id, "run_id": run_id, "lease_ms": 1_000, "holder": "w", "nonce": "ab" * 12}
    first = h.ok("permit.acquire", **grant_args, units=2)
    assert h.ok("permit.acquire", **grant_args, units=1)["granted"] is False  # nothing changed: no event
    waiter = h.ok("permit.wait", permit_id=permit_id, run_id=run_id, units=1, holder="v", ttl_ms=None)
    since = h.state.spaces[SPACE].event_seq
    h.ok("permit.release", grant_id=first["grant_id"], token=first["token"])
    second = h.ok("permit.acquire", **grant_args, units=1, waiter_id=waiter["waiter_id"])
    h.advance(1_000)
    h.tick()  # the second grant's lease lapses
    third = h.ok("permit.acquire", **grant_args, units=2)
    h.cancel(run_id)
    run_event = next(e for e in log(h) if e.type == "scope.cancelled")
    assert [(kind, p.get("grantId") or p.get("waiterId"), p.get("reason")) for kind, p in told(h, since, "permit")] == [
        ("permit.released", first["grant_id"], "released"),
        ("permit.waiter_signaled", waiter["waiter_id"], None),
        ("permit.granted", second["grant_id"], None),
        ("permit.lease_lost", second["grant_id"], None),
        ("permit.granted", third["grant_id"], None),
        ("permit.released", third["grant_id"], "scope_stopped"),
    ]
    assert all(e.aggregate_id == permit_id and e.run_id == run_id for e in log(h) if e.aggregate_type == "permit")
    assert told(h, since, "permit")[2][1] == {
        "permitId": permit_id, "grantId": second["grant_id"], "units": 1, "holder": "w", "waiterId": waiter["waiter_id"],
    }
    assert log(h)[-1].type == "permit.released" and run_event.seq < log(h)[-1].seq  # the stop first


def test_an_allowance_tells_its_consumptions_settles_and_cooldowns(h: Harness, run_id: str) -> None:
    allowance_id = h.ok("allowance.create", name="llm", units=2, interval_ms=1_000)["allowance_id"]
    args = {"allowance_id": allowance_id, "run_id": run_id, "holder": "w"}
    consumed = h.ok("allowance.consume", **args, units=2)
    waiter = h.ok("allowance.wait", **args, units=1, ttl_ms=None)
    h.ok("allowance_consumption.settle", consumption_id=consumed["consumption_id"], units=1)  # one back: the waiter goes
    h.ok("allowance_consumption.settle", consumption_id=consumed["consumption_id"], units=1)  # a repeat: no event
    h.ok("allowance.cooldown", allowance_id=allowance_id, cooldown_ms=5_000, reason="429 upstream")
    h.ok("allowance.cooldown", allowance_id=allowance_id, cooldown_ms=1_000, reason=None)  # shorter: nothing
    assert [(kind, p.get("consumptionId"), p.get("waiterId")) for kind, p in told(h, 0, "allowance")] == [
        ("allowance.consumed", consumed["consumption_id"], None),
        ("allowance.settled", consumed["consumption_id"], None),
        ("allowance.consumed", "acn_" + waiter["waiter_id"][len("awt_"):], waiter["waiter_id"]),
        ("allowance.cooldown", None, None),
    ]
    _, settled = told(h, 0, "allowance")[1]
    assert (settled["settledUnits"], settled["returnedUnits"], settled["overrunUnits"]) == (1, 1, 0)
    _, cooled = told(h, 0, "allowance")[3]
    assert cooled == {"allowanceId": allowance_id, "cooldownUntilMs": h.now_ms + 5_000, "reason": "429 upstream"}
    assert [e.run_id for e in log(h) if e.aggregate_type == "allowance"] == [run_id, run_id, run_id, None]


def test_a_budget_tells_its_money_but_not_a_jobs_admission(h: Harness, run_id: str) -> None:
    budget_id = h.ok("budget.create", name="usd", limit_minor=200)["budget_id"]
    args = {"budget_id": budget_id, "run_id": run_id, "holder": "w"}
    first = h.ok("budget_reservation.reserve", **args, amount_minor=30)["reservation_id"]
    stale = h.ok("budget_reservation.reserve", **args, amount_minor=10, settle_by_ms=h.now_ms + 1_000)["reservation_id"]
    h.ok("budget_reservation.settle", budget_id=budget_id, reservation_id=first, amount_minor=20, work_key="a")
    h.ok("budget_reservation.settle", budget_id=budget_id, reservation_id=first, amount_minor=20, work_key="a")  # a repeat
    h.ok("budget_reservation.void", budget_id=budget_id, reservation_id=first, work_key="v")
    h.advance(1_000)
    h.tick()
    # A job's reservation: taken and given back with its delivery, told by the task's events only.
    h.ok("mailbox.declare", name="jobs", requirements={"budgets": [{"name": "usd", "reserveMinor": "40"}]})
    h.ok("task.submit", **{**h.submit_args(run_id, "a"), "mailbox": "jobs"})
    h.ok("task.submit", **{**h.submit_args(run_id, "b"), "mailbox": "jobs"})
    done, running = h.ok("task.receive", run_id=run_id, mailbox="jobs", max=2, lease_ms=10_000, holder="w")["deliveries"]
    h.delivery("complete", done["token"], payload=1)
    before_settle = h.state.spaces[SPACE].event_seq
    (job_reservation,) = done["budget_reservations"]
    h.ok("budget_reservation.settle", budget_id=budget_id, reservation_id=job_reservation, amount_minor=5, work_key="j")
    h.cancel(run_id)  # the stop voids what is open: the stale one, the completed job's rest (and the running one's, silently)
    assert [(kind, p["reservationId"], p["state"], p.get("reason")) for kind, p in told(h, 0, "budget")] == [
        ("budget.reserved", first, "ACTIVE", None),
        ("budget.reserved", stale, "ACTIVE", None),
        ("budget.settled", first, "ACTIVE", None),
        ("budget.voided", first, "SETTLED", "voided"),
        ("budget.stale", stale, "STALE", None),
        ("budget.settled", job_reservation, "ACTIVE", None),
        ("budget.voided", stale, "VOIDED", "scope_stopped"),
        ("budget.voided", job_reservation, "SETTLED", "scope_stopped"),
    ]
    assert told(h, before_settle, "budget")[0][1] == {
        "budgetId": budget_id, "reservationId": job_reservation, "taskId": done["task_id"], "state": "ACTIVE",
        "workKey": "j", "chargedMinor": "5", "releasedMinor": "5", "heldMinor": "35",
    }
    assert running["budget_reservations"][0] not in {p["reservationId"] for _, p in told(h, 0, "budget")}


def test_a_jobs_reservation_the_log_told_of_has_its_end_told_when_its_delivery_ends(h: Harness, run_id: str) -> None:
    """Settled in part while its delivery runs, the log knows it: the delivery's lapse voids it with
    budget.voided (reason delivery_ended), so the log's last word on it is its state (the model
    test found it left ACTIVE)."""
    budget_id = h.ok("budget.create", name="usd", limit_minor=200)["budget_id"]
    h.ok("mailbox.declare", name="jobs", requirements={"budgets": [{"name": "usd", "reserveMinor": "40"}]})
    h.ok("task.submit", **{**h.submit_args(run_id, "a"), "mailbox": "jobs"})
    h.ok("task.submit", **{**h.submit_args(run_id, "b"), "mailbox": "jobs"})
    told_of, silent = h.ok("task.receive", run_id=run_id, mailbox="jobs", max=2, lease_ms=1_000, holder="w")["deliveries"]
    (reservation,) = told_of["budget_reservations"]
    h.ok("budget_reservation.settle", budget_id=budget_id, reservation_id=reservation, amount_minor=0, work_key="a")
    h.advance(1_000)
    h.tick()  # both leases lapse
    assert [(kind, p["reservationId"], p["state"], p.get("reason")) for kind, p in told(h, 0, "budget")] == [
        ("budget.settled", reservation, "ACTIVE", None),
        ("budget.voided", reservation, "VOIDED", "delivery_ended"),
    ]
    assert h.state.budget_reservations[silent["budget_reservations"][0]].state == "VOIDED"


def test_a_jobs_slots_and_units_add_no_event(h: Harness, run_id: str) -> None:
    h.ok("permit.create", name="browser", units=1)
    h.ok("allowance.create", name="api", units=5, interval_ms=1_000)
    needs = {"slots": ["browser"], "limit": ["api", 1]}
    task_id = h.ok("task.submit", **{**h.submit_args(run_id, "a"), "needs": needs})["task_id"]
    (delivery,) = h.receive(run_id)
    h.delivery("complete", delivery)
    assert [e.type for e in log(h) if e.aggregate_type != "scope"] == ["task.created", "task.running", "task.succeeded"]
    assert all(e.aggregate_id == task_id for e in log(h) if e.aggregate_type == "task")
