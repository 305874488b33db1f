"""Rules of mailboxes (modes, backlogLimit, declarations), named runs, the task's own lifecycle
(cancel, deadline, subscribers), fencing tokens and admit below a run, in the core."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runstate_server.actors import errors, limits
from runstate_server.actors.state import TaskState
from tests.test_actors_harness import MAILBOX, Harness, round_trip, snapshot_bytes

LEASE_MS = 10_000


def mailbox(h: Harness, name: str = "box", **args: Any) -> str:
    return str(h.ok("mailbox.create", name=name, **args)["mailbox"]["id"])


def submit(h: Harness, run_id: str, mailbox_id: str, key: str | None, **args: Any) -> dict[str, Any]:
    return h.ok("task.submit", run_id=run_id, mailbox_id=mailbox_id, key=key, input=key, input_hash=f"h{key}", **args)


def receive(h: Harness, run_id: str, mailbox_id: str, **args: Any) -> list[dict[str, Any]]:
    deliveries: list[dict[str, Any]] = h.ok(
        "task.receive", run_id=run_id, mailbox_id=mailbox_id, max=args.pop("max", 1), lease_ms=LEASE_MS, **args
    )["deliveries"]
    return deliveries


def unfinished(h: Harness, name: str) -> int:
    return sum(1 for task in h.state.tasks.values() if task.mailbox == name and task.state not in TaskState.TERMINAL)


# -- named runs ----------------------------------------------------------------------------------


def test_a_named_run_is_the_latest_active_one_of_its_name(h: Harness) -> None:
    first = h.ok("run.named", name="nightly")
    assert (first["created"], first["run"]["name"], first["run"]["parent_id"]) == (True, "nightly", None)
    assert h.ok("run.named", name="nightly")["run_id"] == first["run_id"]
    h.complete_run(first["run_id"])
    fresh = h.ok("run.named", name="nightly", deadline_ms=h.now_ms + 1_000)
    assert fresh["created"] and fresh["run_id"] != first["run_id"]
    h.advance(1_000)  # past its deadline, before any tick: no longer active
    assert h.ok("run.named", name="nightly")["run_id"] not in (first["run_id"], fresh["run_id"])


@pytest.mark.parametrize("name", ["", None, 3, "x" * (limits.run_name_chars_max + 1)])
def test_a_run_name_is_validated(h: Harness, name: object) -> None:
    assert h.err("run.named", name=name) == errors.VALIDATION_FAILED


def test_run_names_per_space_are_bounded(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "run_names_per_space_max", 1)
    h.ok("run.named", name="a")
    assert h.err("run.named", name="b") == errors.LIMIT_EXCEEDED
    assert h.ok("run.named", name="a")["created"] is False


def test_retention_forgets_a_name_whose_run_it_removed(h: Harness) -> None:
    run_id = h.ok("run.named", name="gone")["run_id"]
    h.cancel(run_id, retention_ms=1_000)
    h.advance(1_000)
    h.tick()
    assert run_id not in h.state.runs and "gone" not in h.state.spaces[h.space].run_names
    assert round_trip(h.state).spaces[h.space].run_names == h.state.spaces[h.space].run_names


def test_an_old_snapshots_default_run_becomes_the_run_named_default(h: Harness) -> None:
    from tests.test_actors_harness import unpack

    run_id = h.ok("run.named", name="default")["run_id"]
    old = unpack(snapshot_bytes(h.state))
    old["spaces"] = [[*row[:4], run_id, *row[5:]] for row in old["spaces"]]  # the column held the id
    old["spaces"] = [[row[0], [mailbox[:2] for mailbox in row[1]], *row[2:]] for row in old["spaces"]]
    from runstate_server.actors.state import from_snapshot

    restored = from_snapshot(old)
    assert restored.spaces[h.space].run_names == {"default": run_id}
    assert restored.spaces[h.space].mailboxes[MAILBOX].id.startswith("mbx_")
    assert from_snapshot(old).spaces[h.space].mailboxes[MAILBOX].id == restored.spaces[h.space].mailboxes[MAILBOX].id


# -- mailboxes -----------------------------------------------------------------------------------


def test_create_conflicts_on_a_taken_name_and_declare_checks_what_is_declared(h: Harness) -> None:
    created = h.ok("mailbox.create", name="box", mode="INBOX", backlog_limit=3)["mailbox"]
    assert (created["mode"], created["backlog_limit"]) == ("INBOX", 3)
    assert h.err("mailbox.create", name="box") == errors.CONFLICT
    assert h.err("mailbox.create", name="other", mode="FANOUT") == errors.VALIDATION_FAILED
    assert h.err("mailbox.create", name="other", backlog_limit=0) == errors.VALIDATION_FAILED
    declared = h.ok("mailbox.declare", name="jobs")
    assert declared["created"] and declared["mailbox"]["max_attempts"] is None
    assert h.ok("mailbox.declare", name="jobs", max_attempts=2)["mailbox"]["max_attempts"] == 2
    assert h.err("mailbox.declare", name="jobs", max_attempts=3) == errors.CONFLICT
    assert h.ok("mailbox.declare", name="jobs")["created"] is False
    assert h.err("mailbox.declare", name="jobs", requirements={"budgets": [{"name": "b"}]}) == errors.VALIDATION_FAILED
    pools = {"pools": [{"name": "p", "units": 2}]}
    h.ok("mailbox.declare", name="jobs", requirements=pools)
    assert h.err("mailbox.declare", name="jobs", requirements={"pools": []}) == errors.CONFLICT


def test_mailbox_ids_are_found_and_another_spaces_are_not(h: Harness) -> None:
    box = mailbox(h)
    run_id = h.create_run()
    assert submit(h, run_id, box, "k")["created"] is True
    other_run = h.create_run(space="space-2")
    assert h.err("task.submit", space="space-2", run_id=other_run, mailbox_id=box, key="k", input_hash="h") == (
        errors.NOT_FOUND
    )


def test_an_inbox_takes_messages_and_refuses_tasks_and_admit(h: Harness, run_id: str) -> None:
    inbox = mailbox(h, mode="INBOX")
    assert h.err("task.submit", run_id=run_id, mailbox_id=inbox, key="k", input_hash="h") == errors.VALIDATION_FAILED
    first = submit(h, run_id, inbox, None, message=True)
    second = submit(h, run_id, inbox, None, message=True)
    assert first["task_id"] != second["task_id"]  # keyless messages are each their own
    assert h.err("task.receive", run_id=run_id, mailbox_id=inbox, max=1, lease_ms=LEASE_MS, tasks_only=True) == (
        errors.VALIDATION_FAILED
    )
    assert len(receive(h, run_id, inbox, max=2)) == 2


def test_the_mailboxs_max_attempts_applies_without_the_tasks_own(h: Harness, run_id: str) -> None:
    jobs = h.ok("mailbox.declare", name="jobs", max_attempts=2)["mailbox"]["id"]
    plain = submit(h, run_id, jobs, "a")["task_id"]
    own = submit(h, run_id, jobs, "b", attempts=7)["task_id"]
    assert (h.task(plain).attempts, h.task(own).attempts) == (2, 7)


def test_backlog_limit_counts_unfinished_tasks(h: Harness, run_id: str) -> None:
    box = mailbox(h, backlog_limit=2)
    submit(h, run_id, box, "a")
    submit(h, run_id, box, "b")
    before = snapshot_bytes(h.state)
    assert h.err("task.submit", run_id=run_id, mailbox_id=box, key="c", input_hash="h") == errors.BACKLOG_FULL
    assert snapshot_bytes(h.state) == before
    assert submit(h, run_id, box, "a")["created"] is False  # an existing key is answered as usual
    (given,) = receive(h, run_id, box)
    h.delivery("complete", given["token"])
    assert submit(h, run_id, box, "c")["created"] is True


# -- tokens --------------------------------------------------------------------------------------


def test_a_token_must_be_the_messages_current_delivery(h: Harness, run_id: str) -> None:
    box = mailbox(h)
    a, b = submit(h, run_id, box, "a")["task_id"], submit(h, run_id, box, "b")["task_id"]
    given_a, given_b = receive(h, run_id, box, max=2)
    assert (given_a["task_id"], given_b["task_id"]) == (a, b)
    assert given_a["token"] != given_b["token"]
    before = snapshot_bytes(h.state, without_clock=True)
    for kind in ("complete", "retry", "reject", "release"):
        # b's token on a's message, a forged token, and an unknown message.
        assert h.err(f"delivery.{kind}", message_id=a, delivery_id=given_b["token"]) == errors.STALE_CLAIM
        assert h.err(f"delivery.{kind}", message_id=a, delivery_id=given_a["token"] + "0") == errors.STALE_CLAIM
        assert h.err(f"delivery.{kind}", message_id="tsk_nope", delivery_id=given_a["token"]) == errors.NOT_FOUND
    assert h.err("delivery.renew", message_id=a, delivery_id="x", lease_ms=LEASE_MS) == errors.STALE_CLAIM
    assert snapshot_bytes(h.state, without_clock=True) == before
    h.ok("delivery.complete", message_id=a, delivery_id=given_a["token"], payload=1)


# -- the task's own lifecycle --------------------------------------------------------------------


def test_cancel_ends_a_running_task_returns_its_holds_and_stales_its_token(h: Harness, run_id: str) -> None:
    h.ok("pool.ensure", name="p", size=1)
    box = mailbox(h, backlog_limit=5)
    task_id = submit(h, run_id, box, "a", needs={"slots": ["p"]})["task_id"]
    (given,) = receive(h, run_id, box)
    assert len(h.state.pools[f"{h.space}/p"].holds) == 1
    cancelled = h.ok("task.cancel", task_id=task_id, reason="enough")
    assert (cancelled["state"], cancelled["outcome_reason"]) == (TaskState.CANCELLED, "cancelled: enough")
    assert h.state.pools[f"{h.space}/p"].holds == []
    assert h.state.spaces[h.space].mailboxes["box"].unfinished == 0
    assert h.err("delivery.complete", delivery_id=given["token"], payload=1) == errors.STALE_CLAIM
    again = h.ok("task.cancel", task_id=task_id)
    assert again["outcome_reason"] == "cancelled: enough"  # a finished task stays as it is


def test_a_tasks_deadline_expires_it_unless_it_finished_first(h: Harness, run_id: str) -> None:
    box = mailbox(h)
    late = submit(h, run_id, box, "late", deadline_ms=h.now_ms + 1_000)["task_id"]
    done = submit(h, run_id, box, "done", deadline_ms=h.now_ms + 1_000)["task_id"]
    assert h.err("task.submit", run_id=run_id, mailbox_id=box, key="x", input_hash="h", deadline_ms=h.now_ms) == (
        errors.VALIDATION_FAILED
    )
    given = receive(h, run_id, box, max=2)
    h.delivery("complete", next(g["token"] for g in given if g["task_id"] == done))
    h.advance(1_000)
    h.tick()
    assert (h.task(late).state, h.task(late).outcome_reason) == (TaskState.EXPIRED, "deadline_exceeded")
    assert h.task(done).state == TaskState.SUCCEEDED
    assert h.run(run_id).stored_state == "ACTIVE"


def test_subscribers_are_a_bounded_idempotent_set(h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "subscribers_per_task_max", 2)
    box = mailbox(h)
    task_id = submit(h, run_id, box, "a", subscriber="s1")["task_id"]
    assert h.ok("task.join", task_id=task_id, run_id=run_id, subscriber="s1")["subscribers"] == ["s1"]
    assert h.ok("task.join", task_id=task_id, run_id=run_id, subscriber="s2")["subscribers"] == ["s1", "s2"]
    assert h.err("task.join", task_id=task_id, run_id=run_id, subscriber="s3") == errors.LIMIT_EXCEEDED
    assert h.ok("task.detach", task_id=task_id, subscriber="s1")["subscribers"] == ["s2"]
    assert h.ok("task.detach", task_id=task_id, subscriber="s2")["subscribers"] == []
    assert h.task(task_id).state == TaskState.QUEUED  # nobody left, nothing cancelled


def test_admit_below_takes_tasks_of_active_descendant_runs_only(h: Harness, run_id: str) -> None:
    box = mailbox(h)
    child = h.create_run(parent_id=run_id)
    late = h.create_run(parent_id=run_id, deadline_ms=h.now_ms + 1_000)
    grandchild = h.create_run(parent_id=child)
    submit(h, late, box, "late")
    deep = submit(h, grandchild, box, "deep")["task_id"]
    h.advance(1_000)  # the deadline passed; no tick has expired its task yet
    assert receive(h, run_id, box) == []
    (given,) = receive(h, run_id, box, max=5, include_descendants=True)
    assert (given["task_id"], given["run_id"]) == (deep, grandchild)


# -- the backlog count, whatever happens ---------------------------------------------------------

OPS = st.lists(
    st.sampled_from(["submit", "receive", "complete", "retry", "reject", "release", "cancel_task", "lapse",
                     "cancel_child", "expire"]),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
def test_the_backlog_count_is_the_number_of_unfinished_tasks(ops: list[str]) -> None:
    h = Harness()
    run_id = h.create_run()
    child = h.create_run(parent_id=run_id)
    box = mailbox(h, backlog_limit=limits.backlog_limit_max)
    held: list[str] = []
    for index, op in enumerate(ops):
        if op == "submit":
            # The child is removed once its retention after a cancel ran out ("expire" advances past it).
            child_active = child in h.state.runs and h.run(child).stored_state == "ACTIVE"
            target = child if index % 3 == 0 and child_active else run_id
            submit(h, target, box, f"k{index}", attempts=2, deadline_ms=h.now_ms + 5_000 if index % 4 == 0 else None)
        elif op == "receive":
            held += [g["token"] for g in receive(h, run_id, box, max=3, include_descendants=True)]
        elif op in ("complete", "retry", "reject", "release") and held:
            token = held.pop(0)
            h.apply(f"delivery.{op}", delivery_id=token, **({"payload": 1} if op == "complete" else {}))
        elif op == "cancel_task" and h.state.tasks:
            h.ok("task.cancel", task_id=sorted(h.state.tasks)[index % len(h.state.tasks)])
        elif op == "lapse":
            h.advance(LEASE_MS)
            h.tick()
        elif op == "cancel_child" and child in h.state.runs:
            h.cancel(child)
        elif op == "expire":
            h.advance(5_000)
            h.tick()
        assert h.state.spaces[h.space].mailboxes["box"].unfinished == unfinished(h, "box"), op
    assert round_trip(h.state).spaces[h.space].mailboxes["box"].unfinished == unfinished(h, "box")


def test_the_outcome_reason_names_how_a_task_failed(h: Harness, run_id: str) -> None:
    box = mailbox(h)
    lapsed = submit(h, run_id, box, "lapsed", attempts=1)["task_id"]
    retried = submit(h, run_id, box, "retried", attempts=1)["task_id"]
    rejected = submit(h, run_id, box, "rejected", attempts=3)["task_id"]
    given = {g["task_id"]: g["token"] for g in receive(h, run_id, box, max=3, holder="w9")}
    h.delivery("retry", given[retried], error="ValueError: x")
    h.delivery("reject", given[rejected])
    h.advance(LEASE_MS)
    h.tick()
    assert [(h.task(t).state, h.task(t).outcome_reason) for t in (lapsed, retried, rejected)] == [
        (TaskState.FAILED, "lease_expired"),
        (TaskState.FAILED, "handler_error: ValueError: x"),
        (TaskState.FAILED, "rejected: rejected by the worker"),
    ]
    assert h.task(lapsed).error == "lease expired (holder w9)"
