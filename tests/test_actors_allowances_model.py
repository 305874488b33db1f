"""Allowances of the core under random interleavings of consume, wait, cancel, cooldown, settle,
takes of the limit routes, time passing and run stops (hypothesis stateful). After every step:
- no sliding window of the limit's interval ever holds more than its units, counting each
  consumption at its take time with what it was settled to (an overrun, counted at settle time
  past the limit, is the documented exception: it is left out, and only delays later takes);
- strict FIFO: a waiter is granted only when every waiter that joined the same line before it
  has left the line, and the line holds only WAITING waiters of active runs;
- no lost wake-up: a head that cannot be granted now has a wake armed no later than the ms its
  window opens (or its cooldown ends);
- the event log tells each consumption (a waiter's grant naming the waiter) and each settle once;
- a snapshot round-trips.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from runstate_server.actors import allowances, resources
from tests.test_actors_harness import Harness, round_trip


class AllowanceMachine(RuleBasedStateMachine):
    @initialize(units=st.integers(1, 5), interval_ms=st.sampled_from([1_000, 3_000]))
    def setup(self, units: int, interval_ms: int) -> None:
        self.h = Harness()
        self.units, self.interval_ms = units, interval_ms
        self.allowance_id = self.h.ok("allowance.create", name="a", units=units, interval_ms=interval_ms)["allowance_id"]
        self.runs = [self.h.create_run(), self.h.create_run()]
        # Every take, by consumption id (or "take:<n>" for the limit routes): [taken ms, units counted].
        self.takes: dict[str, list[int]] = {}
        self.waiters: list[str] = []  # in the order they joined
        self.granted_order: list[str] = []

    @property
    def limit(self) -> resources.RateLimit:
        limit = allowances.find(self.h.state, self.h.space, self.allowance_id)
        assert limit is not None
        return limit

    def _note_grants(self) -> None:
        for waiter_id in self.waiters:
            waiter = self.h.state.allowance_waiters.get(waiter_id)
            if waiter is not None and waiter.consumption_id is not None and waiter.consumption_id not in self.takes:
                consumption = self.h.state.allowance_consumptions[waiter.consumption_id]
                assert (consumption.taken_ms, consumption.units) == (waiter.ended_ms, waiter.units)
                self.takes[waiter.consumption_id] = [consumption.taken_ms, waiter.units]
                self.granted_order.append(waiter_id)

    @rule(run=st.integers(0, 1), units=st.integers(1, 5))
    def consume(self, run: int, units: int) -> None:
        result = self.h.apply(
            "allowance.consume", allowance_id=self.allowance_id, run_id=self.runs[run], units=min(units, self.units)
        )
        if "error" in result:
            assert result["error"]["code"] in ("ALLOWANCE_EXHAUSTED", "ALLOWANCE_COOLDOWN"), result
            assert result["error"]["retryAfterMs"] > 0
        else:
            self.takes[result["consumption_id"]] = [self.h.now_ms, result["units"]]

    @rule(run=st.integers(0, 1), units=st.integers(1, 5))
    def take_of_the_limit_routes(self, run: int, units: int) -> None:
        result = self.h.ok("limit.take", name="a", run_id=self.runs[run], units=min(units, self.units))
        if result["taken"]:
            self.takes[f"take:{len(self.takes)}"] = [self.h.now_ms, min(units, self.units)]

    @rule(run=st.integers(0, 1), units=st.integers(1, 5), ttl_ms=st.sampled_from([None, 1_500, 4_000]))
    def wait(self, run: int, units: int, ttl_ms: int | None) -> None:
        result = self.h.ok(
            "allowance.wait", allowance_id=self.allowance_id, run_id=self.runs[run], units=min(units, self.units),
            ttl_ms=ttl_ms,
        )
        self.waiters.append(result["waiter_id"])
        self._note_grants()

    @rule(index=st.integers(0, 20))
    def cancel_waiter(self, index: int) -> None:
        if self.waiters:
            waiter_id = self.waiters[index % len(self.waiters)]
            result = self.h.apply("allowance_waiter.cancel", waiter_id=waiter_id)
            # NOT_FOUND only once its stopped run was removed (retention), and the waiter with it.
            assert "error" not in result or waiter_id not in self.h.state.allowance_waiters, result
            self._note_grants()

    @rule(index=st.integers(0, 20), fraction=st.sampled_from([0, 1, 2, 3]))
    def settle(self, index: int, fraction: int) -> None:
        """Settle a consumption with none, a part, all or twice its estimate (an overrun)."""
        consumption_ids = [key for key in self.takes if key.startswith("acn_")]
        if not consumption_ids:
            return
        consumption_id = consumption_ids[index % len(consumption_ids)]
        consumption = self.h.state.allowance_consumptions.get(consumption_id)
        if consumption is None:
            return
        actual = consumption.units * fraction // 2
        result = self.h.apply("allowance_consumption.settle", consumption_id=consumption_id, units=actual)
        if "error" in result:
            assert result["error"]["code"] == "CONFLICT" and consumption.settled_units != actual
            return
        # Counted with what it was settled to, never more than its estimate (an overrun is left out).
        self.takes[consumption_id][1] = min(consumption.units, consumption.settled_units or 0)
        self._note_grants()

    @rule(ms=st.sampled_from([1_000, 2_000, 15_000]), reason=st.sampled_from([None, "429"]))
    def cooldown(self, ms: int, reason: str | None) -> None:
        before = self.limit.cooldown_until_ms
        result = self.h.ok("allowance.cooldown", allowance_id=self.allowance_id, cooldown_ms=ms, reason=reason)
        assert result["cooldown_until_ms"] == max(before, self.h.now_ms + ms)

    @rule(ms=st.sampled_from([1, 250, 999, 1_000, 3_000]))
    def time_passes(self, ms: int) -> None:
        self.h.advance(ms)
        self.h.tick()
        self._note_grants()

    @rule(run=st.integers(0, 1))
    def stop_run(self, run: int) -> None:
        self.h.cancel(self.runs[run])
        self.runs[run] = self.h.create_run()
        self._note_grants()  # the lines its waiters left may have moved

    @invariant()
    def no_window_holds_more_than_the_limit(self) -> None:
        events = sorted(self.takes.values())
        for end_ms, _ in events:
            held = sum(units for at_ms, units in events if end_ms - self.interval_ms < at_ms <= end_ms)
            assert held <= self.units, (end_ms, events)

    @invariant()
    def strict_fifo_and_no_lost_wake_up(self) -> None:
        state, limit, now_ms = self.h.state, self.limit, self.h.now_ms
        line = [state.allowance_waiters[waiter_id] for waiter_id in limit.waiters]
        assert all(waiter.state == "WAITING" for waiter in line)
        assert all(state.runs[waiter.run_id].stored_state == "ACTIVE" for waiter in line)
        for waiter_id in self.granted_order:  # no one earlier in the same line was still waiting
            granted = state.allowance_waiters.get(waiter_id)
            if granted is None:
                continue
            for earlier_id in self.waiters[: self.waiters.index(waiter_id)]:
                assert earlier_id not in limit.waiters
        if line:
            ready_ms = resources.ready_ms(limit, line[0].units, now_ms)
            assert ready_ms is not None  # its units are at most the limit's, which no rule changes
            assert limit.wake_ms is not None and limit.wake_ms <= max(ready_ms, now_ms), (limit.wake_ms, ready_ms)
            due = [entry[0] for entry in state.due if entry[2] == "limit_window" and entry[0] == limit.wake_ms]
            assert due, "the limit's wake is armed"

    @invariant()
    def the_log_tells_each_consumption_and_settle_once(self) -> None:
        consumed: dict[str, str | None] = {}
        settled: set[str] = set()
        for event in self.h.state.spaces[self.h.space].events:
            if event.type == "allowance.consumed":
                assert event.payload["consumptionId"] not in consumed
                consumed[event.payload["consumptionId"]] = event.payload["waiterId"]
            elif event.type == "allowance.settled":
                assert event.payload["consumptionId"] not in settled
                settled.add(event.payload["consumptionId"])
        state = self.h.state
        for consumption in state.allowance_consumptions.values():
            assert consumption.id in consumed
            assert (consumption.id in settled) == (consumption.settled_units is not None)
        for waiter in state.allowance_waiters.values():
            if waiter.state == "GRANTED":
                assert consumed[waiter.consumption_id] == waiter.id

    @invariant()
    def snapshot_round_trips(self) -> None:
        assert round_trip(self.h.state) == self.h.state


AllowanceMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_allowances_model = AllowanceMachine.TestCase
