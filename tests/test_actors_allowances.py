"""Rules of allowances (runstate_server.actors.allowances): rate limits seen through the protocol's
ids; consumptions, the waiters' FIFO line, cooldowns, settling estimates, and what a run's stop
does to them."""

from __future__ import annotations

from typing import Any

import pytest

from runstate_server.actors import allowances, limits, resources
from runstate_server.actors.state import _RUN_FIELDS, from_snapshot, to_snapshot
from tests.test_actors_harness import Harness, pack, unpack

WINDOW_MS = 2_000


def create(h: Harness, name: str = "search", units: int = 3, interval_ms: int = WINDOW_MS) -> str:
    allowance_id: str = h.ok("allowance.create", name=name, units=units, interval_ms=interval_ms)["allowance_id"]
    return allowance_id


def consume(h: Harness, allowance_id: str, run_id: str, units: int = 1) -> Any:
    return h.apply("allowance.consume", allowance_id=allowance_id, run_id=run_id, units=units, holder="w")


def wait(h: Harness, allowance_id: str, run_id: str, units: int = 1, ttl_ms: int | None = None) -> dict[str, Any]:
    return h.ok("allowance.wait", allowance_id=allowance_id, run_id=run_id, units=units, holder="w", ttl_ms=ttl_ms)


def waiter(h: Harness, waiter_id: str) -> dict[str, Any]:
    view = allowances.waiter_view(h.state, h.space, waiter_id)
    assert view is not None
    return view


def limit_of(h: Harness, allowance_id: str) -> resources.RateLimit:
    limit = allowances.find(h.state, h.space, allowance_id)
    assert limit is not None
    return limit


def code(result: Any) -> str:
    assert "error" in result, result
    return str(result["error"]["code"])


def test_create_declare_and_the_limit_routes_share_one_object(h: Harness) -> None:
    allowance_id = create(h)
    assert allowance_id.startswith("alw_")
    assert h.err("allowance.create", name="search", units=3, interval_ms=WINDOW_MS) == "CONFLICT"
    assert h.err("allowance.create", name="x", units=0, interval_ms=WINDOW_MS) == "VALIDATION_FAILED"
    assert allowances.rows(h.state, h.space) == [
        {"id": allowance_id, "name": "search", "unitsLimit": 3, "windowSeconds": 2}
    ]
    assert allowances.rows(h.state, "other-space") == []
    again = h.ok("allowance.declare", name="search", units=3, interval_ms=WINDOW_MS)
    assert again == {"allowance_id": allowance_id, "created": False, "unchanged": True}
    assert h.err("allowance.declare", name="search", units=4, interval_ms=WINDOW_MS) == "CONFLICT"
    assert h.err("allowance.declare", name="search", units=3, interval_ms=3_000) == "CONFLICT"
    assert h.ok("allowance.declare", name="other", units=1, interval_ms=1_000)["created"] is True
    h.ok("limit.ensure", name="legacy", units=2, interval_ms=500)  # the limit routes' limits are allowances
    legacy = resources.find(h.state, resources.LIMIT, h.space, "legacy")
    assert legacy.public_id.startswith("alw_")
    assert allowances.row(legacy)["windowSeconds"] == 0.5
    assert h.ok("allowance.declare", name="legacy", units=2, interval_ms=500)["allowance_id"] == legacy.public_id


def test_consume_takes_in_the_sliding_window_and_says_when_to_retry(h: Harness, run_id: str) -> None:
    allowance_id = create(h, units=3)
    first = consume(h, allowance_id, run_id, units=2)
    assert first["consumption_id"].startswith("acn_")
    assert (first["units"], first["remaining"], first["window_start_ms"]) == (2, 1, h.now_ms - WINDOW_MS)
    h.advance(500)
    assert consume(h, allowance_id, run_id)["remaining"] == 0
    refused = consume(h, allowance_id, run_id)
    assert code(refused) == "ALLOWANCE_EXHAUSTED" and refused["error"]["retryAfterMs"] == 1_500
    h.advance(1_500)  # the first take leaves the window exactly now
    assert consume(h, allowance_id, run_id, units=2)["remaining"] == 0
    assert code(consume(h, allowance_id, run_id, units=4)) == "VALIDATION_FAILED"  # more than it ever allows
    assert code(consume(h, "alw_nope", run_id)) == "NOT_FOUND"
    h.cancel(run_id)
    h.advance(WINDOW_MS)
    assert code(consume(h, allowance_id, run_id)) == "SCOPE_CANCELLED"


def test_waiters_are_granted_in_order_at_the_ms_the_window_opens(h: Harness, run_id: str) -> None:
    allowance_id = create(h, units=3)
    granted = wait(h, allowance_id, run_id, units=3)
    assert granted["state"] == "GRANTED" and granted["consumption_id"].startswith("acn_")
    first = wait(h, allowance_id, run_id, units=2)
    second = wait(h, allowance_id, run_id, units=1)
    assert (first["state"], second["state"]) == ("WAITING", "WAITING")
    assert h.state.next_due_ms() == h.now_ms + WINDOW_MS  # armed for the ms the window opens
    # Strict FIFO: a consume does not pass the line, nor does a job, nor a take of the limit routes.
    assert code(consume(h, allowance_id, run_id)) == "ALLOWANCE_EXHAUSTED"
    h.advance(WINDOW_MS - 1)
    h.tick()
    assert waiter(h, first["waiter_id"])["state"] == "WAITING"
    assert waiter(h, second["waiter_id"])["position"] == 1
    h.advance(1)
    h.tick()
    assert waiter(h, first["waiter_id"])["state"] == "GRANTED"
    assert waiter(h, second["waiter_id"])["state"] == "GRANTED"
    consumption_id = waiter(h, first["waiter_id"])["consumptionId"]
    assert h.state.allowance_consumptions[consumption_id].units == 2
    assert allowances.remaining(limit_of(h, allowance_id), h.now_ms) == 0


def test_a_job_waits_behind_the_line_and_goes_when_it_moves(h: Harness, run_id: str) -> None:
    h.ensure()
    allowance_id = create(h, units=2)
    h.ok("allowance.consume", allowance_id=allowance_id, run_id=run_id, units=2)
    waiting = wait(h, allowance_id, run_id, units=1)
    h.submit(run_id, "job", needs={"limit": ["search", 1]})
    h.advance(WINDOW_MS)
    assert h.receive(run_id) == []  # the window has room, but the waiter is first
    assert h.ok("limit.take", name="search", run_id=run_id, units=1)["taken"] is False
    h.tick()
    assert waiter(h, waiting["waiter_id"])["state"] == "GRANTED"
    assert len(h.receive(run_id)) == 1  # the line moved; one unit was left


def test_a_smaller_head_after_a_cancel_is_granted(h: Harness, run_id: str) -> None:
    allowance_id = create(h, units=3)
    consume(h, allowance_id, run_id, units=2)
    big = wait(h, allowance_id, run_id, units=3)
    small = wait(h, allowance_id, run_id, units=1)
    assert waiter(h, small["waiter_id"])["state"] == "WAITING"  # behind the big one, though it fits
    assert h.ok("allowance_waiter.cancel", waiter_id=big["waiter_id"])["state"] == "CANCELLED"
    assert waiter(h, small["waiter_id"])["state"] == "GRANTED"
    again = h.ok("allowance_waiter.cancel", waiter_id=small["waiter_id"])  # granted stays granted
    assert again["state"] == "GRANTED" and again["consumption_id"] == waiter(h, small["waiter_id"])["consumptionId"]
    assert h.err("allowance_waiter.cancel", waiter_id="awt_nope") == "NOT_FOUND"


def test_ttl_expires_and_run_stop_cancels_waiters(h: Harness, run_id: str) -> None:
    allowance_id = create(h, units=1, interval_ms=60_000)
    consume(h, allowance_id, run_id)
    other_run = h.create_run()
    short = wait(h, allowance_id, run_id, ttl_ms=1_000)
    stopped = wait(h, allowance_id, other_run)
    h.advance(1_000)
    h.tick()
    assert waiter(h, short["waiter_id"])["state"] == "EXPIRED"
    h.cancel(other_run)
    assert waiter(h, stopped["waiter_id"])["state"] == "CANCELLED"
    assert limit_of(h, allowance_id).waiters == []
    h.advance(70_000)
    h.tick()  # the stopped run is removed, with its waiters
    assert stopped["waiter_id"] not in h.state.allowance_waiters


def test_waiter_bounds_and_units_that_could_never_be_granted(h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    allowance_id = create(h, units=1, interval_ms=60_000)
    assert h.err("allowance.wait", allowance_id=allowance_id, run_id=run_id, units=2, ttl_ms=None) == "VALIDATION_FAILED"
    consume(h, allowance_id, run_id)
    monkeypatch.setattr(limits, "allowance_waiters_per_allowance_max", 2)
    wait(h, allowance_id, run_id)
    wait(h, allowance_id, run_id)
    assert h.err("allowance.wait", allowance_id=allowance_id, run_id=run_id, units=1, ttl_ms=None) == "LIMIT_EXCEEDED"
    monkeypatch.setattr(limits, "allowance_waiters_per_allowance_max", 10)
    monkeypatch.setattr(limits, "allowance_waiters_per_run_max", 2)
    assert h.err("allowance.wait", allowance_id=allowance_id, run_id=run_id, units=1, ttl_ms=None) == "LIMIT_EXCEEDED"


def test_cooldown_holds_everything_and_never_shortens(h: Harness, run_id: str) -> None:
    h.ensure()
    allowance_id = create(h, units=5)
    answer = h.ok("allowance.cooldown", allowance_id=allowance_id, cooldown_ms=10_000, reason="429 from provider")
    assert answer == {"cooldown_until_ms": h.now_ms + 10_000, "reason": "429 from provider"}
    shorter = h.ok("allowance.cooldown", allowance_id=allowance_id, cooldown_ms=1_000, reason="other")
    assert shorter["cooldown_until_ms"] == h.now_ms + 10_000 and shorter["reason"] == "429 from provider"
    refused = consume(h, allowance_id, run_id)
    assert code(refused) == "ALLOWANCE_COOLDOWN" and refused["error"]["retryAfterMs"] == 10_000
    assert h.err("allowance.cooldown", allowance_id=allowance_id, cooldown_ms=limits.allowance_cooldown_ms_max + 1,
                 reason=None) == "VALIDATION_FAILED"
    waiting = wait(h, allowance_id, run_id)
    assert waiting["state"] == "WAITING"
    h.submit(run_id, "job", needs={"limit": ["search", 1]})
    assert h.receive(run_id) == []
    assert h.ok("limit.take", name="search", run_id=run_id)["available_ms"] == h.now_ms + 10_000
    assert allowances.view(h.state, limit_of(h, allowance_id), h.now_ms)["cooldownUntil"] == h.now_ms + 10_000
    h.advance(10_000)
    h.tick()
    assert waiter(h, waiting["waiter_id"])["state"] == "GRANTED"
    assert len(h.receive(run_id)) == 1
    assert allowances.view(h.state, limit_of(h, allowance_id), h.now_ms)["cooldownUntil"] is None


def test_settle_gives_back_the_unused_units_and_takes_an_overrun(h: Harness, run_id: str) -> None:
    allowance_id = create(h, units=10)
    estimate = consume(h, allowance_id, run_id, units=8)["consumption_id"]
    queued = wait(h, allowance_id, run_id, units=5)
    assert queued["state"] == "WAITING"
    settled = h.ok("allowance_consumption.settle", consumption_id=estimate, units=3)
    assert settled == {"consumption_id": estimate, "units": 8, "settled_units": 3, "returned_units": 5, "overrun_units": 0}
    assert waiter(h, queued["waiter_id"])["state"] == "GRANTED"  # the units given back served the line
    assert h.ok("allowance_consumption.settle", consumption_id=estimate, units=3)["returned_units"] == 5
    assert h.err("allowance_consumption.settle", consumption_id=estimate, units=4) == "CONFLICT"
    # An overrun counts at settle time, even past the limit: later takes wait for it.
    small = consume(h, allowance_id, run_id, units=1)["consumption_id"]
    h.advance(500)
    over = h.ok("allowance_consumption.settle", consumption_id=small, units=6)
    assert over["overrun_units"] == 5
    limit = limit_of(h, allowance_id)
    assert sum(units for at_ms, units in limit.takes if at_ms > h.now_ms - WINDOW_MS) == 3 + 5 + 1 + 5
    refused = consume(h, allowance_id, run_id)
    assert refused["error"]["retryAfterMs"] == WINDOW_MS - 500  # when the first takes leave the window
    assert h.err("allowance_consumption.settle", consumption_id="acn_nope", units=1) == "NOT_FOUND"
    assert h.err("allowance_consumption.settle", consumption_id=small, units=-1) == "VALIDATION_FAILED"


def test_consumptions_are_settled_within_a_bounded_time_and_count(h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    allowance_id = create(h, units=100, interval_ms=1_000)
    first = consume(h, allowance_id, run_id)["consumption_id"]
    h.advance(limits.allowance_consumption_settle_ms)
    assert h.err("allowance_consumption.settle", consumption_id=first, units=0) == "NOT_FOUND"
    monkeypatch.setattr(limits, "allowance_consumptions_per_allowance_max", 3)
    taken = [consume(h, allowance_id, run_id)["consumption_id"] for _ in range(4)]
    assert first not in h.state.allowance_consumptions  # forgotten: past its time
    assert limit_of(h, allowance_id).consumptions == taken[1:]
    assert h.err("allowance_consumption.settle", consumption_id=taken[0], units=0) == "NOT_FOUND"


def test_a_settle_never_gives_back_what_the_window_forgot(h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past limit_takes_max takes the window is counted in coarser steps and its oldest takes are
    forgotten: giving units back then stays within the limit."""
    monkeypatch.setattr(limits, "limit_takes_max", 8)
    allowance_id = create(h, units=1_000, interval_ms=100)
    taken = []
    for _ in range(40):
        taken.append((h.now_ms, consume(h, allowance_id, run_id, units=10)["consumption_id"]))
        h.advance(3)
    limit = limit_of(h, allowance_id)
    assert len(limit.takes) <= 8 and limit.forgotten_ms > 0
    for at_ms, consumption_id in taken:
        returned = h.ok("allowance_consumption.settle", consumption_id=consumption_id, units=2)["returned_units"]
        assert returned == (0 if at_ms <= limit.forgotten_ms else 8)
    assert all(units >= 0 for _, units in limit.takes)
    in_window = sum(units for at_ms, units in limit.takes if at_ms > h.now_ms - 100)
    real = sum(2 for at_ms, _ in taken if at_ms > h.now_ms - 100)
    assert in_window >= real  # stricter, never looser


def test_snapshot_keeps_allowances_and_an_old_snapshot_gets_their_ids(h: Harness, run_id: str) -> None:
    allowance_id = create(h, units=1, interval_ms=60_000)
    consume(h, allowance_id, run_id)
    waiting = wait(h, allowance_id, run_id)
    h.ok("allowance.cooldown", allowance_id=allowance_id, cooldown_ms=1_000, reason="r")
    restored = from_snapshot(unpack(pack(to_snapshot(h.state))))
    assert restored == h.state
    assert restored.allowance_ids == {allowance_id: "space-1/search"}
    old = to_snapshot(h.state)
    old["rate_limits"] = [row[:10] for row in old["rate_limits"]]  # a row from before allowances
    old["allowance_waiters"], old["allowance_consumptions"] = [], []
    # A run row from before allowances: it stops before allowance_waiters (the queues come last).
    old["runs"] = [row[: _RUN_FIELDS.index("allowance_waiters")] + row[-1:] for row in old["runs"]]
    restored = from_snapshot(unpack(pack(old)))
    (limit,) = restored.rate_limits.values()
    assert limit.public_id.startswith("alw_") and limit.public_id != allowance_id
    assert restored.allowance_ids == {limit.public_id: limit.id}
    assert waiting["waiter_id"] not in restored.allowance_waiters


def test_declare_checks_its_sizes_before_looking(h: Harness) -> None:
    create(h)
    assert h.err("allowance.declare", name="search", units=0, interval_ms=WINDOW_MS) == "VALIDATION_FAILED"
    assert h.err("allowance.declare", name="search", units=3, interval_ms=0) == "VALIDATION_FAILED"


def test_a_limit_made_smaller_expires_the_waiters_it_can_never_grant(h: Harness, run_id: str) -> None:
    h.ensure()
    allowance_id = create(h, units=3)
    consume(h, allowance_id, run_id, units=3)
    big = wait(h, allowance_id, run_id, units=3)
    small = wait(h, allowance_id, run_id, units=1)
    h.submit(run_id, "job", needs={"limit": ["search", 2]})
    h.ok("limit.ensure", name="search", units=2, interval_ms=WINDOW_MS)  # the limit routes may shrink it
    assert waiter(h, big["waiter_id"])["state"] == "EXPIRED"
    assert waiter(h, small["waiter_id"])["state"] == "WAITING"
    assert h.receive(run_id) == []
    assert code(consume(h, allowance_id, run_id)) == "ALLOWANCE_EXHAUSTED"
    h.advance(WINDOW_MS)
    h.tick()
    assert waiter(h, small["waiter_id"])["state"] == "GRANTED"
    assert h.err("allowance.wait", allowance_id=allowance_id, run_id=run_id, units=3, ttl_ms=None) == "VALIDATION_FAILED"
