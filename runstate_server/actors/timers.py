"""Every rule of a durable timer: a wakeup at a time, fired by the server whether anyone waits.

An ARMED timer fires (FIRED) in the first tick at or after its time; a tick is proposed by the
leader, so a timer fires once, and one that fell due during an election fires as soon as the new
leader ticks. A fired timer is acknowledged (ACKED) with its token (`ack`), or by the waiter of the
older wait route in the call that returns the firing (`acknowledge`). `cancel` disarms a timer
that has not fired; stopping its run cancels its armed timers (a fired one stays to be acked).

The token is made when the timer is armed, `<timer id>.<command id><nonce>` (the node's nonce from
a cryptographic source, so it cannot be guessed from the timer id, which readers see), and shown
only once the timer fired. `ack` with another token is STALE_CLAIM; acking an ACKED timer again is
CONFLICT (the published clients take that as "already acked"), as is acking one that has not fired
or was cancelled.

A timer may have a name in its run (`declare`, the published clients' durable `sleep`): the first
declaration arms it; every later one returns that timer, whatever time it names, so a restarted
process waits only for what is left and a second sleep of the same name returns at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runstate_server.actors import errors, events, idempotency, limits, runs
from runstate_server.actors.context import Context, require_in_space
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import DueKind, Run, State, register_table

ARMED = "ARMED"  # waiting for its time
FIRED = "FIRED"  # its time came; not yet acknowledged by a waiter
ACKED = "ACKED"  # the firing was acknowledged; final
CANCELLED = "CANCELLED"  # disarmed, or its run stopped first; final
_ACKNOWLEDGED_BEFORE = "ACKNOWLEDGED"  # ACKED's name in snapshots written before the protocol's


@dataclass(slots=True)
class Timer:
    id: str
    space: str
    run_id: str
    fire_at_ms: int
    created_ms: int
    state: str = ARMED
    fired_ms: int | None = None
    # Fields after the first snapshots. A timer of an older snapshot has no token: any token acks
    # it (token_of shows its id).
    token: str | None = None
    name: str | None = None  # its name in its run (declare), if it has one
    seq: int = 0  # its number in the state's creation order (State.creation_seq)

    def __post_init__(self) -> None:
        if self.state == _ACKNOWLEDGED_BEFORE:
            self.state = ACKED


def token_of(timer: Timer) -> str:
    return timer.token if timer.token is not None else timer.id


register_table("timers", Timer)


def timer_key(timer_id: str) -> tuple[str, str]:
    return ("timer", timer_id)


def create(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    run = runs.require_run(ctx, args.get("run_id"))
    fire_at_ms = _fire_at_ms(ctx, args)
    runs.require_active(ctx, run)
    if len(run.timers) >= limits.timers_per_run_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a run holds at most {limits.timers_per_run_max} timers")
    timer_id = "tmr_" + ctx.command_id
    timer = Timer(
        id=timer_id, space=ctx.space.id, run_id=run.id, fire_at_ms=fire_at_ms, created_ms=ctx.now_ms,
        token=f"{timer_id}.{ctx.command_id}{args.get('nonce') or ''}", seq=ctx.state.next_seq(),
    )
    assert timer.id not in ctx.state.timers, "leader generated a duplicate timer id"
    ctx.state.timers[timer.id] = timer
    run.timers.append(timer.id)
    ctx.state.arm(fire_at_ms, DueKind.TIMER, timer.id)  # in the past: the next tick fires it
    return {"timer_id": timer.id}


def declare(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The timer named `name` in run `run_id`: armed as `create` arms one (the run must be active),
    or the existing one whatever its state and whatever time this declaration names."""
    run = runs.require_run(ctx, args.get("run_id"))
    name = args.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= limits.barrier_timer_name_chars_max:
        raise Rejected(errors.VALIDATION_FAILED, f"name must be 1 to {limits.barrier_timer_name_chars_max} characters")
    _fire_at_ms(ctx, args)  # bad input is refused even when the timer exists
    timer_id = run.timer_names.get(name)
    if timer_id is not None:
        return {"timer_id": timer_id, "created": False, idempotency.UNCHANGED: True}
    made = create(ctx, args)
    ctx.state.timers[made["timer_id"]].name = name
    run.timer_names[name] = made["timer_id"]
    return {**made, "created": True}


def _fire_at_ms(ctx: Context, args: dict[str, Any]) -> int:
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
    return fire_at_ms


def require_timer(ctx: Context, timer_id: Any) -> Timer:
    found: Timer = require_in_space(ctx, ctx.state.timers, timer_id, "timer")
    return found


def acknowledge(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The older wait route takes the firing: FIRED -> ACKED (again: the same answer). Before it
    fired: CONFLICT."""
    timer = require_timer(ctx, args.get("timer_id"))
    if timer.state == CANCELLED:
        raise Rejected(errors.CONFLICT, f"timer {timer.id} was cancelled")
    if timer.state == ARMED:
        raise Rejected(errors.CONFLICT, f"timer {timer.id} has not fired yet")
    timer.state = ACKED
    return {"timer_id": timer.id}


def ack(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Acknowledge the firing with its token: FIRED -> ACKED. Another token: STALE_CLAIM; acked
    already, not fired yet, or cancelled: CONFLICT."""
    timer = require_timer(ctx, args.get("timer_id"))
    if timer.state == CANCELLED:
        raise Rejected(errors.CONFLICT, f"timer {timer.id} was cancelled")
    if timer.state == ARMED:
        raise Rejected(errors.CONFLICT, f"timer {timer.id} has not fired yet")
    if timer.token is not None and args.get("token") != timer.token:
        raise Rejected(errors.STALE_CLAIM, f"that token is not timer {timer.id}'s")
    if timer.state == ACKED:
        raise Rejected(errors.CONFLICT, f"timer {timer.id} was acked already")
    timer.state = ACKED
    ctx.wake(timer_key(timer.id))
    return {"timer_id": timer.id, "state": timer.state}


def cancel(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    timer = require_timer(ctx, args.get("timer_id"))
    if timer.state in (FIRED, ACKED):
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
    events.emit(ctx, "timer.fired", timer.run_id, "timer", timer.id, {"timerId": timer.id})
    ctx.wake(timer_key(timer.id))


def fired(state: State, space_id: str, run_id: str) -> list[Timer] | None:
    """The fired, unacknowledged timers of run `run_id`, oldest firing first (at most
    limits.timers_poll_max), or None when the space has no such run. For the node, under its read
    lock."""
    run = state.runs.get(run_id)
    if run is None or run.space != space_id:
        return None
    found = [timer for timer in (state.timers[timer_id] for timer_id in run.timers) if timer.state == FIRED]
    found.sort(key=lambda timer: (timer.fired_ms or 0, timer.id))
    return found[: limits.timers_poll_max]


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
    "timer.declare": declare,
    "timer.acknowledge": acknowledge,
    "timer.ack": ack,
    "timer.cancel": cancel,
}
DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {DueKind.TIMER: on_due}
