"""Every rule of a run: create, child, cancel, complete, deadline, retention, effective state.

A run is the unit a swarm is stopped by. Cancelling or completing a run, or its deadline passing,
stops it and every run below it in the same step: their unfinished tasks end CANCELLED (EXPIRED
for a deadline), new work is refused, recorded results stay readable until retention removes them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runstate_server.actors import errors, events, limits, storage
from runstate_server.actors.context import Context, queue_key, task_key
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import (
    DueKind,
    Run,
    RunState,
    State,
    Task,
    TaskState,
    count_ended,
    index_task,
)

# What other kinds of work do when a run stops or is removed, registered by their rule modules
# (once, claims, groups, barriers, timers), called in this same step for the run and every run below it.
# on stop: hook(ctx, run, task_state) with task_state CANCELLED or EXPIRED (a deadline);
# on removal (retention): hook(state, run).
RUN_STOP_HOOKS: list[Callable[[Context, Run, str], None]] = []
RUN_REMOVE_HOOKS: list[Callable[[State, Run], None]] = []
# What other rules do for each unfinished task a stop ends (resources: a running job's holds
# return): hook(ctx, task, task_state), called before the task's state changes.
TASK_STOP_HOOKS: list[Callable[[Context, Task, str], None]] = []


# The outcomeReason of a task its run's stop ended, by the state it ends in.
STOP_REASONS = {TaskState.CANCELLED: "scope_cancelled", TaskState.EXPIRED: "scope_deadline_exceeded"}


def require_run(ctx: Context, run_id: Any) -> Run:
    run = ctx.state.runs.get(run_id) if isinstance(run_id, str) else None
    if run is None or run.space != ctx.space.id:
        raise Rejected(errors.NOT_FOUND, f"run {run_id!r} not found")
    return run


def inactive_reason(state: State, run: Run, now_ms: int) -> tuple[str, str] | None:
    """Why `run` refuses new work, as (code, message); None when it and every run above it are
    active. The nearest stopped run decides the code."""
    current: Run | None = run
    while current is not None:
        if current.stored_state != RunState.ACTIVE:
            which = "run" if current is run else "parent run"
            return (
                errors.SCOPE_CANCELLED,
                f"{which} {current.id} is {current.stored_state.lower()}",
            )
        if current.deadline_ms is not None and now_ms >= current.deadline_ms:
            which = "run" if current is run else "parent run"
            return (errors.DEADLINE_EXCEEDED, f"{which} {current.id} is past its deadline")
        current = state.runs.get(current.parent_id) if current.parent_id else None
    return None


def require_active(ctx: Context, run: Run) -> None:
    reason = inactive_reason(ctx.state, run, ctx.now_ms)
    if reason is not None:
        raise Rejected(*reason)


def require_deadline(ctx: Context, deadline_ms: Any) -> None:
    """A deadline (None, or ms since the epoch) must lie in the future, at most a year ahead."""
    if deadline_ms is None:
        return
    if type(deadline_ms) is not int or deadline_ms <= ctx.now_ms:
        raise Rejected(errors.VALIDATION_FAILED, "deadline must be in the future")
    if deadline_ms - ctx.now_ms > limits.deadline_ms_max:
        raise Rejected(errors.VALIDATION_FAILED, "deadline is more than a year ahead")


def effective(state: State, run: Run, now_ms: int) -> str:
    return "ACTIVE" if inactive_reason(state, run, now_ms) is None else "INACTIVE"


def create(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    name = args.get("name")
    deadline_ms = args.get("deadline_ms")
    child_limit = args.get("child_limit", limits.child_limit_default)
    parent_id = args.get("parent_id")
    if type(child_limit) is not int or not 0 <= child_limit <= limits.child_limit_max:
        raise Rejected(errors.VALIDATION_FAILED, f"childLimit must be an integer from 0 to {limits.child_limit_max}")
    require_deadline(ctx, deadline_ms)
    parent: Run | None = None
    depth = 0
    if parent_id is not None:
        parent = require_run(ctx, parent_id)
        require_active(ctx, parent)
        if len(parent.children) >= parent.child_limit:
            raise Rejected(
                errors.LIMIT_EXCEEDED, f"run {parent.id} already has its limit of {parent.child_limit} child runs"
            )
        depth = parent.depth + 1
        if depth > limits.run_depth_max:
            raise Rejected(errors.LIMIT_EXCEEDED, f"runs nest at most {limits.run_depth_max} deep")
    if ctx.space.run_count >= limits.runs_per_space_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a space holds at most {limits.runs_per_space_max} runs")

    run = Run(
        id="run_" + ctx.command_id,
        space=ctx.space.id,
        name=name,
        parent_id=parent.id if parent else None,
        depth=depth,
        deadline_ms=deadline_ms,
        child_limit=child_limit,
        created_ms=ctx.now_ms,
        seq=ctx.state.next_seq(),
    )
    assert run.id not in ctx.state.runs, "leader generated a duplicate run id"
    ctx.state.runs[run.id] = run
    ctx.space.run_count += 1
    if parent is not None:
        parent.children.append(run.id)
    if deadline_ms is not None:
        ctx.state.arm(deadline_ms, DueKind.DEADLINE, run.id)
    events.run_event(ctx, run, "scope.created")
    return {"run_id": run.id, "run": describe(ctx.state, run, ctx.now_ms)}


def named(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The named root run `name` (`PUT /runs/{name}`): the latest run of that name while it is
    active, else a fresh one that takes the name over, decided in this one step, so every process
    asking after a stop gets the same new run. `deadline_ms` applies only to a run created here.
    The default run of once and queue is the run named "default"."""
    name = args.get("name")
    if not (isinstance(name, str) and 0 < len(name) <= limits.run_name_chars_max):
        raise Rejected(errors.VALIDATION_FAILED, f"a run name is 1 to {limits.run_name_chars_max} characters")
    current = ctx.state.runs.get(ctx.space.run_names.get(name, ""))
    if current is not None and inactive_reason(ctx.state, current, ctx.now_ms) is None:
        return {"run_id": current.id, "run": describe(ctx.state, current, ctx.now_ms), "created": False}
    if name not in ctx.space.run_names and len(ctx.space.run_names) >= limits.run_names_per_space_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a space holds at most {limits.run_names_per_space_max} run names")
    created = create(ctx, {"name": name, "deadline_ms": args.get("deadline_ms")})
    ctx.space.run_names[name] = created["run_id"]
    return {**created, "created": True}


def describe(state: State, run: Run, now_ms: int) -> dict[str, Any]:
    """What the API shows of a run, as plain data (the node renders it)."""
    return {
        "id": run.id,
        "name": run.name,
        "parent_id": run.parent_id,
        "stored_state": run.stored_state,
        "effective": effective(state, run, now_ms),
        "deadline_ms": run.deadline_ms,
        "child_limit": run.child_limit,
        "children": len(run.children),
        "created_ms": run.created_ms,
        "finished_ms": run.finished_ms,
        "reason": run.reason,
    }


def cancel(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return _close(ctx, args, RunState.CANCELLED, reason=args.get("reason"))


def complete(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return _close(ctx, args, RunState.COMPLETED, reason=None)


def _close(ctx: Context, args: dict[str, Any], final_state: str, *, reason: str | None) -> dict[str, Any]:
    """Cancel or complete: idempotent for the same final state, a conflict for the other one."""
    run = require_run(ctx, args.get("run_id"))
    if run.stored_state not in (RunState.ACTIVE, final_state):
        verb = "cancelled" if final_state == RunState.CANCELLED else "completed"
        raise Rejected(
            errors.CONFLICT, f"run {run.id} is {run.stored_state.lower()}; it cannot be {verb} as well"
        )
    if run.stored_state == RunState.ACTIVE:
        run.stored_state = final_state
        run.reason = reason
        _stop(ctx, run, TaskState.CANCELLED, args["retention_ms"], "scope." + final_state.lower())
    return {"run_id": run.id, "run": describe(ctx.state, run, ctx.now_ms)}


def on_deadline(ctx: Context, run_id: str, retention_ms: int) -> None:
    run = ctx.state.runs.get(run_id)
    if run is None or run.stored_state != RunState.ACTIVE:
        return  # already stopped (or removed): its tasks are final already
    _stop(ctx, run, TaskState.EXPIRED, retention_ms, "scope.expired")


def on_retention(ctx: Context, run_id: str) -> None:
    run = ctx.state.runs.get(run_id)
    if run is None:
        return  # removed with an ancestor already
    state = ctx.state
    parent = state.runs.get(run.parent_id) if run.parent_id else None
    if parent is not None:
        parent.children.remove(run.id)
    for member in subtree(state, run):
        space = state.spaces[member.space]
        for queue in member.queues.values():
            for task_id in queue.by_key.values():
                task = state.tasks.pop(task_id)
                index_task(state, task, -1)
                storage.charge(state, space.id, -storage.task_bytes(task))
                if task.state in TaskState.TERMINAL:
                    count_ended(state, task, task.state, -1)
        for remove_hook in RUN_REMOVE_HOOKS:
            remove_hook(state, member)
        space.task_count -= member.task_count
        space.run_count -= 1
        if member.name is not None and space.run_names.get(member.name) == member.id:
            del space.run_names[member.name]  # the name's next PUT creates a fresh run anyway
        del state.runs[member.id]


def subtree(state: State, run: Run) -> list[Run]:
    """`run` and every run below it, parents before children."""
    found = [run]
    index = 0
    while index < len(found):
        found.extend(state.runs[child_id] for child_id in found[index].children)
        index += 1
    return found


# The event of a run below the one stopped, by the state the stop ends tasks in: a cancel and a
# complete cancel what is below (its tasks end CANCELLED), a deadline expires it.
CASCADE_EVENTS = {TaskState.CANCELLED: "scope.cancelled", TaskState.EXPIRED: "scope.expired"}


def _stopped_already(state: State, run: Run) -> bool:
    """Whether a stop reached `run` before: its own (its finished_ms is set by the stop that
    started at it) or one of a run above it."""
    current: Run | None = run
    depth = 0
    while current is not None and depth <= limits.run_depth_max:
        if current.finished_ms is not None:
            return True
        current = state.runs.get(current.parent_id) if current.parent_id else None
        depth += 1
    return False


def ended_by_stop(state: State, run: Run) -> list[Run]:
    """The runs a stop of `run` ends, parents before children: `run` and those below it, except
    the ones a stop reached before (and everything below them)."""
    if _stopped_already(state, run):
        return []
    found = [run]
    index = 0
    while index < len(found):
        for child_id in found[index].children:
            child = state.runs[child_id]
            if child.finished_ms is None:
                found.append(child)
        index += 1
    return found


def _stop(ctx: Context, run: Run, task_state: str, retention_ms: int, event_type: str) -> None:
    """Stop `run` and everything below it in this one step. Each run it ends (not stopped before)
    has its event once, parents first: `event_type` for `run`, CASCADE_EVENTS for those below,
    each naming `run` as stoppedBy; then the tasks it ends have theirs."""
    now_ms = ctx.now_ms
    for ended in ended_by_stop(ctx.state, run):
        events.run_event(ctx, ended, event_type if ended is run else CASCADE_EVENTS[task_state], stopped_by=run)
    for member in subtree(ctx.state, run):
        for mailbox, queue in member.queues.items():
            for task_id in queue.by_key.values():
                task = ctx.state.tasks[task_id]
                if task.state in TaskState.TERMINAL:
                    continue
                for task_stop_hook in TASK_STOP_HOOKS:
                    task_stop_hook(ctx, task, task_state)
                events.task_event(ctx, task, task_state)
                task.state = task_state
                task.outcome_reason = STOP_REASONS[task_state]
                task.finished_ms = now_ms
                ctx.wake(task_key(task.id))
            queue.ready.clear()
            ctx.wake(queue_key(member.id, mailbox))
        for stop_hook in RUN_STOP_HOOKS:
            stop_hook(ctx, member, task_state)
    if run.finished_ms is None:
        run.finished_ms = now_ms
        ctx.state.arm(now_ms + retention_ms, DueKind.RETENTION, run.id)
