"""Rules of pools, rate limits and spend budgets (runstate_server.actors.resources), held directly under a
run or by the deliveries of jobs that need them (runstate_server.actors.tasks)."""

from __future__ import annotations

from typing import Any

import pytest

from runstate_server.actors import errors, limits, resources
from runstate_server.actors.state import (
    _TASK_FIELDS,
    TaskState,
    from_snapshot,
    number_in_creation_order,
    to_snapshot,
)
from tests.test_actors_harness import MAILBOX, RETENTION_MS, Harness, pack, round_trip, snapshot_bytes, unpack

LEASE_MS = 10_000
SECOND = 1_000


def pool(h: Harness, name: str = "browser", size: int = 2) -> dict[str, Any]:
    return h.ok("pool.ensure", name=name, size=size)


def limit(h: Harness, name: str = "api", units: int = 3, interval_ms: int = SECOND) -> dict[str, Any]:
    return h.ok("limit.ensure", name=name, units=units, interval_ms=interval_ms)


def budget(h: Harness, name: str = "usd", total: float = 10.0) -> dict[str, Any]:
    return h.ok("budget.ensure", name=name, total_micros=resources.to_micros(total))


def acquire(h: Harness, run_id: str, name: str = "browser", lease_ms: int = LEASE_MS, holder: str = "w") -> Any:
    return h.apply("pool.acquire", name=name, run_id=run_id, lease_ms=lease_ms, holder=holder)


def reserve(h: Harness, run_id: str, amount: float, name: str = "usd", lease_ms: int = LEASE_MS) -> Any:
    return h.apply(
        "budget.reserve", name=name, run_id=run_id, amount_micros=resources.to_micros(amount), lease_ms=lease_ms,
        holder="w",
    )


def take(h: Harness, run_id: str, units: int = 1, name: str = "api") -> Any:
    return h.apply("limit.take", name=name, run_id=run_id, units=units)


def job(h: Harness, run_id: str, key: str, mailbox: str = MAILBOX, **needs: Any) -> str:
    return h.ok("task.submit", **{**h.submit_args(run_id, key), "mailbox": mailbox, "needs": needs})["task_id"]


def resource_key(kind: str, name: str, space: str = "space-1") -> tuple[str, ...]:
    return ("resource", space, kind, name)


def pool_in_use(h: Harness, name: str = "browser") -> int:
    view = resources.pool_view(h.state, h.space, name)
    assert view is not None
    return int(view["inUse"])


def budget_view(h: Harness, name: str = "usd") -> dict[str, Any]:
    view = resources.budget_view(h.state, h.space, name)
    assert view is not None
    return view


# -- config --------------------------------------------------------------------------------------


def test_pool_ensure_creates_then_resizes(h: Harness) -> None:
    assert pool(h, size=2) == {"name": "browser", "size": 2, "created": True}
    assert h.state.pools["space-1/browser"].size == 2
    assert pool(h, size=2) == {"name": "browser", "size": 2, "created": False}
    assert h.effects == []  # nothing changed: nobody to wake
    assert pool(h, size=5) == {"name": "browser", "size": 5, "created": False}
    assert resource_key("pool", "browser") in h.woken()
    assert h.state.spaces[h.space].resource_counts == {"pool": 1}


def test_limit_and_budget_ensure(h: Harness) -> None:
    assert limit(h) == {"name": "api", "units": 3, "interval_ms": SECOND, "created": True}
    assert limit(h, units=5) == {"name": "api", "units": 5, "interval_ms": SECOND, "created": False}
    assert resource_key("limit", "api") in h.woken()
    assert budget(h, total=2.5) == {"name": "usd", "total_micros": 2_500_000, "created": True}
    assert budget(h, total=3) == {"name": "usd", "total_micros": 3_000_000, "created": False}
    assert resource_key("budget", "usd") in h.woken()
    assert h.state.spaces[h.space].resource_counts == {"limit": 1, "budget": 1}


@pytest.mark.parametrize(
    ("kind", "args"),
    [
        ("pool.ensure", {"name": "p", "size": 0}),
        ("pool.ensure", {"name": "p", "size": limits.pool_size_max + 1}),
        ("pool.ensure", {"name": "p", "size": "2"}),
        ("pool.ensure", {"name": "", "size": 1}),
        ("pool.ensure", {"name": "x" * (limits.name_chars_max + 1), "size": 1}),
        ("limit.ensure", {"name": "l", "units": 0, "interval_ms": 1_000}),
        ("limit.ensure", {"name": "l", "units": 1, "interval_ms": 0}),
        ("limit.ensure", {"name": "l", "units": 1, "interval_ms": limits.limit_interval_ms_max + 1}),
        ("budget.ensure", {"name": "b", "total_micros": -1}),
        ("budget.ensure", {"name": "b", "total_micros": 1.5}),
        ("budget.ensure", {"name": "b", "total_micros": limits.budget_total_micros_max + 1}),
    ],
)
def test_ensure_validates(h: Harness, kind: str, args: dict[str, Any]) -> None:
    assert h.err(kind, **args) == errors.VALIDATION_FAILED


def test_resources_per_space_are_bounded_per_kind(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "resources_per_space_max", 2)
    pool(h, "a")
    pool(h, "b")
    assert h.err("pool.ensure", name="c", size=1) == errors.LIMIT_EXCEEDED
    pool(h, "a", size=3)  # an existing one may still change
    limit(h, "a")
    pool(h, "a", size=1)
    h.ok("pool.ensure", space="space-2", name="c", size=1)  # another space counts its own


def test_a_resource_is_the_first_thing_of_a_new_space(h: Harness) -> None:
    h.ok("budget.ensure", space="fresh", name="usd", total_micros=1)
    assert h.state.spaces["fresh"].resource_counts == {"budget": 1}
    assert h.err("pool.acquire", space="other", name="p", run_id="run_x", lease_ms=LEASE_MS) == errors.NOT_FOUND
    assert "other" not in h.state.spaces


# -- pools ---------------------------------------------------------------------------------------


def test_acquire_grants_up_to_size_then_not_granted(h: Harness, run_id: str) -> None:
    pool(h, size=2)
    first = acquire(h, run_id)
    assert first["granted"] is True and first["lease_id"].startswith("slt_")
    assert first["lease_expires_ms"] == h.now_ms + LEASE_MS
    second = acquire(h, run_id)
    assert second["granted"] and second["lease_id"] != first["lease_id"]
    before = snapshot_bytes(h.state, without_clock=True)
    assert acquire(h, run_id) == {"granted": False, "unchanged": True}
    assert snapshot_bytes(h.state, without_clock=True) == before and h.effects == []
    view = resources.pool_view(h.state, h.space, "browser")
    assert view is not None
    assert (view["size"], view["inUse"], view["waiting"]) == (2, 2, 0)
    assert view["holders"][0] == {
        "leaseId": first["lease_id"], "holder": "w", "scopeId": run_id, "taskId": None,
        "leaseExpiresAt": first["lease_expires_ms"],
    }


def test_lease_ids_come_from_the_command_id(h: Harness, run_id: str) -> None:
    pool(h)
    granted = acquire(h, run_id)
    assert granted["lease_id"] == "slt_" + f"{h.commands:08x}{h.commands * 2654435761 % 2**32:08x}"


def test_release_returns_the_slot_once_and_wakes_waiters(h: Harness, run_id: str) -> None:
    pool(h, size=1)
    lease_id = acquire(h, run_id)["lease_id"]
    assert h.ok("pool.release", lease_id=lease_id) == {"released": True}
    assert h.woken() == [resource_key("pool", "browser")]
    assert pool_in_use(h) == 0 and lease_id not in h.state.slot_leases
    assert h.ok("pool.release", lease_id=lease_id) == {"released": False}
    assert h.effects == []
    assert h.ok("pool.release", lease_id="slt_never") == {"released": False}
    assert acquire(h, run_id)["granted"]


def test_renew_extends_and_refuses_once_lapsed_or_released(h: Harness, run_id: str) -> None:
    pool(h)
    lease_id = acquire(h, run_id)["lease_id"]
    h.advance(5_000)
    assert h.ok("pool.renew", lease_id=lease_id, lease_ms=20_000) == {"lease_expires_ms": h.now_ms + 20_000}
    h.advance(20_000)  # lapsed, its tick not yet run
    assert h.err("pool.renew", lease_id=lease_id, lease_ms=LEASE_MS) == errors.STALE_CLAIM
    assert h.ok("pool.release", lease_id=lease_id) == {"released": False}  # it returns now
    assert pool_in_use(h) == 0 and h.woken() == [resource_key("pool", "browser")]
    assert h.err("pool.renew", lease_id=lease_id, lease_ms=LEASE_MS) == errors.STALE_CLAIM


def test_a_lapsed_lease_returns_its_slot_at_the_tick(h: Harness, run_id: str) -> None:
    pool(h, size=1)
    lease_id = acquire(h, run_id)["lease_id"]
    h.advance(5_000)
    h.ok("pool.renew", lease_id=lease_id, lease_ms=LEASE_MS)  # now expires at +15 s
    h.advance(5_000)
    h.tick()  # the entry of the first expiry finds it renewed
    assert pool_in_use(h) == 1
    h.advance(5_000)
    h.tick()
    assert pool_in_use(h) == 0
    assert resource_key("pool", "browser") in h.woken()
    assert h.ok("pool.release", lease_id=lease_id) == {"released": False}


def test_acquire_needs_a_pool_and_an_active_run(h: Harness, run_id: str) -> None:
    pool(h)
    assert h.err("pool.acquire", name="nope", run_id=run_id, lease_ms=LEASE_MS) == errors.NOT_FOUND
    assert h.err("pool.acquire", name="browser", run_id="run_nope", lease_ms=LEASE_MS) == errors.NOT_FOUND
    h.cancel(run_id)
    assert h.err("pool.acquire", name="browser", run_id=run_id, lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED
    late = h.create_run(deadline_ms=h.now_ms + 1_000)
    h.advance(1_000)
    assert h.err("pool.acquire", name="browser", run_id=late, lease_ms=LEASE_MS) == errors.DEADLINE_EXCEEDED


def test_a_stopped_runs_lease_stays_until_released_but_is_not_renewed(h: Harness, run_id: str) -> None:
    pool(h, size=1)
    lease_id = acquire(h, run_id)["lease_id"]
    h.cancel(run_id)
    assert pool_in_use(h) == 1
    assert h.err("pool.renew", lease_id=lease_id, lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED
    assert h.ok("pool.release", lease_id=lease_id) == {"released": True}


def test_a_lease_outliving_its_removed_run_still_lapses(h: Harness, run_id: str) -> None:
    pool(h, size=1)
    lease_id = acquire(h, run_id, lease_ms=limits.lease_ms_max)["lease_id"]
    h.cancel(run_id, retention_ms=1_000)
    h.advance(1_000)
    h.tick()
    assert run_id not in h.state.runs and pool_in_use(h) == 1
    assert h.err("pool.renew", lease_id=lease_id, lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED
    h.advance(limits.lease_ms_max)
    h.tick()
    assert pool_in_use(h) == 0


def test_a_size_below_the_slots_in_use_grants_nothing_until_enough_return(h: Harness, run_id: str) -> None:
    pool(h, size=3)
    leases = [acquire(h, run_id)["lease_id"] for _ in range(3)]
    pool(h, size=1)
    h.ok("pool.release", lease_id=leases[0])
    assert acquire(h, run_id) == {"granted": False, "unchanged": True}
    h.ok("pool.release", lease_id=leases[1])
    assert acquire(h, run_id) == {"granted": False, "unchanged": True}
    h.ok("pool.release", lease_id=leases[2])
    assert acquire(h, run_id)["granted"]


def test_a_new_leader_extends_direct_leases(h: Harness, run_id: str) -> None:
    pool(h)
    budget(h)
    lease_id = acquire(h, run_id)["lease_id"]
    reservation_id = reserve(h, run_id, 1)["reservation_id"]
    h.advance(8_000)
    h.epoch = 2
    h.ok("leader.start")
    assert h.state.slot_leases[lease_id].lease_expires_ms == h.now_ms + LEASE_MS
    assert h.state.reservations[reservation_id].lease_expires_ms == h.now_ms + LEASE_MS
    h.advance(5_000)
    h.tick()
    assert pool_in_use(h) == 1 and budget_view(h)["reserved"] == 1.0


def test_a_jobs_hold_is_ended_by_its_delivery_only(h: Harness, run_id: str) -> None:
    pool(h)
    budget(h)
    job(h, run_id, "a", slots=["browser"], budget=["usd", 1_000])
    (delivery,) = h.receive(run_id)
    task = h.task_of(delivery)
    (lease_id,) = task.slot_leases
    assert h.err("pool.release", lease_id=lease_id) == errors.CONFLICT
    assert h.err("pool.renew", lease_id=lease_id, lease_ms=LEASE_MS) == errors.CONFLICT
    assert h.err("budget.settle", reservation_id=task.reservation_id, spent_micros=1) == errors.CONFLICT
    assert h.err("budget.release", reservation_id=task.reservation_id) == errors.CONFLICT


# -- rate limits ---------------------------------------------------------------------------------


def test_take_is_a_sliding_window_over_command_time(h: Harness, run_id: str) -> None:
    limit(h, units=3, interval_ms=SECOND)
    start = h.now_ms
    assert take(h, run_id, 2) == {"taken": True, "available_ms": start}
    h.advance(400)
    assert take(h, run_id, 1) == {"taken": True, "available_ms": start + 400}
    assert take(h, run_id, 1) == {"taken": False, "available_ms": start + SECOND, "unchanged": True}
    h.advance(599)  # start + 999: the first take is still in (t - 1000, t]
    assert take(h, run_id, 1)["taken"] is False
    h.advance(1)
    assert take(h, run_id, 2) == {"taken": True, "available_ms": start + SECOND}
    assert take(h, run_id, 1) == {"taken": False, "available_ms": start + 400 + SECOND, "unchanged": True}
    assert take(h, run_id, 3) == {"taken": False, "available_ms": start + 2 * SECOND, "unchanged": True}


def test_a_take_waits_for_a_window_wake(h: Harness, run_id: str) -> None:
    limit(h, units=1, interval_ms=SECOND)
    start = h.now_ms
    take(h, run_id)
    assert take(h, run_id) == {"taken": False, "available_ms": start + SECOND, "unchanged": True}
    assert h.armed() == [start + SECOND] and h.state.rate_limits["space-1/api"].wake_ms == start + SECOND
    take(h, run_id)
    assert h.armed() == []  # armed already
    h.advance(SECOND)
    h.tick()
    assert h.woken() == [resource_key("limit", "api")]
    assert h.state.rate_limits["space-1/api"].wake_ms is None
    assert take(h, run_id)["taken"]


def test_take_validates_and_needs_an_active_run(h: Harness, run_id: str) -> None:
    limit(h, units=3)
    assert h.err("limit.take", name="api", run_id=run_id, units=4) == errors.VALIDATION_FAILED
    assert h.err("limit.take", name="api", run_id=run_id, units=0) == errors.VALIDATION_FAILED
    assert h.err("limit.take", name="nope", run_id=run_id, units=1) == errors.NOT_FOUND
    assert h.err("limit.take", name="api", run_id="run_nope", units=1) == errors.NOT_FOUND
    assert h.ok("limit.take", name="api", run_id=run_id)["taken"]  # one unit by default
    h.complete_run(run_id)
    assert h.err("limit.take", name="api", run_id=run_id, units=1) == errors.SCOPE_CANCELLED


def test_a_longer_interval_counts_the_takes_it_covers(h: Harness, run_id: str) -> None:
    limit(h, units=2, interval_ms=SECOND)
    start = h.now_ms
    take(h, run_id, 2)
    h.advance(SECOND)
    limit(h, units=2, interval_ms=10 * SECOND)
    assert take(h, run_id, 1) == {"taken": False, "available_ms": start + 10 * SECOND, "unchanged": True}
    limit(h, units=2, interval_ms=SECOND)
    assert take(h, run_id, 2)["taken"]


def test_a_limit_remembers_a_bounded_number_of_takes(
    h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "limit_takes_max", 4)
    limit(h, units=1_000, interval_ms=SECOND)
    start = h.now_ms
    for _ in range(3):
        take(h, run_id, 1)
        take(h, run_id, 1)  # the same ms: one entry
        h.advance(600)
    api = h.state.rate_limits["space-1/api"]
    assert api.takes == [[start, 2], [start + 600, 2], [start + 1_200, 2]]
    h.advance(200)
    take(h, run_id, 1)  # start + 2000
    h.advance(1)
    take(h, run_id, 1)  # five entries: the limit forgets the two its window no longer counts
    assert api.takes == [[start + 1_200, 2], [start + 2_000, 1], [start + 2_001, 1]]
    for units in range(1, 5):  # more entries in the window than it remembers: coarser steps
        h.advance(1)
        take(h, run_id, units)
    assert len(api.takes) <= 4
    assert sum(units for _, units in api.takes) == 4 + 1 + 2 + 3 + 4
    assert all(api.takes[i][0] < api.takes[i + 1][0] for i in range(len(api.takes) - 1))
    assert api.takes[0][0] >= start + 1_200 and api.takes[-1][0] >= h.now_ms  # later, never earlier
    view = resources.limit_view(h.state, h.space, "api", h.now_ms)
    assert view is not None and (view["takenInWindow"], view["available"]) == (14, 986)
    h.advance(1)
    take(h, run_id, 1)  # before the end of the last coarse step: it joins it
    assert sum(units for _, units in api.takes) == 15 and len(api.takes) <= 4


def test_a_longer_interval_counts_the_takes_of_its_window(h: Harness, run_id: str) -> None:
    limit(h, units=3, interval_ms=SECOND)
    start = h.now_ms
    take(h, run_id, 2)
    h.advance(3 * SECOND)
    take(h, run_id, 1)  # the first take is out of a second's window, but remembered
    limit(h, units=3, interval_ms=10 * SECOND)
    assert take(h, run_id, 1) == {"taken": False, "available_ms": start + 10 * SECOND, "unchanged": True}


# -- budgets -------------------------------------------------------------------------------------


def test_reserve_takes_from_what_remains(h: Harness, run_id: str) -> None:
    budget(h, total=1.0)
    first = reserve(h, run_id, 0.6)
    assert first["granted"] and first["reservation_id"].startswith("rsv_")
    assert first["lease_expires_ms"] == h.now_ms + LEASE_MS
    assert reserve(h, run_id, 0.5) == {"granted": False, "unchanged": True}
    assert reserve(h, run_id, 0.4)["granted"]
    view = budget_view(h)
    assert (view["total"], view["spent"], view["reserved"], view["remaining"]) == (1.0, 0.0, 1.0, 0.0)
    assert [r["amount"] for r in view["reservations"]] == [0.6, 0.4]
    assert view["reservations"][0] == {
        "reservationId": first["reservation_id"], "amount": 0.6, "holder": "w", "scopeId": run_id, "taskId": None,
        "leaseExpiresAt": first["lease_expires_ms"],
    }


def test_reserve_validates(h: Harness, run_id: str) -> None:
    budget(h, total=1.0)
    for amount in (0, -5, 1.5, None):
        assert h.err("budget.reserve", name="usd", run_id=run_id, amount_micros=amount, lease_ms=LEASE_MS) == (
            errors.VALIDATION_FAILED
        )
    assert reserve(h, run_id, 1.01)["error"]["code"] == errors.VALIDATION_FAILED  # more than the total
    assert reserve(h, run_id, 0.5, name="nope")["error"]["code"] == errors.NOT_FOUND
    h.cancel(run_id)
    assert reserve(h, run_id, 0.5)["error"]["code"] == errors.SCOPE_CANCELLED


def test_settle_charges_the_spend_and_returns_the_rest(h: Harness, run_id: str) -> None:
    budget(h, total=1.0)
    reservation_id = reserve(h, run_id, 0.4)["reservation_id"]
    result = h.ok("budget.settle", reservation_id=reservation_id, spent_micros=resources.to_micros(0.12))
    assert result == {"charged_micros": 120_000, "returned_micros": 280_000}
    assert resource_key("budget", "usd") in h.woken()
    view = budget_view(h)
    assert (view["spent"], view["reserved"], view["remaining"]) == (0.12, 0.0, 0.88)
    assert h.err("budget.settle", reservation_id=reservation_id, spent_micros=0) == errors.STALE_CLAIM


def test_settle_beyond_the_reservation_charges_only_what_the_budget_still_has(h: Harness, run_id: str) -> None:
    budget(h, total=1.0)
    first = reserve(h, run_id, 0.5)["reservation_id"]
    second = reserve(h, run_id, 0.3)["reservation_id"]
    # remaining 0.2: the first may charge up to 0.5 + 0.2
    assert h.ok("budget.settle", reservation_id=first, spent_micros=900_000) == {
        "charged_micros": 700_000, "returned_micros": 0,
    }
    assert h.ok("budget.settle", reservation_id=second, spent_micros=400_000) == {
        "charged_micros": 300_000, "returned_micros": 0,
    }
    assert budget_view(h)["spent"] == 1.0


def test_a_lowered_total_grants_nothing_new_but_keeps_reservations(h: Harness, run_id: str) -> None:
    budget(h, total=1.0)
    reservation_id = reserve(h, run_id, 0.8)["reservation_id"]
    budget(h, total=0.5)
    assert reserve(h, run_id, 0.1) == {"granted": False, "unchanged": True}
    assert budget_view(h)["remaining"] == 0.0
    # The reservation still charges what was spent of it, however the total moved.
    assert h.ok("budget.settle", reservation_id=reservation_id, spent_micros=600_000) == {
        "charged_micros": 600_000, "returned_micros": 200_000,
    }
    assert reserve(h, run_id, 0.1) == {"granted": False, "unchanged": True}  # spent 0.6 of 0.5


def test_released_and_lapsed_reservations_return_whole(h: Harness, run_id: str) -> None:
    budget(h, total=1.0)
    released = reserve(h, run_id, 0.5)["reservation_id"]
    lapsing = reserve(h, run_id, 0.5)["reservation_id"]
    assert h.ok("budget.release", reservation_id=released) == {"released": True}
    assert h.ok("budget.release", reservation_id=released) == {"released": False}
    h.advance(5_000)
    h.ok("budget.renew", reservation_id=lapsing, lease_ms=LEASE_MS)
    h.advance(LEASE_MS)
    assert h.err("budget.settle", reservation_id=lapsing, spent_micros=1) == errors.STALE_CLAIM
    assert h.err("budget.renew", reservation_id=lapsing, lease_ms=LEASE_MS) == errors.STALE_CLAIM
    h.tick()
    view = budget_view(h)
    assert (view["spent"], view["reserved"], view["reservations"]) == (0.0, 0.0, [])
    assert resource_key("budget", "usd") in h.woken()


def test_a_stopped_runs_reservation_may_still_be_settled(h: Harness, run_id: str) -> None:
    budget(h, total=1.0)
    reservation_id = reserve(h, run_id, 0.5)["reservation_id"]
    h.cancel(run_id)
    assert h.err("budget.renew", reservation_id=reservation_id, lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED
    assert h.ok("budget.settle", reservation_id=reservation_id, spent_micros=100_000)["charged_micros"] == 100_000


def test_settle_validates_the_spend(h: Harness, run_id: str) -> None:
    budget(h)
    reservation_id = reserve(h, run_id, 1)["reservation_id"]
    for spent in (None, -1, 0.5, limits.budget_total_micros_max + 1):
        assert h.err("budget.settle", reservation_id=reservation_id, spent_micros=spent) == errors.VALIDATION_FAILED


def test_reservations_per_budget_are_bounded(h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "reservations_per_budget_max", 2)
    budget(h)
    reserve(h, run_id, 1)
    reserve(h, run_id, 1)
    assert reserve(h, run_id, 1) == {"granted": False, "unchanged": True}


def test_micros_make_decimal_sums_exact() -> None:
    assert sum(resources.to_micros(0.40) for _ in range(25)) == resources.to_micros(10.00) == 10_000_000
    assert resources.from_micros(400_000) == 0.4


# -- jobs: needs ---------------------------------------------------------------------------------


@pytest.fixture
def resourced(h: Harness) -> Harness:
    pool(h, "browser", 2)
    pool(h, "gpu", 1)
    limit(h, "api", 3, SECOND)
    budget(h, "usd", 1.0)
    return h


@pytest.mark.parametrize(
    ("needs", "code"),
    [
        ({"slots": ["nope"]}, errors.NOT_FOUND),
        ({"limit": ["nope", 1]}, errors.NOT_FOUND),
        ({"budget": ["nope", 1]}, errors.NOT_FOUND),
        ({"slots": ["gpu", "gpu"]}, errors.VALIDATION_FAILED),  # the pool has one slot: it could never run
        ({"limit": ["api", 4]}, errors.VALIDATION_FAILED),
        ({"budget": ["usd", 1_000_001]}, errors.VALIDATION_FAILED),
        ({"slots": "browser"}, errors.VALIDATION_FAILED),
        ({"slots": ["browser"] * (limits.needs_slots_max + 1)}, errors.VALIDATION_FAILED),
        ({"limit": ["api"]}, errors.VALIDATION_FAILED),
        ({"limit": ["api", 0]}, errors.VALIDATION_FAILED),
        ({"budget": ["usd", 0.5]}, errors.VALIDATION_FAILED),
        ({"other": 1}, errors.VALIDATION_FAILED),
        (["browser"], errors.VALIDATION_FAILED),
    ],
)
def test_needs_are_validated_at_submit(resourced: Harness, run_id: str, needs: Any, code: str) -> None:
    h = resourced
    assert h.err("task.submit", **h.submit_args(run_id, "k"), needs=needs) == code


def test_needs_are_normalized(resourced: Harness, run_id: str) -> None:
    h = resourced
    plain = h.task(h.ok("task.submit", **h.submit_args(run_id, "a"), needs={})["task_id"])
    assert plain.needs is None
    task = h.task(job(h, run_id, "b", slots=["browser", "browser"], limit=("api", 2)))
    assert task.needs == {"slots": ["browser", "browser"], "limit": ["api", 2], "budget": None}
    assert resources.needs_view(task.needs) == {
        "pools": [{"name": "browser", "units": 2}], "quotas": [{"name": "api", "units": 2}], "budgets": [],
    }
    assert resources.needs_problem({"slots": ["browser"], "budget": ["usd", 400_000]}) is None
    assert resources.needs_problem({"slots": [""]}) is not None


def test_receive_takes_every_need_with_the_lease(resourced: Harness, run_id: str) -> None:
    h = resourced
    task_id = job(h, run_id, "a", slots=["browser", "gpu"], limit=["api", 2], budget=["usd", 400_000])
    assert resources.pool_view(h.state, h.space, "gpu")["waiting"] == 1  # type: ignore[index]
    (delivery,) = h.receive(run_id)
    task = h.task(task_id)
    assert task.state == TaskState.RUNNING and len(task.slot_leases) == 2
    named = f"{task_id}.1"  # the delivery's number, never its token (readers see hold ids)
    assert delivery.startswith(named + ".") and task.slot_leases == [f"slt_{named}.0", f"slt_{named}.1"]
    assert task.reservation_id == f"rsv_{named}"
    assert resources.holds_view(task) == {"slots": task.slot_leases, "reservationId": task.reservation_id}
    gpu = resources.pool_view(h.state, h.space, "gpu")
    assert gpu is not None and gpu["waiting"] == 0
    assert gpu["holders"] == [{"leaseId": f"slt_{named}.1", "holder": "w1", "scopeId": run_id, "taskId": task_id,
                               "leaseExpiresAt": task.lease_expires_ms}]
    assert resources.limit_view(h.state, h.space, "api", h.now_ms)["takenInWindow"] == 2  # type: ignore[index]
    assert budget_view(h)["reserved"] == 0.4
    h.delivery("renew", delivery, lease_ms=30_000)
    assert budget_view(h)["reservations"][0]["leaseExpiresAt"] == h.now_ms + 30_000


def test_complete_returns_the_slots_and_charges_the_whole_reservation(resourced: Harness, run_id: str) -> None:
    h = resourced
    job(h, run_id, "a", slots=["gpu"], budget=["usd", 400_000])
    (delivery,) = h.receive(run_id)
    h.delivery("complete", delivery, payload=1)
    assert pool_in_use(h, "gpu") == 0
    view = budget_view(h)
    assert (view["spent"], view["reserved"]) == (0.4, 0.0)
    assert {resource_key("pool", "gpu"), resource_key("budget", "usd")} <= set(h.woken())
    task = h.task_of(delivery)
    assert not task.slot_leases and task.reservation_id is None
    h.delivery("complete", delivery, payload=1)  # answered again, charged once
    assert budget_view(h)["spent"] == 0.4


def test_complete_charges_the_reported_spend(resourced: Harness, run_id: str) -> None:
    h = resourced
    job(h, run_id, "a", budget=["usd", 400_000])
    (delivery,) = h.receive(run_id)
    h.delivery("complete", delivery, payload=1, spent_micros=120_000)
    assert budget_view(h)["spent"] == 0.12
    job(h, run_id, "b", budget=["usd", 400_000])
    (delivery,) = h.receive(run_id)
    assert h.err("delivery.complete", delivery_id=delivery, spent_micros=-1) == errors.VALIDATION_FAILED
    h.delivery("complete", delivery, spent_micros=2_000_000)  # more than reserved: up to what remains
    assert budget_view(h)["spent"] == 1.0


@pytest.mark.parametrize("end", ["retry", "reject", "release", "lapse", "cancel", "deadline"])
def test_every_end_of_a_delivery_returns_its_holds_once(resourced: Harness, end: str) -> None:
    h = resourced
    run_id = h.create_run(deadline_ms=h.now_ms + 5_000)
    task_id = job(h, run_id, "a", slots=["browser", "gpu"], limit=["api", 1], budget=["usd", 400_000])
    (delivery,) = h.receive(run_id, lease_ms=4_000 if end == "lapse" else LEASE_MS)
    if end == "retry":
        h.delivery("retry", delivery, error="e", delay_ms=0, spent_micros=100_000)
    elif end == "reject":
        h.delivery("reject", delivery, error="e")
    elif end == "release":
        h.delivery("release", delivery)
    elif end == "lapse":
        h.advance(4_000)
        h.tick()
    elif end == "cancel":
        h.cancel(run_id)
    else:
        h.advance(5_000)
        h.tick()
    task = h.task(task_id)
    assert not task.slot_leases and task.reservation_id is None
    assert (pool_in_use(h, "browser"), pool_in_use(h, "gpu")) == (0, 0)
    assert not h.state.slot_leases and not h.state.reservations
    spent = {"retry": 0.1, "reject": 0.4}.get(end, 0.0)
    view = budget_view(h)
    assert (view["spent"], view["reserved"]) == (spent, 0.0)
    assert {resource_key("pool", "gpu"), resource_key("budget", "usd")} <= set(h.woken())
    waiting = 1 if task.state == TaskState.QUEUED else 0
    assert resources.pool_view(h.state, h.space, "gpu")["waiting"] == waiting  # type: ignore[index]
    if end in ("cancel", "deadline"):
        # A handback after the stop is still accepted and returns nothing twice.
        h.delivery("retry", delivery, error="late", spent_micros=300_000)
        assert budget_view(h)["spent"] == 0.0


def test_stopping_a_run_stops_its_queued_jobs_waiting(resourced: Harness, run_id: str) -> None:
    h = resourced
    job(h, run_id, "a", slots=["gpu"])
    job(h, run_id, "b", slots=["gpu"])
    h.receive(run_id)
    assert resources.pool_view(h.state, h.space, "gpu")["waiting"] == 1  # type: ignore[index]
    h.cancel(run_id)
    gpu = resources.pool_view(h.state, h.space, "gpu")
    assert gpu is not None and (gpu["waiting"], gpu["inUse"]) == (0, 0)


def test_a_group_finalizing_returns_its_members_holds(resourced: Harness, run_id: str) -> None:
    h = resourced
    group = h.ok("group.create", run_id=run_id, mailbox=MAILBOX, condition="FIRST_ACCEPTED", retention_ms=RETENTION_MS)
    first = h.ok("group.submit", group_id=group["group_id"], key="m1", input=1, input_hash="h1")["task_id"]
    job(h, group["run_id"], "needy", slots=["gpu"])
    deliveries = h.receive(group["run_id"], max=2)
    assert len(deliveries) == 2 and pool_in_use(h, "gpu") == 1
    h.delivery("complete", deliveries[0], payload=1)
    h.ok("group.accept", group_id=group["group_id"], task_id=first)
    assert pool_in_use(h, "gpu") == 0


# -- jobs: receive order -------------------------------------------------------------------------


def test_a_blocked_job_stays_in_place_and_later_jobs_needing_its_resource_wait(
    resourced: Harness, run_id: str
) -> None:
    h = resourced
    lease_id = acquire(h, run_id, "browser")["lease_id"]  # one of two browser slots in use
    big = job(h, run_id, "big", slots=["browser", "browser"])
    small = job(h, run_id, "small", slots=["browser"])  # would fit, but must not pass big
    plain = job(h, run_id, "plain")
    gpu = job(h, run_id, "gpu", slots=["gpu"])
    delivered = h.ok("task.receive", run_id=run_id, mailbox=MAILBOX, max=10, lease_ms=LEASE_MS)["task_ids"]
    assert delivered == [plain, gpu]
    assert list(h.run(run_id).queues[MAILBOX].ready) == [big, small]
    assert h.state.pools["space-1/browser"].blocked == [[run_id, MAILBOX]]
    h.ok("pool.release", lease_id=lease_id)
    assert ("queue", run_id, MAILBOX) in h.woken()
    assert h.state.pools["space-1/browser"].blocked == []
    delivered = h.ok("task.receive", run_id=run_id, mailbox=MAILBOX, max=10, lease_ms=LEASE_MS)["task_ids"]
    assert delivered == [big]
    assert list(h.run(run_id).queues[MAILBOX].ready) == [small]


def test_a_job_skipped_for_one_resource_also_holds_back_jobs_needing_its_others(
    resourced: Harness, run_id: str
) -> None:
    h = resourced
    acquire(h, run_id, "gpu")
    first = job(h, run_id, "first", slots=["gpu"])  # blocked: no gpu
    second = job(h, run_id, "second", slots=["gpu", "browser"])  # skipped: first waits for the gpu
    third = job(h, run_id, "third", slots=["browser"])  # must not pass second, which waits for a browser too
    other = job(h, run_id, "other", limit=["api", 1])
    delivered = h.ok("task.receive", run_id=run_id, mailbox=MAILBOX, max=10, lease_ms=LEASE_MS)["task_ids"]
    assert delivered == [other]
    assert list(h.run(run_id).queues[MAILBOX].ready) == [first, second, third]


def test_a_job_blocked_by_a_rate_limit_is_woken_when_the_window_opens(resourced: Harness, run_id: str) -> None:
    h = resourced
    start = h.now_ms
    assert take(h, run_id, 3)["taken"]
    job(h, run_id, "a", limit=["api", 2])
    assert h.receive(run_id) == []
    assert h.armed() == [start + SECOND]
    h.advance(SECOND)
    h.tick()
    assert {resource_key("limit", "api"), ("queue", run_id, MAILBOX)} <= set(h.woken())
    assert len(h.receive(run_id)) == 1
    assert take(h, run_id, 2) == {"taken": False, "available_ms": start + 2 * SECOND, "unchanged": True}  # the job's take counts


def test_a_budget_blocked_job_waits_for_a_reservation_to_return(resourced: Harness, run_id: str) -> None:
    h = resourced
    reservation_id = reserve(h, run_id, 0.8)["reservation_id"]
    job(h, run_id, "a", budget=["usd", 400_000])
    assert h.receive(run_id) == []
    assert budget_view(h)["waiting"] == 1
    h.ok("budget.settle", reservation_id=reservation_id, spent_micros=500_000)
    assert ("queue", run_id, MAILBOX) in h.woken()
    assert len(h.receive(run_id)) == 1


def test_receive_serves_jobs_in_order_as_resources_return(resourced: Harness, run_id: str) -> None:
    h = resourced
    first, second = job(h, run_id, "a", slots=["gpu"]), job(h, run_id, "b", slots=["gpu"])
    (delivery,) = h.receive(run_id, max=10)
    assert h.task_of(delivery).id == first
    h.delivery("complete", delivery, payload=1)
    (delivery,) = h.receive(run_id, max=10)
    assert h.task_of(delivery).id == second


def test_receive_scans_a_bounded_number_of_entries(
    resourced: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = resourced
    monkeypatch.setattr(limits, "receive_scan_max", 3)
    acquire(h, run_id, "gpu")
    needy = [job(h, run_id, f"gpu-{n}", slots=["gpu"]) for n in range(3)]
    plain = job(h, run_id, "plain")
    assert h.receive(run_id) == []
    assert list(h.run(run_id).queues[MAILBOX].ready) == [*needy, plain]


def test_blocked_queues_per_resource_are_bounded(
    resourced: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = resourced
    monkeypatch.setattr(limits, "blocked_queues_max", 1)
    h.ensure("other")
    acquire(h, run_id, "gpu")
    job(h, run_id, "a", slots=["gpu"])
    job(h, run_id, "b", mailbox="other", slots=["gpu"])
    h.receive(run_id)
    h.receive(run_id, mailbox="other")
    h.receive(run_id)
    assert h.state.pools["space-1/gpu"].blocked == [[run_id, MAILBOX]]


# -- views, spaces, snapshots --------------------------------------------------------------------


def test_views_of_unknown_resources_and_other_spaces_are_none(resourced: Harness) -> None:
    h = resourced
    assert resources.pool_view(h.state, "space-2", "browser") is None
    assert resources.limit_view(h.state, h.space, "nope", h.now_ms) is None
    assert resources.budget_view(h.state, "space-2", "usd") is None
    assert resources.needs_view(None) is None


def test_holds_of_another_space_are_not_found(resourced: Harness, run_id: str) -> None:
    h = resourced
    lease_id = acquire(h, run_id)["lease_id"]
    reservation_id = reserve(h, run_id, 0.5)["reservation_id"]
    h.ok("pool.ensure", space="space-2", name="browser", size=1)
    h.ok("budget.ensure", space="space-2", name="usd", total_micros=1_000_000)
    for kind, args in [
        ("pool.renew", {"lease_id": lease_id, "lease_ms": LEASE_MS}),
        ("pool.release", {"lease_id": lease_id}),
        ("budget.renew", {"reservation_id": reservation_id, "lease_ms": LEASE_MS}),
        ("budget.release", {"reservation_id": reservation_id}),
        ("budget.settle", {"reservation_id": reservation_id, "spent_micros": 0}),
        ("pool.acquire", {"name": "browser", "run_id": run_id, "lease_ms": LEASE_MS}),
        ("budget.reserve", {"name": "usd", "run_id": run_id, "amount_micros": 1, "lease_ms": LEASE_MS}),
        ("limit.take", {"name": "api", "run_id": run_id, "units": 1}),
    ]:
        assert h.err(kind, space="space-2", **args) == errors.NOT_FOUND, kind


def test_snapshot_round_trip_with_resources(resourced: Harness, run_id: str) -> None:
    h = resourced
    acquire(h, run_id)
    reserve(h, run_id, 0.2)
    take(h, run_id, 3)
    job(h, run_id, "a", slots=["gpu"], limit=["api", 1], budget=["usd", 100_000])  # blocked by the limit
    job(h, run_id, "b", slots=["browser"], budget=["usd", 100_000])
    h.receive(run_id, max=2)
    data = snapshot_bytes(h.state)
    restored = round_trip(h.state)
    assert restored == h.state
    assert snapshot_bytes(restored) == data
    frozen = pack(to_snapshot(h.state))
    snapshot = to_snapshot(h.state)
    h.advance(SECOND)
    h.receive(run_id)
    h.tick()
    assert pack(snapshot) == frozen  # a value, not a view of the live state


def test_a_snapshot_from_before_resources_loads(h: Harness, run_id: str) -> None:
    h.submit(run_id, "a")
    (delivery,) = h.receive(run_id)
    h.submit(run_id, "b")
    old = unpack(pack(to_snapshot(h.state)))
    # Rows of an older layout (the columns from holder_session on), and no creation numbers (a
    # snapshot from before resources is from before them too: numbered by the log's command).
    old["tasks"] = [row[: _TASK_FIELDS.index("holder_session")] for row in old["tasks"]]
    del old["creation_seq"]
    old["spaces"] = [row[:-1] for row in old["spaces"]]  # no resource_counts
    for table in ("pools", "rate_limits", "budgets", "slot_leases", "reservations"):
        del old[table]
    restored = from_snapshot(old)
    assert restored.creation_seq is None
    number_in_creation_order(restored)  # state.number_creations, as the leader proposes it
    assert restored == h.state
    twin = Harness()
    twin.core.restore(old)
    twin.now_ms, twin.commands = h.now_ms, h.commands
    twin.delivery("complete", delivery, payload=1)
    pool(twin, size=1)
    job(twin, run_id, "c", slots=["browser"])
    assert len(twin.receive(run_id, max=5)) == 2
    with pytest.raises(ValueError, match="task row"):
        from_snapshot({**old, "tasks": [row[: _TASK_FIELDS.index("needs") - 1] for row in old["tasks"]]})


def test_restored_core_answers_like_the_original(resourced: Harness, run_id: str) -> None:
    h = resourced
    acquire(h, run_id, "gpu")
    job(h, run_id, "a", slots=["gpu"], budget=["usd", 100_000])
    job(h, run_id, "b", limit=["api", 3])
    h.receive(run_id, max=3)
    twin = Harness()
    twin.core.restore(unpack(pack(h.core.snapshot())))
    twin.now_ms, twin.commands = h.now_ms, h.commands
    for harness in (h, twin):
        harness.advance(LEASE_MS)
        harness.tick()
        harness.receive(run_id, max=3)
    assert h.effects == twin.effects
    assert snapshot_bytes(h.state) == snapshot_bytes(twin.state)


def receive_all(h: Harness, run_id: str) -> list[str]:
    task_ids: list[str] = h.ok("task.receive", run_id=run_id, mailbox=MAILBOX, max=10, lease_ms=LEASE_MS)["task_ids"]
    return task_ids


def test_resize_changes_a_resource_by_its_public_id_and_wakes_its_queue(resourced: Harness, run_id: str) -> None:
    h = resourced
    gpu = h.state.pools[f"{h.space}/gpu"]
    api = h.state.rate_limits[f"{h.space}/api"]
    usd = h.state.budgets[f"{h.space}/usd"]
    job(h, run_id, "a", slots=["gpu"])
    job(h, run_id, "b", slots=["gpu"])
    assert len(receive_all(h, run_id)) == 1
    made = h.ok("resource.resize", resource="pool", id=gpu.public_id, size=2)
    assert made == {"name": "gpu", "size": 2, "created": False} and gpu.size == 2
    assert resource_key("pool", "gpu") in h.woken()
    assert len(receive_all(h, run_id)) == 1  # the second slot
    h.ok("resource.resize", resource="limit", id=api.public_id, units=5, interval_ms=250)
    assert (api.units, api.interval_ms) == (5, 250)
    h.ok("resource.resize", resource="budget", id=usd.public_id, limit_minor=7)
    assert usd.limit_minor == 7 and usd.scale == limits.budget_micro_scale
    unchanged = snapshot_bytes(h.state)
    for args, code in (
        ({"resource": "pool", "id": "prm_nothing", "size": 1}, errors.NOT_FOUND),
        ({"resource": "pool", "id": api.public_id, "size": 1}, errors.NOT_FOUND),  # another kind's id
        ({"resource": "queue", "id": gpu.public_id, "size": 1}, errors.VALIDATION_FAILED),
        ({"resource": "pool", "id": gpu.public_id, "size": 0}, errors.VALIDATION_FAILED),
        ({"resource": "limit", "id": api.public_id, "units": 5}, errors.VALIDATION_FAILED),
        ({"resource": "budget", "id": usd.public_id, "limit_minor": 0}, errors.VALIDATION_FAILED),
    ):
        assert h.err("resource.resize", **args) == code, args
    assert snapshot_bytes(h.state) == unchanged
