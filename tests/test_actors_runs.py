"""Rules of mailboxes, runs, time and the dispatcher (runstate_server.actors.runs, dispatch)."""

from __future__ import annotations

import pytest

from runstate_server.actors import errors, limits, runs, tasks
from runstate_server.actors.state import RunState, TaskState
from tests.test_actors_harness import MAILBOX, RETENTION_MS, Harness, snapshot_bytes


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.ensure()
    return harness


def effective(h: Harness, run_id: str) -> str:
    return runs.effective(h.state, h.run(run_id), h.now_ms)


# -- mailboxes -----------------------------------------------------------------------------------


def test_mailbox_ensure_is_idempotent() -> None:
    h = Harness()
    assert {"name": "jobs", "mode": "WORK", "created": True}.items() <= h.ensure("jobs").items()
    assert {"name": "jobs", "mode": "WORK", "created": False}.items() <= h.ensure("jobs").items()
    assert h.ensure("jobs", mode="WORK")["created"] is False
    assert list(h.state.spaces[h.space].mailboxes) == ["jobs"]


def test_mailbox_unknown_mode_is_validation() -> None:
    h = Harness()
    assert h.err("mailbox.ensure", name="jobs", mode="BROADCAST") == errors.VALIDATION_FAILED
    h.ensure("jobs")
    assert h.err("mailbox.ensure", name="jobs", mode="BROADCAST") == errors.VALIDATION_FAILED


def test_mailbox_same_name_other_valid_mode_is_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    # With a second valid mode, an existing name keeps its mode.
    monkeypatch.setattr(tasks, "MAILBOX_MODES", ("WORK", "BROADCAST"))
    h = Harness()
    h.ensure("jobs")
    assert h.err("mailbox.ensure", name="jobs", mode="BROADCAST") == errors.CONFLICT
    assert h.ensure("events", mode="BROADCAST")["created"] is True
    assert h.err("mailbox.ensure", name="events") == errors.CONFLICT  # mode defaults to WORK


@pytest.mark.parametrize("name", ["", None, 7, "x" * (limits.name_chars_max + 1)])
def test_mailbox_name_is_validated(name: object) -> None:
    assert Harness().err("mailbox.ensure", name=name) == errors.VALIDATION_FAILED


def test_mailbox_name_at_its_limit_is_fine() -> None:
    assert Harness().ensure("x" * limits.name_chars_max)["created"] is True


def test_mailboxes_belong_to_their_space(h: Harness) -> None:
    other = h.create_run(space="space-2")
    assert h.err("task.submit", space="space-2", **h.submit_args(other, "k")) == errors.NOT_FOUND
    assert h.ok("mailbox.ensure", space="space-2", name=MAILBOX)["created"] is True


def test_a_space_appears_only_when_something_is_created_in_it() -> None:
    h = Harness()
    assert h.err("run.cancel", space="ghost", run_id="run_x", retention_ms=1) == errors.NOT_FOUND
    assert h.err("mailbox.ensure", space="ghost", name="") == errors.VALIDATION_FAILED
    assert "ghost" not in h.state.spaces
    h.create_run(space="ghost")
    assert h.state.spaces["ghost"].run_count == 1


# -- creating runs -------------------------------------------------------------------------------


def test_create_a_run(h: Harness) -> None:
    run_id = h.create_run(name="swarm")
    run = h.run(run_id)
    assert run_id.startswith("run_")
    assert (run.name, run.parent_id, run.depth, run.deadline_ms) == ("swarm", None, 0, None)
    assert run.child_limit == limits.child_limit_default
    assert run.created_ms == h.now_ms
    assert run.stored_state == RunState.ACTIVE and run.finished_ms is None
    assert effective(h, run_id) == "ACTIVE"
    assert h.state.spaces[h.space].run_count == 1


def test_two_creates_make_two_runs(h: Harness) -> None:
    first = h.create_run(name="same")
    second = h.create_run(name="same")
    assert first != second
    assert h.state.spaces[h.space].run_count == 2


def test_create_a_child(h: Harness) -> None:
    parent = h.create_run()
    child = h.create_run(parent_id=parent, name="shard")
    grandchild = h.create_run(parent_id=child)
    assert h.run(child).parent_id == parent and h.run(child).depth == 1
    assert h.run(grandchild).depth == 2
    assert h.run(parent).children == [child]
    assert h.run(child).children == [grandchild]


def test_parent_must_exist_in_this_space(h: Harness) -> None:
    assert h.err("run.create", parent_id="run_nope") == errors.NOT_FOUND
    assert h.err("run.create", parent_id=17) == errors.NOT_FOUND
    elsewhere = h.create_run(space="space-2")
    assert h.err("run.create", parent_id=elsewhere) == errors.NOT_FOUND


def test_child_limit(h: Harness) -> None:
    parent = h.create_run(child_limit=2)
    h.create_run(parent_id=parent)
    h.create_run(parent_id=parent)
    assert h.err("run.create", parent_id=parent) == errors.LIMIT_EXCEEDED
    # Grandchildren do not count against the parent's limit.
    h.create_run(parent_id=h.run(parent).children[0])


def test_child_limit_zero_allows_no_child(h: Harness) -> None:
    parent = h.create_run(child_limit=0)
    assert h.err("run.create", parent_id=parent) == errors.LIMIT_EXCEEDED


@pytest.mark.parametrize("child_limit", [-1, limits.child_limit_max + 1, "3", 2.5, None])
def test_child_limit_is_validated(h: Harness, child_limit: object) -> None:
    assert h.err("run.create", child_limit=child_limit) == errors.VALIDATION_FAILED


def test_depth_limit(h: Harness) -> None:
    run_id = h.create_run()
    for _ in range(limits.run_depth_max):
        run_id = h.create_run(parent_id=run_id)
    assert h.run(run_id).depth == limits.run_depth_max
    assert h.err("run.create", parent_id=run_id) == errors.LIMIT_EXCEEDED


@pytest.mark.parametrize("offset_ms", [-1, 0])
def test_deadline_not_in_the_future_is_validation(h: Harness, offset_ms: int) -> None:
    assert h.err("run.create", deadline_ms=h.now_ms + offset_ms) == errors.VALIDATION_FAILED


def test_deadline_at_most_a_year_ahead(h: Harness) -> None:
    assert h.err("run.create", deadline_ms=h.now_ms + limits.deadline_ms_max + 1) == errors.VALIDATION_FAILED
    assert h.err("run.create", deadline_ms=str(h.now_ms + 1_000)) == errors.VALIDATION_FAILED
    h.create_run(deadline_ms=h.now_ms + limits.deadline_ms_max)


def test_runs_per_space_limit(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "runs_per_space_max", 2)
    h.create_run()
    h.create_run()
    assert h.err("run.create") == errors.LIMIT_EXCEEDED
    h.create_run(space="space-2")  # per space


# -- cancel and complete ---------------------------------------------------------------------------


def test_cancel_cascades_to_every_run_below(h: Harness) -> None:
    parent = h.create_run()
    child = h.create_run(parent_id=parent)
    grandchild = h.create_run(parent_id=child)
    sibling = h.create_run()
    assert h.cancel(parent, reason="stop")["run_id"] == parent
    assert h.run(parent).stored_state == RunState.CANCELLED
    assert h.run(parent).reason == "stop"
    assert h.run(parent).finished_ms == h.now_ms
    for below in (child, grandchild):
        assert h.run(below).stored_state == RunState.ACTIVE  # its own state
        assert effective(h, below) == "INACTIVE"
    assert effective(h, parent) == "INACTIVE"
    assert effective(h, sibling) == "ACTIVE"


def test_cancelling_a_child_leaves_its_parent_active(h: Harness) -> None:
    parent = h.create_run()
    child = h.create_run(parent_id=parent)
    h.cancel(child)
    assert effective(h, child) == "INACTIVE"
    assert effective(h, parent) == "ACTIVE"
    h.create_run(parent_id=parent)


def test_cancel_is_idempotent(h: Harness) -> None:
    run_id = h.create_run()
    h.cancel(run_id, reason="first")
    finished_ms = h.run(run_id).finished_ms
    due = list(h.state.due)
    h.advance(1_000)
    assert h.cancel(run_id, reason="second")["run_id"] == run_id
    assert h.effects == []
    assert h.run(run_id).reason == "first"
    assert h.run(run_id).finished_ms == finished_ms
    assert h.state.due == due  # no second retention entry


def test_complete_is_idempotent(h: Harness) -> None:
    run_id = h.create_run()
    h.complete_run(run_id)
    assert h.complete_run(run_id)["run_id"] == run_id
    assert h.run(run_id).stored_state == RunState.COMPLETED


def test_cancel_of_a_completed_run_is_conflict(h: Harness) -> None:
    run_id = h.create_run()
    h.complete_run(run_id)
    assert h.err("run.cancel", run_id=run_id, retention_ms=RETENTION_MS) == errors.CONFLICT
    assert h.run(run_id).stored_state == RunState.COMPLETED


def test_complete_of_a_cancelled_run_is_conflict(h: Harness) -> None:
    run_id = h.create_run()
    h.cancel(run_id)
    assert h.err("run.complete", run_id=run_id, retention_ms=RETENTION_MS) == errors.CONFLICT
    assert h.run(run_id).stored_state == RunState.CANCELLED


def test_cancel_and_complete_of_unknown_runs(h: Harness) -> None:
    assert h.err("run.cancel", run_id="run_nope", retention_ms=1) == errors.NOT_FOUND
    assert h.err("run.complete", run_id=None, retention_ms=1) == errors.NOT_FOUND
    elsewhere = h.create_run(space="space-2")
    assert h.err("run.cancel", run_id=elsewhere, retention_ms=1) == errors.NOT_FOUND


def test_a_child_of_a_stopped_run_can_still_be_cancelled_or_completed(h: Harness) -> None:
    parent = h.create_run()
    first = h.create_run(parent_id=parent)
    second = h.create_run(parent_id=parent)
    h.cancel(parent)
    h.cancel(first)
    h.complete_run(second)
    assert h.run(first).stored_state == RunState.CANCELLED
    assert h.run(second).stored_state == RunState.COMPLETED


@pytest.mark.parametrize("stop", ["run.cancel", "run.complete"])
def test_no_child_under_a_stopped_run(h: Harness, stop: str) -> None:
    parent = h.create_run()
    child = h.create_run(parent_id=parent)
    h.ok(stop, run_id=parent, retention_ms=RETENTION_MS)
    assert h.err("run.create", parent_id=parent) == errors.SCOPE_CANCELLED
    assert h.err("run.create", parent_id=child) == errors.SCOPE_CANCELLED


# -- deadlines -------------------------------------------------------------------------------------


def test_deadline_makes_the_run_and_its_subtree_inactive_without_a_tick(h: Harness) -> None:
    parent = h.create_run(deadline_ms=h.now_ms + 5_000)
    child = h.create_run(parent_id=parent)
    h.advance(4_999)
    assert effective(h, child) == "ACTIVE"
    h.advance(1)
    assert effective(h, parent) == effective(h, child) == "INACTIVE"
    assert h.run(parent).stored_state == RunState.ACTIVE
    assert h.err("run.create", parent_id=parent) == errors.DEADLINE_EXCEEDED
    assert h.err("run.create", parent_id=child) == errors.DEADLINE_EXCEEDED


def test_nearest_stopped_run_decides_the_code(h: Harness) -> None:
    parent = h.create_run()
    child = h.create_run(parent_id=parent, deadline_ms=h.now_ms + 1_000)
    grandchild = h.create_run(parent_id=child)
    h.cancel(parent)
    h.advance(1_000)
    assert h.err("run.create", parent_id=grandchild) == errors.DEADLINE_EXCEEDED
    assert h.err("run.create", parent_id=parent) == errors.SCOPE_CANCELLED


def test_deadline_tick_stops_the_run_and_arms_retention(h: Harness) -> None:
    run_id = h.create_run(deadline_ms=h.now_ms + 5_000)
    h.advance(5_000)
    assert h.tick(retention_ms=1_000) == {"processed": 1}
    run = h.run(run_id)
    assert run.stored_state == RunState.ACTIVE and run.finished_ms == h.now_ms
    # A run stopped by its deadline can still be cancelled (but not reopened); it stays finished
    # from the deadline's tick, and its retention is not pushed back.
    finished_ms = run.finished_ms
    h.advance(500)
    h.cancel(run_id)
    assert run.stored_state == RunState.CANCELLED
    assert run.finished_ms == finished_ms
    assert [entry[2] for entry in h.state.due].count("retention") == 1
    h.advance(500)
    h.tick()
    assert run_id not in h.state.runs


def test_time_never_goes_backwards(h: Harness) -> None:
    run_id = h.create_run(deadline_ms=h.now_ms + 1_000)
    h.advance(1_000)
    h.tick()
    h.now_ms -= 500  # a new leader whose clock is behind
    assert h.err("run.create", parent_id=run_id) == errors.DEADLINE_EXCEEDED
    assert h.state.clock_ms == h.now_ms + 500


# -- retention -------------------------------------------------------------------------------------


def test_retention_removes_a_finished_run_its_subtree_and_tasks(h: Harness) -> None:
    keep = h.create_run()
    h.submit(keep, "kept")
    parent = h.create_run()
    child = h.create_run(parent_id=parent)
    grandchild = h.create_run(parent_id=child)
    for run_id in (parent, child, grandchild):
        h.submit(run_id, "a")
        h.submit(run_id, "b")
    space = h.state.spaces[h.space]
    assert (space.run_count, space.task_count) == (4, 7)
    h.cancel(parent, retention_ms=10_000)
    h.advance(9_999)
    h.tick()
    assert parent in h.state.runs  # results stay readable until retention ends
    h.advance(1)
    h.tick()
    assert set(h.state.runs) == {keep}
    assert [t.run_id for t in h.state.tasks.values()] == [keep]
    assert (space.run_count, space.task_count) == (1, 1)
    assert h.run(keep).task_count == 1


def test_retention_of_a_child_frees_a_child_slot_of_its_active_parent(h: Harness) -> None:
    parent = h.create_run(child_limit=1)
    child = h.create_run(parent_id=parent)
    assert h.err("run.create", parent_id=parent) == errors.LIMIT_EXCEEDED
    h.complete_run(child, retention_ms=1_000)
    h.advance(1_000)
    h.tick()
    assert h.run(parent).children == []
    assert effective(h, parent) == "ACTIVE"
    h.create_run(parent_id=parent)


def test_an_active_run_is_never_removed(h: Harness) -> None:
    run_id = h.create_run()
    child = h.create_run(parent_id=run_id, deadline_ms=h.now_ms + 1_000)
    h.submit(run_id, "k")
    for _ in range(5):
        h.advance(RETENTION_MS * 10)
        h.tick()
    assert child not in h.state.runs  # stopped by its deadline, then retained and removed
    assert run_id in h.state.runs and h.state.tasks


def test_stopping_a_run_below_an_already_stopped_one_still_removes_it_once(h: Harness) -> None:
    parent = h.create_run()
    child = h.create_run(parent_id=parent)
    h.submit(child, "k")
    h.cancel(parent, retention_ms=5_000)
    h.advance(1_000)
    h.cancel(child, retention_ms=5_000)  # armed later than the parent's
    h.advance(4_000)
    h.tick()
    assert h.state.runs == {} and h.state.tasks == {}
    h.advance(1_000)
    assert h.tick() == {"processed": 1}  # the child's entry finds nothing to remove
    assert h.state.spaces[h.space].run_count == 0
    assert h.state.spaces[h.space].task_count == 0


# -- epochs, ticks and the dispatcher --------------------------------------------------------------


def test_stale_epoch_tick_is_refused(h: Harness) -> None:
    assert h.ok("leader.start", epoch=3) == {"epoch": 3}
    run_id = h.create_run(deadline_ms=h.now_ms + 1_000)
    h.advance(1_000)
    assert h.err("tick", epoch=2, retention_ms=RETENTION_MS) == errors.STALE_EPOCH
    assert h.run(run_id).finished_ms is None
    assert h.ok("tick", epoch=3, retention_ms=RETENTION_MS) == {"processed": 1}
    assert h.ok("tick", epoch=4, retention_ms=RETENTION_MS) == {"processed": 0}


def test_leader_start_never_lowers_the_epoch(h: Harness) -> None:
    h.ok("leader.start", epoch=5)
    assert h.ok("leader.start", epoch=2) == {"epoch": 5}
    assert h.state.epoch == 5


@pytest.mark.parametrize(
    ("command", "code"),
    [
        ({"type": "run.create", "v": 2, "space": "s", "id": "1", "args": {}}, errors.VALIDATION_FAILED),
        ({"type": "run.create", "space": "s", "id": "1", "args": {}}, errors.VALIDATION_FAILED),
        ({"type": "run.explode", "v": 1, "space": "s", "id": "1", "args": {}}, errors.VALIDATION_FAILED),
        ({"type": "run.create", "v": 1, "space": "", "id": "1", "args": {}}, errors.VALIDATION_FAILED),
        ({"type": "run.create", "v": 1, "id": "1", "args": {}}, errors.VALIDATION_FAILED),
    ],
)
def test_malformed_commands_are_validation(h: Harness, command: dict[str, object], code: str) -> None:
    before = snapshot_bytes(h.state)
    result, effects = h.core.apply(command, h.now_ms, 1)
    assert result["error"]["code"] == code and effects == []
    assert snapshot_bytes(h.state) == before


def test_space_limit(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "spaces_max", 1)
    assert h.err("run.create", space="space-2") == errors.LIMIT_EXCEEDED
    h.create_run()  # an existing space is fine


def test_a_rejection_at_a_later_time_moves_only_the_clock(h: Harness) -> None:
    # The batch's time is recorded even when its command is refused; nothing else changes.
    h.create_run()
    before = snapshot_bytes(h.state, without_clock=True)
    h.advance(5_000)
    assert h.err("run.cancel", run_id="run_nope", retention_ms=1) == errors.NOT_FOUND
    assert snapshot_bytes(h.state, without_clock=True) == before
    assert h.state.clock_ms == h.now_ms


# -- effects ---------------------------------------------------------------------------------------


def test_a_deadline_arms_the_ticker_when_it_is_the_earliest(h: Harness) -> None:
    h.create_run(deadline_ms=h.now_ms + 10_000)
    assert h.effects == [("arm", h.now_ms + 10_000)]
    h.create_run(deadline_ms=h.now_ms + 20_000)
    assert h.effects == []  # later than the earliest
    h.create_run(deadline_ms=h.now_ms + 5_000)
    assert h.effects == [("arm", h.now_ms + 5_000)]
    h.create_run()
    assert h.effects == []


def test_cancel_wakes_tasks_and_queues_of_the_whole_subtree(h: Harness) -> None:
    h.ensure("other")
    parent = h.create_run()
    child = h.create_run(parent_id=parent)
    queued = h.submit(parent, "a")
    done = h.submit(parent, "b")
    below = h.ok("task.submit", **{**h.submit_args(child, "c"), "mailbox": "other"})["task_id"]
    h.receive(parent)  # a
    (delivery,) = h.receive(parent)  # b
    h.delivery("complete", delivery)
    h.cancel(parent)
    woken = h.woken()
    assert ("task", queued) in woken and ("task", below) in woken
    assert ("task", done) not in woken  # already finished
    assert ("queue", parent, MAILBOX) in woken and ("queue", child, "other") in woken
    assert h.task(done).state == TaskState.SUCCEEDED
    assert h.armed() == []  # the leases are due before the retention
