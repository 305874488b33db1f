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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runstate_server.actors import errors, idempotency, limits, resources, runs
from runstate_server.actors.context import Context
from runstate_server.actors.errors import Rejected
from runstate_server.actors.resources import POOL, Hold, Pool
from runstate_server.actors.state import DueKind, Run, State

GRANT_PREFIX = "slt_"  # a grant is a direct slot lease: the pool routes' /slots/{lease} name it too


def find(state: State, space_id: str, permit_id: Any) -> Pool | None:
    """The pool whose public id is `permit_id` in the space, or None (a permit of another space is
    not found, as one that does not exist)."""
    pool_key = state.permit_ids.get(permit_id) if isinstance(permit_id, str) else None
    pool = state.pools.get(pool_key) if pool_key is not None else None
    return pool if pool is not None and pool.space == space_id else None


def by_name(state: State, space_id: str, name: str) -> Pool | None:
    """The pool named `name` in the space, or None."""
    pool: Pool | None = resources.find(state, POOL, space_id, name)
    return pool


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
    if resources.units_in_use(ctx.state, pool) + units > pool.size:
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
    assert resources.units_in_use(ctx.state, pool) <= pool.size
    ctx.state.arm(hold.lease_expires_ms, DueKind.SLOT_LEASE, grant_id)
    return {"granted": True, "grant_id": grant_id, "token": hold.token, "lease_expires_ms": hold.lease_expires_ms}


def _require_grant(ctx: Context, args: dict[str, Any]) -> Hold:
    """The live grant `grant_id` of this space that `token` holds; else STALE_CLAIM (ended, lapsed,
    another space's, or a token that is not its own)."""
    grant_id, token = args.get("grant_id"), args.get("token")
    hold = ctx.state.slot_leases.get(grant_id) if isinstance(grant_id, str) else None
    if (
        hold is None or hold.space != ctx.space.id or hold.token is None or hold.token != token
        or ctx.now_ms >= hold.lease_expires_ms
    ):
        raise Rejected(errors.STALE_CLAIM, f"grant {grant_id!r} is not held by this token: it ended, lapsed or is another's")
    return hold


def renew(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Extend the grant's lease from now by `lease_ms` (None: its last length)."""
    hold = _require_grant(ctx, args)
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
    resources.end_hold(ctx, POOL, hold)
    return {"released": True}


def _on_run_stop(ctx: Context, run: Run, reason: str) -> None:
    """A stopped run's grants end: their units return at once. (The slot leases of the pool
    routes keep their documented behaviour: they last until released or lapsed.)"""
    # A scan of the node's slot leases: bounded by resources_per_space_max x pool_size_max a space.
    ended = [hold for hold in ctx.state.slot_leases.values() if hold.run_id == run.id and hold.token is not None]
    for hold in ended:
        resources.end_hold(ctx, POOL, hold)


runs.RUN_STOP_HOOKS.append(_on_run_stop)


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
        "waiters": [],
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
}
