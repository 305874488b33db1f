"""Rules of claims, the fenced mutex leases (runstate_server.actors.claims)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runstate_server.actors import errors
from runstate_server.actors.claims import Claim
from runstate_server.actors.storage import json_value
from tests.test_actors_harness import (
    RETENTION_MS,
    Harness,
    assert_stored_bytes_recount,
    round_trip,
    snapshot_bytes,
)

LEASE_MS = 10_000
KEY = "locks/report"


@pytest.fixture
def h() -> Harness:
    return Harness()


@pytest.fixture
def run_id(h: Harness) -> str:
    return h.create_run()


def acquire(h: Harness, run_id: str, key: str = KEY, holder: str = "w1", **args: Any) -> dict[str, Any]:
    return h.ok(
        "claim.acquire", run_id=run_id, key=key, lease_ms=args.pop("lease_ms", LEASE_MS), holder=holder,
        holder_session=args.pop("holder_session", f"{holder}-s"), **args,
    )


def claim(h: Harness, run_id: str, key: str = KEY) -> Claim:
    found: Claim = h.state.claims[h.run(run_id).claims[key]]
    return found


def on(granted: dict[str, Any], key: str = KEY) -> dict[str, Any]:
    return {"key": key, "token": granted["token"]}


def test_held_until_released_then_the_next_generation(h: Harness, run_id: str) -> None:
    first = acquire(h, run_id)
    assert (first["generation"], first["holder"], first["holder_session"]) == (1, "w1", "w1-s")
    assert first["lease_expires_ms"] == h.now_ms + LEASE_MS
    assert first["token"].startswith(claim(h, run_id).id + ".1.")
    for holder in ("w2", "w1"):  # not re-entrant: the holder's own session is refused too
        refused = h.apply("claim.acquire", run_id=run_id, key=KEY, lease_ms=LEASE_MS, holder=holder, holder_session="w1-s")
        assert refused["error"]["code"] == errors.CLAIM_HELD
        assert refused["error"]["retryAfterMs"] == LEASE_MS  # until the lease runs out
    released = h.ok("claim.release", **on(first), observation={"rows": 3})
    assert (released["token"], json_value(claim(h, run_id).observation)) == (None, {"rows": 3})
    second = acquire(h, run_id, holder="w2")
    assert (second["generation"], second["holder"]) == (2, "w2")
    assert second["token"] != first["token"]


def test_different_keys_and_runs_are_different_claims(h: Harness, run_id: str) -> None:
    acquire(h, run_id, key="a")
    assert acquire(h, run_id, key="b")["generation"] == 1
    assert acquire(h, h.create_run(), key="a")["generation"] == 1


def test_a_stale_token_is_refused_and_changes_nothing(h: Harness, run_id: str) -> None:
    old = acquire(h, run_id)
    h.ok("claim.release", **on(old))
    current = acquire(h, run_id, holder="w2")
    before = snapshot_bytes(h.state, without_clock=True)
    for args in (on(old), {**on(current), "token": current["token"][:-1]}, on(current, "other"), {"key": KEY, "token": 7},
                 {"key": KEY, "token": "clm_nothing.1.x"}):
        assert h.err("claim.renew", **args, lease_ms=LEASE_MS) == errors.STALE_CLAIM
        assert h.err("claim.release", **args) == errors.STALE_CLAIM
    assert h.apply("claim.release", space="elsewhere", **on(current))["error"]["code"] == errors.STALE_CLAIM
    assert snapshot_bytes(h.state, without_clock=True) == before


def test_a_lapse_frees_the_claim_and_keeps_the_generation(h: Harness, run_id: str) -> None:
    old = acquire(h, run_id)
    h.advance(LEASE_MS)
    assert h.err("claim.renew", **on(old), lease_ms=LEASE_MS) == errors.STALE_CLAIM  # before its tick too
    h.tick()
    assert (claim(h, run_id).token, claim(h, run_id).generation) == (None, 1)
    assert acquire(h, run_id, holder="w2")["generation"] == 2
    assert h.err("claim.release", **on(old)) == errors.STALE_CLAIM


def test_an_expired_lease_is_taken_over_even_before_its_tick(h: Harness, run_id: str) -> None:
    old = acquire(h, run_id)
    h.advance(LEASE_MS)
    assert acquire(h, run_id, holder="w2")["generation"] == 2
    h.tick()  # the old grant's due entry finds a newer grant: nothing happens
    assert claim(h, run_id).holder == "w2" and claim(h, run_id).token is not None
    assert h.err("claim.release", **on(old)) == errors.STALE_CLAIM


def test_renew_extends_from_now_with_the_last_length_by_default(h: Harness, run_id: str) -> None:
    granted = acquire(h, run_id)
    h.advance(LEASE_MS - 1)
    assert h.ok("claim.renew", **on(granted))["lease_expires_ms"] == h.now_ms + LEASE_MS
    h.advance(LEASE_MS - 1)
    assert h.ok("claim.renew", **on(granted), lease_ms=2 * LEASE_MS)["lease_expires_ms"] == h.now_ms + 2 * LEASE_MS
    h.advance(LEASE_MS)
    h.tick()
    assert claim(h, run_id).token == granted["token"]


def test_a_stopped_run_refuses_acquire_and_renew_but_not_release(h: Harness, run_id: str) -> None:
    held = acquire(h, run_id)
    h.cancel(run_id)
    assert h.err("claim.acquire", run_id=run_id, key="new", lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED
    assert h.err("claim.renew", **on(held), lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED
    h.ok("claim.release", **on(held))


def test_claims_go_with_their_run_at_retention(h: Harness, run_id: str) -> None:
    acquire(h, run_id)
    h.cancel(run_id)
    h.advance(RETENTION_MS)
    h.tick()
    assert h.state.claims == {} and run_id not in h.state.runs


def test_a_new_leader_extends_held_leases(h: Harness, run_id: str) -> None:
    granted = acquire(h, run_id)
    h.advance(LEASE_MS - 1_000)
    h.epoch = 2
    h.ok("leader.start")
    assert claim(h, run_id).lease_expires_ms == h.now_ms + LEASE_MS
    h.advance(5_000)
    h.tick()
    h.ok("claim.renew", **on(granted))


def test_claims_survive_a_snapshot_generation_included(h: Harness, run_id: str) -> None:
    for _ in range(3):
        h.ok("claim.release", **on(acquire(h, run_id)))
    held = acquire(h, run_id, key="other")
    restored = round_trip(h.state)
    assert restored.claims == h.state.claims
    assert restored.runs[run_id].claims == h.run(run_id).claims
    h.core.state = restored
    assert acquire(h, run_id)["generation"] == 4
    h.ok("claim.release", **on(held, "other"))


def test_unknown_runs_and_spaces(h: Harness, run_id: str) -> None:
    assert h.err("claim.acquire", run_id="run_nope", key=KEY, lease_ms=LEASE_MS) == errors.NOT_FOUND
    other_space = h.apply("claim.acquire", space="elsewhere", run_id=run_id, key=KEY, lease_ms=LEASE_MS)
    assert other_space["error"]["code"] == errors.NOT_FOUND


# A random history of acquires, renewals, releases (current or stale tokens), time and ticks: the
# generation of a claim never decreases and grows by one on each grant, at most one token is live
# per claim, and every grant is refused while another lease is live.
_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["acquire", "renew", "release", "advance"]),
        st.sampled_from(["a", "b"]),
        st.integers(0, 8),  # which token (of those granted so far) a renew or release presents
        st.sampled_from([0, 1_000, 5_000, 10_000]),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(steps=_STEPS)
def test_generations_only_grow_and_one_lease_is_live(steps: list[tuple[str, str, int, int]]) -> None:
    h = Harness()
    run_id = h.create_run()
    tokens: list[dict[str, Any]] = []
    generations: dict[str, int] = {}
    for action, key, pick, ms in steps:
        if action == "acquire":
            existing = h.state.claims.get(h.run(run_id).claims.get(key, ""))
            live = existing is not None and existing.token is not None and h.now_ms < existing.lease_expires_ms
            result = h.apply("claim.acquire", run_id=run_id, key=key, lease_ms=5_000, holder="w")
            if live:
                assert result["error"]["code"] == errors.CLAIM_HELD
            else:
                assert result["generation"] == generations.get(key, 0) + 1
                generations[key] = result["generation"]
                tokens.append({"key": key, "token": result["token"]})
        elif action in ("renew", "release") and tokens:
            h.apply("claim." + action, **tokens[pick % len(tokens)])
        else:
            h.advance(ms)
            h.tick()
        for key_, generation in generations.items():
            found = claim(h, run_id, key_)
            assert found.generation == generation
            assert found.token is None or found.token.startswith(f"{found.id}.{generation}.")
        assert_stored_bytes_recount(h.state)
