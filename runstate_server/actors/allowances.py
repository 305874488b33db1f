"""Every rule of an allowance: the published protocol's name for a rate limit (resources.py).

An allowance is a rate limit seen through its public id ("alw_<command id>", state.allowance_ids):
created by name (an existing name is CONFLICT), declared by name (created, or found when its
units and window are the ones declared; CONFLICT when they differ), and read by id. Its window is
the rate limit's sliding window: no interval of its length ever holds more than its units, so no
fixed window of that length (epoch-aligned or not) does either.

A consumption takes units now, irrevocably ("acn_<command id>"): refused with ALLOWANCE_COOLDOWN
under a cooldown, and ALLOWANCE_EXHAUSTED when the window has not room for them now or waiters
are in line (strict FIFO), both naming when to try again; SCOPE_CANCELLED on a stopped run.

Waiters: a FIFO line per allowance ("awt_<command id>"). A waiter whose units can be taken at once
(nobody in line, room in the window, no cooldown) is GRANTED as it joins; else it is WAITING, and
the head of the line is granted as soon as the window has room for it: a LIMIT_WINDOW due entry
at the exact ms it opens for the head (resources.arm_window), and whatever gives units back or
changes the limit wakes it (LIMIT_RETURN_HOOKS). A grant is a consumption of its own
("acn_" + the waiter's command id). A waiter ends CANCELLED (cancel, or its run's stop) or
EXPIRED (its TTL, or the limit routes made the limit smaller than its units); a GRANTED one stays
granted. Ended waiters are kept, for their state to be
read, until their run is removed. Jobs whose needs name the limit wait behind the line too.

A cooldown: nothing of the allowance is taken before it ends (consumes, waiters, jobs, takes of
the limit routes); a shorter one never shortens a longer one.

Settle (token-weighted limits reconciled after the call): a consumption took an estimate;
settling it with the actual units gives back to its window what was not used (actual < taken:
resources.give_back), or takes the overrun now (actual > taken), even past the limit: the window
then holds more than its units and later takes wait longer. Once: the same actual again answers
the same, another is CONFLICT. A consumption can be settled for
limits.allowance_consumption_settle_ms after it was taken, and an allowance remembers its last
limits.allowance_consumptions_per_allowance_max; past either, settle is NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from runstate_server.actors import errors, events, idempotency, limits, resources, runs
from runstate_server.actors.context import Context, require_in_space
from runstate_server.actors.errors import Rejected
from runstate_server.actors.resources import LIMIT, RateLimit
from runstate_server.actors.state import DueKind, Run, State, register_table

WAITER_PREFIX = "awt_"
CONSUMPTION_PREFIX = "acn_"


class WaiterState:
    WAITING: Final = "WAITING"  # in line
    GRANTED: Final = "GRANTED"  # its units were taken for it (its consumptionId); final
    CANCELLED: Final = "CANCELLED"  # cancelled, or its run stopped; final
    EXPIRED: Final = "EXPIRED"  # its TTL ran out in line; final


@dataclass(slots=True)
class AllowanceWaiter:
    id: str
    space: str
    limit_id: str  # the limit's "<space>/<name>"
    run_id: str
    holder: str | None
    units: int
    created_ms: int
    expires_ms: int
    state: str = WaiterState.WAITING
    ended_ms: int | None = None
    consumption_id: str | None = None  # when GRANTED


@dataclass(slots=True)
class Consumption:
    id: str
    space: str
    limit_id: str
    run_id: str
    holder: str | None
    units: int  # taken: the estimate
    taken_ms: int
    settled_units: int | None = None  # the actual units it was settled with
    returned_units: int = 0  # given back to the window by its settle
    overrun_units: int = 0  # taken beyond the estimate by its settle


register_table("allowance_waiters", AllowanceWaiter)
register_table("allowance_consumptions", Consumption)


class _Refused(Rejected):
    """ALLOWANCE_EXHAUSTED or ALLOWANCE_COOLDOWN, naming when to try again (Retry-After)."""

    def __init__(self, code: str, message: str, retry_after_ms: int) -> None:
        super().__init__(code, message)
        self.retry_after_ms = retry_after_ms

    def as_result(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = super().as_result()
        result["error"]["retryAfterMs"] = self.retry_after_ms
        return result


def find(state: State, space_id: str, allowance_id: Any) -> RateLimit | None:
    """The rate limit whose public id is `allowance_id` in the space, or None (one of another
    space is not found, as one that does not exist)."""
    limit_key = state.allowance_ids.get(allowance_id) if isinstance(allowance_id, str) else None
    limit = state.rate_limits.get(limit_key) if limit_key is not None else None
    return limit if limit is not None and limit.space == space_id else None


def _require_allowance(ctx: Context, allowance_id: Any) -> RateLimit:
    limit = find(ctx.state, ctx.space.id, allowance_id)
    if limit is None:
        raise Rejected(errors.NOT_FOUND, f"allowance {allowance_id!r} not found")
    return limit


def _require_units(limit: RateLimit, value: Any) -> int:
    """Units to take of `limit`: more than its units could never be granted."""
    if type(value) is not int or not 1 <= value <= limits.limit_units_max:
        raise Rejected(errors.VALIDATION_FAILED, f"units must be an integer from 1 to {limits.limit_units_max}")
    if value > limit.units:
        raise Rejected(errors.VALIDATION_FAILED, f"allowance {limit.name!r} allows {limit.units} units per window, not {value}")
    return value


def create(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """A new allowance of `units` per `interval_ms` named `name`; CONFLICT when the name is taken."""
    name = args.get("name")
    if isinstance(name, str) and resources.find(ctx.state, LIMIT, ctx.space.id, name) is not None:
        raise Rejected(errors.CONFLICT, f"allowance {name!r} exists")
    made = resources.ensure_limit(ctx, args)
    limit: RateLimit = resources.find(ctx.state, LIMIT, ctx.space.id, made["name"])
    return {"allowance_id": limit.public_id}


def declare(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The allowance named `name` of `units` per `interval_ms`: created, or found when it has
    those; CONFLICT when they differ (a declaration never changes it)."""
    name, units, interval_ms = args.get("name"), args.get("units"), args.get("interval_ms")
    if type(units) is not int or not 1 <= units <= limits.limit_units_max:
        raise Rejected(errors.VALIDATION_FAILED, f"units must be an integer from 1 to {limits.limit_units_max}")
    if type(interval_ms) is not int or not limits.limit_interval_ms_min <= interval_ms <= limits.limit_interval_ms_max:
        raise Rejected(
            errors.VALIDATION_FAILED,
            f"interval_ms must be an integer from {limits.limit_interval_ms_min} to {limits.limit_interval_ms_max}",
        )
    limit = resources.find(ctx.state, LIMIT, ctx.space.id, name) if isinstance(name, str) else None
    if limit is None:
        return {**create(ctx, args), "created": True}
    if (limit.units, limit.interval_ms) != (units, interval_ms):
        raise Rejected(
            errors.CONFLICT,
            f"allowance {name!r} allows {limit.units} units per {limit.interval_ms} ms, not {units} per {interval_ms} ms",
        )
    return {"allowance_id": limit.public_id, "created": False, idempotency.UNCHANGED: True}


def remaining(limit: RateLimit, now_ms: int) -> int:
    """What a consume could take now: nothing under a cooldown or behind waiters."""
    if limit.cooldown_until_ms > now_ms or limit.waiters:
        return 0
    taken = sum(units for at_ms, units in limit.takes if at_ms > now_ms - limit.interval_ms)
    return max(limit.units - taken, 0)


def _take(
    ctx: Context, limit: RateLimit, run_id: str, holder: Any, units: int, consumption_id: str, waiter_id: str | None = None,
) -> Consumption:
    """Take `units` now as the consumption `consumption_id` (for the waiter `waiter_id`, if one),
    remembered to be settled."""
    assert consumption_id not in ctx.state.allowance_consumptions, "leader generated a duplicate consumption id"
    resources.record_take(limit, ctx.now_ms, units)
    _forget_consumptions(ctx.state, limit, ctx.now_ms, room=1)
    consumption = Consumption(consumption_id, ctx.space.id, limit.id, run_id, holder, units, ctx.now_ms)
    ctx.state.allowance_consumptions[consumption_id] = consumption
    limit.consumptions.append(consumption_id)
    assert len(limit.consumptions) <= limits.allowance_consumptions_per_allowance_max
    events.emit(ctx, "allowance.consumed", run_id, "allowance", limit.public_id, {
        "allowanceId": limit.public_id, "consumptionId": consumption_id, "units": units, "holder": holder,
        "waiterId": waiter_id,
    })
    return consumption


def _forget_consumptions(state: State, limit: RateLimit, now_ms: int, room: int = 0) -> None:
    """Forget the oldest consumptions past their settle time, and beyond the count remembered
    (less `room`, to make room for new ones)."""
    horizon_ms = now_ms - limits.allowance_consumption_settle_ms
    keep_max = limits.allowance_consumptions_per_allowance_max - room
    forgotten = 0
    while forgotten < len(limit.consumptions) and (
        len(limit.consumptions) - forgotten > keep_max
        or state.allowance_consumptions[limit.consumptions[forgotten]].taken_ms <= horizon_ms
    ):
        del state.allowance_consumptions[limit.consumptions[forgotten]]
        forgotten += 1
    del limit.consumptions[:forgotten]


def consume(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Take `units` of the allowance under run `run_id` now, irrevocably; ALLOWANCE_COOLDOWN under
    a cooldown, ALLOWANCE_EXHAUSTED when the window has not room now or waiters are in line."""
    limit = _require_allowance(ctx, args.get("allowance_id"))
    units = _require_units(limit, args.get("units", 1))
    run = runs.require_run(ctx, args.get("run_id"))
    runs.require_active(ctx, run)
    now_ms = ctx.now_ms
    if limit.cooldown_until_ms > now_ms:
        raise _Refused(
            errors.ALLOWANCE_COOLDOWN, f"allowance {limit.name!r} cools down ({limit.cooldown_reason or 'no reason given'})",
            limit.cooldown_until_ms - now_ms,
        )
    ready_ms = resources.ready_ms(limit, units, now_ms)
    assert ready_ms is not None  # units <= limit.units
    if limit.waiters:
        head_ready_ms = resources.ready_ms(limit, ctx.state.allowance_waiters[limit.waiters[0]].units, now_ms)
        ready_ms = max(ready_ms, ready_ms if head_ready_ms is None else head_ready_ms)
        raise _Refused(
            errors.ALLOWANCE_EXHAUSTED, f"allowance {limit.name!r} has {len(limit.waiters)} waiters in line first",
            max(ready_ms - now_ms, 1),
        )
    if ready_ms > now_ms:
        raise _Refused(
            errors.ALLOWANCE_EXHAUSTED, f"allowance {limit.name!r} has not {units} units left in its window",
            ready_ms - now_ms,
        )
    consumption = _take(ctx, limit, run.id, args.get("holder"), units, CONSUMPTION_PREFIX + ctx.command_id)
    return {"consumption_id": consumption.id, "units": units, "window_start_ms": now_ms - limit.interval_ms,
            "remaining": remaining(limit, now_ms)}


def cooldown(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Take nothing of the allowance for `cooldown_ms` from now (a shorter cooldown than the one
    in force changes nothing); its end and reason."""
    limit = _require_allowance(ctx, args.get("allowance_id"))
    cooldown_ms, reason = args.get("cooldown_ms"), args.get("reason")
    if type(cooldown_ms) is not int or not 1 <= cooldown_ms <= limits.allowance_cooldown_ms_max:
        raise Rejected(errors.VALIDATION_FAILED, f"cooldown_ms must be an integer from 1 to {limits.allowance_cooldown_ms_max}")
    assert reason is None or (isinstance(reason, str) and len(reason) <= limits.allowance_reason_chars_max)
    until_ms = ctx.now_ms + cooldown_ms
    if until_ms <= limit.cooldown_until_ms:
        return {"cooldown_until_ms": limit.cooldown_until_ms, "reason": limit.cooldown_reason, idempotency.UNCHANGED: True}
    limit.cooldown_until_ms, limit.cooldown_reason = until_ms, reason
    events.emit(ctx, "allowance.cooldown", None, "allowance", limit.public_id, {
        "allowanceId": limit.public_id, "cooldownUntilMs": until_ms, "reason": reason,
    })
    # What waits for the limit has a wake armed no later than before; it re-arms for the new end.
    return {"cooldown_until_ms": until_ms, "reason": reason}


def settle(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Settle a consumption with the `units` it really used: what it did not use goes back to its
    window, an overrun is taken now. Once; the same units again answer the same."""
    consumption = _require_consumption(ctx, args.get("consumption_id"))
    actual = args.get("units")
    if type(actual) is not int or not 0 <= actual <= limits.limit_units_max:
        raise Rejected(errors.VALIDATION_FAILED, f"units must be an integer from 0 to {limits.limit_units_max}")
    if consumption.settled_units is not None:
        if consumption.settled_units != actual:
            raise Rejected(
                errors.CONFLICT, f"consumption {consumption.id} was settled with {consumption.settled_units} units, not {actual}"
            )
        return {**_settled(consumption), idempotency.UNCHANGED: True}
    limit = ctx.state.rate_limits[consumption.limit_id]
    consumption.settled_units = actual
    if actual < consumption.units:
        consumption.returned_units = resources.give_back(limit, consumption.taken_ms, consumption.units - actual)
    elif actual > consumption.units:
        consumption.overrun_units = actual - consumption.units
        resources.record_take(limit, ctx.now_ms, consumption.overrun_units)
    events.emit(ctx, "allowance.settled", consumption.run_id, "allowance", limit.public_id, {
        "allowanceId": limit.public_id, "consumptionId": consumption.id, "units": consumption.units,
        "settledUnits": actual, "returnedUnits": consumption.returned_units, "overrunUnits": consumption.overrun_units,
    })
    if consumption.returned_units:
        resources.wake(ctx, LIMIT, limit)  # the line and the jobs that wait may go now (their events follow)
    return _settled(consumption)


def _settled(consumption: Consumption) -> dict[str, Any]:
    return {
        "consumption_id": consumption.id, "units": consumption.units, "settled_units": consumption.settled_units,
        "returned_units": consumption.returned_units, "overrun_units": consumption.overrun_units,
    }


def _require_consumption(ctx: Context, consumption_id: Any) -> Consumption:
    consumption = ctx.state.allowance_consumptions.get(consumption_id) if isinstance(consumption_id, str) else None
    if (
        consumption is None or consumption.space != ctx.space.id
        or consumption.taken_ms + limits.allowance_consumption_settle_ms <= ctx.now_ms
    ):
        raise Rejected(
            errors.NOT_FOUND, f"consumption {consumption_id!r} not found (it is settled within "
            f"{limits.allowance_consumption_settle_ms // 1000} s of being taken)",
        )
    return consumption


# -- waiters -------------------------------------------------------------------------------------


def _require_waiter(ctx: Context, waiter_id: Any) -> AllowanceWaiter:
    waiter = require_in_space(ctx, ctx.state.allowance_waiters, waiter_id, "allowance waiter")
    assert isinstance(waiter, AllowanceWaiter)
    return waiter


def wait(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Join the allowance's line for `units` under run `run_id`, for `ttl_ms` at most (None: the
    default); GRANTED at once when its units can be taken now."""
    limit = _require_allowance(ctx, args.get("allowance_id"))
    units = _require_units(limit, args.get("units", 1))
    ttl_ms = args.get("ttl_ms")
    ttl_ms = limits.allowance_waiter_ttl_ms_default if ttl_ms is None else ttl_ms
    assert limits.lease_ms_min <= ttl_ms <= limits.allowance_waiter_ttl_ms_max
    run = runs.require_run(ctx, args.get("run_id"))
    runs.require_active(ctx, run)
    if len(limit.waiters) >= limits.allowance_waiters_per_allowance_max:
        raise Rejected(
            errors.LIMIT_EXCEEDED, f"an allowance's line holds at most {limits.allowance_waiters_per_allowance_max} waiters"
        )
    if len(run.allowance_waiters) >= limits.allowance_waiters_per_run_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a run creates at most {limits.allowance_waiters_per_run_max} allowance waiters")
    waiter = AllowanceWaiter(
        WAITER_PREFIX + ctx.command_id, ctx.space.id, limit.id, run.id, args.get("holder"), units, ctx.now_ms,
        ctx.now_ms + ttl_ms,
    )
    assert waiter.id not in ctx.state.allowance_waiters, "leader generated a duplicate waiter id"
    ctx.state.allowance_waiters[waiter.id] = waiter
    run.allowance_waiters.append(waiter.id)
    limit.waiters.append(waiter.id)
    if len(limit.waiters) == 1:
        _serve_line(ctx, limit)  # alone in line: granted now if its units can be taken now
    if waiter.state == WaiterState.WAITING:
        ctx.state.arm(waiter.expires_ms, DueKind.ALLOWANCE_WAITER, waiter.id)
    return {"waiter_id": waiter.id, "state": waiter.state, "consumption_id": waiter.consumption_id}


def cancel_waiter(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Leave the line; a waiter that ended already (granted, too) keeps its state."""
    waiter = _require_waiter(ctx, args.get("waiter_id"))
    if waiter.state == WaiterState.WAITING:
        _end_waiter(ctx, waiter, WaiterState.CANCELLED)
        resources.wake(ctx, LIMIT, ctx.state.rate_limits[waiter.limit_id])  # the line moves on
        return {"state": waiter.state, "consumption_id": None}
    return {"state": waiter.state, "consumption_id": waiter.consumption_id, idempotency.UNCHANGED: True}


def _end_waiter(ctx: Context, waiter: AllowanceWaiter, state: str) -> None:
    """`waiter` leaves the line as CANCELLED or EXPIRED."""
    assert waiter.state == WaiterState.WAITING and state in (WaiterState.CANCELLED, WaiterState.EXPIRED)
    ctx.state.rate_limits[waiter.limit_id].waiters.remove(waiter.id)
    waiter.state, waiter.ended_ms = state, ctx.now_ms


def _serve_line(ctx: Context, limit: RateLimit) -> None:
    """Grant waiters from the head of the line while their units can be taken now (strict FIFO:
    the first that cannot stops the line, and the limit wakes when its window opens for it). A
    head asking more than the limit now allows (the limit routes made it smaller) never can: it
    EXPIRES, and its holder, joining again, learns why (VALIDATION_FAILED)."""
    while limit.waiters:
        head = ctx.state.allowance_waiters[limit.waiters[0]]
        ready_ms = resources.ready_ms(limit, head.units, ctx.now_ms)
        if ready_ms is None:
            _end_waiter(ctx, head, WaiterState.EXPIRED)
            continue
        if ready_ms > ctx.now_ms:
            resources.arm_window(ctx, limit, ready_ms)
            return
        del limit.waiters[0]
        consumption = _take(
            ctx, limit, head.run_id, head.holder, head.units, CONSUMPTION_PREFIX + head.id[len(WAITER_PREFIX):], head.id
        )
        head.state, head.ended_ms, head.consumption_id = WaiterState.GRANTED, ctx.now_ms, consumption.id


def on_waiter_due(ctx: Context, waiter_id: str, due_ms: int) -> None:
    waiter = ctx.state.allowance_waiters.get(waiter_id)
    if waiter is None or waiter.state != WaiterState.WAITING or waiter.expires_ms != due_ms:
        return  # ended or removed
    _end_waiter(ctx, waiter, WaiterState.EXPIRED)
    resources.wake(ctx, LIMIT, ctx.state.rate_limits[waiter.limit_id])


def _on_run_stop(ctx: Context, run: Run, reason: str) -> None:
    """A stopped run's waiters in line are CANCELLED; the lines they left move on. (Its
    consumptions stay taken: units are spent, and may still be settled.)"""
    left: dict[str, RateLimit] = {}
    for waiter_id in run.allowance_waiters:
        waiter = ctx.state.allowance_waiters[waiter_id]
        if waiter.state == WaiterState.WAITING:
            _end_waiter(ctx, waiter, WaiterState.CANCELLED)
            left[waiter.limit_id] = ctx.state.rate_limits[waiter.limit_id]
    for limit in left.values():
        resources.wake(ctx, LIMIT, limit)


def _on_run_remove(state: State, run: Run) -> None:
    for waiter_id in run.allowance_waiters:
        waiter = state.allowance_waiters.pop(waiter_id)
        assert waiter.state != WaiterState.WAITING, "a removed run's waiters ended when it stopped"


runs.RUN_STOP_HOOKS.append(_on_run_stop)
runs.RUN_REMOVE_HOOKS.append(_on_run_remove)
resources.LIMIT_RETURN_HOOKS.append(_serve_line)


# -- views (for the node, under its read lock) ---------------------------------------------------


def window_seconds(limit: RateLimit) -> int | float:
    """Its window in seconds (a limit of the limit routes may have one of a fraction of a second)."""
    whole, rest = divmod(limit.interval_ms, 1000)
    return whole if rest == 0 else limit.interval_ms / 1000


def row(limit: RateLimit) -> dict[str, Any]:
    """An allowance as the list shows it."""
    return {"id": limit.public_id, "name": limit.name, "unitsLimit": limit.units, "windowSeconds": window_seconds(limit)}


def view(state: State, limit: RateLimit, now_ms: int) -> dict[str, Any]:
    """An allowance now (times in ms): its sliding window's start, what a consume could take, its
    cooldown, the jobs that wait for it and its waiters in line."""
    return {
        **row(limit),
        "windowStart": now_ms - limit.interval_ms,
        "remaining": remaining(limit, now_ms),
        "cooldownUntil": limit.cooldown_until_ms if limit.cooldown_until_ms > now_ms else None,
        "cooldownReason": limit.cooldown_reason if limit.cooldown_until_ms > now_ms else None,
        "waiting": limit.waiting,
        "waiters": [
            {"waiterId": waiter.id, "units": waiter.units, "holder": waiter.holder, "scopeId": waiter.run_id}
            for waiter in (state.allowance_waiters[waiter_id] for waiter_id in limit.waiters)
        ],
    }


def waiter_view(state: State, space_id: str, waiter_id: str) -> dict[str, Any] | None:
    """A waiter of the space (times in ms), or None."""
    waiter = state.allowance_waiters.get(waiter_id)
    if waiter is None or waiter.space != space_id:
        return None
    limit = state.rate_limits[waiter.limit_id]
    waiting = waiter.state == WaiterState.WAITING
    return {
        "waiterId": waiter.id,
        "allowanceId": limit.public_id,
        "scopeId": waiter.run_id,
        "units": waiter.units,
        "holder": waiter.holder,
        "state": waiter.state,
        "position": limit.waiters.index(waiter.id) if waiting else None,
        "expiresAt": waiter.expires_ms if waiting else None,
        "consumptionId": waiter.consumption_id,
    }


def rows(state: State, space_id: str) -> list[dict[str, Any]]:
    """The space's allowances, oldest first."""
    return [row(limit) for limit in state.rate_limits.values() if limit.space == space_id]


HANDLERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "allowance.create": create,
    "allowance.declare": declare,
    "allowance.consume": consume,
    "allowance.wait": wait,
    "allowance.cooldown": cooldown,
    "allowance_waiter.cancel": cancel_waiter,
    "allowance_consumption.settle": settle,
}

DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {DueKind.ALLOWANCE_WAITER: on_waiter_due}
