"""The replicated state: entities, the due-time heap, and the snapshot codec.

Everything here is plain data. The rules that change it live beside it, one module per entity
(`runs.py`, `tasks.py`); `dispatch.py` routes a command to its rule.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import heapq
import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Final

SNAPSHOT_VERSION = 1
# The empty value of a task's slot_leases and subscribers: one shared tuple, not an empty list per task.
EMPTY: tuple[()] = ()
DELIVERY_DIGEST_BYTES = 16
# Where an idempotency entry keeps its result's weight (State.idempotency), after the three columns a
# snapshot holds.
IDEMPOTENCY_WEIGHT = 3


class RunState:
    """A run's own (stored) state."""

    ACTIVE: Final = "ACTIVE"  # accepting work
    CANCELLED: Final = "CANCELLED"  # stopped by cancel(); final
    COMPLETED: Final = "COMPLETED"  # closed by complete(); final


class TaskState:
    QUEUED: Final = "QUEUED"  # waiting for a worker (possibly after a retry backoff)
    RUNNING: Final = "RUNNING"  # held by a worker under a delivery lease
    SUCCEEDED: Final = "SUCCEEDED"  # completed with a recorded outcome
    FAILED: Final = "FAILED"  # rejected, or out of attempts; `error` holds the last error
    CANCELLED: Final = "CANCELLED"  # its run (or a run above it) was cancelled or completed
    EXPIRED: Final = "EXPIRED"  # its run's deadline passed first

    TERMINAL: Final = frozenset({SUCCEEDED, FAILED, CANCELLED, EXPIRED})


class OnceState:
    OPEN: Final = "OPEN"  # nobody holds it: new, released, or its last attempt failed or lapsed
    HELD: Final = "HELD"  # a holder works on it under a lease
    DONE: Final = "DONE"  # a result is recorded; final
    FAILED: Final = "FAILED"  # its attempts are used; final until the run ends


class DueKind:
    """What a heap entry wakes up for. Entries are checked when they come due, so an entry made
    stale by a later change (a renewed lease, a cancelled task) is simply skipped."""

    LEASE: Final = "lease"  # a delivery lease may have lapsed
    READY: Final = "ready"  # a retry backoff ends
    DEADLINE: Final = "deadline"  # a run's deadline passes
    RETENTION: Final = "retention"  # a finished run's retention ends: remove it
    # A once lease may have lapsed. (The value predates the split of once and claims: kept, so the
    # entries of older snapshots still reach once.)
    ONCE_LEASE: Final = "claim_lease"
    CLAIM_LEASE: Final = "mutex_claim_lease"  # a claim's lease may have lapsed
    GROUP_DEADLINE: Final = "group_deadline"  # a task group's deadline passes
    TIMER: Final = "timer"  # a durable timer fires
    SLOT_LEASE: Final = "slot_lease"  # a direct slot lease may have lapsed
    RESERVATION: Final = "reservation"  # a direct budget reservation may have lapsed
    LIMIT_WINDOW: Final = "limit_window"  # a rate limit's window opens for a take or a job that waits
    TASK_DEADLINE: Final = "task_deadline"  # a task's own deadline passes
    PERMIT_WAITER: Final = "permit_waiter"  # a permit waiter's TTL (or its signal's hold) may have run out
    BUDGET_SETTLE_BY: Final = "budget_settle_by"  # a budget reservation's settleBy passes: STALE (budgets.py)
    ALLOWANCE_WAITER: Final = "allowance_waiter"  # an allowance waiter's TTL may have run out (allowances.py)
    EVENTS_AGE: Final = "events_age"  # a space's oldest events reach their age limit (events.py); the id is the space's


@dataclass(slots=True)
class Mailbox:
    name: str
    mode: str  # WORK (tasks and messages) or INBOX (messages only)
    id: str = ""
    backlog_limit: int | None = None  # unfinished tasks it holds at most (None: no bound)
    max_attempts: int | None = None  # attempts of a task submitted without its own (None: not declared)
    requirements: dict[str, Any] | None = None  # as declared: {"pools", "quotas", "budgets"}
    unfinished: int = 0  # its unfinished tasks, counted while it has a backlog_limit


@dataclass(slots=True)
class QueueFigures:
    """What one mailbox holds now, for the node's metrics (node/api/metrics.py). Derived: kept by
    tasks.py as tasks change state, never written to a snapshot, recounted on restore."""

    # Its QUEUED tasks: task id -> when it last became QUEUED (ms), in that order (oldest first).
    queued: dict[str, int] = field(default_factory=dict)
    running: int = 0  # its RUNNING tasks (in flight under a delivery lease)


@dataclass(slots=True)
class EndedFigures:
    """The ended tasks one mailbox still holds (their runs not yet removed), for its stats
    (node/api/mailboxes.py). Derived like QueueFigures: kept by tasks.py as tasks end and by
    runs.py as ended tasks go with their run, never written to a snapshot, recounted on restore."""

    # Final state (SUCCEEDED, FAILED, CANCELLED, EXPIRED) -> how many.
    by_state: dict[str, int] = field(default_factory=dict)
    attempts: int = 0  # the deliveries they had, together


@dataclass(slots=True)
class Space:
    id: str
    mailboxes: dict[str, Mailbox] = field(default_factory=dict)
    run_count: int = 0
    task_count: int = 0
    # Named root runs: name -> the id of the latest run of that name (the default run is "default").
    run_names: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    created_ms: int = 0  # 0 for a space of a snapshot older than spaces with names
    key_count: int = 0  # its API keys, revoked ones included
    resource_counts: dict[str, int] = field(default_factory=dict)  # pools, limits, budgets: kind -> count
    # Derived from `mailboxes` (id -> name); rebuilt by from_snapshot, never written to a snapshot.
    mailbox_names: dict[str, str] = field(default_factory=dict)
    # Derived: the bytes its tasks and once entries hold (storage.py); recounted on restore.
    stored_bytes: int = 0
    # -- events (events.py): its event log, oldest first, and the sequence number of the latest
    # event ever appended (0: none yet). Written to snapshots under "events".
    events: deque[Event] = field(default_factory=deque)
    event_seq: int = 0
    event_bytes: int = 0  # derived: what its events weigh (event_bytes); recounted on restore


@dataclass(slots=True)
class Event:
    """One entry of a space's event log (events.py). `payload` holds ids and states only: str, int
    or None values, never a user's payload."""

    seq: int  # its number in the space's log: 1, 2, 3 ... (the cursor is derived from it)
    created_ms: int  # the time of the command that made the change
    type: str  # e.g. "scope.cancelled", "task.succeeded"
    run_id: str | None  # the run it is about, when there is one (the wire's scopeId)
    aggregate_type: str  # what it is about: "scope", "task", "group", ...
    aggregate_id: str
    payload: dict[str, Any]
    # Derived: event_bytes(self), weighed once when it is appended (or restored) and subtracted as
    # it is dropped; never in a snapshot (_EVENT_FIELDS).
    weight: int = field(default=0, compare=False, repr=False)


@dataclass(slots=True)
class ApiKey:
    """An API key of a space. Only the SHA-256 of its secret is kept; the secret itself was shown
    once to whoever created it and never reaches the log."""

    id: str
    space: str
    name: str | None
    permissions: list[str]  # non-empty, in access.PERMISSIONS order
    hash: str  # sha256 of the secret, 64 lowercase hex
    created_ms: int
    revoked_ms: int | None = None  # set once, by the first revoke
    created_by: str | None = None  # the key that created it; None for bootstrap and keyless nodes


@dataclass(slots=True)
class Queue:
    """The tasks of one mailbox within one run."""

    # Task ids ready for delivery, oldest first. May hold ids that are no longer QUEUED (a
    # cancelled task); receive skips those.
    ready: deque[str] = field(default_factory=deque)
    by_key: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class Run:
    id: str
    space: str
    name: str | None
    parent_id: str | None
    depth: int
    deadline_ms: int | None
    child_limit: int
    created_ms: int
    stored_state: str = RunState.ACTIVE
    finished_ms: int | None = None  # when it was cancelled, completed, or its deadline passed
    reason: str | None = None
    children: list[str] = field(default_factory=list)
    queues: dict[str, Queue] = field(default_factory=dict)
    task_count: int = 0
    once: dict[str, str] = field(default_factory=dict)  # key -> once id
    group_id: str | None = None  # the task group this run belongs to (a group owns its own run)
    barriers: list[str] = field(default_factory=list)  # barrier ids created in this run
    timers: list[str] = field(default_factory=list)  # timer ids created in this run
    claims: dict[str, str] = field(default_factory=dict)  # key -> claim id (claims.py)
    # Permit waiters created in this run (permits.py), ended ones too: removed with the run.
    permit_waiters: list[str] = field(default_factory=list)
    # Derived, never in a snapshot (rebuilt on restore, so every replica's bytes are alike): permit
    # grants made in this run (permits.py), ended ones among them until the list is pruned (at each
    # power of two of its length). What the run's stop ends, without a scan of every lease.
    permit_grants: list[str] = field(default_factory=list, compare=False)
    # The grants its stop ended (permits.py): a renewal of one is refused as the run's stop
    # (SCOPE_CANCELLED, DEADLINE_EXCEEDED), not as a lost lease. Kept until the run is removed.
    stopped_grants: list[str] = field(default_factory=list)
    # Named barriers and timers of this run (barriers.py, timers.py): name -> id.
    barrier_names: dict[str, str] = field(default_factory=dict)
    timer_names: dict[str, str] = field(default_factory=dict)
    # Allowance waiters created in this run (allowances.py), ended ones too: removed with the run.
    allowance_waiters: list[str] = field(default_factory=list)
    seq: int = 0  # its number in the state's creation order (State.creation_seq)


@dataclass(slots=True)
class Task:
    id: str
    space: str
    run_id: str
    mailbox: str
    key: str
    input: bytes  # canonical JSON (storage.json_bytes)
    input_hash: str
    attempts: int
    created_ms: int
    state: str = TaskState.QUEUED
    failures: int = 0  # failed attempts so far (lapses, retries)
    attempt: int = 0  # the number of the current or last delivery; 0 before the first
    delivery_id: str | None = None
    delivery_count: int = 0
    lease_expires_ms: int = 0
    lease_ms: int = 0  # the length of the current lease, what a new leader extends it by
    holder: str | None = None
    ready_at_ms: int = 0
    outcome: bytes | None = None  # canonical JSON of the recorded result
    error: str | None = None
    finished_ms: int | None = None
    # The delivery that finished it, as its digest (delivery_digest): a repeated complete of that
    # delivery is answered again. A snapshot from before digests holds the token; restore digests it.
    finished_by: bytes | None = None
    outcome_reason: str | None = None  # why it ended (scope_cancelled, handler_error: ..., ...)
    holder_session: str | None = None  # the session of the current or last delivery's holder
    # Its fields that most tasks leave at their defaults (TaskExtra), read and written as its own
    # (task.needs, task.group_id, ...: the properties below); None while all are.
    extra: TaskExtra | None = None
    seq: int = 0  # its number in the state's creation order (State.creation_seq)

    def _set_extra(self, name: str, value: Any) -> None:
        extra = self.extra
        if extra is None:
            if value is None or value is EMPTY:
                return  # a default: nothing to keep
            extra = self.extra = TaskExtra()
        setattr(extra, name, value)
        if extra == _NO_EXTRA:
            self.extra = None

    # TaskExtra's fields, read and written as the task's own: the default while it has no TaskExtra
    # (TaskExtra's defaults), a write through _set_extra. Properties, not a descriptor class of our
    # own: a compiled core (mypyc) read such a class's instance itself where a task's field was meant.
    @property
    def needs(self) -> dict[str, Any] | None:
        extra = self.extra
        return None if extra is None else extra.needs

    @needs.setter
    def needs(self, value: dict[str, Any] | None) -> None:
        self._set_extra("needs", value)

    @property
    def slot_leases(self) -> list[str] | tuple[()]:
        extra = self.extra
        return EMPTY if extra is None else extra.slot_leases

    @slot_leases.setter
    def slot_leases(self, value: list[str] | tuple[()]) -> None:
        self._set_extra("slot_leases", value)

    @property
    def reservation_id(self) -> str | None:
        extra = self.extra
        return None if extra is None else extra.reservation_id

    @reservation_id.setter
    def reservation_id(self, value: str | None) -> None:
        self._set_extra("reservation_id", value)

    @property
    def deadline_ms(self) -> int | None:
        extra = self.extra
        return None if extra is None else extra.deadline_ms

    @deadline_ms.setter
    def deadline_ms(self, value: int | None) -> None:
        self._set_extra("deadline_ms", value)

    @property
    def subscribers(self) -> list[str] | tuple[()]:
        extra = self.extra
        return EMPTY if extra is None else extra.subscribers

    @subscribers.setter
    def subscribers(self, value: list[str] | tuple[()]) -> None:
        self._set_extra("subscribers", value)

    @property
    def work_limit(self) -> str | None:
        extra = self.extra
        return None if extra is None else extra.work_limit

    @work_limit.setter
    def work_limit(self, value: str | None) -> None:
        self._set_extra("work_limit", value)

    @property
    def group_id(self) -> str | None:
        extra = self.extra
        return None if extra is None else extra.group_id

    @group_id.setter
    def group_id(self, value: str | None) -> None:
        self._set_extra("group_id", value)


@dataclass(slots=True)
class TaskExtra:
    """The fields of a Task that most tasks leave at their defaults, in an object of their own that
    only the tasks that set one have: a task is 7 slots smaller. The properties Task.needs ...
    Task.group_id read them (the default when the task has none) and write them (making the object
    on the first value that is not a default, dropping it when all are defaults again, so equal
    tasks are equal whichever way they were made)."""

    # The resources each delivery needs (see resources.require_needs): None, or {"slots": [pool
    # names], "limit": [name, units] | None, "budget": [name, reserve micros] | None}.
    needs: dict[str, Any] | None = None
    # What the current delivery holds of them: slot lease ids, and the reservation id. Empty, it is
    # the shared EMPTY (no list per task); a list only while it has some.
    slot_leases: list[str] | tuple[()] = EMPTY
    reservation_id: str | None = None
    deadline_ms: int | None = None  # the task's own deadline: EXPIRED when it passes unfinished
    subscribers: list[str] | tuple[()] = EMPTY  # who joined it (join/detach); empty: EMPTY, as slot_leases
    work_limit: str | None = None  # the name of the work limit it counts toward (work_limits.py)
    # The task group it is a member of (groups.py): a task joins at most one. A snapshot from
    # before it loads with None (a member of its group's own run is found through the run's
    # group_id too).
    group_id: str | None = None


_NO_EXTRA = TaskExtra()  # every default: a TaskExtra equal to it is dropped (never written)
TASK_EXTRA_FIELDS = tuple(f.name for f in dataclasses.fields(TaskExtra))


def new_task(**fields: Any) -> Task:
    """A Task of all its fields, those of TaskExtra among them (the constructor takes the others)."""
    extras = {name: fields.pop(name) for name in TASK_EXTRA_FIELDS if name in fields}
    task = Task(**fields)
    for name, value in extras.items():
        setattr(task, name, value)
    return task


@dataclass(slots=True)
class Once:
    """The work of one (run, key) that runs once (once.py)."""

    id: str
    space: str
    run_id: str
    key: str
    # The attempt limit: None until a holder names one (a failure's maxAttempts, or an acquire's);
    # the latest one given applies, to that failure and to later lapses.
    max_attempts: int | None
    created_ms: int
    state: str = OnceState.OPEN
    failures: int = 0  # failed or lapsed attempts so far
    attempt: int = 0  # the number of the current or last lease; 0 before the first
    token: str | None = None  # the current lease's token (None while not HELD)
    lease_count: int = 0
    lease_ms: int = 0
    lease_expires_ms: int = 0
    holder: str | None = None
    result: bytes | None = None  # canonical JSON of the recorded result
    error: str | None = None
    finished_ms: int | None = None
    finished_by: str | None = None  # the token of the lease that recorded the result
    holder_session: str | None = None


@dataclass(slots=True)
class State:
    clock_ms: int = 0
    epoch: int = 0
    spaces: dict[str, Space] = field(default_factory=dict)
    runs: dict[str, Run] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)
    once: dict[str, Once] = field(default_factory=dict)
    # Entities of claims.py, groups.py, barriers.py and timers.py: id -> entity. Each is a dataclass
    # whose fields are plain values, lists and dicts of plain values (copied deeply by snapshots).
    claims: dict[str, Any] = field(default_factory=dict)
    groups: dict[str, Any] = field(default_factory=dict)
    barriers: dict[str, Any] = field(default_factory=dict)
    timers: dict[str, Any] = field(default_factory=dict)
    # Entities of resources.py: resources by "<space>/<name>", and what holds them by hold id.
    pools: dict[str, Any] = field(default_factory=dict)
    rate_limits: dict[str, Any] = field(default_factory=dict)
    budgets: dict[str, Any] = field(default_factory=dict)
    slot_leases: dict[str, Any] = field(default_factory=dict)
    reservations: dict[str, Any] = field(default_factory=dict)
    permit_waiters: dict[str, Any] = field(default_factory=dict)  # permits.py: waiter id -> waiter
    work_limits: dict[str, Any] = field(default_factory=dict)  # work_limits.py: "<space>/<name>" -> limit
    # Derived from `pools` (a pool's public id, "prm_...", -> its "<space>/<name>"); rebuilt by
    # from_snapshot, never written to a snapshot.
    permit_ids: dict[str, str] = field(default_factory=dict)
    # Derived from the runs' stopped_grants: a grant its run's stop ended -> that run (permits.py).
    stopped_grant_runs: dict[str, str] = field(default_factory=dict)
    # budgets.py: its reservations by id; and, derived like permit_ids, a budget's public id
    # ("bdg_...") -> its "<space>/<name>".
    budget_reservations: dict[str, Any] = field(default_factory=dict)
    budget_ids: dict[str, str] = field(default_factory=dict)
    # allowances.py: waiter id -> waiter; consumption id -> consumption (to be settled). Derived
    # from `rate_limits` (a limit's public id, "alw_...", -> its "<space>/<name>"), like permit_ids.
    allowance_waiters: dict[str, Any] = field(default_factory=dict)
    allowance_consumptions: dict[str, Any] = field(default_factory=dict)
    allowance_ids: dict[str, str] = field(default_factory=dict)
    # Min-heap of (due_ms, seq, kind, entity id); seq keeps the order total and deterministic.
    # Tuples, not lists: a tuple of ints and strings is left alone by the garbage collector after
    # its first pass, and a busy node holds one entry per lease (tens of thousands).
    due: list[tuple[int, int, str, str]] = field(default_factory=list)
    due_seq: int = 0
    # The number of the latest run, task, group, barrier or timer created (1, 2, 3 ...: each keeps
    # its own as `seq`). Lists page in this order (node/api/_paging.py): items created in one
    # millisecond (a batch submit) keep the order they were created in, on every replica, and an
    # item created later always sorts after them. None until the log's `state.number_creations`
    # command (dispatch.py), which numbers every entity there is in table (creation) order: until
    # then entities get 0. A replicated command, not the restore of a snapshot, starts the count,
    # so that every replica numbers alike whatever it restored: replicas of an earlier release's
    # snapshots, restored at different log indexes, would count different entities (those deleted
    # in between). A leader proposes it once every node of the cluster applies it (its level).
    creation_seq: int | None = None
    # The command level every node of the cluster applies, as the log proved it (`state.level`,
    # dispatch.proven_level): 1 until a leader wrote one. Only ever rises.
    level: int = 1
    # The cluster's learners (actors/members.py): node id -> [Raft address, API URL, added ms], in
    # the order they were added. The voters are the Raft log's own configuration, not state.
    learners: dict[str, list[Any]] = field(default_factory=dict)
    # The cluster's id (`cluster.identify`, dispatch.py): None until a leader wrote one; a backup
    # names its cluster by it, and a restore gives the new cluster a new one (node/backup.py).
    cluster_id: str | None = None
    keys: dict[str, ApiKey] = field(default_factory=dict)  # id -> key
    # Derived from `keys` (hash -> id), so a request's key is found without a scan; rebuilt by
    # from_snapshot, never written to a snapshot.
    key_ids_by_hash: dict[str, str] = field(default_factory=dict)
    operator_space: str | None = None  # the space bootstrap created: its admin keys manage every space
    # Idempotency keys (idempotency.py): space -> key -> [first use ms, request fingerprint, result,
    # result_bytes(result)], oldest first. The weight is derived: never in a snapshot.
    idempotency: dict[str, OrderedDict[str, list[Any]]] = field(default_factory=dict)
    # Derived: the bytes each space's remembered results weigh (result_bytes); recounted on restore.
    idempotency_bytes: dict[str, int] = field(default_factory=dict)
    # Derived: the bytes every space holds together (storage.py); recounted on restore.
    stored_bytes: int = 0
    # Derived: (space, mailbox) -> its QUEUED and RUNNING tasks (tasks.py keeps them; only mailboxes
    # that hold some have an entry); recounted on restore.
    queue_figures: dict[tuple[str, str], QueueFigures] = field(default_factory=dict, compare=False)
    # Derived: (space, mailbox) -> its ended tasks still held (only mailboxes with some have an
    # entry); recounted on restore.
    ended_figures: dict[tuple[str, str], EndedFigures] = field(default_factory=dict, compare=False)
    # Derived: (space, mailbox) -> its tasks' ids in creation order (a dict used as an ordered set),
    # so a list of a mailbox's or a space's tasks reads only theirs (node/api/tasks.py). Kept by
    # tasks.submit and runs.on_retention; rebuilt on restore from `tasks`, which keeps creation order.
    mailbox_tasks: dict[tuple[str, str], dict[str, None]] = field(default_factory=dict, compare=False)

    def arm(self, due_ms: int, kind: str, entity_id: str) -> None:
        self.due_seq += 1
        heapq.heappush(self.due, (due_ms, self.due_seq, kind, entity_id))

    def next_due_ms(self) -> int | None:
        return self.due[0][0] if self.due else None

    def next_seq(self) -> int:
        """The creation number of an entity created now (its `seq`): one more than the latest; 0
        before `state.number_creations` (creation_seq is None)."""
        if self.creation_seq is None:
            return 0
        self.creation_seq += 1
        return self.creation_seq


# -- snapshot codec ------------------------------------------------------------------------------
# Entities are written as lists in field order; the version guards the layout.

_RUN_FIELDS = (
    "id", "space", "name", "parent_id", "depth", "deadline_ms", "child_limit", "created_ms",
    "stored_state", "finished_ms", "reason", "children", "task_count", "once", "group_id", "barriers",
    "timers", "claims", "permit_waiters", "stopped_grants",
    "barrier_names", "timer_names",  # barriers.py, timers.py
    "allowance_waiters",  # allowances.py
    "seq",  # its creation number (State.creation_seq)
)
# Run fields appended after the first snapshots: an older row stops before them (their defaults).
_RUN_FIELDS_REQUIRED = _RUN_FIELDS.index("claims")
_TASK_FIELDS = (
    "id", "space", "run_id", "mailbox", "key", "input", "input_hash", "attempts", "created_ms",
    "state", "failures", "attempt", "delivery_id", "delivery_count", "lease_expires_ms", "lease_ms", "holder",
    "ready_at_ms", "outcome", "error", "finished_ms", "finished_by", "needs", "slot_leases", "reservation_id",
    "deadline_ms", "outcome_reason", "subscribers", "holder_session", "work_limit", "group_id", "seq",
)
# Task fields appended after the first snapshots: an older row stops before them (their defaults).
_TASK_FIELDS_REQUIRED = _TASK_FIELDS.index("needs")
_TASK_COPIED = frozenset({"slot_leases", "subscribers"})  # changed in place by later commands: copied by snapshots


_ONCE_FIELDS = (
    "id", "space", "run_id", "key", "max_attempts", "created_ms", "state", "failures", "attempt", "token",
    "lease_count", "lease_ms", "lease_expires_ms", "holder", "result", "error", "finished_ms", "finished_by",
    "holder_session",
)
_ONCE_FIELDS_REQUIRED = _ONCE_FIELDS.index("holder_session")
_KEY_FIELDS = ("id", "space", "name", "permissions", "hash", "created_ms", "revoked_ms", "created_by")
_EVENT_FIELDS = ("seq", "created_ms", "type", "run_id", "aggregate_type", "aggregate_id", "payload")


def to_snapshot(state: State) -> dict[str, Any]:
    # A snapshot is a value: the containers the state keeps changing (the heap and its entries, a
    # run's children, a queue's keys) are copied, so applying later commands does not alter it.
    runs = []
    for run in state.runs.values():
        queues = {name: [list(q.ready), dict(q.by_key)] for name, q in run.queues.items()}
        row = [_copied(getattr(run, f)) for f in _RUN_FIELDS]
        runs.append(row + [queues])
    return {
        "v": SNAPSHOT_VERSION,
        "clock_ms": state.clock_ms,
        "epoch": state.epoch,
        "spaces": [
            [
                s.id,
                [
                    [m.name, m.mode, m.id, m.backlog_limit, m.max_attempts, copy.deepcopy(m.requirements), m.unfinished]
                    for m in s.mailboxes.values()
                ],
                s.run_count, s.task_count, dict(s.run_names),
                s.name, s.created_ms, s.key_count, dict(s.resource_counts),
            ]
            for s in state.spaces.values()
        ],
        "runs": runs,
        "tasks": [
            [_copied(getattr(t, f)) if f in _TASK_COPIED else getattr(t, f) for f in _TASK_FIELDS]
            for t in state.tasks.values()
        ],
        "once": [[getattr(o, f) for f in _ONCE_FIELDS] for o in state.once.values()],
        **{
            table: [[copy.deepcopy(getattr(entity, f)) for f in _fields(cls)] for entity in getattr(state, table).values()]
            for table, cls in ENTITY_TABLES.items()
        },
        "due": [list(entry) for entry in state.due],
        "due_seq": state.due_seq,
        "creation_seq": state.creation_seq,
        # Only once proven, so a state without it has the snapshot (and digest) releases before had.
        **({"level": state.level} if state.level > 1 else {}),
        **({"learners": [[node_id, *entry] for node_id, entry in state.learners.items()]} if state.learners else {}),
        # Only once written, so a state without it has the snapshot (and digest) releases before had.
        **({"cluster_id": state.cluster_id} if state.cluster_id is not None else {}),
        "keys": [[_copied(getattr(k, f)) for f in _KEY_FIELDS] for k in state.keys.values()],
        "operator_space": state.operator_space,
        # Rows in age order; a result is a value the state never changes, but copied all the same.
        "idempotency": [
            [space, key, *copy.deepcopy(entry[:IDEMPOTENCY_WEIGHT])]
            for space, table in state.idempotency.items()
            for key, entry in table.items()
        ],
        # events.py: per space with a log, [space id, latest seq, [event rows, oldest first]].
        "events": [
            [s.id, s.event_seq, [[_copied(getattr(e, f)) for f in _EVENT_FIELDS] for e in s.events]]
            for s in state.spaces.values() if s.event_seq
        ],
    }


def from_snapshot(data: dict[str, Any]) -> State:
    if data.get("v") != SNAPSHOT_VERSION:
        raise ValueError(f"unsupported snapshot version {data.get('v')!r}, expected {SNAPSHOT_VERSION}")
    # Copied for the same reason as in to_snapshot: two states restored from one snapshot must not
    # share a heap, a children list or a key map.
    due = [(due_ms, seq, kind, entity_id) for due_ms, seq, kind, entity_id in data["due"]]
    state = State(clock_ms=data["clock_ms"], epoch=data["epoch"], due=due, due_seq=data["due_seq"])
    # Spaces, keys and the operator space came later: a snapshot from before them has rows of 5
    # columns, no keys and no operator space, and loads with the defaults; so does one from before
    # resources (rows of 8 columns).
    state.operator_space = data.get("operator_space")
    for space, key, first_ms, fingerprint, result in data.get("idempotency", []):
        state.idempotency.setdefault(space, OrderedDict())[key] = [
            first_ms, fingerprint, copy.deepcopy(result), result_bytes(result)
        ]
    for row in data["spaces"]:
        space_id, mailboxes, run_count, task_count, run_names, *later = row
        later_defaults: list[Any] = [None, 0, 0, {}]  # name, created_ms, key_count, resource_counts
        space_name, created_ms, key_count, resource_counts = list(later) + later_defaults[len(later):]
        state.spaces[space_id] = Space(
            id=space_id,
            mailboxes={mailbox[0]: _mailbox_of(space_id, mailbox) for mailbox in mailboxes},
            run_count=run_count,
            task_count=task_count,
            # Before named runs the column held the default run's id (or None).
            run_names=dict(run_names) if isinstance(run_names, dict) else {} if run_names is None else {"default": run_names},
            name=space_name,
            created_ms=created_ms,
            key_count=key_count,
            resource_counts=dict(resource_counts),
        )
        state.spaces[space_id].mailbox_names = {m.id: m.name for m in state.spaces[space_id].mailboxes.values()}
    for space_id, event_seq, rows in data.get("events", []):  # none in a snapshot from before events
        space = state.spaces[space_id]
        space.event_seq = event_seq
        space.events = deque(Event(**dict(zip(_EVENT_FIELDS, row, strict=True))) for row in rows)
        for event in space.events:
            event.payload = dict(event.payload)
    for row in data.get("keys", []):
        key = ApiKey(**dict(zip(_KEY_FIELDS, row, strict=True)))
        key.permissions = list(key.permissions)
        state.keys[key.id] = key
        state.key_ids_by_hash[key.hash] = key.id
    for row in data["runs"]:
        *values, queues = row
        if not _RUN_FIELDS_REQUIRED <= len(values) <= len(_RUN_FIELDS):
            raise ValueError(f"a run row has {len(values)} fields, Run has {len(_RUN_FIELDS)}")
        run = Run(**dict(zip(_RUN_FIELDS[: len(values)], values, strict=True)))
        run.children = list(run.children)
        run.once = dict(run.once)
        run.claims = dict(run.claims)
        run.permit_waiters = list(run.permit_waiters)
        run.stopped_grants = list(run.stopped_grants)
        for grant_id in run.stopped_grants:
            state.stopped_grant_runs[grant_id] = run.id
        run.barrier_names, run.timer_names = dict(run.barrier_names), dict(run.timer_names)
        run.allowance_waiters = list(run.allowance_waiters)
        run.queues = {name: Queue(deque(ready), dict(by_key)) for name, (ready, by_key) in queues.items()}
        state.runs[run.id] = run
    shared: dict[str, str] = {}
    for row in data["tasks"]:
        if not _TASK_FIELDS_REQUIRED <= len(row) <= len(_TASK_FIELDS):
            raise ValueError(f"a task row has {len(row)} fields, Task has {len(_TASK_FIELDS)}")
        fields = dict(zip(_TASK_FIELDS[: len(row)], row, strict=True))
        # A row of an older snapshot is brought to today's field types before a Task is made of it
        # (a compiled core checks them): payloads were kept as parsed values before they were kept
        # as their JSON bytes, and a finished task kept its delivery's token before its digest.
        fields["input"] = json_bytes(fields["input"])
        if fields.get("outcome") is not None:
            fields["outcome"] = json_bytes(fields["outcome"])
        if isinstance(fields.get("finished_by"), str):
            fields["finished_by"] = delivery_digest(fields["finished_by"])
        task = new_task(**fields)
        task.slot_leases = list(task.slot_leases) if task.slot_leases else EMPTY
        task.subscribers = list(task.subscribers) if task.subscribers else EMPTY
        _share_task_strings(state, task, shared)
        state.tasks[task.id] = task
    # A snapshot from before once and claims were split keeps the once entries under "claims"
    # (with `attempts` where max_attempts is) and has no claims.
    legacy = "once" not in data
    for row in data["claims" if legacy else "once"]:
        if not _ONCE_FIELDS_REQUIRED <= len(row) <= len(_ONCE_FIELDS):
            raise ValueError(f"a once row has {len(row)} fields, Once has {len(_ONCE_FIELDS)}")
        fields = dict(zip(_ONCE_FIELDS[: len(row)], row, strict=True))
        if fields.get("result") is not None:
            fields["result"] = json_bytes(fields["result"])  # a parsed value in an older snapshot
        entry = Once(**fields)
        state.once[entry.id] = entry
    for table, cls in ENTITY_TABLES.items():
        if legacy and table == "claims":
            continue
        entities = getattr(state, table)
        names = _fields(cls)
        for row in data.get(table, []):
            # Fields are only ever appended, with defaults: a row written before one was added is
            # shorter and the missing fields take their defaults.
            if len(row) > len(names):
                raise ValueError(f"a {table} row has {len(row)} fields, {cls.__name__} has {len(names)}")
            entity = cls(**dict(zip(names[: len(row)], copy.deepcopy(row), strict=True)))
            entities[entity.id] = entity
    for pool in state.pools.values():
        if not pool.public_id:  # a pool of a snapshot from before permit ids: derived, the same on every replica
            pool.public_id = "prm_" + hashlib.sha256(pool.id.encode()).hexdigest()[:20]
        state.permit_ids[pool.public_id] = pool.id
    for hold in state.slot_leases.values():
        if hold.token is not None and hold.run_id in state.runs:  # a permit grant (permits.py)
            state.runs[hold.run_id].permit_grants.append(hold.id)
    for budget in state.budgets.values():
        if not budget.public_id:  # a budget of a snapshot from before budget ids: derived alike
            budget.public_id = "bdg_" + hashlib.sha256(budget.id.encode()).hexdigest()[:20]
        state.budget_ids[budget.public_id] = budget.id
    for limit in state.rate_limits.values():
        if not limit.public_id:  # a limit of a snapshot from before allowance ids: derived alike
            limit.public_id = "alw_" + hashlib.sha256(limit.id.encode()).hexdigest()[:20]
        state.allowance_ids[limit.public_id] = limit.id
    for claim in state.claims.values():
        # An observation was kept as a parsed value before it was kept as its JSON bytes.
        claim.observation = None if claim.observation is None else json_bytes(claim.observation)
    # None in a snapshot from before creation numbers, or taken before `state.number_creations`.
    state.creation_seq = data.get("creation_seq")
    state.level = data.get("level", 1)
    state.learners = {row[0]: list(row[1:]) for row in data.get("learners", [])}
    state.cluster_id = data.get("cluster_id")
    recount(state)
    recount_queue_figures(state)
    return state


# What a task's and a once entry's objects cost beyond their payloads, key and error (storage.py).
# A task's is measured by bench.memory (CPython 3.11; a 100-byte input, the node's 64-character
# key, a 112-byte result), as the node's RSS grows per task: the two constants below make its
# charge that growth, QUEUED and SUCCEEDED (MEASURED_*_TASK_BYTES; tests/test_actors_storage.py
# holds them together, and bench.memory prints the ratio of growth to charge, so a drift shows).
# A QUEUED task: the Task (26 slots), its id and creation number, its entries in the task table,
# its queue, its mailbox's index and figures, and its share of what the Raft journal keeps in
# memory until the next compaction (at most 16 MiB, or a quarter of the last dump: ~100 bytes a
# task at a million).
TASK_OVERHEAD_BYTES = 1_184
# A task once delivered, more: its holder's and session's strings, its attempt, the digest of
# the delivery that finished it, the lease's entry in the due-time heap and its delivery id (kept
# until the lease would have ended: every task completed within a lease's length of now), and
# what its QUEUED entries leave behind in the allocator. Charged from its first delivery on.
DELIVERED_TASK_BYTES = 360
# bench.memory's RSS growth per small task (above) at 100,000 tasks, QUEUED and SUCCEEDED (the
# medians of 3 runs: 1,308 to 1,457 and 1,648 to 1,957), which the charge is held to (within 10%).
# Fewer tasks grow more per task (10,000: ~1,460 and ~2,660), for the node's fixed costs (the
# journal's 16 MiB, a space's event log) weigh on few; more grow less (a million, extrapolated
# from 30,000 and 100,000: ~1,300 and ~1,500 to 1,700), for a lease's heap entry goes once the
# lease would have ended. Measure again when the constants above change, or the ratio drifts.
MEASURED_QUEUED_TASK_BYTES = 1_349
MEASURED_SUCCEEDED_TASK_BYTES = 1_821
ONCE_OVERHEAD_BYTES = 512
CLAIM_OVERHEAD_BYTES = 512
EVENT_OVERHEAD_BYTES = 512
# What result_bytes counts for a value that is not a string or bytes, and for each container.
SCALAR_BYTES = 8


def delivery_digest(token: str) -> bytes:
    """What a finished task keeps of the token of the delivery that finished it (Task.finished_by):
    128 bits of its BLAKE2b, 49 bytes in memory where the token takes 120; a complete with another
    token cannot match it but by a collision of 128 bits."""
    return hashlib.blake2b(token.encode(), digest_size=DELIVERY_DIGEST_BYTES).digest()


def share_key_hash(task: Task) -> None:
    """A task without a key of its own is keyed by its input's hash (the API): the two equal
    strings are kept as one object."""
    if task.input_hash == task.key:
        task.input_hash = task.key


def _share_task_strings(state: State, task: Task, shared: dict[str, str]) -> None:
    """A restored task's strings that other objects hold too, as those objects (each row of a
    snapshot decodes into strings of its own): its space's, run's and mailbox's names, and its
    holder's and session's, alike across many tasks. Only the objects change, never a value."""
    space = state.spaces.get(task.space)
    if space is not None:
        task.space = space.id
        mailbox = space.mailboxes.get(task.mailbox)
        if mailbox is not None:
            task.mailbox = mailbox.name
    run = state.runs.get(task.run_id)
    if run is not None:
        task.run_id = run.id
    share_key_hash(task)
    if task.holder is not None:
        task.holder = shared.setdefault(task.holder, task.holder)
    if task.holder_session is not None:
        task.holder_session = shared.setdefault(task.holder_session, task.holder_session)


def _size(value: bytes | str | None) -> int:
    return 0 if value is None else len(value)


def task_bytes(task: Task) -> int:
    """What a task is charged (storage.py): its objects (more once it was delivered), its input,
    key, result and error. (_size written out: this runs twice per settle.)"""
    outcome, error = task.outcome, task.error
    return (
        TASK_OVERHEAD_BYTES + (DELIVERED_TASK_BYTES if task.delivery_count else 0) + len(task.input) + len(task.key)
        + (0 if outcome is None else len(outcome)) + (0 if error is None else len(error))
    )


def once_bytes(entry: Once) -> int:
    """What a once entry is charged (storage.py)."""
    return ONCE_OVERHEAD_BYTES + _size(entry.result) + _size(entry.key) + _size(entry.error)


def result_bytes(value: Any) -> int:
    """What a remembered result weighs (idempotency.py): its strings and bytes, and 8 bytes for
    every other value, container and key. Deterministic, so every replica evicts alike.

    The members of a plain dict or list that are strings, bytes, None or integers are weighed in
    place rather than pushed on the stack (results are mostly such flat dicts); anything else, a
    subclass included, goes the general way: the same value either way."""
    weight = 0
    stack = [value]
    push = stack.append
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            weight += SCALAR_BYTES
            for key, member in item.items():
                if type(key) is str:
                    weight += len(key)
                else:
                    push(key)
                kind = type(member)
                if kind is str or kind is bytes:
                    weight += len(member)
                elif member is None or kind is int or kind is bool:
                    weight += SCALAR_BYTES
                else:
                    push(member)
        elif kind is list:
            weight += SCALAR_BYTES
            for member in item:
                kind = type(member)
                if kind is str or kind is bytes:
                    weight += len(member)
                elif member is None or kind is int or kind is bool:
                    weight += SCALAR_BYTES
                else:
                    push(member)
        elif isinstance(item, (str, bytes)):
            weight += len(item)
        elif isinstance(item, dict):
            weight += SCALAR_BYTES
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            weight += SCALAR_BYTES
            stack.extend(item)
        else:
            weight += SCALAR_BYTES
    return weight


def claim_bytes(claim: Any) -> int:
    """What a claim (claims.Claim, which this module cannot import) is charged (storage.py)."""
    return CLAIM_OVERHEAD_BYTES + _size(claim.key) + _size(claim.observation)


def event_bytes(event: Event) -> int:
    """What an event weighs (events.py bounds a space's log by it): its objects, strings and payload,
    the payload as result_bytes weighs it. Its keys are strings and its values strings, integers
    or None (asserted here, where each value is looked at anyway)."""
    run_id = event.run_id
    weight = EVENT_OVERHEAD_BYTES + (0 if run_id is None else len(run_id)) + len(event.aggregate_id) + SCALAR_BYTES
    for key, value in event.payload.items():
        weight += len(key)
        if isinstance(value, str):
            weight += len(value)
        else:
            assert value is None or isinstance(value, int), event.payload
            weight += SCALAR_BYTES
    return weight


# The tables whose entities have a creation number (`seq`), each kept in creation order.
SEQUENCED_TABLES = ("runs", "tasks", "groups", "barriers", "timers")


def number_in_creation_order(state: State) -> None:
    """Start creation numbers (`state.number_creations`): number every entity there is in the order
    its table keeps (the order it was created in). Applied at one log index on every replica, to the
    same state, so every replica numbers alike. The tables are numbered one after the other: only
    the order within a table is ever compared."""
    assert state.creation_seq is None, "numbered once"
    state.creation_seq = 0
    for table in SEQUENCED_TABLES:
        for entity in getattr(state, table).values():
            entity.seq = state.next_seq()


def recount(state: State) -> None:
    """Every space's charge and the node's, from the tasks and once entries the state holds; and
    the weight of each space's remembered results."""
    state.stored_bytes = 0
    for space in state.spaces.values():
        space.stored_bytes = 0
    for task in state.tasks.values():
        state.spaces[task.space].stored_bytes += task_bytes(task)
    for entry in state.once.values():
        state.spaces[entry.space].stored_bytes += once_bytes(entry)
    for claim in state.claims.values():
        state.spaces[claim.space].stored_bytes += claim_bytes(claim)
    for space in state.spaces.values():
        space.event_bytes = 0
        for event in space.events:
            event.weight = event_bytes(event)
            space.event_bytes += event.weight
    state.stored_bytes = sum(space.stored_bytes for space in state.spaces.values())
    state.idempotency_bytes = {
        space: sum(entry[IDEMPOTENCY_WEIGHT] for entry in table.values()) for space, table in state.idempotency.items()
    }


def recount_queue_figures(state: State) -> None:
    """Every mailbox's QueueFigures, EndedFigures and task index from its tasks. When a restored task became QUEUED is not kept:
    its creation, or the end of its last lease if it was delivered before, stands in for it."""
    state.queue_figures = {}
    state.ended_figures = {}
    state.mailbox_tasks = {}
    queued: list[tuple[int, str, Task]] = []
    for task in state.tasks.values():
        index_task(state, task, 1)
        if task.state in TaskState.TERMINAL:
            count_ended(state, task, task.state, 1)
        elif task.state == TaskState.RUNNING:
            figures_of(state, task).running += 1
        elif task.state == TaskState.QUEUED:
            since_ms = max(task.created_ms, task.lease_expires_ms) if task.delivery_count else task.created_ms
            queued.append((since_ms, task.id, task))
    for since_ms, task_id, task in sorted(queued):
        figures_of(state, task).queued[task_id] = since_ms


def index_task(state: State, task: Task, sign: int) -> None:
    """The task is created (sign 1) or removed with its run (sign -1): state.mailbox_tasks."""
    key = (task.space, task.mailbox)
    if sign > 0:
        state.mailbox_tasks.setdefault(key, {})[task.id] = None
        return
    ids = state.mailbox_tasks[key]
    del ids[task.id]
    if not ids:
        del state.mailbox_tasks[key]


def count_ended(state: State, task: Task, final_state: str, sign: int) -> None:
    """The task ended in `final_state` (sign 1), or, ended, goes with its run (sign -1): its
    mailbox's EndedFigures count it (and go when empty)."""
    key = (task.space, task.mailbox)
    figures = state.ended_figures.get(key)
    if figures is None:
        figures = state.ended_figures[key] = EndedFigures()
    figures.by_state[final_state] = figures.by_state.get(final_state, 0) + sign
    if not figures.by_state[final_state]:
        del figures.by_state[final_state]
    figures.attempts += sign * task.attempt
    if not figures.by_state:
        del state.ended_figures[key]


def figures_of(state: State, task: Task) -> QueueFigures:
    """The QueueFigures of the task's mailbox, made when it has none."""
    figures = state.queue_figures.get((task.space, task.mailbox))
    if figures is None:
        figures = state.queue_figures[(task.space, task.mailbox)] = QueueFigures()
    return figures


def json_bytes(value: Any) -> bytes:
    """A payload as the state keeps it: canonical JSON bytes (sorted keys, compact, UTF-8). The API
    sends payloads already encoded; a command or snapshot written before payloads were kept as
    bytes carries the parsed value, encoded here."""
    if isinstance(value, bytes):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _mailbox_of(space_id: str, row: list[Any]) -> Mailbox:
    """A mailbox row; one of a snapshot from before mailbox ids ([name, mode]) gets an id derived
    from its space and name, the same on every replica."""
    name, mode, *later = row
    if not later:
        digest = hashlib.sha256(f"{space_id}/{name}".encode()).hexdigest()[:20]
        return Mailbox(name=name, mode=mode, id="mbx_" + digest)
    mailbox_id, backlog_limit, max_attempts, requirements, unfinished = later
    return Mailbox(name, mode, mailbox_id, backlog_limit, max_attempts, copy.deepcopy(requirements), unfinished)


# The entity classes of the later rule modules, by State table; registered by those modules
# (register_table) so this module does not import them.
ENTITY_TABLES: dict[str, type] = {}


def register_table(table: str, cls: type) -> None:
    assert table in (
        "claims", "groups", "barriers", "timers", "pools", "rate_limits", "budgets", "slot_leases", "reservations",
        "permit_waiters", "work_limits", "budget_reservations", "allowance_waiters", "allowance_consumptions",
    ), table
    ENTITY_TABLES[table] = cls


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _copied(value: Any) -> Any:
    """Lists and dicts of the live state, copied (a snapshot must not change with the state)."""
    if isinstance(value, (list, tuple)):  # a tuple: EMPTY, written as the empty list it stands for
        return list(value)
    if isinstance(value, dict):
        return dict(value)
    return value
