"""Every rule of a work queue: mailboxes, tasks, and deliveries under leases.

A task is identified by (run, mailbox, key). A delivery hands a QUEUED task to one worker under a
lease; the lease is valid while `now_ms < lease_expires_ms`, and every rule below uses that one
test, so a tick that has not yet run cannot make a lapsed lease valid again. A delivery id names
its task (`<task id>.<delivery number>.<nonce>`), so an operation on a delivery that was taken
over finds the task and answers STALE_CLAIM rather than NOT_FOUND.

A task may need resources (resources.py): a receive hands it out only with all of them, taken in
the same step, and every end of its delivery gives them back. A queue serves such jobs in order: a
job is skipped, and stays where it is, when it needs a resource of an earlier job this receive
could not serve; jobs that need none of those go past.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runstate_server.actors import errors, limits, resources, runs
from runstate_server.actors.context import Context, queue_key, task_key
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import DueKind, Mailbox, Queue, Run, State, Task, TaskState

MAILBOX_MODES = ("WORK",)

# What other rules do when a task finishes (SUCCEEDED or FAILED through a delivery), registered by
# their modules (groups): hook(ctx, task), called in this same step. A run's stop ends its tasks
# through runs.RUN_STOP_HOOKS instead.
TASK_FINISHED_HOOKS: list[Callable[[Context, Task], None]] = []


# -- mailboxes -----------------------------------------------------------------------------------


def ensure_mailbox(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    name, mode = args.get("name"), args.get("mode", "WORK")
    if not (isinstance(name, str) and 0 < len(name) <= limits.name_chars_max):
        raise Rejected(errors.VALIDATION_FAILED, f"mailbox name must be 1 to {limits.name_chars_max} characters")
    if mode not in MAILBOX_MODES:
        raise Rejected(errors.VALIDATION_FAILED, f"mode must be one of {', '.join(MAILBOX_MODES)}, not {mode!r}")
    existing = ctx.space.mailboxes.get(name)
    if existing is not None:
        if existing.mode != mode:
            raise Rejected(errors.CONFLICT, f"mailbox {name!r} exists with mode {existing.mode}, not {mode}")
        return {"name": name, "mode": mode, "created": False}
    if len(ctx.space.mailboxes) >= limits.mailboxes_per_space_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a space holds at most {limits.mailboxes_per_space_max} mailboxes")
    ctx.space.mailboxes[name] = Mailbox(name=name, mode=mode)
    return {"name": name, "mode": mode, "created": True}


def _require_queue(ctx: Context, run: Run, mailbox: Any) -> Queue:
    """The run's queue of `mailbox`. A run without one gets a new queue that is not attached yet:
    `submit` and `receive` attach it once every check passed, so a refused command leaves no
    trace."""
    if not isinstance(mailbox, str) or mailbox not in ctx.space.mailboxes:
        raise Rejected(errors.NOT_FOUND, f"mailbox {mailbox!r} not found; create it with mailboxes.ensure")
    queue = run.queues.get(mailbox)
    return Queue() if queue is None else queue


# -- tasks ---------------------------------------------------------------------------------------


def submit(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    run = runs.require_run(ctx, args.get("run_id"))
    mailbox: str = args["mailbox"]  # a string, checked by _require_queue below
    key, input_hash = args["key"], args["input_hash"]
    attempts = args.get("attempts", limits.attempts_default)
    if type(attempts) is not int or not 1 <= attempts <= limits.attempts_max:
        raise Rejected(errors.VALIDATION_FAILED, f"attempts must be an integer from 1 to {limits.attempts_max}")
    # Checked for a resubmit too; the needs of the first submit stay.
    needs = resources.require_needs(ctx, args.get("needs"))
    queue = _require_queue(ctx, run, mailbox)
    existing_id = queue.by_key.get(key)
    if existing_id is not None:
        existing = ctx.state.tasks[existing_id]
        # key_only: the key alone names the work (a queue's key function); else the input must match.
        if existing.input_hash != input_hash and not args.get("key_only"):
            raise Rejected(
                errors.KEY_CONFLICT, f"task key {key!r} is already used in this run with a different input"
            )
        return {"task_id": existing.id, "created": False}
    runs.require_active(ctx, run)
    if run.task_count >= limits.tasks_per_run_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a run holds at most {limits.tasks_per_run_max} tasks")
    if ctx.space.task_count >= limits.tasks_per_space_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a space holds at most {limits.tasks_per_space_max} tasks")

    task = Task(
        id="tsk_" + ctx.command_id,
        space=ctx.space.id,
        run_id=run.id,
        mailbox=mailbox,
        key=key,
        input=args.get("input"),
        input_hash=input_hash,
        attempts=attempts,
        created_ms=ctx.now_ms,
        needs=needs,
    )
    assert task.id not in ctx.state.tasks, "leader generated a duplicate task id"
    ctx.state.tasks[task.id] = task
    run.queues[mailbox] = queue
    queue.by_key[key] = task.id
    run.task_count += 1
    ctx.space.task_count += 1
    if needs is not None:
        resources.count_waiting(ctx.state, task, 1)  # new, and QUEUED
    _make_ready(ctx, task, queue)
    return {"task_id": task.id, "created": True}


def _set_state(ctx: Context, task: Task, state: str) -> None:
    """Every change of a task's state in this module (runs._stop ends tasks through
    runs.TASK_STOP_HOOKS): a job entering or leaving QUEUED counts as waiting on its resources."""
    if task.needs is not None and (task.state == TaskState.QUEUED) != (state == TaskState.QUEUED):
        resources.count_waiting(ctx.state, task, 1 if state == TaskState.QUEUED else -1)
    task.state = state


def _make_ready(ctx: Context, task: Task, queue: Queue) -> None:
    _set_state(ctx, task, TaskState.QUEUED)
    task.ready_at_ms = 0
    queue.ready.append(task.id)
    ctx.wake(queue_key(task.run_id, task.mailbox))


def _finish(ctx: Context, task: Task, state: str, *, outcome: Any = None, error: str | None = None) -> None:
    assert not task.slot_leases and task.reservation_id is None, "a delivery ends its holds before its task"
    _set_state(ctx, task, state)
    task.outcome = outcome
    if error is not None:
        task.error = error
    task.finished_ms = ctx.now_ms
    task.finished_by = task.delivery_id
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
    run = runs.require_run(ctx, args.get("run_id"))
    queue = _require_queue(ctx, run, args.get("mailbox"))
    runs.require_active(ctx, run)
    # Attached even when empty: stopping the run wakes the queues it has, and with them the
    # consumers long-polling this one.
    run.queues[args["mailbox"]] = queue
    count_max, lease_ms, holder = args["max"], args["lease_ms"], args.get("holder")
    assert 1 <= count_max <= limits.receive_batch_max
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    delivered: list[str] = []
    deliveries: list[dict[str, Any]] = []
    unserved: list[str] = []  # jobs this receive could not serve, in order: they stay in front
    passed: set[tuple[str, str]] = set()  # the resources those jobs need
    scanned = 0
    while queue.ready and len(delivered) < count_max and scanned < limits.receive_scan_max:
        scanned += 1
        task = ctx.state.tasks[queue.ready.popleft()]
        if task.state != TaskState.QUEUED or task.ready_at_ms:
            continue  # stale entry: cancelled, or already handed out
        delivery_id = f"{task.id}.{task.delivery_count + 1}.{ctx.command_id[:8]}"
        if task.needs is not None:
            needed = resources.needed(task.needs)
            # An earlier job waits for one of its resources (it must not be passed), or they
            # cannot all be taken now (take_needs remembers this queue on what falls short).
            if needed & passed or not resources.take_needs(ctx, task, delivery_id, holder):
                passed |= needed
                unserved.append(task.id)
                continue
        _set_state(ctx, task, TaskState.RUNNING)
        task.delivery_count += 1
        task.attempt = task.failures + 1
        task.delivery_id = delivery_id
        task.lease_ms = lease_ms
        task.lease_expires_ms = ctx.now_ms + lease_ms
        task.holder = holder
        ctx.state.arm(task.lease_expires_ms, DueKind.LEASE, task.delivery_id)
        delivered.append(task.id)
        # As this step left them: a later command (a lapse, the run's stop) may end the delivery
        # before the caller reads the state, and the next delivery of the task is someone else's.
        deliveries.append({"task_id": task.id, "delivery_id": delivery_id, "attempt": task.attempt,
                           "lease_expires_ms": task.lease_expires_ms})
    queue.ready.extendleft(reversed(unserved))
    return {"task_ids": delivered, "deliveries": deliveries}


def _require_delivery(ctx: Context, delivery_id: Any) -> Task:
    """The task the delivery belongs to. STALE_CLAIM if the delivery is no longer its current one."""
    task_id = delivery_id.split(".", 1)[0] if isinstance(delivery_id, str) else None
    task = ctx.state.tasks.get(task_id) if task_id else None
    if task is None or task.space != ctx.space.id:
        raise Rejected(errors.NOT_FOUND, f"delivery {delivery_id!r} not found")
    if task.delivery_id != delivery_id:
        raise Rejected(errors.STALE_CLAIM, f"delivery {delivery_id} is no longer held: its lease lapsed or ended")
    return task


def _completed_by(ctx: Context, delivery_id: Any) -> Task | None:
    """The task this very delivery already completed, if it did."""
    task_id = delivery_id.split(".", 1)[0] if isinstance(delivery_id, str) else None
    task = ctx.state.tasks.get(task_id) if task_id else None
    if task is None or task.space != ctx.space.id or task.state != TaskState.SUCCEEDED:
        return None
    return task if task.finished_by == delivery_id else None


def _require_live_lease(ctx: Context, task: Task) -> None:
    if task.state != TaskState.RUNNING or ctx.now_ms >= task.lease_expires_ms:
        raise Rejected(errors.STALE_CLAIM, f"the lease of delivery {task.delivery_id} lapsed")


def _handback(ctx: Context, delivery_id: Any) -> tuple[Task, bool]:
    """For release, retry and reject, which stay allowed after the run stopped: the task, and
    whether it is still live (False when the run's stop already ended it)."""
    task = _require_delivery(ctx, delivery_id)
    if task.state in (TaskState.CANCELLED, TaskState.EXPIRED):
        assert not task.slot_leases and task.reservation_id is None, "the stop returned them"
        task.delivery_id = None
        return task, False
    _require_live_lease(ctx, task)
    return task, True


def renew(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    delivery_id, lease_ms = args.get("delivery_id"), args["lease_ms"]
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    task = _require_delivery(ctx, delivery_id)
    runs.require_active(ctx, ctx.state.runs[task.run_id])
    _require_live_lease(ctx, task)
    # The LEASE heap entry for the old expiry finds the lease extended and re-arms itself.
    task.lease_ms = lease_ms
    task.lease_expires_ms = max(task.lease_expires_ms, ctx.now_ms + lease_ms)
    return {"task_id": task.id, "lease_expires_ms": task.lease_expires_ms}


def complete(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """`spent_micros` (optional): what the job spent of its reservation; without it, all of it."""
    spent_micros = resources.require_spent(args.get("spent_micros"))
    delivery_id = args.get("delivery_id")
    repeated = _completed_by(ctx, delivery_id)
    if repeated is not None:
        # The same complete again (a client retrying after a lost answer): the same answer, and
        # still one recorded result.
        return {"task_id": repeated.id, "state": repeated.state}
    task = _require_delivery(ctx, delivery_id)
    runs.require_active(ctx, ctx.state.runs[task.run_id])
    _require_live_lease(ctx, task)
    resources.end_holds(ctx, task, spent_micros)
    _finish(ctx, task, TaskState.SUCCEEDED, outcome=args.get("payload"))
    return {"task_id": task.id, "state": task.state}


def retry(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """`spent_micros` as for complete. After the run's stop, its holds had returned whole already."""
    spent_micros = resources.require_spent(args.get("spent_micros"))
    task, live = _handback(ctx, args.get("delivery_id"))
    if live:
        resources.end_holds(ctx, task, spent_micros)
        delay_ms = args.get("delay_ms")
        _fail_attempt(ctx, task, args.get("error") or "retried by the worker", delay_ms)
    return {"task_id": task.id, "state": task.state}


def reject(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """`spent_micros` as for retry."""
    spent_micros = resources.require_spent(args.get("spent_micros"))
    task, live = _handback(ctx, args.get("delivery_id"))
    if live:
        resources.end_holds(ctx, task, spent_micros)
        task.failures += 1
        _finish(ctx, task, TaskState.FAILED, error=args.get("error") or "rejected by the worker")
    return {"task_id": task.id, "state": task.state}


def release(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    task, live = _handback(ctx, args.get("delivery_id"))
    if live:
        resources.end_holds(ctx, task, 0)  # nothing spent: the reservation returns whole
        task.delivery_id = None
        _make_ready(ctx, task, ctx.state.runs[task.run_id].queues[task.mailbox])
    return {"task_id": task.id, "state": task.state}


def backoff_ms(failures: int) -> int:
    """Delay before the attempt after `failures` failed ones: 1 s, 2 s, 4 s ... at most 60 s."""
    return min(limits.retry_backoff_ms_base * 2 ** min(failures - 1, 30), limits.retry_backoff_ms_max)


def _fail_attempt(ctx: Context, task: Task, error: str, delay_ms: int | None) -> None:
    """One attempt failed: FAILED when the attempts are used, else QUEUED again (after a delay).
    The caller ended the delivery's holds."""
    task.failures += 1
    task.error = error
    if task.failures >= task.attempts:
        _finish(ctx, task, TaskState.FAILED, error=error)
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
    _fail_attempt(ctx, task, f"lease expired (holder {task.holder or 'unknown'})", 0)


def on_ready_due(ctx: Context, task_id: str, due_ms: int) -> None:
    task = ctx.state.tasks.get(task_id)
    if task is None or task.state != TaskState.QUEUED or task.ready_at_ms != due_ms:
        return
    _make_ready(ctx, task, ctx.state.runs[task.run_id].queues[task.mailbox])
