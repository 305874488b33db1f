"""The claims of the core against a small model, driven by hypothesis.

One run, a few keys and holders; random acquires, renewals, results, failures, releases (with
current and stale lease ids), time passing with ticks, a new leader, and the run's cancellation.
After every step the core's answer and every claim must agree with the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runstate_server.actors.state import ClaimState
from tests.test_actors_harness import Harness, round_trip

KEYS = ("a", "b", "c")
HOLDERS = ("w1", "w2", "w3")
LEASE_MS = (1_000, 3_000)
ATTEMPTS = 2


@dataclass
class ModelClaim:
    state: str = ClaimState.FREE
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


class ClaimsMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(now_ms=1_000_000)
        self.run_id = self.h.create_run()
        self.cancelled = False
        self.epoch = 1
        self.claims: dict[str, ModelClaim] = {}
        self.leases: list[str] = []  # every lease id ever granted (current and stale)
        self.key_of_lease: dict[str, str] = {}

    # -- model helpers ---------------------------------------------------------------------------

    def require_lease(self, lease: str) -> ModelClaim:
        claim = self.claims[self.key_of_lease[lease]]
        if claim.lease != lease or claim.state != ClaimState.HELD or self.h.now_ms >= claim.expires:
            raise Rejection("STALE_CLAIM")
        return claim

    def fail_attempt(self, claim: ModelClaim, error: str) -> None:
        claim.failures += 1
        claim.error = error
        claim.state = ClaimState.FAILED if claim.failures >= ATTEMPTS else ClaimState.FREE
        claim.lease = None

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

    @rule(key=st.sampled_from(KEYS), holder=st.sampled_from(HOLDERS), lease_ms=st.sampled_from(LEASE_MS))
    def acquire(self, key: str, holder: str, lease_ms: int) -> None:
        def model() -> str:
            claim = self.claims.get(key)
            if claim is not None and claim.state in (ClaimState.DONE, ClaimState.FAILED):
                return claim.state
            if self.cancelled:
                raise Rejection("SCOPE_CANCELLED")
            if claim is None:
                claim = self.claims[key] = ModelClaim()
            if claim.state == ClaimState.HELD:
                if self.h.now_ms < claim.expires:
                    return "HELD"
                self.fail_attempt(claim, f"lease expired (holder {claim.holder})")
                if claim.state == ClaimState.FAILED:
                    return ClaimState.FAILED
            claim.state, claim.attempt, claim.holder = ClaimState.HELD, claim.failures + 1, holder
            claim.lease_ms, claim.expires = lease_ms, self.h.now_ms + lease_ms
            return "GRANTED"

        args = {"run_id": self.run_id, "key": key, "lease_ms": lease_ms, "holder": holder, "attempts": ATTEMPTS}
        answer = self.execute("claim.acquire", args, model)
        if answer is None:
            return
        result, outcome = answer
        assert result["outcome"] == outcome
        if outcome == "GRANTED":
            self.claims[key].lease = result["lease_id"]
            self.key_of_lease[result["lease_id"]] = key
            self.leases.append(result["lease_id"])

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), payload=st.integers(0, 3))
    def complete(self, data: st.DataObject, payload: int) -> None:
        lease = data.draw(st.sampled_from(self.leases))

        def model() -> None:
            claim = self.claims[self.key_of_lease[lease]]
            if claim.state == ClaimState.DONE and claim.finished_by == lease:
                return  # the same complete again
            claim = self.require_lease(lease)
            if self.cancelled:
                raise Rejection("SCOPE_CANCELLED")
            claim.state, claim.result, claim.finished_by, claim.lease = ClaimState.DONE, payload, lease, None

        self.execute("claim.complete", {"lease_id": lease, "result": payload}, model)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.leases))

        def model() -> None:
            self.fail_attempt(self.require_lease(lease), f"error {lease}")

        self.execute("claim.fail", {"lease_id": lease, "error": f"error {lease}"}, model)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.leases))

        def model() -> None:
            claim = self.require_lease(lease)
            claim.state, claim.lease = ClaimState.FREE, None

        self.execute("claim.release", {"lease_id": lease}, model)

    @precondition(lambda self: self.leases)
    @rule(data=st.data(), lease_ms=st.sampled_from(LEASE_MS))
    def renew(self, data: st.DataObject, lease_ms: int) -> None:
        lease = data.draw(st.sampled_from(self.leases))

        def model() -> None:
            claim = self.require_lease(lease)
            if self.cancelled:
                raise Rejection("SCOPE_CANCELLED")
            claim.lease_ms = lease_ms
            claim.expires = max(claim.expires, self.h.now_ms + lease_ms)

        self.execute("claim.renew", {"lease_id": lease, "lease_ms": lease_ms}, model)

    @rule(ms=st.sampled_from([0, 500, 1_000, 2_500, 4_000]))
    def advance_and_tick(self, ms: int) -> None:
        self.h.advance(ms)

        def model() -> None:
            for claim in self.claims.values():
                if claim.state == ClaimState.HELD and claim.expires <= self.h.now_ms:
                    self.fail_attempt(claim, f"lease expired (holder {claim.holder})")

        self.execute("tick", {"retention_ms": 10**9}, model)

    @rule()
    def new_leader(self) -> None:
        self.epoch += 1

        def model() -> None:
            for claim in self.claims.values():
                if claim.state == ClaimState.HELD:
                    claim.expires = max(claim.expires, self.h.now_ms + claim.lease_ms)

        self.execute("leader.start", {}, model)

    @precondition(lambda self: not self.cancelled)
    @rule()
    def cancel(self) -> None:
        self.cancelled = True
        self.execute("run.cancel", {"run_id": self.run_id, "retention_ms": 10**9}, lambda: None)

    # -- checks ----------------------------------------------------------------------------------

    @invariant()
    def claims_agree_with_the_model(self) -> None:
        state = self.h.state
        run = state.runs[self.run_id]
        assert set(run.claims) == set(self.claims)
        for key, expected in self.claims.items():
            claim = state.claims[run.claims[key]]
            assert (claim.state, claim.failures, claim.attempt, claim.lease_id) == (
                expected.state, expected.failures, expected.attempt, expected.lease
            ), key
            if claim.state == ClaimState.HELD:
                assert (claim.lease_expires_ms, claim.holder) == (expected.expires, expected.holder), key
            if claim.state == ClaimState.DONE:
                assert claim.result == expected.result, key
            assert claim.error == expected.error, key

    @invariant()
    def at_most_one_live_lease_per_claim_and_a_snapshot_round_trip(self) -> None:
        state = self.h.state
        for claim in state.claims.values():
            assert (claim.lease_id is not None) == (claim.state == ClaimState.HELD)
        assert round_trip(state).claims == state.claims


ClaimsMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_claims_against_the_model = ClaimsMachine.TestCase
