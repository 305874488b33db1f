"""The faults: a registry by kind, a seeded schedule, and the injector that runs it against a cluster.

    schedule = Schedule(seed=7, duration_s=60, kinds=["kill", "pause", "partition", "restart"])
    injector = Injector(cluster, schedule, history.event_line).start()
    ...                                     # the workload runs meanwhile
    injector.join()                         # or stop() first to end early (the current fault heals)
    injector.summary()

The same seed, duration and kinds give the same schedule (offsets, kinds, target roles, holds and
which follower). Which node plays "leader" is only known when the fault starts, so the injector
resolves roles then. The kinds are drawn from the chosen ones in registry order, so a kind added
to the registry changes the schedules that include it (the default, every kind) and no other.
Around each fault it records, through the callback, event lines of the history
(`{"event": ..., "at": time.monotonic(), "detail": {...}}`):

    health (phase "before": ok, leader) -> fault (kind, nodes, role) -> [hold] -> heal
    -> health (phase "after": ok, leader, unavailableS: from the fault until healthy again)

A cluster that does not come back within HEALTH_TIMEOUT_S is recorded (`ok` false) and the run
goes on; one that is not healthy before a fault skips that fault.

Membership faults change the nodes (ChaosCluster's slots): `replace` puts a fresh node (n4, n5,
...) in a removed follower's slot, `grow` adds two slots and drops them at its heal; the cluster
tells its watchers (the workload) the new URLs. Their heal waits until every member lists the
slots' nodes as voters; one that does not within JOIN_TIMEOUT_S is an outcome in the fault's
detail (`outcome`, `shrink`: summary()'s `replaces` and `grows`), not a harness error.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos.cluster import (
    JOIN_TIMEOUT_S,
    KILL_TIMEOUT_S,
    NODES,
    NODES_MAX,
    REMOVE_CALL_TIMEOUT_S,
    REMOVE_TIMEOUT_S,
    STOP_TIMEOUT_S,
    TRANSFER_CALL_TIMEOUT_S,
    ChaosCluster,
    ClusterError,
    error_code,
)

LEADER = "leader"
FOLLOWER = "follower"
ALL = "all"
LEADER_TO_FOLLOWER = "leader->follower"  # the leader, then the pick-th follower (a transfer's target)
NEW_NODES = "new"  # no node of the cluster: the fault adds its own (a grow)

# The schedule. Each fault: a hold drawn from its kind's range, then RECOVERY_S_PLANNED for the
# cluster to come back, then a quiet gap (the workload runs undisturbed) before the next one.
FIRST_FAULT_S_MIN = 1.0
FIRST_FAULT_S_MAX = 3.0
RECOVERY_S_PLANNED = 3.0
GAP_S_MIN = 1.0
GAP_S_MAX = 3.0
FAULTS_MAX = 1_000  # per schedule, whatever the duration
DURATION_S_MAX = 24 * 3600.0
# The injector's bounded waits.
HEALTH_TIMEOUT_S = 30.0  # before a fault, and from its heal until the cluster is healthy again
HOLD_S_MAX = 5.0  # the longest hold of any kind (checked against the registry below)
# A replaced node's newcomer that exits on its own (its join refused) is started again, this often.
JOIN_RESTARTS_MAX = 2
# Membership faults, every bound reached: a replace's kill, removal and join; a grow's joins (one
# per node added) in the injection, and in the heal, per node it added, a leadership transfer (if
# it leads), its removal and its kill, then the members' agreement.
GROW_NODES = NODES_MAX - NODES
REMOVE_S_MAX = REMOVE_TIMEOUT_S + REMOVE_CALL_TIMEOUT_S
INJECT_MEMBERSHIP_S_MAX = max(KILL_TIMEOUT_S + REMOVE_S_MAX, GROW_NODES * JOIN_TIMEOUT_S)
HEAL_MEMBERSHIP_S_MAX = (
    GROW_NODES * (TRANSFER_CALL_TIMEOUT_S + REMOVE_S_MAX + KILL_TIMEOUT_S) + JOIN_TIMEOUT_S
)
# The longest one fault can take, every bound reached: health before, the injection (a graceful
# stop that ends in a kill, or a membership change), the hold, the heal, health after; plus slack
# for the HTTP probes.
FAULT_S_MAX = (
    2 * HEALTH_TIMEOUT_S + max(STOP_TIMEOUT_S + KILL_TIMEOUT_S, INJECT_MEMBERSHIP_S_MAX) + HOLD_S_MAX
    + HEAL_MEMBERSHIP_S_MAX + 10.0
)
OFFSET_DIGITS = 3  # schedule times are rounded to milliseconds, so they print and replay exactly
PROBLEM_CHARS_MAX = 2000  # of a failed membership change's last ClusterError, in its detail

EventRecorder = Callable[[dict[str, Any]], None]
Detail = dict[str, Any]


# -- the registry ----------------------------------------------------------------------------------


def _kill(cluster: ChaosCluster, nodes: Sequence[int]) -> dict[str, Any] | None:
    for node in nodes:
        cluster.kill(node)
    return None


def _start_stopped(cluster: ChaosCluster, nodes: Sequence[int], detail: Detail | None = None) -> None:
    down = [node for node in nodes if not cluster.running(node)]
    if down:
        cluster.start(*down)


def _pause(cluster: ChaosCluster, nodes: Sequence[int]) -> dict[str, Any] | None:
    for node in nodes:
        cluster.pause(node)
    return None


def _resume(cluster: ChaosCluster, nodes: Sequence[int], detail: Detail | None) -> None:
    for node in nodes:
        cluster.resume(node)


def _isolate(cluster: ChaosCluster, nodes: Sequence[int]) -> dict[str, Any] | None:
    for node in nodes:
        cluster.partition(node)
    return None


def _heal_partitions(cluster: ChaosCluster, nodes: Sequence[int], detail: Detail | None) -> None:
    cluster.heal()


def _transfer(cluster: ChaosCluster, nodes: Sequence[int]) -> dict[str, Any]:
    """POST /v1/cluster/transfer-leader to hand the leader's (nodes[0]) leadership to nodes[1],
    asked through the third node's API (a bystander, which forwards it to the leader); the status,
    the answer (a refusal, such as 409 when the target was behind for 5 s, is an outcome, not a
    harness error) and how long the call took. ClusterError when nothing answered."""
    leader, to = nodes
    asked = next(node for node in range(cluster.size) if node not in nodes)
    began = time.monotonic()
    answer = cluster.transfer_leader(asked, to)
    took_s = round(time.monotonic() - began, OFFSET_DIGITS)
    if answer is None:
        raise ClusterError(
            f"POST /v1/cluster/transfer-leader to {cluster.ids[asked]} got no answer within {took_s} s"
        )
    status, body = answer
    return {"to": cluster.ids[to], "askedThrough": cluster.ids[asked], "status": status, "answer": body,
            "transferS": took_s}


def _heal_nothing(cluster: ChaosCluster, nodes: Sequence[int], detail: Detail | None) -> None:
    """A transfer leaves nothing to undo: the new leader leads on."""


def _stop_gracefully(cluster: ChaosCluster, nodes: Sequence[int]) -> dict[str, Any]:
    """SIGTERM; the exit codes (-9: it did not stop within STOP_TIMEOUT_S and was killed) and how
    long the stop took."""
    began = time.monotonic()
    if len(nodes) == cluster.size:
        codes = cluster.stop_all()  # all at once, not one after the other
    else:
        codes = [cluster.stop(node) for node in nodes]
    return {
        "exitCodes": {cluster.ids[node]: code for node, code in zip(nodes, codes, strict=True)},
        "stopS": round(time.monotonic() - began, OFFSET_DIGITS),
    }


def _removal(removal: Detail) -> Detail:
    """A remove_member() outcome for the report: the answer's error code instead of its body."""
    return {"status": removal["status"], "code": error_code(removal["answer"]),
            "calls": removal["calls"], "removeS": removal["removeS"]}


def _replace(cluster: ChaosCluster, nodes: Sequence[int]) -> Detail:
    """kill -9 the follower nodes[0]; remove it from the configuration (DELETE
    /v1/cluster/members/{id} through the other members, asked again while a moment may cure the
    refusal); then start a fresh node in its slot (a new id, new ports, an empty data dir) with
    --join the running members' APIs. Its detail names both and how the removal was answered;
    `outcome` "not-removed" when the removal was not confirmed (the old node is started again at
    the heal). The heal waits for the newcomer to be a voter."""
    index = nodes[0]
    old_id = cluster.ids[index]
    cluster.kill(index)
    removal = cluster.remove_member(old_id, [other for other in range(cluster.size) if other != index])
    detail: Detail = {"removed": old_id, "removal": _removal(removal)}
    if not removal["removed"]:
        return {**detail, "outcome": "not-removed"}
    cluster.join(index)
    return {**detail, "added": cluster.ids[index]}


def _await_voter(cluster: ChaosCluster, nodes: Sequence[int], detail: Detail | None) -> Detail:
    """A replace's heal: until every member lists the newcomer as a voter and the old node nowhere
    (bounded by JOIN_TIMEOUT_S; a newcomer that exits on its own, its join refused, is started
    again up to JOIN_RESTARTS_MAX times). `outcome`: "voter", or "not-voter" with the problem. A
    replace whose removal failed starts the old node again instead ("not-removed")."""
    index = nodes[0]
    if detail is None or "added" not in detail:  # the removal failed, or the injection did not end
        _start_stopped(cluster, nodes)
        return {"outcome": (detail or {}).get("outcome", "error")}
    began = time.monotonic()
    deadline = began + JOIN_TIMEOUT_S
    restarts = 0
    while True:
        try:
            cluster.wait_members(max(0.0, deadline - time.monotonic()))
            return {"outcome": "voter", "voterS": round(time.monotonic() - began, OFFSET_DIGITS), "joinRestarts": restarts}
        except ClusterError as error:
            newcomer_exited = list(cluster.exited()) == [cluster.ids[index]]
            if newcomer_exited and restarts < JOIN_RESTARTS_MAX and time.monotonic() < deadline:
                restarts += 1
                cluster.kill(index)  # reaped, and no longer expected to run
                cluster.start(index)
                continue
            if newcomer_exited:
                cluster.kill(index)  # so the health checks that follow count it as down, not failed
            return {"outcome": "not-voter", "problem": str(error)[:PROBLEM_CHARS_MAX], "joinRestarts": restarts}


def _grow(cluster: ChaosCluster, nodes: Sequence[int]) -> Detail:
    """Add GROW_NODES fresh nodes with --join, one at a time, each waited for until every member
    lists it as a voter. `outcome` "voters", "not-voter" (with the problem: the heal removes what
    was added) or "not-grown" when the cluster had more than NODES nodes already."""
    if cluster.size != NODES:
        return {"outcome": "not-grown", "problem": f"the cluster has {cluster.size} nodes, not {NODES}"}
    added: list[str] = []
    voter_s: list[float] = []
    for _ in range(GROW_NODES):
        index = cluster.join()
        added.append(cluster.ids[index])
        try:
            voter_s.append(cluster.wait_members(JOIN_TIMEOUT_S))
        except ClusterError as error:
            return {"added": added, "voterS": voter_s, "outcome": "not-voter", "problem": str(error)[:PROBLEM_CHARS_MAX]}
    return {"added": added, "voterS": voter_s, "outcome": "voters"}


def _shrink(cluster: ChaosCluster, nodes: Sequence[int], detail: Detail | None) -> Detail:
    """A grow's heal: each node it added, the last first, is removed from the configuration
    (after handing its leadership to a first member if it leads) and killed; then the members must
    agree again. A node whose removal was not confirmed stays (`shrink` "not-removed")."""
    removed: list[str] = []
    kept: list[str] = []
    for index in reversed(range(NODES, cluster.size)):
        node_id = cluster.ids[index]
        firsts = [other for other in range(NODES) if other in cluster.live()]
        if cluster.running(index) and firsts and cluster.agreed_leader(cluster.live()) == index:
            cluster.transfer_leader(firsts[0], firsts[0])
        removal = cluster.remove_member(node_id, firsts or [0])
        if not removal["removed"] and cluster.running(index):
            kept.append(node_id)
            break
        cluster.drop(index)
        removed.append(node_id)
    outcome: Detail = {"dropped": removed, "kept": kept}
    if kept:
        return {**outcome, "shrink": "not-removed"}
    try:
        cluster.wait_members(JOIN_TIMEOUT_S)
    except ClusterError as error:
        return {**outcome, "shrink": "members-disagree", "problem": str(error)[:PROBLEM_CHARS_MAX]}
    return {**outcome, "shrink": "removed"}


@dataclass(frozen=True)
class FaultKind:
    """One kind of fault: the roles it may target, its hold range, and how to inject and heal it."""

    name: str
    roles: tuple[str, ...]
    hold_s_min: float
    hold_s_max: float
    inject: Callable[[ChaosCluster, Sequence[int]], Detail | None]  # returns details for the report
    heal: Callable[[ChaosCluster, Sequence[int], Detail | None], Detail | None]  # gets them; may add some
    description: str


REGISTRY: dict[str, FaultKind] = {
    kind.name: kind
    for kind in (
        FaultKind("kill", (LEADER, FOLLOWER), 1.0, 4.0, _kill, _start_stopped,
                  "kill -9 the leader or a follower; restart it on its data after the hold"),
        FaultKind("pause", (LEADER, FOLLOWER), 1.0, 4.0, _pause, _resume,
                  "SIGSTOP the leader or a follower; SIGCONT after the hold"),
        FaultKind("partition", (LEADER, FOLLOWER), 2.0, 5.0, _isolate, _heal_partitions,
                  "cut every Raft pair of the leader or a follower; reconnect after the hold"),
        FaultKind("restart", (LEADER, FOLLOWER, ALL), 0.0, 1.0, _stop_gracefully, _start_stopped,
                  "SIGTERM one node or all three, start them again after the hold (their downtime)"),
        # Last: a kind's place in the registry decides the draws of every schedule that has it.
        FaultKind("transfer", (LEADER_TO_FOLLOWER,), 0.0, 1.0, _transfer, _heal_nothing,
                  "ask (through the third node) for the leader's leadership to go to a follower; "
                  "nothing to heal"),
        FaultKind("replace", (FOLLOWER,), 0.0, 1.0, _replace, _await_voter,
                  "kill -9 a follower, remove it, start a fresh node at new ports with --join; healed "
                  "once every member lists it as a voter"),
        FaultKind("grow", (NEW_NODES,), 1.0, 4.0, _grow, _shrink,
                  "add a fourth and a fifth voter with --join, one at a time; remove them after the hold"),
    )
}


assert all(kind.hold_s_max <= HOLD_S_MAX for kind in REGISTRY.values())
# An injection that waits on a node (a transfer call) must fit in what a graceful stop may take.
assert TRANSFER_CALL_TIMEOUT_S <= STOP_TIMEOUT_S + KILL_TIMEOUT_S


def parse_kinds(text: str) -> list[str]:
    """'kill,pause' as a list of known kinds (registry order, no repeats); ValueError otherwise."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in REGISTRY]
    if unknown or not names:
        raise ValueError(f"faults are some of {', '.join(REGISTRY)}; got {text!r}")
    return [name for name in REGISTRY if name in names]


# -- the schedule ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlannedFault:
    """One fault of a schedule: when (seconds after the injector starts), what, on whom, how long."""

    at_s: float
    kind: str
    role: str  # leader | follower | all | leader->follower
    hold_s: float
    pick: int  # which follower (the pick-th of the followers in node order, modulo their number)


class Schedule:
    """A deterministic list of faults drawn from random.Random(seed) within duration_s."""

    def __init__(self, seed: int, duration_s: float, kinds: Iterable[str]) -> None:
        chosen = set(kinds)
        unknown = sorted(chosen - set(REGISTRY))
        if unknown or not chosen:
            raise ValueError(f"faults are some of {', '.join(REGISTRY)}; got {sorted(chosen)}")
        if not 0 < duration_s <= DURATION_S_MAX:
            raise ValueError(f"duration_s must be in (0, {DURATION_S_MAX}], got {duration_s}")
        self.seed = seed
        self.duration_s = float(duration_s)
        # Registry order, whatever order they were given in: the same set gives the same schedule.
        self.kinds = [name for name in REGISTRY if name in chosen]
        self.faults = self._draw()

    def _draw(self) -> tuple[PlannedFault, ...]:
        rng = random.Random(self.seed)
        faults: list[PlannedFault] = []
        at_s = rng.uniform(FIRST_FAULT_S_MIN, FIRST_FAULT_S_MAX)
        while len(faults) < FAULTS_MAX:
            kind = REGISTRY[rng.choice(self.kinds)]
            role = rng.choice(kind.roles)
            hold_s = round(rng.uniform(kind.hold_s_min, kind.hold_s_max), OFFSET_DIGITS)
            pick = rng.randrange(NODES)
            gap_s = rng.uniform(GAP_S_MIN, GAP_S_MAX)
            if at_s + hold_s + RECOVERY_S_PLANNED > self.duration_s:
                break
            faults.append(PlannedFault(round(at_s, OFFSET_DIGITS), kind.name, role, hold_s, pick))
            at_s += hold_s + RECOVERY_S_PLANNED + gap_s
        return tuple(faults)

    def __len__(self) -> int:
        return len(self.faults)

    def __repr__(self) -> str:
        return f"<Schedule seed={self.seed} duration_s={self.duration_s} kinds={self.kinds} faults={len(self.faults)}>"

    def as_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed, "durationS": self.duration_s, "kinds": self.kinds,
            "faults": [asdict(fault) for fault in self.faults],
        }


# -- the injector ----------------------------------------------------------------------------------


@dataclass
class FaultResult:
    """What became of one planned fault. Times are time.monotonic()."""

    seq: int
    kind: str
    role: str
    planned_at_s: float
    hold_s: float
    nodes: list[str] = field(default_factory=list)  # the node ids it hit
    leader_before: str | None = None
    at: float | None = None  # injected
    healed_at: float | None = None
    healthy_at: float | None = None  # healthy again after the heal (None: not within HEALTH_TIMEOUT_S)
    gave_up_at: float | None = None  # when the wait for health after the heal gave up
    leader_after: str | None = None
    skipped: str | None = None  # "unhealthy" (before it) | "late" (past the duration) | "stopped"
    error: str | None = None
    detail: dict[str, Any] | None = None  # what the injection reported (a restart's exit codes)

    @property
    def survived(self) -> bool:
        return self.skipped is None and self.healthy_at is not None

    @property
    def unavailable_s(self) -> float | None:
        """From the fault until the cluster was healthy again (until the give-up if it never was)."""
        if self.at is None:
            return None
        end = self.healthy_at if self.healthy_at is not None else self.gave_up_at
        return None if end is None else round(end - self.at, OFFSET_DIGITS)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "survived": self.survived, "unavailableS": self.unavailable_s}


class Injector:
    """Runs a schedule against a cluster in a thread, recording events through `record`."""

    def __init__(self, cluster: ChaosCluster, schedule: Schedule, record: EventRecorder | None = None) -> None:
        """`record` gets each event line `{"event", "at", "detail"}`; it is called from the
        injector's thread and must not raise."""
        self.cluster = cluster
        self.schedule = schedule
        self._record = record
        self.results: list[FaultResult] = []
        self.error: BaseException | None = None
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.started_at: float | None = None
        self.finished_at: float | None = None

    def __repr__(self) -> str:
        done = sum(1 for result in self.results if result.at is not None)
        return f"<Injector {self.schedule!r} injected={done} running={self.running}>"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> Injector:
        assert self._thread is None, "an injector runs once"
        self._thread = threading.Thread(target=self.run, name="chaos-injector", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """No further fault; the current one's hold ends now, and it is healed and awaited."""
        self._stopping.set()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the schedule's end; TimeoutError if the thread is still busy after timeout_s
        (default: what is left of the schedule's duration, plus FAULT_S_MAX for the fault under way)."""
        if self._thread is None:
            return
        if timeout_s is None:
            left_s = self.schedule.duration_s - (time.monotonic() - (self.started_at or time.monotonic()))
            timeout_s = max(0.0, left_s) + FAULT_S_MAX
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the injector did not finish within {timeout_s} s")

    def run(self) -> None:
        """The whole schedule, in this thread (start() runs it in another)."""
        self.started_at = time.monotonic()
        try:
            for seq, planned in enumerate(self.schedule.faults):
                result = FaultResult(seq, planned.kind, planned.role, planned.at_s, planned.hold_s)
                self.results.append(result)
                self._stopping.wait(max(0.0, self.started_at + planned.at_s - time.monotonic()))
                if self._stopping.is_set():
                    result.skipped = "stopped"
                    continue
                if time.monotonic() - self.started_at > self.schedule.duration_s:
                    result.skipped = "late"  # earlier faults took longer to recover than planned
                    continue
                self._one(result, planned)
        except Exception as error:  # a bug or a broken cluster: keep it for the report
            self.error = error
        finally:
            self.finished_at = time.monotonic()

    def _one(self, result: FaultResult, planned: PlannedFault) -> None:
        kind = REGISTRY[planned.kind]
        leader, _ = self._check_health(result, "before")
        if leader is None:
            result.skipped = "unhealthy"
            return
        nodes = self._targets(planned, leader)
        result.leader_before = self.cluster.ids[leader]
        result.nodes = [self.cluster.ids[node] for node in nodes]
        try:
            result.at = time.monotonic()
            self._emit("fault", result.at, {
                "fault": result.seq, "kind": kind.name, "role": planned.role, "nodes": result.nodes,
                "node": result.nodes[0] if len(result.nodes) == 1 else None, "holdS": planned.hold_s,
            })
            result.detail = kind.inject(self.cluster, nodes)
            self._stopping.wait(planned.hold_s)
        except ClusterError as error:
            result.error = str(error)
        finally:
            healed = kind.heal(self.cluster, nodes, result.detail)
            if healed is not None:
                result.detail = {**(result.detail or {}), **healed}
            result.healed_at = time.monotonic()
            self._emit("heal", result.healed_at, {
                "fault": result.seq, "kind": kind.name, "nodes": result.nodes, **(result.detail or {}),
            })
        leader_after, at = self._check_health(result, "after")
        if leader_after is not None:
            result.healthy_at = at
            result.leader_after = self.cluster.ids[leader_after]
        else:
            result.gave_up_at = at

    def _targets(self, planned: PlannedFault, leader: int) -> list[int]:
        if planned.role == ALL:
            return list(range(self.cluster.size))
        if planned.role == NEW_NODES:
            return []
        if planned.role == LEADER:
            return [leader]
        # Running ones only: a node a failed membership change left down is no follower to hit.
        followers = [node for node in range(self.cluster.size) if node != leader and self.cluster.running(node)]
        follower = followers[planned.pick % len(followers)]
        if planned.role == LEADER_TO_FOLLOWER:
            return [leader, follower]
        return [follower]

    def _check_health(self, result: FaultResult, phase: str) -> tuple[int | None, float]:
        """Wait (bounded) for one leader over every live node; record a health event either way.
        (leader or None, when the cluster was healthy again or the wait gave up)."""
        began = time.monotonic()
        leader: int | None = None
        problem: str | None = None
        try:
            leader, at = self.cluster.wait_healthy_since(HEALTH_TIMEOUT_S)
        except ClusterError as error:
            problem = str(error)
            at = time.monotonic()
        detail: dict[str, Any] = {
            "fault": result.seq, "phase": phase, "ok": leader is not None,
            "leader": None if leader is None else self.cluster.ids[leader],
            "waitedS": round(at - began, OFFSET_DIGITS),
        }
        if phase == "after" and result.at is not None:
            detail["unavailableS"] = round(at - result.at, OFFSET_DIGITS)
        if problem is not None:
            detail["problem"] = problem
            detail["nodes"] = self.cluster.health()
        self._emit("health", at, detail)
        return leader, at

    def _emit(self, event: str, at: float, detail: dict[str, Any]) -> None:
        if self._record is not None:
            self._record({"event": event, "at": at, "detail": detail})

    def summary(self) -> dict[str, Any]:
        """Faults injected and survived by kind, skipped by reason, the longest unavailability, how
        the transfers' calls were answered, and what became of the membership changes."""
        injected = Counter(result.kind for result in self.results if result.at is not None)
        survived = Counter(result.kind for result in self.results if result.survived)
        skipped = Counter(result.skipped for result in self.results if result.skipped is not None)
        transfers = Counter(
            transfer_outcome(result) for result in self.results if result.kind == "transfer" and result.at is not None
        )
        replaces = Counter(
            membership_outcome(result) for result in self.results if result.kind == "replace" and result.at is not None
        )
        grows = Counter(
            membership_outcome(result) for result in self.results if result.kind == "grow" and result.at is not None
        )
        windows = [result for result in self.results if result.unavailable_s is not None]
        longest = max(windows, key=lambda result: result.unavailable_s or 0.0, default=None)
        return {
            "seed": self.schedule.seed,
            "planned": len(self.schedule.faults),
            "injected": {kind: injected[kind] for kind in self.schedule.kinds},
            "survived": {kind: survived[kind] for kind in self.schedule.kinds},
            "skipped": dict(skipped),
            "transfers": dict(transfers),
            "replaces": dict(replaces),
            "grows": dict(grows),
            "longestUnavailableS": None if longest is None else longest.unavailable_s,
            "longestUnavailable": None if longest is None else longest.as_json(),
            "faults": [result.as_json() for result in self.results],
            "error": None if self.error is None else f"{type(self.error).__name__}: {self.error}",
        }


def transfer_outcome(result: FaultResult) -> str:
    """What a transfer's call got: "transferred" (the leadership moved), "stayed" (the voter asked
    for led already), a refusal's error code (CONFLICT, UNAVAILABLE...), or "error" (no answer)."""
    if result.detail is None:
        return "error"
    answer = result.detail.get("answer")
    if result.detail.get("status") == 200 and isinstance(answer, dict):
        return "transferred" if answer.get("transferred") else "stayed"
    error = answer.get("error") if isinstance(answer, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return str(code or result.detail.get("status"))


def membership_outcome(result: FaultResult) -> str:
    """What became of a replace ("voter": the fresh node was listed as a voter by every member in
    time; "not-removed", "not-voter") or a grow ("voters, then removed"; "not-voter, then ...",
    "..., then not-removed" or "members-disagree"); "error" when the injection raised."""
    detail = result.detail or {}
    outcome = str(detail.get("outcome", "error"))
    if result.kind == "grow":
        return f"{outcome}, then {detail.get('shrink', 'error')}"
    return outcome
