"""Every rule of a budget on the published protocol (PROTOCOL.md §5.9): money, reserved, settled
and voided in exact integer minor units.

A budget (resources.Budget) has a `currency` (3 capital letters), a `scale` (0 to 9 digits after
the point: scale 2 counts cents) and a `limitMinor`; it is named by its public id ("bdg_<command
id>", state.budget_ids), created by name (an existing name is CONFLICT) or declared by name
(created, or found when its limit, scale and currency are the ones declared; CONFLICT when one
differs: a declaration never changes a budget). Money is never created or lost:
`limit == settled + reserved + remaining` (remaining below 0 only when the old routes lowered the
limit), and no reservation takes more than what remains.

A reservation ("rsv_<command id>"; a job's "rsv_<task id>.<delivery number>.<n>") holds an amount
under a run until `settleBy` (default now + 1 h, at most a day ahead). States: ACTIVE; STALE once
its settleBy passed: its amount stays held, never refunded by time (as the protocol says), and
settle and void still work on it; SETTLED once nothing of it is held and something was charged;
VOIDED once voided with nothing charged. A settle charges `amountMinor` against what it holds,
keyed by its `workKey` (the same workKey again charges nothing more and answers its charge again,
with the reservation as it is now; with another amount it is CONFLICT); the reservation stays open while part of it is held. More than it
holds is INSUFFICIENT_BUDGET (nothing charged), or with `allowOverrun` is charged up to what the
budget can still cover (what it holds + what remains unreserved) and closes it. A void releases
what it still holds (SETTLED when something was charged, else VOIDED); the same workKey again
answers the same. Settle and void of an ended reservation are CONFLICT.

A run's stop voids its open reservations (ACTIVE and STALE) at once: a stopped run spends
nothing more, and what its work held returns (as stopping a run returns every hold). A late
settle of one then answers CONFLICT.

A job's reservations (a queue's or task's `requirements.budgets`, resources.take_needs checks
they fit) are taken with its delivery at admission, each under the job's run. A delivery that
ends other than by complete (nack, reject, release, a lapse, a cancel, its run's stop) voids
them; after a complete they stay open for the worker to settle or void (0.3.0 settles after it
completes), until its settleBy like any other (then STALE, still settleable).

Ended reservations are kept, for their state and their work keys to be read, at most
limits.budget_ended_kept_max per budget: the oldest ended is forgotten first.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from runstate_server.actors import errors, events, idempotency, limits, resources, runs
from runstate_server.actors.context import Context
from runstate_server.actors.errors import Rejected
from runstate_server.actors.resources import BUDGET, Budget
from runstate_server.actors.state import DueKind, Run, State, Task, register_table

RESERVATION_PREFIX = "rsv_"
_CURRENCY = re.compile(r"[A-Z]{3}")


class ReservationState:
    ACTIVE: Final = "ACTIVE"  # holds its amount (or what is left of it)
    STALE: Final = "STALE"  # its settleBy passed: still holds it, still settled or voided by hand
    SETTLED: Final = "SETTLED"  # nothing held any more, something charged; final
    VOIDED: Final = "VOIDED"  # voided (or its run stopped) with nothing charged; final


_OPEN = (ReservationState.ACTIVE, ReservationState.STALE)


@dataclass(slots=True)
class BudgetReservation:
    id: str
    space: str
    budget_id: str  # the budget's "<space>/<name>"
    run_id: str
    holder: str | None
    amount_minor: int  # reserved at first
    held_minor: int  # held now (0 once ended)
    settle_by_ms: int
    created_ms: int
    settled_minor: int = 0  # charged by its settles
    state: str = ReservationState.ACTIVE
    task_id: str | None = None  # a job's: its task, and "<task id>.<delivery number>" of the delivery
    delivery: str | None = None
    settles: dict[str, list[int]] = field(default_factory=dict)  # workKey -> [amount asked, charged]
    void_key: str | None = None  # the workKey of the void that ended it
    ended_ms: int | None = None


register_table("budget_reservations", BudgetReservation)


# -- budgets -------------------------------------------------------------------------------------


def find(state: State, space_id: str, budget_id: Any) -> Budget | None:
    """The budget whose public id is `budget_id` in the space, or None (another space's is not found)."""
    key = state.budget_ids.get(budget_id) if isinstance(budget_id, str) else None
    budget = state.budgets.get(key) if key is not None else None
    return budget if budget is not None and budget.space == space_id else None


def _require_budget(ctx: Context, budget_id: Any) -> Budget:
    budget = find(ctx.state, ctx.space.id, budget_id)
    if budget is None:
        raise Rejected(errors.NOT_FOUND, f"budget {budget_id!r} not found")
    return budget


def _require_minor(value: Any, what: str, low: int) -> int:
    if type(value) is not int or not low <= value <= limits.budget_limit_minor_max:
        raise Rejected(errors.VALIDATION_FAILED, f"{what} must be a whole number of minor units from {low} to {limits.budget_limit_minor_max}")
    return value


def _sizes(args: dict[str, Any]) -> tuple[int, int, str]:
    """A declaration's (limit, scale, currency): scale and currency take their defaults."""
    limit_minor = _require_minor(args.get("limit_minor"), "limitMinor", 1)
    scale = args.get("scale", limits.budget_scale_default)
    if type(scale) is not int or not 0 <= scale <= limits.budget_scale_max:
        raise Rejected(errors.VALIDATION_FAILED, f"scale must be an integer from 0 to {limits.budget_scale_max}")
    currency = args.get("currency", limits.budget_currency_default)
    if not isinstance(currency, str) or _CURRENCY.fullmatch(currency) is None:
        raise Rejected(errors.VALIDATION_FAILED, "currency must be 3 capital letters, such as USD")
    return limit_minor, scale, currency


def create(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """A new budget named `name`; CONFLICT when the name is taken."""
    name = resources.require_budget_name(args.get("name"))
    limit_minor, scale, currency = _sizes(args)
    if resources.find(ctx.state, BUDGET, ctx.space.id, name) is not None:
        raise Rejected(errors.CONFLICT, f"budget {name!r} exists")
    resources.add_budget(ctx, name, limit_minor, scale, currency)
    budget: Budget = resources.find(ctx.state, BUDGET, ctx.space.id, name)
    return {"budget_id": budget.public_id}


def declare(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The budget named `name` of this limit, scale and currency: created, or found when it has
    them; CONFLICT when one differs."""
    name = resources.require_budget_name(args.get("name"))
    sizes = _sizes(args)
    budget = resources.find(ctx.state, BUDGET, ctx.space.id, name)
    if budget is None:
        return {**create(ctx, args), "created": True}
    if (budget.limit_minor, budget.scale, budget.currency) != sizes:
        raise Rejected(
            errors.CONFLICT,
            f"budget {name!r} has limitMinor {budget.limit_minor}, scale {budget.scale} and currency "
            f"{budget.currency}, not {sizes[0]}, {sizes[1]} and {sizes[2]}",
        )
    return {"budget_id": budget.public_id, "created": False, idempotency.UNCHANGED: True}


# -- reservations --------------------------------------------------------------------------------


def _open(
    ctx: Context, budget: Budget, reservation_id: str, run_id: str, holder: Any, amount_minor: int,
    settle_by_ms: int, task: Task | None = None,
) -> BudgetReservation:
    assert amount_minor <= resources.remaining_minor(budget)
    assert reservation_id not in ctx.state.budget_reservations, "leader generated a duplicate reservation id"
    reservation = BudgetReservation(
        reservation_id, ctx.space.id, budget.id, run_id, holder, amount_minor, amount_minor, settle_by_ms, ctx.now_ms,
        task_id=None if task is None else task.id,
        delivery=None if task is None else f"{task.id}.{task.delivery_count + 1}",
    )
    ctx.state.budget_reservations[reservation_id] = reservation
    budget.reservations.append(reservation_id)
    budget.reserved_minor += amount_minor
    ctx.state.arm(settle_by_ms, DueKind.BUDGET_SETTLE_BY, reservation_id)
    _check(budget)
    if task is None:  # a job's is taken with its delivery: task.running records it
        _event(ctx, "budget.reserved", budget, reservation, amountMinor=str(amount_minor))
    return reservation


def _event(ctx: Context, event_type: str, budget: Budget, reservation: BudgetReservation, **extra: Any) -> None:
    """budget.reserved, budget.settled, budget.voided, budget.stale: about the budget, under the
    reservation's run; minor units as decimal-digit strings, as the API shows them."""
    events.emit(ctx, event_type, reservation.run_id, "budget", budget.public_id, {
        "budgetId": budget.public_id, "reservationId": reservation.id, "taskId": reservation.task_id,
        "state": reservation.state, **extra,
    })


def _check(budget: Budget) -> None:
    assert budget.settled_minor >= 0 and budget.reserved_minor >= 0


def reserve(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Hold `amount_minor` of the budget under run `run_id` until `settle_by_ms` (None: now + the
    default); INSUFFICIENT_BUDGET when less remains."""
    budget = _require_budget(ctx, args.get("budget_id"))
    amount_minor = _require_minor(args.get("amount_minor"), "amountMinor", 1)
    run = runs.require_run(ctx, args.get("run_id"))
    settle_by_ms = args.get("settle_by_ms")
    if settle_by_ms is None:
        settle_by_ms = ctx.now_ms + limits.budget_settle_by_ms_default
    if type(settle_by_ms) is not int or not ctx.now_ms < settle_by_ms <= ctx.now_ms + limits.budget_settle_by_ms_max:
        raise Rejected(
            errors.VALIDATION_FAILED, f"settleBy must be after now and at most {limits.budget_settle_by_ms_max // 3_600_000} hours ahead"
        )
    runs.require_active(ctx, run)
    if len(budget.holds) + len(budget.reservations) >= limits.reservations_per_budget_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a budget holds at most {limits.reservations_per_budget_max} reservations at once")
    remaining = resources.remaining_minor(budget)
    if amount_minor > remaining:
        raise Rejected(
            errors.INSUFFICIENT_BUDGET,
            f"budget {budget.name!r} has {max(remaining, 0)} minor units left, not {amount_minor}",
        )
    reservation = _open(ctx, budget, RESERVATION_PREFIX + ctx.command_id, run.id, args.get("holder"), amount_minor, settle_by_ms)
    return {
        "reservation_id": reservation.id, "reserved_minor": amount_minor, "state": reservation.state,
        "settle_by_ms": settle_by_ms,
    }


def _require_reservation(ctx: Context, budget: Budget, reservation_id: Any) -> BudgetReservation:
    reservation = ctx.state.budget_reservations.get(reservation_id) if isinstance(reservation_id, str) else None
    if reservation is None or reservation.budget_id != budget.id:
        raise Rejected(errors.NOT_FOUND, f"reservation {reservation_id!r} of budget {budget.public_id} not found")
    return reservation


def _require_work_key(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= limits.budget_work_key_chars_max:
        raise Rejected(errors.VALIDATION_FAILED, f"workKey must be 1 to {limits.budget_work_key_chars_max} characters")
    return value


def _settled(reservation: BudgetReservation, charged_minor: int) -> dict[str, Any]:
    return {
        "reservation_id": reservation.id, "state": reservation.state, "charged_minor": charged_minor,
        "settled_minor": reservation.settled_minor, "reserved_minor": reservation.held_minor,
    }


def settle(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Charge `amount_minor` against the reservation, once per `work_key` (see the module doc)."""
    budget = _require_budget(ctx, args.get("budget_id"))
    reservation = _require_reservation(ctx, budget, args.get("reservation_id"))
    amount_minor = _require_minor(args.get("amount_minor"), "amountMinor", 0)
    work_key = _require_work_key(args.get("work_key"))
    earlier = reservation.settles.get(work_key)
    if earlier is not None:
        if earlier[0] != amount_minor:
            raise Rejected(errors.CONFLICT, f"workKey {work_key!r} settled {earlier[0]} already, not {amount_minor}")
        return {**_settled(reservation, earlier[1]), idempotency.UNCHANGED: True}
    if reservation.state not in _OPEN:
        raise Rejected(errors.CONFLICT, f"reservation {reservation.id} is {reservation.state}: nothing left to settle")
    if len(reservation.settles) >= limits.budget_settles_per_reservation_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a reservation takes at most {limits.budget_settles_per_reservation_max} settles")
    held = reservation.held_minor
    if amount_minor <= held:
        charged, released = amount_minor, amount_minor
    elif not args.get("allow_overrun"):
        raise Rejected(
            errors.INSUFFICIENT_BUDGET,
            f"reservation {reservation.id} holds {held}, less than {amount_minor} (settle with allowOverrun to charge more)",
        )
    else:  # what it holds, and of the rest only what the budget has unreserved
        charged, released = min(amount_minor, held + max(resources.remaining_minor(budget), 0)), held
    reservation.held_minor -= released
    reservation.settled_minor += charged
    reservation.settles[work_key] = [amount_minor, charged]
    budget.reserved_minor -= released
    budget.settled_minor += charged
    if reservation.held_minor == 0:
        _end(ctx, budget, reservation)
    _check(budget)
    _event(ctx, "budget.settled", budget, reservation, workKey=work_key, chargedMinor=str(charged),
           releasedMinor=str(released), heldMinor=str(reservation.held_minor))
    return _settled(reservation, charged)


def void(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Release what the reservation still holds; the same `work_key` again answers the same."""
    budget = _require_budget(ctx, args.get("budget_id"))
    reservation = _require_reservation(ctx, budget, args.get("reservation_id"))
    work_key = _require_work_key(args.get("work_key"))
    if reservation.state not in _OPEN:
        if reservation.void_key == work_key:
            return {**_settled(reservation, 0), idempotency.UNCHANGED: True}
        raise Rejected(errors.CONFLICT, f"reservation {reservation.id} is {reservation.state} already")
    reservation.void_key = work_key
    _void(ctx, budget, reservation, "voided")
    return _settled(reservation, 0)


def _void(ctx: Context, budget: Budget, reservation: BudgetReservation, reason: str) -> None:
    """End the reservation, releasing what it holds; budget.voided (reason: voided, scope_stopped,
    delivery_ended)."""
    released = reservation.held_minor
    _end(ctx, budget, reservation)
    _event(ctx, "budget.voided", budget, reservation, reason=reason, releasedMinor=str(released))


def _end(ctx: Context, budget: Budget, reservation: BudgetReservation) -> None:
    """The reservation ends: what it still holds returns; it is kept ended (the oldest ended of
    the budget forgotten past limits.budget_ended_kept_max)."""
    assert reservation.state in _OPEN
    budget.reserved_minor -= reservation.held_minor
    reservation.held_minor = 0
    reservation.state = ReservationState.SETTLED if reservation.settled_minor else ReservationState.VOIDED
    reservation.ended_ms = ctx.now_ms
    budget.reservations.remove(reservation.id)
    budget.ended.append(reservation.id)
    while len(budget.ended) > limits.budget_ended_kept_max:
        del ctx.state.budget_reservations[budget.ended.pop(0)]
    resources.wake(ctx, BUDGET, budget)  # the old routes' waiters, and jobs that wait for money


def on_settle_by_due(ctx: Context, reservation_id: str, due_ms: int) -> None:
    """Its settleBy passed: STALE, still holding its amount (never refunded by time)."""
    reservation = ctx.state.budget_reservations.get(reservation_id)
    if reservation is None or reservation.state != ReservationState.ACTIVE or reservation.settle_by_ms != due_ms:
        return
    reservation.state = ReservationState.STALE
    _event(ctx, "budget.stale", ctx.state.budgets[reservation.budget_id], reservation,
           heldMinor=str(reservation.held_minor))


# -- runs and jobs -------------------------------------------------------------------------------


def _on_run_stop(ctx: Context, run: Run, reason: str) -> None:
    """A stopped run's open reservations end: what they hold returns at once."""
    # A scan of the open reservations of the space's budgets: at most resources_per_space_max x
    # reservations_per_budget_max (the ended ones kept are not looked at).
    stopped = [
        (budget, reservation)
        for budget in ctx.state.budgets.values() if budget.space == run.space
        for reservation in (ctx.state.budget_reservations[rid] for rid in budget.reservations)
        if reservation.run_id == run.id
    ]
    for budget, reservation in stopped:
        _void(ctx, budget, reservation, "scope_stopped")


runs.RUN_STOP_HOOKS.append(_on_run_stop)


def reserve_for_job(ctx: Context, task: Task, holder: Any) -> list[str]:
    """The reservations of the job's requirements.budgets for the delivery being handed out (its
    number: task.delivery_count + 1), under its run; resources.take_needs found they fit."""
    ids = []
    assert task.needs is not None
    for index, (name, amount_minor) in enumerate(task.needs.get("budgets") or []):
        budget: Budget = resources.find(ctx.state, BUDGET, task.space, name)
        reservation = _open(
            ctx, budget, f"{RESERVATION_PREFIX}{task.id}.{task.delivery_count + 1}.{index}", task.run_id, holder,
            amount_minor, ctx.now_ms + limits.budget_settle_by_ms_default, task,
        )
        ids.append(reservation.id)
    return ids


def _on_delivery_end(ctx: Context, task: Task, completed: bool) -> None:
    """A delivery that did not complete voids its open reservations (no event: the task's own
    end records it, as task.running recorded their reserve; but one the log told of already, by
    a settle or going STALE during the delivery, has its end told too: budget.voided, reason
    delivery_ended); a completed one leaves them to the worker's settle or void."""
    if completed or task.needs is None or not task.needs.get("budgets"):
        return
    delivery = f"{task.id}.{task.delivery_count}"
    # Each budget once, in the order the job names them (a set's order differs between processes,
    # and every node must tell the same events in the same order).
    for name in dict.fromkeys(name for name, _ in task.needs["budgets"]):
        budget: Budget = resources.find(ctx.state, BUDGET, task.space, name)
        ended = [
            reservation for reservation in (ctx.state.budget_reservations[rid] for rid in budget.reservations)
            if reservation.delivery == delivery
        ]
        for reservation in ended:
            if reservation.settles or reservation.state == ReservationState.STALE:
                _void(ctx, budget, reservation, "delivery_ended")
            else:
                _end(ctx, budget, reservation)


resources.DELIVERY_END_HOOKS.append(_on_delivery_end)


# -- views (for the node, under its read lock) ---------------------------------------------------


def row(budget: Budget) -> dict[str, Any]:
    """A budget as the list shows it (minor units as decimal-digit strings)."""
    return {
        "id": budget.public_id, "name": budget.name, "currency": budget.currency, "scale": budget.scale,
        "limitMinor": str(budget.limit_minor),
    }


def view(state: State, budget: Budget) -> dict[str, Any]:
    """A budget with its totals and reservations (open, then the ended ones kept); times in ms."""
    return {
        **row(budget),
        "reservedMinor": str(budget.reserved_minor),
        "settledMinor": str(budget.settled_minor),
        "remainingMinor": str(max(resources.remaining_minor(budget), 0)),
        "waiting": budget.waiting,  # QUEUED jobs that name it (the SDK's budget view shows it)
        "reservations": [
            {
                "id": reservation.id, "scopeId": reservation.run_id, "holder": reservation.holder,
                "taskId": reservation.task_id, "reservedMinor": str(reservation.held_minor),
                "settledMinor": str(reservation.settled_minor), "state": reservation.state,
                "settleBy": reservation.settle_by_ms,
            }
            for reservation in (state.budget_reservations[rid] for rid in [*budget.reservations, *budget.ended])
        ],
    }


def rows(state: State, space_id: str) -> list[dict[str, Any]]:
    """The space's budgets, oldest first."""
    return [row(budget) for budget in state.budgets.values() if budget.space == space_id]


HANDLERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "budget.create": create,
    "budget.declare": declare,
    "budget_reservation.reserve": reserve,
    "budget_reservation.settle": settle,
    "budget_reservation.void": void,
}

DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {DueKind.BUDGET_SETTLE_BY: on_settle_by_due}
