"""Budgets of the core under random interleavings of reserve, settle (partial, repeated, with and
without overrun), void, leased reservations of the old routes, jobs that reserve at admission and
whose deliveries complete, fail or lapse, settleBy passing, and run stops (hypothesis stateful).
After every step, on the core's state:
- money is never created or lost: limit == settled + reserved + remaining, remaining >= 0, what
  was settled is the sum of what the settles answered, and what is reserved is what the open
  reservations and leased holds hold;
- no reservation was granted over what remained, no settle charged more than it asked or than the
  reservation and the budget could cover;
- nothing is leaked: no open reservation belongs to a stopped run, and a job's open reservation
  belongs to its running delivery or to the delivery that completed it;
- the event log ends each reservation's events with the state it is in;
- a snapshot round-trips.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from runstate_server.actors import budgets, errors, resources
from runstate_server.actors.state import TaskState, to_snapshot
from tests.test_actors_harness import Harness, round_trip

LIMIT = 100
LEASE_MS = 5_000


class BudgetMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.h = Harness()
        self.h.ensure()
        self.budget_id = self.h.ok("budget.create", name="usd", limit_minor=LIMIT)["budget_id"]
        self.h.ok("mailbox.declare", name="jobs", requirements={"budgets": [{"name": "usd", "reserveMinor": "30"}]})
        self.runs = [self.h.create_run(), self.h.create_run()]
        self.reservations: list[str] = []
        self.leased: list[str] = []
        self.deliveries: list[str] = []
        self.charged = 0
        self.tasks = 0

    @property
    def budget(self) -> resources.Budget:
        budget = budgets.find(self.h.state, self.h.space, self.budget_id)
        assert budget is not None
        return budget

    def _remaining(self) -> int:
        return resources.remaining_minor(self.budget)

    # -- direct reservations ---------------------------------------------------------------------

    @rule(run=st.integers(0, 1), amount=st.integers(1, 60), settle_by_ms=st.sampled_from([None, 1, 3_000]))
    def reserve(self, run: int, amount: int, settle_by_ms: int | None) -> None:
        remaining = self._remaining()
        args: dict[str, Any] = {"budget_id": self.budget_id, "run_id": self.runs[run], "amount_minor": amount}
        if settle_by_ms is not None:
            args["settle_by_ms"] = self.h.now_ms + settle_by_ms
        result = self.h.apply("budget_reservation.reserve", **args)
        if "error" in result:
            assert result["error"]["code"] in (errors.INSUFFICIENT_BUDGET, errors.SCOPE_CANCELLED)
            if result["error"]["code"] == errors.INSUFFICIENT_BUDGET:
                assert amount > remaining
            return
        assert amount <= remaining  # never over the remainder
        self.reservations.append(result["reservation_id"])

    @rule(index=st.integers(0, 30), amount=st.integers(0, 80), key=st.sampled_from(["a", "b", "c"]),
          overrun=st.booleans())
    def settle(self, index: int, amount: int, key: str, overrun: bool) -> None:
        if not self.reservations:
            return
        reservation_id = self.reservations[index % len(self.reservations)]
        reservation = self.h.state.budget_reservations.get(reservation_id)
        held = reservation.held_minor if reservation is not None else 0
        remaining = self._remaining()
        result = self.h.apply(
            "budget_reservation.settle", budget_id=self.budget_id, reservation_id=reservation_id,
            amount_minor=amount, work_key=key, allow_overrun=overrun,
        )
        if "error" in result:
            assert result["error"]["code"] in (errors.CONFLICT, errors.INSUFFICIENT_BUDGET, errors.NOT_FOUND)
            return
        if result.get("unchanged"):
            return  # a repeat of its workKey: charged nothing more
        charged = result["charged_minor"]
        assert charged <= amount and charged <= held + max(remaining, 0)
        assert charged == amount or overrun
        self.charged += charged

    @rule(index=st.integers(0, 30))
    def void(self, index: int) -> None:
        if self.reservations:
            reservation_id = self.reservations[index % len(self.reservations)]
            self.h.apply("budget_reservation.void", budget_id=self.budget_id, reservation_id=reservation_id, work_key="v")

    # -- the old routes' leased reservations -------------------------------------------------------

    @rule(run=st.integers(0, 1), cents=st.integers(1, 60))
    def reserve_leased(self, run: int, cents: int) -> None:
        result = self.h.apply("budget.reserve", name="usd", run_id=self.runs[run], amount_micros=cents * 10_000,
                              lease_ms=LEASE_MS)
        if result.get("granted"):
            self.leased.append(result["reservation_id"])

    @rule(index=st.integers(0, 30), cents=st.integers(0, 80))
    def settle_leased(self, index: int, cents: int) -> None:
        if not self.leased:
            return
        result = self.h.apply("budget.settle", reservation_id=self.leased[index % len(self.leased)],
                              spent_micros=cents * 10_000)
        if "error" not in result:
            self.charged += result["charged_micros"] // 10_000

    # -- jobs ----------------------------------------------------------------------------------

    @rule(run=st.integers(0, 1))
    def submit(self, run: int) -> None:
        self.tasks += 1
        self.h.apply("task.submit", **{**self.h.submit_args(self.runs[run], f"t{self.tasks}"), "mailbox": "jobs"})

    @rule(run=st.integers(0, 1))
    def receive(self, run: int) -> None:
        result = self.h.apply("task.receive", run_id=self.runs[run], mailbox="jobs", max=2, lease_ms=LEASE_MS, holder="w")
        for delivery in result.get("deliveries", []):
            self.deliveries.append(delivery["token"])
            self.reservations.extend(delivery["budget_reservations"])

    @rule(index=st.integers(0, 30), how=st.sampled_from(["complete", "retry", "reject", "release"]))
    def end_delivery(self, index: int, how: str) -> None:
        if self.deliveries:
            token = self.deliveries[index % len(self.deliveries)]
            extra: dict[str, Any] = {"payload": 1} if how == "complete" else {}
            self.h.apply("delivery." + how, delivery_id=token, **extra)

    # -- time and runs -------------------------------------------------------------------------

    @rule(ms=st.sampled_from([1, 1_000, LEASE_MS]))
    def advance(self, ms: int) -> None:
        self.h.advance(ms)
        self.h.tick()

    @rule(run=st.integers(0, 1))
    def stop_run(self, run: int) -> None:
        self.h.cancel(self.runs[run])
        self.runs[run] = self.h.create_run()

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def money_is_never_created_or_lost(self) -> None:
        budget = self.budget
        state = self.h.state
        remaining = resources.remaining_minor(budget)
        assert remaining >= 0 and budget.limit_minor == budget.settled_minor + budget.reserved_minor + remaining
        assert budget.settled_minor == self.charged
        open_held = sum(state.budget_reservations[rid].held_minor for rid in budget.reservations)
        leased = sum(state.reservations[hold_id].amount for hold_id in budget.holds)
        assert budget.reserved_minor == open_held + leased
        for rid in budget.reservations:
            assert state.budget_reservations[rid].state in ("ACTIVE", "STALE")
        for rid in budget.ended:
            assert state.budget_reservations[rid].held_minor == 0

    @invariant()
    def nothing_is_leaked(self) -> None:
        state = self.h.state
        for rid in self.budget.reservations:
            reservation = state.budget_reservations[rid]
            run = state.runs[reservation.run_id]
            assert run.stored_state == "ACTIVE", (rid, run.stored_state)
            if reservation.task_id is not None:
                task = state.tasks[reservation.task_id]
                own = reservation.delivery == f"{task.id}.{task.delivery_count}"
                assert own and task.state in (TaskState.RUNNING, TaskState.SUCCEEDED), (rid, task.state)
                if task.state == TaskState.RUNNING:
                    assert self.h.now_ms < task.lease_expires_ms or task.delivery_id is not None

    @invariant()
    def the_log_tells_each_reservation_s_state(self) -> None:
        """A reservation's events (a job's begin only after its delivery completed) end with the
        state it is in; a settle is told once per workKey; a direct reservation is told from its reserve."""
        last: dict[str, str] = {}
        settled: set[tuple[str, str]] = set()
        for event in self.h.state.spaces[self.h.space].events:
            if event.aggregate_type != "budget":
                continue
            reservation_id = event.payload["reservationId"]
            assert event.type != "budget.reserved" or reservation_id not in last
            last[reservation_id] = event.payload["state"]
            if event.type == "budget.settled":
                assert (reservation_id, event.payload["workKey"]) not in settled
                settled.add((reservation_id, event.payload["workKey"]))
        for reservation in self.h.state.budget_reservations.values():
            if reservation.task_id is None:
                assert last[reservation.id] == reservation.state, (reservation.id, reservation.state)
            elif reservation.id in last:
                assert last[reservation.id] == reservation.state, (reservation.id, reservation.state)

    @invariant()
    def snapshot_round_trips(self) -> None:
        assert to_snapshot(round_trip(self.h.state)) == to_snapshot(self.h.state)


BudgetMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_budgets_against_the_model = BudgetMachine.TestCase
