"""Rules of budgets on the protocol (runstate_server.actors.budgets): money in integer minor units,
budgets by id, reservations reserved, settled by workKey and voided, STALE at their settleBy, what
a run's stop and a job's delivery do to them, and the old micro-unit routes on the same budgets."""

from __future__ import annotations

from typing import Any

from runstate_server.actors import budgets, limits, resources
from runstate_server.actors.state import from_snapshot, to_snapshot
from tests.test_actors_harness import Harness, pack, round_trip, unpack


def create(h: Harness, name: str = "usd", limit_minor: int = 100, **args: Any) -> str:
    budget_id: str = h.ok("budget.create", name=name, limit_minor=limit_minor, **args)["budget_id"]
    return budget_id


def reserve(h: Harness, budget_id: str, run_id: str, amount_minor: int, **args: Any) -> dict[str, Any]:
    return h.ok("budget_reservation.reserve", budget_id=budget_id, run_id=run_id, amount_minor=amount_minor,
                holder="w", **args)


def settle(h: Harness, budget_id: str, reservation_id: str, amount_minor: int, work_key: str = "k", **args: Any) -> Any:
    return h.apply("budget_reservation.settle", budget_id=budget_id, reservation_id=reservation_id,
                   amount_minor=amount_minor, work_key=work_key, **args)


def view(h: Harness, budget_id: str) -> dict[str, Any]:
    budget = budgets.find(h.state, h.space, budget_id)
    assert budget is not None
    return budgets.view(h.state, budget)


def totals(h: Harness, budget_id: str) -> tuple[str, str, str]:
    seen = view(h, budget_id)
    return seen["reservedMinor"], seen["settledMinor"], seen["remainingMinor"]


def test_create_and_declare_check_their_sizes(h: Harness) -> None:
    budget_id = create(h, scale=2, currency="EUR")
    assert budget_id.startswith("bdg_")
    assert budgets.rows(h.state, h.space) == [
        {"id": budget_id, "name": "usd", "currency": "EUR", "scale": 2, "limitMinor": "100"}
    ]
    assert h.err("budget.create", name="usd", limit_minor=100) == "CONFLICT"
    for bad in ({"limit_minor": 0}, {"limit_minor": "100"}, {"limit_minor": limits.budget_limit_minor_max + 1},
                {"limit_minor": 1, "scale": 10}, {"limit_minor": 1, "scale": True}, {"limit_minor": 1, "currency": "US"},
                {"limit_minor": 1, "currency": "usd"}, {"limit_minor": 1, "name": "bdg_x"}):
        assert h.err("budget.create", **{"name": "x", **bad}) == "VALIDATION_FAILED", bad
    declared = h.ok("budget.declare", name="gbp", limit_minor=10)
    assert declared["created"] is True
    made = budgets.find(h.state, h.space, declared["budget_id"])
    assert made is not None and (made.scale, made.currency) == (2, "USD")  # the defaults
    assert h.ok("budget.declare", name="gbp", limit_minor=10)["budget_id"] == declared["budget_id"]
    for other in ({"limit_minor": 11}, {"limit_minor": 10, "scale": 3}, {"limit_minor": 10, "currency": "EUR"}):
        assert h.err("budget.declare", name="gbp", **other) == "CONFLICT", other
    assert budgets.find(h.state, "other-space", budget_id) is None


def test_reserve_takes_from_what_remains(h: Harness, run_id: str) -> None:
    budget_id = create(h)
    first = reserve(h, budget_id, run_id, 60)
    assert first["state"] == "ACTIVE" and first["settle_by_ms"] == h.now_ms + limits.budget_settle_by_ms_default
    assert h.err("budget_reservation.reserve", budget_id=budget_id, run_id=run_id, amount_minor=41) == "INSUFFICIENT_BUDGET"
    reserve(h, budget_id, run_id, 40)
    assert totals(h, budget_id) == ("100", "0", "0")
    for bad in ({"amount_minor": 0}, {"amount_minor": 1, "settle_by_ms": h.now_ms},
                {"amount_minor": 1, "settle_by_ms": h.now_ms + limits.budget_settle_by_ms_max + 1}):
        assert h.err("budget_reservation.reserve", budget_id=budget_id, run_id=run_id, **bad) == "VALIDATION_FAILED"
    assert h.err("budget_reservation.reserve", budget_id="bdg_nothing", run_id=run_id, amount_minor=1) == "NOT_FOUND"


def test_settles_are_partial_and_keyed_by_work_key(h: Harness, run_id: str) -> None:
    budget_id = create(h)
    reservation_id = reserve(h, budget_id, run_id, 40)["reservation_id"]
    first = settle(h, budget_id, reservation_id, 10, "a")
    assert first == {"reservation_id": reservation_id, "state": "ACTIVE", "charged_minor": 10, "settled_minor": 10,
                     "reserved_minor": 30}
    assert settle(h, budget_id, reservation_id, 10, "a") == {**first, "unchanged": True}  # charged once
    assert settle(h, budget_id, reservation_id, 11, "a")["error"]["code"] == "CONFLICT"
    assert settle(h, budget_id, reservation_id, 31, "b")["error"]["code"] == "INSUFFICIENT_BUDGET"
    assert totals(h, budget_id) == ("30", "10", "60")
    last = settle(h, budget_id, reservation_id, 30, "b")
    assert (last["state"], last["reserved_minor"], last["settled_minor"]) == ("SETTLED", 0, 40)
    assert settle(h, budget_id, reservation_id, 1, "c")["error"]["code"] == "CONFLICT"
    assert h.err("budget_reservation.void", budget_id=budget_id, reservation_id=reservation_id, work_key="v") == "CONFLICT"
    assert totals(h, budget_id) == ("0", "40", "60")


def test_an_overrun_is_charged_up_to_what_the_budget_covers(h: Harness, run_id: str) -> None:
    """0.3.0's test_budget_charges_overruns_and_refuses: 0.30 spent, 0.40 reserved, 0.90 cost."""
    budget_id = create(h)
    settle(h, budget_id, reserve(h, budget_id, run_id, 30)["reservation_id"], 30)
    reservation_id = reserve(h, budget_id, run_id, 40)["reservation_id"]
    result = settle(h, budget_id, reservation_id, 90, allow_overrun=True)
    assert (result["state"], result["charged_minor"], result["reserved_minor"]) == ("SETTLED", 70, 0)
    assert totals(h, budget_id) == ("0", "100", "0")
    assert h.err("budget_reservation.reserve", budget_id=budget_id, run_id=run_id, amount_minor=40) == "INSUFFICIENT_BUDGET"


def test_void_releases_the_rest(h: Harness, run_id: str) -> None:
    budget_id = create(h)
    untouched = reserve(h, budget_id, run_id, 20)["reservation_id"]
    voided = h.ok("budget_reservation.void", budget_id=budget_id, reservation_id=untouched, work_key="v")
    assert (voided["state"], voided["reserved_minor"]) == ("VOIDED", 0)
    again = h.ok("budget_reservation.void", budget_id=budget_id, reservation_id=untouched, work_key="v")
    assert again == {**voided, "unchanged": True}
    partly = reserve(h, budget_id, run_id, 20)["reservation_id"]
    settle(h, budget_id, partly, 5)
    assert h.ok("budget_reservation.void", budget_id=budget_id, reservation_id=partly, work_key="v")["state"] == "SETTLED"
    assert totals(h, budget_id) == ("0", "5", "95")


def test_a_reservation_past_its_settle_by_is_stale_and_still_held(h: Harness, run_id: str) -> None:
    budget_id = create(h)
    reservation_id = reserve(h, budget_id, run_id, 40, settle_by_ms=h.now_ms + 1_000)["reservation_id"]
    h.advance(1_000)
    h.tick()
    assert view(h, budget_id)["reservations"][0]["state"] == "STALE"
    assert totals(h, budget_id) == ("40", "0", "60")  # never refunded by time
    assert settle(h, budget_id, reservation_id, 10)["state"] == "STALE"
    assert h.ok("budget_reservation.void", budget_id=budget_id, reservation_id=reservation_id, work_key="v")["state"] == "SETTLED"
    assert totals(h, budget_id) == ("0", "10", "90")


def test_a_runs_stop_voids_its_reservations(h: Harness) -> None:
    budget_id = create(h)
    stopping, other = h.create_run(), h.create_run()
    reservation_id = reserve(h, budget_id, stopping, 30, settle_by_ms=h.now_ms + 1)["reservation_id"]
    h.advance(1)
    h.tick()  # STALE: a stop returns it all the same
    reserve(h, budget_id, other, 20)
    h.cancel(stopping)
    assert totals(h, budget_id) == ("20", "0", "80")
    assert settle(h, budget_id, reservation_id, 1)["error"]["code"] == "CONFLICT"
    assert h.err("budget_reservation.reserve", budget_id=budget_id, run_id=stopping, amount_minor=1) == "SCOPE_CANCELLED"


def test_ended_reservations_are_kept_up_to_a_bound(h: Harness, run_id: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(limits, "budget_ended_kept_max", 2)
    budget_id = create(h)
    ids = [reserve(h, budget_id, run_id, 1)["reservation_id"] for _ in range(3)]
    for reservation_id in ids:
        settle(h, budget_id, reservation_id, 1)
    assert [row["id"] for row in view(h, budget_id)["reservations"]] == ids[1:]
    assert settle(h, budget_id, ids[0], 1)["error"]["code"] == "NOT_FOUND"
    assert totals(h, budget_id) == ("0", "3", "97")


def test_a_jobs_reservations_are_taken_at_admission(h: Harness, run_id: str) -> None:
    budget_id = create(h)
    requirements = {"budgets": [{"name": "usd", "reserveMinor": "40"}]}
    h.ok("mailbox.declare", name="jobs", requirements=requirements)
    for key in ("a", "b", "c"):
        h.ok("task.submit", **{**h.submit_args(run_id, key), "mailbox": "jobs"})
    given = h.ok("task.receive", run_id=run_id, mailbox="jobs", max=3, lease_ms=10_000, holder="w")["deliveries"]
    assert len(given) == 2  # 20 left: the third waits for money
    first, second = given
    (reservation_id,) = first["budget_reservations"]
    assert totals(h, budget_id) == ("80", "0", "20")
    # Completed: the reservation stays for the worker to settle (0.3.0 settles after complete).
    h.delivery("complete", first["token"], payload=1)
    assert settle(h, budget_id, reservation_id, 15)["state"] == "ACTIVE"
    # A lapse voids what the delivery held, and the next delivery reserves again.
    h.advance(10_000)
    h.tick()
    assert totals(h, budget_id) == ("25", "15", "60")
    again = h.ok("task.receive", run_id=run_id, mailbox="jobs", max=3, lease_ms=10_000, holder="w")["deliveries"]
    (redelivered,) = again  # 60 left: one more of 40
    assert len(redelivered["budget_reservations"]) == 1  # "c": the lapsed "b" went back behind it
    assert second["budget_reservations"] != redelivered["budget_reservations"]
    assert totals(h, budget_id) == ("65", "15", "20")
    h.cancel(run_id)
    assert totals(h, budget_id) == ("0", "15", "85")


def test_requirements_budgets_are_checked(h: Harness, run_id: str) -> None:
    create(h)
    for bad in ([{"name": "usd"}], [{"name": "usd", "reserveMinor": "0"}], [{"name": "usd", "reserveMinor": "1.5"}],
                [{"name": "usd", "reserveMinor": "1"}] * 3, {"name": "usd"}):
        assert h.err("task.submit", **h.submit_args(run_id, "a", requirements={"budgets": bad})) == "VALIDATION_FAILED"
    assert h.err("task.submit", **h.submit_args(run_id, "a", requirements={"budgets": [
        {"name": "usd", "reserveMinor": "101"}]})) == "VALIDATION_FAILED"
    assert h.err("task.submit", **h.submit_args(run_id, "a", requirements={"budgets": [
        {"name": "none", "reserveMinor": "1"}]})) == "NOT_FOUND"
    h.ok("task.submit", **h.submit_args(run_id, "a", requirements={"budgets": [{"name": "usd", "reserveMinor": 5}]}))


def test_the_old_routes_convert_micros_exactly(h: Harness, run_id: str) -> None:
    h.ok("budget.ensure", name="old", total_micros=2_500_000)
    old = resources.find(h.state, resources.BUDGET, h.space, "old")
    assert (old.scale, old.limit_minor) == (6, 2_500_000)
    assert h.err("budget.ensure", name="bdg_x", total_micros=1) == "VALIDATION_FAILED"
    create(h, "cents")
    assert h.err("budget.ensure", name="cents", total_micros=1_005_000) == "VALIDATION_FAILED"  # 1.005: not whole cents
    args = {"name": "cents", "run_id": run_id, "lease_ms": 10_000}
    assert h.err("budget.reserve", amount_micros=405_000, **args) == "VALIDATION_FAILED"
    reservation_id = h.ok("budget.reserve", amount_micros=400_000, **args)["reservation_id"]
    assert h.ok("budget.settle", reservation_id=reservation_id, spent_micros=100_000) == {
        "charged_micros": 100_000, "returned_micros": 300_000
    }
    budget_id = resources.find(h.state, resources.BUDGET, h.space, "cents").public_id
    assert totals(h, budget_id) == ("0", "10", "90")
    assert resources.to_micros(0.1) == 100_000 and resources.to_micros(3) == 3_000_000
    assert sum(resources.to_micros(0.4) for _ in range(25)) == resources.to_micros(10.0)


def test_an_old_snapshots_budget_counts_micros_and_gets_an_id(h: Harness) -> None:
    h.ok("budget.ensure", name="old", total_micros=1_000_000)
    snapshot = to_snapshot(h.state)
    # A row from before scales and ids: its first ten columns.
    snapshot["budgets"] = [row[:10] for row in snapshot["budgets"]]
    restored = from_snapshot(unpack(pack(snapshot)))
    (budget,) = restored.budgets.values()
    assert (budget.scale, budget.currency, budget.limit_minor) == (6, "USD", 1_000_000)
    assert budget.public_id.startswith("bdg_") and restored.budget_ids == {budget.public_id: budget.id}
    assert round_trip(h.state).budget_ids == h.state.budget_ids
