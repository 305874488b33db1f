"""Every rule of a space's event log: what happened in the space, in the order it was applied.

An event is appended by the very command step that makes the change it records (`emit`, one call
where each change happens), so an event exists exactly when its change was applied, and the log's
order is the apply order. The log is replicated state: every replica appends the same events with
the same numbers, and snapshots carry it, so a cursor read on one leader resumes on the next.

Each space numbers its events 1, 2, 3 ... (`Space.event_seq` is the latest); entries are only ever
dropped from the front, so the kept numbers are contiguous. A reader's cursor is the number of the
last event it has seen; reading resumes after it. A cursor before the oldest kept entry lost
events in between: CursorExpired.

Bounds (limits.py): at most `events_per_space_max` entries, the oldest dropped by the step that
appends past it; entries older than `event_age_ms_max` dropped by the tick (one due entry per space
with a log, armed when its first entry is appended and re-armed while entries remain, at most every
`event_prune_interval_ms`) and by the next append; and at most `event_bytes_per_space_max` bytes
(`state.event_bytes`: a fixed overhead per entry, its ids and payload), the oldest dropped first.
That weight is the log's own, apart from what tasks are charged (storage.py): an event is never
refused, since the change it records is applied anyway.

What is emitted (type: aggregate, payload):
  scope.created | scope.cancelled | scope.completed | scope.expired   scope: {scopeId, parentId?}
  task.created | task.queued | task.running | task.succeeded | task.failed | task.cancelled |
  task.expired                                                        task: {taskId, state, attempt}
  delivery.lease_lost                                                 task: {taskId, attempt, holder?}
  group.finalized                                                     group: {groupId, outcome, outcomeReason}
  barrier.released                                                    barrier: {barrierId, epoch}
  timer.fired                                                         timer: {timerId}
  permit.granted | permit.released | permit.lease_lost                permit: {permitId, grantId, units,
                                                                        holder, waiterId | reason}
  permit.waiter_signaled                                              permit: {permitId, waiterId, units, holder}
  allowance.consumed | allowance.settled | allowance.cooldown         allowance: {allowanceId, consumptionId ...}
  budget.reserved | budget.settled | budget.voided | budget.stale      budget: {budgetId, reservationId, taskId,
                                                                        state, amounts as strings ...}
A run's stop (runs.py) emits a scope.* event for every run it ends, once, parents first, each
naming the run stopped (stoppedBy); then, run by run, the tasks it ends emit theirs and so does
what else it ends (grants released, reservations voided: reason scope_stopped). A job's slots, units and
reservations taken with its delivery and returned at its end emit nothing: the task's own events
record them (a busy queue with requirements would otherwise multiply the log's entries per task).
Payloads hold ids, states and numbers, never a user's payload (a cooldown's reason, bounded, is
the one text).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from runstate_server.actors import limits
from runstate_server.actors.context import Context
from runstate_server.actors.state import (
    EVENT_OVERHEAD_BYTES,
    SCALAR_BYTES,
    DueKind,
    Event,
    Run,
    Space,
    State,
    Task,
    TaskState,
    event_bytes,
)

# Long polls on a space's log (GET /watch) park on this key; every append wakes it.
EVENTS_WAKE = "events"


def events_key(space_id: str) -> tuple[str, str]:
    return (EVENTS_WAKE, space_id)


class CursorExpired(Exception):
    """The cursor is older than what the log keeps: events after it were dropped."""


class CursorAhead(Exception):
    """The cursor names an event the log never had (a made-up cursor)."""


# -- appending -----------------------------------------------------------------------------------


def emit(
    ctx: Context, event_type: str, run_id: str | None, aggregate_type: str, aggregate_id: str, payload: dict[str, Any],
    weight: int | None = None,
) -> None:
    """Append one event to the command's space, in this step. `weight`: its event_bytes, when the
    caller knows it (task_event); else weighed here."""
    space = ctx.space
    if not space.id:
        return  # a tick's entity whose space is gone: nothing of a space changed
    had_events = bool(space.events)
    space.event_seq += 1
    event = Event(space.event_seq, ctx.now_ms, event_type, run_id, aggregate_type, aggregate_id, payload)
    # event_bytes asserts that the payload holds str, int or None values only.
    event.weight = event_bytes(event) if weight is None else weight
    space.events.append(event)
    space.event_bytes += event.weight
    _drop(space, ctx.now_ms)
    if not had_events:
        # A log that was empty has no due entry (the last one found it empty and stopped): arm one.
        ctx.state.arm(ctx.now_ms + limits.event_age_ms_max, DueKind.EVENTS_AGE, space.id)
    ctx.wake(events_key(space.id))


def run_event(ctx: Context, run: Run, event_type: str, stopped_by: Run | None = None) -> None:
    """scope.created; scope.cancelled, scope.completed, scope.expired, naming the run whose stop
    ended it (`stopped_by`: itself, or the run above it that was stopped)."""
    payload: dict[str, Any] = {"scopeId": run.id, "parentId": run.parent_id}
    if stopped_by is not None:
        payload["stoppedBy"] = stopped_by.id
    emit(ctx, event_type, run.id, "scope", run.id, payload)


# What event_bytes weighs of a task event besides its run id, its task id (twice: the aggregate's and
# the payload's) and its state: the overhead, the payload's container, its three keys and the
# attempt (an int). Three events per task: they are weighed without event_bytes's walk.
_TASK_EVENT_WEIGHT = EVENT_OVERHEAD_BYTES + SCALAR_BYTES + len("taskId") + len("state") + len("attempt") + SCALAR_BYTES
# task.<state> of each state, made once.
_TASK_EVENT_TYPES = {state: "task." + state.lower() for state in (TaskState.QUEUED, TaskState.RUNNING, *TaskState.TERMINAL)}


def task_event(ctx: Context, task: Task, state: str, event_type: str | None = None) -> None:
    """task.<state> as the task enters `state` (called before or after the assignment; nothing when
    the task is in that state already, unless `event_type` names the event: task.created)."""
    if event_type is None:
        if task.state == state:
            return
        event_type = _TASK_EVENT_TYPES[state]
    task_id, run_id, attempt = task.id, task.run_id, task.attempt
    assert type(attempt) is int
    emit(ctx, event_type, run_id, "task", task_id, {"taskId": task_id, "state": state, "attempt": attempt},
         _TASK_EVENT_WEIGHT + len(run_id) + 2 * len(task_id) + len(state))


def lease_lost(ctx: Context, task: Task) -> None:
    """A delivery's lease lapsed: its task is queued again (another worker takes it over) or fails."""
    emit(ctx, "delivery.lease_lost", task.run_id, "task", task.id,
         {"taskId": task.id, "attempt": task.attempt, "holder": task.holder})


# -- dropping ------------------------------------------------------------------------------------


def _drop(space: Space, now_ms: int) -> None:
    """Drop the oldest entries past the log's count, its weight or their age (the newest entry, just
    appended, is always kept)."""
    events = space.events
    count_max, bytes_max = limits.events_per_space_max, limits.event_bytes_per_space_max
    oldest_kept_ms = now_ms - limits.event_age_ms_max
    while events and (
        len(events) > count_max
        or (space.event_bytes > bytes_max and len(events) > 1)
        or events[0].created_ms <= oldest_kept_ms
    ):
        space.event_bytes -= events.popleft().weight


def on_age_due(ctx: Context, space_id: str, due_ms: int) -> None:
    """The space's oldest entries reached their age: drop them; re-arm while entries remain."""
    space = ctx.state.spaces.get(space_id)
    if space is None:
        return
    _drop(space, ctx.now_ms)
    if space.events:
        next_ms = max(space.events[0].created_ms + limits.event_age_ms_max, ctx.now_ms + limits.event_prune_interval_ms)
        ctx.state.arm(next_ms, DueKind.EVENTS_AGE, space.id)


# -- reading -------------------------------------------------------------------------------------


def oldest_seq(space: Space | None) -> int:
    """The number of the oldest kept event (the next one's when none is kept)."""
    if space is None:
        return 1
    return space.events[0].seq if space.events else space.event_seq + 1


def head_seq(space: Space | None) -> int:
    return 0 if space is None else space.event_seq


def read(
    space: Space | None, after_seq: int | None, limit: int, match: Callable[[Event], bool] | None = None
) -> tuple[list[Event], int]:
    """Up to `limit` events after `after_seq` (None: from the oldest kept) that `match`, oldest
    first; and the cursor to resume from: the last event returned when the page is full, else the
    latest event looked at (no matching event lies between). CursorExpired when events after
    `after_seq` were dropped; CursorAhead past the latest event."""
    first = oldest_seq(space)
    if after_seq is None:
        after_seq = first - 1
    if after_seq < first - 1:
        raise CursorExpired(f"events {after_seq + 1} to {first - 1} were dropped; the oldest kept is {first}")
    if after_seq > head_seq(space):
        raise CursorAhead(f"cursor {after_seq} is past the latest event {head_seq(space)}")
    found: list[Event] = []
    if space is None:
        return found, after_seq
    for event in itertools.islice(space.events, after_seq + 1 - first, None):
        if match is None or match(event):
            found.append(event)
            if len(found) >= limit:
                return found, event.seq
    return found, space.event_seq


def matcher(
    state: State, types: frozenset[str] | None, aggregate: tuple[str, str] | None, run_id: str | None
) -> Callable[[Event], bool] | None:
    """The filter of a watch: any of `types`, about `aggregate` (type, id), of the run `run_id` or a
    run below it (a run that was removed matches only itself). None: every event."""
    if types is None and aggregate is None and run_id is None:
        return None
    below: dict[str, bool] = {}  # run id -> in run_id's subtree, computed once per run

    def in_subtree(candidate: str | None) -> bool:
        if candidate is None:
            return False
        if candidate not in below:
            current = state.runs.get(candidate)
            depth = 0
            while current is not None and current.id != run_id and depth <= limits.run_depth_max:
                current = state.runs.get(current.parent_id) if current.parent_id else None
                depth += 1
            below[candidate] = candidate == run_id or current is not None
        return below[candidate]

    def match(event: Event) -> bool:
        if types is not None and event.type not in types:
            return False
        if aggregate is not None and (event.aggregate_type, event.aggregate_id) != aggregate:
            return False
        return run_id is None or in_subtree(event.run_id)

    return match


def describe(event: Event) -> dict[str, Any]:
    """What the API shows of an event, as plain data (the node renders the time)."""
    return {
        "event_id": f"evt_{event.seq}",
        "seq": event.seq,
        "type": event.type,
        "created_ms": event.created_ms,
        "run_id": event.run_id,
        "aggregate_type": event.aggregate_type,
        "aggregate_id": event.aggregate_id,
        "payload": dict(event.payload),
    }


DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {DueKind.EVENTS_AGE: on_age_due}
