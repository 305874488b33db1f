"""Slots, rate limits and spend budgets: `rs.pools`, `rs.limits`, `rs.budgets` configure them for
the space; a run takes them (`run.slot`, `run.limits.take`, `run.budget`), or a queue names them so
that a worker takes a job and everything it needs in one step (`submit(..., slots=, limit=, budget=)`).

    await rs.pools.ensure("browser", size=4)
    await rs.limits.ensure("search-api", units=10, per="1s")
    await rs.budgets.ensure("model-usd", total=25.00)

    run = rs.scope(run_id)
    async with run.slot("browser", timeout_ms=60_000) as lease:    # renewed while held, released on exit
        ...
    await run.limits.take("search-api", units=1, timeout_ms=10_000)
    async with run.budget("model-usd", amount=0.40) as reservation:
        reservation.spend(0.12)                                      # settled on exit

All of it is the published protocol on the wire: a pool is a permit, a rate limit an allowance,
a budget a protocol budget in exact integer minor units, and a queue's needs its `requirements`.
Amounts are decimals, converted exactly to the budget's minor units (a budget this SDK declares
has scale 6: 25 spends of 0.40 are 10.00). A slot lease held with `async with` is renewed every
third of its lease; when a renewal is refused (the lease lapsed, or the run stopped) it is marked
lost, its `signal` is set, the block is cancelled and LeaseLostError comes out of it. A
reservation has no lease: the same happens when its run stops (which voids it).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import warnings
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from runstate.sdk._http import path_segment
from runstate.sdk._time import format_time, parse_duration_ms, parse_time
from runstate.sdk.errors import (
    ConfigError,
    ConflictError,
    LeaseLostError,
    NotFoundError,
    RunstateError,
    ScopeCancelledError,
    ValidationError,
    WaitTimeoutError,
)

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from runstate.sdk._http import Transport

logger = logging.getLogger("runstate.sdk")

SLOT_LEASE_MS_DEFAULT = 30_000
WAIT_TIMEOUT_MS_DEFAULT = 60_000
# Renewing: a third of the lease, but not more often than this.
RENEW_INTERVAL_S_MIN = 0.05
# A pool's line of waiters: the first pause between two looks at a waiter, the longest, and the
# longest TTL a waiter is given (the server's bound; a longer wait joins the line again).
WAITER_POLL_S_MIN = 0.05
WAITER_POLL_S_MAX = 0.5
WAITER_TTL_S_MAX = 3600
MICROS_PER_UNIT = 1_000_000
# Budgets on the protocol: the scale (digits after the point) of a budget this SDK declares, so
# that sub-cent costs stay exact, and its currency.
# Allowances (the protocol's rate limits): the longest window in seconds, and the refusals of a
# consume that a wait in the allowance's line can outlast.
WINDOW_S_MAX = 86_400
ALLOWANCE_REFUSALS = frozenset({"ALLOWANCE_EXHAUSTED", "ALLOWANCE_COOLDOWN"})
BUDGET_SCALE = 6
BUDGET_CURRENCY = "USD"
# A reservation's settleBy is now + its lease_ms, within these bounds (the lower one rides out a
# client clock behind the server's; the upper one is the server's).
SETTLE_BY_S_MIN = 60
SETTLE_BY_S_MAX = 86_400
# Waiting for a budget to have room: the first pause between two reserves, and the longest.
RESERVE_POLL_S_MIN = 0.05
RESERVE_POLL_S_MAX = 0.5

SlotsLike = str | Sequence[str] | None
LimitLike = str | Mapping[str, Any] | None
BudgetLike = Mapping[str, Any] | None
DurationLike = float | int | str | timedelta

H = TypeVar("H", bound="Held")
W = TypeVar("W")
T = TypeVar("T")
R = TypeVar("R", bound="_Resources")
S = TypeVar("S", bound="_InScope")


def _count(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    return value


def _amount(value: float, what: str) -> float:
    """A decimal amount for the API: a finite, non-negative number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{what} must be a non-negative number, got {value!r}")
    return float(value)


def _micros(amount: float) -> int:
    return round(amount * MICROS_PER_UNIT)


def spent_value(value: float) -> float:
    """An amount spent as sent to the server: rounded to the micro-unit. ConfigError if negative
    or not a number."""
    return _micros(_amount(value, "the amount spent")) / MICROS_PER_UNIT


def to_minor(amount: float, scale: int, what: str) -> int:
    """`amount` (a decimal, read exactly from its shortest form: 0.1 is one tenth) in minor units
    of a budget of `scale`. ConfigError when negative, not a number, or not a whole number of
    minor units (0.405 at scale 2)."""
    _amount(amount, what)
    minor = Decimal(str(amount)).scaleb(scale)
    if minor != minor.to_integral_value():
        raise ConfigError(f"{what} {amount!r} is finer than the budget's minor units (scale {scale})")
    return int(minor)


def from_minor(minor: Any, scale: int) -> float:
    """Minor units (a decimal-digit string or an integer) of a budget of `scale`, as a decimal."""
    return float(Decimal(int(minor)).scaleb(-scale))


def _expiry(value: Any) -> datetime | None:
    try:
        return parse_time(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _field(answer: dict[str, Any], name: str) -> Any:
    if name not in answer:
        raise RunstateError(f"the server's answer lacks {name!r}: {answer!r}", code="INVALID_RESPONSE", status=None)
    return answer[name]


def needs_body(slots: SlotsLike, limit: LimitLike, budget: BudgetLike) -> dict[str, Any]:
    """The fields a task submit carries for what the job needs. ConfigError when malformed.

    `slots` is a pool name or a list of them; `limit` a limit name (1 unit) or `{"name", "units"}`;
    `budget` `{"name", "amount"}` (`{"name", "reserve"}`, deprecated, still works).
    """
    body: dict[str, Any] = {}
    if slots is not None:
        if isinstance(slots, str):
            names: str | list[str] = slots
        elif isinstance(slots, Sequence) and slots:
            names = list(slots)
        else:
            raise ConfigError(f"slots must be a pool name or a non-empty list of them, got {slots!r}")
        for name in [names] if isinstance(names, str) else names:
            path_segment(name, "a pool name in slots")
        body["slots"] = names
    if limit is not None:
        if isinstance(limit, str):
            limit = {"name": limit}
        if not isinstance(limit, Mapping) or "name" not in limit or set(limit) - {"name", "units"}:
            raise ConfigError(f'limit must be a limit name or {{"name", "units"}}, got {limit!r}')
        path_segment(limit["name"], "limit name")
        body["limit"] = {"name": limit["name"]}
        if "units" in limit:
            body["limit"]["units"] = _count(limit["units"], "limit units")
    if budget is not None:
        if not isinstance(budget, Mapping) or set(budget) not in ({"name", "amount"}, {"name", "reserve"}):
            raise ConfigError(f'budget must be {{"name", "amount"}}, got {budget!r}')
        path_segment(budget["name"], "budget name")
        amount = budget_amount(budget.get("amount"), budget.get("reserve"), 'budget={"name", "amount"}', stacklevel=4)
        # "reserve" is the wire's name (the protocol's reserveMinor), not the user's.
        body["budget"] = {"name": budget["name"], "reserve": _amount(amount, "budget amount")}
    return body


def budget_amount(amount: Any, reserve: Any, where: str, stacklevel: int = 3) -> Any:
    """The amount of a budget to reserve, given as `amount`, or by its old name `reserve` (as
    runstate-sdk 0.3.0 named it in `budget(name, reserve=...)` and a submit's `budget`): accepted
    with a DeprecationWarning. ConfigError when both or neither are given."""
    if reserve is None:
        if amount is None:
            raise ConfigError(f"{where} needs the amount to reserve")
        return amount
    if amount is not None:
        raise ConfigError(f"{where}: give the amount once, as amount (reserve is its deprecated name)")
    warnings.warn(
        f"{where}: 'reserve' is deprecated, name the amount 'amount'", DeprecationWarning, stacklevel=stacklevel
    )
    return reserve


async def requirements_body(
    transport: Transport, slots: SlotsLike, limit: LimitLike, budget: BudgetLike
) -> dict[str, Any] | None:
    """What a job needs as the protocol's `requirements` (`{"pools": [{"name", "units"}],
    "quotas": [{"name", "units"}], "budgets": [{"name", "reserveMinor"}]}`), or None for nothing.
    A pool named n times is n units of it; a budget's reserve is converted exactly to its minor
    units (its scale is looked up once per name: NotFoundError for an unknown budget, ConfigError
    for a reserve finer than its minor units). ConfigError when malformed (see `needs_body`)."""
    needs = needs_body(slots, limit, budget)
    if not needs:
        return None
    requirements: dict[str, Any] = {}
    if "slots" in needs:
        units: dict[str, int] = {}
        for name in [needs["slots"]] if isinstance(needs["slots"], str) else needs["slots"]:
            units[name] = units.get(name, 0) + 1
        requirements["pools"] = [{"name": name, "units": count} for name, count in units.items()]
    if "limit" in needs:
        requirements["quotas"] = [{"name": needs["limit"]["name"], "units": needs["limit"].get("units", 1)}]
    if "budget" in needs:
        name, reserve = needs["budget"]["name"], needs["budget"]["reserve"]
        row = await _budget_row(transport, name)
        reserve_minor = to_minor(reserve, row["scale"], "budget reserve")
        if reserve_minor < 1:
            raise ConfigError(f"budget reserve must be at least one minor unit of budget {name}, got {reserve!r}")
        requirements["budgets"] = [{"name": name, "reserveMinor": str(reserve_minor)}]
    return requirements


async def settle_job_reservations(
    transport: Transport, reservations: Sequence[str], needs: Mapping[str, Any] | None, spent: float | None
) -> None:
    """After a job's delivery: settle each reservation of its `requirements.budgets` with `spent`
    (None: the whole reservation) and void the rest; a `spent` of 0 voids it. Failures are
    logged, never raised (the job's outcome is recorded already)."""
    budgets = list((needs or {}).get("budgets") or [])
    for reservation_id, need in zip(reservations, budgets, strict=False):
        try:
            row = await _budget_row(transport, need["name"])
            amount_minor = int(need["reserveMinor"])
            if spent is not None:
                try:
                    amount_minor = to_minor(spent, row["scale"], "the amount spent")
                except ConfigError as exc:
                    logger.error("settling reservation %s with its whole reserve: %s", reservation_id, exc)
            await settle_reservation(transport, f"/budgets/{path_segment(row['id'], 'budget id')}", reservation_id, amount_minor)
        except RunstateError as exc:
            # CONFLICT: it had ended (the delivery's end or its run's stop voided it).
            logger.warning("settling reservation %s of budget %s failed: %s", reservation_id, need.get("name"), exc)


class Spending:
    """Amounts reported with `spend()`, summed exactly in micro-units; safe from any thread."""

    def __init__(self) -> None:
        self._micros: int | None = None
        self._lock = threading.Lock()

    def add(self, amount: float) -> None:
        micros = _micros(_amount(amount, "the amount spent"))
        with self._lock:
            self._micros = (self._micros or 0) + micros

    @property
    def total(self) -> float | None:
        """The sum reported so far, or None if `spend()` was never called."""
        micros = self._micros
        return None if micros is None else micros / MICROS_PER_UNIT


# -- configuration (per space) -------------------------------------------------------------------


class _Resources:
    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def status(self, name: str) -> dict[str, Any]:
        raise NotImplementedError


async def _declare(
    transport: Transport, by_name: str, body: dict[str, Any], ids: dict[str, str], name: str, route: str,
    id_of: Callable[[Transport, str], Awaitable[str]],
) -> dict[str, Any]:
    """Declare the resource `name` with `body` at `by_name` (its id remembered in `ids`), or, when
    it exists with other sizes (CONFLICT: a declaration never changes one), set them with `PATCH
    /{route}/{id}`. The declaration's answer, or `{"created": False}`."""
    try:
        declared = await transport.request("PUT", by_name, body=body, safe=True)
    except ConflictError as exc:
        if exc.code != "CONFLICT":
            raise
        resource_id = path_segment(await id_of(transport, name), f"{route} id")
        await transport.request("PATCH", f"/{route}/{resource_id}", body=body, safe=True)
        return {"created": False}
    ids[name] = _field(declared, "id")
    return declared


class Pools(_Resources):
    """Pools of slots of the space: `rs.pools`. On the wire a pool is a *permit*
    (`PUT /permits/by-name/{name}`, `GET /permits/{id}`); its id is looked up once per name."""

    async def ensure(self, name: str, size: int) -> dict[str, Any]:
        """Create the pool `name` with `size` slots, or resize it; safe to call every time.

        Returns its view `{"name", "size", "inUse", "waiting", "holders": [{"leaseId", "holder",
        "scopeId", "taskId", "leaseExpiresAt"}], "created"}` (`waiting`: queued jobs that need
        it; also the permit's own fields `id`, `unitsTotal`, `unitsInUse`, `grants`, `waiters`).
        A size below the slots in use grants nothing new until enough return. ValidationError for
        a size out of range.
        """
        body = {"units": _count(size, "size")}
        declared = await _declare(
            self._transport, _permit_path(name), body, _permit_ids(self._transport), name, "permits", _permit_id
        )
        view = await self.status(name)
        return {**view, "created": bool(declared.get("created"))}

    async def status(self, name: str) -> dict[str, Any]:
        """The view of `name` (see `ensure` for its fields). NotFoundError if it does not exist."""
        permit_id = await _permit_id(self._transport, name)
        try:
            view = await self._transport.request("GET", f"/permits/{path_segment(permit_id, 'permit id')}", safe=True)
        except NotFoundError:
            _permit_ids(self._transport).pop(name, None)  # forget an id the server no longer knows
            raise
        return _pool_view(view)


class Limits(_Resources):
    """Rate limits of the space: `rs.limits`. On the wire a limit is the protocol's *allowance*
    (`PUT /allowances/by-name/{name}`, `GET /allowances/{id}`); its id is looked up once per name.
    The protocol's window is whole seconds; runstate also takes a fraction of a second (down to
    1 ms), so `per="500ms"` works."""

    async def ensure(self, name: str, units: int, per: DurationLike = "1s") -> dict[str, Any]:
        """Create the rate limit `name` of `units` per `per` (seconds, "500ms", "1s", "1m" or a
        timedelta), or change it; safe to call every time. No window of `per` ever holds more
        than `units` taken units.

        Returns its view `{"name", "units", "intervalMs", "available", "takenInWindow", "waiting",
        "created"}` (`takenInWindow` is null under a cooldown or while waiters are in line; also
        the allowance's own fields `id`, `unitsLimit`, `windowSeconds`, `remaining`,
        `cooldownUntil`, `waiters`...).
        """
        interval_ms = parse_duration_ms(per, "per")
        if not 1 <= interval_ms <= WINDOW_S_MAX * 1000:
            raise ConfigError(f"per must be from 1 ms to {WINDOW_S_MAX} s, got {per!r}")
        window_s = interval_ms // 1000 if interval_ms % 1000 == 0 else interval_ms / 1000
        body = {"unitsLimit": _count(units, "units"), "windowSeconds": window_s}
        declared = await _declare(
            self._transport, _allowance_path(name), body, _allowance_ids(self._transport), name, "allowances",
            _allowance_id,
        )
        view = await self.status(name)
        return {**view, "created": bool(declared.get("created"))}

    async def status(self, name: str) -> dict[str, Any]:
        """The view of `name` (see `ensure` for its fields). NotFoundError if it does not exist."""
        allowance_id = await _allowance_id(self._transport, name)
        try:
            view = await self._transport.request("GET", f"/allowances/{path_segment(allowance_id, 'allowance id')}", safe=True)
        except NotFoundError:
            _allowance_ids(self._transport).pop(name, None)  # forget an id the server no longer knows
            raise
        return _limit_view(view)


class Budgets(_Resources):
    """Spend budgets of the space: `rs.budgets`. On the wire a budget is the protocol's budget in
    exact integer minor units (`PUT /budgets/by-name/{name}`, `GET /budgets/{id}`); its id and
    scale are looked up once per name. A budget this SDK declares has scale 6 (millionths), so
    that sub-cent costs stay exact; an existing budget keeps its own scale."""

    async def ensure(self, name: str, total: float) -> dict[str, Any]:
        """Create the budget `name` with `total` (a decimal), or change its total; safe to call
        every time. A total below what is spent and reserved grants nothing new. ConfigError for
        a total that is not positive, or finer than the budget's minor units.

        Returns its view `{"name", "total", "spent", "reserved", "remaining", "waiting",
        "reservations": [{"reservationId", "amount", "holder", "scopeId", "taskId",
        "leaseExpiresAt"}], "created"}` (also the protocol's own fields: `id`, `currency`,
        `scale`, `limitMinor`, `reservedMinor`, `settledMinor`, `remainingMinor`; the
        reservations are the open ones, with their `state` and `settleBy`).
        """
        if to_minor(total, BUDGET_SCALE, "total") < 1:
            raise ConfigError(f"total must be more than 0, got {total!r}")
        body = {"limitMinor": str(to_minor(total, BUDGET_SCALE, "total")), "scale": BUDGET_SCALE,
                "currency": BUDGET_CURRENCY}
        try:
            declared = await self._transport.request("PUT", _budget_path(name), body=body, safe=True)
        except ConflictError as exc:
            if exc.code != "CONFLICT":
                raise
            # It exists with another limit, scale or currency: a declaration never changes a
            # budget. Its total in its own minor units; PATCH /budgets/{id} sets a new one.
            row = await _budget_row(self._transport, name, fresh=True)
            limit_minor = to_minor(total, row["scale"], "total")
            if limit_minor != int(row["limitMinor"]):
                budget_id = path_segment(row["id"], "budget id")
                await self._transport.request(
                    "PATCH", f"/budgets/{budget_id}", body={"limitMinor": str(limit_minor)}, safe=True
                )
                _budget_rows(self._transport)[name] = {**row, "limitMinor": str(limit_minor)}
            declared = {"created": False}
        else:
            _budget_rows(self._transport)[name] = declared
        view = await self.status(name)
        return {**view, "created": bool(declared.get("created"))}

    async def status(self, name: str) -> dict[str, Any]:
        """The view of `name` (see `ensure` for its fields). NotFoundError if it does not exist."""
        row = await _budget_row(self._transport, name)
        try:
            view = await self._transport.request("GET", f"/budgets/{path_segment(row['id'], 'budget id')}", safe=True)
        except NotFoundError:
            _budget_rows(self._transport).pop(name, None)  # forget an id the server no longer knows
            raise
        _budget_rows(self._transport)[name] = {field: view.get(field) for field in ("id", "name", "scale", "limitMinor", "currency")}
        return _budget_view(view)


# -- what a run holds ----------------------------------------------------------------------------


class Held:
    """What slot leases and reservations share: an id held under a lease that the holder renews.

    `lease_expires_at` is an aware UTC datetime (None if the server sent none). `lost` turns True
    once a renewal was refused (the lease lapsed, or the run stopped): the server returns it, or
    has already, and `signal` (a threading.Event) is set. `lost_error` is that refusal.
    """

    _route: ClassVar[str]
    _kind: ClassVar[str]

    def __init__(
        self, transport: Transport, held_id: str, name: str, scope_id: str, lease_ms: int, expires: Any
    ) -> None:
        self._transport = transport
        self._path = f"/{self._route}/{path_segment(held_id, f'{self._kind} id')}"
        self.id = held_id
        self.name = name
        self.scope_id = scope_id
        self.lease_ms = lease_ms
        self.lease_expires_at = _expiry(expires)
        self.lost_error: RunstateError | None = None
        self.signal = threading.Event()

    def __repr__(self) -> str:
        lost = " lost" if self.lost else ""
        return f"<{type(self).__name__} {self.id} of {self.name}{lost}>"

    @property
    def lost(self) -> bool:
        return self.lost_error is not None

    def _lose(self, error: RunstateError) -> None:
        if self.lost_error is None:
            self.lost_error = error
        self.signal.set()

    async def renew(self, lease_ms: int | None = None) -> dict[str, Any]:
        """Extend the lease by `lease_ms` (default: the one it was taken with) from now; returns
        `{"leaseExpiresAt"}` and updates `lease_expires_at`.

        Raises LeaseLostError once it lapsed or was returned, ScopeCancelledError /
        DeadlineExceededError once its run stopped; both mark it lost.
        """
        body = self._renew_body(_count(self.lease_ms if lease_ms is None else lease_ms, "lease_ms"))
        try:
            answer = await self._transport.request("POST", f"{self._path}/renew", body=body, safe=True)
        except (ConflictError, NotFoundError) as exc:
            self._lose(exc)
            raise
        self.lease_expires_at = _expiry(answer.get("leaseExpiresAt")) or self.lease_expires_at
        return answer

    def _renew_body(self, lease_ms: int) -> dict[str, Any]:
        return {"leaseMs": lease_ms}

    async def release(self) -> dict[str, Any]:
        """Give it back at once (nothing spent). Returns `{"released": bool}` (False when it had
        lapsed already). Allowed after the run stopped."""
        return await self._transport.request("POST", f"{self._path}/release", body={}, safe=True)

    async def _finish(self, raised: bool) -> None:
        """Return it at the end of an `async with` block."""
        raise NotImplementedError

    async def _release_quietly(self) -> None:
        try:
            await self.release()
        except RunstateError as exc:
            # A lapsed lease has returned already; anything else lapses it in `lease_ms`.
            logger.info("releasing %r failed: %s", self, exc)


class SlotLease(Held):
    """One slot of a pool, held by a run: `async with run.slot("browser") as lease:`. On the wire
    it is a permit's grant (its `id` is the grantId), renewed and released with its token."""

    _route = "grants"
    _kind = "slot lease"

    def __init__(
        self, transport: Transport, held_id: str, name: str, scope_id: str, lease_ms: int, expires: Any, token: str
    ) -> None:
        super().__init__(transport, held_id, name, scope_id, lease_ms, expires)
        self._token = token

    def _renew_body(self, lease_ms: int) -> dict[str, Any]:
        return {"token": self._token, "leaseSeconds": lease_ms / 1000}

    async def release(self) -> dict[str, Any]:
        """Give it back at once. Returns `{"released": bool}` (False when it had lapsed or ended
        already). Allowed after the run stopped."""
        try:
            answer = await self._transport.request(
                "POST", f"{self._path}/release", body={"token": self._token}, safe=True
            )
        except LeaseLostError:
            return {"released": False}
        return {"released": bool(answer.get("released"))}

    async def _finish(self, raised: bool) -> None:
        await self._release_quietly()


class Reservation(Held):
    """An amount reserved from a budget: `async with run.budget("model-usd", amount=0.40) as r:`.

    `amount` is what was reserved; `spend(amount)` reports what was actually spent (summed over
    calls, `spent`); `settle()` charges it and returns the rest to the budget. On the wire it is
    a protocol reservation (`POST /budgets/{id}/reserve`): it has no lease to renew. Its
    `lease_expires_at` is its settleBy (past it the reservation is STALE: still held, still
    settled); a `renew()` checks that its run is still active, since the run's stop voids it.
    """

    _route = "budgets"
    _kind = "reservation"

    def __init__(
        self, transport: Transport, held_id: str, name: str, scope_id: str, lease_ms: int, expires: Any,
        amount: float, budget_id: str = "", scale: int = BUDGET_SCALE,
    ) -> None:
        super().__init__(transport, held_id, name, scope_id, lease_ms, expires)
        self._path = f"/budgets/{path_segment(budget_id or 'unknown', 'budget id')}"
        self.amount = amount
        self._scale = scale
        self._spending = Spending()

    def spend(self, amount: float) -> None:
        """Report `amount` more spent (no request; `settle` sends the sum). ConfigError for a
        negative or non-numeric amount."""
        self._spending.add(amount)

    @property
    def spent(self) -> float | None:
        """The sum reported with `spend()`, or None if it was never called."""
        return self._spending.total

    async def renew(self, lease_ms: int | None = None) -> dict[str, Any]:
        """A protocol reservation has no lease: this checks that its run is still active (its
        stop voids the reservation) and returns `{"leaseExpiresAt"}` (its settleBy, unchanged).

        Raises ScopeCancelledError once the run stopped, and marks the reservation lost.
        """
        if lease_ms is not None:
            _count(lease_ms, "lease_ms")
        view = await self._transport.request("GET", f"/scopes/{path_segment(self.scope_id, 'scope id')}", safe=True)
        if view.get("effective", "ACTIVE") != "ACTIVE":
            error = ScopeCancelledError(
                f"run {self.scope_id} stopped ({view.get('storedState')}): its reservations were voided", status=None
            )
            self._lose(error)
            raise error
        expires = self.lease_expires_at
        return {"leaseExpiresAt": None if expires is None else format_time(expires)}

    async def release(self) -> dict[str, Any]:
        """Give it back whole (nothing spent): the protocol's void. Returns `{"released": bool}`
        (False when it had ended already: settled, or voided by its run's stop). Allowed after the
        run stopped."""
        try:
            answer = await self._void()
        except ConflictError as exc:
            if exc.code != "CONFLICT":
                raise
            return {"released": False}
        return {"released": answer.get("state") in ("VOIDED", "SETTLED")}

    async def _void(self) -> dict[str, Any]:
        body = {"reservationId": self.id, "workKey": f"void:{self.id}"}
        return await self._transport.request("POST", f"{self._path}/void", body=body, safe=True)

    async def settle(self, spent: float | None = None) -> dict[str, Any]:
        """Charge `spent` (default: the sum reported with `spend()`, else the whole reservation)
        and return the rest. A spend over the reservation is charged up to what the budget still
        has. Returns `{"charged", "returned"}`.

        On the wire: `POST /budgets/{id}/settle` (workKey `settle:<reservationId>`, so a repeat
        after a lost answer charges nothing more; `allowOverrun`), then a void of what it still
        holds. Raises LeaseLostError once the reservation ended (its run's stop voided it:
        nothing was charged), and marks it lost; ConfigError for an amount finer than the
        budget's minor units. Allowed after the run stopped.
        """
        if spent is None:
            spent = self.spent if self.spent is not None else self.amount
        amount_minor = to_minor(spent, self._scale, "the amount spent")
        try:
            answer = await settle_reservation(self._transport, self._path, self.id, amount_minor)
        except ConflictError as exc:
            if exc.code != "CONFLICT":
                raise
            self._lose(exc)
            raise LeaseLostError(
                f"reservation {self.id} of {self.name} had ended (its run stopped?): nothing was charged: {exc}",
                status=exc.status,
            ) from exc
        charged = int(answer.get("chargedMinor") or 0)
        held = to_minor(self.amount, self._scale, "amount")
        return {"charged": from_minor(charged, self._scale), "returned": from_minor(max(held - charged, 0), self._scale)}

    async def _finish(self, raised: bool) -> None:
        if raised and self.spent is None:
            await self._release_quietly()
            return
        try:
            await self.settle()
        except LeaseLostError as exc:
            logger.warning("settling %r refused (it returned whole, nothing charged): %s", self, exc)
        except RunstateError:
            if not raised:
                raise
            logger.exception("settling %r failed", self)


async def settle_reservation(transport: Transport, budget_path: str, reservation_id: str, amount_minor: int) -> dict[str, Any]:
    """Charge `amount_minor` of a protocol reservation (workKey `settle:<id>`, allowOverrun: over
    the reservation up to what the budget can still cover) and void what it still holds, as the
    published worker does. A zero charge is a void. ConflictError (CONFLICT) once it had ended."""
    if amount_minor == 0:
        void_body = {"reservationId": reservation_id, "workKey": f"void:{reservation_id}"}
        return await transport.request("POST", f"{budget_path}/void", body=void_body, safe=True)
    body: dict[str, Any] = {
        "reservationId": reservation_id, "amountMinor": str(amount_minor), "workKey": f"settle:{reservation_id}",
        "allowOverrun": True,
    }
    answer = await transport.request("POST", f"{budget_path}/settle", body=body, safe=True)
    if answer.get("state") in ("ACTIVE", "STALE"):
        void = {"reservationId": reservation_id, "workKey": f"void:{reservation_id}"}
        try:
            await transport.request("POST", f"{budget_path}/void", body=void, safe=True)
        except ConflictError as exc:  # ended meanwhile (its run stopped): nothing more is held
            logger.info("voiding the rest of reservation %s failed: %s", reservation_id, exc)
    return answer


def _permit_path(name: str) -> str:
    return f"/permits/by-name/{path_segment(name, 'pool name')}"


# The permit id of each pool name, per transport (one client's): looked up once, then reused.
_PERMIT_IDS: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def _permit_ids(transport: Transport) -> dict[str, str]:
    return _PERMIT_IDS.setdefault(transport, {})


async def _permit_id(transport: Transport, name: str) -> str:
    """The permit id of pool `name` (`PUT /permits/by-name/{name} {}` looks it up the first
    time). NotFoundError when the space has no such pool."""
    ids = _permit_ids(transport)
    permit_id = ids.get(name)
    if permit_id is None:
        answer = await transport.request("PUT", _permit_path(name), body={}, safe=True)
        permit_id = ids[name] = _field(answer, "id")
    return permit_id


def _pool_view(view: dict[str, Any]) -> dict[str, Any]:
    """A permit's view in the pool's documented shape (its own fields kept)."""
    return {
        **view,
        "size": view.get("unitsTotal"),
        "inUse": view.get("unitsInUse"),
        "holders": [
            {"leaseId": grant.get("grantId"), "holder": grant.get("holder"), "scopeId": grant.get("scopeId"),
             "taskId": grant.get("taskId"), "leaseExpiresAt": grant.get("leaseExpiresAt")}
            for grant in view.get("grants") or []
        ],
    }


def _allowance_path(name: str) -> str:
    return f"/allowances/by-name/{path_segment(name, 'limit name')}"


# The allowance id of each limit name, per transport (one client's): looked up once, then reused.
_ALLOWANCE_IDS: weakref.WeakKeyDictionary[Any, dict[str, str]] = weakref.WeakKeyDictionary()


def _allowance_ids(transport: Transport) -> dict[str, str]:
    return _ALLOWANCE_IDS.setdefault(transport, {})


async def _allowance_id(transport: Transport, name: str) -> str:
    """The allowance id of limit `name` (`PUT /allowances/by-name/{name} {}` looks it up the
    first time). NotFoundError when the space has no such limit."""
    ids = _allowance_ids(transport)
    allowance_id = ids.get(name)
    if allowance_id is None:
        answer = await transport.request("PUT", _allowance_path(name), body={}, safe=True)
        allowance_id = ids[name] = _field(answer, "id")
    return allowance_id


def _limit_view(view: dict[str, Any]) -> dict[str, Any]:
    """An allowance's view in the limit's documented shape (its own fields kept)."""
    units = view.get("unitsLimit")
    remaining = view.get("remaining")
    free = view.get("cooldownUntil") is None and not view.get("waiters")
    return {
        **view,
        "units": units,
        "intervalMs": round(float(view.get("windowSeconds") or 0) * 1000),
        "available": remaining,
        "takenInWindow": units - remaining if free and isinstance(units, int) and isinstance(remaining, int) else None,
    }


class _Allowance:
    """Taking units of one allowance: at once, or through its FIFO line of waiters."""

    def __init__(self, transport: Transport, allowance_id: str) -> None:
        self._transport = transport
        self._path = f"/allowances/{path_segment(allowance_id, 'allowance id')}"

    async def try_consume(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """`{"consumptionId", "units"}`, or None when the window has not room now (or a cooldown
        holds, or waiters are in line)."""
        try:
            answer = await self._transport.request("POST", f"{self._path}/consume", body=body, safe=True)
        except RunstateError as exc:
            if exc.code in ALLOWANCE_REFUSALS:
                return None
            raise
        return {"consumptionId": _field(answer, "consumptionId"), "units": answer.get("units", body["units"])}

    async def wait_in_line(self, body: dict[str, Any], deadline: float) -> dict[str, Any] | None:
        """Join the line and poll the waiter (backing off to WAITER_POLL_S_MAX) until GRANTED.
        None when the waiter ended without a grant (expired, cancelled) or the deadline passed:
        the caller consumes again or gives up. A waiter still in line when this ends (a timeout,
        an error, a cancellation) is cancelled; one granted meanwhile counts as taken."""
        loop = asyncio.get_running_loop()
        ttl_s = min(WAITER_TTL_S_MAX, max(1, math.ceil(deadline - loop.time()) + 1))
        waiter = await self._transport.request("POST", f"{self._path}/wait", body={**body, "ttlSeconds": ttl_s}, safe=True)
        waiter_id = path_segment(_field(waiter, "waiterId"), "waiter id")
        pause_s, done = WAITER_POLL_S_MIN, False
        try:
            while True:
                state = waiter.get("state")
                if state == "GRANTED":
                    done = True
                    return {"consumptionId": _field(waiter, "consumptionId"), "units": body["units"]}
                if state != "WAITING":
                    done = True
                    # CANCELLED (its run stopped: the consume says how) or EXPIRED: try again.
                    return await self.try_consume(body)
                left_s = deadline - loop.time()
                if left_s <= 0:
                    done = True
                    return await self._leave(waiter_id, body["units"])  # its grant if it came meanwhile
                await asyncio.sleep(min(pause_s, left_s))
                pause_s = min(pause_s * 1.5, WAITER_POLL_S_MAX)
                waiter = await self._transport.request("GET", f"/allowance-waiters/{waiter_id}", safe=True)
        finally:
            if not done:  # an error or a cancellation: leave the line
                await self._leave(waiter_id, body["units"])

    async def _leave(self, waiter_id: str, units: int) -> dict[str, Any] | None:
        """Cancel the waiter; its grant when it was granted meanwhile."""
        try:
            answer = await self._transport.request("POST", f"/allowance-waiters/{waiter_id}/cancel", body={}, safe=True)
        except RunstateError as exc:  # it lapses with its TTL
            logger.info("leaving the line of %s failed: %s", self._path, exc)
            return None
        if answer.get("state") == "GRANTED" and answer.get("consumptionId"):
            return {"consumptionId": answer["consumptionId"], "units": units}
        return None


def _budget_path(name: str) -> str:
    return f"/budgets/by-name/{path_segment(name, 'budget name')}"


# The protocol row ({"id", "scale", "limitMinor", ...}) of each budget name, per transport.
_BUDGET_ROWS: weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = weakref.WeakKeyDictionary()


def _budget_rows(transport: Transport) -> dict[str, dict[str, Any]]:
    return _BUDGET_ROWS.setdefault(transport, {})


async def _budget_row(transport: Transport, name: str, fresh: bool = False) -> dict[str, Any]:
    """The protocol row of budget `name` (`PUT /budgets/by-name/{name} {}` looks it up the first
    time, or when `fresh`). NotFoundError when the space has no such budget."""
    rows = _budget_rows(transport)
    row = None if fresh else rows.get(name)
    if row is None:
        answer = await transport.request("PUT", _budget_path(name), body={}, safe=True)
        _field(answer, "id")
        row = rows[name] = {**answer, "scale": int(_field(answer, "scale"))}
    return row


def _budget_view(view: dict[str, Any]) -> dict[str, Any]:
    """A protocol budget's view in the documented decimal shape (its own fields kept)."""
    scale = int(_field(view, "scale"))

    def decimal(field: str) -> float:
        return from_minor(view.get(field) or 0, scale)

    open_states = ("ACTIVE", "STALE")
    return {
        **view,
        "total": decimal("limitMinor"),
        "spent": decimal("settledMinor"),
        "reserved": decimal("reservedMinor"),
        "remaining": decimal("remainingMinor"),
        "waiting": view.get("waiting", 0),
        "reservations": [
            {**row, "reservationId": row.get("id"), "amount": from_minor(row.get("reservedMinor") or 0, scale),
             "leaseExpiresAt": row.get("settleBy")}
            for row in view.get("reservations") or [] if row.get("state") in open_states
        ],
    }


class _Permit:
    """Acquiring a slot of one permit: at once, or through its FIFO line of waiters."""

    def __init__(self, transport: Transport, permit_id: str) -> None:
        self._transport = transport
        self._path = f"/permits/{path_segment(permit_id, 'permit id')}"

    async def try_acquire(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The grant, or None when the permit has not the units free now (CAPACITY_UNAVAILABLE)."""
        try:
            return await self._transport.request("POST", f"{self._path}/acquire", body=body, safe=True)
        except ConflictError as exc:
            if exc.code == "CAPACITY_UNAVAILABLE":
                return None
            raise

    async def wait_in_line(self, body: dict[str, Any], deadline: float) -> dict[str, Any] | None:
        """Join the line, poll the waiter (backing off to WAITER_POLL_S_MAX) and acquire with its
        waiterId once it is SIGNALED. None when the waiter ended without a grant (expired, or a
        signal lost to a race): the caller joins again. The waiter is cancelled when this ends
        without its grant (a timeout, an error, a cancellation)."""
        loop = asyncio.get_running_loop()
        ttl_s = min(WAITER_TTL_S_MAX, max(1, math.ceil(deadline - loop.time()) + 1))
        line_body = {"scopeId": body["scopeId"], "units": body["units"], "holder": body["holder"], "ttlSeconds": ttl_s}
        waiter = await self._transport.request("POST", f"{self._path}/wait", body=line_body, safe=True)
        waiter_id = path_segment(_field(waiter, "waiterId"), "waiter id")
        state, pause_s, granted = waiter.get("state"), WAITER_POLL_S_MIN, False
        try:
            while True:
                if state == "SIGNALED":
                    answer = await self.try_acquire({**body, "waiterId": waiter_id})
                    if answer is not None:
                        granted = True
                        return answer
                elif state == "CANCELLED":
                    # Its run stopped (the acquire says how), or someone cancelled it: join again.
                    answer = await self.try_acquire(body)
                    granted = answer is not None
                    return answer
                elif state != "WAITING":
                    return None  # expired (or granted to a lost answer): join again
                left_s = deadline - loop.time()
                if left_s <= 0:
                    return None
                await asyncio.sleep(min(pause_s, left_s))
                pause_s = min(pause_s * 1.5, WAITER_POLL_S_MAX)
                state = (await self._transport.request("GET", f"/permit-waiters/{waiter_id}", safe=True)).get("state")
        finally:
            if not granted:
                await self._leave(waiter_id)

    async def _leave(self, waiter_id: str) -> None:
        try:
            await self._transport.request("POST", f"/permit-waiters/{waiter_id}/cancel", body={}, safe=True)
        except RunstateError as exc:  # it lapses with its TTL
            logger.info("leaving the line of %s failed: %s", self._path, exc)


class _InScope:
    def __init__(self, transport: Transport, scope_id: str) -> None:
        self._transport = transport
        self.scope_id = scope_id
        self._path = f"/scopes/{path_segment(scope_id, 'scope id')}"


class ScopePools(_InScope):
    """`run.pools`: take slots under this run (`run.slot(...)` holds one for a block)."""

    async def acquire(
        self,
        name: str,
        lease_ms: int = SLOT_LEASE_MS_DEFAULT,
        timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT,
        holder: str | None = None,
    ) -> SlotLease:
        """Take a slot of pool `name`, waiting up to `timeout_ms` for one. Returns the `SlotLease`;
        renew it within `lease_ms` and release it (or use `run.slot`, which does both).

        Raises WaitTimeoutError when no slot was free in time, ScopeCancelledError /
        DeadlineExceededError once the run stopped, NotFoundError for an unknown pool.
        """
        _count(lease_ms, "lease_ms")
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise ConfigError(f"timeout_ms must be a non-negative integer, got {timeout_ms!r}")
        body = {
            "scopeId": self.scope_id, "units": 1, "holder": holder or self._transport.holder,
            "holderSession": self._transport.holder_session, "leaseSeconds": lease_ms / 1000,
        }
        permit = _Permit(self._transport, await _permit_id(self._transport, name))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        answer = await permit.try_acquire(body)
        while answer is None:  # full: join its FIFO line, and take the slot when it is our turn
            if loop.time() >= deadline:
                raise WaitTimeoutError(f"a slot of pool {name}", timeout_ms)
            answer = await permit.wait_in_line(body, deadline)
        return SlotLease(self._transport, _field(answer, "grantId"), name, self.scope_id, lease_ms,
                         answer.get("leaseExpiresAt"), _field(answer, "token"))


class ScopeLimits(_InScope):
    """`run.limits`: take units of rate limits under this run."""

    async def take(self, name: str, units: int = 1, timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT) -> dict[str, Any]:
        """Take `units` of the rate limit `name`, waiting up to `timeout_ms` until the window has
        room. Taken units are spent: they never come back (but see `settle`). Returns `{"taken":
        True, "availableAt", "consumptionId", "units"}`.

        On the wire: a consume of the allowance (`POST /allowances/{id}/consume`); when the window
        is full (or under a cooldown) the call joins the allowance's FIFO line (`POST
        /allowances/{id}/wait`), polls its waiter until the server grants it as the window opens,
        and leaves the line when the wait times out. Raises WaitTimeoutError when the units were
        not granted in time, ValidationError for more units than the limit has,
        ScopeCancelledError / DeadlineExceededError once the run stopped, NotFoundError for an
        unknown limit.
        """
        body = {"scopeId": self.scope_id, "units": _count(units, "units"), "holder": self._transport.holder}
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise ConfigError(f"timeout_ms must be a non-negative integer, got {timeout_ms!r}")
        allowance = _Allowance(self._transport, await _allowance_id(self._transport, name))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        answer = await allowance.try_consume(body)
        while answer is None:  # no room now: join its FIFO line, granted as the window opens
            if loop.time() >= deadline:
                raise WaitTimeoutError(f"{units} units of limit {name}", timeout_ms)
            answer = await allowance.wait_in_line(body, deadline)
        return {"taken": True, "availableAt": format_time(datetime.now(timezone.utc)), **answer}

    async def settle(self, consumption_id: str, units: int) -> dict[str, Any]:
        """Settle a take with the units it really used (token-weighted limits: take an estimate
        before an LLM call, settle with its real token count after): below the estimate the
        difference goes back to the window at once, above it the overrun is taken now (even past
        the limit, delaying later takes). Once: the same units again answer the same. Returns
        `{"consumptionId", "estimatedUnits", "units", "returnedUnits", "overrunUnits"}`.
        ConflictError for other units than a first settle; NotFoundError past an hour."""
        if isinstance(units, bool) or not isinstance(units, int) or units < 0:
            raise ConfigError(f"units must be a non-negative integer, got {units!r}")
        path = f"/allowance-consumptions/{path_segment(consumption_id, 'consumption id')}/settle"
        return await self._transport.request("POST", path, body={"units": units}, safe=True)


class ScopeBudgets(_InScope):
    """`run.budgets`: reserve amounts of spend budgets under this run (`run.budget(...)` for a block)."""

    async def reserve(
        self,
        name: str,
        amount: float,
        lease_ms: int = SLOT_LEASE_MS_DEFAULT,
        timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT,
        holder: str | None = None,
    ) -> Reservation:
        """Reserve `amount` of budget `name`, waiting up to `timeout_ms` until that much remains.
        Returns the `Reservation`; `settle(spent)` or `release()` it. Its settleBy is now +
        `lease_ms` (at least a minute, at most a day): past it the reservation is STALE, still
        held until settled, released or its run stops (nothing returns by time).

        Raises WaitTimeoutError when not enough remained in time, ValidationError for more than
        the budget's total, ConfigError for an amount finer than its minor units,
        ScopeCancelledError / DeadlineExceededError once the run stopped, NotFoundError for an
        unknown budget.
        """
        _count(lease_ms, "lease_ms")
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
            raise ConfigError(f"timeout_ms must be a non-negative integer, got {timeout_ms!r}")
        row = await _budget_row(self._transport, name)
        amount_minor = to_minor(amount, row["scale"], "amount")
        if amount_minor < 1:
            raise ConfigError(f"amount must be at least one minor unit of the budget, got {amount!r}")
        settle_s = min(max(lease_ms / 1000, SETTLE_BY_S_MIN), SETTLE_BY_S_MAX)
        body = {
            "scopeId": self.scope_id, "amountMinor": str(amount_minor), "holder": holder or self._transport.holder,
        }
        path = f"/budgets/{path_segment(row['id'], 'budget id')}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        pause_s = RESERVE_POLL_S_MIN
        while True:
            settle_by = datetime.now(timezone.utc) + timedelta(seconds=settle_s)
            try:
                answer = await self._transport.request(
                    "POST", f"{path}/reserve", body={**body, "settleBy": format_time(settle_by)}, safe=True
                )
                break
            except ConflictError as exc:
                if exc.code != "INSUFFICIENT_BUDGET":
                    raise
            if amount_minor > int((row := await _budget_row(self._transport, name, fresh=True))["limitMinor"]):
                raise ValidationError(
                    f"a reserve of {amount} is more than the total of budget {name}", code="VALIDATION_FAILED", status=None
                )
            left_s = deadline - loop.time()
            if left_s <= 0:
                raise WaitTimeoutError(f"{amount} of budget {name}", timeout_ms)
            await asyncio.sleep(min(pause_s, left_s))
            pause_s = min(pause_s * 1.5, RESERVE_POLL_S_MAX)
        return Reservation(self._transport, _field(answer, "reservationId"), name, self.scope_id, lease_ms,
                           answer.get("settleBy"), from_minor(_field(answer, "reservedMinor"), row["scale"]),
                           row["id"], row["scale"])


async def _keep(held: Held, on_lost: Callable[[], None]) -> None:
    """Renew `held` every third of its lease until cancelled; once a renewal is refused (which
    marks it lost), call `on_lost`."""
    interval_s = max(held.lease_ms / 3 / 1000, RENEW_INTERVAL_S_MIN)
    while True:
        await asyncio.sleep(interval_s)
        try:
            await held.renew()
        except (ConflictError, NotFoundError):
            on_lost()
            return
        except RunstateError as exc:
            # UNAVAILABLE and the like: try again at the next interval; the lease may still hold.
            logger.warning("renewing %r failed: %s", held, exc)


def _lost_error(held: Held) -> LeaseLostError:
    return LeaseLostError(f"{held._kind} {held.id} of {held.name} was lost: {held.lost_error}", status=None)


class Holding(Generic[H]):
    """`async with run.slot(...) as lease:` / `async with run.budget(...) as reservation:`.

    Takes it on entry (waiting as `acquire` / `reserve` do), renews it while the block runs,
    returns it on exit: a slot is released; a reservation is settled with what was spent (the
    whole reservation if `spend()` was never called), or released if the block raised before any
    `spend()`. If a renewal is refused, the block is cancelled and LeaseLostError is raised.
    """

    def __init__(self, take: Callable[[], Awaitable[H]]) -> None:
        self._take = take
        self._held: H | None = None
        self._task: asyncio.Task[Any] | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._in_block = False
        self._cancelled = False

    async def __aenter__(self) -> H:
        if self._held is not None:
            raise ConfigError("enter run.slot(...) / run.budget(...) once; call it again for another")
        self._held = held = await self._take()
        self._task = asyncio.current_task()
        self._in_block = True
        self._keeper = asyncio.create_task(_keep(held, self._on_lost))
        return held

    def _on_lost(self) -> None:
        if self._in_block and self._task is not None:
            self._cancelled = True
            self._task.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        held, keeper = self._held, self._keeper
        assert held is not None and keeper is not None
        self._in_block = False
        keeper.cancel()
        await asyncio.wait({keeper})
        await held._finish(raised=exc is not None)
        if not held.lost:
            return
        if self._cancelled:
            uncancel = getattr(self._task, "uncancel", None)  # Python 3.11+
            if uncancel is not None and uncancel() > 0:
                return  # also cancelled from outside: let that cancellation go on
        raise _lost_error(held) from held.lost_error


# -- the blocking client -------------------------------------------------------------------------


class _Blocking(Generic[T]):
    def __init__(self, inner: T, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal


class _BlockingResources(_Blocking[R]):
    def status(self, name: str) -> dict[str, Any]:
        return self._portal.call(self._inner.status, name)


class BlockingPools(_BlockingResources[Pools]):
    """`rs.pools` of the blocking client (see `Pools`)."""

    def ensure(self, name: str, size: int) -> dict[str, Any]:
        return self._portal.call(lambda: self._inner.ensure(name, size=size))


class BlockingLimits(_BlockingResources[Limits]):
    """`rs.limits` of the blocking client (see `Limits`)."""

    def ensure(self, name: str, units: int, per: DurationLike = "1s") -> dict[str, Any]:
        return self._portal.call(lambda: self._inner.ensure(name, units=units, per=per))


class BlockingBudgets(_BlockingResources[Budgets]):
    """`rs.budgets` of the blocking client (see `Budgets`)."""

    def ensure(self, name: str, total: float) -> dict[str, Any]:
        return self._portal.call(lambda: self._inner.ensure(name, total=total))


class BlockingSlotLease:
    """A slot lease of the blocking client (see `SlotLease`); usable from any thread but the portal's."""

    def __init__(self, inner: Held, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def __repr__(self) -> str:
        return repr(self._inner)

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def scope_id(self) -> str:
        return self._inner.scope_id

    @property
    def lease_ms(self) -> int:
        return self._inner.lease_ms

    @property
    def lease_expires_at(self) -> datetime | None:
        return self._inner.lease_expires_at

    @property
    def lost(self) -> bool:
        return self._inner.lost

    @property
    def lost_error(self) -> RunstateError | None:
        return self._inner.lost_error

    @property
    def signal(self) -> threading.Event:
        return self._inner.signal

    def renew(self, lease_ms: int | None = None) -> dict[str, Any]:
        return self._portal.call(self._inner.renew, lease_ms)

    def release(self) -> dict[str, Any]:
        return self._portal.call(self._inner.release)


class BlockingReservation(BlockingSlotLease):
    """A reservation of the blocking client (see `Reservation`)."""

    def __init__(self, inner: Reservation, portal: BlockingPortal) -> None:
        super().__init__(inner, portal)
        self._reservation = inner

    @property
    def amount(self) -> float:
        return self._reservation.amount

    @property
    def spent(self) -> float | None:
        return self._reservation.spent

    def spend(self, amount: float) -> None:
        self._reservation.spend(amount)

    def settle(self, spent: float | None = None) -> dict[str, Any]:
        return self._portal.call(self._reservation.settle, spent)


class BlockingHolding(Generic[H, W]):
    """`with run.slot(...) as lease:` of the blocking client (see `Holding`). The block runs in the
    caller's thread and cannot be cancelled: a refused renewal sets `lease.signal`, and
    LeaseLostError is raised when the block ends."""

    def __init__(self, take: Callable[[], Awaitable[H]], wrap: Callable[[H, BlockingPortal], W],
                 portal: BlockingPortal) -> None:
        self._take = take
        self._wrap = wrap
        self._portal = portal
        self._held: H | None = None
        self._keeper: asyncio.Task[None] | None = None

    def __enter__(self) -> W:
        if self._held is not None:
            raise ConfigError("enter run.slot(...) / run.budget(...) once; call it again for another")
        self._held = held = self._portal.call(self._take)
        self._keeper = self._portal.call(self._start_keeper, held)
        return self._wrap(held, self._portal)

    @staticmethod
    async def _start_keeper(held: H) -> asyncio.Task[None]:
        return asyncio.create_task(_keep(held, lambda: None))

    async def _finish(self, raised: bool) -> None:
        held, keeper = self._held, self._keeper
        assert held is not None and keeper is not None
        keeper.cancel()
        await asyncio.wait({keeper})
        await held._finish(raised)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._portal.call(self._finish, exc is not None)
        held = self._held
        assert held is not None
        if held.lost:
            raise _lost_error(held) from held.lost_error


class _BlockingInScope(_Blocking[S]):
    @property
    def scope_id(self) -> str:
        return self._inner.scope_id


class BlockingScopePools(_BlockingInScope[ScopePools]):
    """`run.pools` of the blocking client (see `ScopePools`)."""

    def acquire(
        self,
        name: str,
        lease_ms: int = SLOT_LEASE_MS_DEFAULT,
        timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT,
        holder: str | None = None,
    ) -> BlockingSlotLease:
        lease = self._portal.call(lambda: self._inner.acquire(name, lease_ms, timeout_ms, holder))
        return BlockingSlotLease(lease, self._portal)


class BlockingScopeLimits(_BlockingInScope[ScopeLimits]):
    """`run.limits` of the blocking client (see `ScopeLimits`)."""

    def take(self, name: str, units: int = 1, timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT) -> dict[str, Any]:
        return self._portal.call(lambda: self._inner.take(name, units=units, timeout_ms=timeout_ms))

    def settle(self, consumption_id: str, units: int) -> dict[str, Any]:
        return self._portal.call(lambda: self._inner.settle(consumption_id, units=units))


class BlockingScopeBudgets(_BlockingInScope[ScopeBudgets]):
    """`run.budgets` of the blocking client (see `ScopeBudgets`)."""

    def reserve(
        self,
        name: str,
        amount: float,
        lease_ms: int = SLOT_LEASE_MS_DEFAULT,
        timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT,
        holder: str | None = None,
    ) -> BlockingReservation:
        reservation = self._portal.call(lambda: self._inner.reserve(name, amount, lease_ms, timeout_ms, holder))
        return BlockingReservation(reservation, self._portal)


__all__ = [
    "BudgetLike",
    "Budgets",
    "Held",
    "Holding",
    "LimitLike",
    "Limits",
    "Pools",
    "Reservation",
    "ScopeBudgets",
    "ScopeLimits",
    "ScopePools",
    "SlotLease",
    "SlotsLike",
    "Spending",
    "needs_body",
    "requirements_body",
    "settle_job_reservations",
    "spent_value",
]
