"""Rules of claims (runstate_server.actors.claims) and of the space's default run."""

from __future__ import annotations

from typing import Any

import pytest

from runstate_server.actors import errors
from runstate_server.actors.state import Claim, ClaimState
from tests.test_actors_harness import RETENTION_MS, Harness, round_trip, snapshot_bytes

LEASE_MS = 10_000
KEY = "research:0123456789abcdef0123456789abcdef"


@pytest.fixture
def h() -> Harness:
    return Harness()


@pytest.fixture
def run_id(h: Harness) -> str:
    return h.create_run()


def acquire(h: Harness, run_id: str, key: str = KEY, holder: str = "w1", **args: Any) -> dict[str, Any]:
    return h.ok("claim.acquire", run_id=run_id, key=key, lease_ms=args.pop("lease_ms", LEASE_MS), holder=holder, **args)


def claim(h: Harness, run_id: str, key: str = KEY) -> Claim:
    return h.state.claims[h.run(run_id).claims[key]]


def test_the_first_caller_is_granted_the_others_see_it_held(h: Harness, run_id: str) -> None:
    first = acquire(h, run_id, attempts=5)
    assert first["outcome"] == "GRANTED"
    held = claim(h, run_id)
    assert (held.state, held.attempt, held.attempts, held.holder, held.lease_id) == (
        ClaimState.HELD, 1, 5, "w1", first["lease_id"]
    )
    assert acquire(h, run_id, holder="w2") == {"outcome": "HELD", "claim_id": held.id}
    assert claim(h, run_id).holder == "w1"


def test_a_result_is_recorded_once_and_given_to_everyone(h: Harness, run_id: str) -> None:
    lease = acquire(h, run_id)["lease_id"]
    assert h.ok("claim.complete", lease_id=lease, result={"report": 1})["claim_id"] == claim(h, run_id).id
    assert ("claim", run_id, KEY) in h.woken()
    assert acquire(h, run_id, holder="w2")["outcome"] == "DONE"
    assert (claim(h, run_id).state, claim(h, run_id).result) == (ClaimState.DONE, {"report": 1})
    # The same complete again is answered again; it changes nothing.
    before = snapshot_bytes(h.state, without_clock=True)
    h.ok("claim.complete", lease_id=lease, result={"report": 2})
    assert snapshot_bytes(h.state, without_clock=True) == before


def test_different_keys_are_different_claims(h: Harness, run_id: str) -> None:
    assert acquire(h, run_id, key="a")["outcome"] == "GRANTED"
    assert acquire(h, run_id, key="b", holder="w2")["outcome"] == "GRANTED"
    assert acquire(h, h.create_run(), key="a", holder="w3")["outcome"] == "GRANTED"  # another run


def test_a_failure_frees_the_claim_for_the_next_caller_until_the_attempts_are_used(h: Harness, run_id: str) -> None:
    for attempt in (1, 2):
        granted = acquire(h, run_id, holder=f"w{attempt}", attempts=3)
        assert claim(h, run_id).attempt == attempt
        h.ok("claim.fail", lease_id=granted["lease_id"], error=f"boom {attempt}")
        assert (claim(h, run_id).state, claim(h, run_id).error) == (ClaimState.FREE, f"boom {attempt}")
    last = acquire(h, run_id, holder="w3")
    h.ok("claim.fail", lease_id=last["lease_id"], error="boom 3")
    failed = claim(h, run_id)
    assert (failed.state, failed.failures, failed.error) == (ClaimState.FAILED, 3, "boom 3")
    assert acquire(h, run_id, holder="w4")["outcome"] == "FAILED"  # for everyone, until the run ends


def test_release_counts_no_attempt(h: Harness, run_id: str) -> None:
    lease = acquire(h, run_id)["lease_id"]
    h.ok("claim.release", lease_id=lease)
    assert claim(h, run_id).state == ClaimState.FREE
    assert acquire(h, run_id, holder="w2")["outcome"] == "GRANTED"
    assert claim(h, run_id).attempt == 1


def test_a_lapsed_lease_is_taken_over_and_the_late_holder_refused(h: Harness, run_id: str) -> None:
    old = acquire(h, run_id)["lease_id"]
    h.advance(LEASE_MS)
    h.tick()
    assert (claim(h, run_id).state, claim(h, run_id).failures) == (ClaimState.FREE, 1)
    assert claim(h, run_id).error == "lease expired (holder w1)"
    new = acquire(h, run_id, holder="w2")
    assert (new["outcome"], claim(h, run_id).attempt) == ("GRANTED", 2)
    for kind, args in (("complete", {"result": "late"}), ("renew", {"lease_ms": LEASE_MS}), ("fail", {}), ("release", {})):
        assert h.err("claim." + kind, lease_id=old, **args) == errors.STALE_CLAIM
    h.ok("claim.complete", lease_id=new["lease_id"], result="on time")
    assert claim(h, run_id).result == "on time"


def test_an_expired_lease_is_taken_over_even_before_its_tick(h: Harness, run_id: str) -> None:
    old = acquire(h, run_id)["lease_id"]
    h.advance(LEASE_MS)
    assert acquire(h, run_id, holder="w2")["outcome"] == "GRANTED"
    assert claim(h, run_id).attempt == 2
    assert h.err("claim.complete", lease_id=old, result="late") == errors.STALE_CLAIM


def test_renew_keeps_the_lease_past_its_first_expiry(h: Harness, run_id: str) -> None:
    lease = acquire(h, run_id)["lease_id"]
    h.advance(LEASE_MS - 1)
    h.ok("claim.renew", lease_id=lease, lease_ms=LEASE_MS)
    h.advance(5_000)
    h.tick()
    assert claim(h, run_id).state == ClaimState.HELD
    h.ok("claim.complete", lease_id=lease, result=1)


def test_a_stopped_run_refuses_new_claims_and_keeps_results(h: Harness, run_id: str) -> None:
    done = acquire(h, run_id, key="done")["lease_id"]
    h.ok("claim.complete", lease_id=done, result="kept")
    held = acquire(h, run_id, key="held")["lease_id"]
    h.cancel(run_id)
    assert ("claim", run_id, "held") in h.woken()  # waiting callers look again
    assert acquire(h, run_id, key="done")["outcome"] == "DONE"
    assert h.err("claim.acquire", run_id=run_id, key="new", lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED
    assert h.err("claim.renew", lease_id=held, lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED
    assert h.err("claim.complete", lease_id=held, result=1) == errors.SCOPE_CANCELLED
    h.ok("claim.release", lease_id=held)  # handing back stays allowed
    assert h.err("claim.acquire", run_id=run_id, key="held", lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED


def test_claims_go_with_their_run_at_retention(h: Harness, run_id: str) -> None:
    acquire(h, run_id)
    h.cancel(run_id)
    h.advance(RETENTION_MS)
    h.tick()
    assert h.state.claims == {} and run_id not in h.state.runs


def test_a_new_leader_extends_held_claim_leases(h: Harness, run_id: str) -> None:
    lease = acquire(h, run_id)["lease_id"]
    h.advance(LEASE_MS - 1_000)
    h.epoch = 2
    h.ok("leader.start")
    assert claim(h, run_id).lease_expires_ms == h.now_ms + LEASE_MS
    h.advance(5_000)
    h.tick()
    h.ok("claim.complete", lease_id=lease, result="kept")


def test_bad_claim_commands_change_nothing(h: Harness, run_id: str) -> None:
    assert h.err("claim.acquire", run_id="run_nope", key=KEY, lease_ms=LEASE_MS) == errors.NOT_FOUND
    assert h.err("claim.acquire", run_id=run_id, key=KEY, lease_ms=LEASE_MS, attempts=0) == errors.VALIDATION_FAILED
    assert h.err("claim.acquire", run_id=run_id, key=KEY, lease_ms=LEASE_MS, attempts=True) == errors.VALIDATION_FAILED
    assert h.err("claim.complete", lease_id="clm_nope.1.x", result=1) == errors.NOT_FOUND
    assert h.err("claim.complete", lease_id=7, result=1) == errors.NOT_FOUND
    other_space = h.apply("claim.acquire", space="elsewhere", run_id=run_id, key=KEY, lease_ms=LEASE_MS)
    assert other_space["error"]["code"] == errors.NOT_FOUND


def test_claims_survive_a_snapshot(h: Harness, run_id: str) -> None:
    lease = acquire(h, run_id)["lease_id"]
    acquire(h, run_id, key="other")
    restored = round_trip(h.state)
    assert restored.claims == h.state.claims
    assert restored.runs[run_id].claims == h.run(run_id).claims
    h.core.state = restored
    h.ok("claim.complete", lease_id=lease, result="after restore")


def test_the_default_run_is_replaced_once_it_stopped(h: Harness) -> None:
    first = h.ok("run.named", name="default")
    assert first["created"] is True
    again = h.ok("run.named", name="default")
    assert (again["run_id"], again["created"]) == (first["run_id"], False)
    assert h.run(first["run_id"]).name == "default"
    h.cancel(first["run_id"])
    fresh = h.ok("run.named", name="default")
    assert fresh["created"] is True and fresh["run_id"] != first["run_id"]
    assert h.state.spaces[h.space].run_names["default"] == fresh["run_id"]
    assert round_trip(h.state).spaces[h.space].run_names["default"] == fresh["run_id"]
