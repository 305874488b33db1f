"""Rules of permits (runstate_server.actors.permits): pools seen through the protocol's ids, grants
of several units fenced by tokens, and what a run's stop does to them."""

from __future__ import annotations

from typing import Any

import pytest

from runstate_server.actors import limits, permits, resources
from runstate_server.actors.state import _RUN_FIELDS, from_snapshot, to_snapshot
from tests.test_actors_harness import Harness, pack, round_trip, snapshot_bytes, unpack

LEASE_MS = 10_000


def create(h: Harness, name: str = "gpu", units: int = 3) -> str:
    permit_id: str = h.ok("permit.create", name=name, units=units)["permit_id"]
    return permit_id


def acquire(h: Harness, permit_id: str, run_id: str, units: int = 1, **args: Any) -> Any:
    return h.apply(
        "permit.acquire", permit_id=permit_id, run_id=run_id, units=units, lease_ms=LEASE_MS, holder="w",
        holder_session="s1", nonce="ab" * 12, **args,
    )


def view(h: Harness, permit_id: str) -> dict[str, Any]:
    pool = permits.find(h.state, h.space, permit_id)
    assert pool is not None
    return permits.view(h.state, pool)


def test_create_gives_an_id_from_the_command_and_refuses_a_taken_name(h: Harness) -> None:
    permit_id = create(h)
    assert permit_id.startswith("prm_")
    assert h.err("permit.create", name="gpu", units=3) == "CONFLICT"
    assert h.err("permit.create", name="cpu", units=0) == "VALIDATION_FAILED"
    assert permits.rows(h.state, h.space) == [
        {"id": permit_id, "name": "gpu", "unitsTotal": 3, "unitsInUse": 0, "waiting": 0}
    ]
    assert permits.rows(h.state, "other-space") == []


def test_declare_creates_finds_an_equal_one_and_refuses_another_size(h: Harness) -> None:
    first = h.ok("permit.declare", name="gpu", units=2)
    assert first["created"] is True
    again = h.ok("permit.declare", name="gpu", units=2)
    assert again["permit_id"] == first["permit_id"] and again["created"] is False
    assert h.err("permit.declare", name="gpu", units=3) == "CONFLICT"
    pool_made = h.ok("pool.ensure", name="browser", size=1)  # the pool routes' pools are permits too
    assert pool_made["created"] is True
    found = resources.find(h.state, resources.POOL, h.space, "browser")
    assert h.ok("permit.declare", name="browser", units=1)["permit_id"] == found.public_id


def test_grants_count_their_units_until_full(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=3)
    grant = acquire(h, permit_id, run_id, units=2)
    assert grant["granted"] is True and grant["grant_id"].startswith("slt_")
    assert grant["token"].startswith(grant["grant_id"] + ".") and grant["token"].endswith("ab" * 12)
    assert acquire(h, permit_id, run_id, units=2)["granted"] is False
    assert acquire(h, permit_id, run_id, units=1)["granted"] is True
    assert view(h, permit_id)["unitsInUse"] == 3
    assert [g["units"] for g in view(h, permit_id)["grants"]] == [2, 1]
    assert h.err("permit.acquire", permit_id=permit_id, run_id=run_id, units=4, lease_ms=LEASE_MS) == "VALIDATION_FAILED"
    assert h.err("permit.acquire", permit_id="prm_nope", run_id=run_id, units=1, lease_ms=LEASE_MS) == "NOT_FOUND"


def test_a_jobs_slot_and_a_multi_unit_grant_share_the_size(h: Harness, run_id: str) -> None:
    permit_id = create(h, "browser", units=2)
    assert acquire(h, permit_id, run_id, units=1)["granted"] is True
    h.ok("task.submit", **{**h.submit_args(run_id, "a"), "needs": {"slots": ["browser"]}})
    h.ok("task.submit", **{**h.submit_args(run_id, "b"), "needs": {"slots": ["browser"]}})
    assert len(h.receive(run_id, max=2)) == 1  # one slot was free
    assert acquire(h, permit_id, run_id)["granted"] is False
    assert view(h, permit_id)["unitsInUse"] == 2


def test_renew_and_release_need_the_grants_token(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=1)
    grant = acquire(h, permit_id, run_id)
    grant_id, token = grant["grant_id"], grant["token"]
    assert h.err("permit.renew", grant_id=grant_id, token=token + "x", lease_ms=LEASE_MS) == "STALE_CLAIM"
    assert h.err("permit.release", grant_id=grant_id, token=None) == "STALE_CLAIM"
    h.advance(5_000)
    assert h.ok("permit.renew", grant_id=grant_id, token=token, lease_ms=LEASE_MS)["lease_expires_ms"] == h.now_ms + LEASE_MS
    assert h.ok("permit.release", grant_id=grant_id, token=token) == {"released": True}
    assert h.err("permit.release", grant_id=grant_id, token=token) == "STALE_CLAIM"
    assert h.err("permit.renew", grant_id=grant_id, token=token, lease_ms=LEASE_MS) == "STALE_CLAIM"
    assert view(h, permit_id)["unitsInUse"] == 0


def test_a_lapsed_grant_is_stale_and_returns_at_the_tick(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=1)
    grant = acquire(h, permit_id, run_id)
    h.advance(LEASE_MS)
    assert h.err("permit.renew", grant_id=grant["grant_id"], token=grant["token"], lease_ms=LEASE_MS) == "STALE_CLAIM"
    h.tick()
    assert view(h, permit_id)["unitsInUse"] == 0


def test_a_grant_of_another_space_is_stale(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=1)
    grant = acquire(h, permit_id, run_id)
    other = h.apply("permit.release", space="space-2", grant_id=grant["grant_id"], token=grant["token"])
    assert other["error"]["code"] == "STALE_CLAIM"
    assert permits.find(h.state, "space-2", permit_id) is None


def test_a_stopped_run_refuses_acquire_and_ends_its_grants(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=2)
    other_run = h.create_run()
    ended = acquire(h, permit_id, run_id)
    kept = acquire(h, permit_id, other_run)
    h.cancel(run_id, retention_ms=1_000)
    assert [g["grantId"] for g in view(h, permit_id)["grants"]] == [kept["grant_id"]]
    assert ("wake", ("resource", h.space, "pool", "gpu")) in [(e[0], e[1]) for e in h.effects]
    assert h.err("permit.acquire", permit_id=permit_id, run_id=run_id, units=1, lease_ms=LEASE_MS) == "SCOPE_CANCELLED"
    # Running work learns of the stop from its renewal; a release after it is a lost lease (ignored).
    grant = {"grant_id": ended["grant_id"], "token": ended["token"]}
    assert h.err("permit.renew", **grant, lease_ms=LEASE_MS) == "SCOPE_CANCELLED"
    assert h.err("permit.release", **grant) == "STALE_CLAIM"
    assert round_trip(h.state).stopped_grant_runs == {ended["grant_id"]: run_id}
    h.advance(1_000)
    h.tick()  # the run is removed, and what it remembered of its grants with it
    assert run_id not in h.state.runs and h.state.stopped_grant_runs == {}
    assert h.err("permit.renew", **grant, lease_ms=LEASE_MS) == "STALE_CLAIM"


def test_a_runs_grants_are_indexed_pruned_and_rebuilt_on_restore(h: Harness, run_id: str) -> None:
    """A run's stop ends its grants from the run's own list (no scan of every lease): the list
    drops ended grants as it grows, and a restored state rebuilds it from the live grants."""
    permit_id = create(h, units=2)
    for _ in range(70):
        grant = acquire(h, permit_id, run_id)
        h.ok("permit.release", grant_id=grant["grant_id"], token=grant["token"])
    run = h.state.runs[run_id]
    assert len(run.permit_grants) < 70 - 32  # pruned at 64
    live = acquire(h, permit_id, run_id)
    h.core.state = round_trip(h.state)
    assert h.state.runs[run_id].permit_grants == [live["grant_id"]]
    h.cancel(run_id)
    assert view(h, permit_id)["grants"] == []


def test_snapshot_round_trip_with_grants(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=3)
    acquire(h, permit_id, run_id, units=2)
    restored = round_trip(h.state)
    assert restored == h.state
    assert restored.permit_ids == h.state.permit_ids == {permit_id: f"{h.space}/gpu"}
    assert snapshot_bytes(restored) == snapshot_bytes(h.state)


def test_a_pool_from_before_permit_ids_gets_a_derived_id(h: Harness, run_id: str) -> None:
    h.ok("pool.ensure", name="browser", size=1)
    h.ok("pool.acquire", name="browser", run_id=run_id, lease_ms=LEASE_MS, holder="w")
    old = unpack(pack(to_snapshot(h.state)))
    old["pools"] = [row[:-2] for row in old["pools"]]  # no public_id, waiters
    old["slot_leases"] = [row[:-2] for row in old["slot_leases"]]  # no token, holder_session
    # A run row from before permit waiters: it stops before them (the queues come last).
    old["runs"] = [row[: _RUN_FIELDS.index("permit_waiters")] + row[-1:] for row in old["runs"]]
    del old["permit_waiters"]
    one, two = from_snapshot(old), from_snapshot(unpack(pack(old)))
    (permit_id,) = one.permit_ids
    assert permit_id.startswith("prm_") and permit_id != h.state.pools[f"{h.space}/browser"].public_id
    assert two.permit_ids == one.permit_ids  # the same on every replica
    pool = permits.find(one, h.space, permit_id)
    assert pool is not None and permits.view(one, pool)["unitsInUse"] == 1


@pytest.mark.parametrize("units", [0, -1, 1.5, "2", None])
def test_units_are_validated(h: Harness, units: Any) -> None:
    assert h.err("permit.create", name="gpu", units=units) == "VALIDATION_FAILED"


# -- waiters -------------------------------------------------------------------------------------


def wait(h: Harness, permit_id: str, run_id: str, units: int = 1, ttl_ms: int | None = None) -> dict[str, Any]:
    return h.ok("permit.wait", permit_id=permit_id, run_id=run_id, units=units, holder="w", ttl_ms=ttl_ms)


def waiter_state(h: Harness, waiter_id: str) -> str:
    view = permits.waiter_view(h.state, h.space, waiter_id)
    assert view is not None
    return str(view["state"])


def test_waiters_are_signaled_in_order_and_their_units_set_aside(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=2)
    first = acquire(h, permit_id, run_id, units=2)
    big, small = wait(h, permit_id, run_id, units=2), wait(h, permit_id, run_id, units=1)
    assert big["state"] == small["state"] == "WAITING"
    assert acquire(h, permit_id, run_id)["granted"] is False  # strict FIFO: waiters are in line
    h.ok("permit.release", grant_id=first["grant_id"], token=first["token"])
    assert (waiter_state(h, big["waiter_id"]), waiter_state(h, small["waiter_id"])) == ("SIGNALED", "WAITING")
    assert view(h, permit_id)["unitsInUse"] == 0
    assert acquire(h, permit_id, run_id)["granted"] is False  # the 2 units are set aside for the head
    taken = acquire(h, permit_id, run_id, waiter_id=big["waiter_id"])
    assert taken["granted"] is True and taken["units"] == 2
    assert waiter_state(h, big["waiter_id"]) == "GRANTED"
    h.ok("permit.release", grant_id=taken["grant_id"], token=taken["token"])
    assert waiter_state(h, small["waiter_id"]) == "SIGNALED"
    assert [w["state"] for w in view(h, permit_id)["waiters"]] == ["SIGNALED"]


def test_acquire_for_a_waiter_not_signaled_grants_nothing(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=1)
    acquire(h, permit_id, run_id)
    waiter = wait(h, permit_id, run_id)
    assert acquire(h, permit_id, run_id, waiter_id=waiter["waiter_id"])["granted"] is False
    other = create(h, "cpu", units=1)
    assert h.err(
        "permit.acquire", permit_id=other, run_id=run_id, units=1, lease_ms=LEASE_MS, waiter_id=waiter["waiter_id"]
    ) == "VALIDATION_FAILED"
    assert h.err(
        "permit.acquire", permit_id=permit_id, run_id=run_id, units=1, lease_ms=LEASE_MS, waiter_id="pwt_nope"
    ) == "NOT_FOUND"


def test_a_waiter_is_signaled_at_once_when_there_is_room(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=2)
    assert wait(h, permit_id, run_id)["state"] == "SIGNALED"


def test_cancel_returns_the_set_aside_units_and_the_line_moves_on(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=1)
    grant = acquire(h, permit_id, run_id)
    one, two = wait(h, permit_id, run_id), wait(h, permit_id, run_id)
    h.ok("permit.release", grant_id=grant["grant_id"], token=grant["token"])
    assert waiter_state(h, one["waiter_id"]) == "SIGNALED"
    assert h.ok("permit_waiter.cancel", waiter_id=one["waiter_id"])["state"] == "CANCELLED"
    assert waiter_state(h, two["waiter_id"]) == "SIGNALED"
    assert h.ok("permit_waiter.cancel", waiter_id=one["waiter_id"])["state"] == "CANCELLED"  # ended: kept as is
    assert h.err("permit_waiter.cancel", waiter_id="pwt_nope") == "NOT_FOUND"


def test_a_waiter_expires_after_its_ttl_and_a_signal_not_taken_in_time(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=1)
    grant = acquire(h, permit_id, run_id)
    short = wait(h, permit_id, run_id, ttl_ms=1_000)
    h.advance(1_000)
    h.tick()
    assert waiter_state(h, short["waiter_id"]) == "EXPIRED"
    waiter = wait(h, permit_id, run_id)
    h.ok("permit.release", grant_id=grant["grant_id"], token=grant["token"])
    assert waiter_state(h, waiter["waiter_id"]) == "SIGNALED"
    h.advance(limits.permit_waiter_signaled_ms)
    h.tick()
    assert waiter_state(h, waiter["waiter_id"]) == "EXPIRED"
    assert acquire(h, permit_id, run_id)["granted"] is True  # nothing set aside any more


def test_a_run_stop_cancels_its_waiters_and_removal_forgets_them(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=1)
    other_run = h.create_run()
    acquire(h, permit_id, run_id)
    mine, theirs = wait(h, permit_id, run_id), wait(h, permit_id, other_run)
    h.cancel(run_id, retention_ms=1_000)
    assert waiter_state(h, mine["waiter_id"]) == "CANCELLED"
    assert waiter_state(h, theirs["waiter_id"]) == "SIGNALED"  # the stopped run's grant returned
    assert h.err("permit.wait", permit_id=permit_id, run_id=run_id, units=1) == "SCOPE_CANCELLED"
    h.advance(1_000)
    h.tick()
    assert mine["waiter_id"] not in h.state.permit_waiters
    assert theirs["waiter_id"] in h.state.permit_waiters


def test_a_signaled_waiter_holds_units_back_from_jobs(h: Harness, run_id: str) -> None:
    permit_id = create(h, "browser", units=1)
    grant = acquire(h, permit_id, run_id)
    waiter = wait(h, permit_id, run_id)
    h.ok("task.submit", **{**h.submit_args(run_id, "a"), "needs": {"slots": ["browser"]}})
    h.ok("permit.release", grant_id=grant["grant_id"], token=grant["token"])
    assert waiter_state(h, waiter["waiter_id"]) == "SIGNALED"
    assert h.receive(run_id) == []
    h.ok("permit_waiter.cancel", waiter_id=waiter["waiter_id"])
    assert len(h.receive(run_id)) == 1


def test_a_waiting_waiter_holds_back_jobs_and_they_run_once_the_line_is_empty(h: Harness, run_id: str) -> None:
    """A job does not jump the line: a waiter for 2 of 2 units waits for both, and the unit that
    returns first is not taken by a job meanwhile. Once the line is empty (here: the waiter
    expires), the blocked job is woken and delivered."""
    permit_id = create(h, "browser", units=2)
    grant = acquire(h, permit_id, run_id)
    waiter = wait(h, permit_id, run_id, units=2, ttl_ms=5_000)
    h.ok("task.submit", **{**h.submit_args(run_id, "a"), "needs": {"slots": ["browser"]}})
    assert waiter_state(h, waiter["waiter_id"]) == "WAITING"
    assert h.receive(run_id) == []  # a unit is free, but the waiter is first in line
    h.advance(5_000)
    h.tick()
    assert waiter_state(h, waiter["waiter_id"]) == "EXPIRED"
    assert len(h.receive(run_id)) == 1
    h.ok("permit.release", grant_id=grant["grant_id"], token=grant["token"])


def test_waiters_are_bounded(h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    permit_id = create(h, units=1)
    acquire(h, permit_id, run_id)
    monkeypatch.setattr(limits, "permit_waiters_per_permit_max", 2)
    wait(h, permit_id, run_id)
    wait(h, permit_id, run_id)
    assert h.err("permit.wait", permit_id=permit_id, run_id=run_id, units=1) == "LIMIT_EXCEEDED"


def test_snapshot_round_trip_with_waiters(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=1)
    acquire(h, permit_id, run_id)
    wait(h, permit_id, run_id)
    restored = round_trip(h.state)
    assert restored == h.state
    assert snapshot_bytes(restored) == snapshot_bytes(h.state)


def test_the_pool_routes_cannot_end_a_grant_without_its_token(h: Harness, run_id: str) -> None:
    permit_id = create(h, units=1)
    grant = acquire(h, permit_id, run_id)
    assert h.err("pool.release", lease_id=grant["grant_id"]) == "CONFLICT"
    assert h.err("pool.renew", lease_id=grant["grant_id"], lease_ms=LEASE_MS) == "CONFLICT"
