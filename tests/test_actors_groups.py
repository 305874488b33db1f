"""Rules of task groups (runstate_server.actors.groups): the spec's table, closing, verdicts, finalizing."""

from __future__ import annotations

from typing import Any

import pytest

from runstate_server.actors import errors, limits
from runstate_server.actors.groups import Group
from runstate_server.actors.state import RunState, TaskState
from tests.test_actors_harness import MAILBOX, RETENTION_MS, Harness, round_trip, snapshot_bytes


class G:
    """One group driven through the harness: its commands, by member key."""

    def __init__(self, h: Harness, run_id: str, **args: Any) -> None:
        self.h = h
        args.setdefault("mailbox", MAILBOX)
        created = h.ok("group.create", run_id=run_id, retention_ms=RETENTION_MS, **args)
        self.id, self.run_id = created["group_id"], created["run_id"]
        self.tasks: dict[str, str] = {}

    @property
    def group(self) -> Group:
        group = self.h.state.groups[self.id]
        assert isinstance(group, Group)
        return group

    def submit_args(self, key: str, input: Any = None) -> dict[str, Any]:
        input = {"key": key} if input is None else input
        return {"group_id": self.id, "key": key, "input": input, "input_hash": f"hash:{input!r}"}

    def submit(self, *keys: str) -> list[str]:
        for key in keys:
            self.tasks[key] = self.h.ok("group.submit", **self.submit_args(key))["task_id"]
        return [self.tasks[key] for key in keys]

    def finish(self, key: str, how: str = "complete") -> None:
        """Deliver member `key` (only it: the others are put back) and settle it with `how`."""
        task = self.h.task(self.tasks[key])
        queue = self.h.run(self.run_id).queues[MAILBOX]
        queue.ready.remove(task.id)
        queue.ready.appendleft(task.id)
        (delivery,) = self.h.receive(self.run_id)
        self.h.delivery(how, delivery, **({"payload": key} if how == "complete" else {}))

    def verdict(self, kind: str, key: str) -> dict[str, Any]:
        return self.h.ok(f"group.{kind}", group_id=self.id, task_id=self.tasks[key])

    def close(self) -> dict[str, Any]:
        return self.h.ok("group.close", group_id=self.id)

    def decided(self) -> tuple[str, str | None, str | None]:
        return self.group.state, self.group.outcome, self.group.outcome_reason


# -- create --------------------------------------------------------------------------------------


def test_create_makes_a_run_owned_by_the_group_under_the_parent(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="FIRST_ACCEPTED", parent_id=run_id)
    run = h.run(g.run_id)
    assert (run.group_id, run.parent_id, g.group.parent_id, g.group.state) == (g.id, run_id, run_id, "OPEN")
    assert g.id.startswith("grp_") and g.run_id in h.run(run_id).children
    assert G(h, run_id, condition="FIRST_ACCEPTED").group.parent_id is None


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ({"condition": "MOST_ACCEPTED"}, errors.VALIDATION_FAILED),
        ({"condition": "N_ACCEPTED"}, errors.VALIDATION_FAILED),
        ({"condition": "N_ACCEPTED", "threshold": 0}, errors.VALIDATION_FAILED),
        ({"condition": "N_ACCEPTED", "threshold": limits.group_members_max + 1}, errors.VALIDATION_FAILED),
        ({"condition": "FIRST_ACCEPTED", "threshold": 2}, errors.VALIDATION_FAILED),
        ({"condition": "N_ACCEPTED", "threshold": 5, "expected_members": 4}, errors.VALIDATION_FAILED),
        ({"condition": "ALL_TERMINAL", "expected_members": 0}, errors.VALIDATION_FAILED),
        ({"condition": "ALL_TERMINAL", "expected_members": 101}, errors.VALIDATION_FAILED),
        ({"condition": "ALL_TERMINAL", "deadline_ms": 5}, errors.VALIDATION_FAILED),
        ({"condition": "ALL_TERMINAL", "mailbox": "missing"}, errors.NOT_FOUND),
        ({"condition": "ALL_TERMINAL", "parent_id": "run_nope"}, errors.NOT_FOUND),
    ],
)
def test_create_refuses_bad_arguments(h: Harness, run_id: str, args: dict[str, Any], code: str) -> None:
    args = {"mailbox": MAILBOX, **args}
    assert h.err("group.create", run_id=run_id, retention_ms=RETENTION_MS, **args) == code


def test_create_refuses_from_a_stopped_run_or_under_one(h: Harness, run_id: str) -> None:
    stopped = h.create_run()
    h.cancel(stopped)
    assert h.err("group.create", run_id=stopped, mailbox=MAILBOX, condition="ALL_TERMINAL",
                 retention_ms=RETENTION_MS) == errors.SCOPE_CANCELLED
    assert h.err("group.create", run_id=run_id, parent_id=stopped, mailbox=MAILBOX, condition="ALL_TERMINAL",
                 retention_ms=RETENTION_MS) == errors.SCOPE_CANCELLED


def test_the_protocols_create_names_the_mailbox_by_id_and_no_calling_run(h: Harness, run_id: str) -> None:
    mailbox_id = next(iter(h.state.spaces.values())).mailboxes[MAILBOX].id
    created = h.ok("group.create", mailbox_id=mailbox_id, condition="ALL_TERMINAL", retention_ms=RETENTION_MS)
    group = h.state.groups[created["group_id"]]
    assert (group.mailbox, group.parent_id, h.run(created["run_id"]).parent_id) == (MAILBOX, None, None)
    under = h.ok("group.create", mailbox_id=mailbox_id, parent_id=run_id, condition="FIRST_ACCEPTED",
                 retention_ms=RETENTION_MS)
    assert h.run(under["run_id"]).parent_id == run_id
    assert h.err("group.create", mailbox_id="mbx_nope", condition="ALL_TERMINAL", retention_ms=RETENTION_MS) == (
        errors.NOT_FOUND
    )
    h.ensure("inbox", mode="INBOX")
    assert h.err("group.create", mailbox="inbox", condition="ALL_TERMINAL", retention_ms=RETENTION_MS) == (
        errors.VALIDATION_FAILED
    )
    stopped = h.create_run()
    h.cancel(stopped)
    assert h.err("group.create", mailbox_id=mailbox_id, parent_id=stopped, condition="ALL_TERMINAL",
                 retention_ms=RETENTION_MS) == errors.SCOPE_CANCELLED


def test_seal_is_close_but_conflict_once_finalized(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="N_ACCEPTED", threshold=2)
    g.submit("a", "b")
    assert h.ok("group.seal", group_id=g.id)["state"] == "SEALED"
    assert h.ok("group.seal", group_id=g.id)["state"] == "SEALED"  # again, undecided: the same
    one = G(h, run_id, condition="N_ACCEPTED", threshold=2)
    one.submit("a")
    decided = h.ok("group.seal", group_id=one.id)  # the seal that decides answers the decision
    assert (decided["state"], decided["outcome_reason"]) == ("FINALIZED", "threshold_unreachable")
    assert h.err("group.seal", group_id=one.id) == errors.CONFLICT
    assert h.ok("group.close", group_id=one.id)["state"] == "FINALIZED"  # close stays idempotent


# -- members -------------------------------------------------------------------------------------


def test_a_member_takes_its_deadline_and_requirements(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="ALL_TERMINAL")
    h.ok("pool.ensure", name="gpu", size=2)
    deadline_ms = h.now_ms + 60_000
    task_id = h.ok("group.submit", **g.submit_args("a"), deadline_ms=deadline_ms,
                   requirements={"pools": [{"name": "gpu", "units": 1}]})["task_id"]
    task = h.task(task_id)
    assert task.deadline_ms == deadline_ms and task.needs is not None and task.needs["slots"] == ["gpu"]
    assert h.err("group.submit", **g.submit_args("b"), requirements=3) == errors.VALIDATION_FAILED
    assert h.err("group.submit", **g.submit_args("c"), deadline_ms=h.now_ms - 1) == errors.VALIDATION_FAILED


def test_members_are_tasks_of_the_group_run_and_resubmitting_returns_them(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="ALL_TERMINAL")
    (task_id,) = g.submit("a")
    assert (h.task(task_id).run_id, h.task(task_id).mailbox, g.group.members) == (g.run_id, MAILBOX, [task_id])
    assert ("group", g.id) in h.woken()
    again = h.ok("group.submit", **g.submit_args("a"))
    assert again == {"task_id": task_id, "created": False, "group_state": "OPEN"}
    assert h.err("group.submit", **g.submit_args("a", {"other": 1})) == errors.KEY_CONFLICT
    g.close()
    assert h.ok("group.submit", **g.submit_args("a"))["task_id"] == task_id  # even when closed
    assert h.err("group.submit", **g.submit_args("b")) == "CONFLICT"


def test_join_adds_a_task_of_the_group_run_or_an_outside_one_of_no_other_group(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="ALL_TERMINAL", parent_id=run_id)
    direct = h.submit(g.run_id, "direct")
    assert h.ok("group.join", group_id=g.id, task_id=direct) == {"task_id": direct, "joined": True, "group_state": "OPEN"}
    assert h.ok("group.join", group_id=g.id, task_id=direct) == {"task_id": direct, "joined": False, "group_state": "OPEN"}
    outside = h.submit(run_id, "outside")  # a task of the run the group was made from
    assert h.ok("group.join", group_id=g.id, task_id=outside)["joined"] is True
    assert (h.task(outside).group_id, g.group.outside) == (g.id, {outside: ["outside", None]})
    other = G(h, run_id, condition="ALL_TERMINAL")
    assert h.err("group.join", group_id=other.id, task_id=outside) == errors.CONFLICT  # a task joins one group
    assert h.err("group.join", group_id=other.id, task_id=direct) == errors.CONFLICT
    h.ensure("notes", mode="INBOX")
    message = h.submit(run_id, "note", mailbox="notes", message=True)
    assert h.err("group.join", group_id=g.id, task_id=message) == errors.CONFLICT  # a message is no job
    assert h.err("group.join", group_id=g.id, task_id="tsk_nope") == errors.NOT_FOUND
    # The outside member counts like any: it finishes, gets its verdict, and the group decides.
    (delivery,) = h.receive(run_id)
    h.delivery("complete", delivery, payload="outside")
    assert g.group.outside[outside] == ["outside", "SUCCEEDED"]
    g.tasks.update(direct=direct, outside=outside)
    g.finish("direct")
    g.close()
    g.verdict("accept", "outside")
    assert g.decided() == ("SEALED", None, None)
    g.verdict("accept", "direct")
    assert g.decided() == ("FINALIZED", "SUCCESS", "all_terminal")
    late = h.submit(run_id, "late")  # a decided group takes no member
    assert h.err("group.join", group_id=g.id, task_id=late) == errors.CONFLICT


def test_an_outside_member_run_stop_decides_and_finalizing_cancels_an_unfinished_one(h: Harness, run_id: str) -> None:
    elsewhere = h.create_run()
    g = G(h, run_id, condition="ALL_TERMINAL")
    stopped = h.submit(elsewhere, "stopped")
    h.ok("group.join", group_id=g.id, task_id=stopped)
    assert g.close()["state"] == "SEALED"
    h.cancel(elsewhere)  # ends the member: the closed group decides in the same step
    assert g.decided() == ("FINALIZED", "FAILURE", "all_terminal")

    first = G(h, run_id, condition="FIRST_ACCEPTED")
    other_run = h.create_run()
    waiting = h.submit(other_run, "waiting")
    h.ok("group.join", group_id=first.id, task_id=waiting)
    first.submit("a")
    first.finish("a")
    first.verdict("accept", "a")
    assert first.decided() == ("FINALIZED", "SUCCESS", "first_accepted")
    assert h.task(waiting).state == TaskState.CANCELLED  # unfinished members end cancelled, outside ones too
    assert h.run(other_run).stored_state == RunState.ACTIVE  # their run goes on
    # Its run is removed before the group's: the group still shows and counts it.
    h.complete_run(other_run, retention_ms=10)
    h.advance(11)
    h.tick()
    assert waiting not in h.state.tasks and other_run not in h.state.runs
    assert first.group.outside[waiting] == ["waiting", "CANCELLED"]
    assert h.err("group.accept", group_id=first.id, task_id=waiting) == errors.CONFLICT
    restored = round_trip(h.state)
    assert restored.groups[first.id] == first.group


def test_a_group_holds_at_most_the_member_bound(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="ALL_TERMINAL")
    g.submit(*(f"m{i}" for i in range(limits.group_members_max)))
    assert h.err("group.submit", **g.submit_args("one-more")) == errors.LIMIT_EXCEEDED
    assert h.ok("group.submit", **g.submit_args("m0"))["created"] is False


def test_expected_members_closes_on_the_submit_that_reaches_it(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="N_ACCEPTED", threshold=2, expected_members=3)
    g.submit("a", "b")
    assert g.group.state == "OPEN"
    g.submit("c")
    assert g.group.state == "SEALED"
    assert h.err("group.submit", **g.submit_args("d")) == "CONFLICT"


def test_unknown_group_is_not_found(h: Harness) -> None:
    assert h.err("group.close", group_id="grp_nope") == errors.NOT_FOUND
    assert h.err("group.accept", group_id="grp_nope", task_id="t") == errors.NOT_FOUND


def test_groups_are_per_space(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="ALL_TERMINAL")
    h.ensure(space="space-2")
    assert h.err("group.close", group_id=g.id, space="space-2") == errors.NOT_FOUND


# -- verdicts ------------------------------------------------------------------------------------


def test_accept_needs_a_succeeded_member_reject_a_finished_one(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="N_ACCEPTED", threshold=3)
    g.submit("ok", "bad", "queued")
    g.finish("ok")
    g.finish("bad", "reject")
    assert h.err("group.accept", group_id=g.id, task_id=g.tasks["queued"]) == errors.CONFLICT
    assert h.err("group.reject", group_id=g.id, task_id=g.tasks["queued"]) == errors.CONFLICT
    assert h.err("group.accept", group_id=g.id, task_id=g.tasks["bad"]) == errors.CONFLICT
    assert h.err("group.accept", group_id=g.id, task_id="tsk_not_a_member") == errors.NOT_FOUND
    answer = g.verdict("reject", "bad")
    assert answer == {"task_id": g.tasks["bad"], "verdict": "REJECTED", "late": False, "group_id": g.id,
                      "state": "OPEN", "outcome": None, "outcome_reason": None}
    assert g.verdict("accept", "ok")["verdict"] == "ACCEPTED"


def test_verdicts_are_idempotent_and_final(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="N_ACCEPTED", threshold=2)
    g.submit("a")
    g.finish("a")
    first = g.verdict("accept", "a")
    before = snapshot_bytes(h.state, without_clock=True)
    assert g.verdict("accept", "a") == first
    assert snapshot_bytes(h.state, without_clock=True) == before
    assert h.err("group.reject", group_id=g.id, task_id=g.tasks["a"]) == errors.CONFLICT


# -- the table -----------------------------------------------------------------------------------


def test_first_accepted_succeeds_on_the_first_accept_and_cancels_the_rest(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="FIRST_ACCEPTED")
    g.submit("a", "b", "c")
    g.finish("a")
    g.finish("b")
    (running,) = h.receive(g.run_id)  # c is held by a worker
    answer = g.verdict("accept", "b")
    assert (answer["state"], answer["outcome"], answer["outcome_reason"]) == ("FINALIZED", "SUCCESS", "first_accepted")
    assert h.run(g.run_id).stored_state == RunState.CANCELLED
    assert [h.task(g.tasks[k]).state for k in "abc"] == ["SUCCEEDED", "SUCCEEDED", "CANCELLED"]
    assert h.err("delivery.complete", delivery_id=running, payload=1) == errors.SCOPE_CANCELLED
    assert h.err("task.receive", run_id=g.run_id, mailbox=MAILBOX, max=1, lease_ms=1_000) == errors.SCOPE_CANCELLED
    # A late verdict is recorded and changes nothing.
    late = g.verdict("reject", "a")
    assert (late["late"], late["outcome"]) == (True, "SUCCESS")
    assert g.group.late == [g.tasks["a"]]


def test_first_accepted_closed_waits_for_an_accept_or_its_deadline(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="FIRST_ACCEPTED", deadline_ms=h.now_ms + 10_000)
    g.submit("a")
    g.finish("a", "reject")
    assert g.close() == {"group_id": g.id, "state": "SEALED", "outcome": None, "outcome_reason": None}
    h.advance(10_000)
    h.tick()
    assert g.decided() == ("FINALIZED", "FAILURE", "deadline")
    assert ("group", g.id) in h.woken()


def test_n_accepted_succeeds_at_the_threshold_while_open(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="N_ACCEPTED", threshold=2)
    g.submit("a", "b", "c", "d")
    for key in "ab":
        g.finish(key)
    g.verdict("accept", "a")
    assert g.group.state == "OPEN"
    g.verdict("accept", "b")
    assert g.decided() == ("FINALIZED", "SUCCESS", "threshold_reached")
    assert [h.task(g.tasks[k]).state for k in "cd"] == ["CANCELLED", "CANCELLED"]
    assert h.run(g.run_id).reason == f"group {g.id} finalized: SUCCESS threshold_reached"
    assert g.close()["state"] == "FINALIZED"  # close on a finalized group returns the outcome
    assert h.err("group.submit", **g.submit_args("e")) == "CONFLICT"


def test_n_accepted_failures_before_close_do_not_fail_it(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="N_ACCEPTED", threshold=2)
    g.submit("a", "b")
    g.finish("a", "reject")
    g.finish("b", "reject")
    g.verdict("reject", "a")
    assert g.group.state == "OPEN"
    g.submit("c", "d")  # more members may still succeed
    g.finish("c")
    g.finish("d")
    g.verdict("accept", "c")
    g.verdict("accept", "d")
    assert g.decided() == ("FINALIZED", "SUCCESS", "threshold_reached")


def test_n_accepted_close_decides_unreachable_at_once(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="N_ACCEPTED", threshold=3)
    g.submit("a", "b", "c")
    g.finish("a", "reject")
    answer = g.close()
    assert (answer["state"], answer["outcome"], answer["outcome_reason"]) == (
        "FINALIZED", "FAILURE", "threshold_unreachable"
    )
    assert h.run(g.run_id).stored_state == RunState.CANCELLED


def test_n_accepted_becomes_unreachable_when_members_end_after_close(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="N_ACCEPTED", threshold=2)
    g.submit("a", "b", "c")
    g.finish("a")
    assert g.close()["state"] == "SEALED"
    g.verdict("reject", "a")  # 0 accepted + b, c could still be accepted
    assert g.group.state == "SEALED"
    g.finish("b")  # succeeded, no verdict yet: still counts
    assert g.group.state == "SEALED"
    g.finish("c", "reject")  # FAILED: only b could still be accepted
    assert g.decided() == ("FINALIZED", "FAILURE", "threshold_unreachable")


def test_n_accepted_lease_lapses_that_use_the_attempts_count_too(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="N_ACCEPTED", threshold=1)
    h.ok("group.submit", **{**g.submit_args("a"), "attempts": 1})
    g.tasks["a"] = g.group.members[0]
    g.close()
    h.receive(g.run_id, lease_ms=1_000)
    h.advance(1_000)
    h.tick()  # the lease lapses: its only attempt failed
    assert h.task(g.tasks["a"]).state == TaskState.FAILED
    assert g.decided() == ("FINALIZED", "FAILURE", "threshold_unreachable")


def test_all_terminal_succeeds_when_closed_and_all_finished_with_accepts_only(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="ALL_TERMINAL")
    g.submit("a", "b")
    g.finish("a")
    g.verdict("accept", "a")
    g.finish("b", "reject")
    assert g.group.state == "OPEN"  # open: nothing is decided by finishing
    assert g.close()["outcome"] == "SUCCESS"
    assert g.decided() == ("FINALIZED", "SUCCESS", "all_terminal")


def test_all_terminal_fails_with_a_rejection_or_without_an_accept(h: Harness, run_id: str) -> None:
    rejected = G(h, run_id, condition="ALL_TERMINAL")
    rejected.submit("a", "b")
    rejected.finish("a")
    rejected.finish("b")
    rejected.verdict("accept", "a")
    rejected.verdict("reject", "b")
    rejected.close()
    assert rejected.decided() == ("FINALIZED", "FAILURE", "all_terminal")
    none = G(h, run_id, condition="ALL_TERMINAL")
    none.submit("a", "b")
    none.close()
    assert none.group.state == "SEALED"
    none.finish("a", "reject")  # FAILED: finished without a verdict, and nobody accepted the other
    none.finish("b")
    none.verdict("reject", "b")
    assert none.decided() == ("FINALIZED", "FAILURE", "all_terminal")
    empty = G(h, run_id, condition="ALL_TERMINAL")
    assert empty.close()["outcome"] == "FAILURE"


def test_all_terminal_waits_for_the_verdict_on_the_last_success(h: Harness, run_id: str) -> None:
    """Every member succeeded before the close and before any verdict (the spec's reviewer flow:
    close, then judge each result): the group decides on the last verdict, which counts."""
    g = G(h, run_id, condition="ALL_TERMINAL")
    g.submit("a", "b", "c")
    for key in ("a", "b", "c"):
        g.finish(key)
    assert g.close()["state"] == "SEALED"
    g.verdict("accept", "a")
    g.verdict("accept", "b")
    assert g.group.state == "SEALED"  # c succeeded but is not judged yet
    last = g.verdict("accept", "c")
    assert (last["late"], last["state"], last["outcome"]) == (False, "FINALIZED", "SUCCESS")
    assert g.decided() == ("FINALIZED", "SUCCESS", "all_terminal")
    rejected = G(h, run_id, condition="ALL_TERMINAL")
    rejected.submit("a", "b")
    rejected.finish("a")
    rejected.finish("b")
    rejected.close()
    rejected.verdict("accept", "a")
    assert rejected.verdict("reject", "b")["late"] is False  # the last verdict decides: FAILURE
    assert rejected.decided() == ("FINALIZED", "FAILURE", "all_terminal")


def test_all_terminal_decides_on_the_last_member_finishing_after_close(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="ALL_TERMINAL", expected_members=2)
    g.submit("a")
    g.finish("a")
    g.verdict("accept", "a")
    g.submit("b")  # reaches expectedMembers: closed
    assert g.group.state == "SEALED"
    g.finish("b", "reject")
    assert g.decided() == ("FINALIZED", "SUCCESS", "all_terminal")


# -- deadline and the run's stop -----------------------------------------------------------------


def test_deadline_finalizes_failure_through_a_tick(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="N_ACCEPTED", threshold=1, deadline_ms=h.now_ms + 5_000)
    g.submit("a")
    h.advance(4_999)
    h.tick()
    assert g.group.state == "OPEN"
    h.advance(1)
    assert h.err("group.submit", **g.submit_args("b")) == "CONFLICT"  # before the tick, too
    h.tick()
    assert g.decided() == ("FINALIZED", "FAILURE", "deadline")
    assert h.task(g.tasks["a"]).state == TaskState.CANCELLED


def test_a_verdict_after_the_deadline_but_before_the_tick_is_late(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="FIRST_ACCEPTED", deadline_ms=h.now_ms + 5_000)
    g.submit("a")
    g.finish("a")
    h.advance(5_000)
    answer = g.verdict("accept", "a")
    assert (answer["late"], answer["outcome"], answer["outcome_reason"]) == (True, "FAILURE", "deadline")
    h.tick()  # the deadline entry finds the group decided
    assert g.decided() == ("FINALIZED", "FAILURE", "deadline")


def test_cancelling_the_parent_finalizes_the_group_cancelled(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="ALL_TERMINAL", parent_id=run_id)
    g.submit("a")
    h.cancel(run_id)
    assert g.decided() == ("FINALIZED", "FAILURE", "cancelled")
    assert h.task(g.tasks["a"]).state == TaskState.CANCELLED
    assert ("group", g.id) in h.woken()


def test_cancelling_the_group_run_itself_finalizes_it(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="FIRST_ACCEPTED")
    h.complete_run(g.run_id)
    assert g.decided() == ("FINALIZED", "FAILURE", "cancelled")


def test_retention_removes_the_group_with_its_run(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="FIRST_ACCEPTED")
    g.submit("a")
    g.finish("a")
    g.verdict("accept", "a")
    h.advance(RETENTION_MS)
    h.tick()
    assert g.id not in h.state.groups and g.run_id not in h.state.runs


def test_groups_survive_a_snapshot(h: Harness, run_id: str) -> None:
    g = G(h, run_id, condition="N_ACCEPTED", threshold=2, deadline_ms=h.now_ms + 60_000)
    g.submit("a", "b")
    g.finish("a")
    g.verdict("accept", "a")
    g.close()
    restored = round_trip(h.state)
    assert restored.groups == h.state.groups
    twin = Harness()
    twin.core.state = restored
    twin.now_ms, twin.commands = h.now_ms, h.commands
    for harness in (h, twin):
        harness.advance(60_000)
        harness.tick()
    assert snapshot_bytes(h.state) == snapshot_bytes(twin.state)
    assert twin.state.groups[g.id].outcome_reason == "deadline"
