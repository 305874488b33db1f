"""Work limits of the core: create (the same again answers it, another size is CONFLICT), the
bound on a space's limits, tasks that name one refused past maxOutstanding (nothing changed, a
replay still answered), and a model test: under random submits, deliveries, settles, cancels,
deadlines, lapses and run stops, each limit's count is exactly its unfinished tasks."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from runstate_server.actors import limits, work_limits
from runstate_server.actors.state import TaskState
from tests.test_actors_harness import MAILBOX, Harness, round_trip, snapshot_bytes


def _harness() -> tuple[Harness, str]:
    h = Harness()
    h.ensure()
    return h, h.create_run()


def _outstanding(h: Harness, name: str) -> int:
    limit = work_limits.find(h.state, h.space, name)
    assert limit is not None
    return limit.outstanding


def test_create_answers_the_same_limit_and_refuses_another_size() -> None:
    h, run_id = _harness()
    assert h.ok("work_limit.create", name="bound", run_id=run_id, max_outstanding=2) == {"name": "bound", "created": True}
    (row,) = work_limits.rows(h.state, h.space)
    assert row["id"].startswith("wlm_")
    assert row == {"id": row["id"], "name": "bound", "scopeId": run_id, "maxOutstanding": 2, "outstanding": 0}
    again = h.ok("work_limit.create", name="bound", run_id=h.create_run(), max_outstanding=2)
    assert again["created"] is False
    assert h.err("work_limit.create", name="bound", run_id=run_id, max_outstanding=3) == "CONFLICT"
    assert work_limits.rows(h.state, h.space) == [row]  # created under its first run, kept
    assert h.err("work_limit.create", name="other", run_id="run_nothing", max_outstanding=1) == "NOT_FOUND"
    for bad in ({"name": "", "max_outstanding": 1}, {"name": "x", "max_outstanding": 0},
                {"name": "x", "max_outstanding": limits.work_limit_outstanding_max + 1},
                {"name": "x", "max_outstanding": True}, {"name": "x"}):
        assert h.err("work_limit.create", run_id=run_id, **bad) == "VALIDATION_FAILED", bad
    h.cancel(run_id)
    assert h.err("work_limit.create", name="late", run_id=run_id, max_outstanding=1) == "SCOPE_CANCELLED"
    assert h.ok("work_limit.create", name="bound", run_id=run_id, max_outstanding=2)["created"] is False
    assert len(work_limits.rows(h.state, h.space)) == 1


def test_a_space_holds_a_bounded_number_of_work_limits(monkeypatch: Any) -> None:
    monkeypatch.setattr(limits, "work_limits_per_space_max", 2)
    h, run_id = _harness()
    h.ok("work_limit.create", name="a", run_id=run_id, max_outstanding=1)
    h.ok("work_limit.create", name="b", run_id=run_id, max_outstanding=1)
    assert h.err("work_limit.create", name="c", run_id=run_id, max_outstanding=1) == "LIMIT_EXCEEDED"
    other = Harness(space="other-space")
    other.ensure()
    other.ok("work_limit.create", name="c", run_id=other.create_run(), max_outstanding=1)  # per space


def test_tasks_past_max_outstanding_are_refused_until_one_ends() -> None:
    h, run_id = _harness()
    h.ok("work_limit.create", name="bound", run_id=run_id, max_outstanding=2)
    first = h.submit(run_id, "a", work_limit="bound")
    h.submit(run_id, "b", work_limit="bound")
    h.submit(run_id, "free")  # names no limit: not counted
    assert _outstanding(h, "bound") == 2
    before = snapshot_bytes(h.state, without_clock=True)
    assert h.err("task.submit", **h.submit_args(run_id, "c", work_limit="bound")) == "CONCURRENCY_LIMITED"
    assert snapshot_bytes(h.state, without_clock=True) == before  # nothing changed
    # A replay of an existing key is answered whatever the count.
    replay = h.ok("task.submit", **h.submit_args(run_id, "a", work_limit="bound"))
    assert (replay["task_id"], replay["created"]) == (first, False)
    assert h.err("task.submit", **h.submit_args(run_id, "d", work_limit="nothing")) == "NOT_FOUND"
    # Another run of the space counts toward the same limit.
    other_run = h.create_run()
    assert h.err("task.submit", **h.submit_args(other_run, "c", work_limit="bound")) == "CONCURRENCY_LIMITED"
    (delivery,) = h.receive(run_id)
    h.delivery("complete", delivery)
    assert _outstanding(h, "bound") == 1
    h.submit(other_run, "c", work_limit="bound")
    assert _outstanding(h, "bound") == 2
    h.cancel(other_run)
    assert _outstanding(h, "bound") == 1
    assert round_trip(h.state) == h.state


def test_every_end_of_a_task_counts_once() -> None:
    h, run_id = _harness()
    h.ok("work_limit.create", name="bound", run_id=run_id, max_outstanding=10)
    ids = [h.submit(run_id, f"k{n}", work_limit="bound", attempts=1) for n in range(5)]
    h.submit(run_id, "deadline", work_limit="bound", deadline_ms=h.now_ms + 1_000)
    assert _outstanding(h, "bound") == 6
    h.ok("task.cancel", task_id=ids[0])
    h.ok("task.cancel", task_id=ids[0])  # again: no second count
    assert _outstanding(h, "bound") == 5
    retried, rejected, lapsed = h.receive(run_id, max=3, lease_ms=500)
    h.delivery("retry", retried, error="boom")  # its last attempt: FAILED
    h.delivery("reject", rejected, error="no")
    assert _outstanding(h, "bound") == 3
    h.advance(2_000)
    h.tick()  # the lease lapses (its last attempt) and the deadline passes
    assert h.task_of(lapsed).state == TaskState.FAILED
    assert _outstanding(h, "bound") == 1
    h.cancel(run_id)
    assert _outstanding(h, "bound") == 0


class WorkLimitMachine(RuleBasedStateMachine):
    @initialize(max_outstanding=st.integers(1, 3))
    def setup(self, max_outstanding: int) -> None:
        self.h = Harness()
        self.h.ensure()
        self.runs = [self.h.create_run(), self.h.create_run()]
        self.h.ok("work_limit.create", name="bound", run_id=self.runs[0], max_outstanding=max_outstanding)
        self.keys = 0
        self.deliveries: list[str] = []

    @rule(run=st.integers(0, 1), limited=st.booleans(), deadline=st.booleans(), replay=st.booleans())
    def submit(self, run: int, limited: bool, deadline: bool, replay: bool) -> None:
        if not replay:
            self.keys += 1
        args: dict[str, Any] = {"attempts": 2}
        if limited:
            args["work_limit"] = "bound"
        if deadline:
            args["deadline_ms"] = self.h.now_ms + 1_500
        result = self.h.apply("task.submit", **self.h.submit_args(self.runs[run], f"k{self.keys}", **args))
        assert "error" not in result or result["error"]["code"] in (
            "CONCURRENCY_LIMITED", "KEY_CONFLICT", "SCOPE_CANCELLED", "NOT_FOUND",
        ), result

    @rule(run=st.integers(0, 1))
    def receive(self, run: int) -> None:
        result = self.h.apply("task.receive", run_id=self.runs[run], mailbox=MAILBOX, max=2, lease_ms=1_000, holder="w")
        for task_id in result.get("task_ids", []):
            delivery_id = self.h.task(task_id).delivery_id
            assert delivery_id is not None
            self.deliveries.append(delivery_id)

    @rule(index=st.integers(0, 20), how=st.sampled_from(["complete", "retry", "reject", "release"]))
    def settle(self, index: int, how: str) -> None:
        if self.deliveries:
            self.h.apply("delivery." + how, delivery_id=self.deliveries.pop(index % len(self.deliveries)), delay_ms=0)

    @rule(index=st.integers(0, 50))
    def cancel_task(self, index: int) -> None:
        task_ids = list(self.h.state.tasks)
        if task_ids:
            self.h.apply("task.cancel", task_id=task_ids[index % len(task_ids)])

    @rule(ms=st.sampled_from([300, 1_200, 5_000]))
    def time_passes(self, ms: int) -> None:
        self.h.advance(ms)
        self.h.tick(retention_ms=2_000)

    @rule(run=st.integers(0, 1))
    def stop_run(self, run: int) -> None:
        self.h.cancel(self.runs[run], retention_ms=2_000)
        self.runs[run] = self.h.create_run()

    @invariant()
    def the_count_is_the_unfinished_tasks_naming_it(self) -> None:
        limit = work_limits.find(self.h.state, self.h.space, "bound")
        assert limit is not None
        unfinished = sum(
            1 for task in self.h.state.tasks.values()
            if task.work_limit == "bound" and task.state not in TaskState.TERMINAL
        )
        assert limit.outstanding == unfinished <= limit.max_outstanding

    @invariant()
    def snapshot_round_trips(self) -> None:
        assert round_trip(self.h.state) == self.h.state


WorkLimitMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_work_limits_model = WorkLimitMachine.TestCase
