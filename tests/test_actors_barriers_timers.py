"""Rules of barriers (runstate_server.actors.barriers) and durable timers (runstate_server.actors.timers)."""

from __future__ import annotations

import pytest

from runstate_server.actors import barriers, errors, timers
from tests.test_actors_harness import RETENTION_MS, Harness, round_trip, snapshot_bytes


@pytest.fixture
def h() -> Harness:
    return Harness()


@pytest.fixture
def run_id(h: Harness) -> str:
    return h.create_run()


def new_barrier(h: Harness, run_id: str, target: int) -> str:
    return str(h.ok("barrier.create", run_id=run_id, target=target)["barrier_id"])


# -- barriers ------------------------------------------------------------------------------------


def test_a_barrier_releases_once_when_target_distinct_keys_arrived(h: Harness, run_id: str) -> None:
    barrier_id = new_barrier(h, run_id, 3)
    assert h.ok("barrier.arrive", barrier_id=barrier_id, key="a") == {"barrier_id": barrier_id, "arrived": True}
    assert h.ok("barrier.arrive", barrier_id=barrier_id, key="a")["arrived"] is False  # idempotent per key
    h.ok("barrier.arrive", barrier_id=barrier_id, key="b")
    assert h.state.barriers[barrier_id].state == barriers.WAITING
    h.ok("barrier.arrive", barrier_id=barrier_id, key="c")
    barrier = h.state.barriers[barrier_id]
    assert (barrier.state, barrier.arrivals, barrier.released_ms) == (barriers.RELEASED, ["a", "b", "c"], h.now_ms)
    assert ("barrier", barrier_id) in h.woken()
    assert h.ok("barrier.arrive", barrier_id=barrier_id, key="b")["arrived"] is False  # a repeat stays fine
    assert h.err("barrier.arrive", barrier_id=barrier_id, key="d") == errors.BARRIER_RELEASED


def test_next_epoch_reuses_a_released_barrier(h: Harness, run_id: str) -> None:
    barrier_id = new_barrier(h, run_id, 1)
    assert h.err("barrier.next_epoch", barrier_id=barrier_id) == errors.CONFLICT  # not released yet
    h.ok("barrier.arrive", barrier_id=barrier_id, key="a")
    h.ok("barrier.next_epoch", barrier_id=barrier_id)
    barrier = h.state.barriers[barrier_id]
    assert (barrier.epoch, barrier.state, barrier.arrivals) == (2, barriers.WAITING, [])
    h.ok("barrier.arrive", barrier_id=barrier_id, key="a")  # the same key arrives anew in epoch 2
    assert h.state.barriers[barrier_id].state == barriers.RELEASED


def test_stopping_the_run_cancels_waiting_barriers_and_keeps_released_ones(h: Harness, run_id: str) -> None:
    child = h.create_run(parent_id=run_id)
    waiting = new_barrier(h, child, 2)
    released = new_barrier(h, child, 1)
    h.ok("barrier.arrive", barrier_id=released, key="x")
    h.cancel(run_id)
    assert h.state.barriers[waiting].state == barriers.CANCELLED
    assert h.state.barriers[released].state == barriers.RELEASED
    assert ("barrier", waiting) in h.woken()
    assert h.err("barrier.arrive", barrier_id=waiting, key="a") == errors.BARRIER_CANCELLED
    assert h.err("barrier.create", run_id=child, target=1) == errors.SCOPE_CANCELLED
    assert h.err("barrier.next_epoch", barrier_id=released) == errors.SCOPE_CANCELLED


def test_bad_barrier_commands_change_nothing(h: Harness, run_id: str) -> None:
    for target in (0, -1, True, "3", 10**9):
        assert h.err("barrier.create", run_id=run_id, target=target) == errors.VALIDATION_FAILED
    assert h.err("barrier.create", run_id="run_nope", target=1) == errors.NOT_FOUND
    assert h.err("barrier.arrive", barrier_id="bar_nope", key="a") == errors.NOT_FOUND
    barrier_id = new_barrier(h, run_id, 1)
    other = h.apply("barrier.arrive", space="elsewhere", barrier_id=barrier_id, key="a")
    assert other["error"]["code"] == errors.NOT_FOUND


# -- timers --------------------------------------------------------------------------------------


def test_a_timer_fires_once_in_the_first_tick_at_its_time(h: Harness, run_id: str) -> None:
    timer_id = h.ok("timer.create", run_id=run_id, after_ms=5_000)["timer_id"]
    assert h.state.timers[timer_id].fire_at_ms == h.now_ms + 5_000
    assert h.armed() == [h.now_ms + 5_000]
    assert h.err("timer.acknowledge", timer_id=timer_id) == errors.CONFLICT  # not fired yet
    h.advance(4_999)
    h.tick()
    assert h.state.timers[timer_id].state == timers.ARMED
    h.advance(500)  # overdue, as after an election: fires at the next tick
    h.tick()
    timer = h.state.timers[timer_id]
    assert (timer.state, timer.fired_ms) == (timers.FIRED, h.now_ms)
    assert ("timer", timer_id) in h.woken()
    h.tick()
    assert h.state.timers[timer_id].fired_ms == timer.fired_ms  # once
    h.ok("timer.acknowledge", timer_id=timer_id)
    h.ok("timer.acknowledge", timer_id=timer_id)  # the same answer again
    assert h.state.timers[timer_id].state == timers.ACKED
    assert h.err("timer.cancel", timer_id=timer_id) == errors.CONFLICT  # already fired


def test_a_timer_at_a_time_and_in_the_past(h: Harness, run_id: str) -> None:
    future = h.ok("timer.create", run_id=run_id, fire_at_ms=h.now_ms + 1_000)["timer_id"]
    past = h.ok("timer.create", run_id=run_id, fire_at_ms=h.now_ms - 1_000)["timer_id"]
    h.tick()
    assert (h.state.timers[past].state, h.state.timers[future].state) == (timers.FIRED, timers.ARMED)


def test_cancel_disarms_and_a_stopped_run_cancels_armed_timers(h: Harness, run_id: str) -> None:
    disarmed = h.ok("timer.create", run_id=run_id, after_ms=1_000)["timer_id"]
    h.ok("timer.cancel", timer_id=disarmed)
    h.ok("timer.cancel", timer_id=disarmed)  # idempotent
    armed = h.ok("timer.create", run_id=run_id, after_ms=1_000)["timer_id"]
    fired = h.ok("timer.create", run_id=run_id, after_ms=0)["timer_id"]
    h.tick()
    h.cancel(run_id)
    assert h.state.timers[armed].state == timers.CANCELLED
    assert h.state.timers[fired].state == timers.FIRED  # what fired stays fired
    h.advance(2_000)
    h.tick()
    assert (h.state.timers[disarmed].state, h.state.timers[armed].state) == (timers.CANCELLED, timers.CANCELLED)
    assert h.err("timer.create", run_id=run_id, after_ms=1) == errors.SCOPE_CANCELLED
    assert h.err("timer.acknowledge", timer_id=armed) == errors.CONFLICT


def test_bad_timer_commands_change_nothing(h: Harness, run_id: str) -> None:
    assert h.err("timer.create", run_id=run_id) == errors.VALIDATION_FAILED
    assert h.err("timer.create", run_id=run_id, after_ms=1, fire_at_ms=h.now_ms) == errors.VALIDATION_FAILED
    assert h.err("timer.create", run_id=run_id, after_ms=-1) == errors.VALIDATION_FAILED
    assert h.err("timer.create", run_id=run_id, after_ms=400 * 86_400_000) == errors.VALIDATION_FAILED
    assert h.err("timer.cancel", timer_id="tmr_nope") == errors.NOT_FOUND


def test_barriers_and_timers_survive_snapshots_and_go_with_their_run(h: Harness, run_id: str) -> None:
    barrier_id = new_barrier(h, run_id, 2)
    h.ok("barrier.arrive", barrier_id=barrier_id, key="a")
    timer_id = h.ok("timer.create", run_id=run_id, after_ms=1_000)["timer_id"]
    restored = round_trip(h.state)
    assert restored.barriers == h.state.barriers and restored.timers == h.state.timers
    before = snapshot_bytes(h.state)
    h.ok("barrier.arrive", barrier_id=barrier_id, key="b")
    assert snapshot_bytes(restored) == before  # a snapshot is a value
    h.cancel(run_id)
    h.advance(RETENTION_MS)
    h.tick()
    assert barrier_id not in h.state.barriers and timer_id not in h.state.timers
