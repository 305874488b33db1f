"""Task groups of the core against a model written from the spec's table, driven by hypothesis.

One group (a random condition, threshold, expectedMembers and deadline) under a parent run; random
submits, deliveries settled every way, accepts and rejects in any order and number (repeated ones,
ones right before or after a close, ones after the decision), closes, time passing with ticks, and
the parent's cancellation. After every step the core's answer, the group and every member must
agree with the model, and a finalized group must never change its outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from runstate_server.actors.state import RunState
from tests.test_actors_harness import MAILBOX, Harness, round_trip

KEYS = tuple(f"k{i}" for i in range(6))
DEADLINE_MS = 10_000
LEASE_MS = 3_600_000  # leases outlast the steps here: lapses are covered by the task model
RETENTION_MS = 10**9
FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")


@dataclass
class Member:
    task_id: str
    state: str = "QUEUED"
    verdict: str | None = None
    late: bool = False


class Rejection(Exception):
    def __init__(self, code: str) -> None:
        self.code = code


class GroupMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness()
        self.h.ensure()
        self.parent = self.h.create_run()
        self.members: dict[str, Member] = {}
        self.ready: list[str] = []  # member keys in delivery order
        self.deliveries: dict[str, str] = {}  # key -> delivery id not yet settled
        self.state = "OPEN"
        self.outcome: str | None = None
        self.reason: str | None = None
        self.parent_cancelled = False
        self.run_cancelled = False  # the group's decision cancelled its run itself
        self.first_decision: tuple[str | None, str | None] | None = None

    @initialize(
        condition=st.sampled_from(["FIRST_ACCEPTED", "N_ACCEPTED", "ALL_TERMINAL"]),
        threshold=st.integers(1, 4),
        expected=st.none() | st.integers(1, 6),
        with_deadline=st.booleans(),
        protocol=st.booleans(),
    )
    def create(self, condition: str, threshold: int, expected: int | None, with_deadline: bool, protocol: bool) -> None:
        self.condition = condition
        self.threshold = threshold if condition == "N_ACCEPTED" else None
        if expected is not None and self.threshold is not None:
            expected = max(expected, self.threshold)
        self.expected = expected
        self.deadline_ms = self.h.now_ms + DEADLINE_MS if with_deadline else None
        # The older route names the calling run and the mailbox by name; the protocol's (POST
        # /task-groups) only the parent, and the mailbox by id.
        named: dict[str, Any] = {"run_id": self.parent, "mailbox": MAILBOX}
        if protocol:
            named = {"mailbox_id": next(iter(self.h.state.spaces.values())).mailboxes[MAILBOX].id}
        created = self.h.ok(
            "group.create", parent_id=self.parent, condition=condition, threshold=self.threshold,
            expected_members=expected, deadline_ms=self.deadline_ms, retention_ms=RETENTION_MS, **named,
        )
        self.group_id, self.run_id = created["group_id"], created["run_id"]

    # -- the model -------------------------------------------------------------------------------

    def deadline_passed(self) -> bool:
        return self.deadline_ms is not None and self.h.now_ms >= self.deadline_ms

    def finalize(self, outcome: str, reason: str, *, by_parent: bool = False) -> None:
        self.state, self.outcome, self.reason = "FINALIZED", outcome, reason
        self.run_cancelled = not by_parent
        for member in self.members.values():
            if member.state not in FINISHED:
                member.state = "CANCELLED"
        self.ready.clear()

    def evaluate(self) -> None:
        """The spec's table."""
        if self.state == "FINALIZED":
            return
        if self.deadline_passed():
            self.finalize("FAILURE", "deadline")
            return
        members = list(self.members.values())
        accepted = sum(m.verdict == "ACCEPTED" for m in members)
        rejected = sum(m.verdict == "REJECTED" for m in members)
        possible = sum(m.state not in FINISHED or (m.state == "SUCCEEDED" and m.verdict is None) for m in members)
        closed = self.state == "SEALED"
        # A success is finished for the group once it has a verdict (spec: "every member has finished").
        all_finished = all(m.state in FINISHED and not (m.state == "SUCCEEDED" and m.verdict is None) for m in members)
        if self.condition == "FIRST_ACCEPTED" and accepted:
            self.finalize("SUCCESS", "first_accepted")
        elif self.condition == "N_ACCEPTED":
            assert self.threshold is not None
            if accepted >= self.threshold:
                self.finalize("SUCCESS", "threshold_reached")
            elif closed and accepted + possible < self.threshold:
                self.finalize("FAILURE", "threshold_unreachable")
        elif self.condition == "ALL_TERMINAL" and closed and all_finished:
            self.finalize("SUCCESS" if accepted and not rejected else "FAILURE", "all_terminal")

    def run_stopped(self) -> bool:
        return self.state == "FINALIZED" or self.parent_cancelled

    def execute(self, kind: str, args: dict[str, Any], model: Callable[[], Any]) -> Any:
        """Run the model, then the core; they must agree on success or on the error code."""
        try:
            expected = model()
        except Rejection as rejection:
            result = self.h.apply(kind, **args)
            assert result.get("error", {}).get("code") == rejection.code, (kind, args, result)
            return None
        result = self.h.apply(kind, **args)
        assert "error" not in result, (kind, args, result, expected)
        return result

    # -- rules -----------------------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS))
    def submit(self, key: str) -> None:
        def model() -> None:
            if key in self.members:
                return
            if self.reason == "cancelled":
                raise Rejection("SCOPE_CANCELLED")  # its run was stopped from outside: new work refused
            if self.state != "OPEN" or self.deadline_passed():
                raise Rejection("CONFLICT")
            self.members[key] = Member(task_id="")
            self.ready.append(key)
            if self.expected is not None and len(self.members) >= self.expected:
                self.state = "SEALED"
            self.evaluate()

        args = {"group_id": self.group_id, "key": key, "input": key, "input_hash": key}
        result = self.execute("group.submit", args, model)
        if result is not None:
            if self.members[key].task_id:
                assert result == {"task_id": self.members[key].task_id, "created": False, "group_state": self.state}
            self.members[key].task_id = result["task_id"]
            assert result["group_state"] == self.state  # as this submit left the group

    @rule()
    def receive(self) -> None:
        def model() -> str | None:
            if self.run_stopped():
                raise Rejection("SCOPE_CANCELLED")
            while self.ready:
                key = self.ready.pop(0)
                if self.members[key].state == "QUEUED":
                    self.members[key].state = "RUNNING"
                    return key
            return None

        args = {"run_id": self.run_id, "mailbox": MAILBOX, "max": 1, "lease_ms": LEASE_MS, "holder": "w"}
        result = self.execute("task.receive", args, model)
        if result is None:
            return
        delivered = [key for key, m in self.members.items() if m.task_id in result["task_ids"]]
        assert len(delivered) == len(result["task_ids"]) <= 1
        for key in delivered:
            assert self.members[key].state == "RUNNING"
            delivery_id = self.h.task(self.members[key].task_id).delivery_id
            assert delivery_id is not None
            self.deliveries[key] = delivery_id

    @precondition(lambda self: self.deliveries)
    @rule(data=st.data(), how=st.sampled_from(["complete", "complete", "reject", "release"]))
    def settle(self, data: st.DataObject, how: str) -> None:
        self.settle_one(data.draw(st.sampled_from(sorted(self.deliveries))), how)

    def settle_one(self, key: str, how: str) -> None:
        member = self.members[key]

        def model() -> None:
            if how == "complete":
                if self.run_stopped():
                    raise Rejection("SCOPE_CANCELLED")
                member.state = "SUCCEEDED"
            elif member.state == "CANCELLED":
                pass  # handed back after the stop: allowed, the task stays CANCELLED
            elif how == "reject":
                member.state = "FAILED"
            else:
                member.state = "QUEUED"
                self.ready.append(key)
            del self.deliveries[key]
            self.evaluate()

        args: dict[str, Any] = {"delivery_id": self.deliveries[key]}
        if how == "complete":
            args["payload"] = key
        self.execute(f"delivery.{how}", args, model)

    @rule()
    def work(self) -> None:
        """A worker takes the next member and completes it (the common path, in one step)."""
        self.receive()
        if self.deliveries:
            self.settle_one(sorted(self.deliveries)[0], "complete")

    @precondition(lambda self: self.members)
    @rule(data=st.data(), verdict=st.sampled_from(["accept", "accept", "reject"]), succeeded=st.booleans())
    def judge(self, data: st.DataObject, verdict: str, succeeded: bool) -> None:
        # Mostly a member that can take the verdict; else any member (refusals, repeats, late ones).
        keys = sorted(k for k, m in self.members.items() if m.state == "SUCCEEDED") if succeeded else []
        key = data.draw(st.sampled_from(keys or sorted(self.members)))
        member = self.members[key]
        wanted = "ACCEPTED" if verdict == "accept" else "REJECTED"

        def model() -> None:
            if member.verdict is not None:
                if member.verdict != wanted:
                    raise Rejection("CONFLICT")
                return
            if wanted == "ACCEPTED" and member.state != "SUCCEEDED":
                raise Rejection("CONFLICT")
            if wanted == "REJECTED" and member.state not in FINISHED:
                raise Rejection("CONFLICT")
            if self.state != "FINALIZED" and self.deadline_passed():
                self.finalize("FAILURE", "deadline")
            member.verdict = wanted
            member.late = self.state == "FINALIZED"
            self.evaluate()

        result = self.execute(f"group.{verdict}", {"group_id": self.group_id, "task_id": member.task_id}, model)
        if result is not None:
            assert (result["verdict"], result["late"]) == (member.verdict, member.late)
            assert (result["state"], result["outcome"], result["outcome_reason"]) == (
                self.state, self.outcome, self.reason
            )

    @rule()
    def close(self) -> None:
        def model() -> None:
            if self.state == "OPEN":
                self.state = "SEALED"
            self.evaluate()

        result = self.execute("group.close", {"group_id": self.group_id}, model)
        assert (result["state"], result["outcome"], result["outcome_reason"]) == (self.state, self.outcome, self.reason)

    @rule()
    def seal(self) -> None:
        """The protocol's deprecated close: the same, but CONFLICT once the group was decided."""

        def model() -> None:
            if self.state == "FINALIZED":
                raise Rejection("CONFLICT")
            self.state = "SEALED"
            self.evaluate()

        result = self.execute("group.seal", {"group_id": self.group_id}, model)
        if result is not None:
            assert (result["state"], result["outcome"], result["outcome_reason"]) == (self.state, self.outcome, self.reason)

    @rule(ms=st.sampled_from([0, 1_000, 2_000, 4_000]))
    def advance_and_tick(self, ms: int) -> None:
        self.h.advance(ms)

        def model() -> None:
            if self.state != "FINALIZED" and self.deadline_passed():
                self.finalize("FAILURE", "deadline")

        self.execute("tick", {"retention_ms": RETENTION_MS}, model)

    @precondition(lambda self: not self.parent_cancelled)
    @rule(roll=st.integers(0, 7))
    def cancel_parent(self, roll: int) -> None:
        if roll:
            return  # rarely: a cancelled parent ends every example early

        def model() -> None:
            self.parent_cancelled = True
            if self.state != "FINALIZED":
                self.finalize("FAILURE", "deadline" if self.deadline_passed() else "cancelled", by_parent=True)

        self.execute("run.cancel", {"run_id": self.parent, "retention_ms": RETENTION_MS}, model)

    # -- checks ----------------------------------------------------------------------------------

    @invariant()
    def group_agrees_with_the_model(self) -> None:
        group = self.h.state.groups[self.group_id]
        assert (group.state, group.outcome, group.outcome_reason) == (self.state, self.outcome, self.reason)
        assert group.members == [m.task_id for m in self.members.values()]
        for member in self.members.values():
            assert self.h.task(member.task_id).state == member.state, member
            assert group.verdicts.get(member.task_id) == member.verdict
            assert (member.task_id in group.late) == member.late
        run_state = self.h.run(self.run_id).stored_state
        assert run_state == (RunState.CANCELLED if self.run_cancelled else RunState.ACTIVE)

    @invariant()
    def decided_exactly_once(self) -> None:
        if self.state == "FINALIZED":
            if self.first_decision is None:
                self.first_decision = (self.outcome, self.reason)
            assert (self.outcome, self.reason) == self.first_decision

    @invariant()
    def survives_a_snapshot(self) -> None:
        assert round_trip(self.h.state).groups == self.h.state.groups


GroupMachine.TestCase.settings = settings(
    max_examples=400, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_groups_model = GroupMachine.TestCase
