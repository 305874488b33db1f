"""Rules of tasks and deliveries (runstate_server.actors.tasks): submit, receive, leases, retries, and what
cancel, deadlines and retention do to them."""

from __future__ import annotations

from typing import Any

import pytest

from runstate_server.actors import errors, limits, tasks
from runstate_server.actors.state import TaskState
from runstate_server.actors.storage import json_value
from tests.test_actors_harness import MAILBOX, RETENTION_MS, Harness, snapshot_bytes

LEASE_MS = 10_000


# -- submit ------------------------------------------------------------------------------------


def test_submit_creates_a_queued_task(h: Harness, run_id: str) -> None:
    result = h.ok("task.submit", **h.submit_args(run_id, "k", {"n": 1}, attempts=3))
    task = h.task(result["task_id"])
    assert {"task_id": task.id, "created": True}.items() <= result.items()
    assert task.id.startswith("tsk_")
    assert (task.run_id, task.mailbox, task.key, json_value(task.input)) == (run_id, MAILBOX, "k", {"n": 1})
    assert (task.state, task.attempt, task.attempts, task.failures) == (TaskState.QUEUED, 0, 3, 0)
    assert task.attempts == 3 and task.created_ms == h.now_ms
    assert h.run(run_id).task_count == 1 and h.state.spaces[h.space].task_count == 1
    assert h.woken() == [("queue", run_id, MAILBOX), ("mailbox", h.space, MAILBOX)]


def test_submit_defaults_to_the_default_attempts(h: Harness, run_id: str) -> None:
    assert h.task(h.submit(run_id, "k")).attempts == limits.attempts_default


def test_submit_is_idempotent_per_key_with_the_same_input(h: Harness, run_id: str) -> None:
    first = h.submit(run_id, "k", {"n": 1})
    again = h.ok("task.submit", **h.submit_args(run_id, "k", {"n": 1}))
    assert {"task_id": first, "created": False}.items() <= again.items()
    assert h.effects == []
    assert h.run(run_id).task_count == 1 and len(h.state.tasks) == 1
    assert list(h.run(run_id).queues[MAILBOX].ready) == [first]  # not queued twice


def test_same_key_with_another_input_is_key_conflict(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "k", {"n": 1})
    assert h.err("task.submit", **h.submit_args(run_id, "k", {"n": 2})) == errors.KEY_CONFLICT
    assert json_value(h.task(task_id).input) == {"n": 1}


def test_same_key_in_another_run_or_mailbox_is_another_task(h: Harness, run_id: str) -> None:
    h.ensure("other")
    child = h.create_run(parent_id=run_id)
    ids = {
        h.submit(run_id, "k"),
        h.submit(h.create_run(), "k"),
        h.submit(child, "k"),
        h.ok("task.submit", **{**h.submit_args(run_id, "k"), "mailbox": "other"})["task_id"],
    }
    assert len(ids) == 4 == len(h.state.tasks)


def test_submit_to_unknown_run_or_mailbox_is_not_found(h: Harness, run_id: str) -> None:
    assert h.err("task.submit", **h.submit_args("run_nope", "k")) == errors.NOT_FOUND
    assert h.err("task.submit", **{**h.submit_args(run_id, "k"), "mailbox": "nope"}) == errors.NOT_FOUND
    assert h.err("task.submit", **{**h.submit_args(run_id, "k"), "mailbox": None}) == errors.NOT_FOUND
    elsewhere = h.create_run(space="space-2")
    h.ok("mailbox.ensure", space="space-2", name=MAILBOX)
    assert h.err("task.submit", **h.submit_args(elsewhere, "k")) == errors.NOT_FOUND


@pytest.mark.parametrize("attempts", [0, limits.attempts_max + 1, "3"])
def test_attempts_are_validated(h: Harness, run_id: str, attempts: object) -> None:
    assert h.err("task.submit", **h.submit_args(run_id, "k", attempts=attempts)) == errors.VALIDATION_FAILED


def test_tasks_per_run_limit(h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "tasks_per_run_max", 2)
    h.submit(run_id, "a")
    h.submit(run_id, "b")
    assert h.err("task.submit", **h.submit_args(run_id, "c")) == errors.LIMIT_EXCEEDED
    assert h.ok("task.submit", **h.submit_args(run_id, "a"))["created"] is False
    h.submit(h.create_run(), "c")


def test_tasks_per_space_limit(h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "tasks_per_space_max", 1)
    h.submit(run_id, "a")
    assert h.err("task.submit", **h.submit_args(h.create_run(), "b")) == errors.LIMIT_EXCEEDED


@pytest.mark.parametrize("stop", ["run.cancel", "run.complete"])
def test_no_new_task_in_a_stopped_run_or_below_it(h: Harness, stop: str) -> None:
    run_id = h.create_run()
    child = h.create_run(parent_id=run_id)
    grandchild = h.create_run(parent_id=child)
    h.ok(stop, run_id=run_id, retention_ms=RETENTION_MS)
    for target in (run_id, child, grandchild):
        # err() also checks that the refusal leaves no empty queue behind in the run.
        assert h.err("task.submit", **h.submit_args(target, "k")) == errors.SCOPE_CANCELLED


def test_no_new_task_past_the_deadline_of_the_run_or_above_it(h: Harness) -> None:
    run_id = h.create_run(deadline_ms=h.now_ms + 1_000)
    child = h.create_run(parent_id=run_id)
    h.advance(1_000)  # no tick needed
    for target in (run_id, child):
        assert h.err("task.submit", **h.submit_args(target, "k")) == errors.DEADLINE_EXCEEDED
    h.tick()
    for target in (run_id, child):
        assert h.err("task.submit", **h.submit_args(target, "k")) == errors.DEADLINE_EXCEEDED


def test_resubmitting_an_existing_key_after_cancel_returns_the_existing_task(h: Harness, run_id: str) -> None:
    # A producer that retries its submit after the run was cancelled gets its task back, with the
    # final state, rather than an error that would hide whether the first submit happened.
    queued = h.submit(run_id, "queued")
    done = h.submit(run_id, "done")
    h.receive(run_id)
    (delivery,) = h.receive(run_id)
    h.delivery("complete", delivery, payload="result")
    h.cancel(run_id)
    before = snapshot_bytes(h.state)
    assert {"task_id": queued, "created": False}.items() <= h.ok("task.submit", **h.submit_args(run_id, "queued")).items()
    assert {"task_id": done, "created": False}.items() <= h.ok("task.submit", **h.submit_args(run_id, "done")).items()
    assert snapshot_bytes(h.state) == before
    assert h.task(queued).state == TaskState.CANCELLED
    assert h.task(done).state == TaskState.SUCCEEDED and json_value(h.task(done).outcome) == "result"
    # Another input under the same key is still a conflict; a new key is new work.
    assert h.err("task.submit", **h.submit_args(run_id, "queued", {"x": 1})) == errors.KEY_CONFLICT
    assert h.err("task.submit", **h.submit_args(run_id, "new")) == errors.SCOPE_CANCELLED


# -- receive -----------------------------------------------------------------------------------


def test_receive_hands_out_fifo_at_most_max(h: Harness, run_id: str) -> None:
    ids = [h.submit(run_id, key) for key in "abcde"]
    h.effects.clear()
    first = h.ok("task.receive", run_id=run_id, mailbox=MAILBOX, max=2, lease_ms=LEASE_MS, holder="w1")
    assert first["task_ids"] == ids[:2]
    second = h.ok("task.receive", run_id=run_id, mailbox=MAILBOX, max=10, lease_ms=LEASE_MS, holder="w2")
    assert second["task_ids"] == ids[2:]
    assert h.ok("task.receive", run_id=run_id, mailbox=MAILBOX, max=1, lease_ms=LEASE_MS, holder="w3") == {
        "task_ids": [], "deliveries": [], "unchanged": True
    }
    for index, task_id in enumerate(ids):
        task = h.task(task_id)
        assert task.state == TaskState.RUNNING
        assert task.attempt == 1 and task.failures == 0
        assert task.lease_expires_ms == h.now_ms + LEASE_MS
        assert task.holder == ("w1" if index < 2 else "w2")
        assert task.delivery_id is not None and task.delivery_id.startswith(task_id + ".")
    assert len({h.task(task_id).delivery_id for task_id in ids}) == 5


def test_receive_sees_only_its_own_run_and_mailbox(h: Harness, run_id: str) -> None:
    h.ensure("other")
    child = h.create_run(parent_id=run_id)
    h.submit(child, "k")
    h.ok("task.submit", **{**h.submit_args(run_id, "k"), "mailbox": "other"})
    assert h.receive(run_id, max=10) == []
    assert len(h.receive(run_id, max=10, mailbox="other")) == 1
    assert len(h.receive(child, max=10)) == 1


def test_receive_from_unknown_run_or_mailbox(h: Harness, run_id: str) -> None:
    args: dict[str, Any] = {"mailbox": MAILBOX, "max": 1, "lease_ms": LEASE_MS, "holder": "w"}
    assert h.err("task.receive", run_id="run_nope", **args) == errors.NOT_FOUND
    assert h.err("task.receive", run_id=run_id, **{**args, "mailbox": "nope"}) == errors.NOT_FOUND


def test_receive_from_a_stopped_run_is_refused(h: Harness) -> None:
    h.ensure("unused")
    cancelled = h.create_run()
    late = h.create_run(deadline_ms=h.now_ms + 1_000)
    child = h.create_run(parent_id=late)
    h.submit(cancelled, "k")
    h.cancel(cancelled)
    h.advance(1_000)
    for mailbox in (MAILBOX, "unused"):  # "unused": no queue for it in the run yet
        args: dict[str, Any] = {"mailbox": mailbox, "max": 1, "lease_ms": LEASE_MS, "holder": "w"}
        assert h.err("task.receive", run_id=cancelled, **args) == errors.SCOPE_CANCELLED
        assert h.err("task.receive", run_id=late, **args) == errors.DEADLINE_EXCEEDED
        assert h.err("task.receive", run_id=child, **args) == errors.DEADLINE_EXCEEDED


# -- leases --------------------------------------------------------------------------------------


def test_lease_lapse_puts_the_task_back_with_the_next_attempt(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "k")
    (first,) = h.receive(run_id, holder="dead-worker")
    h.advance(LEASE_MS - 1)
    h.tick()
    assert h.task(task_id).state == TaskState.RUNNING  # not yet
    h.advance(1)
    h.effects.clear()
    assert h.tick() == {"processed": 1}
    task = h.task(task_id)
    assert task.state == TaskState.QUEUED and task.delivery_id is None
    assert task.failures == 1 and "lease expired" in (task.error or "")
    assert ("queue", run_id, MAILBOX) in h.woken()
    (second,) = h.receive(run_id)
    assert h.task(task_id).attempt == 2 and second != first


def test_late_complete_after_a_lapse_is_lease_lost_and_changes_nothing(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "k")
    (first,) = h.receive(run_id)
    h.advance(LEASE_MS)
    # Lapsed but not yet ticked: refused all the same.
    assert h.err("delivery.complete", delivery_id=first, payload="late") == errors.STALE_CLAIM
    assert h.err("delivery.renew", delivery_id=first, lease_ms=LEASE_MS) == errors.STALE_CLAIM
    assert h.err("delivery.release", delivery_id=first) == errors.STALE_CLAIM
    h.tick()
    (second,) = h.receive(run_id)
    stale: list[tuple[str, dict[str, Any]]] = [
        ("complete", {"payload": "late"}),
        ("renew", {"lease_ms": LEASE_MS}),
        ("retry", {"error": "e"}),
        ("reject", {"error": "e"}),
        ("release", {}),
    ]
    for kind, args in stale:
        assert h.err("delivery." + kind, delivery_id=first, **args) == errors.STALE_CLAIM
    assert h.task(task_id).state == TaskState.RUNNING and h.task(task_id).delivery_id == second
    h.delivery("complete", second, payload="on time")
    assert json_value(h.task(task_id).outcome) == "on time"


def test_renew_extends_the_lease(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "k")
    (delivery,) = h.receive(run_id)
    old_expiry = h.task(task_id).lease_expires_ms
    h.advance(LEASE_MS // 2)
    result = h.delivery("renew", delivery, lease_ms=LEASE_MS)
    assert result == {"task_id": task_id, "lease_expires_ms": h.now_ms + LEASE_MS}
    new_expiry = result["lease_expires_ms"]
    h.now_ms = old_expiry
    h.tick()  # the entry for the old expiry re-arms itself
    assert h.task(task_id).state == TaskState.RUNNING
    h.delivery("renew", delivery, lease_ms=limits.lease_ms_min)  # never shortens
    assert h.task(task_id).lease_expires_ms == new_expiry
    h.now_ms = new_expiry - 1
    h.tick()
    assert h.task(task_id).state == TaskState.RUNNING
    h.now_ms = new_expiry
    h.tick()
    assert h.task(task_id).state == TaskState.QUEUED and h.task(task_id).failures == 1


def test_unknown_deliveries_are_not_found(h: Harness, run_id: str) -> None:
    h.submit(run_id, "k")
    (delivery,) = h.receive(run_id)
    for bogus in ("tsk_nope.1.abc", "", None, 5):
        assert h.err("delivery.complete", delivery_id=bogus) == errors.NOT_FOUND
    assert h.err("delivery.complete", space="space-2", delivery_id=delivery) == errors.NOT_FOUND


# -- outcomes --------------------------------------------------------------------------------------


def test_complete_records_the_outcome_once(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "k")
    (delivery,) = h.receive(run_id)
    h.advance(5)
    assert {"task_id": task_id, "state": "SUCCEEDED"}.items() <= h.delivery("complete", delivery, payload={"ok": True}).items()
    task = h.task(task_id)
    assert (task.state, json_value(task.outcome), task.finished_ms, task.delivery_id) == (
        TaskState.SUCCEEDED,
        {"ok": True},
        h.now_ms,
        None,
    )
    assert ("task", task_id) in h.woken()
    # The same complete again (a retry after a lost answer) gets the same answer and changes nothing.
    before = snapshot_bytes(h.state, without_clock=True)
    assert {"task_id": task_id, "state": "SUCCEEDED"}.items() <= h.delivery("complete", delivery, payload="again").items()
    assert snapshot_bytes(h.state, without_clock=True) == before
    assert h.err("delivery.retry", delivery_id=delivery) == errors.STALE_CLAIM


def test_complete_many_answers_each_item_as_its_own_complete(h: Harness, run_id: str) -> None:
    """A live delivery, a lapsed one, an unknown one, a repeated complete and the same live one
    twice: each item is what its own complete answers; a refused item changes nothing."""
    lapsed = h.submit(run_id, "lapsed")
    (lapsed_delivery,) = h.receive(run_id)
    h.advance(LEASE_MS)  # lapsed, not yet ticked
    live, done = h.submit(run_id, "live"), h.submit(run_id, "done")
    (live_delivery, done_delivery) = h.receive(run_id, max=2)
    assert h.task(live).delivery_id == live_delivery and h.task(done).delivery_id == done_delivery
    h.delivery("complete", done_delivery, payload="first")
    items = [
        {"delivery_id": live_delivery, "payload": {"n": 1}},
        {"delivery_id": lapsed_delivery, "payload": "late"},
        {"delivery_id": "tsk_nope.1.abc", "payload": 1},
        {"delivery_id": done_delivery, "payload": "again"},
        {"delivery_id": live_delivery, "payload": "twice"},
    ]
    answers = h.ok("delivery.complete_many", items=items)["items"]
    assert [answer.get("state") or answer["error"]["code"] for answer in answers] == [
        "SUCCEEDED", errors.STALE_CLAIM, errors.NOT_FOUND, "SUCCEEDED", "SUCCEEDED",
    ]
    assert answers[0] == answers[4] == {"task_id": live, "state": "SUCCEEDED", "attempt": 1, "outcome_reason": None}
    assert json_value(h.task(live).outcome) == {"n": 1}  # the repeat recorded nothing more
    assert json_value(h.task(done).outcome) == "first"
    assert h.task(lapsed).state == TaskState.RUNNING and h.task(lapsed).outcome is None
    assert ("task", live) in h.woken() and ("task", lapsed) not in h.woken()


def test_complete_many_whose_items_are_all_refused_changes_nothing(h: Harness, run_id: str) -> None:
    h.submit(run_id, "k")
    (delivery,) = h.receive(run_id)
    h.advance(LEASE_MS)
    before = snapshot_bytes(h.state, without_clock=True)
    items = [{"delivery_id": delivery, "payload": 1}, {"delivery_id": None}]
    answers = h.ok("delivery.complete_many", items=items)["items"]
    assert [answer["error"]["code"] for answer in answers] == [errors.STALE_CLAIM, errors.NOT_FOUND]
    assert h.effects == []
    assert snapshot_bytes(h.state, without_clock=True) == before


def test_retry_with_backoff_is_not_receivable_until_the_ready_tick(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "k")
    (delivery,) = h.receive(run_id)
    assert {"task_id": task_id, "state": "QUEUED"}.items() <= h.delivery("retry", delivery, error="flaky", delay_ms=5_000).items()
    task = h.task(task_id)
    assert (task.failures, task.error, task.ready_at_ms) == (1, "flaky", h.now_ms + 5_000)
    assert h.armed() == [h.now_ms + 5_000]
    assert h.receive(run_id) == []
    h.advance(5_000)
    assert h.receive(run_id) == []  # due, but only a tick makes it ready
    h.effects.clear()
    h.tick()
    assert ("queue", run_id, MAILBOX) in h.woken()
    h.receive(run_id)
    assert h.task(task_id).attempt == 2 and h.task(task_id).state == TaskState.RUNNING


def test_retry_without_delay_backs_off_exponentially(h: Harness, run_id: str) -> None:
    assert [tasks.backoff_ms(n) for n in (1, 2, 3, 7, 8, 100)] == [1_000, 2_000, 4_000, 60_000, 60_000, 60_000]
    task_id = h.submit(run_id, "k", attempts=10)
    for failures, expected_ms in [(1, 1_000), (2, 2_000), (3, 4_000)]:
        (delivery,) = h.receive(run_id)
        h.delivery("retry", delivery)
        assert h.task(task_id).failures == failures
        assert h.task(task_id).ready_at_ms == h.now_ms + expected_ms
        assert h.task(task_id).error == "retried by the worker"
        h.advance(expected_ms)
        h.tick()


def test_retry_with_zero_delay_is_ready_at_once(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "k")
    (delivery,) = h.receive(run_id)
    h.delivery("retry", delivery, delay_ms=0)
    assert ("queue", run_id, MAILBOX) in h.woken()
    h.receive(run_id)
    assert h.task(task_id).attempt == 2


def test_reject_fails_the_task_now(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "k", attempts=5)
    (delivery,) = h.receive(run_id)
    assert {"task_id": task_id, "state": "FAILED"}.items() <= h.delivery("reject", delivery, error="bad input").items()
    task = h.task(task_id)
    assert (task.state, task.error, task.failures, task.outcome) == (TaskState.FAILED, "bad input", 1, None)
    assert ("task", task_id) in h.woken()
    assert h.receive(run_id) == []


def test_release_puts_the_task_back_without_counting_an_attempt(h: Harness, run_id: str) -> None:
    first_id = h.submit(run_id, "first")
    second_id = h.submit(run_id, "second")
    (delivery,) = h.receive(run_id)
    assert {"task_id": first_id, "state": "QUEUED"}.items() <= h.delivery("release", delivery).items()
    assert h.task(first_id).failures == 0 and h.task(first_id).delivery_id is None
    assert ("queue", run_id, MAILBOX) in h.woken()
    assert h.receive(run_id, max=2) == [h.task(second_id).delivery_id, h.task(first_id).delivery_id]
    assert h.task(first_id).attempt == 1  # the same attempt again


def test_after_attempts_failures_the_task_fails_with_the_last_error(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "k", attempts=3)
    (delivery,) = h.receive(run_id)
    h.delivery("retry", delivery, error="one", delay_ms=0)
    (delivery,) = h.receive(run_id)
    h.advance(LEASE_MS)
    h.tick()  # a lapse counts as a failed attempt
    assert h.task(task_id).failures == 2 and h.task(task_id).state == TaskState.QUEUED
    (delivery,) = h.receive(run_id)
    assert h.task(task_id).attempt == 3
    h.effects.clear()
    assert {"task_id": task_id, "state": "FAILED"}.items() <= h.delivery("retry", delivery, error="three", delay_ms=0).items()
    task = h.task(task_id)
    assert (task.state, task.error, task.failures, task.delivery_id) == (TaskState.FAILED, "three", 3, None)
    assert ("task", task_id) in h.woken()


def test_last_attempt_lapsing_fails_the_task(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "k", attempts=1)
    h.receive(run_id, holder="w9")
    h.advance(LEASE_MS)
    h.effects.clear()
    h.tick()
    task = h.task(task_id)
    assert task.state == TaskState.FAILED and task.error == "lease expired (holder w9)"
    assert ("task", task_id) in h.woken()


# -- cancel, deadline and retention ------------------------------------------------------------


@pytest.mark.parametrize("stop", ["run.cancel", "run.complete"])
def test_stopping_a_run_cancels_queued_and_running_tasks(h: Harness, stop: str) -> None:
    run_id = h.create_run()
    child = h.create_run(parent_id=run_id)
    done = h.submit(run_id, "done")
    running = h.submit(run_id, "running")
    backing_off = h.submit(run_id, "backing-off")
    queued = h.submit(run_id, "queued")
    below = h.submit(child, "below")
    d_done, d_running, d_backing_off = h.receive(run_id, max=3)
    h.delivery("complete", d_done, payload=1)
    h.delivery("retry", d_backing_off, delay_ms=1_000)
    h.ok(stop, run_id=run_id, retention_ms=RETENTION_MS)
    for task_id in (running, backing_off, queued, below):
        assert h.task(task_id).state == TaskState.CANCELLED
        assert h.task(task_id).finished_ms == h.now_ms
    assert h.task(done).state == TaskState.SUCCEEDED and json_value(h.task(done).outcome) == 1
    assert list(h.run(run_id).queues[MAILBOX].ready) == []
    h.advance(1_000)
    h.tick()  # the backoff ends: nothing to do for a cancelled task
    assert h.task(backing_off).state == TaskState.CANCELLED
    # The worker still holding `running` may not renew or complete it ...
    assert h.err("delivery.renew", delivery_id=d_running, lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED
    assert h.err("delivery.complete", delivery_id=d_running, payload=2) == errors.SCOPE_CANCELLED
    # ... but may hand it back: OK, with the final state, and the task does not change. The
    # handback ends the delivery, so a second one is STALE_CLAIM like after any handback.
    assert {"task_id": running, "state": "CANCELLED"}.items() <= h.delivery("retry", d_running, error="e").items()
    task = h.task(running)
    assert (task.state, task.failures, task.outcome, task.error) == (TaskState.CANCELLED, 0, None, None)
    assert h.err("delivery.release", delivery_id=d_running) == errors.STALE_CLAIM
    h.advance(LEASE_MS)
    h.tick()  # its lease entry finds nothing to lapse
    assert h.task(running).state == TaskState.CANCELLED and h.task(running).failures == 0


@pytest.mark.parametrize("kind", ["release", "retry", "reject"])
def test_each_handback_is_allowed_after_cancel(h: Harness, run_id: str, kind: str) -> None:
    task_id = h.submit(run_id, "k")
    (delivery,) = h.receive(run_id)
    h.cancel(run_id)
    assert {"task_id": task_id, "state": "CANCELLED"}.items() <= h.delivery(kind, delivery).items()
    assert h.task(task_id).failures == 0 and h.task(task_id).error is None


def test_deadline_expires_the_tasks_and_refuses_new_work(h: Harness) -> None:
    run_id = h.create_run(deadline_ms=h.now_ms + 5_000)
    child = h.create_run(parent_id=run_id)
    done = h.submit(run_id, "done")
    running = h.submit(run_id, "running")
    queued = h.submit(run_id, "queued")
    below = h.submit(child, "below")
    d_done, d_running = h.receive(run_id, max=2, lease_ms=60_000)
    h.delivery("complete", d_done, payload="kept")
    h.advance(5_000)
    # Past the deadline, before the tick: refused already.
    assert h.err("delivery.complete", delivery_id=d_running, payload="late") == errors.DEADLINE_EXCEEDED
    assert h.err("delivery.renew", delivery_id=d_running, lease_ms=LEASE_MS) == errors.DEADLINE_EXCEEDED
    args: dict[str, Any] = {"mailbox": MAILBOX, "max": 1, "lease_ms": LEASE_MS, "holder": "w"}
    assert h.err("task.receive", run_id=child, **args) == errors.DEADLINE_EXCEEDED
    h.effects.clear()
    h.tick()
    for task_id in (running, queued, below):
        assert h.task(task_id).state == TaskState.EXPIRED
        assert ("task", task_id) in h.woken()
    assert h.task(done).state == TaskState.SUCCEEDED
    assert {"task_id": running, "state": "EXPIRED"}.items() <= h.delivery("retry", d_running).items()
    assert h.err("task.submit", **h.submit_args(run_id, "new")) == errors.DEADLINE_EXCEEDED


def test_a_handback_between_the_deadline_and_its_tick_is_still_accepted(h: Harness) -> None:
    run_id = h.create_run(deadline_ms=h.now_ms + 5_000)
    task_id = h.submit(run_id, "k")
    (delivery,) = h.receive(run_id, lease_ms=60_000)
    h.advance(5_000)
    assert {"task_id": task_id, "state": "QUEUED"}.items() <= h.delivery("release", delivery).items()
    h.tick()
    assert h.task(task_id).state == TaskState.EXPIRED


def test_retention_removes_the_tasks_and_their_deliveries(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "k")
    (delivery,) = h.receive(run_id)
    h.cancel(run_id, retention_ms=1_000)
    h.advance(1_000)
    h.tick()
    assert task_id not in h.state.tasks
    assert h.err("delivery.release", delivery_id=delivery) == errors.NOT_FOUND
    assert h.err("task.submit", **h.submit_args(run_id, "k")) == errors.NOT_FOUND
    assert h.state.spaces[h.space].task_count == 0
    h.advance(LEASE_MS)
    h.tick()  # the removed task's lease entry is skipped


# -- effects ---------------------------------------------------------------------------------------


def test_receive_arms_the_ticker_only_when_the_earliest_due_time_moves_earlier(h: Harness, run_id: str) -> None:
    for key in "abc":
        h.submit(run_id, key)
    assert h.effects == [("wake", ("queue", run_id, MAILBOX)), ("wake", ("mailbox", h.space, MAILBOX))]
    h.receive(run_id, lease_ms=10_000)
    assert h.effects == [("arm", h.now_ms + 10_000)]
    h.receive(run_id, lease_ms=20_000)
    assert h.effects == []
    h.receive(run_id, lease_ms=5_000)
    assert h.effects == [("arm", h.now_ms + 5_000)]
    assert h.receive(run_id, lease_ms=1_000) == []
    assert h.effects == []


def test_effects_of_finishing_and_readying(h: Harness, run_id: str) -> None:
    a, b = h.submit(run_id, "a"), h.submit(run_id, "b")
    da, db = h.receive(run_id, max=2)
    h.delivery("complete", da)
    assert h.effects == [("wake", ("task", a))]
    h.delivery("release", db)
    assert h.effects == [("wake", ("queue", run_id, MAILBOX)), ("wake", ("mailbox", h.space, MAILBOX))]
    (db,) = h.receive(run_id)
    h.delivery("reject", db)
    assert h.effects == [("wake", ("task", b))]


def test_stopping_a_run_wakes_consumers_polling_an_empty_mailbox(h: Harness, run_id: str) -> None:
    h.ensure("idle")
    assert h.receive(run_id, mailbox="idle") == []  # a consumer now long-polls ("queue", run, "idle")
    h.cancel(run_id)
    assert ("queue", run_id, "idle") in h.woken()


def test_a_new_leader_extends_every_live_lease_to_its_full_length(h: Harness, run_id: str) -> None:
    task_id = h.submit(run_id, "a")
    (delivery,) = h.receive(run_id, lease_ms=10_000)
    h.advance(9_000)  # one second of the lease left; the workers could not renew meanwhile
    h.epoch = 2  # a new leader: every command from now on carries its epoch
    assert h.ok("leader.start") == {"epoch": 2}
    assert h.task(task_id).lease_expires_ms == h.now_ms + 10_000
    h.advance(5_000)
    h.tick()  # the old expiry has passed: the entry finds the later one and re-arms
    assert h.task(task_id).state == TaskState.RUNNING
    h.delivery("complete", delivery, payload="kept")
    # The same epoch again (a restarted node replaying it) extends nothing.
    other = h.submit(run_id, "b")
    h.receive(run_id, lease_ms=10_000)
    expires = h.task(other).lease_expires_ms
    h.advance(1_000)
    h.ok("leader.start")
    assert h.task(other).lease_expires_ms == expires


def test_a_barrier_changes_nothing(h: Harness, run_id: str) -> None:
    before = snapshot_bytes(h.state, without_clock=True)
    assert h.ok("barrier") == {}
    assert snapshot_bytes(h.state, without_clock=True) == before


def test_key_only_names_the_task_by_its_key_alone(h: Harness, run_id: str) -> None:
    first = h.submit(run_id, "acme", {"at": 1}, key_only=True)
    again = h.ok("task.submit", **h.submit_args(run_id, "acme", {"at": 2}, key_only=True))
    assert {"task_id": first, "created": False}.items() <= again.items()
    assert json_value(h.task(first).input) == {"at": 1}
    assert h.err("task.submit", **h.submit_args(run_id, "acme", {"at": 3})) == errors.KEY_CONFLICT


def test_a_receive_answers_its_deliveries_as_its_own_step_left_them(h: Harness, run_id: str) -> None:
    """The node renders a receive's answer from the command's result, never from the state read
    afterwards: the delivery may have ended meanwhile (its lease lapsed and the task went to
    another worker), and the answer must still name this receive's delivery."""
    from runstate_server.node.api.messages import message_of

    task_id = h.submit(run_id, "a")
    result = h.ok("task.receive", run_id=run_id, mailbox=MAILBOX, max=1, lease_ms=1_000, holder="w1")
    (given,) = result["deliveries"]
    token = h.task(task_id).delivery_id
    assert (given["task_id"], given["token"], given["attempt"]) == (task_id, token, 1)
    assert given["lease_expires_ms"] == h.task(task_id).lease_expires_ms
    h.advance(1_001)
    h.tick()  # the lease lapsed: the task is back, and another worker takes it
    h.ok("task.receive", run_id=run_id, mailbox=MAILBOX, max=1, lease_ms=1_000, holder="w2")
    view = message_of(given)
    assert (view["token"], view["message"]["attempt"], view["message"]["id"]) == (token, 1, task_id)
    assert view["token"] != h.task(task_id).delivery_id

