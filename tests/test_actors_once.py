"""Rules of once (runstate_server.actors.once) and of the space's default run."""

from __future__ import annotations

from typing import Any

import pytest

from runstate_server.actors import errors
from runstate_server.actors.state import _RUN_FIELDS, Once, OnceState, from_snapshot, to_snapshot
from runstate_server.actors.storage import json_value
from tests.test_actors_harness import RETENTION_MS, Harness, pack, round_trip, snapshot_bytes, unpack

LEASE_MS = 10_000
KEY = "research:0123456789abcdef0123456789abcdef"


@pytest.fixture
def h() -> Harness:
    return Harness()


@pytest.fixture
def run_id(h: Harness) -> str:
    return h.create_run()


def acquire(h: Harness, run_id: str, key: str = KEY, holder: str = "w1", **args: Any) -> dict[str, Any]:
    return h.ok("once.acquire", run_id=run_id, key=key, lease_ms=args.pop("lease_ms", LEASE_MS), holder=holder, **args)


def entry(h: Harness, run_id: str, key: str = KEY) -> Once:
    return h.state.once[h.run(run_id).once[key]]


def on(run_id: str, granted: dict[str, Any], key: str = KEY) -> dict[str, Any]:
    """The arguments naming the lease `granted` of (run, key)."""
    return {"run_id": run_id, "key": key, "token": granted["token"]}


def test_the_first_caller_is_granted_the_others_see_it_held(h: Harness, run_id: str) -> None:
    first = acquire(h, run_id, holder_session="s1")
    assert (first["state"], first["attempts"]) == ("GRANTED", 0)
    held = entry(h, run_id)
    assert (held.state, held.attempt, held.holder, held.holder_session, held.token) == (
        OnceState.HELD, 1, "w1", "s1", first["token"]
    )
    assert held.token is not None
    assert held.token.startswith(held.id + ".1.") and len(held.token.split(".")[2]) == 16  # the command's id
    assert acquire(h, run_id, holder="w2")["state"] == "HELD"
    assert entry(h, run_id).holder == "w1"


def test_a_result_is_recorded_once_and_given_to_everyone(h: Harness, run_id: str) -> None:
    granted = acquire(h, run_id)
    assert h.ok("once.complete", **on(run_id, granted), result={"report": 1})["state"] == "DONE"
    assert ("once", run_id, KEY) in h.woken()
    done = acquire(h, run_id, holder="w2")
    assert (done["state"], json_value(done["result"])) == ("DONE", {"report": 1})
    assert (entry(h, run_id).state, json_value(entry(h, run_id).result)) == (OnceState.DONE, {"report": 1})
    # The same complete again is answered again; it changes nothing.
    before = snapshot_bytes(h.state, without_clock=True)
    assert h.ok("once.complete", **on(run_id, granted), result={"report": 2})["result"] == b"{\"report\":1}"
    assert snapshot_bytes(h.state, without_clock=True) == before


def test_different_keys_are_different_entries(h: Harness, run_id: str) -> None:
    assert acquire(h, run_id, key="a")["state"] == "GRANTED"
    assert acquire(h, run_id, key="b", holder="w2")["state"] == "GRANTED"
    assert acquire(h, h.create_run(), key="a", holder="w3")["state"] == "GRANTED"  # another run


def test_a_failure_opens_the_entry_until_the_limit_it_names_is_reached(h: Harness, run_id: str) -> None:
    for attempt in (1, 2):
        granted = acquire(h, run_id, holder=f"w{attempt}")
        assert (entry(h, run_id).attempt, granted["attempts"]) == (attempt, attempt - 1)
        answer = h.ok("once.fail", **on(run_id, granted), error=f"boom {attempt}", max_attempts=3)
        assert (answer["state"], answer["attempts"], answer["last_error"]) == ("OPEN", attempt, f"boom {attempt}")
    last = acquire(h, run_id, holder="w3")
    assert h.ok("once.fail", **on(run_id, last), error="boom 3", max_attempts=3)["state"] == "FAILED"
    failed = entry(h, run_id)
    assert (failed.state, failed.failures, failed.error) == (OnceState.FAILED, 3, "boom 3")
    answer = acquire(h, run_id, holder="w4")  # for everyone, until the run ends
    assert (answer["state"], answer["attempts"], answer["last_error"]) == ("FAILED", 3, "boom 3")


def test_the_limit_is_the_one_the_failure_names(h: Harness, run_id: str) -> None:
    first = acquire(h, run_id, max_attempts=5)  # an acquire's limit is replaced by a failure's
    assert h.ok("once.fail", **on(run_id, first), error="boom", max_attempts=1)["state"] == "FAILED"
    other = acquire(h, run_id, key="other")
    assert h.ok("once.fail", **on(run_id, other, "other"), error="boom")["state"] == "OPEN"  # default 3
    assert entry(h, run_id, "other").max_attempts == 3


def test_a_lapse_is_checked_against_the_last_limit_named(h: Harness, run_id: str) -> None:
    acquire(h, run_id)  # no limit named yet: a lapse never ends the entry
    h.advance(LEASE_MS)
    h.tick()
    assert (entry(h, run_id).state, entry(h, run_id).failures) == (OnceState.OPEN, 1)
    acquire(h, run_id, max_attempts=2)
    h.advance(LEASE_MS)
    h.tick()
    assert (entry(h, run_id).state, entry(h, run_id).failures) == (OnceState.FAILED, 2)


def test_release_counts_no_attempt(h: Harness, run_id: str) -> None:
    granted = acquire(h, run_id)
    h.ok("once.release", **on(run_id, granted))
    assert entry(h, run_id).state == OnceState.OPEN
    assert acquire(h, run_id, holder="w2")["state"] == "GRANTED"
    assert entry(h, run_id).attempt == 1


def test_a_lapsed_lease_is_taken_over_and_the_late_holder_refused(h: Harness, run_id: str) -> None:
    old = acquire(h, run_id)
    h.advance(LEASE_MS)
    h.tick()
    assert (entry(h, run_id).state, entry(h, run_id).failures) == (OnceState.OPEN, 1)
    assert entry(h, run_id).error == "lease expired (holder w1)"
    new = acquire(h, run_id, holder="w2")
    assert (new["state"], entry(h, run_id).attempt) == ("GRANTED", 2)
    before = snapshot_bytes(h.state, without_clock=True)
    for kind, args in (("complete", {"result": "late"}), ("renew", {"lease_ms": LEASE_MS}), ("fail", {}), ("release", {})):
        assert h.err("once." + kind, **on(run_id, old), **args) == errors.STALE_CLAIM
        forged = {**on(run_id, new), "token": new["token"][:-1]}
        assert h.err("once." + kind, **forged, **args) == errors.STALE_CLAIM
        assert h.err("once." + kind, **on(run_id, new, "other key"), **args) == errors.STALE_CLAIM
    assert snapshot_bytes(h.state, without_clock=True) == before
    h.ok("once.complete", **on(run_id, new), result="on time")
    assert json_value(entry(h, run_id).result) == "on time"


def test_an_expired_lease_is_taken_over_even_before_its_tick(h: Harness, run_id: str) -> None:
    old = acquire(h, run_id)
    h.advance(LEASE_MS)
    assert acquire(h, run_id, holder="w2")["state"] == "GRANTED"
    assert entry(h, run_id).attempt == 2
    assert h.err("once.complete", **on(run_id, old), result="late") == errors.STALE_CLAIM


def test_renew_keeps_the_lease_past_its_first_expiry(h: Harness, run_id: str) -> None:
    granted = acquire(h, run_id)
    h.advance(LEASE_MS - 1)
    assert h.ok("once.renew", **on(run_id, granted), lease_ms=LEASE_MS)["lease_expires_ms"] == h.now_ms + LEASE_MS
    h.advance(5_000)
    h.tick()
    assert entry(h, run_id).state == OnceState.HELD
    h.ok("once.complete", **on(run_id, granted), result=1)


def test_a_stopped_run_refuses_new_work_and_keeps_results(h: Harness, run_id: str) -> None:
    h.ok("once.complete", **on(run_id, acquire(h, run_id, key="done"), "done"), result="kept")
    held = acquire(h, run_id, key="held")
    h.cancel(run_id)
    assert ("once", run_id, "held") in h.woken()  # waiting callers look again
    done = acquire(h, run_id, key="done")
    assert (done["state"], done["run_effective"]) == ("DONE", "INACTIVE")
    assert h.err("once.acquire", run_id=run_id, key="new", lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED
    assert h.err("once.renew", **on(run_id, held, "held"), lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED
    assert h.err("once.complete", **on(run_id, held, "held"), result=1) == errors.SCOPE_CANCELLED
    h.ok("once.release", **on(run_id, held, "held"))  # handing back stays allowed
    assert h.err("once.acquire", run_id=run_id, key="held", lease_ms=LEASE_MS) == errors.SCOPE_CANCELLED


def test_entries_go_with_their_run_at_retention(h: Harness, run_id: str) -> None:
    acquire(h, run_id)
    h.cancel(run_id)
    h.advance(RETENTION_MS)
    h.tick()
    assert h.state.once == {} and run_id not in h.state.runs


def test_a_new_leader_extends_held_leases(h: Harness, run_id: str) -> None:
    granted = acquire(h, run_id)
    h.advance(LEASE_MS - 1_000)
    h.epoch = 2
    h.ok("leader.start")
    assert entry(h, run_id).lease_expires_ms == h.now_ms + LEASE_MS
    h.advance(5_000)
    h.tick()
    h.ok("once.complete", **on(run_id, granted), result="kept")


def test_bad_once_commands_change_nothing(h: Harness, run_id: str) -> None:
    assert h.err("once.acquire", run_id="run_nope", key=KEY, lease_ms=LEASE_MS) == errors.NOT_FOUND
    assert h.err("once.acquire", run_id=run_id, key=KEY, lease_ms=LEASE_MS, max_attempts=0) == errors.VALIDATION_FAILED
    assert h.err("once.acquire", run_id=run_id, key=KEY, lease_ms=LEASE_MS, max_attempts=True) == errors.VALIDATION_FAILED
    granted = acquire(h, run_id)
    assert h.err("once.fail", **on(run_id, granted), max_attempts=101) == errors.VALIDATION_FAILED
    assert h.err("once.complete", run_id="run_nope", key=KEY, token=granted["token"], result=1) == errors.NOT_FOUND
    assert h.err("once.complete", run_id=run_id, key=KEY, token=7, result=1) == errors.STALE_CLAIM
    other_space = h.apply("once.acquire", space="elsewhere", run_id=run_id, key=KEY, lease_ms=LEASE_MS)
    assert other_space["error"]["code"] == errors.NOT_FOUND


def test_entries_survive_a_snapshot(h: Harness, run_id: str) -> None:
    granted = acquire(h, run_id)
    acquire(h, run_id, key="other")
    restored = round_trip(h.state)
    assert restored.once == h.state.once
    assert restored.runs[run_id].once == h.run(run_id).once
    h.core.state = restored
    h.ok("once.complete", **on(run_id, granted), result="after restore")


def test_a_snapshot_from_before_once_and_claims_were_split_still_loads(h: Harness, run_id: str) -> None:
    """Such a snapshot keeps the once entries under "claims" (without holder_session), and its
    run rows end before the claims index."""
    granted = acquire(h, run_id)
    snapshot = unpack(pack(to_snapshot(h.state)))
    assert snapshot["claims"] == []
    snapshot["claims"] = [row[:-1] for row in snapshot.pop("once")]
    snapshot["runs"] = [row[: _RUN_FIELDS.index("claims")] + row[-1:] for row in snapshot["runs"]]  # the queues come last
    restored = from_snapshot(snapshot)
    assert restored.claims == {} and restored.runs[run_id].claims == {}
    assert restored.once[h.run(run_id).once[KEY]].token == granted["token"]
    h.core.state = restored
    h.ok("once.complete", **on(run_id, granted), result="after an old snapshot")


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
