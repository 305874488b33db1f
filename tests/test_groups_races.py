"""Task groups under real races, against a real dev node, checked against a model of the spec's table.

A hypothesis state machine drives one group per example (a random condition, threshold and
expectedMembers, under a parent run). Sequential rules submit members and let a worker take or
finish them; the `burst` rule fires up to six calls at the same time from threads: accepts and
rejects of any member (repeats and late ones included), closes, submits of new or existing keys
(racing `expectedMembers`), completes and failures of held deliveries (racing the close and the
last accept), and the parent run's cancellation. The node serializes them in some order; the check
is linearizability: some order of the burst, applied to the model one call at a time, must give
every answer the node gave (each verdict's `late`, `groupState`, outcome and reason, each close's
decision, each refusal's code) and end in the state the node shows, members and late flags
included. The group must decide exactly once and never change its decision.
"""

from __future__ import annotations

import copy
import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from chaos.checker import GroupMember, group_decision
from tests._http import Api, new_space, recv, settle
from tests._nodes import DevNode

MAILBOX = "reviews"
KEYS = tuple(f"k{i}" for i in range(6))
BURST_MAX = 6
LEASE_MS = 600_000  # leases outlast an example: lapses are the task model's business
FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED")
# What a burst is made of, weighted by repetition; cancel_parent is rare (it ends the example's story).
BURST_KINDS = (
    *("accept",) * 8, *("reject",) * 4, *("close",) * 3, *("submit",) * 3, *("complete",) * 3, *("fail",) * 2,
    "cancel_parent",
)


class Refused(Exception):
    def __init__(self, code: str) -> None:
        self.code = code


@dataclass
class Model:
    """One group as the spec's table decides it (no deadline: time is the core model's business)."""

    condition: str
    threshold: int | None
    expected: int | None
    state: str = "OPEN"
    outcome: str | None = None
    reason: str | None = None
    parent_cancelled: bool = False
    members: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> state, verdict, late
    queue: list[str] = field(default_factory=list)  # QUEUED members, in delivery order

    def run_stopped(self) -> bool:
        return self.state == "FINALIZED" or self.parent_cancelled

    def finalize(self, outcome: str, reason: str) -> None:
        self.state, self.outcome, self.reason = "FINALIZED", outcome, reason
        for member in self.members.values():
            if member["state"] not in FINISHED:
                member["state"] = "CANCELLED"
        self.queue.clear()

    def evaluate(self) -> None:
        """The spec's table, as the chaos checker restates it (not the server's code)."""
        if self.state == "FINALIZED":
            return
        members = [GroupMember(m["state"], m["verdict"]) for m in self.members.values()]
        decided = group_decision(self.condition, self.threshold, self.state == "SEALED", members)
        if decided is not None:
            self.finalize(*decided)

    def decision(self) -> tuple[str, str | None, str | None]:
        return self.state, self.outcome, self.reason

    # -- calls: each returns the answer the node must give, or raises Refused --------------------

    def submit(self, key: str) -> tuple[Any, ...]:
        if key in self.members:
            return (False, self.state)
        if self.reason == "cancelled":
            raise Refused("SCOPE_CANCELLED")
        if self.state != "OPEN":
            raise Refused("CONFLICT")
        self.members[key] = {"state": "QUEUED", "verdict": None, "late": False}
        self.queue.append(key)
        if self.expected is not None and len(self.members) >= self.expected:
            self.state = "SEALED"
        self.evaluate()
        return (True, self.state)

    def judge(self, key: str, wanted: str) -> tuple[Any, ...]:
        member = self.members[key]
        if member["verdict"] is not None:
            if member["verdict"] != wanted:
                raise Refused("CONFLICT")
        elif member["state"] != "SUCCEEDED" if wanted == "ACCEPTED" else member["state"] not in FINISHED:
            raise Refused("CONFLICT")  # accepting needs SUCCEEDED, rejecting a finished member
        else:
            member["verdict"], member["late"] = wanted, self.state == "FINALIZED"
            self.evaluate()
        return (member["verdict"], member["late"], *self.decision())

    def close(self) -> tuple[Any, ...]:
        if self.state == "OPEN":
            self.state = "SEALED"
        self.evaluate()
        return self.decision()

    def finish(self, key: str, how: str) -> tuple[Any, ...]:
        member = self.members[key]
        assert member["state"] in ("RUNNING", "CANCELLED"), member
        if how == "complete":
            if self.run_stopped():
                raise Refused("SCOPE_CANCELLED")
            member["state"] = "SUCCEEDED"
        elif member["state"] == "RUNNING":
            member["state"] = "FAILED"
        self.evaluate()
        return ()

    def cancel_parent(self) -> tuple[Any, ...]:
        self.parent_cancelled = True
        if self.state != "FINALIZED":
            self.finalize("FAILURE", "cancelled")
        return ()


class GroupRaces(RuleBasedStateMachine):
    url: str = ""

    def __init__(self) -> None:
        super().__init__()
        self.api = Api(self.url, space=new_space(self.url, "races"))
        self.mailbox_id = self.api.ok("POST", "/v1/mailboxes", {"name": MAILBOX, "mode": "WORK"})["id"]
        self.parent = self.api.ok("POST", "/v1/scopes", {})["id"]
        self.task_ids: dict[str, str] = {}  # member key -> task id
        self.held: dict[str, dict[str, Any]] = {}  # member key -> the delivery not settled yet
        self.decided: tuple[str | None, str | None] | None = None
        self.pool = ThreadPoolExecutor(BURST_MAX)

    def teardown(self) -> None:
        self.pool.shutdown()

    @initialize(
        condition=st.sampled_from(["FIRST_ACCEPTED", "N_ACCEPTED", "ALL_TERMINAL"]),
        threshold=st.integers(1, 3),
        expected=st.none() | st.integers(1, 5),
        members=st.integers(0, 5),
        settled=st.lists(st.sampled_from(["complete", "complete", "complete", "fail", "hold"]), max_size=5),
    )
    def create(self, condition: str, threshold: int, expected: int | None, members: int, settled: list[str]) -> None:
        model_threshold = threshold if condition == "N_ACCEPTED" else None
        if expected is not None and model_threshold is not None:
            expected = max(expected, model_threshold)
        body: dict[str, Any] = {
            "mailboxId": self.mailbox_id, "condition": condition, "scopeId": self.parent, "parentScopeId": self.parent,
        }
        body.update({k: v for k, v in (("threshold", model_threshold), ("expectedMembers", expected)) if v is not None})
        group = self.api.ok("POST", "/v1/task-groups", body)
        self.group, self.run_id = group["id"], group["scopeId"]
        self.model = Model(condition, model_threshold, expected)
        # Start from members that workers already settled, so bursts meet verdicts soon.
        for key in KEYS[:members]:
            self.submit(key)
        for how in settled:
            self.work(how)

    # -- sequential rules ------------------------------------------------------------------------

    @rule(key=st.sampled_from(KEYS))
    def submit(self, key: str) -> None:
        self.burst_of([("submit", key)])

    @rule(hows=st.lists(st.sampled_from(["hold", "complete", "complete", "complete", "fail"]), min_size=1, max_size=3))
    def work_some(self, hows: list[str]) -> None:
        for how in hows:
            self.work(how)

    def work(self, how: str) -> None:
        """A worker takes the next member: keeps it (to finish in a burst) or finishes it now.
        (No preconditions and no draws that depend on the node's answers: hypothesis needs the
        same draws to give the same steps.)"""
        if not self.model.queue:
            return
        (delivery,) = recv(self.api, self.run_id, MAILBOX, leaseMs=LEASE_MS)
        key = self.model.queue.pop(0)
        assert delivery["taskId"] == self.task_ids[key], "members are delivered in submit order"
        self.model.members[key]["state"] = "RUNNING"
        self.held[key] = delivery
        if how != "hold":
            self.burst_of([(how, key)])

    # -- the races -------------------------------------------------------------------------------

    @rule(calls=st.lists(st.tuples(st.sampled_from(BURST_KINDS), st.sampled_from(KEYS)), min_size=2, max_size=BURST_MAX))
    def burst(self, calls: list[tuple[str, str]]) -> None:
        """Calls at the same time; those that name a member that is not there (or a delivery not
        held, or held by another call of the burst) are left out."""
        chosen: list[tuple[str, str]] = []
        for kind, key in calls:
            if kind in ("accept", "reject"):
                # Mostly a member that can take the verdict (repeats and late ones included).
                wanted = ("SUCCEEDED",) if kind == "accept" else FINISHED
                able = [k for k, m in self.model.members.items() if m["state"] in wanted] or list(self.model.members)
                if not able:
                    continue
                key = able[KEYS.index(key) % len(able)]
            if kind in ("complete", "fail") and (key not in self.held or any(key == k for _, k in chosen)):
                continue
            chosen.append((kind, "" if kind in ("close", "cancel_parent") else key))
        if chosen:
            self.burst_of(chosen)

    def call(self, kind: str, key: str) -> tuple[int, Any]:
        if kind == "submit":
            return self.api("POST", f"/v1/task-groups/{self.group}/tasks", {"input": {"draft": key}, "taskKey": key})
        if kind in ("accept", "reject"):
            return self.api("POST", f"/v1/task-groups/{self.group}/tasks/{self.task_ids[key]}/{kind}")
        if kind == "close":
            return self.api("POST", f"/v1/task-groups/{self.group}/close")
        if kind == "complete":
            return settle(self.api, self.held[key], "complete", {"result": {"payload": key}})
        if kind == "fail":
            return settle(self.api, self.held[key], "reject", {"error": "bad draft"})
        assert kind == "cancel_parent"
        return self.api("POST", f"/v1/scopes/{self.parent}/cancel")

    @staticmethod
    def observed(kind: str, status: int, answer: Any) -> tuple[Any, ...]:
        """What of the node's answer the model predicts."""
        if status >= 400:
            assert status == 409, (kind, status, answer)  # never a 400 or a 500 here
            return ("refused", answer["error"]["code"])
        if kind == "submit":
            return (answer["created"], answer["groupState"])
        if kind in ("accept", "reject"):
            return (answer["verdict"], answer["late"], answer["groupState"], answer["outcome"], answer["outcomeReason"])
        if kind == "close":
            return (answer["state"], answer["outcome"], answer["outcomeReason"])
        return ()

    @staticmethod
    def predicted(model: Model, kind: str, key: str) -> tuple[Any, ...]:
        try:
            if kind == "submit":
                return model.submit(key)
            if kind in ("accept", "reject"):
                return model.judge(key, "ACCEPTED" if kind == "accept" else "REJECTED")
            if kind == "close":
                return model.close()
            if kind in ("complete", "fail"):
                return model.finish(key, kind)
            return model.cancel_parent()
        except Refused as refused:
            return ("refused", refused.code)

    def burst_of(self, calls: list[tuple[str, str]]) -> None:
        answers = list(self.pool.map(lambda call: self.call(*call), calls))
        for (kind, key), (status, answer) in zip(calls, answers, strict=True):
            if kind == "submit" and status < 300:
                assert self.task_ids.setdefault(key, answer["id"]) == answer["id"]
        observed = [self.observed(kind, *answer) for (kind, _), answer in zip(calls, answers, strict=True)]
        final = self.node_view()
        for order in itertools.permutations(range(len(calls))):
            model = copy.deepcopy(self.model)
            if all(self.predicted(model, *calls[i]) == observed[i] for i in order) and self.view_of(model) == final:
                self.model = model
                break
        else:
            raise AssertionError(f"no order of {calls} gives the answers {observed} and the state {final} from {self.model}")
        for kind, key in calls:
            if kind in ("complete", "fail"):
                del self.held[key]  # settled, or refused for good (its run stopped)

    def node_view(self) -> dict[str, Any]:
        view = self.api.ok("GET", f"/v1/task-groups/{self.group}")
        assert [m["taskId"] for m in view["members"]] == [self.task_ids[m["key"]] for m in view["members"]]
        members = {m["key"]: {"state": m["state"], "verdict": m["verdict"], "late": m["late"]} for m in view["members"]}
        return {"decision": (view["state"], view["outcome"], view["outcomeReason"]), "members": members,
                "order": [m["key"] for m in view["members"]]}

    @staticmethod
    def view_of(model: Model) -> dict[str, Any]:
        return {"decision": model.decision(), "members": model.members, "order": list(model.members)}

    # -- checks ----------------------------------------------------------------------------------

    @invariant()
    def decided_exactly_once(self) -> None:
        if self.model.state == "FINALIZED":
            if self.decided is None:
                self.decided = (self.model.outcome, self.model.reason)
            assert (self.model.outcome, self.model.reason) == self.decided
            run = self.api.ok("GET", f"/v1/scopes/{self.run_id}")
            assert run["effective"] == "INACTIVE"  # finalizing stopped the group's run


def test_group_rules_under_concurrent_calls_are_linearizable(dev_node: DevNode) -> None:
    GroupRaces.url = dev_node.url
    run_state_machine_as_test(
        GroupRaces,
        settings=settings(
            max_examples=100, stateful_step_count=10, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
