"""The chaos checker on small hand-written histories, and the linearizability search on classic
examples and on random histories that are linearizable by construction.

Every check of the contract gets a history that passes and one that violates it; unknown
operations are shown never to be violations by themselves and to explain later observations.
Times: `call`/`ret` are the harness's seconds; server times (`leaseExpiresAt`, `fireAt`,
`firedAt`, `finishedAt`) are epoch milliseconds, kept small here.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos import checker
from chaos.checker import Violation, check_history, format_report, parse_history
from chaos.history import History as HistoryWriter
from chaos.history import HistoryLines, read_history
from chaos.linearizability import (
    UNKNOWN,
    Complete,
    Model,
    Operation,
    Outcome,
    Read,
    check,
    write_once_register,
)

LEASE_MS = 2_000


class H:
    """A hand-written history: `op(...)` adds an operation, `final(...)` a final view;
    `violations(check)` runs one check on it."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []

    def op(
        self,
        op: str,
        args: dict[str, Any],
        call: float,
        ret: float | None,
        result: dict[str, Any] | None = None,
        *,
        status: str = "ok",
        code: str | None = None,
        client: str = "c1",
    ) -> H:
        line = {
            "id": len(self.lines) + 1,
            "client": client,
            "op": op,
            "call": call,
            "ret": None if status == "unknown" else ret,
            "args": args,
            "result": (result if result is not None else {}) if status == "ok" else None,
            "error": None if status == "ok" else {"code": code or "UNAVAILABLE", "message": "..."},
            "status": status,
        }
        self.lines.append(line)
        return self

    def fail(self, op: str, args: dict[str, Any], call: float, ret: float, code: str, **kwargs: Any) -> H:
        return self.op(op, args, call, ret, status="fail", code=code, **kwargs)

    def unknown(self, op: str, args: dict[str, Any], call: float, **kwargs: Any) -> H:
        return self.op(op, args, call, None, status="unknown", **kwargs)

    def final(self, kind: str, entity_id: str, view: dict[str, Any] | None) -> H:
        self.lines.append({"final": kind, "id": entity_id, "view": view})
        return self

    def history_lines(self) -> HistoryLines:
        """As read_history answers."""
        operations = [line for line in self.lines if "op" in line]
        events = [line for line in self.lines if "event" in line]
        return HistoryLines(operations, events, [line for line in self.lines if "final" in line])

    def violations(self, name: str) -> list[Violation]:
        functions = dict(checker.CHECKS)
        return functions[name](parse_history(self.history_lines()))

    # -- tasks -----------------------------------------------------------------------------------

    def submit(self, task: str, call: float, ret: float, *, run: str = "run1", key: str | None = None) -> H:
        args = {"run": run, "mailbox": "work", "key": key or task, "input": {"n": 1}}
        return self.op("submit", args, call, ret, {"taskId": task, "created": True})

    def receive(
        self, task: str, delivery: str, call: float, ret: float, granted_ms: int, *, worker: str = "w1", run: str = "run1",
        attempt: int = 1,
    ) -> H:
        item = {"id": delivery, "taskId": task, "input": {"n": 1}, "leaseExpiresAt": granted_ms + LEASE_MS, "leaseMs": LEASE_MS,
                "attempt": attempt}
        args = {"run": run, "mailbox": "work", "worker": worker, "leaseMs": LEASE_MS}
        return self.op("receive", args, call, ret, {"deliveries": [item]}, client=worker)

    def complete(self, task: str, delivery: str, payload: Any, call: float, ret: float | None, *, status: str = "ok") -> H:
        args = {"delivery": delivery, "taskId": task, "result": payload}
        if status == "fail":
            return self.fail("complete", args, call, ret or call, "STALE_CLAIM")
        return self.op("complete", args, call, ret, {"state": "SUCCEEDED"}, status=status)

    def read_task(self, task: str, call: float, ret: float, state: str, outcome: Any = None) -> H:
        result = {"state": state, "outcome": outcome, "attempt": 1, "finishedBy": None}
        return self.op("read_task", {"taskId": task}, call, ret, result, client="reader")

    def final_task(self, task: str, state: str, outcome: Any = None, finished_by: str | None = None) -> H:
        return self.final("task", task, {"state": state, "outcome": outcome, "attempt": 1, "finishedBy": finished_by})


def completed_task() -> H:
    """t1 submitted, received by w1, completed with {"v": 1}, read, and final."""
    return (
        H()
        .submit("t1", 0, 1)
        .receive("t1", "d1", 1, 2, 10_000)
        .complete("t1", "d1", {"v": 1}, 2, 3)
        .read_task("t1", 4, 5, "SUCCEEDED", {"v": 1})
        .final_task("t1", "SUCCEEDED", {"v": 1}, "w1")
    )


def messages(violations: list[Violation]) -> str:
    return "\n".join(map(str, violations))


# -- 1. results ----------------------------------------------------------------------------------


def test_results_pass_for_a_completed_task() -> None:
    assert completed_task().violations("results") == []


def test_results_an_acknowledged_result_lost() -> None:
    history = H().submit("t1", 0, 1).receive("t1", "d1", 1, 2, 10_000).complete("t1", "d1", {"v": 1}, 2, 3)
    history.final_task("t1", "FAILED")
    found = history.violations("results")
    assert "acknowledged complete's result" in messages(found)


def test_results_a_result_that_changes() -> None:
    # Two unknown completes could each have written the final outcome; a read saw the other one.
    history = H().submit("t1", 0, 1).receive("t1", "d1", 1, 2, 10_000)
    history.unknown("complete", {"delivery": "d1", "taskId": "t1", "result": {"v": 1}}, 2)
    history.unknown("complete", {"delivery": "d1", "taskId": "t1", "result": {"v": 2}}, 2.5)
    history.read_task("t1", 4, 5, "SUCCEEDED", {"v": 1}).final_task("t1", "SUCCEEDED", {"v": 2})
    found = history.violations("results")
    assert len(found) == 1 and "lost or changed" in found[0].message


def test_results_an_acknowledged_task_that_never_finished_or_is_gone() -> None:
    queued = H().submit("t1", 0, 1).final_task("t1", "QUEUED")
    assert "never finished" in messages(queued.violations("results"))
    gone = H().submit("t1", 0, 1).final("task", "t1", {"error": {"code": "NOT_FOUND", "message": "gone"}})
    assert "gone" in messages(gone.violations("results"))


def test_results_an_outcome_no_complete_wrote() -> None:
    history = H().submit("t1", 0, 1).receive("t1", "d1", 1, 2, 10_000)
    history.complete("t1", "d1", {"v": 1}, 2, 3, status="fail").final_task("t1", "SUCCEEDED", {"v": 1})
    assert "no payload" in messages(history.violations("results"))


def test_results_an_unknown_complete_explains_the_outcome_and_an_unknown_submit_proves_nothing() -> None:
    history = H().submit("t1", 0, 1).receive("t1", "d1", 1, 2, 10_000)
    history.unknown("complete", {"delivery": "d1", "taskId": "t1", "result": {"v": 1}}, 2)
    history.final_task("t1", "SUCCEEDED", {"v": 1})
    history.unknown("submit", {"run": "run1", "mailbox": "work", "key": "k2", "input": {}}, 3)
    assert history.violations("results") == []


def test_results_a_task_view_carries_its_own_error_message() -> None:
    # A view's `error` is the task's last error (text); only `{"error": {"code", ...}}` is a refused read.
    history = H().submit("t1", 0, 1).receive("t1", "d1", 1, 2, 10_000)
    history.final("task", "t1", {"state": "FAILED", "outcome": None, "error": "lease expired (holder w1)", "finishedBy": "w1"})
    assert history.violations("results") == [] and history.violations("leases") == []


def test_results_without_final_views_finished_reads_are_compared() -> None:
    history = H().read_task("t1", 0, 1, "SUCCEEDED", {"v": 1}).read_task("t1", 2, 3, "SUCCEEDED", {"v": 2})
    assert len(history.violations("results")) == 1


# -- 2. leases -----------------------------------------------------------------------------------


def taken_over() -> H:
    """d1 (w1) granted at 10000 lapses at 12000; d2 (w2) granted at 12500 completes."""
    return (
        H()
        .submit("t1", 0, 1)
        .receive("t1", "d1", 1, 2, 10_000, worker="w1")
        .receive("t1", "d2", 4, 5, 12_500, worker="w2")
        .complete("t1", "d1", {"by": "w1"}, 6, 7, status="fail")
        .complete("t1", "d2", {"by": "w2"}, 6, 7)
        .final_task("t1", "SUCCEEDED", {"by": "w2"}, "w2")
    )


def test_leases_pass_for_a_takeover_after_a_lapse() -> None:
    assert taken_over().violations("leases") == []


def test_leases_two_accepted_completes() -> None:
    history = H().receive("t1", "d1", 1, 2, 10_000).receive("t1", "d2", 4, 5, 12_500, worker="w2")
    history.complete("t1", "d1", {"v": 1}, 2.5, 3).complete("t1", "d2", {"v": 2}, 6, 7)
    found = history.violations("leases")
    assert any("2 different deliveries" in violation.message for violation in found)


def test_leases_a_complete_from_a_lost_lease_accepted() -> None:
    history = taken_over()
    history.lines[3] = {**history.lines[3], "status": "ok", "result": {"state": "SUCCEEDED"}, "error": None}
    found = history.violations("leases")
    assert any("its lease was lost" in violation.message for violation in found)


def test_leases_the_final_view_names_another_finisher() -> None:
    history = H().receive("t1", "d1", 1, 2, 10_000, worker="w1").complete("t1", "d1", {"v": 1}, 2, 3)
    history.final_task("t1", "SUCCEEDED", {"v": 1}, "w9")
    assert "w9 finished" in messages(history.violations("leases"))


def test_leases_overlapping_valid_leases() -> None:
    # d1's renew was acknowledged until 13000; d2 was granted at 12500.
    history = H().receive("t1", "d1", 1, 2, 10_000)
    history.op("renew", {"delivery": "d1", "taskId": "t1"}, 2.5, 3, {"leaseExpiresAt": 13_000})
    history.receive("t1", "d2", 4, 5, 12_500, worker="w2")
    found = history.violations("leases")
    assert len(found) == 1 and "while delivery d1's lease was valid until 13000" in found[0].message


def test_leases_a_release_acknowledged_or_unknown_before_the_second_receive_explains_it() -> None:
    for status in ("ok", "unknown"):
        history = H().receive("t1", "d1", 1, 2, 10_000)
        history.op("release", {"delivery": "d1", "taskId": "t1"}, 2.5, 3, {}, status=status)
        history.receive("t1", "d2", 4, 5, 10_500, worker="w2")
        assert history.violations("leases") == [], status
    # A refused release ended nothing.
    history = H().receive("t1", "d1", 1, 2, 10_000)
    history.fail("release", {"delivery": "d1", "taskId": "t1"}, 2.5, 3, "STALE_CLAIM")
    history.receive("t1", "d2", 4, 5, 10_500, worker="w2")
    assert len(history.violations("leases")) == 1


# -- 3. once -------------------------------------------------------------------------------------


def once_calls(*values: Any) -> H:
    history = H()
    for index, value in enumerate(values):
        history.op("once", {"key": "k", "name": "f"}, index, index + 1, {"value": value}, client=f"c{index}")
    return history


def test_once_pass_for_one_value_and_unknown_callers() -> None:
    history = once_calls({"v": 1}, {"v": 1})
    history.unknown("once", {"key": "k", "name": "f"}, 3)
    history.fail("once", {"key": "k", "name": "f"}, 3, 4, "STALE_CLAIM")
    history.final("once", "k", {"key": "k", "state": "DONE", "result": {"v": 1}})
    assert history.violations("once") == []


def test_once_two_values() -> None:
    assert "2 different results" in messages(once_calls({"v": 1}, {"v": 2}).violations("once"))


def test_once_a_value_and_once_failed_and_a_final_entry_that_differs() -> None:
    history = once_calls({"v": 1}).fail("once", {"key": "k", "name": "f"}, 3, 4, "ONCE_FAILED")
    assert "ONCE_FAILED" in messages(history.violations("once"))
    history = once_calls({"v": 1}).final("once", "k", {"key": "k", "state": "DONE", "result": {"v": 2}})
    assert "final once entry" in messages(history.violations("once"))


# -- 4. groups -----------------------------------------------------------------------------------


def member(task: str, state: str, verdict: str | None = None, late: bool = False) -> dict[str, Any]:
    return {"taskId": task, "state": state, "verdict": verdict, "late": late}


def group_view(state: str, outcome: str | None, reason: str | None, members: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "g1", "scopeId": "grun", "parentScopeId": "prun", "condition": "N_ACCEPTED", "threshold": 2,
        "deadline": None, "state": state, "outcome": outcome, "outcomeReason": reason, "members": members,
    }  # fmt: skip


def verdict(history: H, task: str, given: str, call: float, result: dict[str, Any]) -> H:
    return history.op("verdict", {"groupId": "g1", "taskId": task, "verdict": given}, call, call + 0.5, result)


SUCCESS = {"groupState": "FINALIZED", "outcome": "SUCCESS", "outcomeReason": "threshold_reached"}


def decided_group() -> H:
    """N_ACCEPTED, threshold 2: t1 and t2 accepted on time, t3 cancelled by the decision, t4
    rejected late."""
    history = H().op("group_create", {"run": "prun"}, 0, 1, {"groupId": "g1", "condition": "N_ACCEPTED", "threshold": 2})
    verdict(history, "t1", "accept", 2, {"late": False, "groupState": "SEALED", "outcome": None, "outcomeReason": None})
    verdict(history, "t2", "accept", 3, {"late": False, **SUCCESS})
    history.op("group_read", {"groupId": "g1"}, 4, 5, {"state": "FINALIZED", "outcome": "SUCCESS", "outcomeReason": "threshold_reached"})
    verdict(history, "t4", "reject", 6, {"late": True, **SUCCESS})
    members = [
        member("t1", "SUCCEEDED", "ACCEPTED"),
        member("t2", "SUCCEEDED", "ACCEPTED"),
        member("t3", "CANCELLED"),
        member("t4", "SUCCEEDED", "REJECTED", late=True),
    ]
    return history.final("group", "g1", group_view("FINALIZED", "SUCCESS", "threshold_reached", members))


def test_groups_pass_for_a_decision_and_a_late_verdict() -> None:
    assert decided_group().violations("groups") == []


def test_groups_finalized_twice() -> None:
    history = decided_group()
    history.op("group_read", {"groupId": "g1"}, 7, 8, {"state": "FINALIZED", "outcome": "FAILURE", "outcomeReason": "threshold_unreachable"})
    assert "different decisions" in messages(history.violations("groups"))


def test_groups_seen_undecided_after_it_was_finalized() -> None:
    history = decided_group()
    history.op("group_read", {"groupId": "g1"}, 7, 8, {"state": "SEALED", "outcome": None, "outcomeReason": None})
    assert "after it was seen FINALIZED" in messages(history.violations("groups"))


def test_groups_finalized_against_its_verdicts() -> None:
    members = [member("t1", "SUCCEEDED", "ACCEPTED"), member("t2", "SUCCEEDED", "ACCEPTED"), member("t3", "FAILED")]
    history = H().final("group", "g1", group_view("FINALIZED", "FAILURE", "threshold_unreachable", members))
    assert "imply SUCCESS threshold_reached" in messages(history.violations("groups"))
    # Unreachable is right only when accepted + could still be accepted < threshold.
    members = [member("t1", "SUCCEEDED", "ACCEPTED"), member("t2", "CANCELLED"), member("t3", "FAILED")]
    history = H().final("group", "g1", group_view("FINALIZED", "FAILURE", "threshold_unreachable", members))
    assert "imply nothing yet" in messages(history.violations("groups"))
    members = [member("t1", "SUCCEEDED", "ACCEPTED"), member("t2", "FAILED", "REJECTED"), member("t3", "FAILED")]
    history = H().final("group", "g1", group_view("FINALIZED", "FAILURE", "threshold_unreachable", members))
    assert history.violations("groups") == []


def test_groups_a_late_verdict_that_changed_it_or_an_acknowledged_verdict_lost() -> None:
    history = decided_group()
    history.lines[-1]["view"]["members"][1]["late"] = True  # t2's acceptance turned late: one accepted on time
    found = messages(history.violations("groups"))
    assert "late=False has late=True" in found and "imply nothing yet" in found
    history = decided_group()
    history.lines[-1]["view"]["members"][3]["verdict"] = None
    assert "acknowledged verdict REJECTED is None" in messages(history.violations("groups"))


def test_groups_undecided_although_its_members_decide() -> None:
    members = [member("t1", "SUCCEEDED", "ACCEPTED"), member("t2", "SUCCEEDED", "ACCEPTED")]
    history = H().final("group", "g1", group_view("SEALED", None, None, members))
    assert "members decide SUCCESS threshold_reached" in messages(history.violations("groups"))


def test_groups_cancelled_needs_a_stop_of_its_run() -> None:
    members = [member("t1", "CANCELLED")]
    history = H().final("group", "g1", group_view("FINALIZED", "FAILURE", "cancelled", members))
    history.final("run", "prun", {"storedState": "ACTIVE", "deadline": None, "parentId": None, "finishedAt": None})
    assert "nothing stopped its run" in messages(history.violations("groups"))
    # An unknown cancel of the parent may have stopped it.
    history.unknown("cancel_run", {"run": "prun"}, 1)
    assert history.violations("groups") == []


# -- 5. barriers ---------------------------------------------------------------------------------


def barrier(target: int = 2) -> H:
    return H().op("barrier_create", {"run": "run1", "target": target}, 0, 1, {"barrierId": "b1", "target": target, "epoch": 1})


def arrive(history: H, key: str, call: float, state: str, arrivals: int, *, arrived: bool = True) -> H:
    result = {"arrived": arrived, "state": state, "arrivals": arrivals, "epoch": 1}
    return history.op("arrive", {"barrierId": "b1", "key": key}, call, call + 0.5, result, client=key)


def read_barrier(history: H, call: float, state: str, arrivals: int) -> H:
    result = {"state": state, "arrivals": arrivals, "target": 2, "epoch": 1}
    return history.op("barrier_read", {"barrierId": "b1"}, call, call + 0.5, result)


def test_barriers_pass_for_a_release_at_the_target() -> None:
    history = arrive(barrier(), "a", 2, "WAITING", 1)
    arrive(history, "b", 3, "RELEASED", 2)
    arrive(history, "a", 4, "RELEASED", 2, arrived=False)
    history.fail("arrive", {"barrierId": "b1", "key": "c"}, 5, 5.5, "BARRIER_RELEASED")
    read_barrier(history, 6, "RELEASED", 2).final("barrier", "b1", {"state": "RELEASED", "arrivals": 2, "target": 2, "epoch": 1})
    assert history.violations("barriers") == []


def test_barriers_an_unknown_arrival_may_have_counted() -> None:
    history = arrive(barrier(), "a", 2, "WAITING", 1)
    history.unknown("arrive", {"barrierId": "b1", "key": "b"}, 3)
    read_barrier(history, 4, "RELEASED", 2)
    assert history.violations("barriers") == []


def test_barriers_released_early() -> None:
    history = arrive(barrier(), "a", 2, "WAITING", 1)
    history.fail("arrive", {"barrierId": "b1", "key": "b"}, 2.2, 2.4, "BARRIER_CANCELLED")
    read_barrier(history, 3, "RELEASED", 2)
    assert "only 1 distinct keys" in messages(history.violations("barriers"))


def test_barriers_released_twice_and_an_arrival_after_the_release() -> None:
    history = arrive(barrier(), "a", 2, "WAITING", 1)
    arrive(history, "b", 3, "RELEASED", 2)
    read_barrier(history, 4, "WAITING", 1)
    assert "seen WAITING after RELEASED" in messages(history.violations("barriers"))
    history = arrive(barrier(), "a", 2, "WAITING", 1)
    arrive(history, "b", 3, "RELEASED", 2)
    arrive(history, "c", 4, "RELEASED", 3)
    found = messages(history.violations("barriers"))
    assert "'c' was acknowledged as a new arrival" in found and "3 arrivals counted for a target of 2" in found


# -- 6. timers -----------------------------------------------------------------------------------


def timer(fire_at: int = 5_000) -> H:
    return H().op("timer_create", {"run": "run1", "afterMs": 3_000}, 0, 1, {"timerId": "tm1", "fireAt": fire_at, "state": "ARMED"})


def read_timer(history: H, call: float, state: str, fired_at: int | None) -> H:
    return history.op("timer_read", {"timerId": "tm1"}, call, call + 0.5, {"state": state, "firedAt": fired_at, "fireAt": 5_000})


def test_timers_pass_for_one_firing() -> None:
    history = read_timer(timer(), 2, "ARMED", None)
    read_timer(history, 6, "FIRED", 5_010)
    history.final("timer", "tm1", {"scopeId": "run1", "state": "FIRED", "fireAt": 5_000, "firedAt": 5_010})
    history.final("run", "run1", {"storedState": "ACTIVE", "finishedAt": None})
    assert history.violations("timers") == []


def test_timers_fired_twice_early_or_back_to_armed() -> None:
    twice = read_timer(read_timer(timer(), 6, "FIRED", 5_010), 7, "FIRED", 5_900)
    assert "2 different times" in messages(twice.violations("timers"))
    early = read_timer(timer(), 6, "FIRED", 4_000)
    assert "before its time 5000" in messages(early.violations("timers"))
    back = read_timer(read_timer(timer(), 6, "FIRED", 5_010), 7, "ARMED", None)
    assert "seen ARMED after FIRED" in messages(back.violations("timers"))


def test_timers_fired_after_the_cancel_of_its_run() -> None:
    history = timer().op("cancel_run", {"run": "run1"}, 2, 3, {"storedState": "CANCELLED", "finishedAt": 4_500})
    history.final("timer", "tm1", {"scopeId": "run1", "state": "FIRED", "fireAt": 5_000, "firedAt": 5_010})
    assert "after its run run1 stopped at 4500" in messages(history.violations("timers"))
    still_armed = timer().op("cancel_run", {"run": "run1"}, 2, 3, {"storedState": "CANCELLED", "finishedAt": 4_500})
    read_timer(still_armed, 4, "ARMED", None)
    assert "still ARMED after the cancel" in messages(still_armed.violations("timers"))


def test_timers_an_unknown_cancel_proves_nothing() -> None:
    history = timer().unknown("cancel_run", {"run": "run1"}, 2)
    read_timer(history, 4, "ARMED", None)
    read_timer(history, 6, "FIRED", 5_010)
    assert history.violations("timers") == []


# -- 7. cancel -----------------------------------------------------------------------------------


def cancelled_run() -> H:
    return H().op("cancel_run", {"run": "run1"}, 10, 11, {"storedState": "CANCELLED", "finishedAt": 50_000})


def test_cancel_pass_refused_concurrent_and_existing_submits() -> None:
    history = cancelled_run()
    history.fail("submit", {"run": "run1", "mailbox": "work", "key": "k9", "input": {}}, 12, 13, "SCOPE_CANCELLED")
    history.submit("t2", 10.5, 11.5, key="k2")  # concurrent with the cancel: may come first
    args = {"run": "run1", "mailbox": "work", "key": "k1", "input": {}}
    history.op("submit", args, 12, 13, {"taskId": "t1", "created": False})  # the existing task
    assert history.violations("cancel") == []


def test_cancel_a_submit_accepted_after_an_acknowledged_cancel() -> None:
    history = cancelled_run().submit("t9", 12, 13, key="k9")
    found = history.violations("cancel")
    assert len(found) == 1 and "created a task" in found[0].message


def test_cancel_an_unknown_cancel_proves_nothing() -> None:
    history = H().unknown("cancel_run", {"run": "run1"}, 10).submit("t9", 12, 13)
    assert history.violations("cancel") == []


def test_cancel_work_handed_out_or_completed_after_the_cancel() -> None:
    history = cancelled_run().receive("t1", "d1", 12, 13, 60_000)
    assert "receive called after" in messages(history.violations("cancel"))
    history = H().submit("t1", 0, 1).receive("t1", "d1", 1, 2, 10_000)
    history.op("cancel_run", {"run": "run1"}, 3, 4, {"storedState": "CANCELLED", "finishedAt": 11_000})
    history.complete("t1", "d1", {"v": 1}, 5, 6)
    assert "a complete called after" in messages(history.violations("cancel"))
    # A repeat of a complete that was sent before the cancel returned is answered again.
    history = H().submit("t1", 0, 1).receive("t1", "d1", 1, 2, 10_000)
    history.unknown("complete", {"delivery": "d1", "taskId": "t1", "result": {"v": 1}}, 2.5)
    history.op("cancel_run", {"run": "run1"}, 3, 4, {"storedState": "CANCELLED", "finishedAt": 11_000})
    history.complete("t1", "d1", {"v": 1}, 5, 6)
    assert history.violations("cancel") == []


# -- 9. replays ---------------------------------------------------------------------------------


def test_replays_answered_alike_pass() -> None:
    history = H().op("run_create", {"idem": "k1"}, 0, 1, {"run": "run1"})
    history.unknown("run_create", {"idem": "k2"}, 2).op("run_create", {"idem": "k2"}, 3, 4, {"run": "run2"})
    history.op("run_create", {"idem": "k1"}, 5, 6, {"run": "run1"})  # a deliberate second send
    history.fail("run_create", {"idem": "k3"}, 7, 8, "VALIDATION_FAILED").op("run_create", {"idem": "k3"}, 9, 10, {"run": "run3"})
    assert history.violations("replays") == []


def test_replays_a_retry_applied_again() -> None:
    args = {"run": "run1", "mailbox": "work", "key": "a", "input": {"n": 1}, "idem": "k1"}
    history = H().op("submit", args, 0, 1, {"taskId": "t1", "created": True})
    history.op("submit", args, 2, 3, {"taskId": "t1", "created": False})  # found the task: not a replay
    found = history.violations("replays")
    assert len(found) == 1 and "applied again" in found[0].message
    # Another kind of call under the same key is another request.
    history = H().op("run_create", {"idem": "k1"}, 0, 1, {"run": "run1"}).op("submit", args, 2, 3, {"taskId": "t1", "created": True})
    assert history.violations("replays") == []


# -- 10. capacity -------------------------------------------------------------------------------

PERMIT_LEASE_MS = 2_000


def permit(total: int = 2) -> H:
    return H().op("permit_declare", {"name": "p", "units": total}, 0, 0.1, {"permitId": "prm_1", "unitsTotal": total})


def grant(h: H, grant_id: str, call: float, ret: float, *, units: int = 1, run: str = "run1", status: str = "ok") -> H:
    args = {"permit": "prm_1", "run": run, "units": units, "leaseMs": PERMIT_LEASE_MS, "waiter": None}
    result = {"grantId": grant_id, "token": "t", "units": units, "leaseExpiresAt": 0}
    return h.op("permit_acquire", args, call, ret, result, status=status)


def release(h: H, grant_id: str, call: float, ret: float, *, status: str = "ok") -> H:
    return h.op("permit_release", {"grantId": grant_id, "lapsed": False}, call, ret, {}, status=status)


def test_capacity_passes_for_grants_released_lapsed_or_ended_by_their_runs_cancel() -> None:
    h = permit(total=2)
    grant(h, "g1", 1, 1.1, units=2)
    release(h, "g1", 1.5, 1.6)
    grant(h, "g2", 1.55, 1.65, units=2)  # the release was called first: it may have taken effect
    grant(h, "g3", 1.7, 1.8, units=2, status="unknown")  # holds nothing certain
    grant(h, "g4", 3.6, 3.7, units=1)  # g2's lease (from 1.55) ran out at 3.55
    h.op("cancel_run", {"run": "run2"}, 5, 5.1, {})
    grant(h, "g5", 4, 4.1, units=1, run="run2")
    grant(h, "g6", 5.05, 5.2, units=1)  # g5 ended with its run's cancel, called at 5
    h.op("permit_read", {"permit": "prm_1"}, 6, 6.1, {"unitsTotal": 2, "unitsInUse": 1, "grants": [["g6", 1]]})
    h.final("permit", "prm_1", {"unitsInUse": 0, "unitsTotal": 2})
    assert h.violations("capacity") == []


def test_capacity_grants_that_overlap_beyond_the_size() -> None:
    h = permit(total=2)
    grant(h, "g1", 1, 1.1, units=2)
    release(h, "g1", 1.5, 1.6, status="fail")  # refused: it did not end the grant
    grant(h, "g2", 1.4, 1.45, units=1)
    found = h.violations("capacity")
    assert len(found) == 1 and "3 units of 2" in found[0].message


def test_capacity_a_view_over_its_size_an_acquire_after_a_cancel_and_units_left_at_the_end() -> None:
    h = permit(total=2)
    h.op("permit_read", {"permit": "prm_1"}, 1, 1.1, {"unitsTotal": 2, "unitsInUse": 3, "grants": [["a", 3]]})
    h.op("cancel_run", {"run": "run9"}, 2, 2.1, {})
    grant(h, "g1", 3, 3.1, run="run9")
    h.final("permit", "prm_1", {"unitsInUse": 1, "unitsTotal": 2})
    found = messages(h.violations("capacity"))
    assert "3 of 2 units in use" in found
    assert "after its cancel was acknowledged" in found
    assert "still has 1 units in use" in found


def allowance(units: int = 3, window_s: float = 2) -> H:
    return H().op("allowance_declare", {"name": "a"}, 0, 0.1,
                  {"allowanceId": "alw_1", "unitsLimit": units, "windowSeconds": window_s})


def consume(h: H, call: float, ret: float, units: int = 1, *, status: str = "ok") -> H:
    return h.op("allowance_consume", {"allowance": "alw_1", "run": "r", "units": units}, call, ret,
                {"consumptionId": f"acn_{call}", "units": units}, status=status)


def test_capacity_an_allowance_passes_when_each_window_holds_its_units() -> None:
    h = allowance(units=3)
    for call in (1, 1.1, 1.2):
        consume(h, call, call + 0.05)
    consume(h, 1.3, 3.5)  # its answer came late: it may have been taken after the window moved on
    consume(h, 1.4, 1.45, status="unknown")
    h.op("allowance_wait", {"allowance": "alw_1", "run": "r", "units": 1}, 1.5, 1.6, {"waiterId": "w", "state": "WAITING"})
    h.op("allowance_waiter_read", {"waiterId": "w"}, 3.0, 3.6, {"state": "GRANTED"})
    assert h.violations("capacity") == []


def test_capacity_an_allowance_that_lets_too_much_through_a_window() -> None:
    h = allowance(units=3)
    for call in (1, 1.1, 1.2):
        consume(h, call, call + 0.05)
    h.op("allowance_wait", {"allowance": "alw_1", "run": "r", "units": 1}, 1.5, 1.6, {"waiterId": "w", "state": "WAITING"})
    h.op("allowance_waiter_read", {"waiterId": "w"}, 2.0, 2.1, {"state": "GRANTED"})
    found = h.violations("capacity")
    assert len(found) == 1 and "4 units went through within 2 s" in found[0].message


def stamped(seq: int, event_type: str, created_ms: float, **payload: Any) -> dict[str, Any]:
    """An event of the allowance or the budget, stamped by the leader at `created_ms`."""
    return {**resource_event(seq, event_type, run="r", **payload), "createdAt": created_ms}


# The leader's epoch ms at the harness's time 0 (a wall clock and a monotonic one).
OFFSET_MS = 1_796_000_000_000


def stepped_clock(h: H, calls: list[float], shift_s: float, log: list[dict[str, Any]]) -> None:
    """Budget reservations at `calls` (answered 0.05 s later), stamped by a leader whose clock is
    `shift_s` ahead of the harness's, and their events in `log`."""
    for call in calls:
        reservation = f"rsv_{call}"
        h.op("budget_reserve", {"budget": "bdg_1", "run": "r", "amountMinor": 1}, call, call + 0.05,
             {"reservationId": reservation, "reservedMinor": 1})
        log.append(stamped(len(log) + 1, "budget.reserved", OFFSET_MS + (call + shift_s) * 1000, budgetId="bdg_1",
                           reservationId=reservation, state="ACTIVE", amountMinor="1"))


def too_much_through_a_window(stamps_s: list[float], *, witnesses: int = 0) -> H:
    """Four consumes of a 3-per-2 s allowance within 0.4 s by the harness's clock, stamped by the
    leader at `stamps_s` (harness seconds); `witnesses` budget reservations before them stamped as
    the first consume and as many after them stamped as the last; an event page with every stamp."""
    h = allowance(units=3)
    log: list[dict[str, Any]] = []
    stepped_clock(h, [0.1 * index for index in range(witnesses)], stamps_s[0] - 1.0, log)
    for call, stamp in zip((1.0, 1.1, 1.2, 1.3), stamps_s, strict=True):
        consume(h, call, call + 0.05)
        log.append(stamped(len(log) + 1, "allowance.consumed", OFFSET_MS + stamp * 1000, allowanceId="alw_1",
                           consumptionId=f"acn_{call}", units=1, waiterId=None))
    stepped_clock(h, [5.0 + 0.1 * index for index in range(witnesses)], stamps_s[-1] - 1.3, log)
    return page(h, log, None, 9.0, op="events_read", client="final-events")


def test_capacity_an_allowance_window_names_the_leaders_stamps_of_its_grants() -> None:
    found = too_much_through_a_window([1.01, 1.11, 1.21, 1.31]).violations("capacity")
    assert len(found) == 1 and "4 units went through within 2 s" in found[0].message
    assert "the leader stamped them at +0, +100, +200, +300 ms" in found[0].message


def test_capacity_a_window_a_whole_window_long_by_the_leaders_clock_across_a_clock_step_is_a_note() -> None:
    # The nodes' wall clock stepped 2 s forward between the second consume and the third (or the
    # harness's monotonic clock missed 2 s of a paused machine): by the leader's clock, which the
    # window is kept by, the four grants were 2.3 s apart.
    stepped = too_much_through_a_window([1.01, 1.11, 3.21, 3.31], witnesses=3)
    assert stepped.violations("capacity") == []
    report = checker.check_history(stepped.history_lines())
    assert not [violation for violation in report.violations if violation.check == "capacity"]
    noted = [note for note in report.notes if note.startswith("capacity: allowance alw_1")]
    assert len(noted) == 1 and "stamped them at +0, +100, +2200, +2300 ms" in noted[0], report.notes
    assert "moved +1950 to +2050 ms against the harness's between #6 and #7: not counted" in noted[0]
    clock = [note for note in report.notes if note.startswith("clock:")]
    assert len(clock) == 1 and "+1950 to +2050 ms" in clock[0] and "(5 stamped operations" in clock[0], report.notes


def test_capacity_a_step_with_too_few_witnesses_or_too_small_explains_no_window() -> None:
    few = too_much_through_a_window([1.01, 1.11, 3.21, 3.31], witnesses=0).violations("capacity")
    assert len(few) == 1 and "+0, +100, +2200, +2300 ms" in few[0].message
    small = too_much_through_a_window([1.01, 1.11, 1.61, 1.71], witnesses=3)
    found = small.violations("capacity")
    assert len(found) == 1 and "+0, +100, +600, +700 ms" in found[0].message
    clock = [note for note in checker.check_history(small.history_lines()).notes if note.startswith("clock:")]
    assert len(clock) == 1 and "moved +350 to +450 ms against the harness's between #6 and #7" in clock[0], clock


@pytest.mark.parametrize("step_s", [0.0, 1.0])
def test_capacity_a_permit_lease_ends_earlier_by_a_forward_step_of_the_leaders_clock(step_s: float) -> None:
    # g1's 2 s lease, from 1.0 by the harness's clock, ends at 2.0 by it when the leader's clock
    # stepped 1 s forward meanwhile: g2, granted at 2.2, does not overlap it then.
    h = permit(total=1)
    log: list[dict[str, Any]] = []
    stepped_clock(h, [0.5, 0.6, 0.7], 0.0, log)
    grant(h, "g1", 1.0, 1.05)
    stepped_clock(h, [1.3, 1.4, 1.5], step_s, log)
    grant(h, "g2", 2.2, 2.25)
    page(h, log, None, 9.0, op="events_read", client="final-events")
    found = [violation.message for violation in h.violations("capacity")]
    assert found == ([] if step_s else ["grants certainly held add up to 2 units of 1"]), found


def test_stamps_that_fit_one_offset_note_no_clock_step() -> None:
    report = checker.check_history(too_much_through_a_window([1.01, 1.11, 1.21, 1.31], witnesses=3).history_lines())
    assert not [note for note in report.notes if note.startswith("clock:")], report.notes


# -- 11. money ----------------------------------------------------------------------------------


def budget_view(settled: int, reserved: int, *, limit: int = 1_000, held: int | None = None) -> dict[str, Any]:
    return {"limitMinor": limit, "settledMinor": settled, "reservedMinor": reserved,
            "remainingMinor": limit - settled - reserved, "held": reserved if held is None else held}


def money() -> H:
    h = H().op("budget_declare", {"name": "b"}, 0, 0.1, {"budgetId": "bdg_1", "limitMinor": 1_000})
    h.op("budget_reserve", {"budget": "bdg_1", "run": "r", "amountMinor": 300}, 1, 1.1,
         {"reservationId": "rsv_1", "reservedMinor": 300})
    return h


def settle(h: H, work_key: str, amount: int, charged: int | None, call: float, *, status: str = "ok") -> H:
    args = {"budget": "bdg_1", "reservationId": "rsv_1", "amountMinor": amount, "workKey": work_key, "allowOverrun": False}
    return h.op("budget_settle", args, call, call + 0.1, {"chargedMinor": charged, "state": "ACTIVE"}, status=status)


def test_money_passes_for_settles_reads_and_an_unknown_settle_that_charged() -> None:
    h = money()
    settle(h, "settle:0", 100, 100, 2)
    settle(h, "settle:0", 100, 100, 2.5)  # a retry under its key charges once
    settle(h, "settle:1", 50, None, 3, status="unknown")
    h.op("budget_read", {"budget": "bdg_1"}, 4, 4.1, budget_view(150, 150))
    reservations = [{"reservedMinor": "0", "state": "VOIDED"}]
    h.final("budget", "bdg_1", {"limitMinor": "1000", "settledMinor": "150", "reservedMinor": "0",
                                "remainingMinor": "850", "reservations": reservations})
    assert h.violations("money") == []


def test_money_unbalanced_views_settled_going_down_and_money_created() -> None:
    h = money()
    settle(h, "settle:0", 100, 100, 2)
    h.op("budget_read", {"budget": "bdg_1"}, 3, 3.1, budget_view(100, 200, held=150))
    h.op("budget_read", {"budget": "bdg_1"}, 4, 4.1, budget_view(50, 0))
    h.final("budget", "bdg_1", {"limitMinor": "1000", "settledMinor": "400", "reservedMinor": "0",
                                "remainingMinor": "600", "reservations": []})
    found = messages(h.violations("money"))
    assert "open reservations hold 150, its reserved is 200" in found
    assert "settled went down" in found
    assert "settled 400 at the end, but acknowledged settles charged 100" in found


# -- 8. linearizability (the check) --------------------------------------------------------------


def test_linearizability_pass_for_reads_around_a_complete() -> None:
    history = H().read_task("t1", 0, 0.5, "QUEUED").receive("t1", "d1", 1, 2, 10_000)
    history.complete("t1", "d1", {"v": 1}, 2, 4).read_task("t1", 3, 3.5, "RUNNING").read_task("t1", 5, 6, "SUCCEEDED", {"v": 1})
    assert history.violations("linearizability") == []


def test_linearizability_a_read_that_sees_the_result_then_a_read_that_sees_nothing() -> None:
    history = H().receive("t1", "d1", 1, 2, 10_000).complete("t1", "d1", {"v": 1}, 2, 3)
    history.read_task("t1", 4, 5, "SUCCEEDED", {"v": 1}).read_task("t1", 6, 7, "RUNNING")
    found = history.violations("linearizability")
    assert len(found) == 1
    assert [op.op for op in found[0].ops] == ["complete", "read_task", "read_task"]
    assert "no order explains" in found[0].message


def test_linearizability_an_unknown_complete_explains_a_read() -> None:
    history = H().receive("t1", "d1", 1, 2, 10_000)
    history.unknown("complete", {"delivery": "d1", "taskId": "t1", "result": {"v": 1}}, 2)
    history.read_task("t1", 30, 31, "SUCCEEDED", {"v": 1})
    assert history.violations("linearizability") == []


def test_linearizability_an_undecided_search_is_a_note_not_a_violation() -> None:
    history = H().receive("t1", "d1", 1, 2, 10_000).complete("t1", "d1", {"v": 1}, 2, 30)
    for i in range(8):
        history.read_task("t1", 3 + i, 20 + i, "RUNNING")
    parsed = parse_history(history.history_lines())
    assert checker.check_linearizable_reads(parsed, budget_steps=3) == []
    assert parsed.notes == ["linearizability: task t1 undecided after 3 search steps"]
    assert parsed.counts_extra == {"registers": 1, "registers_undecided": 1}


# -- the linearizability search ------------------------------------------------------------------


def op(client: str, call: float, ret: float | None, input: Any, output: Any) -> Operation:
    return Operation(client, call, ret, input, output)


def _register_step(state: int, input: tuple[str, int], output: Any) -> tuple[bool, int]:
    kind, value = input
    if kind == "put":
        return True, value
    return (output is UNKNOWN or output == state), state


# A plain read/write register (porcupine's first example), to show the search is generic.
register: Model[int] = Model(init=0, step=_register_step)


def test_search_a_linearizable_concurrent_history() -> None:
    # The get of 0 goes before the put, the get of 100 after it: both overlap the put.
    history = [
        op("c0", 0, 100, ("put", 100), None),
        op("c1", 25, 75, ("get", 0), 100),
        op("c2", 30, 60, ("get", 0), 0),
    ]
    assert check(register, history).outcome == Outcome.OK


def test_search_a_stale_read() -> None:
    # The get of 0 starts after the get of 100 returned: no order explains both.
    history = [
        op("c0", 0, 100, ("put", 100), None),
        op("c1", 25, 75, ("get", 0), 100),
        op("c2", 80, 90, ("get", 0), 0),
    ]
    result = check(register, history)
    assert result.outcome == Outcome.VIOLATION and result.prefix_end == 90
    assert result.prefix == tuple(history)


def test_search_the_shortest_failing_prefix() -> None:
    history = [
        op("c0", 0, 1, Complete("k", "a"), True),
        op("c1", 2, 3, Read("k"), None),  # stale: the write returned before this read began
        op("c1", 4, 5, Read("k"), "a"),
        op("c0", 6, 7, Read("k"), "a"),
    ]
    result = check(write_once_register, history)
    assert result.outcome == Outcome.VIOLATION and result.key == "k"
    assert result.prefix == tuple(history[:2]) and result.prefix_end == 3


def test_search_an_unknown_operation_explains_a_read_but_only_after_its_call() -> None:
    explained = [op("c0", 0, None, Complete("k", "a"), None), op("c1", 10, 11, Read("k"), "a")]
    assert check(write_once_register, explained).outcome == Outcome.OK
    # Never returning, it may also not have happened at all.
    not_happened = [op("c0", 0, None, Complete("k", "a"), None), op("c1", 10, 11, Read("k"), None)]
    assert check(write_once_register, not_happened).outcome == Outcome.OK
    too_late = [op("c1", 10, 11, Read("k"), "a"), op("c0", 12, None, Complete("k", "a"), None)]
    assert check(write_once_register, too_late).outcome == Outcome.VIOLATION


def test_search_write_once_refuses_a_second_value() -> None:
    history = [op("c0", 0, 1, Complete("k", "a"), True), op("c1", 2, 3, Complete("k", "b"), True)]
    assert check(write_once_register, history).outcome == Outcome.VIOLATION
    refused = [op("c0", 0, 1, Complete("k", "a"), True), op("c1", 2, 3, Complete("k", "b"), False), op("c2", 4, 5, Read("k"), "a")]
    assert check(write_once_register, refused).outcome == Outcome.OK
    repeated = [op("c0", 0, 1, Complete("k", "a"), True), op("c0", 2, 3, Complete("k", "a"), True)]
    assert check(write_once_register, repeated).outcome == Outcome.OK


def test_search_partitions_by_key() -> None:
    history = [
        op("c0", 0, 1, Complete("good", "a"), True),
        op("c1", 2, 3, Read("good"), "a"),
        op("c0", 0, 1, Complete("bad", "a"), True),
        op("c1", 2, 3, Read("bad"), "b"),
    ]
    result = check(write_once_register, history)
    assert result.outcome == Outcome.VIOLATION and result.key == "bad"
    assert result.outcomes["good"] == Outcome.OK


def test_search_answers_unknown_when_the_budget_runs_out() -> None:
    # Twelve concurrent reads of nothing and a write that returned last: decidable, not in 5 steps.
    history = [op("c0", 0, 100, Complete("k", "a"), True)]
    history += [op(f"r{i}", 1 + i, 50 + i, Read("k"), None) for i in range(12)]
    history.append(op("r", 101, 102, Read("k"), None))  # stale: a violation, found with budget
    assert check(write_once_register, history, budget_steps=5).outcome == Outcome.UNKNOWN
    assert check(write_once_register, history).outcome == Outcome.VIOLATION


@st.composite
def linearizable_histories(draw: st.DrawFn) -> list[Operation]:
    """Random write-once register histories over a few keys, linearizable by construction: each
    operation's point is its index, its interval a random stretch around it, its output what the
    register gives at that point; some completes never return (and then may or may not have
    taken effect). Sequential when every stretch is zero."""
    count = draw(st.integers(0, 14))
    registers: dict[Hashable, Hashable | None] = {}
    operations = []
    for point in range(count):
        key = draw(st.sampled_from(["x", "y"]))
        call = point - draw(st.sampled_from([0, 0, 0.25, 1.5, 3]))
        ret = point + draw(st.sampled_from([0, 0, 0.25, 1.5, 3]))
        current = registers.get(key)
        if draw(st.booleans()):
            operations.append(Operation("c", call, ret, Read(key), current))
            continue
        value = draw(st.sampled_from(["a", "b"]))
        if draw(st.integers(0, 4)) == 0:  # never returned: took effect or not
            if current is None and draw(st.booleans()):
                registers[key] = value
            operations.append(Operation("c", call, None, Complete(key, value), None))
            continue
        accepted = current is None or (current == value and draw(st.booleans()))
        if current is None:
            registers[key] = value
        operations.append(Operation("c", call, ret, Complete(key, value), accepted))
    return draw(st.permutations(operations))


@settings(max_examples=300, deadline=None)
@given(linearizable_histories())
def test_search_accepts_every_linearizable_history(history: Sequence[Operation]) -> None:
    result = check(write_once_register, history)
    assert result.outcome == Outcome.OK, result


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", None]), min_size=1, max_size=12), st.sampled_from(["a", "b"]))
def test_search_sequential_reads_after_an_acknowledged_write(reads: list[str | None], written: str) -> None:
    """Sequentially, after an acknowledged write of `written`, every read must see it."""
    history = [Operation("w", 0, 1, Complete("k", written), True)]
    history += [Operation("r", 2 + 2 * i, 3 + 2 * i, Read("k"), seen) for i, seen in enumerate(reads)]
    expected = Outcome.OK if all(seen == written for seen in reads) else Outcome.VIOLATION
    assert check(write_once_register, history).outcome == expected


# -- the whole checker ---------------------------------------------------------------------------


def test_check_history_and_its_report(tmp_path: Path) -> None:
    """A history written with chaos.history, read back and checked: a clean one, then one with a
    result that changed."""
    times = iter(float(t) for t in range(1000))
    path = tmp_path / "history.jsonl"
    with HistoryWriter(path, clock=lambda: next(times)) as writer:
        writer.event("fault", {"kind": "kill", "node": "n1"})
        writer.record("p", "submit", {"run": "run1", "mailbox": "work", "key": "k1", "input": {}}).ok({"taskId": "t1", "created": True})
        item = {"id": "d1", "taskId": "t1", "input": {}, "leaseExpiresAt": 12_000, "leaseMs": LEASE_MS}
        writer.record("w1", "receive", {"run": "run1", "mailbox": "work", "worker": "w1", "leaseMs": LEASE_MS}).ok({"deliveries": [item]})
        writer.record("w1", "complete", {"delivery": "d1", "taskId": "t1", "result": {"v": 1}}).ok({"state": "SUCCEEDED"})
        read = writer.record("r", "read_task", {"taskId": "t1"})
        read.ok({"state": "SUCCEEDED", "outcome": {"v": 1}, "attempt": 1, "finishedBy": "w1"})
        writer.final("task", "t1", {"state": "SUCCEEDED", "outcome": {"v": 1}, "attempt": 1, "finishedBy": "w1"})
    report = check_history(read_history(path))
    assert report.ok, format_report(report)
    assert report.counts["operations"] == 4 and report.counts["faults"] == 1 and report.counts["registers"] == 1
    text = format_report(report)
    assert "no violations" in text and "8 linearizability" in text

    lines = path.read_text().splitlines()
    lines[-1] = lines[-1].replace('{"v":1}', '{"v":2}')
    path.write_text("\n".join(lines) + "\n")
    report = check_history(read_history(path))
    assert not report.ok
    assert {violation.check for violation in report.violations} == {"results"}
    text = format_report(report)
    assert "[results] t1" in text and "#4 r read_task" in text


def test_every_check_is_named_in_the_contract_order() -> None:
    assert [name for name, _ in checker.CHECKS] == [
        "results", "leases", "once", "groups", "barriers", "timers", "cancel", "linearizability", "replays",
        "capacity", "money", "events", "stale_reads",
    ]  # fmt: skip
    for _, function in checker.CHECKS:
        assert function.__doc__ and "unknown" in function.__doc__.lower(), function.__name__


# -- 12. events ---------------------------------------------------------------------------------


def event(seq: int, event_type: str, entity: str, run: str | None = "run1", **payload: Any) -> dict[str, Any]:
    """An event as a page records it (aggregate from the type: scope, task, group, barrier, timer)."""
    kind = event_type.split(".")[0]
    aggregate = {"delivery": "task"}.get(kind, kind)
    if aggregate == "task":
        state = {"created": "QUEUED"}.get(event_type.split(".")[1], event_type.split(".")[1].upper())
        payload = {"taskId": entity, "state": state, "attempt": 1, **payload}
    elif aggregate == "scope":
        payload = {"scopeId": entity, "parentId": None, **payload}
    return {"seq": seq, "eventId": f"evt_{seq}", "type": event_type, "aggregateType": aggregate, "aggregateId": entity,
            "scopeId": run, "payload": payload, "createdAt": 1_000 + seq}


def page(h: H, events: list[dict[str, Any]], cursor: int | None, call: float, *, next_cursor: int | None = None,
         client: str = "watcher-0", node: int = 0, op: str = "watch", status: str = "ok") -> H:
    last = events[-1]["seq"] if events else cursor
    result = {"events": events, "nextCursor": last if next_cursor is None else next_cursor}
    args = {"watcher": client, "cursor": cursor, "limit": 200, "resume": "next", "node": node}
    return h.op(op, args, call, call + 0.5, result, client=client, status=status)


def evented() -> H:
    """run1 created, t1 submitted, received, completed, run1 cancelled; a watcher reads events 1-3,
    loses a page on node 0 (a failover), resumes from cursor 3 on node 1; the final read is empty."""
    h = H().op("run_create", {"idem": "k1"}, 0, 1, {"run": "run1"})
    h.submit("t1", 1, 2).receive("t1", "d1", 2, 3, 10_000).complete("t1", "d1", {"v": 1}, 3, 4)
    h.op("cancel_run", {"run": "run1"}, 5, 6, {"storedState": "CANCELLED", "finishedAt": 2_000})
    log = [event(1, "scope.created", "run1"), event(2, "task.created", "t1"), event(3, "task.running", "t1"),
           event(4, "task.succeeded", "t1"), event(5, "scope.cancelled", "run1")]
    page(h, log[:3], None, 3.5)
    h.unknown("watch", {"watcher": "watcher-0", "cursor": 3, "limit": 200, "resume": "next", "node": 0}, 4.2,
              client="watcher-0")
    page(h, log[3:], 3, 7, node=1)
    page(h, [], 5, 8, client="final-events", op="events_read")
    return h


def test_events_pass_for_a_log_read_across_a_failover() -> None:
    h = evented()
    assert h.violations("events") == []
    parsed = parse_history(h.history_lines())
    checker.check_events(parsed)
    assert parsed.counts_extra["events_seen"] == 5 and parsed.counts_extra["event_failover_resumes"] == 1
    assert parsed.notes == []


def test_events_a_page_that_loses_or_repeats_events_or_names_a_wrong_cursor() -> None:
    lost = evented()
    page(lost, [event(5, "scope.cancelled", "run1")], 3, 9, client="watcher-1")  # event 4 skipped
    assert "where 4 comes next" in messages(lost.violations("events"))
    repeated = evented()
    page(repeated, [event(3, "task.running", "t1")], 3, 9, client="watcher-1")
    assert "where 4 comes next" in messages(repeated.violations("events"))
    cursor = evented()
    page(cursor, [event(4, "task.succeeded", "t1")], 3, 9, next_cursor=5, client="watcher-1")
    assert "names nextCursor 5" in messages(cursor.violations("events"))


def test_events_one_event_shown_two_ways() -> None:
    h = evented()
    page(h, [event(4, "task.failed", "t1")], 3, 9, client="watcher-1")
    assert "two pages show event 4 differently" in messages(h.violations("events"))


def test_events_an_event_of_something_that_did_not_happen() -> None:
    refused = H().op("run_create", {"idem": "k1"}, 0, 1, {"run": "run1"}).submit("t1", 1, 2)
    refused.receive("t1", "d1", 2, 3, 10_000).complete("t1", "d1", {"v": 1}, 3, 4, status="fail")
    page(refused, [event(1, "scope.created", "run1"), event(2, "task.created", "t1"), event(3, "task.running", "t1"),
                   event(4, "task.succeeded", "t1"), event(5, "scope.cancelled", "run1"),
                   event(6, "scope.created", "run9")], None, 5)
    found = messages(refused.violations("events"))
    assert "task.succeeded without a complete" in found
    assert "scope.cancelled without a cancel" in found
    assert "1 scope.created events of entities no answer named, but only 0" in found


def test_events_out_of_the_state_machine() -> None:
    h = H().op("run_create", {"idem": "k1"}, 0, 1, {"run": "run1"}).submit("t1", 1, 2)
    h.receive("t1", "d1", 2, 3, 10_000).complete("t1", "d1", {"v": 1}, 3, 4)
    h.op("timer_create", {"run": "run1", "afterMs": 1_000}, 1, 1.1, {"timerId": "tmr_1", "fireAt": 1_000, "state": "ARMED"})
    h.op("cancel_run", {"run": "run1"}, 5, 6, {"storedState": "CANCELLED", "finishedAt": 2_000})
    page(h, [event(1, "scope.created", "run1"), event(2, "task.created", "t1"), event(3, "task.succeeded", "t1"),
             event(4, "task.running", "t1"), event(5, "scope.cancelled", "run1"),
             {**event(6, "timer.fired", "tmr_1"), "aggregateType": "timer", "payload": {"timerId": "tmr_1"}}], None, 7)
    found = messages(h.violations("events"))
    assert "task.succeeded of a task that was QUEUED" in found
    assert "an event after the task finished" in found
    assert "timer.fired after its run stopped" in found


def test_events_unknown_operations_explain_events_and_need_none() -> None:
    h = H().op("run_create", {"idem": "k1"}, 0, 1, {"run": "run1"}).submit("t1", 1, 2)
    h.unknown("submit", {"run": "run1", "mailbox": "work", "key": "k2", "input": {}}, 2)  # made t2, unnamed
    h.receive("t1", "d1", 2, 3, 10_000)
    h.unknown("complete", {"delivery": "d1", "taskId": "t1", "result": {"v": 1}}, 3)  # it took effect
    h.unknown("cancel_run", {"run": "run1"}, 5)  # it did not
    h.unknown("run_create", {"idem": "k3"}, 6)  # it did not either
    page(h, [event(1, "scope.created", "run1"), event(2, "task.created", "t1"), event(3, "task.created", "t2"),
             event(4, "task.running", "t1"), event(5, "task.succeeded", "t1")], None, 7)
    assert h.violations("events") == []


def test_events_an_acknowledged_change_without_its_event_or_with_two() -> None:
    h = evented()
    h.submit("t2", 6.5, 6.6, key="k2")  # acknowledged, but no page shows task.created of t2
    assert "an acknowledged submit's task has no task.created event" in messages(h.violations("events"))
    twice = evented()
    page(twice, [event(6, "task.created", "t1")], 5, 9, client="watcher-1")
    found = messages(twice.violations("events"))
    assert "has 2 task.created events" in found


def test_events_a_change_acknowledged_after_the_last_read_to_the_end_is_a_note() -> None:
    """No final read (a run whose cluster did not recover): what was acknowledged after the last
    page that found the end of the log may be past what the pages saw; before it, it may not."""
    h = evented()
    h.submit("t2", 8.6, 8.7, key="k2")  # after the final read's call (8): its event may be past it
    parsed = parse_history(h.history_lines())
    assert checker.check_events(parsed) == []
    assert any("after the last read of the log to its end" in note for note in parsed.notes)
    earlier = evented()
    earlier.submit("t2", 7.5, 7.9, key="k2")  # acknowledged before the final read's call
    assert "an acknowledged submit's task has no task.created event" in messages(earlier.violations("events"))


def test_events_a_change_missing_from_a_log_not_seen_whole_is_a_note() -> None:
    h = H().op("run_create", {"idem": "k1"}, 0, 1, {"run": "run1"}).submit("t1", 1, 2)
    # Events 1 to 9 fell out of the bounded log before any page read them.
    page(h, [event(10, "task.created", "t1")], None, 3)
    page(h, [], 10, 5, client="final-events", op="events_read")
    h.fail("watch", {"watcher": "watcher-1", "cursor": 3, "limit": 200, "resume": "older", "node": 0}, 4, 4.1,
           "CURSOR_EXPIRED", client="watcher-1")
    parsed = parse_history(h.history_lines())
    assert checker.check_events(parsed) == []
    assert any("dropped from it" in note for note in parsed.notes)
    assert parsed.counts_extra["event_cursors_expired"] == 1


def test_events_in_an_order_the_history_contradicts() -> None:
    # run1's create was acknowledged before run2's was called, but run2's event comes first.
    h = H().op("run_create", {"idem": "k1"}, 0, 1, {"run": "run1"}).op("run_create", {"idem": "k2"}, 2, 3, {"run": "run2"})
    page(h, [event(1, "scope.created", "run2", run="run2"), event(2, "scope.created", "run1")], None, 4)
    found = h.violations("events")
    assert len(found) == 1 and "out of order" in found[0].message
    # Called concurrently: either order is fine.
    concurrent = H().op("run_create", {"idem": "k1"}, 0, 3, {"run": "run1"}).op("run_create", {"idem": "k2"}, 1, 2, {"run": "run2"})
    page(concurrent, [event(1, "scope.created", "run1"), event(2, "scope.created", "run2", run="run2")], None, 4)
    assert concurrent.violations("events") == []


def test_events_a_lease_lost_before_the_lease_ran_out() -> None:
    for lost_at, expected in ((12_500, 0), (11_000, 1)):  # the lease was acknowledged until 12000
        h = H().op("run_create", {"idem": "k1"}, 0, 1, {"run": "run1"}).submit("t1", 1, 2)
        h.receive("t1", "d1", 2, 3, 10_000).op("crash", {"delivery": "d1", "taskId": "t1", "reason": "crash"}, 3, 3)
        page(h, [event(1, "scope.created", "run1"), event(2, "task.created", "t1"), event(3, "task.running", "t1"),
                 {**event(4, "delivery.lease_lost", "t1"), "createdAt": lost_at}, event(5, "task.queued", "t1")], None, 7)
        found = h.violations("events")
        assert len(found) == expected and all("lease was acknowledged valid until 12000" in v.message for v in found), found


def resource_event(seq: int, event_type: str, run: str | None = "run1", **payload: Any) -> dict[str, Any]:
    """An event of a permit, an allowance or a budget (aggregate from the type; ids prm_1, alw_1, bdg_1)."""
    kind = event_type.split(".")[0]
    entity = {"permit": "prm_1", "allowance": "alw_1", "budget": "bdg_1"}[kind]
    return {"seq": seq, "eventId": f"evt_{seq}", "type": event_type, "aggregateType": kind, "aggregateId": entity,
            "scopeId": run, "payload": payload, "createdAt": 1_000 + seq}


def resourced() -> tuple[H, list[dict[str, Any]]]:
    """run1 and a run below it (a group's); a grant released, a consume, a reservation settled then
    voided, a second reservation and a grant ended by run1's cancel, which stops the run below too."""
    h = H().op("run_create", {"idem": "k1"}, 0, 1, {"run": "run1"})
    h.op("group_create", {"run": "run1"}, 1, 1.1, {"groupId": "grp_1", "scopeId": "run2"})
    grant(h, "g1", 2, 2.1, units=2)
    release(h, "g1", 2.2, 2.3)
    h.op("allowance_consume", {"allowance": "alw_1", "run": "run1", "units": 1}, 2.4, 2.5,
         {"consumptionId": "acn_1", "units": 1})
    h.op("budget_reserve", {"budget": "bdg_1", "run": "run1", "amountMinor": 40}, 2.6, 2.7,
         {"reservationId": "rsv_1", "reservedMinor": 40})
    h.op("budget_settle", {"budget": "bdg_1", "reservationId": "rsv_1", "amountMinor": 10, "workKey": "settle:0",
                           "allowOverrun": False}, 2.8, 2.9, {"chargedMinor": 10, "state": "ACTIVE"})
    h.op("budget_void", {"budget": "bdg_1", "reservationId": "rsv_1"}, 3.0, 3.1, {"state": "SETTLED"})
    h.op("budget_reserve", {"budget": "bdg_1", "run": "run1", "amountMinor": 5}, 3.2, 3.3,
         {"reservationId": "rsv_2", "reservedMinor": 5})
    grant(h, "g2", 3.4, 3.5)
    h.op("cancel_run", {"run": "run1"}, 4, 4.1, {"storedState": "CANCELLED", "finishedAt": 2_000})
    log = [
        event(1, "scope.created", "run1"), event(2, "scope.created", "run2", run="run2", parentId="run1"),
        resource_event(3, "permit.granted", permitId="prm_1", grantId="g1", units=2),
        resource_event(4, "permit.released", permitId="prm_1", grantId="g1", units=2, reason="released"),
        resource_event(5, "allowance.consumed", allowanceId="alw_1", consumptionId="acn_1", units=1, waiterId=None),
        resource_event(6, "budget.reserved", budgetId="bdg_1", reservationId="rsv_1", state="ACTIVE", amountMinor="40"),
        resource_event(7, "budget.settled", budgetId="bdg_1", reservationId="rsv_1", state="ACTIVE", workKey="settle:0",
                       chargedMinor="10"),
        resource_event(8, "budget.voided", budgetId="bdg_1", reservationId="rsv_1", state="SETTLED", reason="voided"),
        resource_event(9, "budget.reserved", budgetId="bdg_1", reservationId="rsv_2", state="ACTIVE", amountMinor="5"),
        resource_event(10, "permit.granted", permitId="prm_1", grantId="g2", units=1),
        event(11, "scope.cancelled", "run1", stoppedBy="run1"),
        event(12, "scope.cancelled", "run2", run="run2", parentId="run1", stoppedBy="run1"),
        resource_event(13, "permit.released", permitId="prm_1", grantId="g2", units=1, reason="scope_stopped"),
        resource_event(14, "budget.voided", budgetId="bdg_1", reservationId="rsv_2", state="VOIDED", reason="scope_stopped"),
    ]
    return h, log


def test_events_of_permits_allowances_budgets_and_a_stops_cascade_pass() -> None:
    h, log = resourced()
    page(h, log, None, 5)
    assert h.violations("events") == []


def test_events_of_resources_without_a_cause_or_out_of_their_order() -> None:
    h, log = resourced()
    log[3] = {**log[3], "payload": {**log[3]["payload"], "grantId": "g9"}}  # a release of a grant never released
    log += [
        resource_event(15, "permit.granted", permitId="prm_1", grantId="g1", units=2),  # g1 again, after its end
        resource_event(16, "allowance.cooldown", run=None, allowanceId="alw_1", cooldownUntilMs=9, reason=None),
        resource_event(17, "budget.settled", budgetId="bdg_1", reservationId="rsv_1", state="SETTLED", workKey="x"),
        event(18, "scope.cancelled", "run3", run="run3", stoppedBy="run1"),  # not below run1
    ]
    page(h, log, None, 5)
    found = messages(h.violations("events"))
    assert "permit.released (released) without a release of the grant" in found
    assert "the first event of grantId g9 is not permit.granted" in found
    assert "permit.granted again" in found and "an event after it ended" in found
    assert "allowance.cooldown although the workload" in found
    assert "budget.settled without a settle of the reservation under that workKey" in found
    assert "scope.cancelled by the stop of run run1, which is not a run above it" in found


def test_events_an_acknowledged_resource_change_or_a_run_below_a_cancel_without_its_event() -> None:
    h, log = resourced()
    kept = [item for item in log if item["seq"] not in (5, 7, 12)]  # the consume, the settle, run2's stop
    page(h, [{**item, "seq": index + 1, "eventId": f"evt_{index + 1}"} for index, item in enumerate(kept)], None, 5)
    page(h, [], len(kept), 6, client="final-events", op="events_read")
    found = messages(h.violations("events"))
    assert "an acknowledged consume has no allowance.consumed event" in found
    assert "an acknowledged settle has no budget.settled event" in found
    assert "run run2, below the cancelled run run1, has no stop event" in found
    twice, log = resourced()
    log.append(resource_event(15, "budget.reserved", budgetId="bdg_1", reservationId="rsv_2", state="ACTIVE", amountMinor="5"))
    page(twice, log, None, 5)
    assert "has 2 budget.reserved events" in messages(twice.violations("events"))


# -- 13. stale reads -----------------------------------------------------------------------------


def test_stale_reads_pass_for_reads_that_move_forward() -> None:
    history = completed_task().read_task("t1", 0.5, 0.8, "QUEUED").read_task("t1", 2.5, 3.5, "RUNNING")
    history.fail("read_task", {"taskId": "t2"}, 0, 0.2, "NOT_FOUND").submit("t2", 0.1, 0.3)
    assert history.violations("stale_reads") == []


def test_stale_reads_a_read_that_misses_an_acknowledged_write() -> None:
    missed_submit = H().submit("t1", 0, 1).fail("read_task", {"taskId": "t1"}, 2, 3, "NOT_FOUND")
    missed_complete = completed_task().read_task("t1", 3.5, 4, "RUNNING")
    missed_cancel = H().submit("t1", 0, 1).op("cancel_run", {"run": "run1"}, 2, 3, {"storedState": "CANCELLED", "finishedAt": 9})
    missed_cancel.read_task("t1", 4, 5, "QUEUED")
    missed_read = H().read_task("t1", 0, 1, "CANCELLED").read_task("t1", 2, 3, "QUEUED")
    for history, witness in ((missed_submit, "submit"), (missed_complete, "complete"), (missed_cancel, "cancel_run"),
                             (missed_read, "read_task")):
        found = history.violations("stale_reads")
        assert len(found) == 1, messages(found)
        assert [op.op for op in found[0].ops] == [witness, "read_task"]


def test_stale_reads_unknown_writes_and_a_stopped_runs_removal_are_no_floor() -> None:
    history = H().receive("t1", "d1", 1, 2, 10_000)
    history.unknown("complete", {"delivery": "d1", "taskId": "t1", "result": {"v": 1}}, 2)
    history.read_task("t1", 30, 31, "RUNNING")  # the complete may never have been applied
    removed = H().submit("t1", 0, 1).op("cancel_run", {"run": "run1"}, 2, 3, {"storedState": "CANCELLED", "finishedAt": 9})
    removed.fail("read_task", {"taskId": "t1"}, 100, 101, "NOT_FOUND")  # past the run's retention
    assert history.violations("stale_reads") == [] and removed.violations("stale_reads") == []
