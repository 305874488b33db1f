"""A driver for the deterministic core, shared by the test_actors_* modules, and the tests of the
snapshot codec it relies on.

`Harness` holds one Core, a controllable `now_ms`, the current epoch and a counter for command
ids. `ok()` applies a command that must succeed; `err()` one that must be rejected, and checks
that the rejection left the snapshot as it was.
"""

from __future__ import annotations

import heapq
from typing import Any

import msgpack
import pytest

from runstate_server.actors import dispatch, events, storage
from runstate_server.actors.state import (
    EVENT_OVERHEAD_BYTES,
    Run,
    State,
    Task,
    from_snapshot,
    result_bytes,
    to_snapshot,
)

SPACE = "space-1"
MAILBOX = "work"
RETENTION_MS = 60_000
START_MS = 1_000_000


def pack(snapshot: dict[str, Any]) -> bytes:
    return msgpack.packb(snapshot, use_bin_type=True)


def unpack(data: bytes) -> dict[str, Any]:
    return msgpack.unpackb(data, raw=False)


def snapshot_bytes(state: State, *, without_clock: bool = False) -> bytes:
    snapshot = to_snapshot(state)
    if without_clock:
        snapshot = {**snapshot, "clock_ms": None}
    return pack(snapshot)


def round_trip(state: State) -> State:
    return from_snapshot(unpack(snapshot_bytes(state)))


def heap_is_valid(heap: list[Any]) -> bool:
    return all(heap[(i - 1) // 2] <= heap[i] for i in range(1, len(heap)))


class Harness:
    def __init__(self, space: str = SPACE, now_ms: int = START_MS, epoch: int = 1, numbered: bool = True) -> None:
        self.core = dispatch.Core()
        self.space = space
        self.now_ms = now_ms
        self.epoch = epoch
        self.commands = 0
        self.effects: list[tuple[Any, ...]] = []
        self.all_effects: list[tuple[Any, ...]] = []
        if numbered:  # as a node's first leader does (Node.prove_levels_when_due)
            self.number_creations()

    def number_creations(self) -> Any:
        """The leader's `state.number_creations` (no command id: a system command)."""
        command = {"type": "state.number_creations", "v": 1, "space": dispatch.SYSTEM_SPACE, "id": "", "args": {}}
        return self.core.apply(command, self.now_ms, self.epoch)[0]

    # -- plumbing --------------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self.core.state

    def next_id(self) -> str:
        self.commands += 1
        return f"{self.commands:08x}{self.commands * 2654435761 % 2**32:08x}"

    def apply(
        self, kind: str, *, space: str | None = None, epoch: int | None = None, idem: list[str] | None = None, **args: Any
    ) -> Any:
        command: dict[str, Any] = {
            "type": kind,
            "v": 1,
            "space": self.space if space is None else space,
            "id": self.next_id(),
            "args": args,
        }
        if idem is not None:
            command["idem"] = idem
        result, effects = self.core.apply(command, self.now_ms, self.epoch if epoch is None else epoch)
        # The wakes of the event log (events.py) go with nearly every command; test_actors_events.py checks them.
        self.all_effects = effects
        # The figures for the node's metrics ("observe") too; test_actors_tasks.py checks them.
        self.effects = [
            effect for effect in effects
            if effect[0] != "observe" and (effect[:1] != ("wake",) or effect[1][0] != events.EVENTS_WAKE)
        ]
        return result

    def ok(self, kind: str, **kwargs: Any) -> dict[str, Any]:
        result = self.apply(kind, **kwargs)
        assert "error" not in result, result
        return result

    def err(self, kind: str, **kwargs: Any) -> str:
        """Apply a command that must be rejected; return its code. The state must not change,
        apart from the clock the batch carries (checked separately)."""
        before = snapshot_bytes(self.state, without_clock=True)
        stored_before = self.state.stored_bytes
        result = self.apply(kind, **kwargs)
        assert "error" in result, result
        assert set(result["error"]) == {"code", "message"}
        assert self.effects == []
        assert snapshot_bytes(self.state, without_clock=True) == before, f"{kind} rejected but changed the state"
        assert self.state.stored_bytes == stored_before, f"{kind} rejected but changed the stored bytes"
        return result["error"]["code"]

    def advance(self, ms: int) -> None:
        self.now_ms += ms

    # -- commands --------------------------------------------------------------------------------

    def tick(self, retention_ms: int = RETENTION_MS) -> dict[str, Any]:
        return self.ok("tick", retention_ms=retention_ms)

    def ensure(self, name: str = MAILBOX, **args: Any) -> dict[str, Any]:
        return self.ok("mailbox.ensure", name=name, **args)

    def create_run(self, **args: Any) -> str:
        return self.ok("run.create", **args)["run_id"]

    def cancel(self, run_id: str, retention_ms: int = RETENTION_MS, **args: Any) -> dict[str, Any]:
        return self.ok("run.cancel", run_id=run_id, retention_ms=retention_ms, **args)

    def complete_run(self, run_id: str, retention_ms: int = RETENTION_MS) -> dict[str, Any]:
        return self.ok("run.complete", run_id=run_id, retention_ms=retention_ms)

    def submit_args(self, run_id: str, key: str, input: Any = None, **args: Any) -> dict[str, Any]:
        if input is None:
            input = {"key": key}
        return {
            "run_id": run_id,
            "mailbox": MAILBOX,
            "key": key,
            "input": input,
            "input_hash": args.pop("input_hash", f"hash:{input!r}"),
            **args,
        }

    def submit(self, run_id: str, key: str, input: Any = None, **args: Any) -> str:
        return self.ok("task.submit", **self.submit_args(run_id, key, input, **args))["task_id"]

    def receive(
        self, run_id: str, max: int = 1, lease_ms: int = 10_000, mailbox: str = MAILBOX, holder: str = "w1"
    ) -> list[str]:
        """Deliver up to `max` tasks; returns their delivery ids."""
        result = self.ok("task.receive", run_id=run_id, mailbox=mailbox, max=max, lease_ms=lease_ms, holder=holder)
        delivery_ids = [self.task(task_id).delivery_id for task_id in result["task_ids"]]
        assert all(isinstance(delivery_id, str) for delivery_id in delivery_ids)
        return delivery_ids  # type: ignore[return-value]

    def delivery(self, kind: str, delivery_id: str, **args: Any) -> dict[str, Any]:
        return self.ok("delivery." + kind, delivery_id=delivery_id, **args)

    # -- reads -----------------------------------------------------------------------------------

    def task(self, task_id: str) -> Task:
        return self.state.tasks[task_id]

    def task_of(self, delivery_id: str) -> Task:
        return self.state.tasks[delivery_id.split(".", 1)[0]]

    def run(self, run_id: str) -> Run:
        return self.state.runs[run_id]

    def woken(self) -> list[Any]:
        return [effect[1] for effect in self.effects if effect[0] == "wake"]

    def armed(self) -> list[int]:
        return [effect[1] for effect in self.effects if effect[0] == "arm"]


# -- the snapshot codec ------------------------------------------------------------------------


def busy_harness() -> Harness:
    """A state with a bit of everything: runs at two levels, a deadline, a stopped run, tasks in
    every state, a renewed lease and a retry backoff on the heap."""
    h = Harness()
    h.ensure()
    h.ensure("other")
    parent = h.create_run(name="parent", deadline_ms=h.now_ms + 3_600_000)
    child = h.create_run(parent_id=parent, child_limit=3)
    stopped = h.create_run()
    for key in "abcdef":
        h.submit(parent, key, attempts=3)
    h.submit(child, "x")
    h.ok("task.submit", **{**h.submit_args(child, "y"), "mailbox": "other"})
    h.submit(stopped, "z")
    first, second, third, fourth = h.receive(parent, max=4)
    h.delivery("complete", first, payload={"answer": 42, "list": [1, 2.5, None, "s"]})
    h.delivery("retry", second, error="flaky", delay_ms=5_000)
    h.delivery("reject", third, error="bad input")
    h.delivery("renew", fourth, lease_ms=20_000)
    h.receive(child)
    h.cancel(stopped, reason="operator")
    return h


def test_snapshot_round_trip_through_msgpack_is_equal() -> None:
    h = busy_harness()
    snapshot = to_snapshot(h.state)
    data = pack(snapshot)
    restored = from_snapshot(unpack(data))
    assert to_snapshot(restored) == unpack(data)
    assert pack(to_snapshot(restored)) == data
    assert restored == h.state  # dataclass equality, queues included


def test_restored_core_answers_like_the_original() -> None:
    h = busy_harness()
    twin = Harness()
    twin.core.restore(unpack(pack(h.core.snapshot())))
    twin.now_ms, twin.commands = h.now_ms, h.commands
    for harness in (h, twin):
        harness.advance(40_000)
        harness.tick()
    assert h.effects == twin.effects
    run_id = next(iter(h.state.runs))
    assert h.apply("task.receive", run_id=run_id, mailbox=MAILBOX, max=10, lease_ms=1_000, holder="w") == twin.apply(
        "task.receive", run_id=run_id, mailbox=MAILBOX, max=10, lease_ms=1_000, holder="w"
    )
    assert snapshot_bytes(h.state) == snapshot_bytes(twin.state)


def test_snapshot_is_a_value_not_a_view_of_the_live_state() -> None:
    h = busy_harness()
    snapshot = h.core.snapshot()
    frozen = pack(snapshot)
    parent = next(run.id for run in h.state.runs.values() if run.name == "parent")
    h.submit(parent, "later")
    h.create_run(parent_id=parent)
    h.advance(10_000)
    h.tick()
    assert pack(snapshot) == frozen


def test_two_cores_restored_from_one_snapshot_do_not_share_state() -> None:
    h = busy_harness()
    snapshot = unpack(pack(h.core.snapshot()))
    one, two = Harness(), Harness()
    one.core.restore(snapshot)
    two.core.restore(snapshot)
    one.commands = two.commands = h.commands
    one.now_ms = two.now_ms = h.now_ms
    before = snapshot_bytes(two.state)
    parent = next(run.id for run in one.state.runs.values() if run.name == "parent")
    one.submit(parent, "only-in-one")
    one.create_run(parent_id=parent)
    one.advance(10_000)
    one.tick()
    assert snapshot_bytes(two.state) == before


def test_snapshot_rejects_another_version() -> None:
    snapshot = to_snapshot(busy_harness().state)
    snapshot["v"] = 2
    with pytest.raises(ValueError, match="version"):
        from_snapshot(snapshot)


def test_due_heap_stays_a_heap() -> None:
    h = busy_harness()
    assert heap_is_valid(h.state.due)
    assert h.state.next_due_ms() == heapq.nsmallest(1, h.state.due)[0][0]


def assert_stored_bytes_recount(state: State) -> None:
    """The charges kept step by step equal a recount of what the state holds (every replica, and
    every restore, must count the same: the bytes limits decide what is accepted)."""
    for space in state.spaces.values():
        for event in space.events:
            # Weighed once, as it was appended: what result_bytes weighs its payload, as every version did.
            assert event.weight == (
                EVENT_OVERHEAD_BYTES + len(event.run_id or "") + len(event.aggregate_id) + result_bytes(event.payload)
            )
    kept = (
        state.stored_bytes, {space.id: space.stored_bytes for space in state.spaces.values()}, dict(state.idempotency_bytes),
        {space.id: space.event_bytes for space in state.spaces.values()},
    )
    storage.recount(state)
    recounted = (
        state.stored_bytes, {space.id: space.stored_bytes for space in state.spaces.values()}, state.idempotency_bytes,
        {space.id: space.event_bytes for space in state.spaces.values()},
    )
    assert recounted == kept
