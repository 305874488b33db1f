"""Permits of the core under random interleavings of acquire, release, wait, cancel, lapses,
expiries and run stops (hypothesis stateful). After every step, on the core's state:
- no over-grant: the units in use plus those set aside for SIGNALED waiters never exceed the size;
- strict FIFO: the SIGNALED waiters of a line are a prefix of it;
- no lost wake-up: a WAITING head does not fit in what is free;
- nothing of a stopped run is held or in line;
- the event log tells every grant and its end once (the grants it leaves live are those held), and
  every waiter's signal once;
- a snapshot round-trips.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from runstate_server.actors import permits, resources
from tests.test_actors_harness import Harness, round_trip

LEASE_MS = 5_000


class PermitMachine(RuleBasedStateMachine):
    @initialize(size=st.integers(1, 4))
    def setup(self, size: int) -> None:
        self.h = Harness()
        self.h.ensure()
        self.size = size
        self.permit_id = self.h.ok("permit.create", name="p", units=size)["permit_id"]
        self.runs = [self.h.create_run(), self.h.create_run()]
        self.grants: list[dict[str, Any]] = []
        self.waiters: list[str] = []

    @property
    def pool(self) -> resources.Pool:
        pool = permits.find(self.h.state, self.h.space, self.permit_id)
        assert pool is not None
        return pool

    def _acquire(self, run: int, units: int, waiter_id: str | None = None) -> None:
        args: dict[str, Any] = {"permit_id": self.permit_id, "run_id": self.runs[run], "units": units,
                                "lease_ms": LEASE_MS, "nonce": "n"}
        if waiter_id is not None:
            args["waiter_id"] = waiter_id
        result = self.h.apply("permit.acquire", **args)
        if result.get("granted"):
            self.grants.append({"grant_id": result["grant_id"], "token": result["token"]})

    @rule(run=st.integers(0, 1), units=st.integers(1, 4))
    def acquire(self, run: int, units: int) -> None:
        self._acquire(run, min(units, self.size))

    @rule(run=st.integers(0, 1), index=st.integers(0, 20))
    def acquire_for_waiter(self, run: int, index: int) -> None:
        if self.waiters:
            self._acquire(run, 1, self.waiters[index % len(self.waiters)])

    @rule(index=st.integers(0, 20))
    def release(self, index: int) -> None:
        if self.grants:
            self.h.apply("permit.release", **self.grants.pop(index % len(self.grants)))

    @rule(run=st.integers(0, 1), units=st.integers(1, 4), ttl_ms=st.sampled_from([None, 1_500, 7_500]))
    def wait(self, run: int, units: int, ttl_ms: int | None) -> None:
        result = self.h.apply(
            "permit.wait", permit_id=self.permit_id, run_id=self.runs[run], units=min(units, self.size), ttl_ms=ttl_ms
        )
        if "waiter_id" in result:
            self.waiters.append(result["waiter_id"])

    @rule(index=st.integers(0, 20))
    def cancel_waiter(self, index: int) -> None:
        if self.waiters:
            waiter_id = self.waiters[index % len(self.waiters)]
            result = self.h.apply("permit_waiter.cancel", waiter_id=waiter_id)
            # NOT_FOUND only once its stopped run was removed (retention), and the waiter with it.
            assert "error" not in result or waiter_id not in self.h.state.permit_waiters, result

    @rule(ms=st.sampled_from([500, 2_000, 6_000, 31_000]))
    def time_passes(self, ms: int) -> None:
        self.h.advance(ms)
        self.h.tick()

    @rule(run=st.integers(0, 1))
    def stop_run(self, run: int) -> None:
        self.h.cancel(self.runs[run])
        self.runs[run] = self.h.create_run()  # the next commands use a fresh run

    @invariant()
    def no_over_grant_and_strict_fifo(self) -> None:
        state, pool = self.h.state, self.pool
        in_use = resources.units_in_use(state, pool)
        set_aside = resources.units_set_aside(state, pool)
        assert in_use + set_aside <= pool.size
        line = [state.permit_waiters[waiter_id] for waiter_id in pool.waiters]
        states = [waiter.state for waiter in line]
        assert states == sorted(states, key=lambda s: s != "SIGNALED"), states  # SIGNALED first
        waiting = [waiter for waiter in line if waiter.state == "WAITING"]
        if waiting:
            assert waiting[0].units > pool.size - in_use - set_aside  # else it would be SIGNALED
        for waiter in line:
            assert state.runs[waiter.run_id].stored_state == "ACTIVE"
        for hold_id in pool.holds:
            hold = state.slot_leases[hold_id]
            if hold.token is not None:
                assert state.runs[hold.run_id].stored_state == "ACTIVE"

    @invariant()
    def the_log_tells_every_grant_and_signal_once(self) -> None:
        live: set[str] = set()
        signals: Counter[str] = Counter()
        for event in self.h.state.spaces[self.h.space].events:
            if event.type == "permit.granted":
                assert event.payload["grantId"] not in live
                live.add(event.payload["grantId"])
            elif event.type in ("permit.released", "permit.lease_lost"):
                live.remove(event.payload["grantId"])
            elif event.type == "permit.waiter_signaled":
                signals[event.payload["waiterId"]] += 1
        state = self.h.state
        assert live == {hold_id for hold_id in self.pool.holds if state.slot_leases[hold_id].token is not None}
        assert set(signals.values()) <= {1}
        signaled = {waiter_id for waiter_id in self.pool.waiters if state.permit_waiters[waiter_id].state == "SIGNALED"}
        assert signaled <= set(signals)

    @invariant()
    def snapshot_round_trips(self) -> None:
        assert round_trip(self.h.state) == self.h.state


PermitMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_permits_model = PermitMachine.TestCase
