"""Lists page in creation order (State.creation_seq, each entity's `seq`; node/api/_paging.py pages
the core's tables by it): runs, tasks, groups, barriers and timers created in one millisecond keep
the order they were created in, not the order of their random ids; entities created while a list
is paged never reshuffle the pages already given; and a snapshot, of today or from before creation
numbers, restores the same order on every replica. Numbers start with the log's
`state.number_creations`, so replicas that restored an earlier release's snapshots at different
log indexes still number alike."""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runstate_server.actors import dispatch
from runstate_server.actors.state import (
    _RUN_FIELDS,
    _TASK_FIELDS,
    ENTITY_TABLES,
    SEQUENCED_TABLES,
    State,
    from_snapshot,
    to_snapshot,
)
from runstate_server.node.api import _paging as paging
from tests.test_actors_harness import MAILBOX, RETENTION_MS, SPACE, Harness, pack, round_trip, unpack

KINDS = SEQUENCED_TABLES  # runs, tasks, groups, barriers, timers


class RandomIds(Harness):
    """Command ids (and so entity ids) in an order unrelated to their creation, as a leader's are."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.random = random.Random(seed)

    def next_id(self) -> str:
        self.commands += 1
        return f"{self.random.getrandbits(64):016x}"


def _create(h: RandomIds, kind: str, run_id: str, count: int) -> list[str]:
    """`count` entities of `kind` made now (one millisecond: the harness's clock stands still), in
    creation order; tasks in one batch submit, as `POST /tasks/batch` makes them."""
    if kind == "tasks":
        args = [h.submit_args(run_id, f"k{h.commands}-{i}") for i in range(count)]
        ids = [h.next_id() for _ in range(count)]
        answers = h.ok("task.submit_many", items=args, ids=ids)["items"]
        return [answer["task_id"] for answer in answers]
    made = []
    for _ in range(count):
        if kind == "runs":
            made.append(h.create_run())
        elif kind == "groups":
            made.append(h.ok("group.create", run_id=run_id, retention_ms=RETENTION_MS, mailbox=MAILBOX,
                             condition="ALL_TERMINAL")["group_id"])
        elif kind == "barriers":
            made.append(h.ok("barrier.create", run_id=run_id, target=2)["barrier_id"])
        else:
            made.append(h.ok("timer.create", run_id=run_id, after_ms=60_000)["timer_id"])
    return made


def _legacy(state: State) -> State:
    """The state restored from its snapshot as written before creation numbers: rows without
    `seq`, no `creation_seq`."""
    data = unpack(pack(to_snapshot(state)))
    del data["creation_seq"]
    run_seq = _RUN_FIELDS.index("seq")
    data["runs"] = [row[:run_seq] + row[run_seq + 1:] for row in data["runs"]]  # the queues stay last
    data["tasks"] = [row[: _TASK_FIELDS.index("seq")] for row in data["tasks"]]
    for table in ("groups", "barriers", "timers"):
        names = [field.name for field in dataclasses.fields(ENTITY_TABLES[table])]
        assert names[-1] == "seq"
        data[table] = [row[:-1] for row in data[table]]
    return from_snapshot(data)


def _page_all(state_of: Any, kind: str, limit: int, between: Any) -> list[str]:
    """Page the table newest first as the list routes do, calling between() after every page."""
    seen: list[str] = []
    after: paging.Cursor | None = None
    while True:
        table = getattr(state_of(), kind)
        found, cursor = paging.page(reversed(table.values()), paging.creation_key, lambda _: True, limit, after)
        assert len(found) <= limit
        seen.extend(entity.id for entity in found)
        between()
        if cursor is None:
            return seen
        after = paging.decode_cursor(cursor)


STEP = st.tuples(st.sampled_from(KINDS), st.integers(1, 6), st.sampled_from((0, 0, 1, 3)))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32), steps=st.lists(STEP, min_size=1, max_size=12), limit=st.integers(1, 5),
    kind=st.sampled_from(KINDS), restore=st.sampled_from(("none", "snapshot", "legacy")),
    during=st.lists(st.integers(1, 4), max_size=6),
)
def test_lists_page_in_creation_order_while_entities_are_added(
    seed: int, steps: list[tuple[str, int, int]], limit: int, kind: str, restore: str, during: list[int]
) -> None:
    h = RandomIds(seed)
    h.ensure()
    home = h.create_run()
    created: dict[str, list[str]] = {table: [home] if table == "runs" else [] for table in KINDS}
    for step_kind, count, advance_ms in steps:
        h.advance(advance_ms)
        made = _create(h, step_kind, home, count)
        created[step_kind].extend(made)
        if step_kind == "groups":  # each group has a run of its own, created just before it
            created["runs"].extend(h.state.groups[group_id].run_id for group_id in made)
    # Restored (from today's snapshot, or one from before creation numbers): the same order.
    if restore == "snapshot":
        h.core.state = round_trip(h.state)
    elif restore == "legacy":
        h.core.state = _legacy(h.state)
        assert h.number_creations() == {"numbered": True}  # as the leader does once every node applies it
    for table in KINDS:
        entities = list(getattr(h.state, table).values())
        assert [entity.id for entity in entities] == created[table], table
        numbers = [entity.seq for entity in entities]
        assert numbers == sorted(numbers) and len(set(numbers)) == len(numbers) and all(numbers), table
        assert all(number <= h.state.creation_seq for number in numbers)

    # Paged, with new entities of the same millisecond (then of later ones) made between pages:
    # exactly the entities of the first page's time, newest first, each once.
    existing = list(reversed(created[kind]))
    additions = iter(during)

    def add() -> None:
        count = next(additions, 0)
        if count:
            _create(h, kind, home, count)
            h.advance(count % 2)

    assert _page_all(lambda: h.state, kind, limit, add) == existing


def test_a_batch_made_in_one_millisecond_lists_in_its_order_not_its_ids() -> None:
    """The case the issue found: ids sort otherwise than the batch (here, exactly backwards)."""
    h = RandomIds(0)
    h.ensure()
    run_id = h.create_run()
    ids = [f"{999 - i:08x}" for i in range(40)]
    args = [h.submit_args(run_id, f"k{i}") for i in range(40)]
    made = [answer["task_id"] for answer in h.ok("task.submit_many", items=args, ids=ids)["items"]]
    assert sorted(made) == list(reversed(made))
    assert len({h.state.tasks[task_id].created_ms for task_id in made}) == 1
    assert _page_all(lambda: h.state, "tasks", 7, lambda: None) == list(reversed(made))


def test_a_snapshot_keeps_the_creation_numbers_and_the_counter() -> None:
    h = RandomIds(1)
    h.ensure()
    run_id = h.create_run()
    _create(h, "tasks", run_id, 3)
    restored = round_trip(h.state)
    assert restored == h.state and restored.creation_seq == h.state.creation_seq == 4
    # The next entity on either continues from the same number.
    assert restored.next_seq() == h.state.next_seq() == 5


def test_a_snapshot_from_before_creation_numbers_is_numbered_by_the_logs_command_in_table_order() -> None:
    h = RandomIds(2)
    h.ensure()
    run_id = h.create_run()
    _create(h, "tasks", run_id, 3)
    _create(h, "barriers", run_id, 2)
    h.core.state = legacy = _legacy(h.state)
    # Restored, nothing is numbered, and what is created is not either, until the log says so.
    assert legacy.creation_seq is None and {t.seq for t in legacy.tasks.values()} == {0}
    _create(h, "tasks", run_id, 1)
    assert {t.seq for t in legacy.tasks.values()} == {0}
    assert h.number_creations() == {"numbered": True}
    assert [t.seq for t in legacy.tasks.values()] == [2, 3, 4, 5]
    assert [r.seq for r in legacy.runs.values()] == [1]
    assert [b.seq for b in legacy.barriers.values()] == [6, 7]
    assert legacy.creation_seq == 7
    assert h.number_creations() == {"numbered": False}  # once
    assert legacy.creation_seq == 7 and _create(h, "tasks", run_id, 1) and legacy.tasks[next(reversed(legacy.tasks))].seq == 8


class RecordingCore:
    """A core that keeps every command it applies (with its time and epoch), so that a replica can
    apply them again (the compiled core's methods cannot be wrapped in place)."""

    def __init__(self, core: dispatch.Core) -> None:
        self.core = core
        self.log: list[tuple[dict[str, Any], int, int]] = []

    @property
    def state(self) -> State:
        return self.core.state

    def apply(self, command: dict[str, Any], now_ms: int, epoch: int) -> Any:
        self.log.append((copy.deepcopy(command), now_ms, epoch))
        return self.core.apply(command, now_ms, epoch)


def test_replicas_that_restored_older_snapshots_at_different_indexes_number_alike() -> None:
    """A rolling upgrade: one replica restores an earlier release's snapshot taken at index i,
    another one taken at a later index j, and applies the log from i; runs ended and were dropped
    in between. The command that starts the numbers, at one index of the log, numbers them alike
    (numbering each as it restored its snapshot, the first would count the dropped ones too)."""
    h = RandomIds(3)
    recording = RecordingCore(h.core)
    h.core = recording  # type: ignore[assignment]
    h.ensure()
    keep = h.create_run()
    _create(h, "tasks", keep, 3)
    dropped = h.create_run()
    _create(h, "tasks", dropped, 2)
    early, applied_early = _legacy(h.state), len(recording.log)
    h.cancel(dropped)
    h.advance(RETENTION_MS + 1)
    h.tick()  # the cancelled run and its tasks are dropped
    assert dropped not in h.state.runs
    _create(h, "tasks", keep, 2)
    late, applied_late = _legacy(h.state), len(recording.log)
    number = {"type": "state.number_creations", "v": 1, "space": "", "id": "", "args": {}}
    replay = recording.log[applied_early:applied_late]
    from_early, from_late = dispatch.Core(), dispatch.Core()
    from_early.state, from_late.state = early, late
    for command, now_ms, epoch in replay:
        from_early.apply(copy.deepcopy(command), now_ms, epoch)
    for core in (from_early, from_late):
        core.apply(number, h.now_ms, h.epoch)
        _create_on(core, h.now_ms)
    assert to_snapshot(from_early.state) == to_snapshot(from_late.state)
    assert [t.seq for t in from_late.state.tasks.values()] == [2, 3, 4, 5, 6]


def _create_on(core: dispatch.Core, now_ms: int) -> None:
    """One more run, made the same on any replica (the same command)."""
    command = {"type": "run.create", "v": 1, "space": SPACE, "id": "feedfacefeedface", "args": {"retention_ms": RETENTION_MS}}
    result, _ = core.apply(command, now_ms, 1)
    assert "error" not in result, result
