"""Once entries of the core against a small model, driven by hypothesis.

One run, a few keys and holders; random acquires, renewals, results, failures (each naming its own
attempt limit, decided at fail time), releases (with current and stale tokens), time passing with
ticks, a new leader, and the run's cancellation. After every step the core's answer and every entry
must agree with the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runstate_server.actors.state import OnceState
from runstate_server.actors.storage import json_value
from tests.test_actors_harness import Harness, assert_stored_bytes_recount, round_trip

KEYS = ("a", "b", "c")
HOLDERS = ("w1", "w2", "w3")
LEASE_MS = (1_000, 3_000)
MAX_ATTEMPTS = st.integers(1, 3)


@dataclass
class ModelOnce:
    state: str = OnceState.OPEN
    max_attempts: int | None = None
    failures: int = 0
    attempt: int = 0
    lease: str | None = None
    lease_ms: int = 0
    expires: int = 0
    holder: str | None = None
    result: Any = None
    error: str | None = None
    finished_by: str | None = None


class Rejection(Exception):
    def __init__(self, code: str) -> None:
        self.code = code


class OnceMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(now_ms=1_000_000)
        self.run_id = self.h.create_run()
        self.cancelled = False
        self.epoch = 1
        self.entries: dict[str, ModelOnce] = {}
        self.leases: list[str] = []  # every token ever granted (current and stale)
        self.key_of_lease: dict[str, str] = {}

    # -- model helpers ---------------------------------------------------------------------------

    def require_lease(self, lease: str) -> ModelOnce:
        entry = self.entries[self.key_of_lease[lease]]
        if entry.lease != lease or entry.state != OnceState.HELD or self.h.now_ms >= entry.expires:
            raise Rejection("STALE_CLAIM")
        return entry

    def fail_attempt(self, entry: ModelOnce, error: str) -> None:
        entry.failures += 1
        entry.error = error
        used = entry.max_attempts is not None and entry.failures >= entry.max_attempts
        entry.state = OnceState.FAILED if used else OnceState.OPEN
        entry.lease = None

    def lease_args(self, lease: str) -> dict[str, Any]:
        return {"run_id": self.run_id, "key": self.key_of_lease[lease], "token": lease}

    def execute(self, kind: str, args: dict[str, Any], model: Any) -> Any:
        """Run the model; then the core; they must agree on success or the error code."""
        try:
            expected = model()
        except Rejection as rejection:
            result = self.h.apply(kind, epoch=self.epoch, **args)
            assert result.get("error", {}).get("code") == rejection.code, (kind, args, result)
            return None
        result = self.h.apply(kind, epoch=self.epoch, **args)
        assert "error" not in result, (kind, args, result, expected)
        return result, expected

    # -- rules -----------------------------------------------------------------------------------

    @rule(
        key=st.sampled_from(KEYS), holder=st.sampled_from(HOLDERS), lease_ms=st.sampled_from(LEASE_MS),
        max_attempts=st.none() | MAX_ATTEMPTS,
    )
    def acquire(self, key: str, holder: str, lease_ms: int, max_attempts: int | None) -> None:
        def model() -> str:
            entry = self.entries.get(key)
            if entry is not None and entry.state in (OnceState.DONE, OnceState.FAILED):
                return entry.state
            if self.cancelled:
                raise Rejection("SCOPE_CANCELLED")
            if entry is None:
                entry = self.entries[key] = ModelOnce()
            if entry.state == OnceState.HELD:
                if self.h.now_ms < entry.expires:
                    return "HELD"
                self.fail_attempt(entry, f"lease expired (holder {entry.holder})")
                if entry.state == OnceState.FAILED:
                    return OnceState.FAILED
            if max_attempts is not None:
                entry.max_attempts = max_attempts
            entry.state, entry.attempt, entry.holder = OnceState.HELD, entry.failures + 1, holder
            entry.lease_ms, entry.expires = lease_ms, self.h.now_ms + lease_ms
            return "GRANTED"

        args = {"run_id": self.run_id, "key": key, "lease_ms": lease_ms, "holder": holder, "max_attempts": max_attempts}
        answer = self.execute("once.acquire", args, model)
        if answer is None:
            return
        result, outcome = answer
        assert (result["state"], result["attempts"]) == (outcome, self.entries[key].failures)
        if outcome == "GRANTED":
            self.entries[key].lease = result["token"]
            self.key_of_lease[result["token"]] = key
            self.leases.append(result["token"])

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), payload=st.integers(0, 3))
    def complete(self, data: st.DataObject, payload: int) -> None:
        lease = data.draw(st.sampled_from(self.leases))

        def model() -> None:
            entry = self.entries[self.key_of_lease[lease]]
            if entry.state == OnceState.DONE and entry.finished_by == lease:
                return  # the same complete again
            entry = self.require_lease(lease)
            if self.cancelled:
                raise Rejection("SCOPE_CANCELLED")
            entry.state, entry.result, entry.finished_by, entry.lease = OnceState.DONE, payload, lease, None

        self.execute("once.complete", {**self.lease_args(lease), "result": payload}, model)

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), max_attempts=MAX_ATTEMPTS)
    def fail(self, data: st.DataObject, max_attempts: int) -> None:
        lease = data.draw(st.sampled_from(self.leases))

        def model() -> str:
            entry = self.require_lease(lease)
            entry.max_attempts = max_attempts  # decided now, by this failure
            self.fail_attempt(entry, f"error {lease}")
            return entry.state

        args = {**self.lease_args(lease), "error": f"error {lease}", "max_attempts": max_attempts}
        answer = self.execute("once.fail", args, model)
        if answer is not None:
            result, state = answer
            assert result["state"] == state

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.leases))

        def model() -> None:
            entry = self.require_lease(lease)
            entry.state, entry.lease = OnceState.OPEN, None

        self.execute("once.release", self.lease_args(lease), model)

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), lease_ms=st.sampled_from(LEASE_MS))
    def renew(self, data: st.DataObject, lease_ms: int) -> None:
        lease = data.draw(st.sampled_from(self.leases))

        def model() -> None:
            entry = self.require_lease(lease)
            if self.cancelled:
                raise Rejection("SCOPE_CANCELLED")
            entry.lease_ms = lease_ms
            entry.expires = max(entry.expires, self.h.now_ms + lease_ms)

        self.execute("once.renew", {**self.lease_args(lease), "lease_ms": lease_ms}, model)

    @rule(ms=st.sampled_from([0, 500, 1_000, 2_500, 4_000]))
    def advance_and_tick(self, ms: int) -> None:
        self.h.advance(ms)

        def model() -> None:
            for entry in self.entries.values():
                if entry.state == OnceState.HELD and entry.expires <= self.h.now_ms:
                    self.fail_attempt(entry, f"lease expired (holder {entry.holder})")

        self.execute("tick", {"retention_ms": 10**9}, model)

    @rule()
    def new_leader(self) -> None:
        self.epoch += 1

        def model() -> None:
            for entry in self.entries.values():
                if entry.state == OnceState.HELD:
                    entry.expires = max(entry.expires, self.h.now_ms + entry.lease_ms)

        self.execute("leader.start", {}, model)

    @precondition(lambda self: not self.cancelled)
    @rule()
    def cancel(self) -> None:
        self.cancelled = True
        self.execute("run.cancel", {"run_id": self.run_id, "retention_ms": 10**9}, lambda: None)

    # -- checks ----------------------------------------------------------------------------------

    @invariant()
    def stored_bytes_are_what_the_state_holds(self) -> None:
        assert_stored_bytes_recount(self.h.state)

    @invariant()
    def entries_agree_with_the_model(self) -> None:
        state = self.h.state
        run = state.runs[self.run_id]
        assert set(run.once) == set(self.entries)
        for key, expected in self.entries.items():
            entry = state.once[run.once[key]]
            assert (entry.state, entry.failures, entry.attempt, entry.token, entry.max_attempts) == (
                expected.state, expected.failures, expected.attempt, expected.lease, expected.max_attempts
            ), key
            if entry.state == OnceState.HELD:
                assert (entry.lease_expires_ms, entry.holder) == (expected.expires, expected.holder), key
            if entry.state == OnceState.DONE:
                assert json_value(entry.result) == expected.result, key
            assert entry.error == expected.error, key

    @invariant()
    def at_most_one_live_lease_per_entry_and_a_snapshot_round_trip(self) -> None:
        state = self.h.state
        for entry in state.once.values():
            assert (entry.token is not None) == (entry.state == OnceState.HELD)
        assert round_trip(state).once == state.once


OnceMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_once_against_the_model = OnceMachine.TestCase
