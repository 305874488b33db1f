"""Every rule of a barrier: release everyone once `target` distinct participants have arrived.

A barrier WAITING in its epoch counts distinct arrival keys; the arrival that reaches the target
releases it (RELEASED) in the same step. Arriving again with a key that already arrived changes
nothing; arriving after the release is BARRIER_RELEASED. `next_epoch` turns a RELEASED barrier into
a fresh WAITING one for reuse. Stopping its run (or a run above it) cancels a barrier that has not
been released: arrivals and waits then answer BARRIER_CANCELLED.

A barrier may have a name in its run (`declare`, the published clients' `together`): the same
name in the same run is the same barrier, in whatever state it is; a declaration with another
target is CONFLICT. A declaration never moves the epoch: a released named barrier stays released,
so a latecomer (a new key: BARRIER_RELEASED) or a restarted participant (its key: RELEASED) carries
on, as after a durable named sleep; `next_epoch` reuses it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runstate_server.actors import errors, events, idempotency, limits, runs
from runstate_server.actors.context import Context, require_in_space
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import Run, State, register_table

WAITING = "WAITING"  # counting arrivals in the current epoch
RELEASED = "RELEASED"  # the target was reached in the current epoch
CANCELLED = "CANCELLED"  # its run stopped before the release; final


@dataclass(slots=True)
class Barrier:
    id: str
    space: str
    run_id: str
    target: int
    created_ms: int
    epoch: int = 1
    state: str = WAITING
    arrivals: list[str] = field(default_factory=list)  # distinct keys of this epoch, in arrival order
    released_ms: int | None = None
    name: str | None = None  # its name in its run (declare), if it has one
    seq: int = 0  # its number in the state's creation order (State.creation_seq)


register_table("barriers", Barrier)


def barrier_key(barrier_id: str) -> tuple[str, str]:
    return ("barrier", barrier_id)


def _require_target(target: Any) -> int:
    if type(target) is not int or not 1 <= target <= limits.barrier_target_max:
        raise Rejected(errors.VALIDATION_FAILED, f"target must be an integer from 1 to {limits.barrier_target_max}")
    return target


def create(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    run = runs.require_run(ctx, args.get("run_id"))
    target = _require_target(args.get("target"))
    runs.require_active(ctx, run)
    if len(run.barriers) >= limits.barriers_per_run_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a run holds at most {limits.barriers_per_run_max} barriers")
    barrier = Barrier(
        id="bar_" + ctx.command_id, space=ctx.space.id, run_id=run.id, target=target, created_ms=ctx.now_ms,
        seq=ctx.state.next_seq(),
    )
    assert barrier.id not in ctx.state.barriers, "leader generated a duplicate barrier id"
    ctx.state.barriers[barrier.id] = barrier
    run.barriers.append(barrier.id)
    return {"barrier_id": barrier.id}


def declare(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The barrier named `name` in run `run_id`: created with `target` (the run must be active),
    or the existing one whatever its state; CONFLICT when its target is another."""
    run = runs.require_run(ctx, args.get("run_id"))
    name = args.get("name")
    if not isinstance(name, str) or not 1 <= len(name) <= limits.barrier_timer_name_chars_max:
        raise Rejected(errors.VALIDATION_FAILED, f"name must be 1 to {limits.barrier_timer_name_chars_max} characters")
    target = _require_target(args.get("target"))
    barrier_id = run.barrier_names.get(name)
    if barrier_id is not None:
        barrier: Barrier = ctx.state.barriers[barrier_id]
        if barrier.target != target:
            raise Rejected(errors.CONFLICT, f"barrier {name!r} of run {run.id} has target {barrier.target}, not {target}")
        return {"barrier_id": barrier.id, "created": False, idempotency.UNCHANGED: True}
    made = create(ctx, {"run_id": run.id, "target": target})
    ctx.state.barriers[made["barrier_id"]].name = name
    run.barrier_names[name] = made["barrier_id"]
    return {**made, "created": True}


def require_barrier(ctx: Context, barrier_id: Any) -> Barrier:
    found: Barrier = require_in_space(ctx, ctx.state.barriers, barrier_id, "barrier")
    return found


def arrive(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    barrier = require_barrier(ctx, args.get("barrier_id"))
    key = args["key"]
    if barrier.state == CANCELLED:
        raise Rejected(errors.BARRIER_CANCELLED, f"barrier {barrier.id} was cancelled with its run")
    if key in barrier.arrivals:
        return {"barrier_id": barrier.id, "arrived": False}  # idempotent per key, even after release
    if barrier.state == RELEASED:
        raise Rejected(
            errors.BARRIER_RELEASED, f"barrier {barrier.id} was released in epoch {barrier.epoch}; start the next epoch"
        )
    runs.require_active(ctx, ctx.state.runs[barrier.run_id])
    barrier.arrivals.append(key)
    if len(barrier.arrivals) >= barrier.target:
        barrier.state = RELEASED
        barrier.released_ms = ctx.now_ms
        events.emit(ctx, "barrier.released", barrier.run_id, "barrier", barrier.id, {"barrierId": barrier.id, "epoch": barrier.epoch})
        ctx.wake(barrier_key(barrier.id))
    return {"barrier_id": barrier.id, "arrived": True}


def next_epoch(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    barrier = require_barrier(ctx, args.get("barrier_id"))
    if barrier.state == CANCELLED:
        raise Rejected(errors.BARRIER_CANCELLED, f"barrier {barrier.id} was cancelled with its run")
    if barrier.state != RELEASED:
        raise Rejected(errors.CONFLICT, f"barrier {barrier.id} is not released yet in epoch {barrier.epoch}")
    runs.require_active(ctx, ctx.state.runs[barrier.run_id])
    barrier.epoch += 1
    barrier.state = WAITING
    barrier.arrivals = []
    barrier.released_ms = None
    ctx.wake(barrier_key(barrier.id))
    return {"barrier_id": barrier.id}


def _on_run_stopped(ctx: Context, run: Run, task_state: str) -> None:
    for barrier_id in run.barriers:
        barrier = ctx.state.barriers[barrier_id]
        if barrier.state == WAITING:
            barrier.state = CANCELLED
            ctx.wake(barrier_key(barrier.id))


def _on_run_removed(state: State, run: Run) -> None:
    for barrier_id in run.barriers:
        del state.barriers[barrier_id]


runs.RUN_STOP_HOOKS.append(_on_run_stopped)
runs.RUN_REMOVE_HOOKS.append(_on_run_removed)

HANDLERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "barrier.create": create,
    "barrier.declare": declare,
    "barrier.arrive": arrive,
    "barrier.next_epoch": next_epoch,
}
DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {}
