"""Every rule of a resource: pools of slots, rate limits and spend budgets.

Pool: `size` slots of one space and name. A slot is held under a lease: a direct one (pool.acquire
under a run; renewed and released by its holder, returned when it lapses) or a job's (taken by the
receive that delivers the job and held under the delivery's lease). A size below the slots in use
grants nothing new until enough return.

Rate limit: `units` per `interval_ms`, a sliding window over command time: a take of k units at
time t is allowed iff the units taken in (t - interval_ms, t] plus k <= units, so no window of the
interval ever holds more than `units`. Taken units are spent; they come back only when an allowance
consumption is settled below its estimate (allowances.py, give_back). No take is made before a
cooldown ends, nor while allowance waiters are in line (a job does not jump it). A limit
remembers its takes of the longest interval allowed, so a longer interval counts the takes of its
window, and at most limits.limit_takes_max of them: beyond that it forgets what its window no
longer counts, then counts the rest in coarser steps of time (stricter, never looser).

Budget: money in exact integer minor units of a currency (`scale` digits after the point: scale
2 counts cents; budgets.py holds the protocol's rules). `limit - settled - reserved` remains. The
routes here count micro-units (a budget they create has scale 6; an amount is converted exactly to
the budget's scale, VALIDATION_FAILED when it is not a whole number of its minor units). A leased
reservation takes its amount from what remains; settling charges the actual spend, beyond the
reservation only up to what the budget still has (`charged = min(spent, amount + remaining)`), and
returns the rest. A lapsed, released or cancelled reservation returns whole. A limit below settled
+ reserved grants nothing new.

Jobs: a task's `needs` names slots, a limit and a budget. `task.receive` hands out a job only when
all of them can be taken now, and takes them in the step that leases the job (`take_needs`); each
end of the delivery (complete, retry, reject, release, lapse, its run's stop) gives them back once
(`end_holds`). Its queue serves jobs in order: tasks.receive skips a job that needs a resource of
an earlier job of the same queue it could not serve.

Ids: a resource is "<space>/<name>". A direct slot lease is "slt_<command id>", a direct
reservation "rsv_<command id>"; a job's holds are named after its delivery's number ("slt_<task
id>.<delivery number>.<n>", "rsv_<task id>.<delivery number>"), never its token. A hold is removed when it ends (nothing of it is kept until its run
is removed, so a long-lived run may acquire without end), so an id that is not held, ended or never
issued, answers released False to release and STALE_CLAIM to renew and settle; a live hold of
another space is NOT_FOUND. A direct lease is valid while `now_ms < lease_expires_ms`, as for
deliveries; stopping its run refuses renewals but keeps it until it is released, settled or lapses.

Waking: whatever returns something of a resource, or changes its config, wakes
("resource", space, kind, name) and the queues a receive found blocked on it; a due entry does so
when a rate limit's window opens for a take or a job that waits.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from runstate_server.actors import errors, events, idempotency, limits, runs
from runstate_server.actors.context import Context, queue_key, resource_key
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import EMPTY, DueKind, State, Task, TaskState, register_table

POOL = "pool"
LIMIT = "limit"
BUDGET = "budget"
KINDS = (POOL, LIMIT, BUDGET)

MICROS = 1_000_000  # micro-units per unit of a budget's currency: the old routes' amounts
PERMIT_PREFIX = "prm_"  # a pool's id on the protocol's wire (permits.py)
BUDGET_PREFIX = "bdg_"  # a budget's id on the protocol's wire (budgets.py); no budget name starts with it
ALLOWANCE_PREFIX = "alw_"  # a rate limit's id on the protocol's wire (allowances.py)


@dataclass(slots=True)
class Pool:
    id: str  # "<space>/<name>"
    space: str
    name: str
    size: int
    created_ms: int
    holds: list[str] = field(default_factory=list)  # ids of the slot leases held, oldest first
    waiting: int = 0  # QUEUED jobs that name it
    blocked: list[list[str]] = field(default_factory=list)  # [run id, mailbox]: queues to wake
    # Its id on the protocol's wire ("prm_<command id>"; one from a snapshot from before permits
    # gets one derived from its space and name: state.from_snapshot).
    public_id: str = ""
    # Its permit waiters' line, oldest first: the ids of those WAITING or SIGNALED (permits.py).
    waiters: list[str] = field(default_factory=list)


@dataclass(slots=True)
class RateLimit:
    id: str
    space: str
    name: str
    units: int
    interval_ms: int
    created_ms: int
    # [ms, units], oldest first, one per ms: the takes of the last limit_interval_ms_max (so that
    # a longer interval counts the takes of its window), at most limit_takes_max (see _record_take).
    takes: list[list[int]] = field(default_factory=list)
    wake_ms: int | None = None  # the armed LIMIT_WINDOW entry: when the window opens for a waiter
    waiting: int = 0
    blocked: list[list[str]] = field(default_factory=list)
    # -- allowances.py: the limit on the protocol's wire ---------------------------------------
    # Its id there ("alw_<command id>"; one of an older snapshot gets one derived from its id).
    public_id: str = ""
    waiters: list[str] = field(default_factory=list)  # its allowance waiters' line (all WAITING), oldest first
    cooldown_until_ms: int = 0  # nothing is taken before (allowance cooldown); 0: none ever
    cooldown_reason: str | None = None
    consumptions: list[str] = field(default_factory=list)  # those that may still be settled, oldest first
    # The latest time whose takes it forgot (_forget): a take at or before it may no longer be
    # counted, so a settle gives none of it back (stricter, never looser).
    forgotten_ms: int = 0


@dataclass(slots=True)
class Budget:
    """Amounts in integer minor units. (Before budgets had a scale these columns held micro-units:
    a budget of such a snapshot loads with scale 6, the same amounts.)"""

    id: str
    space: str
    name: str
    limit_minor: int
    created_ms: int
    settled_minor: int = 0  # charged, for good
    # Held now: its leased holds' amounts plus what its reservations (budgets.py) still hold.
    reserved_minor: int = 0
    holds: list[str] = field(default_factory=list)  # ids of its leased holds (the routes here), oldest first
    waiting: int = 0
    blocked: list[list[str]] = field(default_factory=list)
    scale: int = limits.budget_micro_scale
    currency: str = limits.budget_currency_default
    # Its id on the protocol's wire ("bdg_<command id>"; derived for an older snapshot's budget).
    public_id: str = ""
    # budgets.py: its open reservations (ACTIVE, STALE), oldest first; and the ended ones it keeps
    # for reads and repeated settles, oldest first, at most limits.budget_ended_kept_max.
    reservations: list[str] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Hold:
    """A slot lease (amount: the units it holds, 1 unless a permit grant asked for more) or a leased
    budget reservation (amount in the budget's minor units)."""

    id: str
    space: str
    resource_id: str
    run_id: str
    holder: str | None
    task_id: str | None  # the job whose delivery holds it; None for a direct hold
    amount: int
    # A direct hold's lease. A job's hold has none of its own (0, 0): it lasts as long as the
    # delivery's lease (see hold_expires_ms) and ends with the delivery.
    lease_ms: int
    lease_expires_ms: int
    created_ms: int
    # A permit grant's fencing token (`<hold id>.<command id><node nonce>`); None for a slot lease
    # of the pool routes and for a job's hold, which no token names.
    token: str | None = None
    holder_session: str | None = None


register_table("pools", Pool)
register_table("rate_limits", RateLimit)
register_table("budgets", Budget)
register_table("slot_leases", Hold)
register_table("reservations", Hold)

_TABLES = {POOL: "pools", LIMIT: "rate_limits", BUDGET: "budgets"}
_HOLD_TABLES = {POOL: "slot_leases", BUDGET: "reservations"}
_HOLD_PREFIXES = {POOL: "slt_", BUDGET: "rsv_"}
_HOLD_DUE = {POOL: DueKind.SLOT_LEASE, BUDGET: DueKind.RESERVATION}
_HOLD_NAMES = {POOL: "slot lease", BUDGET: "reservation"}


def resource_id(space_id: str, name: str) -> str:
    return f"{space_id}/{name}"


def to_micros(amount: int | float) -> int:
    """A decimal amount of the API and SDK in exact micro-units, read from its shortest decimal
    form (0.1 is 100000, never 100000.00000000001): 25 x 0.40 is exactly 10.00. ValueError when it
    has more than 6 decimal places."""
    if isinstance(amount, int):
        return amount * MICROS
    whole, _, fraction = f"{Decimal(repr(amount)):f}".partition(".")
    fraction = fraction.rstrip("0")
    if len(fraction) > limits.budget_micro_scale:
        raise ValueError(f"{amount} has more than {limits.budget_micro_scale} decimal places")
    return int(whole) * MICROS + int(fraction.ljust(limits.budget_micro_scale, "0"))


def from_micros(micros: int) -> float:
    return micros / MICROS


def minor_of_micros(micros: int, scale: int) -> int | None:
    """`micros` in minor units of `scale`, exactly; None when it is no whole number of them."""
    if scale >= limits.budget_micro_scale:
        return micros * 10 ** (scale - limits.budget_micro_scale)
    step = 10 ** (limits.budget_micro_scale - scale)
    return micros // step if micros % step == 0 else None


def micros_of_minor(minor: int, scale: int) -> int:
    """Minor units of `scale` as micro-units (rounded down when the scale is finer than micros)."""
    if scale >= limits.budget_micro_scale:
        return minor // 10 ** (scale - limits.budget_micro_scale)
    return minor * 10 ** (limits.budget_micro_scale - scale)


def require_minor_of_micros(budget: Budget, micros: int, what: str) -> int:
    """The old routes' micro-units in the budget's minor units; VALIDATION_FAILED when not exact."""
    minor = minor_of_micros(micros, budget.scale)
    if minor is None:
        raise Rejected(
            errors.VALIDATION_FAILED,
            f"{what} {from_micros(micros)} is not a whole number of budget {budget.name!r}'s minor units "
            f"(scale {budget.scale})",
        )
    return minor


def major(minor: int, scale: int) -> float:
    """Minor units as the decimal number the old routes show (a view for the wire, never counted)."""
    return float(Decimal(minor).scaleb(-scale))


def _table(state: State, kind: str) -> dict[str, Any]:
    table: dict[str, Any] = getattr(state, _TABLES[kind])
    return table


def _hold_table(state: State, kind: str) -> dict[str, Hold]:
    table: dict[str, Hold] = getattr(state, _HOLD_TABLES[kind])
    return table


def find(state: State, kind: str, space_id: str, name: str) -> Any:
    """The resource of `kind` named `name` in the space, or None."""
    return _table(state, kind).get(resource_id(space_id, name))


def _require_resource(ctx: Context, kind: str, name: Any) -> Any:
    resource = find(ctx.state, kind, ctx.space.id, name) if isinstance(name, str) else None
    if resource is None:
        raise Rejected(errors.NOT_FOUND, f"{kind} {name!r} not found; create it first")
    return resource


def _is_name(name: Any) -> bool:
    return isinstance(name, str) and 0 < len(name) <= limits.name_chars_max


def _require_name(name: Any) -> str:
    if not _is_name(name):
        raise Rejected(errors.VALIDATION_FAILED, f"a resource name must be 1 to {limits.name_chars_max} characters")
    assert isinstance(name, str)
    return name


def _require_int(value: Any, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise Rejected(errors.VALIDATION_FAILED, f"{what} must be an integer from {low} to {high}")
    return value


def require_spent(value: Any) -> int | None:
    """A delivery's or a settle's `spent_micros`: None (not given) or 0 to budget_total_micros_max."""
    if value is None:
        return None
    return _require_int(value, "spent_micros", 0, limits.budget_total_micros_max)


# -- config --------------------------------------------------------------------------------------


def _ensure(
    ctx: Context, kind: str, name: str, config: dict[str, int], make: Callable[[str], Any]
) -> dict[str, Any]:
    """Create the resource with `config` (field -> value), or change its config; a change wakes
    its waiters. The answer is the config and whether it was created."""
    resource = _table(ctx.state, kind).get(resource_id(ctx.space.id, name))
    created = resource is None
    if resource is None:
        count = ctx.space.resource_counts.get(kind, 0)
        if count >= limits.resources_per_space_max:
            raise Rejected(
                errors.LIMIT_EXCEEDED, f"a space holds at most {limits.resources_per_space_max} of kind {kind}"
            )
        resource = make(resource_id(ctx.space.id, name))
        _table(ctx.state, kind)[resource.id] = resource
        ctx.space.resource_counts[kind] = count + 1
        if kind == POOL:
            ctx.state.permit_ids[resource.public_id] = resource.id
        elif kind == BUDGET:
            ctx.state.budget_ids[resource.public_id] = resource.id
        elif kind == LIMIT:
            ctx.state.allowance_ids[resource.public_id] = resource.id
    elif any(getattr(resource, field_name) != value for field_name, value in config.items()):
        for field_name, value in config.items():
            setattr(resource, field_name, value)
        _wake(ctx, kind, resource)
    return {"name": name, **config, "created": created}


def ensure_pool(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Create the pool, or resize it (a size below the slots in use grants nothing new)."""
    name = _require_name(args.get("name"))
    size = _require_int(args.get("size"), "size", 1, limits.pool_size_max)
    return _ensure(ctx, POOL, name, {"size": size}, lambda pool_id: _new_pool(ctx, pool_id, name, size))


def _new_pool(ctx: Context, pool_id: str, name: str, size: int) -> Pool:
    return Pool(pool_id, ctx.space.id, name, size, ctx.now_ms, public_id=PERMIT_PREFIX + ctx.command_id)


def ensure_limit(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Create the rate limit, or change it (from now on; the takes it remembers count)."""
    name = _require_name(args.get("name"))
    units = _require_int(args.get("units"), "units", 1, limits.limit_units_max)
    interval_ms = _require_int(
        args.get("interval_ms"), "interval_ms", limits.limit_interval_ms_min, limits.limit_interval_ms_max
    )
    return _ensure(
        ctx, LIMIT, name, {"units": units, "interval_ms": interval_ms},
        lambda limit_id: RateLimit(
            limit_id, ctx.space.id, name, units, interval_ms, ctx.now_ms, public_id=ALLOWANCE_PREFIX + ctx.command_id
        ),
    )


def require_budget_name(name: Any) -> str:
    name = _require_name(name)
    if name.startswith(BUDGET_PREFIX):
        raise Rejected(errors.VALIDATION_FAILED, f"a budget name may not start with {BUDGET_PREFIX!r} (its ids do)")
    return name


def ensure_budget(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The old routes: create the budget of `total_micros` (scale 6), or change its limit (below
    settled + reserved: nothing new is granted)."""
    name = require_budget_name(args.get("name"))
    total = _require_int(args.get("total_micros"), "total_micros", 0, limits.budget_total_micros_max)
    budget = find(ctx.state, BUDGET, ctx.space.id, name)
    limit_minor = total if budget is None else require_minor_of_micros(budget, total, "total")
    if limit_minor > limits.budget_limit_minor_max:
        raise Rejected(errors.VALIDATION_FAILED, f"total is more than a budget holds ({limits.budget_limit_minor_max} minor units)")
    made = add_budget(ctx, name, limit_minor, limits.budget_micro_scale, limits.budget_currency_default)
    return {"name": name, "total_micros": total, "created": made["created"]}


def add_budget(ctx: Context, name: str, limit_minor: int, scale: int, currency: str) -> dict[str, Any]:
    """Create the budget (LIMIT_EXCEEDED past the space's count), or set the limit of the one of
    that name (the old routes; budgets.py checks a declaration first, so it never changes one)."""
    return _ensure(
        ctx, BUDGET, name, {"limit_minor": limit_minor},
        lambda budget_id: Budget(
            budget_id, ctx.space.id, name, limit_minor, ctx.now_ms, scale=scale, currency=currency,
            public_id=BUDGET_PREFIX + ctx.command_id,
        ),
    )


_PUBLIC_IDS = {POOL: "permit_ids", LIMIT: "allowance_ids", BUDGET: "budget_ids"}


def resize(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Change an existing resource's sizes, by its public id (the protocol's declarations never
    change one): a permit's `size`, an allowance's `units` and `interval_ms` (from now on: the
    takes it remembers count), a budget's `limit_minor`. A size below what is held grants nothing
    new until enough returns; a change wakes the resource's waiters. NOT_FOUND for an id the space
    does not have. The answer is the resource's name, its new config and created False."""
    kind = args.get("resource")
    if kind not in _PUBLIC_IDS:
        raise Rejected(errors.VALIDATION_FAILED, f"resource must be one of {', '.join(KINDS)}")
    public_id = args.get("id")
    internal = getattr(ctx.state, _PUBLIC_IDS[kind]).get(public_id) if isinstance(public_id, str) else None
    resource = _table(ctx.state, kind).get(internal) if internal is not None else None
    if resource is None or resource.space != ctx.space.id:
        raise Rejected(errors.NOT_FOUND, f"{kind} {public_id!r} not found")
    if kind == POOL:
        config = {"size": _require_int(args.get("size"), "size", 1, limits.pool_size_max)}
    elif kind == LIMIT:
        config = {
            "units": _require_int(args.get("units"), "units", 1, limits.limit_units_max),
            "interval_ms": _require_int(
                args.get("interval_ms"), "interval_ms", limits.limit_interval_ms_min, limits.limit_interval_ms_max
            ),
        }
    else:
        config = {"limit_minor": _require_int(args.get("limit_minor"), "limit_minor", 1, limits.budget_limit_minor_max)}
    return _ensure(ctx, kind, resource.name, config, _never_made)


def _never_made(resource_id: str) -> Any:
    raise AssertionError(f"resize found {resource_id} and never creates one")


# -- holds: slot leases and reservations ---------------------------------------------------------


def remaining_minor(budget: Budget) -> int:
    """What the budget can still reserve: below 0 when its limit was lowered under what it holds."""
    return budget.limit_minor - budget.settled_minor - budget.reserved_minor


def budget_has_room(budget: Budget, amount_minor: int, count: int = 1) -> bool:
    """Whether `amount_minor` can be reserved now, in `count` more reservations."""
    held = len(budget.holds) + len(budget.reservations)
    return held + count <= limits.reservations_per_budget_max and amount_minor <= remaining_minor(budget)


def units_in_use(state: State, pool: Pool) -> int:
    """The units its holds take: a hold of N units counts N (a job's slot and a pool lease, 1)."""
    return sum(state.slot_leases[hold_id].amount for hold_id in pool.holds)


def units_set_aside(state: State, pool: Pool) -> int:
    """The units set aside for its SIGNALED permit waiters (permits.py): nobody else takes them."""
    return sum(
        waiter.units for waiter in (state.permit_waiters[waiter_id] for waiter_id in pool.waiters)
        if waiter.state == "SIGNALED"
    )


def has_waiting(state: State, pool: Pool) -> bool:
    """Whether a permit waiter of the pool is WAITING (permits.py): then nothing that names no
    waiter takes its units, neither an acquire nor a job's slot (strict FIFO: no one jumps the line)."""
    return any(state.permit_waiters[waiter_id].state == "WAITING" for waiter_id in pool.waiters)


def has_room(state: State, pool: Pool, units: int) -> bool:
    """Whether `units` of the pool are free, beyond those in use and set aside."""
    return _has_room(state, POOL, pool, units)


def _has_room(state: State, kind: str, resource: Any, amount: int) -> bool:
    if kind == POOL:
        return units_in_use(state, resource) + units_set_aside(state, resource) + amount <= resource.size
    return budget_has_room(resource, amount)


def _hold(
    ctx: Context, kind: str, resource: Any, hold_id: str, run_id: str, holder: Any, task_id: str | None,
    amount: int, lease_ms: int,
) -> Hold:
    assert holder is None or isinstance(holder, str), holder  # the API checked it (holder_of)
    table = _hold_table(ctx.state, kind)
    assert hold_id not in table, "leader generated a duplicate hold id"
    expires_ms = ctx.now_ms + lease_ms if task_id is None else 0
    hold = Hold(hold_id, ctx.space.id, resource.id, run_id, holder, task_id, amount, lease_ms, expires_ms, ctx.now_ms)
    table[hold_id] = hold
    resource.holds.append(hold_id)
    if kind == BUDGET:
        resource.reserved_minor += amount
    return hold


def _end_hold(ctx: Context, kind: str, hold: Hold, spent_minor: int) -> tuple[int, int]:
    """End `hold`: a slot returns; a reservation charges what was spent (see the module doc) and
    returns the rest. Returns (charged, returned) minor units."""
    del _hold_table(ctx.state, kind)[hold.id]
    resource = _table(ctx.state, kind)[hold.resource_id]
    resource.holds.remove(hold.id)
    charged = returned = 0
    if kind == BUDGET:
        charged = min(spent_minor, hold.amount + max(remaining_minor(resource), 0))
        returned = hold.amount - min(charged, hold.amount)
        resource.reserved_minor -= hold.amount
        resource.settled_minor += charged
    _wake(ctx, kind, resource)
    return charged, returned


def end_hold(ctx: Context, kind: str, hold: Hold) -> None:
    """End a direct hold, nothing spent (permits.py: a grant released, or its run stopped)."""
    _end_hold(ctx, kind, hold, 0)


def _grant(ctx: Context, kind: str, args: dict[str, Any], amount: int, id_field: str) -> dict[str, Any]:
    resource = _require_resource(ctx, kind, args.get("name"))
    run = runs.require_run(ctx, args.get("run_id"))
    lease_ms = args["lease_ms"]
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    if kind == BUDGET:
        amount = require_minor_of_micros(resource, amount, "amount")
        if amount > resource.limit_minor:
            raise Rejected(
                errors.VALIDATION_FAILED,
                f"amount {major(amount, resource.scale)} is more than budget {resource.name!r} holds "
                f"({major(resource.limit_minor, resource.scale)})",
            )
    runs.require_active(ctx, run)
    if not _has_room(ctx.state, kind, resource, amount):
        return {"granted": False, idempotency.UNCHANGED: True}
    hold = _hold(
        ctx, kind, resource, _HOLD_PREFIXES[kind] + ctx.command_id, run.id, args.get("holder"), None, amount, lease_ms
    )
    ctx.state.arm(hold.lease_expires_ms, _HOLD_DUE[kind], hold.id)
    return {"granted": True, id_field: hold.id, "lease_expires_ms": hold.lease_expires_ms}


def _find_direct(ctx: Context, kind: str, hold_id: Any) -> Hold | None:
    """The direct hold `hold_id` of the command's space; None if it is not held (ended, or never
    issued). NOT_FOUND for a hold of another space; CONFLICT for a job's hold, which ends with
    its delivery."""
    hold = _hold_table(ctx.state, kind).get(hold_id) if isinstance(hold_id, str) else None
    if hold is None:
        return None
    if hold.space != ctx.space.id:
        raise Rejected(errors.NOT_FOUND, f"{_HOLD_NAMES[kind]} {hold_id!r} not found")
    if hold.task_id is not None:
        raise Rejected(
            errors.CONFLICT, f"{_HOLD_NAMES[kind]} {hold_id} belongs to a delivery of task {hold.task_id}: it ends with it"
        )
    if hold.token is not None:  # fenced: only its token renews or releases it (permits.py)
        raise Rejected(errors.CONFLICT, f"{_HOLD_NAMES[kind]} {hold_id} is a permit grant: renew or release it with its token")
    return hold


def _require_held(ctx: Context, kind: str, hold_id: Any) -> Hold:
    hold = _find_direct(ctx, kind, hold_id)
    if hold is None:
        raise Rejected(errors.STALE_CLAIM, f"{_HOLD_NAMES[kind]} {hold_id!r} is not held: it ended or lapsed")
    return hold


def _require_live(ctx: Context, kind: str, hold: Hold) -> None:
    if ctx.now_ms >= hold.lease_expires_ms:
        raise Rejected(errors.STALE_CLAIM, f"{_HOLD_NAMES[kind]} {hold.id} lapsed")


def _renew(ctx: Context, kind: str, args: dict[str, Any], id_field: str) -> dict[str, Any]:
    lease_ms = args["lease_ms"]
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    hold = _require_held(ctx, kind, args.get(id_field))
    run = ctx.state.runs.get(hold.run_id)
    if run is None:  # removed by retention: stopped long ago
        raise Rejected(errors.SCOPE_CANCELLED, f"run {hold.run_id} is stopped")
    runs.require_active(ctx, run)
    _require_live(ctx, kind, hold)
    # The due entry of the old expiry finds the lease extended and re-arms itself.
    hold.lease_ms = lease_ms
    hold.lease_expires_ms = max(hold.lease_expires_ms, ctx.now_ms + lease_ms)
    return {"lease_expires_ms": hold.lease_expires_ms}


def _release(ctx: Context, kind: str, hold_id: Any) -> dict[str, Any]:
    """Allowed after the run stopped. False when the hold had lapsed already (its tick not yet
    run: it is returned now) or is not held at all."""
    hold = _find_direct(ctx, kind, hold_id)
    if hold is None:
        return {"released": False}
    live = ctx.now_ms < hold.lease_expires_ms
    _end_hold(ctx, kind, hold, 0)
    return {"released": live}


def acquire(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """A slot of pool `name` under run `run_id`, or granted False when none is free now."""
    return _grant(ctx, POOL, args, 1, "lease_id")


def renew_slot(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return _renew(ctx, POOL, args, "lease_id")


def release_slot(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return _release(ctx, POOL, args.get("lease_id"))


def reserve(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Reserve `amount_micros` of budget `name` under run `run_id`, or granted False when the
    budget does not have it now."""
    amount = _require_int(args.get("amount_micros"), "amount_micros", 1, limits.budget_total_micros_max)
    return _grant(ctx, BUDGET, args, amount, "reservation_id")


def renew_reservation(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return _renew(ctx, BUDGET, args, "reservation_id")


def release_reservation(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    return _release(ctx, BUDGET, args.get("reservation_id"))


def settle(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Charge what was spent of a reservation and return the rest; allowed after the run stopped,
    STALE_CLAIM once the reservation lapsed."""
    spent = require_spent(args.get("spent_micros"))
    if spent is None:
        raise Rejected(errors.VALIDATION_FAILED, "settle needs spent_micros")
    hold = _require_held(ctx, BUDGET, args.get("reservation_id"))
    _require_live(ctx, BUDGET, hold)
    budget = ctx.state.budgets[hold.resource_id]
    charged, returned = _end_hold(ctx, BUDGET, hold, require_minor_of_micros(budget, spent, "spent"))
    return {
        "charged_micros": micros_of_minor(charged, budget.scale), "returned_micros": micros_of_minor(returned, budget.scale)
    }


def hold_expires_ms(state: State, hold: Hold) -> int:
    """When the hold lapses: its own lease, or its delivery's."""
    return hold.lease_expires_ms if hold.task_id is None else state.tasks[hold.task_id].lease_expires_ms


def extend_leases(state: State, now_ms: int) -> None:
    """Every direct hold's lease runs its full length from now (see tasks.extend_leases; a job's
    holds follow its delivery's lease)."""
    for kind in _HOLD_TABLES:
        for hold in _hold_table(state, kind).values():
            if hold.task_id is None:
                hold.lease_expires_ms = max(hold.lease_expires_ms, now_ms + hold.lease_ms)


# -- rate limits ---------------------------------------------------------------------------------


def _in_window(limit: RateLimit, now_ms: int) -> list[list[int]]:
    return [entry for entry in limit.takes if entry[0] > now_ms - limit.interval_ms]


def _available_ms(limit: RateLimit, units: int, now_ms: int) -> int | None:
    """The earliest time from now at which `units` can be taken if nobody else takes; None if
    never (more than the limit's units)."""
    if units > limit.units:
        return None
    window = _in_window(limit, now_ms)
    excess = sum(taken for _, taken in window) + units - limit.units
    if excess <= 0:
        return now_ms
    for at_ms, taken in window:  # oldest first: each take leaves the window interval_ms after it
        excess -= taken
        if excess <= 0:
            return at_ms + limit.interval_ms
    raise AssertionError("units <= limit.units, so the window empties enough")


def _record_take(limit: RateLimit, now_ms: int, units: int) -> None:
    takes = limit.takes
    if takes and takes[-1][0] >= now_ms:
        takes[-1][1] += units  # the same ms (or a coarsened entry ending later: see below)
    else:
        takes.append([now_ms, units])
    _forget(limit, now_ms - limits.limit_interval_ms_max)  # no interval reaches back further
    if len(takes) > limits.limit_takes_max:
        _forget(limit, now_ms - limit.interval_ms)  # what the current window no longer counts
    if len(takes) > limits.limit_takes_max:
        # More takes in the window than the limit remembers (its units are more than that): count
        # them in coarser steps of time, each as if taken at the end of its step. A take is then
        # counted later than it was made, by less than one step: stricter, never looser. Steps are
        # powers of two, so coarsening again never moves a take by more than the largest step.
        step_ms = 2
        while len({-(-at_ms // step_ms) for at_ms, _ in takes}) > limits.limit_takes_max // 2:
            step_ms *= 2
        coarse: dict[int, int] = {}
        for at_ms, taken in takes:
            end_ms = -(-at_ms // step_ms) * step_ms
            coarse[end_ms] = coarse.get(end_ms, 0) + taken
        takes[:] = [[at_ms, taken] for at_ms, taken in coarse.items()]


def _forget(limit: RateLimit, horizon_ms: int) -> None:
    """Forget the takes at or before `horizon_ms`."""
    forgotten = 0
    while forgotten < len(limit.takes) and limit.takes[forgotten][0] <= horizon_ms:
        forgotten += 1
    if forgotten:
        limit.forgotten_ms = max(limit.forgotten_ms, limit.takes[forgotten - 1][0])
    del limit.takes[:forgotten]


def ready_ms(limit: RateLimit, units: int, now_ms: int) -> int | None:
    """When `units` can be taken if nobody else takes: when its window has room for them, and not
    before its cooldown ends (allowances.py); None if never (more than its units: it may have been
    made smaller since they were asked for). Its waiters' line is not counted."""
    available_ms = _available_ms(limit, units, now_ms)
    if available_ms is None or limit.cooldown_until_ms <= now_ms:
        return available_ms
    return max(available_ms, limit.cooldown_until_ms)


def record_take(limit: RateLimit, now_ms: int, units: int) -> None:
    """Count `units` taken now (allowances.py: a consumption, a waiter's grant, an overrun)."""
    _record_take(limit, now_ms, units)


def give_back(limit: RateLimit, taken_ms: int, units: int) -> int:
    """Take back `units` of a take made at `taken_ms` from its window (a consumption settled below
    its estimate, allowances.py); the units given back: 0 when the take may no longer be counted.

    A take's units stay in the first entry at or after it: _record_take adds it to an entry of its
    own ms, or to the last one when that ends later (coarsened); coarsening moves an entry to the
    end of its step, and never past a later entry. Forgetting drops the entries at or before a
    time: a take at or before `forgotten_ms` may be among them, and nothing of it is given back.
    """
    if taken_ms <= limit.forgotten_ms:
        return 0
    for entry in limit.takes:
        if entry[0] >= taken_ms:
            assert entry[1] >= units, (entry, units)
            entry[1] -= units
            return units
    raise AssertionError(f"a take at {taken_ms} after what was forgotten is counted")


def arm_window(ctx: Context, limit: RateLimit, at_ms: int) -> None:
    """Wake the limit at `at_ms` (allowances.py: when its window opens for the head of its line)."""
    _arm_window(ctx, limit, at_ms)


def _arm_window(ctx: Context, limit: RateLimit, at_ms: int) -> None:
    if limit.wake_ms is None or at_ms < limit.wake_ms:
        limit.wake_ms = at_ms
        ctx.state.arm(at_ms, DueKind.LIMIT_WINDOW, limit.id)


def take(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Take `units` of rate limit `name` under run `run_id` now, or answer when they will be free
    (and wake the limit's waiters then)."""
    units = _require_int(args.get("units", 1), "units", 1, limits.limit_units_max)
    limit = _require_resource(ctx, LIMIT, args.get("name"))
    run = runs.require_run(ctx, args.get("run_id"))
    if units > limit.units:
        raise Rejected(errors.VALIDATION_FAILED, f"limit {limit.name!r} allows {limit.units} units per window, not {units}")
    runs.require_active(ctx, run)
    available_ms = ready_ms(limit, units, ctx.now_ms)
    assert available_ms is not None  # units <= limit.units
    if available_ms <= ctx.now_ms and not limit.waiters:
        _record_take(limit, ctx.now_ms, units)
        return {"taken": True, "available_ms": ctx.now_ms}
    if available_ms > ctx.now_ms:
        _arm_window(ctx, limit, available_ms)
    # (Behind allowance waiters it tries again when their line moves: that wakes the limit.)
    return {"taken": False, "available_ms": available_ms, idempotency.UNCHANGED: True}


def on_window_due(ctx: Context, limit_id: str, due_ms: int) -> None:
    limit = ctx.state.rate_limits.get(limit_id)
    if limit is None or limit.wake_ms != due_ms:
        return  # an earlier wake replaced it
    limit.wake_ms = None
    _wake(ctx, LIMIT, limit)


# -- jobs ----------------------------------------------------------------------------------------


def needs_problem(needs: Any) -> str | None:
    """What is wrong with the shape of a job's needs, or None: `None`, or {"slots": [pool names],
    "limit": [name, units] | None, "budget": [name, reserve micros] | None, "budgets": [[name,
    reserve minor units], ...]} (keys may be left out; "budgets" are the protocol's
    requirements.budgets, reserved as budgets.py reservations). The node checks it before
    proposing; the core checks it again with require_needs."""
    if needs is None:
        return None
    if not isinstance(needs, dict) or not set(needs) <= {"slots", "limit", "budget", "budgets"}:
        return 'needs must be an object of "slots", "limit", "budget" and "budgets"'
    entries = needs.get("budgets") or []
    if not isinstance(entries, (list, tuple)) or len(entries) > limits.budget_reservations_per_job_max or not all(
        isinstance(pair, (list, tuple)) and len(pair) == 2 and _is_name(pair[0])
        and type(pair[1]) is int and 1 <= pair[1] <= limits.budget_limit_minor_max
        for pair in entries
    ):
        return (
            f"budgets must be at most {limits.budget_reservations_per_job_max} [name, reserve minor units] "
            f"with the reserve from 1 to {limits.budget_limit_minor_max}"
        )
    slots = needs.get("slots") or []
    if not isinstance(slots, (list, tuple)) or len(slots) > limits.needs_slots_max or not all(map(_is_name, slots)):
        return f"slots must name at most {limits.needs_slots_max} pools"
    for key, what, high in (("limit", "units", limits.limit_units_max),
                            ("budget", "reserve_micros", limits.budget_total_micros_max)):
        pair = needs.get(key)
        if pair is not None and not (
            isinstance(pair, (list, tuple)) and len(pair) == 2 and _is_name(pair[0])
            and type(pair[1]) is int and 1 <= pair[1] <= high
        ):
            return f"{key} must be [name, {what}] with {what} from 1 to {high}"
    return None


def require_needs(ctx: Context, needs: Any) -> dict[str, Any] | None:
    """The needs of a job submitted now, normalized (None when it names nothing). VALIDATION_FAILED for a
    bad shape or a job that could never run (more than the resource has), NOT_FOUND for a
    resource that does not exist."""
    problem = needs_problem(needs)
    if problem is not None:
        raise Rejected(errors.VALIDATION_FAILED, problem)
    if needs is None:
        return None
    slots = list(needs.get("slots") or [])
    limit_pair, budget_pair = needs.get("limit"), needs.get("budget")
    for name, count in Counter(slots).items():
        pool = _require_resource(ctx, POOL, name)
        if count > pool.size:
            raise Rejected(errors.VALIDATION_FAILED, f"a job needs {count} slots of pool {name!r}, which has {pool.size}")
    if limit_pair is not None:
        limit = _require_resource(ctx, LIMIT, limit_pair[0])
        if limit_pair[1] > limit.units:
            raise Rejected(
                errors.VALIDATION_FAILED, f"limit {limit.name!r} allows {limit.units} units per window, not {limit_pair[1]}"
            )
    if budget_pair is not None:
        budget = _require_resource(ctx, BUDGET, budget_pair[0])
        if require_minor_of_micros(budget, budget_pair[1], "reserve") > budget.limit_minor:
            raise Rejected(
                errors.VALIDATION_FAILED,
                f"reserve {from_micros(budget_pair[1])} is more than budget {budget.name!r} holds "
                f"({major(budget.limit_minor, budget.scale)})",
            )
    reserves = [list(pair) for pair in needs.get("budgets") or []]
    for name, amount_minor in _budget_amounts(reserves).items():
        budget = _require_resource(ctx, BUDGET, name)
        if amount_minor > budget.limit_minor:
            raise Rejected(
                errors.VALIDATION_FAILED, f"a job reserves {amount_minor} of budget {name!r}, whose limit is {budget.limit_minor}"
            )
    if not slots and limit_pair is None and budget_pair is None and not reserves:
        return None
    normalized = {
        "slots": slots,
        "limit": None if limit_pair is None else list(limit_pair),
        "budget": None if budget_pair is None else list(budget_pair),
    }
    if reserves:  # absent otherwise: the needs of a snapshot from before them look the same
        normalized["budgets"] = reserves
    return normalized


def _budget_amounts(reserves: list[list[Any]]) -> dict[str, int]:
    """requirements.budgets as name -> the minor units reserved of it (a budget named twice, summed)."""
    amounts: dict[str, int] = {}
    for name, amount_minor in reserves:
        amounts[name] = amounts.get(name, 0) + amount_minor
    return amounts


def needed(needs: dict[str, Any]) -> frozenset[tuple[str, str]]:
    """The resources a job's needs name, as (kind, name)."""
    found = {(POOL, name) for name in needs["slots"]}
    if needs["limit"] is not None:
        found.add((LIMIT, needs["limit"][0]))
    if needs["budget"] is not None:
        found.add((BUDGET, needs["budget"][0]))
    found.update((BUDGET, name) for name, _ in needs.get("budgets") or [])
    return frozenset(found)


def count_waiting(state: State, task: Task, delta: int) -> None:
    """`task`, which has needs, enters (+1) or leaves (-1) the QUEUED state."""
    assert task.needs is not None
    for kind, name in needed(task.needs):
        find(state, kind, task.space, name).waiting += delta


def shortfalls(state: State, space: str, now_ms: int, needs: dict[str, Any]) -> list[tuple[str, Any, int | None]]:
    """The resources that cannot give the job what it needs now, as (kind, resource, when a rate
    limit's window opens for it, else None). Read only: take_needs acts on it, ops.py shows it."""
    short: list[tuple[str, Any, int | None]] = []
    for name, count in Counter(needs["slots"]).items():
        pool = find(state, POOL, space, name)
        if has_waiting(state, pool) or not _has_room(state, POOL, pool, count):
            short.append((POOL, pool, None))
    if needs["limit"] is not None:
        name, units = needs["limit"]
        limit = find(state, LIMIT, space, name)
        available_ms = ready_ms(limit, units, now_ms)
        if available_ms != now_ms:
            short.append((LIMIT, limit, available_ms))
        elif limit.waiters:  # a job does not jump the allowance waiters' line: it moves on, and wakes it
            short.append((LIMIT, limit, None))
    amounts = _budget_amounts(needs.get("budgets") or [])
    counts = Counter(name for name, _ in needs.get("budgets") or [])
    if needs["budget"] is not None:
        name, micros = needs["budget"]
        budget = find(state, BUDGET, space, name)
        amounts[name] = amounts.get(name, 0) + require_minor_of_micros(budget, micros, "reserve")
        counts[name] += 1
    for name, amount_minor in amounts.items():
        budget = find(state, BUDGET, space, name)
        if not budget_has_room(budget, amount_minor, counts[name]):
            short.append((BUDGET, budget, None))
    return short


def take_needs(ctx: Context, task: Task, delivery_id: str, holder: Any) -> bool:
    """Take everything the job needs for the delivery `delivery_id` (a job's task is QUEUED and
    holds nothing), or nothing: then remember its queue on each resource that falls short, so
    that resource wakes it, and return False."""
    needs = task.needs
    assert needs is not None and not task.slot_leases and task.reservation_id is None
    short = shortfalls(ctx.state, ctx.space.id, ctx.now_ms, needs)
    if short:
        for _kind, resource, available_ms in short:
            blocked = [task.run_id, task.mailbox]
            if blocked not in resource.blocked and len(resource.blocked) < limits.blocked_queues_max:
                resource.blocked.append(blocked)
            if available_ms is not None:
                _arm_window(ctx, resource, available_ms)
        return False
    space = ctx.space.id
    # Named "<task id>.<delivery number>", never by the delivery's id: that is its token, and
    # readers of a pool, permit or budget see its holds' ids.
    delivery = ".".join(delivery_id.split(".", 2)[:2])
    task.slot_leases = [
        _hold(ctx, POOL, find(ctx.state, POOL, space, name), f"slt_{delivery}.{index}", task.run_id, holder,
              task.id, 1, 0).id
        for index, name in enumerate(needs["slots"])
    ] or EMPTY
    if needs["limit"] is not None:
        name, units = needs["limit"]
        _record_take(find(ctx.state, LIMIT, space, name), ctx.now_ms, units)
    if needs["budget"] is not None:
        name, micros = needs["budget"]
        budget = find(ctx.state, BUDGET, space, name)
        amount = require_minor_of_micros(budget, micros, "reserve")
        task.reservation_id = _hold(ctx, BUDGET, budget, f"rsv_{delivery}", task.run_id, holder, task.id, amount, 0).id
    return True


def end_holds(ctx: Context, task: Task, spent_micros: int | None, *, completed: bool = False) -> None:
    """The delivery of `task` ends (`completed`: by its complete): its slots return, and its
    reservation is settled with `spent_micros` (None: all of it counts as spent; 0: it returns
    whole; VALIDATION_FAILED, before anything changes, when it is no whole number of the budget's
    minor units). Then DELIVERY_END_HOOKS (budgets.py: its requirements.budgets reservations)."""
    if task.extra is not None:  # else its slot_leases and reservation_id are at their defaults: none held
        spent_minor = None
        if task.reservation_id is not None and spent_micros is not None:
            reservation = ctx.state.reservations[task.reservation_id]
            spent_minor = require_minor_of_micros(ctx.state.budgets[reservation.resource_id], spent_micros, "spent")
        for lease_id in task.slot_leases:
            _end_hold(ctx, POOL, ctx.state.slot_leases[lease_id], 0)
        if task.reservation_id is not None:
            reservation = ctx.state.reservations[task.reservation_id]
            _end_hold(ctx, BUDGET, reservation, reservation.amount if spent_minor is None else spent_minor)
        task.slot_leases = EMPTY
        task.reservation_id = None
    for hook in DELIVERY_END_HOOKS:
        hook(ctx, task, completed)


# What else ends with a job's delivery, after its holds: budgets.py voids the reservations of
# its requirements.budgets unless the delivery completed (then the worker settles them).
DELIVERY_END_HOOKS: list[Callable[[Context, Task, bool], None]] = []


def _on_task_stopping(ctx: Context, task: Task, task_state: str) -> None:
    """Its run's stop ends `task`: a running job's holds return whole, a queued one waits no more."""
    if task.needs is None:
        return
    if task.state == TaskState.RUNNING:
        end_holds(ctx, task, 0)
    elif task.state == TaskState.QUEUED:
        count_waiting(ctx.state, task, -1)


# What runs when units of a pool return or its size changes, before its waiters wake: permits.py
# signals the head of its waiters' line.
POOL_RETURN_HOOKS: list[Callable[[Context, Pool], None]] = []
# The same for a rate limit (its window opened, units were given back, its config changed):
# allowances.py grants the head of its waiters' line.
LIMIT_RETURN_HOOKS: list[Callable[[Context, RateLimit], None]] = []


def wake(ctx: Context, kind: str, resource: Any) -> None:
    """Wake what waits for the resource (permits.py: a signaled waiter's units returned)."""
    _wake(ctx, kind, resource)


def _wake(ctx: Context, kind: str, resource: Any) -> None:
    if kind == POOL:
        for hook in POOL_RETURN_HOOKS:
            hook(ctx, resource)
    elif kind == LIMIT:
        for limit_hook in LIMIT_RETURN_HOOKS:
            limit_hook(ctx, resource)
    ctx.wake(resource_key(resource.space, kind, resource.name))
    for run_id, mailbox in resource.blocked:
        ctx.wake(queue_key(run_id, mailbox))
    resource.blocked = []


# -- views (for the node, under its read lock) ---------------------------------------------------


def pool_view(state: State, space_id: str, name: str) -> dict[str, Any] | None:
    pool = find(state, POOL, space_id, name)
    if pool is None:
        return None
    return {
        "name": pool.name,
        "size": pool.size,
        "inUse": units_in_use(state, pool),
        "waiting": pool.waiting,
        "holders": [
            {
                "leaseId": hold.id,
                "holder": hold.holder,
                "scopeId": hold.run_id,
                "taskId": hold.task_id,
                "leaseExpiresAt": hold_expires_ms(state, hold),
            }
            for hold in (state.slot_leases[hold_id] for hold_id in pool.holds)
        ],
    }


def limit_view(state: State, space_id: str, name: str, now_ms: int) -> dict[str, Any] | None:
    limit = find(state, LIMIT, space_id, name)
    if limit is None:
        return None
    taken = sum(units for _, units in _in_window(limit, now_ms))
    return {
        "name": limit.name,
        "units": limit.units,
        "intervalMs": limit.interval_ms,
        "available": max(limit.units - taken, 0),
        "takenInWindow": taken,
        "waiting": limit.waiting,
    }


def budget_view(state: State, space_id: str, name: str) -> dict[str, Any] | None:
    budget = find(state, BUDGET, space_id, name)
    if budget is None:
        return None
    return {
        "name": budget.name,
        "total": major(budget.limit_minor, budget.scale),
        "spent": major(budget.settled_minor, budget.scale),
        "reserved": major(budget.reserved_minor, budget.scale),
        "remaining": major(max(remaining_minor(budget), 0), budget.scale),
        "waiting": budget.waiting,
        "reservations": [
            {
                "reservationId": hold.id,
                "amount": major(hold.amount, budget.scale),
                "holder": hold.holder,
                "scopeId": hold.run_id,
                "taskId": hold.task_id,
                "leaseExpiresAt": hold_expires_ms(state, hold),
            }
            for hold in (state.reservations[hold_id] for hold_id in budget.holds)
        ],
    }


def needs_view(needs: dict[str, Any] | None) -> dict[str, Any] | None:
    """What each delivery of a task takes, in the shape of the protocol's `requirements`:
    `{"pools": [{"name", "units"}], "quotas": [{"name", "units"}], "budgets": [{"name",
    "reserveMinor"}]}` (a kind it names nothing of is an empty list), or None."""
    if needs is None:
        return None
    pools = Counter(needs["slots"])  # one entry a unit, in the order first named
    limit = needs["limit"]
    return {
        "pools": [{"name": name, "units": units} for name, units in pools.items()],
        "quotas": [] if limit is None else [{"name": limit[0], "units": limit[1]}],
        "budgets": [{"name": name, "reserveMinor": str(amount)} for name, amount in needs.get("budgets") or []],
    }


def holds_view(task: Task) -> dict[str, Any]:
    """What the task's current delivery holds."""
    return {"slots": list(task.slot_leases), "reservationId": task.reservation_id}


runs.TASK_STOP_HOOKS.append(_on_task_stopping)

# The commands of the routes before the published protocol (pool, limit and budget by name, direct
# slot leases, takes and micro-unit reservations) are no longer proposed by any route: they stay
# so that a journal or snapshot an older node wrote replays to the same state.
HANDLERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "pool.ensure": ensure_pool,
    "pool.acquire": acquire,
    "pool.renew": renew_slot,
    "pool.release": release_slot,
    "limit.ensure": ensure_limit,
    "limit.take": take,
    "budget.ensure": ensure_budget,
    "budget.reserve": reserve,
    "budget.renew": renew_reservation,
    "budget.release": release_reservation,
    "budget.settle": settle,
    "resource.resize": resize,
}


def _on_hold_due(kind: str) -> Callable[[Context, str, int], None]:
    def on_due(ctx: Context, hold_id: str, due_ms: int) -> None:
        hold = _hold_table(ctx.state, kind).get(hold_id)
        if hold is None:
            return  # ended already
        assert hold.task_id is None  # a job's hold arms nothing: it ends with its delivery
        if hold.lease_expires_ms > due_ms:
            ctx.state.arm(hold.lease_expires_ms, _HOLD_DUE[kind], hold_id)  # renewed: look again then
            return
        if hold.token is not None:  # a permit grant (permits.py; the pool routes' leases are not logged)
            pool = ctx.state.pools[hold.resource_id]
            events.emit(ctx, "permit.lease_lost", hold.run_id, "permit", pool.public_id, {
                "permitId": pool.public_id, "grantId": hold.id, "units": hold.amount, "holder": hold.holder,
            })
        _end_hold(ctx, kind, hold, 0)

    return on_due


DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {
    DueKind.SLOT_LEASE: _on_hold_due(POOL),
    DueKind.RESERVATION: _on_hold_due(BUDGET),
    DueKind.LIMIT_WINDOW: on_window_due,
}
# The table each due kind's entity lives in (dispatch finds the space of a due entry with it).
DUE_TABLES = {
    DueKind.SLOT_LEASE: "slot_leases", DueKind.RESERVATION: "reservations", DueKind.LIMIT_WINDOW: "rate_limits",
    DueKind.PERMIT_WAITER: "permit_waiters",  # permits.py
    DueKind.BUDGET_SETTLE_BY: "budget_reservations",  # budgets.py
    DueKind.ALLOWANCE_WAITER: "allowance_waiters",  # allowances.py
}
