"""Every rule of a durable timer: a wakeup at a time, fired by the server whether anyone waits.

An ARMED timer fires (FIRED) in the first tick at or after its time; a tick is proposed by the
leader, so a timer fires once, and one that fell due during an election fires as soon as the new
leader ticks. The waiter acknowledges it (ACKNOWLEDGED) in the call that returns the firing.
`cancel` disarms a timer that has not fired; stopping its run cancels its armed timers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runstate_server.actors import errors, limits, runs
from runstate_server.actors.context import Context, require_in_space
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import DueKind, Run, State, register_table

ARMED = "ARMED"  # waiting for its time
FIRED = "FIRED"  # its time came; not yet acknowledged by a waiter
ACKNOWLEDGED = "ACKNOWLEDGED"  # a waiter received the firing
CANCELLED = "CANCELLED"  # disarmed, or its run stopped first; final


@dataclass(slots=True)
class Timer:
    id: str
    space: str
    run_id: str
    fire_at_ms: int
    created_ms: int
    state: str = ARMED
    fired_ms: int | None = None


register_table("timers", Timer)


def timer_key(timer_id: str) -> tuple[str, str]:
    return ("timer", timer_id)


def create(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    run = runs.require_run(ctx, args.get("run_id"))
    fire_at_ms = args.get("fire_at_ms")
    after_ms = args.get("after_ms")
    if (fire_at_ms is None) == (after_ms is None):
        raise Rejected(errors.VALIDATION_FAILED, "give exactly one of at and afterSeconds")
    if after_ms is not None:
        if type(after_ms) is not int or after_ms < 0:
            raise Rejected(errors.VALIDATION_FAILED, "afterSeconds must not be negative")
        fire_at_ms = ctx.now_ms + after_ms
    if type(fire_at_ms) is not int or fire_at_ms - ctx.now_ms > limits.timer_ms_max:
        raise Rejected(errors.VALIDATION_FAILED, "a timer fires at most a year ahead")
    runs.require_active(ctx, run)
    if len(run.timers) >= limits.timers_per_run_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a run holds at most {limits.timers_per_run_max} timers")
    timer = Timer(id="tmr_" + ctx.command_id, space=ctx.space.id, run_id=run.id, fire_at_ms=fire_at_ms, created_ms=ctx.now_ms)
    assert timer.id not in ctx.state.timers, "leader generated a duplicate timer id"
    ctx.state.timers[timer.id] = timer
    run.timers.append(timer.id)
    ctx.state.arm(fire_at_ms, DueKind.TIMER, timer.id)  # in the past: the next tick fires it
    return {"timer_id": timer.id}


def require_timer(ctx: Context, timer_id: Any) -> Timer:
    found: Timer = require_in_space(ctx, ctx.state.timers, timer_id, "timer")
    return found


def acknowledge(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Take the firing: FIRED -> ACKNOWLEDGED (again: the same answer). Before it fired: CONFLICT."""
    timer = require_timer(ctx, args.get("timer_id"))
    if timer.state == CANCELLED:
        raise Rejected(errors.CONFLICT, f"timer {timer.id} was cancelled")
    if timer.state == ARMED:
        raise Rejected(errors.CONFLICT, f"timer {timer.id} has not fired yet")
    timer.state = ACKNOWLEDGED
    return {"timer_id": timer.id}


def cancel(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    timer = require_timer(ctx, args.get("timer_id"))
    if timer.state in (FIRED, ACKNOWLEDGED):
        raise Rejected(errors.CONFLICT, f"timer {timer.id} already fired")
    if timer.state == ARMED:
        _disarm(ctx, timer)
    return {"timer_id": timer.id}


def _disarm(ctx: Context, timer: Timer) -> None:
    timer.state = CANCELLED
    ctx.wake(timer_key(timer.id))


def on_due(ctx: Context, timer_id: str, due_ms: int) -> None:
    timer = ctx.state.timers.get(timer_id)
    if timer is None or timer.state != ARMED or timer.fire_at_ms != due_ms:
        return  # cancelled (or removed) before its time
    timer.state = FIRED
    timer.fired_ms = ctx.now_ms
    ctx.wake(timer_key(timer.id))


def _on_run_stopped(ctx: Context, run: Run, task_state: str) -> None:
    for timer_id in run.timers:
        timer = ctx.state.timers[timer_id]
        if timer.state == ARMED:
            _disarm(ctx, timer)


def _on_run_removed(state: State, run: Run) -> None:
    for timer_id in run.timers:
        del state.timers[timer_id]


runs.RUN_STOP_HOOKS.append(_on_run_stopped)
runs.RUN_REMOVE_HOOKS.append(_on_run_removed)

HANDLERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "timer.create": create,
    "timer.acknowledge": acknowledge,
    "timer.cancel": cancel,
}
DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {DueKind.TIMER: on_due}
