"""The checks of a chaos history: what a cluster under faults must never do, tested on what its
clients saw.

    report = check_history(read_history(report_dir / "history.jsonl"))
    print(format_report(report))

A history (chaos/history.py) holds every client operation with its call and return times and a
status: `ok` (acknowledged), `fail` (a definite refusal: nothing happened) or `unknown` (no
answer: it may have happened, at any time after its call, or never). Each check below is one
function `(History) -> list[Violation]`, with a docstring saying what it proves and how it treats
unknown operations. The rule for all of them: an unknown operation is never a violation by itself,
and it may explain a later observation (a result read that only an unknown complete wrote). Times
of one process (`call`, `ret`: the harness's monotonic clock) are compared only with each other;
times of the server (`leaseExpiresAt`, `fireAt`, `firedAt`, a run's `finishedAt`: the leader's
epoch milliseconds) only with each other. "B was called after A was acknowledged" is
`B.call > A.ret`, and then B took effect after A did. Durations of the two clocks are compared
(an allowance's window, a lease's length) on the premise that they run alike: where the leader's
stamps show one stepped against the other (clock_steps), the report notes it.

    1 results          every acknowledged submit ends with one recorded result; none lost or changed
    2 leases           no complete from a lost lease is accepted; no two valid leases of a task overlap
    3 once             a once key has one result, the same for every caller
    4 groups           a group finalizes once, as its verdicts imply; late verdicts change nothing
    5 barriers         a barrier releases only after `target` distinct arrivals, once per epoch
    6 timers           a timer fires at most once, never early, never after its run stopped
    7 cancel           after a run's cancel is acknowledged, it takes no new work
    8 linearizability  per task, completes (write once) and reads are linearizable
    9 replays          calls retried with one idempotency key are answered alike: applied once
   10 capacity         a permit never grants more units than it has; a stopped run's acquire is
                       refused; every unit is back once the leases ran out; no window of an
                       allowance lets more than its units through
   11 money            a budget's money is never created or lost: limit = settled + reserved +
                       remaining in every view; settled only grows, by the settles' charges
   12 events           the event log is one sequence that pages resume without loss or repeat;
                       no event of something that did not happen; every acknowledged change
                       has its event, once, in the order the history proves
   13 stale_reads      no task read misses a change acknowledged before the read was called
                       (its submit, an accepted complete, its run's cancel, or what an earlier
                       read returned)

The final views (`final` lines, read after the faults healed) are the last observation of each
entity; a check that needs them and finds none of a kind notes that it skipped that part.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from chaos import linearizability
from chaos.history import STATUS_FAIL, STATUS_OK, STATUS_UNKNOWN, HistoryLines

CHECK_RESULTS = "results"
CHECK_LEASES = "leases"
CHECK_ONCE = "once"
CHECK_GROUPS = "groups"
CHECK_BARRIERS = "barriers"
CHECK_TIMERS = "timers"
CHECK_CANCEL = "cancel"
CHECK_LINEARIZABILITY = "linearizability"
CHECK_REPLAYS = "replays"
CHECK_CAPACITY = "capacity"
CHECK_MONEY = "money"
CHECK_EVENTS = "events"
CHECK_STALE_READS = "stale_reads"

# How much earlier than `acquire.call + leaseMs` the capacity check ends a grant's certain holding:
# the lease runs on the leader's clock from its command time (after the call), this clock runs
# with it; the margin covers clock-rate noise only.
CAPACITY_CLOCK_MARGIN_S = 0.02

# Steps of the linearizability search per task before it answers "unknown".
LINEARIZABILITY_BUDGET_STEPS = 100_000
# How much of an operation's args or result a report line shows.
REPORT_VALUE_CHARS_MAX = 160
# Operations shown under one violation.
REPORT_OPS_MAX = 8

TASK_FINISHED = ("SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED")
SUCCEEDED = "SUCCEEDED"
CANCELLED = "CANCELLED"
FINALIZED = "FINALIZED"
RELEASED = "RELEASED"
ONCE_FAILED = "ONCE_FAILED"
NOT_FOUND = "NOT_FOUND"

# Operations that end a delivery (the lease ends with them when they take effect).
DELIVERY_ENDS = ("complete", "release", "retry", "reject")


# -- the history ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One recorded operation (a history line with `op`)."""

    id: int
    client: str
    op: str
    call: float
    ret: float | None
    args: Mapping[str, Any]
    result: Mapping[str, Any] | None
    error: Mapping[str, Any] | None
    status: str

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK

    @property
    def failed(self) -> bool:
        return self.status == STATUS_FAIL

    @property
    def may_have_happened(self) -> bool:
        """Acknowledged or unknown: not refused."""
        return self.status != STATUS_FAIL

    @property
    def code(self) -> str | None:
        return None if self.error is None else self.error.get("code")

    def __str__(self) -> str:
        ret = "-" if self.ret is None or self.status == STATUS_UNKNOWN else f"{self.ret:.3f}"
        answer = self.result if self.ok else self.error
        return (
            f"#{self.id} {self.client} {self.op} [{self.call:.3f} .. {ret}] {self.status} "
            f"args={_short(self.args)} -> {_short(answer)}"
        )


@dataclass(frozen=True)
class Delivery:
    """A delivery a receive acknowledged: its task, its worker and its lease in server time."""

    id: str
    task: str
    receive: Op
    holder: str | None
    granted_ms: float | None  # leaseExpiresAt - leaseMs: the server's time of the receive
    expires_ms: float | None


@dataclass(frozen=True)
class Violation:
    """What a check found: the check's name, the entity (a task id, a group id, ...), what is
    wrong, and the operations that show it."""

    check: str
    key: str
    message: str
    ops: tuple[Op, ...] = ()

    def __str__(self) -> str:
        return f"[{self.check}] {self.key}: {self.message}"


@dataclass
class Report:
    """Every violation, counts of what was checked, and notes on what could not be (an
    undecided linearizability search, a kind of final views missing)."""

    violations: list[Violation]
    counts: dict[str, int]
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations


class History:
    """A parsed history with the indexes the checks share. `notes` collects what a check could not
    decide (it is not a violation)."""

    def __init__(self, operations: Iterable[Op], events: Iterable[Mapping[str, Any]], finals: Iterable[Mapping[str, Any]]):
        self.ops = sorted(operations, key=lambda op: (op.call, op.id))
        self.events = list(events)
        self.finals: dict[str, dict[str, Any]] = defaultdict(dict)  # kind -> id -> view
        for line in finals:
            self.finals[str(line["final"])][str(line["id"])] = line.get("view")
        self.notes: list[str] = []
        self.counts_extra: dict[str, int] = {}  # what a check counted (registers searched)
        self.steps: list[ClockStep] | None = None  # clock_steps', once found
        self.by_kind: dict[str, list[Op]] = defaultdict(list)
        for op in self.ops:
            self.by_kind[op.op].append(op)
        self.deliveries: dict[str, Delivery] = {}
        self.run_of_task: dict[str, str] = {}
        for op in self.by_kind["submit"]:
            if op.ok and op.result is not None and op.result.get("taskId") and op.args.get("run"):
                self.run_of_task[op.result["taskId"]] = op.args["run"]
        for op in self.by_kind["receive"]:
            for delivery in _deliveries_of(op):
                self.deliveries[delivery.id] = delivery
                if op.args.get("run"):
                    self.run_of_task.setdefault(delivery.task, op.args["run"])
        self.task_ops: dict[str, list[Op]] = defaultdict(list)  # task id -> its delivery calls and reads
        for kind in ("renew", "complete", "release", "retry", "reject", "read_task"):
            for op in self.by_kind[kind]:
                task = self.task_of(op)
                if task is not None:
                    self.task_ops[task].append(op)

    def delivery_of(self, op: Op) -> Delivery | None:
        """The acknowledged delivery an operation names (None if no receive acknowledged it)."""
        delivery_id = op.args.get("delivery")
        return self.deliveries.get(delivery_id) if isinstance(delivery_id, str) else None

    def task_of(self, op: Op) -> str | None:
        """The task an operation on a task or a delivery is about."""
        task = op.args.get("taskId")
        if task is None:
            delivery = self.delivery_of(op)
            task = None if delivery is None else delivery.task
        return task

    def task_ops_of(self, task: str, *kinds: str) -> list[Op]:
        return [op for op in self.task_ops.get(task, []) if op.op in kinds]

    def submitted_tasks(self) -> list[tuple[str, Op]]:
        """(task id, the acknowledged submit) for every acknowledged submit and group submit."""
        found = []
        for op in self.by_kind["submit"] + self.by_kind["group_submit"]:
            if op.ok and op.result is not None and op.result.get("taskId"):
                found.append((op.result["taskId"], op))
        return found

    def final(self, kind: str, entity_id: str) -> tuple[bool, Any]:
        """(whether a final line of this entity exists, its view)."""
        views = self.finals.get(kind, {})
        return (entity_id in views), views.get(entity_id)

    def note(self, message: str) -> None:
        self.notes.append(message)


def parse_history(lines: HistoryLines) -> History:
    """A History from `read_history`'s answer (operations, events, finals)."""
    return History((_op(line) for line in lines.operations), lines.events, lines.finals)


def _op(line: Mapping[str, Any]) -> Op:
    status = line["status"]
    return Op(
        id=int(line["id"]),
        client=str(line.get("client", "")),
        op=str(line["op"]),
        call=float(line["call"]),
        # An unknown operation's effect may land at any time after its call: it has no return.
        ret=None if status == STATUS_UNKNOWN or line.get("ret") is None else float(line["ret"]),
        args=line.get("args") or {},
        result=line.get("result"),
        error=line.get("error"),
        status=status,
    )


def _deliveries_of(receive: Op) -> list[Delivery]:
    if not receive.ok or receive.result is None:
        return []
    holder = receive.args.get("holder", receive.args.get("worker"))
    found = []
    for item in receive.result.get("deliveries") or []:
        expires_ms = epoch_ms(item.get("leaseExpiresAt"))
        lease_ms = item.get("leaseMs", receive.args.get("leaseMs"))
        granted_ms = None if expires_ms is None or lease_ms is None else expires_ms - float(lease_ms)
        found.append(Delivery(item["id"], item["taskId"], receive, holder, granted_ms, expires_ms))
    return found


# -- values --------------------------------------------------------------------------------------


def canonical(value: Any) -> str:
    """A JSON value as text that is equal exactly when the values are (keys sorted)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def epoch_ms(value: Any) -> float | None:
    """A server time in epoch milliseconds, given as a number or as ISO 8601 text."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000.0
    raise ValueError(f"not a time: {value!r}")


def written_payload(complete: Op) -> Any:
    """What a complete asked to record as the task's outcome: its `result`'s `payload` (the HTTP
    body's shape), or the `result` itself when it is not wrapped."""
    result = complete.args.get("result")
    if isinstance(result, dict) and "payload" in result and set(result) <= {"payload", "spent"}:
        return result["payload"]
    return result


def _short(value: Any) -> str:
    text = canonical(value)
    return text if len(text) <= REPORT_VALUE_CHARS_MAX else text[: REPORT_VALUE_CHARS_MAX - 3] + "..."


def _read_error(view: Any) -> Mapping[str, Any] | None:
    """The refusal a final read got instead of a view (`{"error": {"code", "message"}}`); a view's
    own `error` (a task's last error message) is text, not this."""
    error = view.get("error") if isinstance(view, dict) else None
    return error if isinstance(error, dict) else None


def _is_missing(view: Any) -> bool:
    """A final view saying the entity does not exist (any more)."""
    return view is None or (_read_error(view) or {}).get("code") == NOT_FOUND


def _is_error(view: Any) -> bool:
    """A final read that was refused for another reason than NOT_FOUND (or for that one)."""
    return _read_error(view) is not None


@dataclass(frozen=True)
class _Seen:
    """One observation of an entity: an acknowledged read (or an answer carrying its state), or
    the final view (at infinite time). `b` was read after `a` when `b.call > a.ret`."""

    view: Mapping[str, Any]
    call: float
    ret: float
    op: Op | None = None

    def after(self, other: _Seen) -> bool:
        return self.call > other.ret

    @property
    def ops(self) -> tuple[Op, ...]:
        return () if self.op is None else (self.op,)


def _seen(op: Op, view: Mapping[str, Any]) -> _Seen:
    assert op.ret is not None, op
    return _Seen(view, op.call, op.ret, op)


def _seen_final(view: Mapping[str, Any]) -> _Seen:
    return _Seen(view, math.inf, math.inf)


def _observed(history: History, final_kind: str, id_name: str, *kinds: str) -> dict[Any, list[_Seen]]:
    """Every view of each entity, by id: the acknowledged answers of `kinds` that carry its state
    (a verdict's answer names it `groupState`), then its final view."""
    seen: dict[Any, list[_Seen]] = defaultdict(list)
    for kind in kinds:
        for op in history.by_kind[kind]:
            if not op.ok or op.result is None:
                continue
            view = {**op.result, "state": op.result["groupState"]} if "groupState" in op.result else op.result
            if view.get("state") is not None:
                seen[op.args.get(id_name)].append(_seen(op, view))
    for entity_id, view in history.finals.get(final_kind, {}).items():
        if isinstance(view, dict) and not _is_error(view):
            seen[entity_id].append(_seen_final(view))
    return seen


def _ops(*groups: Iterable[Op]) -> tuple[Op, ...]:
    unique = {op.id: op for group in groups for op in group}
    return tuple(sorted(unique.values(), key=lambda op: (op.call, op.id)))


# -- 1. results ----------------------------------------------------------------------------------


def check_results(history: History) -> list[Violation]:
    """Every acknowledged submit ends with exactly one recorded result, and no result is lost or
    changes.

    Proves, for each task an acknowledged submit (or group submit) created: its final view exists
    and is finished; a SUCCEEDED outcome is the payload of a complete of that task that was
    acknowledged or unknown (an unknown complete may be the one that wrote it; a refused one
    cannot); an acknowledged complete's payload is the final outcome (an acknowledged result is
    never lost or replaced); and every acknowledged read of the task that saw it finished saw the
    final state and outcome (a recorded result never changes). Without final views, reads that saw
    the task finished are compared with each other. An unknown submit is not required to have
    created anything; unknown reads are not observations.
    """
    violations: list[Violation] = []
    if "task" not in history.finals:
        history.note("results: no final task views; checked only that finished reads agree")
    submits = dict(history.submitted_tasks())
    for task in sorted(set(submits) | set(history.task_ops)):
        present, view = history.final("task", task)
        if present and _is_error(view) and not _is_missing(view):
            history.note(f"results: the final read of task {task} failed: {_short(view['error'])}")
        elif not present and task in submits and "task" in history.finals:
            history.note(f"results: task {task} has no final view")
        final_view = view if present and not _is_error(view) else None
        gone = present and _is_missing(view)
        if task in submits and (gone or final_view is not None):
            violations.extend(_submitted_task_wrong(history, task, submits[task], final_view))
        for complete in history.task_ops_of(task, "complete"):
            if complete.ok and (gone or final_view is not None):
                violations.extend(_acknowledged_result_wrong(complete, final_view, reported_gone=task in submits))
        violations.extend(_finished_reads_disagree(history, task, final_view))
    return violations


def _submitted_task_wrong(history: History, task: str, submit: Op, view: Mapping[str, Any] | None) -> list[Violation]:
    """An acknowledged submit's task in its final view (None: gone): finished, with an outcome
    some complete that may have happened wrote."""
    if view is None:
        return [Violation(CHECK_RESULTS, task, "an acknowledged submit's task is gone", (submit,))]
    if view.get("state") not in TASK_FINISHED:
        return [Violation(CHECK_RESULTS, task, f"an acknowledged task never finished: final state {view.get('state')}", (submit,))]
    if view.get("state") != SUCCEEDED:
        return []
    completes = history.task_ops_of(task, "complete")
    outcome = canonical(view.get("outcome"))
    if any(op.may_have_happened and canonical(written_payload(op)) == outcome for op in completes):
        return []
    message = f"final outcome {_short(view.get('outcome'))} is no payload of an acknowledged or unknown complete"
    return [Violation(CHECK_RESULTS, task, message, _ops([submit], completes))]


def _acknowledged_result_wrong(complete: Op, view: Mapping[str, Any] | None, *, reported_gone: bool) -> list[Violation]:
    """An acknowledged complete against its task's final view (None: gone)."""
    task = str(complete.args.get("taskId"))
    if view is None:
        gone = Violation(CHECK_RESULTS, task, "an acknowledged complete's task is gone", (complete,))
        return [] if reported_gone else [gone]
    payload = written_payload(complete)
    if view.get("state") == SUCCEEDED and canonical(view.get("outcome")) == canonical(payload):
        return []
    message = (
        f"an acknowledged complete's result {_short(payload)} is not the final one "
        f"(final: {view.get('state')} {_short(view.get('outcome'))})"
    )
    return [Violation(CHECK_RESULTS, task, message, (complete,))]


def _finished_reads_disagree(history: History, task: str, final_view: Mapping[str, Any] | None) -> list[Violation]:
    """Reads that saw the task finished against the final view (or, without one, the first such
    read): a finished task never changes state or outcome."""
    seen = [
        _seen(op, op.result)
        for op in history.task_ops_of(task, "read_task")
        if op.ok and op.result is not None and op.result.get("state") in TASK_FINISHED
    ]
    reference: _Seen | None = _seen_final(final_view) if final_view is not None else (seen[0] if seen else None)
    if reference is None:
        return []
    violations = []
    for read in seen:
        if _finished(read.view) != _finished(reference.view):
            what = "the final view" if reference.op is None else "another read"
            violations.append(
                Violation(
                    CHECK_RESULTS,
                    task,
                    f"a read saw {_describe_finished(read.view)} but {what} saw {_describe_finished(reference.view)}: "
                    "a recorded result was lost or changed",
                    _ops(read.ops, reference.ops),
                )
            )
    return violations


def _finished(view: Mapping[str, Any]) -> tuple[Any, str]:
    return view.get("state"), canonical(view.get("outcome"))


def _describe_finished(view: Mapping[str, Any]) -> str:
    return f"{view.get('state')} {_short(view.get('outcome'))}"


# -- 2. leases -----------------------------------------------------------------------------------


def check_leases(history: History) -> list[Violation]:
    """No complete from a lost lease is accepted, and no two deliveries of a task hold valid leases
    at once.

    Proves, per task: (a) at most one delivery had a complete acknowledged (the same delivery may
    be acknowledged again: a retried complete is answered again); (b) that delivery is the one the
    final view names: its receive's holder is the final `finishedBy`; (c) no complete of a
    delivery called after another delivery of the task was received is acknowledged (that lease
    was taken over); (d) for two deliveries received in that order, the second was granted
    (server time `leaseExpiresAt - leaseMs`) no earlier than the first's last acknowledged
    `leaseExpiresAt` (its receive's, or an acknowledged renew's), unless the first may have been
    ended before: a complete, release, retry or reject of it, acknowledged or unknown, called
    before the second receive returned. Unknown completes are not acceptances; an unknown renew
    extends nothing we rely on (the server's lease can only be longer than the acknowledged one,
    which makes an overlap only more certain).
    """
    violations: list[Violation] = []
    by_task: dict[str, list[Delivery]] = defaultdict(list)
    for delivery in history.deliveries.values():
        by_task[delivery.task].append(delivery)
    for task in sorted(set(by_task) | set(history.task_ops)):
        completes = history.task_ops_of(task, "complete")
        accepted: dict[Any, list[Op]] = defaultdict(list)
        for op in completes:
            if op.ok:
                accepted[op.args.get("delivery")].append(op)
        if len(accepted) > 1:
            violations.append(
                Violation(
                    CHECK_LEASES,
                    task,
                    f"completes of {len(accepted)} different deliveries were acknowledged ({', '.join(map(str, accepted))})",
                    _ops(*accepted.values()),
                )
            )
        violations.extend(_finisher_differs(history, task, accepted))
        violations.extend(_complete_after_takeover(history, task, by_task.get(task, []), completes))
        violations.extend(_leases_overlap(history, task, by_task.get(task, [])))
    return violations


def _finisher_differs(history: History, task: str, accepted: Mapping[Any, list[Op]]) -> list[Violation]:
    present, view = history.final("task", task)
    if not present or _is_missing(view) or _is_error(view) or view.get("finishedBy") is None:
        return []
    if view.get("state") != SUCCEEDED:
        return []  # an acknowledged result that is not the final one: check_results reports it
    violations = []
    for delivery_id, ops in accepted.items():
        delivery = history.deliveries.get(delivery_id)
        if delivery is not None and delivery.holder is not None and delivery.holder != view["finishedBy"]:
            violations.append(
                Violation(
                    CHECK_LEASES,
                    task,
                    f"delivery {delivery_id} of holder {delivery.holder} had its complete acknowledged, "
                    f"but the final view says {view['finishedBy']} finished the task",
                    _ops([delivery.receive], ops),
                )
            )
    return violations


def _complete_after_takeover(
    history: History, task: str, deliveries: list[Delivery], completes: list[Op]
) -> list[Violation]:
    violations = []
    for complete in completes:
        mine = history.delivery_of(complete)
        if not complete.ok or mine is None:
            continue
        for other in deliveries:
            assert other.receive.ret is not None
            if other.id != mine.id and _granted_after(other, mine) and complete.call > other.receive.ret:
                violations.append(
                    Violation(
                        CHECK_LEASES,
                        task,
                        f"a complete of delivery {complete.args.get('delivery')} was acknowledged although it was "
                        f"called after delivery {other.id} of the task was received (its lease was lost)",
                        _ops([other.receive, complete]),
                    )
                )
                break
    return violations


def _granted_after(later: Delivery, earlier: Delivery) -> bool:
    """Whether `later` was handed out after `earlier` (by server time when both are known)."""
    if later.granted_ms is not None and earlier.granted_ms is not None:
        return later.granted_ms > earlier.granted_ms
    assert earlier.receive.ret is not None
    return later.receive.call > earlier.receive.ret


def _leases_overlap(history: History, task: str, deliveries: list[Delivery]) -> list[Violation]:
    timed = sorted(
        (delivery for delivery in deliveries if delivery.granted_ms is not None),
        key=lambda delivery: (delivery.granted_ms, delivery.receive.call),
    )
    violations = []
    for index, first in enumerate(timed):
        renews = [op for op in history.task_ops_of(task, "renew") if op.ok and op.args.get("delivery") == first.id]
        expiries = [first.expires_ms] + [epoch_ms((op.result or {}).get("leaseExpiresAt")) for op in renews]
        valid_until = max(expiry for expiry in expiries if expiry is not None)
        ends = [
            op
            for op in history.task_ops_of(task, *DELIVERY_ENDS)
            if op.args.get("delivery") == first.id and op.may_have_happened
        ]
        for second in timed[index + 1 :]:
            assert second.granted_ms is not None and second.receive.ret is not None
            if second.granted_ms >= valid_until:
                break  # granted after the first lease ran out; later ones too
            if any(end.call < second.receive.ret for end in ends):
                continue
            violations.append(
                Violation(
                    CHECK_LEASES,
                    task,
                    f"delivery {second.id} was granted at {second.granted_ms:.0f} while delivery {first.id}'s lease "
                    f"was valid until {valid_until:.0f} and nothing had ended it",
                    _ops([first.receive, second.receive], renews),
                )
            )
    return violations


# -- 3. once -------------------------------------------------------------------------------------


def check_once(history: History) -> list[Violation]:
    """A once key has one result, the same for every caller.

    Proves, per (run, name, key): every acknowledged call got the same value; no caller got
    ONCE_FAILED (the key failed for good) while another got a value; and the final once view, if
    any, is DONE with that value. Unknown calls and other refusals (a caller whose lease was taken
    over) say nothing about the key's result.
    """
    violations = []
    calls: dict[tuple[Any, Any, Any], list[Op]] = defaultdict(list)
    for op in history.by_kind["once"]:
        calls[(op.args.get("run"), op.args.get("name"), op.args.get("key"))].append(op)
    entries = history.finals.get("once", {})
    for (run, _, key), ops in calls.items():
        label = str(key)
        values: dict[str, list[Op]] = defaultdict(list)
        for op in ops:
            if op.ok and op.result is not None:
                values[canonical(op.result.get("value"))].append(op)
        if len(values) > 1:
            violations.append(
                Violation(
                    CHECK_ONCE,
                    label,
                    f"callers got {len(values)} different results: {', '.join(_short(json.loads(v)) for v in values)}",
                    _ops(*(group[:1] for group in values.values())),
                )
            )
        failed = [op for op in ops if op.failed and op.code == ONCE_FAILED]
        if values and failed:
            violations.append(
                Violation(
                    CHECK_ONCE,
                    label,
                    "one caller got a result and another ONCE_FAILED",
                    _ops(failed[:1], next(iter(values.values()))[:1]),
                )
            )
        view = _once_view(entries, run, key)
        if view is None or not values:
            continue
        if view.get("state") != "DONE" or canonical(view.get("result")) not in values:
            violations.append(
                Violation(
                    CHECK_ONCE,
                    label,
                    f"callers got {_short(json.loads(next(iter(values))))} but the final once entry is "
                    f"{view.get('state')} {_short(view.get('result'))}",
                    _ops(next(iter(values.values()))[:1]),
                )
            )
    return violations


def _once_view(entries: Mapping[str, Any], run: Any, key: Any) -> Mapping[str, Any] | None:
    for entry_id, view in entries.items():
        if not isinstance(view, dict) or _is_error(view):
            continue
        if entry_id != key and view.get("key") != key:
            continue
        view_run = view.get("scopeId", view.get("run"))
        if run is None or view_run is None or view_run == run:
            return view
    return None


# -- 4. groups -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupMember:
    """A member as a group's decision sees it: its task's state and its verdict."""

    state: str | None
    verdict: str | None  # ACCEPTED | REJECTED | None


def group_decision(condition: str, threshold: int | None, closed: bool, members: Iterable[GroupMember]) -> tuple[str, str] | None:
    """The (outcome, reason) a group's members decide, or None while undecided: the rule of
    docs/http-api.md "Task groups" (and runstate_server/actors/groups.py), restated from the spec."""
    accepted = rejected = unfinished = unjudged_successes = 0
    for member in members:
        if member.verdict == "ACCEPTED":
            accepted += 1
        elif member.verdict == "REJECTED":
            rejected += 1
        elif member.state == SUCCEEDED:
            unjudged_successes += 1
        if member.state not in TASK_FINISHED:
            unfinished += 1
    if condition == "FIRST_ACCEPTED":
        return ("SUCCESS", "first_accepted") if accepted >= 1 else None
    if condition == "N_ACCEPTED":
        assert threshold is not None
        if accepted >= threshold:
            return "SUCCESS", "threshold_reached"
        if closed and accepted + unfinished + unjudged_successes < threshold:
            return "FAILURE", "threshold_unreachable"
        return None
    if condition == "ALL_TERMINAL":
        if not closed or unfinished or unjudged_successes:
            return None
        return ("SUCCESS" if accepted >= 1 and rejected == 0 else "FAILURE"), "all_terminal"
    raise ValueError(f"unknown group condition {condition!r}")


def check_groups(history: History) -> list[Violation]:
    """Each group finalizes once, with the outcome and reason its verdicts imply, and no late
    verdict changes it.

    Proves, per group: every observation that saw it FINALIZED (a group read, a verdict's answer,
    the final view) has the same outcome and reason, and nothing read after a FINALIZED one saw it
    undecided; an acknowledged verdict is in the final view, with the verdict given and the same
    late flag; a final view that is not FINALIZED is not already decided by its own members; a
    FINALIZED one has the decision its on-time verdicts imply (members then unfinished are the
    ones it cancelled), with no more on-time acceptances than the decision needed; `deadline` needs
    a deadline, and `cancelled` a stop of its run or its parent run (a cancel acknowledged or
    unknown, or a parent seen stopped). Unknown verdicts may or may not be in the final view; only
    acknowledged ones must be.
    """
    violations: list[Violation] = []
    creates = {op.result["groupId"]: op for op in history.by_kind["group_create"] if op.ok and op.result}
    observations = _observed(history, "group", "groupId", "group_read", "verdict")
    verdicts: dict[Any, list[Op]] = defaultdict(list)
    for op in history.by_kind["verdict"]:
        verdicts[op.args.get("groupId")].append(op)
    for group_id in sorted(set(creates) | set(observations) | set(history.finals.get("group", {}))):
        present, view = history.final("group", group_id)
        final_view = view if present and not _is_missing(view) and not _is_error(view) else None
        violations.extend(_finalized_disagree(group_id, observations.get(group_id, [])))
        if final_view is None:
            continue
        violations.extend(_verdicts_lost(group_id, final_view, verdicts.get(group_id, [])))
        create = creates.get(group_id)
        created: Mapping[str, Any] = (create.result or {}) if create is not None else {}
        condition = final_view.get("condition") or created.get("condition")
        threshold = final_view.get("threshold") if final_view.get("threshold") is not None else created.get("threshold")
        if condition is None or (condition == "N_ACCEPTED" and threshold is None):
            history.note(f"groups: group {group_id} has no condition or threshold in its views; decision not checked")
            continue
        violations.extend(_decision_wrong(history, group_id, condition, threshold, final_view, create))
    return violations


def _finalized_disagree(group_id: str, seen: list[_Seen]) -> list[Violation]:
    violations = []
    finalized = [item for item in seen if item.view.get("state") == FINALIZED]
    if finalized:
        decisions = {(item.view.get("outcome"), item.view.get("outcomeReason")) for item in finalized}
        if len(decisions) > 1:
            violations.append(
                Violation(
                    CHECK_GROUPS,
                    group_id,
                    f"finalized with different decisions: {', '.join(f'{o} {r}' for o, r in sorted(decisions, key=str))}",
                    _ops(*(item.ops for item in finalized)),
                )
            )
    for decided in finalized:
        for later in seen:
            if later.after(decided) and later.view.get("state") != FINALIZED:
                violations.append(
                    Violation(
                        CHECK_GROUPS,
                        group_id,
                        f"seen {later.view.get('state')} after it was seen FINALIZED",
                        _ops(decided.ops, later.ops),
                    )
                )
                return violations
    return violations


def _verdicts_lost(group_id: str, final_view: Mapping[str, Any], verdicts: list[Op]) -> list[Violation]:
    members = {member.get("taskId"): member for member in final_view.get("members") or []}
    violations = []
    for op in verdicts:
        if not op.ok:
            continue
        given = {"accept": "ACCEPTED", "reject": "REJECTED"}.get(str(op.args.get("verdict")).lower(), op.args.get("verdict"))
        member = members.get(op.args.get("taskId"))
        late = (op.result or {}).get("late")
        if member is None or member.get("verdict") != given:
            recorded = None if member is None else member.get("verdict")
            violations.append(
                Violation(CHECK_GROUPS, group_id, f"an acknowledged verdict {given} is {recorded} in the final view", (op,))
            )
        elif late is not None and bool(member.get("late")) != bool(late):
            violations.append(
                Violation(
                    CHECK_GROUPS,
                    group_id,
                    f"a verdict acknowledged with late={late} has late={member.get('late')} in the final view",
                    (op,),
                )
            )
    return violations


def _decision_wrong(
    history: History, group_id: str, condition: str, threshold: int | None, view: Mapping[str, Any], create: Op | None
) -> list[Violation]:
    members = view.get("members") or []
    ops = () if create is None else (create,)
    if view.get("state") != FINALIZED:
        now = [GroupMember(member.get("state"), member.get("verdict")) for member in members]
        decided = group_decision(condition, threshold, view.get("state") == "SEALED", now)
        if decided is None:
            return []
        return [Violation(CHECK_GROUPS, group_id, f"its members decide {decided[0]} {decided[1]} but it is {view.get('state')}", ops)]
    outcome, reason = view.get("outcome"), view.get("outcomeReason")
    # The members as they were when it finalized: late verdicts came after; members it cancelled
    # were unfinished (a group's member is cancelled only by its run's stop, which finalizes it).
    then = [
        GroupMember(
            "RUNNING" if member.get("state") == CANCELLED else member.get("state"),
            None if member.get("late") else member.get("verdict"),
        )
        for member in members
    ]
    accepted = sum(1 for member in then if member.verdict == "ACCEPTED")
    needed = threshold if condition == "N_ACCEPTED" else 1 if condition == "FIRST_ACCEPTED" else None
    if reason in ("deadline", "cancelled"):
        if outcome != "FAILURE":
            return [Violation(CHECK_GROUPS, group_id, f"finalized {outcome} {reason}: that reason is a FAILURE", ops)]
        if needed is not None and accepted >= needed:
            return [
                Violation(
                    CHECK_GROUPS, group_id, f"finalized FAILURE {reason} although {accepted} members were accepted on time", ops
                )
            ]
        return _stop_unexplained(history, group_id, reason, view, ops)
    implied = group_decision(condition, threshold, True, then)
    if implied != (outcome, reason):
        implied_text = "nothing yet" if implied is None else f"{implied[0]} {implied[1]}"
        return [
            Violation(
                CHECK_GROUPS, group_id, f"finalized {outcome} {reason}, but its on-time verdicts imply {implied_text}", ops
            )
        ]
    if outcome == "SUCCESS" and needed is not None and accepted > needed:
        return [
            Violation(
                CHECK_GROUPS, group_id, f"{accepted} members accepted on time, but it finalizes at the {needed}th", ops
            )
        ]
    return []


def _stop_unexplained(
    history: History, group_id: str, reason: str, view: Mapping[str, Any], ops: tuple[Op, ...]
) -> list[Violation]:
    if reason == "deadline":
        if "deadline" in view and view["deadline"] is None:
            return [Violation(CHECK_GROUPS, group_id, "finalized FAILURE deadline, but it has no deadline", ops)]
        return []
    if "parentScopeId" not in view:
        return []
    runs = {view.get("scopeId"), view.get("parentScopeId")} - {None}
    cancels = [op for op in history.by_kind["cancel_run"] if op.args.get("run") in runs and op.may_have_happened]
    if cancels:
        return []
    parent = view.get("parentScopeId")
    if parent is not None:
        present, parent_view = history.final("run", parent)
        if not present or not isinstance(parent_view, dict) or _is_error(parent_view):
            return []  # its parent's fate is not known
        stopped = parent_view.get("storedState") not in (None, "ACTIVE") or parent_view.get("effective") == "INACTIVE"
        if stopped or parent_view.get("deadline") is not None or parent_view.get("parentId") is not None:
            return []
    return [Violation(CHECK_GROUPS, group_id, "finalized FAILURE cancelled, but nothing stopped its run", ops)]


# -- 5. barriers ---------------------------------------------------------------------------------

_BARRIER_NEXT = {"WAITING": {"WAITING", "RELEASED", "CANCELLED"}, "RELEASED": {"RELEASED"}, "CANCELLED": {"CANCELLED"}}


def check_barriers(history: History) -> list[Violation]:
    """A barrier releases only after `target` distinct arrivals were called, once per epoch.

    Proves, per barrier: every observation (an arrive's answer, a read, the final view) that saw
    it RELEASED came after at least `target` distinct keys had called arrive (acknowledged or
    unknown: an unknown arrival may have counted; a refused one did not), and shows at most and,
    once released, exactly `target` arrivals; within an epoch it goes WAITING -> RELEASED or
    CANCELLED and never back (a second release), epochs never go back, and while it never left
    its first epoch no arrive called after a release was seen is acknowledged as a new arrival.
    """
    violations: list[Violation] = []
    creates = {op.result["barrierId"]: op for op in history.by_kind["barrier_create"] if op.ok and op.result}
    arrives: dict[Any, list[Op]] = defaultdict(list)
    for op in history.by_kind["arrive"]:
        arrives[op.args.get("barrierId")].append(op)
    seen = _observed(history, "barrier", "barrierId", "arrive", "barrier_read")
    for barrier_id in sorted(set(creates) | set(seen)):
        observed = seen.get(barrier_id, [])
        create = creates.get(barrier_id)
        target = create.args.get("target") if create is not None else None
        if target is None:
            target = next((item.view["target"] for item in observed if item.view.get("target") is not None), None)
        if target is None:
            history.note(f"barriers: barrier {barrier_id} has no known target; not checked")
            continue
        violations.extend(_barrier_counts(barrier_id, int(target), observed, arrives.get(barrier_id, [])))
        violations.extend(_barrier_order(barrier_id, observed, arrives.get(barrier_id, [])))
    return violations


def _barrier_counts(barrier_id: str, target: int, observed: list[_Seen], arrives: list[Op]) -> list[Violation]:
    violations = []
    for item in observed:
        arrivals = item.view.get("arrivals")
        if isinstance(arrivals, int) and arrivals > target:
            violations.append(Violation(CHECK_BARRIERS, barrier_id, f"{arrivals} arrivals counted for a target of {target}", item.ops))
        if item.view.get("state") != RELEASED:
            continue
        if isinstance(arrivals, int) and arrivals < target:
            violations.append(
                Violation(CHECK_BARRIERS, barrier_id, f"released with {arrivals} arrivals for a target of {target}", item.ops)
            )
        callers = [op for op in arrives if op.may_have_happened and op.call < item.ret]
        keys = {op.args.get("key") for op in callers}
        if len(keys) < target:
            violations.append(
                Violation(
                    CHECK_BARRIERS,
                    barrier_id,
                    f"seen released when only {len(keys)} distinct keys of a target of {target} had called arrive",
                    _ops(item.ops, callers),
                )
            )
    return violations


def _barrier_order(barrier_id: str, observed: list[_Seen], arrives: list[Op]) -> list[Violation]:
    # No operation of the workload starts a new epoch, but a view may say it happened; then an
    # observation without an epoch (an arrive's answer) cannot be placed in one.
    single_epoch = all(item.view.get("epoch") in (None, 1) for item in observed)
    default_epoch = 1 if single_epoch else None
    violations = []
    for earlier in observed:
        for later in observed:
            epoch_before = earlier.view.get("epoch", default_epoch)
            epoch_after = later.view.get("epoch", default_epoch)
            if not later.after(earlier) or epoch_before is None or epoch_after is None:
                continue
            if epoch_after < epoch_before:
                violations.append(
                    Violation(CHECK_BARRIERS, barrier_id, f"epoch {epoch_after} seen after epoch {epoch_before}", _ops(earlier.ops, later.ops))
                )
                return violations
            before, after = earlier.view.get("state"), later.view.get("state")
            if epoch_after == epoch_before and before in _BARRIER_NEXT and after not in _BARRIER_NEXT[before]:
                violations.append(
                    Violation(
                        CHECK_BARRIERS,
                        barrier_id,
                        f"seen {after} after {before} in epoch {epoch_before}",
                        _ops(earlier.ops, later.ops),
                    )
                )
                return violations
    if not single_epoch:
        return violations
    releases = [item for item in observed if item.view.get("state") == RELEASED]
    for op in arrives:
        if not (op.ok and op.result is not None and op.result.get("arrived") is True):
            continue
        release = next((item for item in releases if op.call > item.ret), None)
        if release is not None:
            violations.append(
                Violation(
                    CHECK_BARRIERS,
                    barrier_id,
                    f"key {op.args.get('key')!r} was acknowledged as a new arrival after the release was seen",
                    _ops(release.ops, [op]),
                )
            )
    return violations


# -- 6. timers -----------------------------------------------------------------------------------

_TIMER_NEXT = {
    "ARMED": {"ARMED", "FIRED", "ACKED", "CANCELLED"},
    "FIRED": {"FIRED", "ACKED"},
    "ACKED": {"ACKED"},
    "CANCELLED": {"CANCELLED"},
}


def check_timers(history: History) -> list[Violation]:
    """A timer fires at most once, never before its time, never after its run's cancel was
    acknowledged.

    Proves, per timer: every `firedAt` seen is at or after its `fireAt` and they are all the same
    time (one firing); its state never goes back (ARMED -> FIRED -> ACKED, or ARMED ->
    CANCELLED, then nothing else); once its run's cancel is acknowledged, no read called later
    sees it ARMED (the cancel disarms it in the same step); and if the final view of its run is
    stopped, it did not fire after the run's `finishedAt` (server times both). An unknown cancel
    may or may not have stopped the run; only its final view or an acknowledged cancel count.
    """
    violations: list[Violation] = []
    creates = {op.result["timerId"]: op for op in history.by_kind["timer_create"] if op.ok and op.result}
    seen = _observed(history, "timer", "timerId", "timer_read")
    cancels: dict[Any, list[Op]] = defaultdict(list)
    for op in history.by_kind["cancel_run"]:
        if op.ok:
            cancels[op.args.get("run")].append(op)
    for timer_id in sorted(set(creates) | set(seen)):
        observed = seen.get(timer_id, [])
        create = creates.get(timer_id)
        fire_at = epoch_ms((create.result or {}).get("fireAt")) if create is not None else None
        if fire_at is None:
            fire_at = next((epoch_ms(item.view["fireAt"]) for item in observed if item.view.get("fireAt") is not None), None)
        run = create.args.get("run") if create is not None else None
        if run is None:
            run = next((item.view.get("scopeId") for item in observed if item.view.get("scopeId")), None)
        create_ops = () if create is None else (create,)
        fired = [(item, _fired_ms(item)) for item in observed if item.view.get("firedAt") is not None]
        fired_times = sorted({fired_ms for _, fired_ms in fired})
        if len(fired_times) > 1:
            violations.append(
                Violation(
                    CHECK_TIMERS,
                    timer_id,
                    f"fired at {len(fired_times)} different times: {', '.join(f'{t:.0f}' for t in fired_times)}",
                    _ops(create_ops, *(item.ops for item, _ in fired)),
                )
            )
        early = [(item, fired_ms) for item, fired_ms in fired if fire_at is not None and fired_ms < fire_at]
        if early and fire_at is not None:
            violations.append(
                Violation(
                    CHECK_TIMERS,
                    timer_id,
                    f"fired at {early[0][1]:.0f}, before its time {fire_at:.0f}",
                    _ops(create_ops, early[0][0].ops),
                )
            )
        violations.extend(_timer_order(timer_id, observed))
        if run is not None:
            violations.extend(_timer_after_stop(history, timer_id, run, observed, fired, cancels.get(run, [])))
    return violations


def _fired_ms(item: _Seen) -> float:
    fired_ms = epoch_ms(item.view["firedAt"])
    assert fired_ms is not None
    return fired_ms


def _timer_order(timer_id: str, observed: list[_Seen]) -> list[Violation]:
    for earlier in observed:
        for later in observed:
            before, after = earlier.view.get("state"), later.view.get("state")
            if later.after(earlier) and before in _TIMER_NEXT and after not in _TIMER_NEXT[before]:
                return [Violation(CHECK_TIMERS, timer_id, f"seen {after} after {before}", _ops(earlier.ops, later.ops))]
    return []


def _timer_after_stop(
    history: History, timer_id: str, run: str, observed: list[_Seen], fired: list[tuple[_Seen, float]], cancels: list[Op]
) -> list[Violation]:
    violations = []
    for cancel in cancels:
        armed = next((item for item in observed if item.view.get("state") == "ARMED" and item.call > (cancel.ret or math.inf)), None)
        if armed is not None:
            violations.append(
                Violation(
                    CHECK_TIMERS,
                    timer_id,
                    f"still ARMED after the cancel of its run {run} was acknowledged",
                    _ops([cancel], armed.ops),
                )
            )
            break
    # When the run stopped, in server time: its acknowledged cancel's answer, or its final view.
    stop_times = [epoch_ms((cancel.result or {}).get("finishedAt")) for cancel in cancels]
    present, run_view = history.final("run", run)
    if present and isinstance(run_view, dict) and run_view.get("storedState") not in (None, "ACTIVE"):
        stop_times.append(epoch_ms(run_view.get("finishedAt")))
    known = [time for time in stop_times if time is not None]
    if not known:
        return violations
    stopped_at = min(known)
    late = next(((item, fired_ms) for item, fired_ms in fired if fired_ms > stopped_at), None)
    if late is not None:
        violations.append(
            Violation(
                CHECK_TIMERS,
                timer_id,
                f"fired at {late[1]:.0f}, after its run {run} stopped at {stopped_at:.0f}",
                _ops(cancels[:1], late[0].ops),
            )
        )
    return violations


# -- 7. cancel -----------------------------------------------------------------------------------


def check_cancel(history: History) -> list[Violation]:
    """After a run's cancel is acknowledged, the run takes no new work.

    Proves, for each run from the return of its first acknowledged cancel: no submit called later
    is acknowledged as creating a task (`created` true; an answer without `created` counts unless
    a submit of the same key, acknowledged or unknown, was called before the cancel returned: the
    answer may then name that earlier task); no receive called later is acknowledged with
    deliveries; no renew called later is acknowledged; no complete called later is acknowledged,
    unless a complete of the same delivery (acknowledged or unknown) was called before the cancel
    returned, which may have recorded the result first (a repeat is answered again). An unknown
    cancel proves nothing: the run may still be active.
    """
    violations: list[Violation] = []
    cancelled_at: dict[Any, Op] = {}
    for op in history.by_kind["cancel_run"]:
        run = op.args.get("run")
        if op.ok and op.ret is not None and (run not in cancelled_at or op.ret < (cancelled_at[run].ret or math.inf)):
            cancelled_at[run] = op
    if not cancelled_at:
        return violations

    def after_cancel(op: Op, run: Any) -> Op | None:
        cancel = cancelled_at.get(run)
        return cancel if cancel is not None and cancel.ret is not None and op.call > cancel.ret else None

    for op in history.by_kind["submit"]:
        cancel = after_cancel(op, op.args.get("run"))
        if cancel is None or not op.ok or op.result is None or op.result.get("created") is False:
            continue
        earlier = [
            other
            for other in history.by_kind["submit"]
            if other.may_have_happened
            and other.call < (cancel.ret or 0)
            and all(other.args.get(name) == op.args.get(name) for name in ("run", "mailbox", "key"))
        ]
        if op.result.get("created") is None and earlier:
            continue
        violations.append(
            Violation(CHECK_CANCEL, str(op.args.get("run")), "a submit called after the run's cancel was acknowledged created a task", (cancel, op))
        )
    for op in history.by_kind["receive"]:
        cancel = after_cancel(op, op.args.get("run"))
        if cancel is not None and op.ok and (op.result or {}).get("deliveries"):
            violations.append(
                Violation(CHECK_CANCEL, str(op.args.get("run")), "a receive called after the run's cancel was acknowledged got work", (cancel, op))
            )
    for op in history.by_kind["renew"] + history.by_kind["complete"]:
        task = history.task_of(op)
        run = history.run_of_task.get(task) if task is not None else None
        cancel = after_cancel(op, run)
        if cancel is None or not op.ok:
            continue
        if op.op == "complete" and any(
            other.args.get("delivery") == op.args.get("delivery") and other.may_have_happened and other.call < (cancel.ret or 0)
            for other in history.by_kind["complete"]
        ):
            continue
        violations.append(
            Violation(
                CHECK_CANCEL, str(run), f"a {op.op} called after the run's cancel was acknowledged was acknowledged", (cancel, op)
            )
        )
    return violations


# -- 8. linearizability --------------------------------------------------------------------------


def check_linearizable_reads(history: History, budget_steps: int = LINEARIZABILITY_BUDGET_STEPS) -> list[Violation]:
    """Reads a client acted on are linearizable: per task, its completes and reads are a history
    of a write-once register (chaos.linearizability.write_once_register) and must have a
    linearization.

    A complete writes its payload: acknowledged means accepted, refused means no effect, unknown
    means it may have been accepted at any time after its call, or never (it is given no return).
    A read reads the outcome: the payload once SUCCEEDED, nothing before (or for a task that ended
    otherwise). Unknown and refused reads carry no observation and are left out. A search that
    exhausts `budget_steps` is noted as undecided, not reported as a violation.
    """
    violations = []
    checked = undecided = 0
    for task in sorted(history.task_ops):
        register = [_register_operation(task, op) for op in history.task_ops_of(task, "complete", "read_task")]
        operations = [operation for operation in register if operation is not None]
        if not any(isinstance(operation.input, linearizability.Read) for operation in operations):
            continue
        checked += 1
        result = linearizability.check(linearizability.write_once_register, operations, budget_steps)
        if result.outcome == linearizability.Outcome.UNKNOWN:
            undecided += 1
            history.note(f"linearizability: task {task} undecided after {budget_steps} search steps")
        elif result.outcome == linearizability.Outcome.VIOLATION:
            by_id = {op.id: op for op in history.task_ops[task]}
            prefix = tuple(by_id[operation.id] for operation in result.prefix)
            last = next((op for op in prefix if op.ret == result.prefix_end), None)
            culprit = f"; no order explains #{last.id} {last.op} -> {_short(last.result)}" if last is not None else ""
            violations.append(
                Violation(
                    CHECK_LINEARIZABILITY,
                    task,
                    f"its completes and reads are not linearizable as a write-once register{culprit}",
                    prefix,
                )
            )
    history.counts_extra["registers"] = checked
    history.counts_extra["registers_undecided"] = undecided
    return violations


def _register_operation(task: str, op: Op) -> linearizability.Operation | None:
    if op.op == "complete":
        value = canonical(written_payload(op))
        if op.status == STATUS_UNKNOWN:
            return linearizability.Operation(op.client, op.call, None, linearizability.Complete(task, value), None, op.id)
        return linearizability.Operation(op.client, op.call, op.ret, linearizability.Complete(task, value), op.ok, op.id)
    if not op.ok or op.result is None:
        return None
    seen = canonical(op.result.get("outcome")) if op.result.get("state") == SUCCEEDED else None
    return linearizability.Operation(op.client, op.call, op.ret, linearizability.Read(task), seen, op.id)


# How far a task has come, as a read shows it: missing, there (queued, leased), finished.
_TASK_MISSING, _TASK_PRESENT, _TASK_FINISHED = 0, 1, 2
_TASK_LEVEL_NAMES = {_TASK_MISSING: "missing", _TASK_PRESENT: "not finished", _TASK_FINISHED: "finished"}


def check_stale_reads(history: History) -> list[Violation]:
    """No read of a task is stale: a read called after a change to the task was acknowledged
    shows that change. A task only moves forward (missing, then there, then finished, for good), and
    each acknowledged operation puts a floor under every read called after its answer:
    - a submit (or group submit): the task exists;
    - an accepted complete: the task is finished;
    - the cancel of the task's run: the task is finished (a run's cancel finishes its tasks and
      refuses new ones);
    - a read: what it showed (a read never shows less than a read that returned before it was
      called, whichever nodes answered them).
    A read that shows less than a floor set before its call is a violation. A read shows
    "missing" when it is refused with NOT_FOUND; for a task whose run had a cancel called before
    the read answered (a stopped run is removed after its retention) that is not an observation.
    Unknown operations set no floor and are no observation; a failed one neither.
    Checks 1 and 8 cover which result a finished task shows; this one covers the reads that a
    stale replica, or a leader serving a read after it was deposed, would answer: the ones that
    miss an acknowledged write (cluster/DESIGN.md "Linearizable reads")."""
    violations = []
    cancels: dict[str, list[Op]] = defaultdict(list)
    for op in history.by_kind["cancel_run"]:
        if isinstance(op.args.get("run"), str):
            cancels[op.args["run"]].append(op)
    floors: dict[str, list[tuple[float, int, Op]]] = defaultdict(list)  # task -> (from, level, op)
    for task, submit in history.submitted_tasks():
        if submit.ret is not None:
            floors[task].append((submit.ret, _TASK_PRESENT, submit))
    reads: dict[str, list[tuple[Op, int]]] = defaultdict(list)
    for task, ops in history.task_ops.items():
        run = history.run_of_task.get(task)
        for op in ops:
            if op.op == "complete" and op.ok and op.ret is not None:
                floors[task].append((op.ret, _TASK_FINISHED, op))
            elif op.op == "read_task":
                level = _read_level(op, cancels.get(run, []) if run is not None else [])
                if level is not None:
                    reads[task].append((op, level))
                    if op.ret is not None:
                        floors[task].append((op.ret, level, op))
        for cancel in cancels.get(run, []) if run is not None else []:
            if cancel.ok and cancel.ret is not None:
                floors[task].append((cancel.ret, _TASK_FINISHED, cancel))
    checked = 0
    for task in sorted(reads):
        task_floors = sorted(floors.get(task, []), key=lambda floor: floor[0])
        for read, level in reads[task]:
            checked += 1
            before = [floor for floor in task_floors if floor[0] < read.call and floor[1] > level]
            if not before:
                continue
            _, floor_level, witness = max(before, key=lambda floor: (floor[1], floor[0]))
            violations.append(
                Violation(
                    CHECK_STALE_READS,
                    task,
                    f"read #{read.id} showed the task {_TASK_LEVEL_NAMES[level]}, but #{witness.id} {witness.op}, "
                    f"answered before the read was called, had it {_TASK_LEVEL_NAMES[floor_level]}",
                    (witness, read),
                )
            )
    history.counts_extra["task_reads"] = checked
    return violations


def _read_level(read: Op, run_cancels: list[Op]) -> int | None:
    if read.ok and read.result is not None:
        return _TASK_FINISHED if read.result.get("state") in TASK_FINISHED else _TASK_PRESENT
    if read.failed and read.error is not None and read.error.get("code") == NOT_FOUND:
        answered = read.ret if read.ret is not None else math.inf
        if any(cancel.call < answered for cancel in run_cancels):
            return None  # the stopped run may have been removed
        return _TASK_MISSING
    return None


# -- all of them ---------------------------------------------------------------------------------

def check_replays(history: History) -> list[Violation]:
    """Calls that carry one idempotency key (`idem` in their args: a retry after an unknown answer,
    or a deliberate second send of an acknowledged call) are one request: every acknowledged one
    is answered exactly as the first acknowledged one (the same run, the same task, `created` as
    the first time), so the server applied it once. Unknown and refused calls prove nothing here
    (a refusal is not remembered, and an unknown one may not have reached the server)."""
    violations = []
    by_key: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for op in history.ops:
        key = op.args.get("idem")
        if isinstance(key, str) and op.ok:
            by_key[(op.op, key)].append(op)
    for (kind, key), ops in sorted(by_key.items()):
        first = ops[0]
        for other in ops[1:]:
            if other.result != first.result:
                violations.append(
                    Violation(
                        CHECK_REPLAYS,
                        key,
                        f"{kind} with idempotency key {key} was answered {_short(first.result)} and then "
                        f"{_short(other.result)}: a retried request was applied again",
                        _ops([first, other]),
                    )
                )
    return violations


def _allowance_windows(history: History) -> list[Violation]:
    """No window of an allowance lets more than its units through: the units of the grants that
    certainly happened within one window's length (acknowledged consumes whose call and return,
    and waiters from their wait's call to the return of the read that saw them GRANTED, all lie
    in an interval shorter than the window) add up to at most `unitsLimit`."""
    violations: list[Violation] = []
    sizes = {op.result["allowanceId"]: (int(op.result["unitsLimit"]), float(op.result["windowSeconds"]))
             for op in history.by_kind["allowance_declare"] if op.ok and op.result}
    grants: dict[Any, list[tuple[float, float, int, Op]]] = defaultdict(list)  # (from, to, units, op)
    for op in history.by_kind["allowance_consume"]:
        if op.ok and op.result and op.ret is not None:
            grants[op.args.get("allowance")].append((op.call, op.ret, int(op.result["units"]), op))
    waits = {op.result["waiterId"]: op for op in history.by_kind["allowance_wait"] if op.ok and op.result}
    for op in history.by_kind["allowance_wait"]:
        if op.ok and op.result and op.result.get("state") == "GRANTED" and op.ret is not None:
            grants[op.args.get("allowance")].append((op.call, op.ret, int(op.args.get("units", 1)), op))
    seen_granted: set[Any] = set()
    for op in history.by_kind["allowance_waiter_read"]:
        waiter = op.args.get("waiterId")
        wait = waits.get(waiter)
        if op.ok and op.result and op.result.get("state") == "GRANTED" and wait is not None and waiter not in seen_granted:
            seen_granted.add(waiter)
            grants[wait.args.get("allowance")].append((wait.call, op.ret or op.call, int(wait.args.get("units", 1)), op))
    stamps = _take_stamps(history)
    for allowance, taken in grants.items():
        if allowance not in sizes:
            continue
        units, window_s = sizes[allowance]
        taken.sort(key=lambda grant: grant[0])
        noted = False
        for index, (start, _end, _units, _op) in enumerate(taken):
            inside = [grant for grant in taken[index:] if grant[1] < start + window_s]
            total = sum(grant[2] for grant in inside)
            if total <= units:
                continue
            said = f"{total} units went through within {window_s:g} s, more than its {units}"
            leader_ms = _leader_times(stamps, [grant[3] for grant in inside])
            if leader_ms is None:
                said += " (the event pages do not show when the leader took all of them)"
            else:
                span_ms = max(leader_ms) - min(leader_ms)
                said += f" (the leader stamped them at +{', +'.join(f'{ms - min(leader_ms):.0f}' for ms in leader_ms)} ms)"
                steps = forward_steps_within(history, start, max(grant[1] for grant in inside))
                if span_ms >= window_s * 1000 and steps:
                    step = steps[0]
                    # Apart by a whole window on the leader's clock, which stepped forward against the
                    # harness's meanwhile: the window held by the server's time, not by the harness's.
                    if not noted:
                        history.note(
                            f"capacity: allowance {allowance}: {said}, a whole window apart by the leader's clock, which "
                            f"moved {step.low_ms:+.0f} to {step.high_ms:+.0f} ms against the harness's between "
                            f"#{step.last_before.id} and #{step.first_after.id}: not counted as a violation"
                        )
                        noted = True
                    continue
            violations.append(Violation(CHECK_CAPACITY, str(allowance), said, _ops([grant[3] for grant in inside])))
            break
    return violations


def _take_stamps(history: History) -> dict[str, float]:
    """The leader's time (epoch ms) of every allowance take an event page shows, by its
    consumptionId and, for a waiter's grant, by its waiterId too."""
    stamps: dict[str, float] = {}
    for item in _paged_events(history):
        created_ms = epoch_ms(item.get("createdAt"))
        payload = item.get("payload") or {}
        if item.get("type") == "allowance.consumed" and created_ms is not None:
            for name in ("consumptionId", "waiterId"):
                if payload.get(name):
                    stamps[str(payload[name])] = created_ms
    return stamps


def _paged_events(history: History) -> Iterable[Mapping[str, Any]]:
    """Every event item of every acknowledged page (an event twice when two pages show it)."""
    for kind in EVENT_PAGE_OPS:
        for page in history.by_kind[kind]:
            if page.ok and page.result is not None:
                yield from page.result.get("events") or []


def _leader_times(stamps: dict[str, float], ops: list[Op]) -> list[float] | None:
    """When the leader took each grant the consumes, waits and waiter reads `ops` show (epoch
    ms), or None when an event page showed not all of them."""
    found = []
    for op in ops:
        item = (op.result or {}).get("consumptionId") if op.op == "allowance_consume" else (
            (op.result or {}).get("waiterId") if op.op == "allowance_wait" else op.args.get("waiterId"))
        if item is None or str(item) not in stamps:
            return None
        found.append(stamps[str(item)])
    return found


# How far (ms) the leader's stamps may stray from one offset to the harness's clock before the two
# clocks are taken to disagree: the leader's clock is read in whole ms.
CLOCK_AGREEMENT_MARGIN_MS = 2.0
# Stamped operations on each side of a step that fit their own offset: a step with fewer is not
# trusted to explain a window (one stamp out of line is not a step of the clock).
CLOCK_STEP_WITNESSES_MIN = 3


@dataclass(frozen=True)
class ClockStep:
    """The leader's clock moved against the harness's by `low_ms` to `high_ms` (forward when
    positive) between the calls of `last_before` and `first_after`; `witnesses` is the fewer of
    the stamped operations that fit the offset before and the offset after."""

    last_before: Op
    first_after: Op
    low_ms: float
    high_ms: float
    witnesses: int


def clock_steps(history: History) -> list[ClockStep]:
    """Where the leader's stamps (epoch ms, of the first event of each permit grant, allowance
    consume and budget reservation) move against the harness's monotonic clock. Each stamp lies
    between its call and its return, so offset = stamp - harness time lies in [stamp - ret,
    stamp - call]; in call order, a run of operations whose ranges share a point had one offset,
    and the next operation that fits no point of it starts a new run: a step of one clock (the
    nodes' wall clock, corrected; or the harness's monotonic clock, which misses the time a paused
    machine stood still). Checks that compare a duration of the harness with one of the server
    misjudge by the step."""
    if history.steps is None:
        history.steps = _find_clock_steps(history)
    return history.steps


def _find_clock_steps(history: History) -> list[ClockStep]:
    items = {"allowance.consumed": "consumptionId", "permit.granted": "grantId", "budget.reserved": "reservationId"}
    kinds = {"allowance_consume": "consumptionId", "permit_acquire": "grantId", "budget_reserve": "reservationId"}
    ops: dict[str, Op] = {}
    for kind, name in kinds.items():
        for op in history.by_kind[kind]:
            if op.ok and op.result and op.ret is not None and op.result.get(name):
                ops[str(op.result[name])] = op
    bounds: list[tuple[float, float, Op]] = []  # (lowest, highest offset in ms, op)
    for item in _paged_events(history):
        item_field, created_ms = items.get(str(item.get("type"))), epoch_ms(item.get("createdAt"))
        stamped = ops.pop(str((item.get("payload") or {}).get(item_field)), None) if item_field is not None else None
        if stamped is not None and created_ms is not None and stamped.ret is not None:
            bounds.append((created_ms - stamped.ret * 1000, created_ms - stamped.call * 1000, stamped))
    bounds.sort(key=lambda bound: (bound[2].call, bound[2].id))
    runs: list[tuple[float, float, list[Op]]] = []  # (lowest, highest offset, its operations)
    for low, high, op in bounds:
        if runs and max(runs[-1][0], low) <= min(runs[-1][1], high) + CLOCK_AGREEMENT_MARGIN_MS:
            runs[-1][2].append(op)
            runs[-1] = (max(runs[-1][0], low), min(runs[-1][1], high), runs[-1][2])
        else:
            runs.append((low, high, [op]))
    return [
        ClockStep(before[2][-1], after[2][0], after[0] - before[1], after[1] - before[0], min(len(before[2]), len(after[2])))
        for before, after in itertools.pairwise(runs)
    ]


def forward_steps_within(history: History, start: float, end: float) -> list[ClockStep]:
    """The forward steps of the leader's clock (with their witnesses) that may fall between `start`
    and `end` (the harness's clock): one happened between its two operations' stamps."""
    return [
        step for step in clock_steps(history)
        if step.low_ms > 0 and step.witnesses >= CLOCK_STEP_WITNESSES_MIN
        and step.last_before.call < end and (step.first_after.ret or step.first_after.call) > start
    ]


def note_clock_steps(history: History) -> None:
    for step in clock_steps(history):
        history.note(
            f"clock: the leader's clock moved {step.low_ms:+.0f} to {step.high_ms:+.0f} ms against the harness's between "
            f"#{step.last_before.id} and #{step.first_after.id} ({step.witnesses} stamped operations on the smaller "
            "side): durations the harness measured across it differ from the server's by that much"
        )


def check_capacity(history: History) -> list[Violation]:
    """A permit never grants more units than it has.

    Proves, per permit: at no moment do the grants certainly held add up to more than its
    `unitsTotal` (from its declare). A grant acknowledged by an acquire is certainly held from the
    acquire's return until the earliest of: its lease's end counted from the acquire's call (the
    server starts the lease later, at its command time, so it ends later too; minus
    CAPACITY_CLOCK_MARGIN_S, and minus every forward step of the leader's clock that may fall
    within it: forward_steps_within), the call of a release of it (acknowledged or unknown: it may
    have taken effect at once), and the call of a cancel of its run (acknowledged or unknown). Unknown
    acquires hold nothing certain and are not counted. Also: every view read shows at most
    `unitsTotal` units in use, equal to the sum of its grants; no acquire called after its run's
    cancel was acknowledged is acknowledged; the final view (read after every lease ran out)
    holds no unit. And per allowance (_allowance_windows): no window lets more than its units
    through, counting only grants that certainly fell within one window (unknown consumes and
    waiters never seen GRANTED count nothing).
    """
    violations: list[Violation] = []
    totals = {op.result["permitId"]: int(op.result["unitsTotal"]) for op in history.by_kind["permit_declare"]
              if op.ok and op.result}
    cancels: dict[Any, list[Op]] = defaultdict(list)
    for op in history.by_kind["cancel_run"]:
        if op.may_have_happened:
            cancels[op.args.get("run")].append(op)
    releases: dict[Any, list[Op]] = defaultdict(list)
    for op in history.by_kind["permit_release"]:
        if op.may_have_happened:
            releases[op.args.get("grantId")].append(op)
    # (time, +units | -units, op) per permit; at one time an end comes before a start.
    edges: dict[Any, list[tuple[float, int, Op]]] = defaultdict(list)
    for op in history.by_kind["permit_acquire"]:
        if not (op.ok and op.result) or op.ret is None:
            continue
        run = op.args.get("run")
        stopped_before = [cancel for cancel in cancels[run] if cancel.ok and cancel.ret is not None and cancel.ret < op.call]
        if stopped_before:
            violations.append(Violation(
                CHECK_CAPACITY, str(op.result["grantId"]),
                f"an acquire on run {run} was granted after its cancel was acknowledged", _ops(stopped_before[:1], [op]),
            ))
        end = op.call + float(op.args.get("leaseMs", 0)) / 1000 - CAPACITY_CLOCK_MARGIN_S
        # The lease runs on the leader's clock: a forward step of it within the lease ends it sooner.
        end -= sum(step.high_ms for step in forward_steps_within(history, op.call, end)) / 1000
        for other in releases[op.result["grantId"]] + cancels[run]:
            if other.call >= op.call:
                end = min(end, other.call)
        if end > op.ret:
            units = int(op.result["units"])
            edges[op.args.get("permit")] += [(op.ret, units, op), (end, -units, op)]
    for permit, permit_edges in edges.items():
        total = totals.get(permit)
        if total is None:
            history.notes.append(f"capacity: permit {permit} has no acknowledged declare; its size is unknown")
            continue
        held, holding = 0, {}
        for _time, change, op in sorted(permit_edges, key=lambda edge: (edge[0], edge[1])):
            held += change
            if change > 0:
                holding[op.id] = op
            else:
                holding.pop(op.id, None)
            if held > total:
                violations.append(Violation(
                    CHECK_CAPACITY, str(permit), f"grants certainly held add up to {held} units of {total}",
                    _ops(sorted(holding.values(), key=lambda held_op: held_op.call)),
                ))
                break
    for op in history.by_kind["permit_read"]:
        if op.ok and op.result:
            in_use, total = int(op.result["unitsInUse"]), int(op.result["unitsTotal"])
            granted = sum(int(units) for _grant, units in op.result["grants"])
            if in_use > total or granted != in_use:
                violations.append(Violation(
                    CHECK_CAPACITY, str(op.args.get("permit")),
                    f"a view shows {in_use} of {total} units in use, its grants {granted}", (op,),
                ))
    violations += _allowance_windows(history)
    finals = history.finals.get("permit", {})
    if totals and not finals:
        history.notes.append("capacity: no final view of a permit")
    for permit, view in finals.items():
        if isinstance(view, dict) and "error" not in view and view.get("unitsInUse") != 0:
            violations.append(Violation(
                CHECK_CAPACITY, permit, f"after every lease ran out the permit still has {view.get('unitsInUse')} units in use",
            ))
    return violations


def _money_balanced(view: Mapping[str, Any]) -> str | None:
    """What is wrong with a budget view's sums, or None."""
    limit, settled = int(view["limitMinor"]), int(view["settledMinor"])
    reserved, remaining = int(view["reservedMinor"]), int(view["remainingMinor"])
    if settled + reserved + remaining != limit or min(settled, reserved, remaining) < 0:
        return f"settled {settled} + reserved {reserved} + remaining {remaining} is not its limit {limit}"
    if "held" in view and int(view["held"]) != reserved:
        return f"its open reservations hold {view['held']}, its reserved is {reserved}"
    return None


def check_money(history: History) -> list[Violation]:
    """A budget's money is never created or lost.

    Proves, per budget: every view read (and the final view) has settled + reserved + remaining =
    limit, none negative, and reserved = what its open reservations hold; settled never goes down
    (a view read after another returned shows at least its settled); the final settled is at
    least the sum of the charges acknowledged settles answered (one per reservation and workKey:
    a retried settle charges once) and at most that plus what the settles of unknown outcome asked.
    An unknown settle may have charged anything up to its ask, or nothing.
    """
    violations: list[Violation] = []
    limits_of = {op.result["budgetId"]: int(op.result["limitMinor"]) for op in history.by_kind["budget_declare"]
                 if op.ok and op.result}
    reads: dict[Any, list[Op]] = defaultdict(list)
    for op in history.by_kind["budget_read"]:
        if op.ok and op.result:
            reads[op.args.get("budget")].append(op)
            problem = _money_balanced(op.result)
            if problem is not None:
                violations.append(Violation(CHECK_MONEY, str(op.args.get("budget")), f"a view: {problem}", (op,)))
    for budget, budget_reads in reads.items():
        for earlier in budget_reads:
            later = next((op for op in budget_reads if op.call > (earlier.ret or math.inf)
                          and int(op.result["settledMinor"]) < int(earlier.result["settledMinor"])), None)  # type: ignore[index]
            if later is not None:
                violations.append(Violation(CHECK_MONEY, str(budget), "settled went down between two reads", (earlier, later)))
                break
    charged: dict[Any, dict[tuple[Any, Any], int]] = defaultdict(dict)  # budget -> (reservation, workKey) -> charge
    asked: dict[Any, dict[tuple[Any, Any], int]] = defaultdict(dict)  # of settles whose outcome is unknown
    for op in history.by_kind["budget_settle"]:
        key = (op.args.get("reservationId"), op.args.get("workKey"))
        budget = op.args.get("budget")
        if op.ok and op.result:
            charged[budget][key] = int(op.result["chargedMinor"])
        elif op.may_have_happened:
            asked[budget][key] = max(asked[budget].get(key, 0), int(op.args.get("amountMinor", 0)))
    for budget, view in history.finals.get("budget", {}).items():
        if not isinstance(view, dict) or "error" in view:
            continue
        final = {**view, "held": sum(int(r["reservedMinor"]) for r in view.get("reservations", [])
                                     if r.get("state") in ("ACTIVE", "STALE"))}
        problem = _money_balanced(final)
        if problem is not None:
            violations.append(Violation(CHECK_MONEY, budget, f"the final view: {problem}"))
        known = sum(charged[budget].values())
        unknown = sum(amount for key, amount in asked[budget].items() if key not in charged[budget])
        settled = int(view["settledMinor"])
        if not known <= settled <= known + unknown:
            violations.append(Violation(
                CHECK_MONEY, budget,
                f"settled {settled} at the end, but acknowledged settles charged {known} (and unknown ones asked {unknown})",
            ))
        if budget in limits_of and int(view["limitMinor"]) != limits_of[budget]:
            violations.append(Violation(CHECK_MONEY, budget, "its limit changed"))
    return violations


# -- 12. events ----------------------------------------------------------------------------------

# Pages of the space's event log: the watchers' long polls and finalize's read of the rest.
EVENT_PAGE_OPS = ("watch", "events_read")
RUN_STOP_EVENTS = ("scope.cancelled", "scope.completed", "scope.expired")
TASK_EVENT_STATES = {
    "task.queued": "QUEUED", "task.running": "RUNNING", "task.succeeded": SUCCEEDED, "task.failed": "FAILED",
    "task.cancelled": CANCELLED, "task.expired": "EXPIRED",
}
# Violations of one kind reported before the rest are summed up in a note.
EVENT_VIOLATIONS_PER_KIND_MAX = 20


@dataclass(frozen=True)
class LoggedEvent:
    """One event of the space's log as a page showed it (the first page that did)."""

    seq: int
    type: str
    aggregate: tuple[str, str]
    scope: str | None
    payload: Mapping[str, Any]
    created_ms: float | None
    op: Op

    @property
    def entity(self) -> str:
        return self.aggregate[1]

    def __str__(self) -> str:
        return f"#{self.seq} {self.type} {self.aggregate[0]}:{self.aggregate[1]} {_short(self.payload)}"


@dataclass
class _EventLog:
    """The events seen, by number; `complete`: every number from 1 to the last one seen was seen
    (nothing fell out of the bounded log before a page read it); `read_to_end_at`: the latest call
    of a page that found nothing after its cursor (the log, at some moment after that call, held
    nothing the pages had not seen), -inf when none did."""

    events: dict[int, LoggedEvent]
    complete: bool
    read_to_end_at: float = -math.inf
    by_entity: dict[tuple[str, str], list[LoggedEvent]] = field(default_factory=dict)
    parent: dict[str, str] = field(default_factory=dict)  # run -> its parent run (scope.created, group_create)

    def of(self, kind: str, entity: Any) -> list[LoggedEvent]:
        return self.by_entity.get((kind, str(entity)), [])

    def typed(self, kind: str, entity: Any, event_type: str) -> list[LoggedEvent]:
        return [event for event in self.of(kind, entity) if event.type == event_type]

    def run_and_ancestors(self, run: str | None) -> list[str]:
        found: list[str] = []
        while run is not None and run not in found:
            found.append(run)
            run = self.parent.get(run)
        return found

    def stopped_before(self, run: str | None, seq: int) -> LoggedEvent | None:
        """The stop event of `run` or of a run above it that precedes event `seq`, if any."""
        for member in self.run_and_ancestors(run):
            for event in self.of("scope", member):
                if event.type in RUN_STOP_EVENTS and event.seq < seq:
                    return event
        return None


def check_events(history: History) -> list[Violation]:
    """The space's event log, as the watchers and the final read saw it, is one sequence, holds
    no event of something that did not happen, and holds every acknowledged change once, in order.

    Proves: (a) every page (a watch or a read of the rest, acknowledged) holds consecutive events
    starting right after its cursor (the oldest kept without one), and its nextCursor is its last
    event (its cursor when empty): a chain of pages resumed from each page's cursor, also on
    another node after an unknown page (a failover), loses and repeats nothing; one event number
    (and one eventId) always shows the same content, on every node. (b) no event without a cause
    the history allows: scope.created of a run an acknowledged create (or group create) named, or
    no more unnamed ones than creates of unknown outcome; task.created likewise (of the submit's
    run); task.running of a delivery an acknowledged receive got (same attempt) or after a receive
    of unknown outcome on its run; delivery.lease_lost not before the lease's end an acknowledged
    receive or renew named (server times); task.succeeded after a complete of the task
    acknowledged or unknown; scope.cancelled after a cancel of the run acknowledged or unknown, or its group's
    group.finalized; task.cancelled after its run (or a run above) stopped in the log;
    scope.completed, scope.expired and task.expired never (the workload neither completes runs
    nor sets deadlines); group.finalized, barrier.released, timer.fired only of entities created,
    once (per epoch), a barrier after `target` distinct arrivals acknowledged or unknown, a timer
    not before its fireAt nor after its run's stop; and per task and run the events follow the
    state machine (task.created first, task.running only from QUEUED, task.succeeded only from
    RUNNING, delivery.lease_lost then task.queued or task.failed, nothing after the end; no task
    created or started in a run after its stop). (c) every acknowledged change has its event
    exactly once: a run's create, a submit's task, an accepted complete, a cancel, a delivery (at
    least once per attempt), a timer seen FIRED, a group seen FINALIZED (with that decision), a
    barrier seen RELEASED; and when one such change was acknowledged before another was first
    called, its event comes first in the log.

    Permits, allowances and budgets (the workload's clients of checks 10 and 11), the same way:
    (b) permit.granted of a grant an acknowledged acquire named (with its units; no more unnamed
    ones than acquires of unknown outcome), and not after its run stopped; permit.released after a
    release of the grant (acknowledged or unknown), or with reason scope_stopped after its run's
    stop; permit.lease_lost not before the lease's end the acquire acknowledged;
    permit.waiter_signaled of a waiter a wait named (or after a wait of unknown outcome);
    allowance.consumed of a consume's consumption, or of a waiter a wait named; budget.reserved of
    an acknowledged reserve's reservation (its amount); budget.settled after a settle of that
    reservation and workKey; budget.voided after a void of it, or with reason scope_stopped after
    its run's stop; budget.stale not before an hour after its reserve; allowance.settled and
    allowance.cooldown never (the workload calls neither); per grant and reservation: granted
    (reserved) first, one end (released or lease_lost; voided, or a settle that ends it), nothing
    after it; a consumption consumed once. (c) an acknowledged acquire, release, consume, reserve,
    settle (per workKey) and void each has its event once; and an acknowledged cancel of a run
    has a stop event of every run known below it (scope.cancelled naming it as stoppedBy, or the
    run's own earlier stop).

    Unknown operations are never violations: they explain events (b) and need none (c). An event
    an acknowledged change needs is a violation only when the pages saw the log whole from its
    first event (else it may have fallen out of the bounded log: a note). Pages refused with
    CURSOR_EXPIRED are counted, not violations.
    """
    pages = [op for kind in EVENT_PAGE_OPS for op in history.by_kind[kind] if op.ok and op.result is not None]
    expired = sum(1 for kind in EVENT_PAGE_OPS for op in history.by_kind[kind] if op.code == "CURSOR_EXPIRED")
    history.counts_extra["event_pages"] = len(pages)
    history.counts_extra["event_cursors_expired"] = expired
    if not pages:
        history.note("events: no page of the event log was read; nothing checked")
        return []
    violations, log = _event_sequence(history, sorted(pages, key=lambda op: (op.call, op.id)))
    history.counts_extra["events_seen"] = len(log.events)
    _resumes(history)
    violations += _events_unexplained(history, log)
    violations += _events_out_of_order(log)
    violations += _changes_without_event(history, log)
    return _bounded(history, violations)


def _bounded(history: History, violations: list[Violation]) -> list[Violation]:
    """At most EVENT_VIOLATIONS_PER_KIND_MAX violations of each message kind (one cause tends to
    repeat); the rest are counted in a note."""
    shown: Counter[str] = Counter()
    kept = []
    for violation in violations:
        kind = re.sub(r"[0-9]+", "#", violation.message.split(":", 1)[0])[:60]
        shown[kind] += 1
        if shown[kind] <= EVENT_VIOLATIONS_PER_KIND_MAX:
            kept.append(violation)
    left = sum(shown.values()) - len(kept)
    if left:
        history.note(f"events: {left} more violations like the ones shown")
    return kept


def _event_content(item: Mapping[str, Any]) -> str:
    return canonical({name: item.get(name) for name in (
        "eventId", "type", "aggregateType", "aggregateId", "scopeId", "payload", "createdAt")})


def _event_sequence(history: History, pages: list[Op]) -> tuple[list[Violation], _EventLog]:
    """(a): each page against its cursor; one content per event number and per eventId."""
    violations: list[Violation] = []
    events: dict[int, LoggedEvent] = {}
    contents: dict[int, tuple[str, Op]] = {}
    numbers: dict[str, tuple[int, Op]] = {}
    for page in pages:
        assert page.result is not None
        cursor = page.args.get("cursor")
        items = list(page.result.get("events") or [])
        next_cursor = page.result.get("nextCursor")
        first = int(cursor) + 1 if cursor is not None else (int(items[0]["seq"]) if items else None)
        for index, item in enumerate(items):
            seq = int(item["seq"])
            if first is not None and seq != first + index:
                violations.append(Violation(
                    CHECK_EVENTS, f"page #{page.id}",
                    f"a page from cursor {cursor} holds event {seq} where {first + index} comes next: events lost or "
                    "repeated", (page,),
                ))
                break
        last = int(items[-1]["seq"]) if items else (int(cursor) if cursor is not None else None)
        if next_cursor is not None and last is not None and int(next_cursor) != last:
            violations.append(Violation(
                CHECK_EVENTS, f"page #{page.id}",
                f"a page from cursor {cursor} ending at event {last} names nextCursor {next_cursor}: resuming there "
                "would lose or repeat events", (page,),
            ))
        for item in items:
            seq, content = int(item["seq"]), _event_content(item)
            if seq in contents and contents[seq][0] != content:
                violations.append(Violation(
                    CHECK_EVENTS, f"event {seq}", f"two pages show event {seq} differently: {_short(json.loads(content))} "
                    f"and {_short(json.loads(contents[seq][0]))}", (contents[seq][1], page),
                ))
            contents.setdefault(seq, (content, page))
            event_id = str(item.get("eventId"))
            if event_id in numbers and numbers[event_id][0] != seq:
                violations.append(Violation(
                    CHECK_EVENTS, event_id, f"eventId {event_id} names events {numbers[event_id][0]} and {seq}",
                    (numbers[event_id][1], page),
                ))
            numbers.setdefault(event_id, (seq, page))
            if seq not in events:
                events[seq] = LoggedEvent(
                    seq, str(item.get("type")), (str(item.get("aggregateType")), str(item.get("aggregateId"))),
                    item.get("scopeId"), item.get("payload") or {}, epoch_ms(item.get("createdAt")), page,
                )
    seen = sorted(events)
    complete = bool(seen) and seen[0] == 1 and seen[-1] == len(seen)
    if seen and not complete:
        holes = seen[-1] - len(seen)
        history.note(
            f"events: {holes} of events 1 to {seen[-1]} were seen by no page (dropped from the bounded log before a "
            "page read them, or read only by pages of unknown outcome): a change without its event is a note"
        )
    read_to_end_at = max((page.call for page in pages if not (page.result or {}).get("events")), default=-math.inf)
    log = _EventLog({seq: events[seq] for seq in seen}, complete, read_to_end_at)
    for event in log.events.values():
        log.by_entity.setdefault(event.aggregate, []).append(event)
        if event.type == "scope.created" and event.payload.get("parentId"):
            log.parent[event.entity] = str(event.payload["parentId"])
    for op in history.by_kind["group_create"]:
        if op.ok and op.result and op.args.get("run") and op.result.get("scopeId"):
            log.parent.setdefault(str(op.result["scopeId"]), str(op.args["run"]))
    return violations, log


def _resumes(history: History) -> None:
    """Count the pages resumed from a cursor on another node after a page of unknown outcome (a
    failover), and those resumed from an older cursor: what the per-page check covered."""
    failovers = older = 0
    by_client: dict[str, list[Op]] = defaultdict(list)
    for op in history.by_kind["watch"]:
        by_client[op.client].append(op)
    for ops in by_client.values():
        for before, page in zip(ops, ops[1:], strict=False):
            if page.ok and page.args.get("cursor") is not None:
                if before.status == STATUS_UNKNOWN and page.args.get("node") != before.args.get("node"):
                    failovers += 1
                if page.args.get("resume") == "older":
                    older += 1
    history.counts_extra["event_failover_resumes"] = failovers
    history.counts_extra["event_older_resumes"] = older


def _may_have(ops: Iterable[Op]) -> list[Op]:
    return [op for op in ops if op.may_have_happened]


def _unresolved(ops: Iterable[Op], key: Callable[[Op], Any]) -> int:
    """How many calls (one per key: retries of one call share it) may have made an entity whose id
    no answer named: some attempt of unknown outcome, none acknowledged."""
    by_key: dict[Any, list[Op]] = defaultdict(list)
    for op in ops:
        by_key[key(op)].append(op)
    return sum(1 for group in by_key.values()
               if any(op.status == STATUS_UNKNOWN for op in group) and not any(op.ok for op in group))


def _events_unexplained(history: History, log: _EventLog) -> list[Violation]:
    """(b): every event has a cause the history allows."""
    violations: list[Violation] = []
    created_runs: dict[str, Op] = {}
    for op in history.by_kind["run_create"]:
        if op.ok and op.result and op.result.get("run"):
            created_runs.setdefault(str(op.result["run"]), op)
    for op in history.by_kind["group_create"]:
        if op.ok and op.result and op.result.get("scopeId"):
            created_runs.setdefault(str(op.result["scopeId"]), op)
    unknown_runs = _unresolved(history.by_kind["run_create"], lambda op: op.args.get("idem") or op.id) + sum(
        1 for op in history.by_kind["group_create"] if op.status == STATUS_UNKNOWN)
    group_runs = {op.result["groupId"]: str(op.result["scopeId"]) for op in history.by_kind["group_create"]
                  if op.ok and op.result and op.result.get("groupId")}
    submitted: dict[str, tuple[Op, str | None]] = {}
    for task, op in history.submitted_tasks():
        run = op.args.get("run") if op.op == "submit" else group_runs.get(op.args.get("groupId"))
        submitted.setdefault(str(task), (op, run))
    unknown_tasks = _unresolved(history.by_kind["submit"], lambda op: (op.args.get("run"), op.args.get("key"))) + _unresolved(
        history.by_kind["group_submit"], lambda op: (op.args.get("groupId"), op.args.get("key")))
    deliveries: dict[tuple[str, Any], list[Delivery]] = defaultdict(list)
    for delivery in history.deliveries.values():
        attempt = next((item.get("attempt") for item in (delivery.receive.result or {}).get("deliveries") or []
                        if item.get("id") == delivery.id), None)
        deliveries[(delivery.task, attempt)].append(delivery)
        deliveries[(delivery.task, None)].append(delivery)
    unknown_receives = {op.args.get("run") for op in history.by_kind["receive"] if op.status == STATUS_UNKNOWN}
    completes: dict[str, list[Op]] = defaultdict(list)
    for op in history.by_kind["complete"]:
        completes[str(history.task_of(op))].append(op)
    cancels: dict[str, list[Op]] = defaultdict(list)
    for op in history.by_kind["cancel_run"]:
        cancels[str(op.args.get("run"))].append(op)
    groups = {str(op.result["groupId"]): op for op in history.by_kind["group_create"] if op.ok and op.result}
    barriers = {str(op.result["barrierId"]): op for op in history.by_kind["barrier_create"] if op.ok and op.result}
    timers = {str(op.result["timerId"]): op for op in history.by_kind["timer_create"] if op.ok and op.result}
    unknown_creates = {kind: any(op.status == STATUS_UNKNOWN for op in history.by_kind[kind])
                       for kind in ("group_create", "barrier_create", "timer_create")}
    arrivals: dict[str, set[Any]] = defaultdict(set)
    for op in _may_have(history.by_kind["arrive"]):
        arrivals[str(op.args.get("barrierId"))].add(op.args.get("key"))
    unnamed: dict[str, list[LoggedEvent]] = defaultdict(list)

    def wrong(event: LoggedEvent, message: str, *ops: Op) -> None:
        violations.append(Violation(CHECK_EVENTS, f"{event.aggregate[0]} {event.entity}", f"{message}: {event}",
                                    _ops([event.op], ops)))

    for event in log.events.values():
        kind, entity = event.type, event.entity
        if kind == "scope.created":
            if entity not in created_runs:
                unnamed[kind].append(event)
        elif kind == "task.created":
            if entity not in submitted:
                unnamed[kind].append(event)
            elif submitted[entity][1] is not None and event.scope != submitted[entity][1]:
                wrong(event, f"task.created in run {event.scope}, but its submit named run {submitted[entity][1]}",
                      submitted[entity][0])
        elif kind == "task.running":
            attempt = event.payload.get("attempt")
            if not deliveries.get((entity, attempt)) and not deliveries.get((entity, None)) and event.scope not in unknown_receives:
                wrong(event, "task.running without a receive that got the task (acknowledged, or unknown on its run)")
        elif kind == "delivery.lease_lost":
            valid_until = _lease_valid_until(history, deliveries.get((entity, event.payload.get("attempt")), []))
            if valid_until is not None and event.created_ms is not None and event.created_ms < valid_until:
                wrong(event, f"delivery.lease_lost at {event.created_ms:.0f}, but the lease was acknowledged valid "
                      f"until {valid_until:.0f}", *[delivery.receive for delivery in deliveries[(entity, event.payload.get("attempt"))]])
        elif kind == "task.succeeded":
            if not _may_have(completes.get(entity, [])):
                wrong(event, "task.succeeded without a complete of the task (acknowledged or unknown)",
                      *completes.get(entity, []))
        elif kind == "scope.cancelled":
            finalized = [other for other in log.events.values() if other.type == "group.finalized"
                         and other.scope == entity and other.seq < event.seq]
            stopped_by = event.payload.get("stoppedBy")
            if stopped_by not in (None, entity):
                above = log.run_and_ancestors(log.parent.get(entity))
                stop = log.stopped_before(stopped_by, event.seq) if stopped_by in above else None
                if stop is None or stop.entity != stopped_by:
                    wrong(event, f"scope.cancelled by the stop of run {stopped_by}, which is not a run above it stopped before it")
            elif not _may_have(cancels.get(entity, [])) and not finalized:
                wrong(event, "scope.cancelled without a cancel of the run (acknowledged or unknown) or its group's decision",
                      *cancels.get(entity, []))
        elif kind == "task.cancelled":
            if log.stopped_before(event.scope, event.seq) is None and log.complete:
                wrong(event, "task.cancelled although no stop of its run (or a run above it) precedes it in the log")
        elif kind in ("scope.completed", "scope.expired", "task.expired"):
            wrong(event, f"{kind} although the workload neither completes runs nor sets deadlines")
        elif kind == "group.finalized":
            if entity not in groups and not unknown_creates["group_create"]:
                wrong(event, "group.finalized of a group no create named")
        elif kind == "barrier.released":
            create = barriers.get(entity)
            if create is None and not unknown_creates["barrier_create"]:
                wrong(event, "barrier.released of a barrier no create named")
            target = (create.result or {}).get("target", create.args.get("target")) if create is not None else None
            if target is not None and len(arrivals[entity]) < int(target):
                wrong(event, f"barrier.released after {len(arrivals[entity])} distinct arrivals of {target}", create)  # type: ignore[arg-type]
        elif kind == "timer.fired":
            create = timers.get(entity)
            if create is None and not unknown_creates["timer_create"]:
                wrong(event, "timer.fired of a timer no create named")
            fire_at = epoch_ms((create.result or {}).get("fireAt")) if create is not None else None
            if fire_at is not None and event.created_ms is not None and event.created_ms < fire_at:
                wrong(event, f"timer.fired at {event.created_ms:.0f}, before its fireAt {fire_at:.0f}", create)  # type: ignore[arg-type]
            stop = log.stopped_before(event.scope, event.seq)
            if stop is not None:
                wrong(event, f"timer.fired after its run stopped (event {stop.seq} {stop.type})")
    violations += _resource_events_unexplained(history, log, unnamed)
    unknown_grants = _unresolved(history.by_kind["permit_acquire"], lambda op: op.id)
    unknown_consumes = _unresolved(history.by_kind["allowance_consume"], lambda op: op.id)
    unknown_reserves = _unresolved(history.by_kind["budget_reserve"], lambda op: op.id)
    for kind, budget in (("scope.created", unknown_runs), ("task.created", unknown_tasks),
                         ("permit.granted", unknown_grants), ("allowance.consumed", unknown_consumes),
                         ("budget.reserved", unknown_reserves)):
        if len(unnamed[kind]) > budget:
            shown = unnamed[kind][:REPORT_OPS_MAX]
            violations.append(Violation(
                CHECK_EVENTS, kind, f"{len(unnamed[kind])} {kind} events of entities no answer named, but only {budget} "
                f"calls of unknown outcome could have made them: {', '.join(str(event) for event in shown)}",
                _ops([event.op for event in shown]),
            ))
    return violations


# The events of permits, allowances and budgets are about the resource (aggregate permit:<id>,
# allowance:<id>, budget:<id>); their payloads name the item they change.
RESOURCE_ITEMS = {"permit": "grantId", "allowance": "consumptionId", "budget": "reservationId"}
GRANT_ENDS = ("permit.released", "permit.lease_lost")
BUDGET_SETTLE_BY_DEFAULT_MS = 3_600_000  # the workload reserves with the default settleBy: now + 1 h


def _resource_events_unexplained(history: History, log: _EventLog, unnamed: dict[str, list[LoggedEvent]]) -> list[Violation]:
    """(b) for permits, allowances and budgets (see check_events). Events of items no answer named
    go to `unnamed`, to be weighed against the calls of unknown outcome."""
    violations: list[Violation] = []

    def wrong(event: LoggedEvent, message: str, *ops: Op) -> None:
        violations.append(Violation(CHECK_EVENTS, f"{event.aggregate[0]} {event.entity}", f"{message}: {event}",
                                    _ops([event.op], ops)))

    def named(kind: str, id_name: str) -> dict[str, Op]:
        return {str(op.result[id_name]): op for op in history.by_kind[kind] if op.ok and op.result and op.result.get(id_name)}

    grants, consumes, reserves = named("permit_acquire", "grantId"), named("allowance_consume", "consumptionId"), named(
        "budget_reserve", "reservationId")
    permit_waits, allowance_waits = named("permit_wait", "waiterId"), named("allowance_wait", "waiterId")
    unknown_waits = {kind: any(op.status == STATUS_UNKNOWN for op in history.by_kind[kind])
                     for kind in ("permit_wait", "allowance_wait")}
    releases: dict[str, list[Op]] = defaultdict(list)
    for op in history.by_kind["permit_release"]:
        releases[str(op.args.get("grantId"))].append(op)
    settles: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for op in history.by_kind["budget_settle"]:
        settles[(str(op.args.get("reservationId")), str(op.args.get("workKey")))].append(op)
    voids: dict[str, list[Op]] = defaultdict(list)
    for op in history.by_kind["budget_void"]:
        voids[str(op.args.get("reservationId"))].append(op)
    reserved_at = {str(event.payload.get("reservationId")): event for event in log.events.values() if event.type == "budget.reserved"}

    def after_stop(event: LoggedEvent, what: str) -> None:
        if log.complete and log.stopped_before(event.scope, event.seq) is None:
            wrong(event, f"{what} with reason scope_stopped, but no stop of its run precedes it in the log")

    for event in log.events.values():
        kind, payload = event.type, event.payload
        if kind == "permit.granted":
            acquire = grants.get(str(payload.get("grantId")))
            if acquire is None:
                unnamed[kind].append(event)
            elif payload.get("units") != (acquire.result or {}).get("units"):
                wrong(event, f"permit.granted of {payload.get('units')} units, the acquire got {(acquire.result or {}).get('units')}",
                      acquire)
            stop = log.stopped_before(event.scope, event.seq)
            if stop is not None:
                wrong(event, f"permit.granted after its run stopped (event {stop.seq} {stop.type})")
        elif kind == "permit.released":
            reason = payload.get("reason")
            if reason == "scope_stopped":
                after_stop(event, "permit.released")
            elif reason != "released" or not _may_have(releases.get(str(payload.get("grantId")), [])):
                wrong(event, f"permit.released ({reason}) without a release of the grant (acknowledged or unknown)")
        elif kind == "permit.lease_lost":
            acquire = grants.get(str(payload.get("grantId")))
            expires = (acquire.result or {}).get("leaseExpiresAt") if acquire is not None else None
            if expires is not None and event.created_ms is not None and event.created_ms < float(expires):
                wrong(event, f"permit.lease_lost at {event.created_ms:.0f}, but the grant was acknowledged valid until "
                      f"{float(expires):.0f}", acquire)  # type: ignore[arg-type]
        elif kind == "permit.waiter_signaled":
            if str(payload.get("waiterId")) not in permit_waits and not unknown_waits["permit_wait"]:
                wrong(event, "permit.waiter_signaled of a waiter no wait named")
        elif kind == "allowance.consumed":
            waiter = payload.get("waiterId")
            if waiter is not None:
                if str(waiter) not in allowance_waits and not unknown_waits["allowance_wait"]:
                    wrong(event, "allowance.consumed for a waiter no wait named")
            else:
                consume = consumes.get(str(payload.get("consumptionId")))
                if consume is None:
                    unnamed[kind].append(event)
                elif payload.get("units") != (consume.result or {}).get("units"):
                    wrong(event, f"allowance.consumed of {payload.get('units')} units, the consume took "
                          f"{(consume.result or {}).get('units')}", consume)
        elif kind in ("allowance.settled", "allowance.cooldown"):
            wrong(event, f"{kind} although the workload neither settles consumptions nor cools allowances down")
        elif kind == "budget.reserved":
            reserve = reserves.get(str(payload.get("reservationId")))
            if reserve is None:
                unnamed[kind].append(event)
            elif int(payload.get("amountMinor") or -1) != int((reserve.result or {}).get("reservedMinor", -2)):
                wrong(event, f"budget.reserved of {payload.get('amountMinor')}, the reserve held "
                      f"{(reserve.result or {}).get('reservedMinor')}", reserve)
        elif kind == "budget.settled":
            if not _may_have(settles.get((str(payload.get("reservationId")), str(payload.get("workKey"))), [])):
                wrong(event, "budget.settled without a settle of the reservation under that workKey (acknowledged or unknown)")
        elif kind == "budget.voided":
            reason = payload.get("reason")
            if reason == "scope_stopped":
                after_stop(event, "budget.voided")
            elif reason != "voided" or not _may_have(voids.get(str(payload.get("reservationId")), [])):
                wrong(event, f"budget.voided ({reason}) without a void of the reservation (acknowledged or unknown)")
        elif kind == "budget.stale":
            reserved = reserved_at.get(str(payload.get("reservationId")))
            if reserved is not None and reserved.created_ms is not None and event.created_ms is not None and (
                event.created_ms < reserved.created_ms + BUDGET_SETTLE_BY_DEFAULT_MS
            ):
                wrong(event, f"budget.stale before its settleBy (reserved at event {reserved.seq})")
    return violations


def _item_order(kind: str, events: list[LoggedEvent], log: _EventLog, wrong: Callable[[LoggedEvent, str], None]) -> None:
    """(b), per grant, consumption or reservation of one resource: made first, one end, nothing after."""
    items: dict[str, list[LoggedEvent]] = defaultdict(list)
    for event in events:
        if RESOURCE_ITEMS[kind] in event.payload:
            items[str(event.payload[RESOURCE_ITEMS[kind]])].append(event)
    first_type = {"permit": "permit.granted", "allowance": "allowance.consumed", "budget": "budget.reserved"}[kind]
    for item_events in items.values():
        ended: LoggedEvent | None = None
        for index, event in enumerate(item_events):
            if event.type == first_type and index > 0:
                wrong(event, f"{first_type} again (first event of it: {item_events[0].seq})")
            elif index == 0 and event.type != first_type and log.complete:
                wrong(event, f"the first event of {RESOURCE_ITEMS[kind]} {event.payload[RESOURCE_ITEMS[kind]]} is not {first_type}")
            if ended is not None:
                wrong(event, f"an event after it ended (event {ended.seq} {ended.type})")
            if event.type in GRANT_ENDS or event.type == "budget.voided" or (
                event.type == "budget.settled" and event.payload.get("state") in ("SETTLED", "VOIDED")
            ):
                ended = ended or event


def _resource_changes(history: History, need: Callable[..., LoggedEvent | None]) -> None:
    """(c) for permits, allowances and budgets: each acknowledged change has its event once."""
    for op in history.by_kind["permit_acquire"]:
        grant = (op.result or {}).get("grantId") if op.ok else None
        if grant is not None:
            need("an acknowledged grant", "permit", op.args.get("permit"), "permit.granted", [op],
                 match=lambda event, grant=grant: event.payload.get("grantId") == grant)
    releases: dict[Any, list[Op]] = defaultdict(list)
    for op in history.by_kind["permit_release"]:
        releases[op.args.get("grantId")].append(op)
    acquired = {(op.result or {}).get("grantId"): op.args.get("permit") for op in history.by_kind["permit_acquire"] if op.ok}
    for grant, ops in releases.items():
        if any(op.ok for op in ops) and grant in acquired:
            need("an acknowledged release", "permit", acquired[grant], "permit.released", ops,
                 match=lambda event, grant=grant: event.payload.get("grantId") == grant)
    for op in history.by_kind["allowance_consume"]:
        consumption = (op.result or {}).get("consumptionId") if op.ok else None
        if consumption is not None:
            need("an acknowledged consume", "allowance", op.args.get("allowance"), "allowance.consumed", [op],
                 match=lambda event, consumption=consumption: event.payload.get("consumptionId") == consumption)
    for op in history.by_kind["budget_reserve"]:
        reservation = (op.result or {}).get("reservationId") if op.ok else None
        if reservation is not None:
            need("an acknowledged reserve", "budget", op.args.get("budget"), "budget.reserved", [op],
                 match=lambda event, reservation=reservation: event.payload.get("reservationId") == reservation)
    by_key: dict[tuple[Any, ...], list[Op]] = defaultdict(list)
    for op in history.by_kind["budget_settle"]:
        by_key[("settle", op.args.get("budget"), op.args.get("reservationId"), op.args.get("workKey"))].append(op)
    for op in history.by_kind["budget_void"]:
        by_key[("void", op.args.get("budget"), op.args.get("reservationId"))].append(op)
    for key, ops in by_key.items():
        if not any(op.ok for op in ops):
            continue
        if key[0] == "settle":
            need("an acknowledged settle", "budget", key[1], "budget.settled", ops,
                 match=lambda event, key=key: (event.payload.get("reservationId"), event.payload.get("workKey")) == key[2:])
        else:
            need("an acknowledged void", "budget", key[1], "budget.voided", ops,
                 match=lambda event, key=key: event.payload.get("reservationId") == key[2])


def _lease_valid_until(history: History, deliveries: list[Delivery]) -> float | None:
    """Until when (server ms) an acknowledged answer said one of these deliveries' lease was valid:
    its receive's leaseExpiresAt, or an acknowledged renew's (None: no time known)."""
    expiries = [delivery.expires_ms for delivery in deliveries]
    for delivery in deliveries:
        expiries += [epoch_ms((op.result or {}).get("leaseExpiresAt")) for op in history.task_ops_of(delivery.task, "renew")
                     if op.ok and op.args.get("delivery") == delivery.id]
    known = [expiry for expiry in expiries if expiry is not None]
    return max(known) if known else None


def _events_out_of_order(log: _EventLog) -> list[Violation]:
    """(b), per entity: the events of a task, a run, a group, a barrier, a timer follow its
    state machine; no task is created or started in a run after the run's stop."""
    violations: list[Violation] = []

    def wrong(event: LoggedEvent, message: str) -> None:
        violations.append(Violation(CHECK_EVENTS, f"{event.aggregate[0]} {event.entity}", f"{message}: {event}", (event.op,)))

    for (kind, _entity), events in log.by_entity.items():
        if kind == "task":
            _task_order(events, log, wrong)
        elif kind == "scope":
            stopped: LoggedEvent | None = None
            for index, event in enumerate(events):
                if event.type == "scope.created" and index > 0:
                    wrong(event, f"scope.created after event {events[0].seq} of the run")
                elif event.type in RUN_STOP_EVENTS:
                    if stopped is not None:
                        wrong(event, f"the run stops again (it stopped at event {stopped.seq})")
                    stopped = stopped or event
                if index == 0 and event.type != "scope.created" and log.complete:
                    wrong(event, "the run's first event is not scope.created")
        elif kind in RESOURCE_ITEMS:
            _item_order(kind, events, log, wrong)
        else:
            seen: dict[Any, LoggedEvent] = {}
            for event in events:
                once = (event.type, event.payload.get("epoch"))
                if once in seen:
                    wrong(event, f"{event.type} again (first at event {seen[once].seq})")
                seen.setdefault(once, event)
    return violations


def _task_order(events: list[LoggedEvent], log: _EventLog, wrong: Callable[[LoggedEvent, str], None]) -> None:
    state: str | None = None
    lost = False
    for index, event in enumerate(events):
        if lost and event.type not in ("task.queued", "task.failed"):
            wrong(event, "after delivery.lease_lost the task is neither queued again nor failed")
        lost = False
        if event.type == "task.created":
            if index > 0:
                wrong(event, f"task.created after event {events[0].seq} of the task")
            stop = log.stopped_before(event.scope, event.seq)
            if stop is not None:
                wrong(event, f"a task created in a run after its stop (event {stop.seq} {stop.type})")
            state = str(event.payload.get("state"))
            continue
        if state is None:
            if log.complete:
                wrong(event, "the task's first event is not task.created")
            state = "?"
        if state in TASK_FINISHED:
            wrong(event, f"an event after the task finished ({state})")
        if event.type == "delivery.lease_lost":
            if state not in ("RUNNING", "?"):
                wrong(event, f"delivery.lease_lost of a task that was {state}")
            lost = True
            continue
        new = TASK_EVENT_STATES.get(event.type)
        if new is None:
            continue
        if event.payload.get("state") is not None and event.payload.get("state") != new:
            wrong(event, f"{event.type} says state {event.payload.get('state')}")
        if new == state:
            wrong(event, f"{event.type} of a task that was {state} already")
        elif new == "RUNNING" and state not in ("QUEUED", "?"):
            wrong(event, f"task.running of a task that was {state}")
        elif new == SUCCEEDED and state not in ("RUNNING", "?"):
            wrong(event, f"task.succeeded of a task that was {state}")
        if new == "RUNNING":
            stop = log.stopped_before(event.scope, event.seq)
            if stop is not None:
                wrong(event, f"a task started in a run after its stop (event {stop.seq} {stop.type})")
        state = new


@dataclass(frozen=True)
class _Change:
    """An acknowledged change and its event: applied after `first_call` (the first call of any
    attempt that may have happened) and before `acked` (the first acknowledgement's return)."""

    event: LoggedEvent
    first_call: float
    acked: float
    ops: tuple[Op, ...]


def _changes_without_event(history: History, log: _EventLog) -> list[Violation]:
    """(c): every acknowledged change has its event exactly once (at least once: a delivery, a
    released barrier), and their events are in the order the history proves."""
    violations: list[Violation] = []
    changes: list[_Change] = []
    missing = unread = 0

    def need(label: str, kind: str, entity: Any, event_type: str, ops: list[Op], *, once: bool = True,
             ordered: bool = True, match: Callable[[LoggedEvent], bool] | None = None) -> LoggedEvent | None:
        nonlocal missing, unread
        found = [event for event in log.typed(kind, entity, event_type) if match is None or match(event)]
        acked = [op for op in ops if op.ok and op.ret is not None]
        if not found:
            if acked and all(op.ret >= log.read_to_end_at for op in acked):  # type: ignore[operator]
                unread += 1  # no page read the log to its end after the acknowledgement
            elif log.complete:
                violations.append(Violation(CHECK_EVENTS, f"{kind} {entity}", f"{label} has no {event_type} event",
                                            _ops(acked[:REPORT_OPS_MAX])))
            else:
                missing += 1
            return None
        if once and len(found) > 1:
            violations.append(Violation(
                CHECK_EVENTS, f"{kind} {entity}",
                f"{label} has {len(found)} {event_type} events: {', '.join(str(event.seq) for event in found)}",
                _ops(acked[:1], [event.op for event in found]),
            ))
            return None
        if ordered and acked and len(found) == 1:
            changes.append(_Change(found[0], min(op.call for op in _may_have(ops)),
                                   min(op.ret or math.inf for op in acked), _ops(acked[:1])))
        return found[0]

    creates: dict[Any, list[Op]] = defaultdict(list)
    for op in history.by_kind["run_create"]:
        creates[op.args.get("idem") or f"#{op.id}"].append(op)
    for ops in creates.values():
        run = next((op.result["run"] for op in ops if op.ok and op.result), None)
        if run is not None:
            need("an acknowledged run create", "scope", run, "scope.created", ops)
    for op in history.by_kind["group_create"]:
        if op.ok and op.result and op.result.get("scopeId"):
            need("an acknowledged group create's run", "scope", op.result["scopeId"], "scope.created", [op])
    attempts: dict[Any, list[Op]] = defaultdict(list)
    for op in history.by_kind["submit"]:
        attempts[("submit", op.args.get("run"), op.args.get("mailbox"), op.args.get("key"))].append(op)
    for op in history.by_kind["group_submit"]:
        attempts[("group", op.args.get("groupId"), op.args.get("key"))].append(op)
    tasks: dict[str, list[Op]] = defaultdict(list)
    for ops in attempts.values():
        task = next((op.result["taskId"] for op in ops if op.ok and op.result and op.result.get("taskId")), None)
        if task is not None:
            tasks[str(task)].extend(ops)
    for task, ops in tasks.items():
        need("an acknowledged submit's task", "task", task, "task.created", ops)
    completes: dict[str, list[Op]] = defaultdict(list)
    for op in history.by_kind["complete"]:
        completes[str(history.task_of(op))].append(op)
    for task, ops in completes.items():
        if any(op.ok and (op.result or {}).get("state") in (None, SUCCEEDED) for op in ops):
            need("an accepted complete", "task", task, "task.succeeded", ops)
    cancels: dict[str, list[Op]] = defaultdict(list)
    for op in history.by_kind["cancel_run"]:
        cancels[str(op.args.get("run"))].append(op)
    for run, ops in cancels.items():
        if any(op.ok and (op.result or {}).get("storedState") in (None, CANCELLED) for op in ops):
            by_group = any(event.type == "group.finalized" for event in log.events.values() if event.scope == run)
            from_above = any(event.payload.get("stoppedBy") not in (None, run) for event in log.typed("scope", run, "scope.cancelled"))
            need("an acknowledged cancel", "scope", run, "scope.cancelled", ops, ordered=not by_group and not from_above)
            if log.complete:
                for below in (other for other in log.parent if run in log.run_and_ancestors(log.parent[other])):
                    if not any(event.type in RUN_STOP_EVENTS for event in log.of("scope", below)):
                        violations.append(Violation(
                            CHECK_EVENTS, f"scope {below}", f"run {below}, below the cancelled run {run}, has no stop event",
                            _ops([op for op in ops if op.ok][:1]),
                        ))
    _resource_changes(history, need)
    for delivery in history.deliveries.values():
        attempt = next((item.get("attempt") for item in (delivery.receive.result or {}).get("deliveries") or []
                        if item.get("id") == delivery.id), None)
        need(f"delivery {delivery.id}", "task", delivery.task, "task.running", [delivery.receive], once=False,
             ordered=False, match=lambda event, attempt=attempt: attempt is None or event.payload.get("attempt") == attempt)  # type: ignore[misc]
    for kind, id_name, state, event_type, ops_kinds in (
        ("timer", "timerId", "FIRED", "timer.fired", ("timer_read",)),
        ("group", "groupId", FINALIZED, "group.finalized", ("group_read", "verdict")),
        ("barrier", "barrierId", RELEASED, "barrier.released", ("arrive", "barrier_read")),
    ):
        seen = _observed(history, kind, id_name, *ops_kinds)
        for entity, observations in seen.items():
            decided = [item for item in observations if item.view.get("state") == state]
            if not decided:
                continue
            event = need(f"a {kind} seen {state}", kind, entity, event_type, [item.op for item in decided if item.op],
                         once=kind != "barrier", ordered=False)
            if event is not None and kind == "group":
                outcomes = {(item.view.get("outcome"), item.view.get("outcomeReason")) for item in decided}
                logged = (event.payload.get("outcome"), event.payload.get("outcomeReason"))
                if any(outcome != logged for outcome in outcomes):
                    violations.append(Violation(
                        CHECK_EVENTS, f"group {entity}", f"group.finalized says {logged}, the group was seen {sorted(outcomes, key=str)}",
                        _ops([event.op], [item.op for item in decided if item.op][:1]),
                    ))
    if missing:
        history.note(f"events: {missing} acknowledged changes have no event among the events seen (the log was not "
                     "seen whole: they may have been dropped from it)")
    if unread:
        history.note(f"events: {unread} changes acknowledged after the last read of the log to its end (no final read) "
                     "have no event among the events seen: not checked")
    history.counts_extra["event_changes"] = len(changes)
    violations += _changes_out_of_order(changes)
    return violations


def _changes_out_of_order(changes: list[_Change]) -> list[Violation]:
    """A change acknowledged before another was first called has the earlier event: from the
    latest event down, keep the earliest acknowledgement of the events after it."""
    violations: list[Violation] = []
    earliest: _Change | None = None
    for change in sorted(changes, key=lambda change: -change.event.seq):
        if earliest is not None and earliest.acked < change.first_call:
            violations.append(Violation(
                CHECK_EVENTS, f"event {change.event.seq}",
                f"out of order: {earliest.event} was acknowledged before the change of {change.event} was first called, "
                "but its event comes later", _ops(earliest.ops, change.ops, [earliest.event.op, change.event.op]),
            ))
        if earliest is None or change.acked < earliest.acked:
            earliest = change
    return violations


CHECKS: tuple[tuple[str, Callable[[History], list[Violation]]], ...] = (
    (CHECK_RESULTS, check_results),
    (CHECK_LEASES, check_leases),
    (CHECK_ONCE, check_once),
    (CHECK_GROUPS, check_groups),
    (CHECK_BARRIERS, check_barriers),
    (CHECK_TIMERS, check_timers),
    (CHECK_CANCEL, check_cancel),
    (CHECK_LINEARIZABILITY, check_linearizable_reads),
    (CHECK_REPLAYS, check_replays),
    (CHECK_CAPACITY, check_capacity),
    (CHECK_MONEY, check_money),
    (CHECK_EVENTS, check_events),
    (CHECK_STALE_READS, check_stale_reads),
)


def check_history(lines: HistoryLines) -> Report:
    """Run every check on a history (`read_history`'s answer) and count what was checked."""
    history = parse_history(lines)
    violations: list[Violation] = []
    for _, check in CHECKS:
        violations.extend(check(history))
    note_clock_steps(history)
    return Report(violations, _counts(history, violations), history.notes)


def _counts(history: History, violations: list[Violation]) -> dict[str, int]:
    statuses = Counter(op.status for op in history.ops)
    counts = {
        "operations": len(history.ops),
        "ok": statuses[STATUS_OK],
        "fail": statuses[STATUS_FAIL],
        "unknown": statuses[STATUS_UNKNOWN],
        "events": len(history.events),
        "faults": sum(1 for event in history.events if event.get("event") == "fault"),
        "finals": sum(len(views) for views in history.finals.values()),
        "tasks": len({task for task, _ in history.submitted_tasks()} | set(history.task_ops)),
        "deliveries": len(history.deliveries),
        "once_keys": len({(op.args.get("run"), op.args.get("name"), op.args.get("key")) for op in history.by_kind["once"]}),
        "groups": _entities(history, "group", "groupId", "group_create", "group_read", "verdict"),
        "barriers": _entities(history, "barrier", "barrierId", "barrier_create", "arrive", "barrier_read"),
        "timers": _entities(history, "timer", "timerId", "timer_create", "timer_read"),
        "runs_cancelled": len({op.args.get("run") for op in history.by_kind["cancel_run"] if op.ok}),
        "permit_grants": sum(1 for op in history.by_kind["permit_acquire"] if op.ok),
        "allowance_consumes": sum(1 for op in history.by_kind["allowance_consume"] if op.ok),
        "budget_settles": sum(1 for op in history.by_kind["budget_settle"] if op.ok),
        # Idempotency keys answered more than once (a retry or a deliberate second send).
        "replayed_keys": sum(
            1 for count in Counter((op.op, op.args["idem"]) for op in history.ops if op.ok and "idem" in op.args).values()
            if count > 1
        ),
        **history.counts_extra,
    }
    by_check = Counter(violation.check for violation in violations)
    for name, _ in CHECKS:
        counts[f"violations.{name}"] = by_check[name]
    return counts


def _entities(history: History, kind: str, id_name: str, create: str, *uses: str) -> int:
    """How many entities of a kind the history names: created, used or read at the end."""
    ids = {op.result.get(id_name) for op in history.by_kind[create] if op.ok and op.result is not None}
    ids |= {op.args.get(id_name) for use in uses for op in history.by_kind[use]}
    ids |= set(history.finals.get(kind, {}))
    return len(ids - {None})


def format_report(report: Report) -> str:
    """The report as text: what was checked, each check's verdict, then every violation with the
    operations that show it, and the notes."""
    counts = report.counts
    lines = [
        f"chaos check: {counts.get('operations', 0)} operations ({counts.get('ok', 0)} ok, {counts.get('fail', 0)} "
        f"failed, {counts.get('unknown', 0)} unknown), {counts.get('faults', 0)} faults, {counts.get('finals', 0)} final views",
        f"  checked: {counts.get('tasks', 0)} tasks, {counts.get('deliveries', 0)} deliveries, {counts.get('once_keys', 0)} once "
        f"keys, {counts.get('groups', 0)} groups, {counts.get('barriers', 0)} barriers, {counts.get('timers', 0)} timers, "
        f"{counts.get('runs_cancelled', 0)} cancelled runs, {counts.get('permit_grants', 0)} permit grants, "
        f"{counts.get('allowance_consumes', 0)} allowance consumes, "
        f"{counts.get('budget_settles', 0)} budget settles, "
        f"{counts.get('registers', 0)} task registers "
        f"({counts.get('registers_undecided', 0)} undecided), {counts.get('task_reads', 0)} task reads, {counts.get('events_seen', 0)} events in "
        f"{counts.get('event_pages', 0)} pages ({counts.get('event_failover_resumes', 0)} resumed after a failover)",
    ]
    for number, (name, _) in enumerate(CHECKS, start=1):
        found = counts.get(f"violations.{name}", 0)
        lines.append(f"  {number:>2} {name:<16} {'ok' if found == 0 else f'{found} violation' + ('s' if found > 1 else '')}")
    if report.violations:
        lines.append(f"{len(report.violations)} violation{'s' if len(report.violations) > 1 else ''}:")
        for violation in report.violations:
            lines.append(str(violation))
            for op in violation.ops[:REPORT_OPS_MAX]:
                lines.append(f"    {op}")
            if len(violation.ops) > REPORT_OPS_MAX:
                lines.append(f"    ... and {len(violation.ops) - REPORT_OPS_MAX} more operations")
    else:
        lines.append("no violations")
    if report.notes:
        lines.append(f"notes ({len(report.notes)}):")
        lines.extend(f"  {note}" for note in report.notes)
    return "\n".join(lines)
