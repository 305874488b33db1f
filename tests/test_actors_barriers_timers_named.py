"""Named barriers and timers (barriers.declare, timers.declare) and timer tokens (timers.ack), the
core of the published protocol's §5.11-5.12; a hypothesis model of named barriers and timers under
any interleaving of declarations, arrivals, acks, cancels, ticks and run stops."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from runstate_server.actors import barriers, errors, limits, timers
from runstate_server.actors.state import from_snapshot, to_snapshot
from tests.test_actors_harness import RETENTION_MS, Harness, round_trip

NONCE = "0123456789abcdef01234567"


@pytest.fixture
def h() -> Harness:
    return Harness()


@pytest.fixture
def run_id(h: Harness) -> str:
    return h.create_run()


# -- named barriers ------------------------------------------------------------------------------


def test_a_name_in_a_run_is_one_barrier(h: Harness, run_id: str) -> None:
    made = h.ok("barrier.declare", run_id=run_id, name="stage-2", target=3)
    assert made["created"] is True
    again = h.apply("barrier.declare", run_id=run_id, name="stage-2", target=3)
    assert (again["barrier_id"], again["created"]) == (made["barrier_id"], False)
    assert h.err("barrier.declare", run_id=run_id, name="stage-2", target=2) == errors.CONFLICT
    other_run = h.create_run()
    elsewhere = h.ok("barrier.declare", run_id=other_run, name="stage-2", target=2)
    assert elsewhere["barrier_id"] != made["barrier_id"]  # names are per run
    barrier = h.state.barriers[made["barrier_id"]]
    assert (barrier.name, barrier.target, h.run(run_id).barrier_names) == ("stage-2", 3, {"stage-2": barrier.id})


def test_a_released_named_barrier_stays_released_for_latecomers_and_returning_keys(h: Harness, run_id: str) -> None:
    barrier_id = h.ok("barrier.declare", run_id=run_id, name="go", target=2)["barrier_id"]
    h.ok("barrier.arrive", barrier_id=barrier_id, key="w1")
    h.ok("barrier.arrive", barrier_id=barrier_id, key="w2")
    assert h.apply("barrier.declare", run_id=run_id, name="go", target=2)["barrier_id"] == barrier_id
    barrier = h.state.barriers[barrier_id]
    assert (barrier.state, barrier.epoch) == (barriers.RELEASED, 1)  # a declaration never moves the epoch
    assert h.ok("barrier.arrive", barrier_id=barrier_id, key="w1")["arrived"] is False  # a returning key
    assert h.err("barrier.arrive", barrier_id=barrier_id, key="w3") == errors.BARRIER_RELEASED  # a latecomer
    h.ok("barrier.next_epoch", barrier_id=barrier_id)  # reuse is explicit
    assert (h.state.barriers[barrier_id].epoch, h.state.barriers[barrier_id].state) == (2, barriers.WAITING)


def test_a_stopped_run_cancels_its_open_named_barrier_and_refuses_new_names(h: Harness, run_id: str) -> None:
    barrier_id = h.ok("barrier.declare", run_id=run_id, name="go", target=2)["barrier_id"]
    h.cancel(run_id)
    assert h.state.barriers[barrier_id].state == barriers.CANCELLED
    assert h.apply("barrier.declare", run_id=run_id, name="go", target=2)["barrier_id"] == barrier_id  # read back
    assert h.err("barrier.arrive", barrier_id=barrier_id, key="w1") == errors.BARRIER_CANCELLED
    assert h.err("barrier.declare", run_id=run_id, name="new", target=2) == errors.SCOPE_CANCELLED


def test_bad_declarations_change_nothing(h: Harness, run_id: str) -> None:
    for name in ("", None, 7, "x" * (limits.barrier_timer_name_chars_max + 1)):
        assert h.err("barrier.declare", run_id=run_id, name=name, target=1) == errors.VALIDATION_FAILED
        assert h.err("timer.declare", run_id=run_id, name=name, after_ms=1) == errors.VALIDATION_FAILED
    assert h.err("barrier.declare", run_id=run_id, name="a", target=0) == errors.VALIDATION_FAILED
    assert h.err("barrier.declare", run_id="run_nope", name="a", target=1) == errors.NOT_FOUND
    assert h.err("timer.declare", run_id=run_id, name="a") == errors.VALIDATION_FAILED  # no time
    assert h.err("timer.declare", run_id="run_nope", name="a", after_ms=1) == errors.NOT_FOUND


# -- named timers and tokens ---------------------------------------------------------------------


def test_a_named_timer_is_armed_once_and_returned_whatever_the_later_body(h: Harness, run_id: str) -> None:
    made = h.ok("timer.declare", run_id=run_id, name="cooldown", after_ms=1_000, nonce=NONCE)
    timer_id = made["timer_id"]
    assert made["created"] is True
    h.advance(400)
    again = h.apply("timer.declare", run_id=run_id, name="cooldown", after_ms=60_000, nonce="ff" * 12)
    assert (again["timer_id"], again["created"]) == (timer_id, False)
    timer = h.state.timers[timer_id]
    assert (timer.name, timer.fire_at_ms, timer.state) == ("cooldown", h.now_ms - 400 + 1_000, timers.ARMED)
    assert timer.token == f"{timer_id}.{timer_id[4:]}{NONCE}"  # the first declaration's nonce
    h.advance(600)
    h.tick()
    assert h.state.timers[timer_id].state == timers.FIRED
    assert h.apply("timer.declare", run_id=run_id, name="cooldown", after_ms=1)["timer_id"] == timer_id


def test_ack_takes_the_fired_timers_own_token_once(h: Harness, run_id: str) -> None:
    timer_id = h.ok("timer.create", run_id=run_id, after_ms=100, nonce=NONCE)["timer_id"]
    token = h.state.timers[timer_id].token
    assert h.err("timer.ack", timer_id=timer_id, token=token) == errors.CONFLICT  # not fired yet
    h.advance(100)
    h.tick()
    assert [t.id for t in timers.fired(h.state, h.space, run_id) or []] == [timer_id]
    assert h.err("timer.ack", timer_id=timer_id, token=token + "x") == errors.STALE_CLAIM
    assert h.err("timer.ack", timer_id=timer_id, token=None) == errors.STALE_CLAIM
    assert h.ok("timer.ack", timer_id=timer_id, token=token) == {"timer_id": timer_id, "state": timers.ACKED}
    assert ("timer", timer_id) in h.woken()
    assert h.err("timer.ack", timer_id=timer_id, token=token) == errors.CONFLICT  # acked already
    assert h.err("timer.ack", timer_id=timer_id, token="wrong") == errors.STALE_CLAIM
    assert timers.fired(h.state, h.space, run_id) == []
    assert timers.fired(h.state, "elsewhere", run_id) is None
    other = h.apply("timer.ack", space="elsewhere", timer_id=timer_id, token=token)
    assert other["error"]["code"] == errors.NOT_FOUND


def test_tokens_differ_and_a_cancelled_timer_is_not_acked(h: Harness, run_id: str) -> None:
    first = h.ok("timer.create", run_id=run_id, after_ms=100, nonce=NONCE)["timer_id"]
    second = h.ok("timer.create", run_id=run_id, after_ms=100, nonce=NONCE)["timer_id"]
    assert h.state.timers[first].token != h.state.timers[second].token
    h.ok("timer.cancel", timer_id=first)
    assert h.err("timer.ack", timer_id=first, token=h.state.timers[first].token) == errors.CONFLICT


def test_a_stopped_run_cancels_armed_named_timers_and_keeps_fired_ones(h: Harness, run_id: str) -> None:
    armed = h.ok("timer.declare", run_id=run_id, name="later", after_ms=10_000)["timer_id"]
    fired = h.ok("timer.declare", run_id=run_id, name="now", after_ms=0)["timer_id"]
    h.tick()
    h.cancel(run_id)
    assert (h.state.timers[armed].state, h.state.timers[fired].state) == (timers.CANCELLED, timers.FIRED)
    assert h.apply("timer.declare", run_id=run_id, name="later", after_ms=1)["timer_id"] == armed  # read back
    assert h.err("timer.declare", run_id=run_id, name="new", after_ms=1) == errors.SCOPE_CANCELLED
    h.advance(RETENTION_MS)
    h.tick()
    assert armed not in h.state.timers and fired not in h.state.timers


def test_an_older_snapshot_loads_acknowledged_as_acked_and_runs_without_names(h: Harness, run_id: str) -> None:
    timer_id = h.ok("timer.create", run_id=run_id, after_ms=0)["timer_id"]
    h.tick()
    h.ok("timer.acknowledge", timer_id=timer_id)
    data = to_snapshot(h.state)
    for row in data["timers"]:
        row[5] = "ACKNOWLEDGED"  # the state column
        del row[7:]  # no token, no name
    for row in data["runs"]:
        del row[-3:-1]  # no barrier_names, timer_names (the queues column stays last)
    restored = from_snapshot(data)
    timer = restored.timers[timer_id]
    assert (timer.state, timer.token, timers.token_of(timer)) == (timers.ACKED, None, timer_id)
    assert restored.runs[run_id].timer_names == {} and restored.runs[run_id].barrier_names == {}


# -- the model -----------------------------------------------------------------------------------

NAMES = ("a", "b")
KEYS = ("w1", "w2", "w3")


class NamedMachine(RuleBasedStateMachine):
    """Per (run, name) one barrier and one timer, whatever the interleaving; a barrier releases
    exactly when `target` distinct keys arrived, never before; a timer fires once, never early, and
    is acked only with its own token; a stopped run leaves no open barrier and no armed timer."""

    @initialize()
    def start(self) -> None:
        self.h = Harness()
        self.runs = [self.h.create_run(), self.h.create_run()]
        self.seen_barriers: dict[tuple[str, str], str] = {}
        self.seen_timers: dict[tuple[str, str], str] = {}
        self.acked: set[str] = set()

    @rule(run=st.integers(0, 1), name=st.sampled_from(NAMES), size=st.integers(1, 3))
    def declare_barrier(self, run: int, name: str, size: int) -> None:
        target = size
        run_id = self.runs[run]
        result = self.h.apply("barrier.declare", run_id=run_id, name=name, target=target)
        known = self.seen_barriers.get((run_id, name))
        if "error" in result:
            code = result["error"]["code"]
            if known is not None:
                assert code == errors.CONFLICT and self.h.state.barriers[known].target != target
            else:
                assert code == errors.SCOPE_CANCELLED
            return
        if known is not None:
            assert result["barrier_id"] == known and not result["created"]
        self.seen_barriers[(run_id, name)] = result["barrier_id"]

    @rule(data=st.data(), key=st.sampled_from(KEYS))
    def arrive(self, data: st.DataObject, key: str) -> None:
        if not self.seen_barriers:
            return
        barrier_id = data.draw(st.sampled_from(sorted(self.seen_barriers.values())))
        barrier = self.h.state.barriers[barrier_id]
        before = (barrier.state, list(barrier.arrivals))
        result = self.h.apply("barrier.arrive", barrier_id=barrier_id, key=key)
        if "error" in result:
            assert result["error"]["code"] in (errors.BARRIER_RELEASED, errors.BARRIER_CANCELLED, errors.SCOPE_CANCELLED)
            assert (barrier.state, barrier.arrivals) == before
        elif key in before[1]:
            assert result["arrived"] is False

    @rule(run=st.integers(0, 1), name=st.sampled_from(NAMES), after_ms=st.integers(0, 3_000))
    def declare_timer(self, run: int, name: str, after_ms: int) -> None:
        run_id = self.runs[run]
        result = self.h.apply("timer.declare", run_id=run_id, name=name, after_ms=after_ms, nonce=NONCE)
        known = self.seen_timers.get((run_id, name))
        if "error" in result:
            assert known is None and result["error"]["code"] == errors.SCOPE_CANCELLED
            return
        if known is not None:
            assert result["timer_id"] == known and not result["created"]
        self.seen_timers[(run_id, name)] = result["timer_id"]

    @rule(data=st.data(), own=st.booleans())
    def ack(self, data: st.DataObject, own: bool) -> None:
        if not self.seen_timers:
            return
        timer_id = data.draw(st.sampled_from(sorted(self.seen_timers.values())))
        timer = self.h.state.timers[timer_id]
        token = timer.token if own else "tmr_guess.0"
        state_before = timer.state
        result = self.h.apply("timer.ack", timer_id=timer_id, token=token)
        if "error" not in result:
            assert own and state_before == timers.FIRED and timer_id not in self.acked
            self.acked.add(timer_id)
        else:
            assert timer.state == state_before

    @rule(ms=st.integers(0, 1_500))
    def tick(self, ms: int) -> None:
        self.h.advance(ms)
        self.h.tick()

    @rule(run=st.integers(0, 1))
    def stop(self, run: int) -> None:
        self.h.apply("run.cancel", run_id=self.runs[run], retention_ms=RETENTION_MS)

    @invariant()
    def rules_hold(self) -> None:
        state = self.h.state
        for (run_id, name), barrier_id in self.seen_barriers.items():
            barrier = state.barriers[barrier_id]
            assert state.runs[run_id].barrier_names[name] == barrier_id and barrier.name == name
            assert len(set(barrier.arrivals)) == len(barrier.arrivals) <= barrier.target
            assert (barrier.state == barriers.RELEASED) == (len(barrier.arrivals) == barrier.target)
            if state.runs[run_id].stored_state != "ACTIVE":
                assert barrier.state != barriers.WAITING
        for (run_id, name), timer_id in self.seen_timers.items():
            timer = state.timers[timer_id]
            assert state.runs[run_id].timer_names[name] == timer_id and timer.name == name
            if timer.state in (timers.FIRED, timers.ACKED):
                assert timer.fired_ms is not None and timer.fired_ms >= timer.fire_at_ms
            if timer.state == timers.ACKED:
                assert timer_id in self.acked
            if state.runs[run_id].stored_state != "ACTIVE":
                assert timer.state != timers.ARMED
        for run_id in self.runs:
            names = state.runs[run_id].timer_names
            assert len(names) == len(set(names.values()))

    @invariant()
    def snapshot_round_trips(self) -> None:
        assert round_trip(self.h.state) == self.h.state


NamedMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_named_model = NamedMachine.TestCase
