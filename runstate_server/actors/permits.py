"""Every rule of a permit: the published protocol's name for a pool of slots (resources.py).

A permit is a pool seen through its public id ("prm_<command id>", state.permit_ids): created by
name (an existing name is CONFLICT), declared by name (created, or found when its size is the one
declared; CONFLICT when it differs), and read by id.

A grant is a direct slot lease of `units` slots of it (a resources.Hold whose amount is the units):
it counts its units toward the pool's size, as a job's slots and a pool route's lease count one
each. It is named by its hold id ("slt_<command id>", its grantId) and fenced by a token
(`<grant id>.<command id><nonce>`: the leader's command id and the node's nonce from a
cryptographic source, so it cannot be guessed from the grant id, which readers see). Renew and
release present the token; a token that is not the grant's (released, lapsed, another grant's)
is STALE_CLAIM. Acquire on a full pool grants nothing (the API answers CAPACITY_UNAVAILABLE);
on a stopped run it is SCOPE_CANCELLED, and stopping a run ends its grants (RUN_STOP_HOOKS).

Waiters: a FIFO line per permit ("pwt_<command id>"). A waiter is WAITING until the units free
beyond those set aside cover its units and every waiter ahead of it is SIGNALED: then it is
SIGNALED, and its units are set aside for it (no acquire, and no job's slot, takes them) for
limits.permit_waiter_signaled_ms; an acquire naming it takes them (GRANTED). A WAITING waiter
blocks every acquire that names no waiter and every job's slot (strict FIFO: nobody jumps the
line). It ends CANCELLED (cancel, or its run's stop) or EXPIRED (its TTL, or a signal not taken
in time); the units set aside for it return, and the line moves on. Ended waiters are kept, for
their state to be read, until their run is removed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from runstate_server.actors import errors, events, idempotency, limits, resources, runs
from runstate_server.actors.context import Context, require_in_space
from runstate_server.actors.errors import Rejected
from runstate_server.actors.resources import POOL, Hold, Pool
from runstate_server.actors.state import DueKind, Run, State, register_table

GRANT_PREFIX = "slt_"  # a grant is a direct slot lease: the pool routes' /slots/{lease} name it too
WAITER_PREFIX = "pwt_"


class WaiterState:
    WAITING: Final = "WAITING"  # in line
    SIGNALED: Final = "SIGNALED"  # its turn: its units are set aside until it acquires or the hold ends
    GRANTED: Final = "GRANTED"  # an acquire naming it took its units; final
    CANCELLED: Final = "CANCELLED"  # cancelled, or its run stopped; final
    EXPIRED: Final = "EXPIRED"  # its TTL, or its signal's hold, ran out; final


_IN_LINE = (WaiterState.WAITING, WaiterState.SIGNALED)


@dataclass(slots=True)
class PermitWaiter:
    id: str
    space: str
    pool_id: str  # the pool's "<space>/<name>"
    run_id: str
    holder: str | None
    units: int
    created_ms: int
    expires_ms: int  # when it expires unless it ends before (re-set when it is signaled)
    state: str = WaiterState.WAITING
    ended_ms: int | None = None


register_table("permit_waiters", PermitWaiter)


def find(state: State, space_id: str, permit_id: Any) -> Pool | None:
    """The pool whose public id is `permit_id` in the space, or None (a permit of another space is
    not found, as one that does not exist)."""
    pool_key = state.permit_ids.get(permit_id) if isinstance(permit_id, str) else None
    pool = state.pools.get(pool_key) if pool_key is not None else None
    return pool if pool is not None and pool.space == space_id else None


def _require_permit(ctx: Context, permit_id: Any) -> Pool:
    pool = find(ctx.state, ctx.space.id, permit_id)
    if pool is None:
        raise Rejected(errors.NOT_FOUND, f"permit {permit_id!r} not found")
    return pool


def _require_units(value: Any) -> int:
    if type(value) is not int or not 1 <= value <= limits.pool_size_max:
        raise Rejected(errors.VALIDATION_FAILED, f"units must be an integer from 1 to {limits.pool_size_max}")
    return value


def create(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """A new permit of `units` slots named `name`; CONFLICT when the name is taken."""
    name, units = args.get("name"), _require_units(args.get("units"))
    if isinstance(name, str) and resources.find(ctx.state, POOL, ctx.space.id, name) is not None:
        raise Rejected(errors.CONFLICT, f"permit {name!r} exists")
    made = resources.ensure_pool(ctx, {"name": name, "size": units})
    pool: Pool = resources.find(ctx.state, POOL, ctx.space.id, made["name"])
    return {"permit_id": pool.public_id}


def declare(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The permit named `name` of `units` slots: created, or found when it has that size;
    CONFLICT when its size differs (a declaration never resizes)."""
    name, units = args.get("name"), _require_units(args.get("units"))
    pool = resources.find(ctx.state, POOL, ctx.space.id, name) if isinstance(name, str) else None
    if pool is None:
        return {**create(ctx, args), "created": True}
    if pool.size != units:
        raise Rejected(errors.CONFLICT, f"permit {name!r} has {pool.size} units, not {units}")
    return {"permit_id": pool.public_id, "created": False, idempotency.UNCHANGED: True}


def acquire(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """`units` slots of the permit under run `run_id` and a lease, with a fresh token; granted
    False when the pool has not that many free now."""
    pool = _require_permit(ctx, args.get("permit_id"))
    units = _require_units(args.get("units", 1))
    if units > pool.size:
        raise Rejected(errors.VALIDATION_FAILED, f"permit {pool.name!r} has {pool.size} units, fewer than {units}")
    run = runs.require_run(ctx, args.get("run_id"))
    lease_ms = args["lease_ms"]
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    runs.require_active(ctx, run)
    waiter_id = args.get("waiter_id")
    if waiter_id is not None:
        waiter = _require_waiter(ctx, waiter_id)
        if waiter.pool_id != pool.id:
            raise Rejected(errors.VALIDATION_FAILED, f"waiter {waiter_id} waits for another permit")
        if waiter.state != WaiterState.SIGNALED:
            return {"granted": False, idempotency.UNCHANGED: True}  # not its turn (or no more in line)
        units = waiter.units
        _end_waiter(ctx, pool, waiter, WaiterState.GRANTED)  # its units set aside become the grant's
    elif resources.has_waiting(ctx.state, pool) or not resources.has_room(ctx.state, pool, units):
        return {"granted": False, idempotency.UNCHANGED: True}
    grant_id = GRANT_PREFIX + ctx.command_id
    assert grant_id not in ctx.state.slot_leases, "leader generated a duplicate hold id"
    hold = Hold(
        grant_id, ctx.space.id, pool.id, run.id, args.get("holder"), None, units, lease_ms, ctx.now_ms + lease_ms,
        ctx.now_ms, token=f"{grant_id}.{ctx.command_id}{args.get('nonce') or ''}",
        holder_session=args.get("holder_session"),
    )
    ctx.state.slot_leases[grant_id] = hold
    pool.holds.append(grant_id)
    _remember_grant(ctx.state, run, grant_id)
    assert resources.units_in_use(ctx.state, pool) <= pool.size
    ctx.state.arm(hold.lease_expires_ms, DueKind.SLOT_LEASE, grant_id)
    grant_event(ctx, "permit.granted", pool, hold, waiterId=waiter_id)
    return {
        "granted": True, "grant_id": grant_id, "token": hold.token, "units": units,
        "lease_expires_ms": hold.lease_expires_ms,
    }


_GRANTS_PRUNED_FROM = 64  # a run's list of grants is pruned of ended ones at 64, 128, 256... entries


def _remember_grant(state: State, run: Run, grant_id: str) -> None:
    """Add the grant to its run's list; at each power of two of the list's length from
    _GRANTS_PRUNED_FROM, drop the grants that ended (amortized O(1) per grant)."""
    grants = run.permit_grants
    grants.append(grant_id)
    length = len(grants)
    if length >= _GRANTS_PRUNED_FROM and length & (length - 1) == 0:
        grants[:] = [hold_id for hold_id in grants if hold_id in state.slot_leases]


def _require_grant(ctx: Context, args: dict[str, Any], *, renewing: bool = False) -> Hold:
    """The live grant `grant_id` of this space that `token` holds; else STALE_CLAIM (ended, lapsed,
    another space's, or a token that is not its own). A renewal of a grant its run's stop ended is
    refused as the stop (SCOPE_CANCELLED, DEADLINE_EXCEEDED: how running work learns of it); a
    release of one is STALE_CLAIM, which clients ignore."""
    grant_id, token = args.get("grant_id"), args.get("token")
    hold = ctx.state.slot_leases.get(grant_id) if isinstance(grant_id, str) else None
    stopped_run = ctx.state.stopped_grant_runs.get(grant_id) if hold is None and isinstance(grant_id, str) else None
    if renewing and stopped_run is not None and ctx.state.runs[stopped_run].space == ctx.space.id:
        runs.require_active(ctx, ctx.state.runs[stopped_run])
    if (
        hold is None or hold.space != ctx.space.id or hold.token is None or hold.token != token
        or ctx.now_ms >= hold.lease_expires_ms
    ):
        raise Rejected(errors.STALE_CLAIM, f"grant {grant_id!r} is not held by this token: it ended, lapsed or is another's")
    return hold


def renew(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Extend the grant's lease from now by `lease_ms` (None: its last length)."""
    hold = _require_grant(ctx, args, renewing=True)
    lease_ms = hold.lease_ms if args.get("lease_ms") is None else args["lease_ms"]
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    run = ctx.state.runs.get(hold.run_id)
    if run is None:
        raise Rejected(errors.SCOPE_CANCELLED, f"run {hold.run_id} is stopped")
    runs.require_active(ctx, run)
    # The due entry of the old expiry finds the lease extended and re-arms itself.
    hold.lease_ms = lease_ms
    hold.lease_expires_ms = max(hold.lease_expires_ms, ctx.now_ms + lease_ms)
    return {"lease_expires_ms": hold.lease_expires_ms}


def release(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Give the grant's units back (allowed after its run stopped)."""
    hold = _require_grant(ctx, args)
    grant_event(ctx, "permit.released", ctx.state.pools[hold.resource_id], hold, reason="released")
    resources.end_hold(ctx, POOL, hold)  # (after its event: the waiters it signals come next)
    return {"released": True}


def grant_event(ctx: Context, event_type: str, pool: Pool, hold: Hold, **extra: str | None) -> None:
    """permit.granted, permit.released (reason: released, scope_stopped), permit.lease_lost."""
    events.emit(ctx, event_type, hold.run_id, "permit", pool.public_id, {
        "permitId": pool.public_id, "grantId": hold.id, "units": hold.amount, "holder": hold.holder, **extra,
    })


def _on_run_stop(ctx: Context, run: Run, reason: str) -> None:
    """A stopped run's waiters are CANCELLED and its grants end: their units return at once. (The
    slot leases of the pool routes keep their documented behaviour: they last until released or
    lapsed.)"""
    # Its waiters first, so that the units its grants return go to the lines' other waiters.
    for waiter_id in run.permit_waiters:
        waiter = ctx.state.permit_waiters[waiter_id]
        if waiter.state in _IN_LINE:
            _end_waiter(ctx, ctx.state.pools[waiter.pool_id], waiter, WaiterState.CANCELLED)
    grants, run.permit_grants = run.permit_grants, []
    for grant_id in grants:
        hold = ctx.state.slot_leases.get(grant_id)
        if hold is not None:  # else it ended already (released or lapsed)
            assert hold.run_id == run.id and hold.token is not None
            grant_event(ctx, "permit.released", ctx.state.pools[hold.resource_id], hold, reason="scope_stopped")
            resources.end_hold(ctx, POOL, hold)
            run.stopped_grants.append(grant_id)
            ctx.state.stopped_grant_runs[grant_id] = run.id


def _on_run_remove(state: State, run: Run) -> None:
    for grant_id in run.stopped_grants:
        del state.stopped_grant_runs[grant_id]
    for waiter_id in run.permit_waiters:
        waiter = state.permit_waiters.pop(waiter_id)
        assert waiter.state not in _IN_LINE, "a removed run's waiters ended when it stopped"


runs.RUN_STOP_HOOKS.append(_on_run_stop)
runs.RUN_REMOVE_HOOKS.append(_on_run_remove)


# -- waiters -------------------------------------------------------------------------------------


def _require_waiter(ctx: Context, waiter_id: Any) -> PermitWaiter:
    waiter = require_in_space(ctx, ctx.state.permit_waiters, waiter_id, "permit waiter")
    assert isinstance(waiter, PermitWaiter)
    return waiter


def wait(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Join the permit's line for `units` under run `run_id`, for `ttl_ms` at most (None: the
    default); SIGNALED at once when it is its turn already."""
    pool = _require_permit(ctx, args.get("permit_id"))
    units = _require_units(args.get("units", 1))
    if units > pool.size:
        raise Rejected(errors.VALIDATION_FAILED, f"permit {pool.name!r} has {pool.size} units, fewer than {units}")
    ttl_ms = args.get("ttl_ms")
    ttl_ms = limits.permit_waiter_ttl_ms_default if ttl_ms is None else ttl_ms
    assert limits.lease_ms_min <= ttl_ms <= limits.permit_waiter_ttl_ms_max
    run = runs.require_run(ctx, args.get("run_id"))
    runs.require_active(ctx, run)
    if len(pool.waiters) >= limits.permit_waiters_per_permit_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a permit's line holds at most {limits.permit_waiters_per_permit_max} waiters")
    if len(run.permit_waiters) >= limits.permit_waiters_per_run_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a run creates at most {limits.permit_waiters_per_run_max} permit waiters")
    waiter = PermitWaiter(
        WAITER_PREFIX + ctx.command_id, ctx.space.id, pool.id, run.id, args.get("holder"), units, ctx.now_ms,
        ctx.now_ms + ttl_ms,
    )
    assert waiter.id not in ctx.state.permit_waiters, "leader generated a duplicate waiter id"
    ctx.state.permit_waiters[waiter.id] = waiter
    pool.waiters.append(waiter.id)
    run.permit_waiters.append(waiter.id)
    ctx.state.arm(waiter.expires_ms, DueKind.PERMIT_WAITER, waiter.id)
    _serve_line(ctx, pool)
    return {"waiter_id": waiter.id, "state": waiter.state}


def cancel_waiter(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Leave the line (its units set aside return); a waiter that ended already keeps its state."""
    waiter = _require_waiter(ctx, args.get("waiter_id"))
    if waiter.state in _IN_LINE:
        _end_waiter(ctx, ctx.state.pools[waiter.pool_id], waiter, WaiterState.CANCELLED)
        return {"state": waiter.state}
    return {"state": waiter.state, idempotency.UNCHANGED: True}


def _end_waiter(ctx: Context, pool: Pool, waiter: PermitWaiter, state: str) -> None:
    """`waiter` leaves the line as `state`; units set aside for it and not granted return."""
    assert waiter.state in _IN_LINE and state not in _IN_LINE
    pool.waiters.remove(waiter.id)
    waiter.state, waiter.ended_ms = state, ctx.now_ms
    if state != WaiterState.GRANTED:
        # The line moves on (POOL_RETURN_HOOKS), and jobs it held back look again.
        resources.wake(ctx, POOL, pool)


def _serve_line(ctx: Context, pool: Pool) -> None:
    """Signal waiters from the head of the line while the units free beyond those set aside cover
    theirs (strict FIFO: the first that does not fit stops the line)."""
    free = pool.size - resources.units_in_use(ctx.state, pool) - resources.units_set_aside(ctx.state, pool)
    for waiter_id in pool.waiters:
        waiter = ctx.state.permit_waiters[waiter_id]
        if waiter.state == WaiterState.SIGNALED:
            continue
        if waiter.units > free:
            return
        free -= waiter.units
        waiter.state = WaiterState.SIGNALED
        waiter.expires_ms = ctx.now_ms + limits.permit_waiter_signaled_ms
        ctx.state.arm(waiter.expires_ms, DueKind.PERMIT_WAITER, waiter.id)
        events.emit(ctx, "permit.waiter_signaled", waiter.run_id, "permit", pool.public_id, {
            "permitId": pool.public_id, "waiterId": waiter.id, "units": waiter.units, "holder": waiter.holder,
        })


def on_waiter_due(ctx: Context, waiter_id: str, due_ms: int) -> None:
    waiter = ctx.state.permit_waiters.get(waiter_id)
    if waiter is None or waiter.state not in _IN_LINE or waiter.expires_ms != due_ms:
        return  # ended, removed, or an entry of an earlier expiry (its signal re-set it)
    _end_waiter(ctx, ctx.state.pools[waiter.pool_id], waiter, WaiterState.EXPIRED)


resources.POOL_RETURN_HOOKS.append(_serve_line)


# -- views (for the node, under its read lock) ---------------------------------------------------


def row(state: State, pool: Pool) -> dict[str, Any]:
    """A permit as the list shows it."""
    return {
        "id": pool.public_id,
        "name": pool.name,
        "unitsTotal": pool.size,
        "unitsInUse": resources.units_in_use(state, pool),
        "waiting": pool.waiting,
    }


def view(state: State, pool: Pool) -> dict[str, Any]:
    """A permit with its grants (a job's slots among them, with its taskId); times in ms."""
    return {
        **row(state, pool),
        "grants": [
            {
                "grantId": hold.id,
                "units": hold.amount,
                "holder": hold.holder,
                "scopeId": hold.run_id,
                "taskId": hold.task_id,
                "leaseExpiresAt": resources.hold_expires_ms(state, hold),
            }
            for hold in (state.slot_leases[hold_id] for hold_id in pool.holds)
        ],
        "waiters": [
            {"waiterId": waiter.id, "units": waiter.units, "holder": waiter.holder, "scopeId": waiter.run_id,
             "state": waiter.state}
            for waiter in (state.permit_waiters[waiter_id] for waiter_id in pool.waiters)
        ],
    }


def waiter_view(state: State, space_id: str, waiter_id: str) -> dict[str, Any] | None:
    """A waiter of the space (times in ms), or None."""
    waiter = state.permit_waiters.get(waiter_id)
    if waiter is None or waiter.space != space_id:
        return None
    pool = state.pools[waiter.pool_id]
    return {
        "waiterId": waiter.id,
        "permitId": pool.public_id,
        "scopeId": waiter.run_id,
        "units": waiter.units,
        "holder": waiter.holder,
        "state": waiter.state,
        "position": pool.waiters.index(waiter.id) if waiter.state in _IN_LINE else None,
        "expiresAt": waiter.expires_ms if waiter.state in _IN_LINE else None,
    }


def rows(state: State, space_id: str) -> list[dict[str, Any]]:
    """The space's permits, oldest first."""
    return [row(state, pool) for pool in state.pools.values() if pool.space == space_id]


HANDLERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "permit.create": create,
    "permit.declare": declare,
    "permit.acquire": acquire,
    "permit.renew": renew,
    "permit.release": release,
    "permit.wait": wait,
    "permit_waiter.cancel": cancel_waiter,
}

DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {DueKind.PERMIT_WAITER: on_waiter_due}
