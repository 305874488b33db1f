"""Every rule of a task group: create, members, close, verdicts, the decision and its deadline.

A group owns a run of its own (the gate) and delivers its members as tasks of that run through one
work queue. Members get verdicts (accept, reject); the group finalizes exactly once, as soon as its
condition is decided, and in that same step cancels its run: unfinished members end CANCELLED,
workers are refused, and verdicts arriving afterwards are recorded as late and change nothing.

    condition       SUCCESS when                                  FAILURE when
    FIRST_ACCEPTED  a member is accepted (first_accepted)         the deadline passes (deadline)
    N_ACCEPTED      `threshold` members are accepted, open or     closed and accepted + could still
                    closed (threshold_reached)                    be accepted < threshold
                                                                  (threshold_unreachable); deadline
    ALL_TERMINAL    closed, every member finished, at least one   closed and every member finished
                    accepted and none rejected (all_terminal)     otherwise (all_terminal); deadline

Any condition also fails with `cancelled` when the group's run stops for another reason (it, or a
run above it, is cancelled, completed or passes its deadline).

"Could still be accepted": members whose task has not finished, plus SUCCEEDED members without a
verdict. A member is finished when its task is FAILED, CANCELLED or EXPIRED, or SUCCEEDED with a
verdict: a success is not finished until it is judged, so for ALL_TERMINAL the verdict on the
last member to succeed still counts (deciding when the last task ends would make every verdict a
race with the workers, the last one always lost). Every
member is a task of the group's run, so its finishing and its run's stop reach the group through
tasks.TASK_FINISHED_HOOKS and runs.RUN_STOP_HOOKS in the same step.

A member may also be an outside task, joined with `join`: any task of a WORK mailbox in the
space (of another run, e.g. the run the group was made from, or of a run below the group's) that
is not a member of another group. Its finishing reaches the group through its `group_id`, its
run's stop through runs.RUN_STOP_HOOKS; finalizing cancels it if unfinished, as it cancels the
members of the group's run. Its run may be removed before the group (after its own retention):
the group keeps its key and final state (`outside`) to show and count it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from runstate_server.actors import errors, events, limits, runs, tasks
from runstate_server.actors.context import Context
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import DueKind, Run, RunState, State, Task, TaskState, register_table


class GroupState:
    OPEN: Final = "OPEN"  # new members may join
    SEALED: Final = "SEALED"  # closed to new members, not decided yet
    FINALIZED: Final = "FINALIZED"  # decided; final


class Condition:
    FIRST_ACCEPTED: Final = "FIRST_ACCEPTED"
    N_ACCEPTED: Final = "N_ACCEPTED"
    ALL_TERMINAL: Final = "ALL_TERMINAL"

    ALL: Final = (FIRST_ACCEPTED, N_ACCEPTED, ALL_TERMINAL)


class Outcome:
    SUCCESS: Final = "SUCCESS"
    FAILURE: Final = "FAILURE"


class Reason:
    """The outcomeReason of a finalized group."""

    FIRST_ACCEPTED: Final = "first_accepted"
    THRESHOLD_REACHED: Final = "threshold_reached"
    THRESHOLD_UNREACHABLE: Final = "threshold_unreachable"
    ALL_TERMINAL: Final = "all_terminal"
    DEADLINE: Final = "deadline"  # the group's own deadline passed first
    CANCELLED: Final = "cancelled"  # its run stopped for another reason (cancel, complete, a parent's deadline)


class Verdict:
    ACCEPTED: Final = "ACCEPTED"
    REJECTED: Final = "REJECTED"


@dataclass(slots=True)
class Group:
    id: str
    space: str
    run_id: str  # the group's own run: its members are tasks of this run
    parent_id: str | None  # the run the group's run is a child of
    mailbox: str
    condition: str
    threshold: int | None
    expected_members: int | None
    deadline_ms: int | None
    retention_ms: int  # how long its run is kept after finalizing cancels it
    created_ms: int
    state: str = GroupState.OPEN
    outcome: str | None = None
    outcome_reason: str | None = None
    finalized_ms: int | None = None
    members: list[str] = field(default_factory=list)  # task ids, in the order they joined
    verdicts: dict[str, str] = field(default_factory=dict)  # task id -> ACCEPTED | REJECTED
    late: list[str] = field(default_factory=list)  # task ids whose verdict came after finalizing
    # task id -> the holder that gave its verdict, when the caller declared one. Last, with a
    # default: a snapshot from before it has rows without it and loads with {}.
    verdict_by: dict[str, str] = field(default_factory=dict)
    # Members from outside the group's run: task id -> [key, final state or None while unfinished]
    # (kept for when their run is removed first). Last, with a default, as verdict_by.
    outside: dict[str, list[Any]] = field(default_factory=dict)
    seq: int = 0  # its number in the state's creation order (State.creation_seq); last, as verdict_by


register_table("groups", Group)


def group_key(group_id: str) -> tuple[str, str]:
    """The waiter key woken whenever the group changes (members, state, verdicts)."""
    return ("group", group_id)


def require_group(ctx: Context, group_id: Any) -> Group:
    group = ctx.state.groups.get(group_id) if isinstance(group_id, str) else None
    if group is None or group.space != ctx.space.id:
        raise Rejected(errors.NOT_FOUND, f"group {group_id!r} not found")
    assert isinstance(group, Group)
    return group


# -- commands ------------------------------------------------------------------------------------


def create(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    condition = args.get("condition")
    threshold = args.get("threshold")
    expected = args.get("expected_members")
    deadline_ms = args.get("deadline_ms")
    mailbox = args.get("mailbox")
    members_max = limits.group_members_max
    if condition not in Condition.ALL:
        raise Rejected(errors.VALIDATION_FAILED, f"condition must be one of {', '.join(Condition.ALL)}, not {condition!r}")
    if condition == Condition.N_ACCEPTED:
        if type(threshold) is not int or not 1 <= threshold <= members_max:
            raise Rejected(errors.VALIDATION_FAILED, f"N_ACCEPTED needs a threshold from 1 to {members_max}")
    elif threshold is not None:
        raise Rejected(errors.VALIDATION_FAILED, "threshold applies only to the condition N_ACCEPTED")
    if expected is not None:
        if type(expected) is not int or not 1 <= expected <= members_max:
            raise Rejected(errors.VALIDATION_FAILED, f"expectedMembers must be an integer from 1 to {members_max}")
        if threshold is not None and expected < threshold:
            raise Rejected(errors.VALIDATION_FAILED, f"expectedMembers ({expected}) is lower than threshold ({threshold})")
    runs.require_deadline(ctx, deadline_ms)
    # The API names the mailbox by id; `mailbox` (its name) is kept for commands of the journal
    # written before the old routes were removed, which a restart replays.
    mailbox_id = args.get("mailbox_id")
    if isinstance(mailbox_id, str):
        mailbox = ctx.space.mailbox_names.get(mailbox_id)
    if not isinstance(mailbox, str) or mailbox not in ctx.space.mailboxes:
        shown = mailbox_id if isinstance(mailbox_id, str) else mailbox
        raise Rejected(errors.NOT_FOUND, f"mailbox {shown!r} not found; create it with mailboxes.ensure")
    if ctx.space.mailboxes[mailbox].mode == tasks.INBOX:
        raise Rejected(errors.VALIDATION_FAILED, f"mailbox {mailbox!r} is an INBOX: a group's members are tasks of a WORK queue")
    # The run the call is made from (scopeId, an extension our SDK sends): it must exist and accept
    # work, like any other new work. Without it only parentScopeId is checked, below.
    if args.get("run_id") is not None:
        runs.require_active(ctx, runs.require_run(ctx, args.get("run_id")))

    group_id = "grp_" + ctx.command_id
    assert group_id not in ctx.state.groups, "leader generated a duplicate group id"
    # Checks the parent (NOT_FOUND, SCOPE_CANCELLED, LIMIT_EXCEEDED) before it changes anything.
    run_id = runs.create(ctx, {"name": f"group {group_id}", "parent_id": args.get("parent_id")})["run_id"]
    run = ctx.state.runs[run_id]
    run.group_id = group_id
    group = Group(
        id=group_id,
        space=ctx.space.id,
        run_id=run_id,
        parent_id=run.parent_id,
        mailbox=mailbox,
        condition=condition,
        threshold=threshold,
        expected_members=expected,
        deadline_ms=deadline_ms,
        retention_ms=args["retention_ms"],
        created_ms=ctx.now_ms,
        seq=ctx.state.next_seq(),
    )
    ctx.state.groups[group_id] = group
    if deadline_ms is not None:
        ctx.state.arm(deadline_ms, DueKind.GROUP_DEADLINE, group_id)
    return {"group_id": group_id, "run_id": run_id}


def submit(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Submit a member task to the group's run. A key that names a member already (with the same
    input) returns that member, even after the group closed."""
    group = require_group(ctx, args.get("group_id"))
    key, input_hash = args["key"], args["input_hash"]
    queue = ctx.state.runs[group.run_id].queues.get(group.mailbox)
    existing_id = queue.by_key.get(key) if queue is not None else None
    if existing_id is not None and existing_id in group.members:
        if ctx.state.tasks[existing_id].input_hash != input_hash:
            raise Rejected(errors.KEY_CONFLICT, f"member key {key!r} is already used with a different input")
        return {"task_id": existing_id, "created": False, "group_state": group.state}
    _require_open(ctx, group)
    submitted = tasks.submit(
        ctx,
        {
            "run_id": group.run_id,
            "mailbox": group.mailbox,
            "key": key,
            "input": args.get("input"),
            "input_hash": input_hash,
            "attempts": args.get("attempts", limits.attempts_default),
            # The protocol's member fields: its own deadline, and its requirements (else the
            # mailbox's declared ones, as for any task).
            "deadline_ms": args.get("deadline_ms"),
            "requirements": args.get("requirements"),
        },
    )
    _join(ctx, group, submitted["task_id"])
    # The group's state as this step left it (the member that completes expectedMembers seals it).
    return {"task_id": submitted["task_id"], "created": submitted["created"], "group_state": group.state}


def join(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Add an existing task as a member: one of the group's run (e.g. submitted there directly) or
    an outside one (of any run of the space), of a WORK mailbox, not a member of another group."""
    group = require_group(ctx, args.get("group_id"))
    task_id = args.get("task_id")
    task = ctx.state.tasks.get(task_id) if isinstance(task_id, str) else None
    if task is None or task.space != ctx.space.id:
        raise Rejected(errors.NOT_FOUND, f"task {task_id!r} not found")
    if task.id in group.members:
        return {"task_id": task.id, "joined": False, "group_state": group.state}
    owner = group_of(ctx.state, task)
    if owner is not None:
        raise Rejected(errors.CONFLICT, f"task {task.id} is a member of group {owner.id}; a task joins one group")
    mailbox = ctx.space.mailboxes.get(task.mailbox)
    if mailbox is not None and mailbox.mode == tasks.INBOX:
        raise Rejected(errors.CONFLICT, f"task {task.id} is a message of the INBOX {task.mailbox!r}, not a job")
    _require_open(ctx, group)
    _join(ctx, group, task.id)
    return {"task_id": task.id, "joined": True, "group_state": group.state}


def group_of(state: State, task: Task) -> Group | None:
    """The group `task` is a member of, if any (by its group_id, else its run's group)."""
    group_id = task.group_id
    if group_id is None:
        run = state.runs.get(task.run_id)
        group_id = run.group_id if run is not None else None
    group = state.groups.get(group_id) if group_id is not None else None
    return group if group is not None and task.id in group.members else None


def member_state(state: State, group: Group, task_id: str) -> tuple[str, str]:
    """(key, state) of a member: its task's, or what the group kept of an outside member whose
    run was removed (it was finished then)."""
    task = state.tasks.get(task_id)
    if task is not None:
        return task.key, task.state
    key, final = group.outside[task_id]
    assert final is not None, f"outside member {task_id} was removed unfinished"
    return key, final


def close(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """No new members; decide right away what the full member list decides. Idempotent."""
    group = require_group(ctx, args.get("group_id"))
    if group.state == GroupState.OPEN:
        group.state = GroupState.SEALED
        ctx.wake(group_key(group.id))
    evaluate(ctx, group)
    return decision(group)


def seal(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The deprecated close of the protocol: the same, but CONFLICT on a group decided before it
    (a seal that decides the group answers its decision)."""
    group = require_group(ctx, args.get("group_id"))
    if group.state == GroupState.FINALIZED:
        raise Rejected(
            errors.CONFLICT, f"group {group.id} is finalized ({group.outcome} {group.outcome_reason}): it cannot be sealed"
        )
    return close(ctx, args)


def accept(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Accept a SUCCEEDED member; args `group_id`, `task_id`, `holder` (who gives it, or None)."""
    return _judge(ctx, args, Verdict.ACCEPTED)


def reject(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Reject a finished member; args as for accept."""
    return _judge(ctx, args, Verdict.REJECTED)


def decision(group: Group) -> dict[str, Any]:
    return {"group_id": group.id, "state": group.state, "outcome": group.outcome, "outcome_reason": group.outcome_reason}


# -- the rules -----------------------------------------------------------------------------------


def _deadline_passed(ctx: Context, group: Group) -> bool:
    return group.deadline_ms is not None and ctx.now_ms >= group.deadline_ms


def _require_open(ctx: Context, group: Group) -> None:
    if group.outcome_reason == Reason.CANCELLED:
        # Its run was stopped from outside: new members are new work of a stopped run, refused as
        # every other kind is (SCOPE_CANCELLED, or DEADLINE_EXCEEDED for a deadline above it).
        run = ctx.state.runs.get(group.run_id)
        inactive = runs.inactive_reason(ctx.state, run, ctx.now_ms) if run is not None else None
        if inactive is not None:
            raise Rejected(*inactive)
    if group.state != GroupState.OPEN:
        raise Rejected(errors.CONFLICT, f"group {group.id} is {group.state.lower()}: it takes no new members")
    if _deadline_passed(ctx, group):
        raise Rejected(errors.CONFLICT, f"group {group.id} is past its deadline: it takes no new members")
    if len(group.members) >= limits.group_members_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a group holds at most {limits.group_members_max} members")


def _join(ctx: Context, group: Group, task_id: str) -> None:
    assert group.state == GroupState.OPEN and task_id not in group.members
    task = ctx.state.tasks[task_id]
    task.group_id = group.id
    if task.run_id != group.run_id:
        group.outside[task_id] = [task.key, task.state if task.state in TaskState.TERMINAL else None]
    group.members.append(task_id)
    if group.expected_members is not None and len(group.members) >= group.expected_members:
        group.state = GroupState.SEALED  # the member that completes the list closes the group
    ctx.wake(group_key(group.id))
    evaluate(ctx, group)


def _judge(ctx: Context, args: dict[str, Any], verdict: str) -> dict[str, Any]:
    group = require_group(ctx, args.get("group_id"))
    task_id, holder = args.get("task_id"), args.get("holder")
    assert holder is None or isinstance(holder, str), holder  # the API checked it (holder_of)
    if not isinstance(task_id, str) or task_id not in group.members:
        raise Rejected(errors.NOT_FOUND, f"task {task_id!r} is not a member of group {group.id}")
    recorded = group.verdicts.get(task_id)
    if recorded is not None:
        if recorded != verdict:
            raise Rejected(errors.CONFLICT, f"member {task_id} is {recorded.lower()} already; a verdict is final")
        return _verdict_answer(group, task_id)
    task_state = member_state(ctx.state, group, task_id)[1]
    if verdict == Verdict.ACCEPTED and task_state != TaskState.SUCCEEDED:
        raise Rejected(errors.CONFLICT, f"only a SUCCEEDED member can be accepted; task {task_id} is {task_state}")
    if verdict == Verdict.REJECTED and task_state not in TaskState.TERMINAL:
        raise Rejected(errors.CONFLICT, f"only a finished member can be rejected; task {task_id} is {task_state}")
    if group.state != GroupState.FINALIZED and _deadline_passed(ctx, group):
        _finalize(ctx, group, Outcome.FAILURE, Reason.DEADLINE)  # the tick has not run yet
    group.verdicts[task_id] = verdict
    if holder is not None:
        group.verdict_by[task_id] = holder  # recorded with the verdict, so as final as it is
    if group.state == GroupState.FINALIZED:
        group.late.append(task_id)
    ctx.wake(group_key(group.id))
    evaluate(ctx, group)
    return _verdict_answer(group, task_id)


def _verdict_answer(group: Group, task_id: str) -> dict[str, Any]:
    return {"task_id": task_id, "verdict": group.verdicts[task_id], "late": task_id in group.late, **decision(group)}


def evaluate(ctx: Context, group: Group) -> None:
    """Finalize the group if its condition is decided now. Idempotent; a no-op once finalized."""
    if group.state == GroupState.FINALIZED:
        return
    if _deadline_passed(ctx, group):
        _finalize(ctx, group, Outcome.FAILURE, Reason.DEADLINE)
        return
    decided = _decide(ctx.state, group)
    if decided is not None:
        _finalize(ctx, group, *decided)


def _decide(state: State, group: Group) -> tuple[str, str] | None:
    """The (outcome, reason) the members decide now, or None while undecided."""
    accepted = rejected = unfinished = unjudged_successes = 0
    for task_id in group.members:
        verdict = group.verdicts.get(task_id)
        task_state = member_state(state, group, task_id)[1]
        if verdict == Verdict.ACCEPTED:
            accepted += 1
        elif verdict == Verdict.REJECTED:
            rejected += 1
        elif task_state == TaskState.SUCCEEDED:
            unjudged_successes += 1
        if task_state not in TaskState.TERMINAL:
            unfinished += 1
    closed = group.state == GroupState.SEALED
    if group.condition == Condition.FIRST_ACCEPTED:
        return (Outcome.SUCCESS, Reason.FIRST_ACCEPTED) if accepted >= 1 else None
    if group.condition == Condition.N_ACCEPTED:
        assert group.threshold is not None
        if accepted >= group.threshold:
            return Outcome.SUCCESS, Reason.THRESHOLD_REACHED
        if closed and accepted + unfinished + unjudged_successes < group.threshold:
            return Outcome.FAILURE, Reason.THRESHOLD_UNREACHABLE
        return None
    assert group.condition == Condition.ALL_TERMINAL
    if not closed or unfinished or unjudged_successes:
        return None
    success = accepted >= 1 and rejected == 0
    return (Outcome.SUCCESS if success else Outcome.FAILURE), Reason.ALL_TERMINAL


def _finalize(ctx: Context, group: Group, outcome: str, reason: str, *, cancel_run: bool = True) -> None:
    """Record the decision and cancel the group's run in this same step (its unfinished members
    end CANCELLED, its queue refuses workers). `cancel_run` is False when the run is stopping
    already (the decision is its stop)."""
    assert group.state != GroupState.FINALIZED
    group.state = GroupState.FINALIZED
    group.outcome = outcome
    group.outcome_reason = reason
    group.finalized_ms = ctx.now_ms
    events.emit(ctx, "group.finalized", group.run_id, "group", group.id, {"groupId": group.id, "outcome": outcome, "outcomeReason": reason})
    ctx.wake(group_key(group.id))
    run = ctx.state.runs.get(group.run_id)
    why = f"group {group.id} finalized: {outcome} {reason}"
    if cancel_run and run is not None and run.stored_state == RunState.ACTIVE:
        runs.cancel(ctx, {"run_id": run.id, "reason": why, "retention_ms": group.retention_ms})
    for task_id in list(group.outside):  # outside members are not tasks of that run
        task = ctx.state.tasks.get(task_id)
        if task is not None and task.state not in TaskState.TERMINAL:
            tasks.cancel(ctx, {"task_id": task_id, "reason": why})


# -- hooks and time ------------------------------------------------------------------------------


def _on_task_finished(ctx: Context, task: Task) -> None:
    group = group_of(ctx.state, task)
    if group is not None:
        if task.id in group.outside:
            group.outside[task.id][1] = task.state
        evaluate(ctx, group)


def _on_run_stop(ctx: Context, run: Run, task_state: str) -> None:
    _outside_members_stopped(ctx, run)
    group = ctx.state.groups.get(run.group_id) if run.group_id else None
    if group is None or group.state == GroupState.FINALIZED:
        return  # not a group's run, or the group's decision is what stops it
    reason = Reason.DEADLINE if _deadline_passed(ctx, group) else Reason.CANCELLED
    _finalize(ctx, group, Outcome.FAILURE, reason, cancel_run=False)


def _outside_members_stopped(ctx: Context, run: Run) -> None:
    """`run` stopped, ending its unfinished tasks: record those that are outside members of a
    group, and evaluate those groups (unless their own run stops too: it decides them)."""
    touched: dict[str, Group] = {}
    for queue in run.queues.values():
        for task_id in queue.by_key.values():
            task = ctx.state.tasks[task_id]
            if task.group_id is None or task.group_id == run.group_id:
                continue
            group = ctx.state.groups.get(task.group_id)
            if group is not None and task_id in group.outside:
                group.outside[task_id][1] = task.state
                touched[group.id] = group
    for group in touched.values():
        group_run = ctx.state.runs.get(group.run_id)
        if group_run is not None and runs.inactive_reason(ctx.state, group_run, ctx.now_ms) is None:
            ctx.wake(group_key(group.id))
            evaluate(ctx, group)


def _on_run_remove(state: State, run: Run) -> None:
    if run.group_id is not None:
        state.groups.pop(run.group_id, None)


def on_deadline(ctx: Context, group_id: str, due_ms: int) -> None:
    group = ctx.state.groups.get(group_id)
    if group is None or group.state == GroupState.FINALIZED or group.deadline_ms != due_ms:
        return  # decided already, or removed
    _finalize(ctx, group, Outcome.FAILURE, Reason.DEADLINE)


tasks.TASK_FINISHED_HOOKS.append(_on_task_finished)
runs.RUN_STOP_HOOKS.append(_on_run_stop)
runs.RUN_REMOVE_HOOKS.append(_on_run_remove)

HANDLERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "group.create": create,
    "group.submit": submit,
    "group.join": join,
    "group.close": close,
    "group.seal": seal,
    "group.accept": accept,
    "group.reject": reject,
}
DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {DueKind.GROUP_DEADLINE: on_deadline}
