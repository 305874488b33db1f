"""Every rule of a work queue: mailboxes (WORK, INBOX, backlogLimit, declarations), tasks and
messages (a message is a task: keyless, or keyed by its workKey), their own cancel, deadline and
subscribers, and deliveries under leases.

A task is identified by (run, mailbox, key). A delivery hands a QUEUED task to one worker under a
lease; the lease is valid while `now_ms < lease_expires_ms`, and every rule below uses that one
test, so a tick that has not yet run cannot make a lapsed lease valid again. A delivery's id is
its fencing token (`<task id>.<delivery number>.<command id><nonce>`): it names its task, so an
operation with a token that was taken over finds the task and answers STALE_CLAIM rather than
NOT_FOUND, and the API checks it against the message id of the path.

A mailbox with a backlogLimit counts its unfinished tasks (`Mailbox.unfinished`): +1 when one is
created, -1 whenever one becomes terminal (its delivery finished it, its own cancel or deadline,
or its run's stop through runs.TASK_STOP_HOOKS).

A task may need resources (resources.py): a receive hands it out only with all of them, taken in
the same step, and every end of its delivery gives them back. A queue serves such jobs in order: a
job is skipped, and stays where it is, when it needs a resource of an earlier job this receive
could not serve; jobs that need none of those go past.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runstate_server.actors import (
    budgets,
    errors,
    events,
    idempotency,
    limits,
    resources,
    runs,
    storage,
    work_limits,
)
from runstate_server.actors.context import Context, queue_key, task_key
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import (
    EMPTY,
    DueKind,
    Mailbox,
    Queue,
    Run,
    State,
    Task,
    TaskState,
    count_ended,
    delivery_digest,
    figures_of,
    index_task,
    share_key_hash,
)

MAILBOX_MODES = ("WORK", "INBOX")
INBOX = "INBOX"  # takes messages only: a task (POST /tasks, admit) names a WORK mailbox

# What other rules do when a task finishes (SUCCEEDED or FAILED through a delivery), registered by
# their modules (groups): hook(ctx, task), called in this same step. A run's stop ends its tasks
# through runs.RUN_STOP_HOOKS instead.
TASK_FINISHED_HOOKS: list[Callable[[Context, Task], None]] = []

# outcomeReason values (besides runs.STOP_REASONS): the worker's error follows HANDLER_ERROR.
HANDLER_ERROR = "handler_error: "
REJECTED = "rejected: "
LEASE_EXPIRED = "lease_expired"
CANCELLED = "cancelled"
DEADLINE_EXCEEDED = "deadline_exceeded"


# -- mailboxes -----------------------------------------------------------------------------------


def create_mailbox(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """`POST /mailboxes`: a new mailbox; CONFLICT when the name is taken (whatever its settings)."""
    name, mode = _require_name(args.get("name")), args.get("mode") or "WORK"
    if mode not in MAILBOX_MODES:
        raise Rejected(errors.VALIDATION_FAILED, f"mode must be one of {', '.join(MAILBOX_MODES)}, not {mode!r}")
    backlog_limit = args.get("backlog_limit")
    if backlog_limit is not None and (type(backlog_limit) is not int or not 1 <= backlog_limit <= limits.backlog_limit_max):
        raise Rejected(errors.VALIDATION_FAILED, f"backlogLimit must be an integer from 1 to {limits.backlog_limit_max}")
    existing = ctx.space.mailboxes.get(name)
    if existing is not None:
        raise Rejected(errors.CONFLICT, f"mailbox {name!r} exists (mode {existing.mode}, id {existing.id})")
    mailbox = _new_mailbox(ctx, name, mode)
    mailbox.backlog_limit = backlog_limit
    return {"mailbox": describe_mailbox(mailbox), "created": True}


def declare_mailbox(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """`PUT /mailboxes/by-name/{name}`: create the WORK mailbox when missing; else check each
    declared setting against the stored one (CONFLICT when they differ). A setting never declared
    before is taken from the first declaration that names it, so a producer's `{}` before the
    worker's `{maxAttempts: 5}` is no conflict. Absent settings are not checked."""
    name = _require_name(args.get("name"))
    max_attempts, requirements = args.get("max_attempts"), args.get("requirements")
    if max_attempts is not None and (type(max_attempts) is not int or not 1 <= max_attempts <= limits.attempts_max):
        raise Rejected(errors.VALIDATION_FAILED, f"maxAttempts must be an integer from 1 to {limits.attempts_max}")
    if requirements is not None:
        needs_of(requirements)  # refuses a shape the tasks could not use
    mailbox = ctx.space.mailboxes.get(name)
    created = mailbox is None
    if mailbox is not None:
        for what, stored, declared in (
            ("maxAttempts", mailbox.max_attempts, max_attempts),
            ("requirements", mailbox.requirements, requirements),
        ):
            if declared is not None and stored is not None and declared != stored:
                raise Rejected(errors.CONFLICT, f"mailbox {name!r} is declared with {what} {stored!r}, not {declared!r}")
    else:
        mailbox = _new_mailbox(ctx, name, "WORK")
    if mailbox.max_attempts is None:
        mailbox.max_attempts = max_attempts
    if mailbox.requirements is None:
        mailbox.requirements = requirements
    return {"mailbox": describe_mailbox(mailbox), "created": created}


def ensure_mailbox(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Create the mailbox `name` in `mode` unless it exists (CONFLICT for another mode): how the
    core's own tests and the chaos workload set a mailbox up in one step."""
    name, mode = _require_name(args.get("name")), args.get("mode", "WORK")
    if mode not in MAILBOX_MODES:
        raise Rejected(errors.VALIDATION_FAILED, f"mode must be one of {', '.join(MAILBOX_MODES)}, not {mode!r}")
    existing = ctx.space.mailboxes.get(name)
    if existing is not None:
        if existing.mode != mode:
            raise Rejected(errors.CONFLICT, f"mailbox {name!r} exists with mode {existing.mode}, not {mode}")
        return {"mailbox": describe_mailbox(existing), "name": name, "mode": mode, "created": False}
    mailbox = _new_mailbox(ctx, name, mode)
    return {"mailbox": describe_mailbox(mailbox), "name": name, "mode": mode, "created": True}


def describe_mailbox(mailbox: Mailbox) -> dict[str, Any]:
    return {
        "id": mailbox.id,
        "name": mailbox.name,
        "mode": mailbox.mode,
        "backlog_limit": mailbox.backlog_limit,
        "max_attempts": mailbox.max_attempts,
        "requirements": mailbox.requirements,
    }


def _require_name(name: Any) -> str:
    if not (isinstance(name, str) and 0 < len(name) <= limits.name_chars_max):
        raise Rejected(errors.VALIDATION_FAILED, f"mailbox name must be 1 to {limits.name_chars_max} characters")
    return name


def _new_mailbox(ctx: Context, name: str, mode: str) -> Mailbox:
    if len(ctx.space.mailboxes) >= limits.mailboxes_per_space_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a space holds at most {limits.mailboxes_per_space_max} mailboxes")
    mailbox = Mailbox(name=name, mode=mode, id="mbx_" + ctx.command_id)
    assert mailbox.id not in ctx.space.mailbox_names, "leader generated a duplicate mailbox id"
    ctx.space.mailboxes[name] = mailbox
    ctx.space.mailbox_names[mailbox.id] = name
    return mailbox


def require_mailbox(ctx: Context, args: dict[str, Any]) -> Mailbox:
    """The mailbox a command names by `mailbox_id` (the API) or `mailbox` (its name: groups)."""
    mailbox_id = args.get("mailbox_id")
    name = ctx.space.mailbox_names.get(mailbox_id) if isinstance(mailbox_id, str) else args.get("mailbox")
    mailbox = ctx.space.mailboxes.get(name) if isinstance(name, str) else None
    if mailbox is None:
        raise Rejected(errors.NOT_FOUND, f"mailbox {mailbox_id or name!r} not found")
    return mailbox


def needs_of(requirements: Any) -> dict[str, Any] | None:
    """The core's needs of the protocol's `requirements` {pools: [{name, units}], quotas: [{name,
    units}], budgets: [{name, reserveMinor}]}: a pool's units are that many slots, one quota is the
    rate limit taken, a budget's reserveMinor is reserved at admission (budgets.py)."""
    if requirements is None:
        return None
    problem = "requirements must be an object of pools and quotas, each a list of {name, units}"
    if not isinstance(requirements, dict) or not set(requirements) <= {"pools", "quotas", "budgets"}:
        raise Rejected(errors.VALIDATION_FAILED, problem)
    reserves = _budget_requirements(requirements.get("budgets"))
    pairs: dict[str, list[tuple[str, int]]] = {}
    for kind in ("pools", "quotas"):
        entries = requirements.get(kind) or []
        if not isinstance(entries, list):
            raise Rejected(errors.VALIDATION_FAILED, problem)
        pairs[kind] = []
        for entry in entries:
            if not isinstance(entry, dict) or not set(entry) <= {"name", "units"}:
                raise Rejected(errors.VALIDATION_FAILED, problem)
            name, units = entry.get("name"), entry.get("units", 1)
            if not (isinstance(name, str) and 0 < len(name) <= limits.name_chars_max) or type(units) is not int or units < 1:
                raise Rejected(errors.VALIDATION_FAILED, problem)
            pairs[kind].append((name, units))
    slots = [name for name, units in pairs["pools"] for _ in range(min(units, limits.needs_slots_max + 1))]
    if len(slots) > limits.needs_slots_max:
        raise Rejected(errors.VALIDATION_FAILED, f"requirements.pools take at most {limits.needs_slots_max} units in all")
    if len(pairs["quotas"]) > 1:
        raise Rejected(errors.VALIDATION_FAILED, "requirements.quotas names at most one quota for now")
    limit = list(pairs["quotas"][0]) if pairs["quotas"] else None
    if not slots and limit is None and not reserves:
        return None
    needs: dict[str, Any] = {"slots": slots, "limit": limit, "budget": None}
    if reserves:
        needs["budgets"] = reserves
    return needs


def _budget_requirements(entries: Any) -> list[list[Any]]:
    """requirements.budgets [{name, reserveMinor}] as [[name, minor units]]: reserveMinor is a
    decimal-digit string (or an integer) from 1 to limits.budget_limit_minor_max."""
    entries = entries or []
    problem = (
        f"requirements.budgets must be a list of at most {limits.budget_reservations_per_job_max} "
        f"{{name, reserveMinor}} with reserveMinor a decimal-digit string from 1 to {limits.budget_limit_minor_max}"
    )
    if not isinstance(entries, list) or len(entries) > limits.budget_reservations_per_job_max:
        raise Rejected(errors.VALIDATION_FAILED, problem)
    reserves = []
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != {"name", "reserveMinor"}:
            raise Rejected(errors.VALIDATION_FAILED, problem)
        name, amount = entry["name"], entry["reserveMinor"]
        if isinstance(amount, str) and amount.isascii() and amount.isdigit() and len(amount) <= 19:
            amount = int(amount)
        if not (isinstance(name, str) and 0 < len(name) <= limits.name_chars_max) or type(amount) is not int or not (
            1 <= amount <= limits.budget_limit_minor_max
        ):
            raise Rejected(errors.VALIDATION_FAILED, problem)
        reserves.append([name, amount])
    return reserves


def _require_queue(ctx: Context, run: Run, mailbox: Mailbox) -> Queue:
    """The run's queue of `mailbox`. A run without one gets a new queue that is not attached yet:
    `submit` and `receive` attach it once every check passed, so a refused command leaves no
    trace."""
    queue = run.queues.get(mailbox.name)
    return Queue() if queue is None else queue


def _count_unfinished(state: State, task: Task, delta: int) -> None:
    """A task of a mailbox with a backlogLimit, or naming a work limit, is created (+1) or ends (-1)."""
    mailbox = state.spaces[task.space].mailboxes.get(task.mailbox)
    if mailbox is not None and mailbox.backlog_limit is not None:
        mailbox.unfinished += delta
    work_limits.count(state, task, delta)


# -- tasks ---------------------------------------------------------------------------------------


def submit(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """A task (or, with `message`, a message: keyless unless it names a key) in (run, mailbox, key).
    Without `attempts` the mailbox's declared maxAttempts applies, without needs its declared
    requirements. The result carries what the answer shows."""
    run = runs.require_run(ctx, args.get("run_id"))
    mailbox = require_mailbox(ctx, args)
    message = bool(args.get("message"))
    if mailbox.mode == INBOX and not message:
        raise Rejected(errors.VALIDATION_FAILED, f"mailbox {mailbox.name!r} is an INBOX: it takes messages, not tasks")
    # A message without a workKey is its own: the command id keys it.
    key, input_hash = args.get("key") or "msg:" + ctx.command_id, args["input_hash"]
    attempts = args.get("attempts")
    if attempts is None:
        attempts = mailbox.max_attempts or limits.attempts_default
    if type(attempts) is not int or not 1 <= attempts <= limits.attempts_max:
        raise Rejected(errors.VALIDATION_FAILED, f"attempts must be an integer from 1 to {limits.attempts_max}")
    # Checked for a resubmit too; the needs of the first submit stay.
    needs = args.get("needs")
    if needs is None:
        needs = needs_of(args.get("requirements") if args.get("requirements") is not None else mailbox.requirements)
    needs = resources.require_needs(ctx, needs)
    deadline_ms = args.get("deadline_ms")
    subscriber = args.get("subscriber")
    work_limit = args.get("work_limit")
    if work_limit is not None:
        work_limits.require(ctx, work_limit)  # also for a resubmit; the first submit's limit stays
    queue = _require_queue(ctx, run, mailbox)
    existing_id = queue.by_key.get(key)
    if existing_id is not None:
        existing = ctx.state.tasks[existing_id]
        # key_only: the key alone names the work (a queue's key function); else the input must match.
        if existing.input_hash != input_hash and not args.get("key_only"):
            raise Rejected(
                errors.KEY_CONFLICT, f"task key {key!r} is already used in this run with a different input"
            )
        if subscriber is not None:
            _subscribe(existing, subscriber)
        return {"task_id": existing.id, "key": key, "created": False, "state": existing.state}
    runs.require_active(ctx, run)
    runs.require_deadline(ctx, deadline_ms)
    if run.task_count >= limits.tasks_per_run_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a run holds at most {limits.tasks_per_run_max} tasks")
    if ctx.space.task_count >= limits.tasks_per_space_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a space holds at most {limits.tasks_per_space_max} tasks")
    if mailbox.backlog_limit is not None and mailbox.unfinished >= mailbox.backlog_limit:
        raise Rejected(
            errors.BACKLOG_FULL, f"mailbox {mailbox.name!r} holds its backlogLimit of {mailbox.backlog_limit} unfinished tasks"
        )
    if work_limit is not None:
        work_limits.require_room(ctx, work_limit)

    task = Task(
        id="tsk_" + ctx.command_id,
        space=ctx.space.id,
        run_id=run.id,
        mailbox=mailbox.name,
        key=key,
        input=storage.json_bytes(args.get("input")),
        input_hash=input_hash,
        attempts=attempts,
        created_ms=ctx.now_ms,
    )
    # TaskExtra's fields, only those given: a default sets nothing (new_task, at a cost per field).
    if needs is not None:
        task.needs = needs
    if deadline_ms is not None:
        task.deadline_ms = deadline_ms
    if work_limit is not None:
        task.work_limit = work_limit
    share_key_hash(task)
    assert task.id not in ctx.state.tasks, "leader generated a duplicate task id"
    cost = storage.task_bytes(task)
    storage.require_room(ctx, cost, "task")
    storage.charge(ctx.state, task.space, cost)
    if subscriber is not None:
        _subscribe(task, subscriber)
    task.seq = ctx.state.next_seq()
    ctx.state.tasks[task.id] = task
    index_task(ctx.state, task, 1)
    run.queues[mailbox.name] = queue
    queue.by_key[key] = task.id
    run.task_count += 1
    ctx.space.task_count += 1
    _count_unfinished(ctx.state, task, 1)
    _enter_figures(ctx.state, task, TaskState.QUEUED, ctx.now_ms)  # new, and QUEUED
    if deadline_ms is not None:
        ctx.state.arm(deadline_ms, DueKind.TASK_DEADLINE, task.id)
    if needs is not None:
        resources.count_waiting(ctx.state, task, 1)  # new, and QUEUED
    events.task_event(ctx, task, task.state, "task.created")
    _make_ready(ctx, task, queue)
    return {"task_id": task.id, "key": key, "created": True, "state": task.state}


def submit_many(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """`items[i]` submitted as `task.submit` would be with the command id `ids[i]`, in order, in
    one command (one idempotency record, one envelope: a batch submit cost a replica ~30% more as
    one command per task). Each item answers on its own: its result, or its own error, which
    changes nothing (submit refuses before it changes anything)."""
    items, ids = args.get("items"), args.get("ids")
    if (
        not isinstance(items, list) or not isinstance(ids, list) or len(items) != len(ids)
        or not 1 <= len(items) <= limits.submit_batch_max
    ):
        raise Rejected(errors.VALIDATION_FAILED, f"items and ids: two lists of 1 to {limits.submit_batch_max}, alike in length")
    if not all(isinstance(item, dict) for item in items) or not all(isinstance(one, str) and one for one in ids):
        raise Rejected(errors.VALIDATION_FAILED, "each item is an object and each id a string")
    if len(set(ids)) != len(ids):
        raise Rejected(errors.VALIDATION_FAILED, "the ids of a batch differ")
    batch_id = ctx.command_id
    answers: list[dict[str, Any]] = []
    try:
        for item, command_id in zip(items, ids, strict=True):
            ctx.command_id = command_id
            try:
                answers.append(submit(ctx, item))
            except Rejected as rejected:
                answers.append(rejected.as_result())
    finally:
        ctx.command_id = batch_id
    return {"items": answers}


def require_task(ctx: Context, task_id: Any) -> Task:
    task = ctx.state.tasks.get(task_id) if isinstance(task_id, str) else None
    if task is None or task.space != ctx.space.id:
        raise Rejected(errors.NOT_FOUND, f"task {task_id!r} not found")
    return task


def _subscribe(task: Task, subscriber: str) -> None:
    if subscriber in task.subscribers:
        return
    if len(task.subscribers) >= limits.subscribers_per_task_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a task has at most {limits.subscribers_per_task_max} subscribers")
    if task.subscribers:
        task.subscribers.append(subscriber)
    else:
        task.subscribers = [subscriber]  # EMPTY is shared: never appended to


def join(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Subscribe `subscriber` to the task (idempotent). `run_id` names the caller's run, which
    must be in the space; it does not change the task."""
    task = require_task(ctx, args.get("task_id"))
    runs.require_run(ctx, args.get("run_id"))
    _subscribe(task, args["subscriber"])
    return {"task_id": task.id, "state": task.state, "subscribers": list(task.subscribers)}


def detach(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Unsubscribe (idempotent). A task without subscribers goes on: nothing is cancelled."""
    task = require_task(ctx, args.get("task_id"))
    subscribers = task.subscribers
    if args["subscriber"] in subscribers:
        assert isinstance(subscribers, list), "EMPTY holds nobody"
        subscribers.remove(args["subscriber"])
        if not subscribers:
            task.subscribers = EMPTY
    return {"task_id": task.id, "state": task.state, "subscribers": list(task.subscribers)}


def cancel(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Cancel one unfinished task (a running delivery's holds return, its token turns stale);
    a finished task stays as it is (idempotent)."""
    task = require_task(ctx, args.get("task_id"))
    if task.state not in TaskState.TERMINAL:
        reason = args.get("reason")
        _end_unfinished(ctx, task, TaskState.CANCELLED, CANCELLED + (f": {reason}" if reason else ""))
    return {"task_id": task.id, "state": task.state, "outcome_reason": task.outcome_reason}


def _end_unfinished(ctx: Context, task: Task, state: str, reason: str) -> None:
    """Cancel or expire one task on its own (not its run): as a run's stop ends it."""
    for task_stop_hook in runs.TASK_STOP_HOOKS:
        task_stop_hook(ctx, task, state)
    events.task_event(ctx, task, state)
    task.state = state
    task.outcome_reason = reason
    task.finished_ms = ctx.now_ms
    task.delivery_id = None
    ctx.wake(task_key(task.id))
    for finished_hook in TASK_FINISHED_HOOKS:
        finished_hook(ctx, task)


def _set_state(ctx: Context, task: Task, state: str) -> None:
    """Every change of a task's state in this module (runs._stop ends tasks through
    runs.TASK_STOP_HOOKS): a job entering or leaving QUEUED counts as waiting on its resources."""
    if task.needs is not None and (task.state == TaskState.QUEUED) != (state == TaskState.QUEUED):
        resources.count_waiting(ctx.state, task, 1 if state == TaskState.QUEUED else -1)
    if task.state != state:
        _leave_figures(ctx.state, task)
        _enter_figures(ctx.state, task, state, ctx.now_ms)
    if state in TaskState.TERMINAL:
        _observe_end(ctx, task, state)
    events.task_event(ctx, task, state)
    task.state = state


def _enter_figures(state: State, task: Task, task_state: str, now_ms: int) -> None:
    """The task enters `task_state`: its mailbox's QueueFigures count it (state.py)."""
    if task_state == TaskState.QUEUED:
        figures_of(state, task).queued[task.id] = now_ms
    elif task_state == TaskState.RUNNING:
        figures_of(state, task).running += 1


def _leave_figures(state: State, task: Task) -> None:
    """The task leaves its state: its mailbox's QueueFigures stop counting it (and go when empty)."""
    if task.state not in (TaskState.QUEUED, TaskState.RUNNING):
        return
    figures = figures_of(state, task)
    if task.state == TaskState.QUEUED:
        del figures.queued[task.id]
    else:
        figures.running -= 1
    if not figures.queued and not figures.running:
        del state.queue_figures[(task.space, task.mailbox)]


def _observe_end(ctx: Context, task: Task, task_state: str) -> None:
    """The node's metrics observe a task's end: its state, time since it was submitted, attempts;
    its mailbox's stats count it (state.ended_figures)."""
    if task.state not in TaskState.TERMINAL:  # every end passes here once (_set_state, _on_task_stopping)
        count_ended(ctx.state, task, task_state, 1)
    ctx.observe("task_ended", task.space, task.mailbox, task_state, ctx.now_ms - task.created_ms, task.attempt)


def _make_ready(ctx: Context, task: Task, queue: Queue) -> None:
    _set_state(ctx, task, TaskState.QUEUED)
    task.ready_at_ms = 0
    queue.ready.append(task.id)
    ctx.wake(queue_key(task.run_id, task.mailbox))


def _finish(
    ctx: Context, task: Task, state: str, *, outcome: Any = None, error: str | None = None, reason: str | None = None
) -> None:
    assert not task.slot_leases and task.reservation_id is None, "a delivery ends its holds before its task"
    _set_state(ctx, task, state)
    _count_unfinished(ctx.state, task, -1)
    before = storage.task_bytes(task)
    task.outcome = None if outcome is None else storage.json_bytes(outcome)
    task.outcome_reason = reason
    if error is not None:
        task.error = error
    storage.charge(ctx.state, task.space, storage.task_bytes(task) - before)
    task.finished_ms = ctx.now_ms
    task.finished_by = None if task.delivery_id is None else delivery_digest(task.delivery_id)
    task.delivery_id = None
    ctx.wake(task_key(task.id))
    for finished_hook in TASK_FINISHED_HOOKS:
        finished_hook(ctx, task)


def finisher(task: Task) -> str | None:
    """Who finished the task: the holder of the delivery that recorded its result or its failure
    (a lapse of the last attempt included). Derived, not stored: `holder` changes only on receive,
    which a finished task never sees again. None while unfinished, for a task its run's stop ended
    (CANCELLED, EXPIRED: no delivery finished it), and when that worker declared no holder."""
    return task.holder if task.finished_by is not None else None


# -- deliveries ----------------------------------------------------------------------------------


def receive(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Hand out up to `max` QUEUED tasks of the mailbox in the run (with `include_descendants`,
    also in every run below it, nearest first) under a lease each. `tasks_only`: admit, which
    refuses an INBOX. Each delivery's token is new and unguessable (it carries the leader's
    random command id); the result names each delivery as this step left it."""
    run = runs.require_run(ctx, args.get("run_id"))
    mailbox = require_mailbox(ctx, args)
    if args.get("tasks_only") and mailbox.mode == INBOX:
        raise Rejected(errors.VALIDATION_FAILED, f"mailbox {mailbox.name!r} is an INBOX: receive its messages with recv")
    runs.require_active(ctx, run)
    count_max, lease_ms, holder = args["max"], args["lease_ms"], args.get("holder")
    assert 1 <= count_max <= limits.receive_batch_max
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    members = runs.subtree(ctx.state, run)[: limits.admit_runs_max] if args.get("include_descendants") else [run]
    deliveries: list[dict[str, Any]] = []
    for member in members:
        if len(deliveries) >= count_max:
            break
        if member is not run and runs.inactive_reason(ctx.state, member, ctx.now_ms) is not None:
            continue  # a run below that stopped (or whose deadline passed before its tick)
        queue = member.queues.get(mailbox.name)
        if queue is None and member is run:
            # Attached even when empty: stopping the run wakes the queues it has, and with them
            # the consumers long-polling this one.
            queue = member.queues[mailbox.name] = Queue()
        if queue is not None and queue.ready:
            _deliver_from(ctx, queue, count_max, lease_ms, holder, args, deliveries)
    answer: dict[str, Any] = {"task_ids": [given["task_id"] for given in deliveries], "deliveries": deliveries}
    if not deliveries:
        answer[idempotency.UNCHANGED] = True  # nothing handed out: a retry of the receive looks again
    return answer


def _deliver_from(
    ctx: Context, queue: Queue, count_max: int, lease_ms: int, holder: Any, args: dict[str, Any],
    deliveries: list[dict[str, Any]],
) -> None:
    # The token: the task, the delivery's number, the leader's command id and the node's `nonce`
    # (from a cryptographic source: the command ids come from a fast generator whose outputs the
    # ids of runs and tasks show).
    secret = ctx.command_id + str(args.get("nonce") or "")
    session = args.get("holder_session")
    expires_ms = ctx.now_ms + lease_ms  # one int object for the whole batch, not one per task
    unserved: list[str] = []  # jobs this receive could not serve, in order: they stay in front
    passed: set[tuple[str, str]] = set()  # the resources those jobs need
    scanned = 0
    while queue.ready and len(deliveries) < count_max and scanned < limits.receive_scan_max:
        scanned += 1
        task = ctx.state.tasks[queue.ready.popleft()]
        if task.state != TaskState.QUEUED or task.ready_at_ms:
            continue  # stale entry: cancelled, or already handed out
        delivery_id = f"{task.id}.{task.delivery_count + 1}.{secret}"
        needs = task.needs
        if needs is not None:
            needed = resources.needed(needs)
            # An earlier job waits for one of its resources (it must not be passed), or they
            # cannot all be taken now (take_needs remembers this queue on what falls short).
            if needed & passed or not resources.take_needs(ctx, task, delivery_id, holder):
                passed |= needed
                unserved.append(task.id)
                continue
            budget_reservations = budgets.reserve_for_job(ctx, task, holder)
        else:
            budget_reservations = []
        if not task.delivery_count:  # its first delivery: it holds more from now on (state.task_bytes)
            storage.charge(ctx.state, task.space, storage.DELIVERED_TASK_BYTES)
        task.delivery_count += 1
        task.attempt = task.failures + 1
        _set_state(ctx, task, TaskState.RUNNING)  # after the attempt's number: its event shows it
        task.delivery_id = delivery_id
        task.lease_ms = lease_ms
        task.lease_expires_ms = expires_ms
        task.holder = holder
        task.holder_session = session
        ctx.state.arm(task.lease_expires_ms, DueKind.LEASE, task.delivery_id)
        # As this step left them: a later command (a lapse, the run's stop) may end the delivery
        # before the caller reads the state, and the next delivery of the task is someone else's.
        deliveries.append({
            "task_id": task.id, "token": delivery_id, "attempt": task.attempt, "attempts": task.attempts,
            "lease_expires_ms": task.lease_expires_ms, "run_id": task.run_id, "key": task.key, "input": task.input,
            "slot_leases": list(task.slot_leases), "reservation_id": task.reservation_id,
            "budget_reservations": budget_reservations, "needs": needs,
        })
    queue.ready.extendleft(reversed(unserved))


def _require_delivery(ctx: Context, args: dict[str, Any]) -> Task:
    """The task whose current delivery the token `delivery_id` names. The token starts with its
    task's id; `message_id`, when given (the API's path), must name that same task. NOT_FOUND for
    an unknown task; STALE_CLAIM when the token is not the task's current delivery (superseded,
    lapsed and taken over, ended, or never issued)."""
    token = args.get("delivery_id")
    task_id = args.get("message_id") or (token.split(".", 1)[0] if isinstance(token, str) else None)
    task = require_task(ctx, task_id)
    if not isinstance(token, str) or task.delivery_id != token:
        raise Rejected(errors.STALE_CLAIM, f"the token is not the current delivery of {task.id}: its lease lapsed or ended")
    return task


def _completed_by(ctx: Context, args: dict[str, Any]) -> Task | None:
    """The task this very delivery already completed, if it did."""
    token = args.get("delivery_id")
    task_id = args.get("message_id") or (token.split(".", 1)[0] if isinstance(token, str) else None)
    task = ctx.state.tasks.get(task_id) if isinstance(task_id, str) else None
    if task is None or task.space != ctx.space.id or task.state != TaskState.SUCCEEDED:
        return None
    return task if isinstance(token, str) and task.finished_by == delivery_digest(token) else None


def _require_live_lease(ctx: Context, task: Task) -> None:
    if task.state != TaskState.RUNNING or ctx.now_ms >= task.lease_expires_ms:
        raise Rejected(errors.STALE_CLAIM, f"the lease of delivery {task.delivery_id} lapsed")


def _handback(ctx: Context, args: dict[str, Any]) -> tuple[Task, bool]:
    """For release, retry and reject, which stay allowed after the run stopped: the task, and
    whether it is still live (False when the run's stop already ended it)."""
    task = _require_delivery(ctx, args)
    if task.state in (TaskState.CANCELLED, TaskState.EXPIRED):
        assert not task.slot_leases and task.reservation_id is None, "the stop returned them"
        task.delivery_id = None
        return task, False
    _require_live_lease(ctx, task)
    return task, True


def _settled(task: Task) -> dict[str, Any]:
    """What a settle answers: the task as this step left it."""
    return {"task_id": task.id, "state": task.state, "attempt": task.attempt, "outcome_reason": task.outcome_reason}


def renew(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    lease_ms = args["lease_ms"]
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    task = _require_delivery(ctx, args)
    runs.require_active(ctx, ctx.state.runs[task.run_id])
    _require_live_lease(ctx, task)
    # The LEASE heap entry for the old expiry finds the lease extended and re-arms itself.
    task.lease_ms = lease_ms
    task.lease_expires_ms = max(task.lease_expires_ms, ctx.now_ms + lease_ms)
    return {"task_id": task.id, "lease_expires_ms": task.lease_expires_ms}


def complete(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """`spent_micros` (optional): what the job spent of its reservation; without it, all of it."""
    spent_micros = resources.require_spent(args.get("spent_micros"))
    repeated = _completed_by(ctx, args)
    if repeated is not None:
        # The same complete again (a client retrying after a lost answer): the same answer, and
        # still one recorded result.
        return _settled(repeated)
    task = _require_delivery(ctx, args)
    runs.require_active(ctx, ctx.state.runs[task.run_id])
    _require_live_lease(ctx, task)
    resources.end_holds(ctx, task, spent_micros, completed=True)
    _finish(ctx, task, TaskState.SUCCEEDED, outcome=args.get("payload"))
    return _settled(task)


def complete_many(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Several completes in one command: `items` are complete's args, each applied as its own
    complete would be, in order. A refused item changes nothing and answers its own error; the
    others go on (one worker's batch mixes deliveries that are live and ones whose lease lapsed)."""
    items = args["items"]
    assert 1 <= len(items) <= limits.complete_batch_max
    answers: list[dict[str, Any]] = []
    for item in items:
        effects_before = len(ctx.effects)
        try:
            answers.append(complete(ctx, item))
        except Rejected as rejected:
            # complete refuses before it changes anything: only its effects (none) to drop.
            assert len(ctx.effects) == effects_before, "a refused complete left effects"
            answers.append(rejected.as_result())
    return {"items": answers}


def retry(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """`nack {retry: true}`: another attempt after `delay_ms` (default: the backoff); FAILED with
    outcomeReason `handler_error: <error>` once the attempts are used. `spent_micros` as for
    complete. After the run's stop, its holds had returned whole already."""
    spent_micros = resources.require_spent(args.get("spent_micros"))
    task, live = _handback(ctx, args)
    if live:
        resources.end_holds(ctx, task, spent_micros)
        error = args.get("error") or "retried by the worker"
        _fail_attempt(ctx, task, error, args.get("delay_ms"), HANDLER_ERROR + error)
    return _settled(task)


def reject(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """`nack {retry: false}`: FAILED now (outcomeReason `rejected: <error>`). `spent_micros` as for retry."""
    spent_micros = resources.require_spent(args.get("spent_micros"))
    task, live = _handback(ctx, args)
    if live:
        resources.end_holds(ctx, task, spent_micros)
        task.failures += 1
        error = args.get("error") or "rejected by the worker"
        _finish(ctx, task, TaskState.FAILED, error=error, reason=REJECTED + error)
    return _settled(task)


def release(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """`nack {retry: true, countAttempt: false}`: back in the queue at once, no attempt counted."""
    task, live = _handback(ctx, args)
    if live:
        resources.end_holds(ctx, task, 0)  # nothing spent: the reservation returns whole
        task.delivery_id = None
        _make_ready(ctx, task, ctx.state.runs[task.run_id].queues[task.mailbox])
    return _settled(task)


def backoff_ms(failures: int) -> int:
    """Delay before the attempt after `failures` failed ones: 1 s, 2 s, 4 s ... at most 60 s."""
    return min(limits.retry_backoff_ms_base * 2 ** min(failures - 1, 30), limits.retry_backoff_ms_max)


def _fail_attempt(ctx: Context, task: Task, error: str, delay_ms: int | None, reason: str) -> None:
    """One attempt failed: FAILED with outcomeReason `reason` when the attempts are used, else
    QUEUED again (after a delay). The caller ended the delivery's holds."""
    task.failures += 1
    before = storage.task_bytes(task)
    task.error = error
    storage.charge(ctx.state, task.space, storage.task_bytes(task) - before)
    if task.failures >= task.attempts:
        _finish(ctx, task, TaskState.FAILED, error=error, reason=reason)
        return
    task.delivery_id = None
    if delay_ms is None:
        delay_ms = backoff_ms(task.failures)
    if delay_ms <= 0:
        _make_ready(ctx, task, ctx.state.runs[task.run_id].queues[task.mailbox])
        return
    _set_state(ctx, task, TaskState.QUEUED)
    task.ready_at_ms = ctx.now_ms + delay_ms
    ctx.state.arm(task.ready_at_ms, DueKind.READY, task.id)


def extend_leases(state: State, now_ms: int) -> None:
    """Every RUNNING task's lease runs its full length from now (the LEASE heap entries find the
    later expiry when they come due and re-arm themselves)."""
    for task in state.tasks.values():
        if task.state == TaskState.RUNNING:
            task.lease_expires_ms = max(task.lease_expires_ms, now_ms + task.lease_ms)


# -- time ----------------------------------------------------------------------------------------


def on_lease_due(ctx: Context, delivery_id: str, due_ms: int) -> None:
    task = ctx.state.tasks.get(delivery_id.split(".", 1)[0])
    if task is None or task.delivery_id != delivery_id or task.state != TaskState.RUNNING:
        return  # the delivery ended already
    if task.lease_expires_ms > due_ms:
        ctx.state.arm(task.lease_expires_ms, DueKind.LEASE, delivery_id)  # renewed: look again then
        return
    resources.end_holds(ctx, task, 0)  # a lapse spends nothing: the reservation returns whole
    events.lease_lost(ctx, task)
    _fail_attempt(ctx, task, f"lease expired (holder {task.holder or 'unknown'})", 0, LEASE_EXPIRED)
    # Queued again, the task is taken over by the next worker; out of attempts, it failed.
    ctx.observe("lease_expired", task.space, task.mailbox, task.state == TaskState.QUEUED)


def on_ready_due(ctx: Context, task_id: str, due_ms: int) -> None:
    task = ctx.state.tasks.get(task_id)
    if task is None or task.state != TaskState.QUEUED or task.ready_at_ms != due_ms:
        return
    _make_ready(ctx, task, ctx.state.runs[task.run_id].queues[task.mailbox])


def on_deadline_due(ctx: Context, task_id: str, due_ms: int) -> None:
    """The task's own deadline passed: EXPIRED unless it finished first."""
    task = ctx.state.tasks.get(task_id)
    if task is None or task.state in TaskState.TERMINAL or task.deadline_ms != due_ms:
        return
    _end_unfinished(ctx, task, TaskState.EXPIRED, DEADLINE_EXCEEDED)


def _on_task_stopping(ctx: Context, task: Task, task_state: str) -> None:
    _count_unfinished(ctx.state, task, -1)
    _leave_figures(ctx.state, task)
    _observe_end(ctx, task, task_state)


runs.TASK_STOP_HOOKS.append(_on_task_stopping)
