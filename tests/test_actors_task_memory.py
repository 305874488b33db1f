"""What a task keeps, kept small (runstate_server/actors/state.py, tasks.py; bench.memory measures
it): no empty lists of its own, one string for a key that is its input's hash, the digest of the
delivery that finished it rather than its token; and a snapshot written before these loads into
the same state and answers alike."""

from __future__ import annotations

from runstate_server.actors import errors
from runstate_server.actors.dispatch import Core
from runstate_server.actors.state import (
    _TASK_FIELDS,
    EMPTY,
    TaskState,
    delivery_digest,
    from_snapshot,
    to_snapshot,
)
from tests.test_actors_harness import MAILBOX, Harness, pack, unpack


def started() -> tuple[Harness, str]:
    h = Harness()
    h.ensure()
    return h, h.create_run()


def test_a_task_holds_no_empty_list_of_its_own() -> None:
    h, run_id = started()
    task = h.task(h.submit(run_id, "a"))
    assert task.slot_leases is EMPTY and task.subscribers is EMPTY
    h.ok("task.join", task_id=task.id, run_id=run_id, subscriber="s1")
    assert task.subscribers == ["s1"]
    h.ok("task.detach", task_id=task.id, subscriber="s1")
    assert task.subscribers is EMPTY
    (delivery,) = h.receive(run_id)
    h.delivery("complete", delivery, payload=1)
    assert task.slot_leases is EMPTY and task.subscribers is EMPTY
    # A snapshot writes them as the empty lists they stand for, and restores them shared.
    row = next(row for row in unpack(pack(to_snapshot(h.state)))["tasks"] if row[0] == task.id)
    assert row[_TASK_FIELDS.index("slot_leases")] == [] and row[_TASK_FIELDS.index("subscribers")] == []
    restored = from_snapshot(unpack(pack(to_snapshot(h.state)))).tasks[task.id]
    assert restored.slot_leases is EMPTY and restored.subscribers is EMPTY


def test_a_key_that_is_the_input_hash_is_one_string() -> None:
    h, run_id = started()
    digest = "ab" * 32
    task = h.task(h.submit(run_id, digest, input_hash=digest))
    assert task.input_hash is task.key
    restored = from_snapshot(unpack(pack(to_snapshot(h.state)))).tasks[task.id]
    assert restored.input_hash is restored.key and restored.key == digest
    other = h.task(h.submit(run_id, "k", input_hash=digest))
    assert other.input_hash == digest and other.key == "k"


def test_a_finished_task_keeps_the_digest_of_its_delivery_and_answers_a_repeated_complete() -> None:
    h, run_id = started()
    h.submit(run_id, "a")
    (delivery,) = h.receive(run_id)
    first = h.delivery("complete", delivery, payload=1)
    task = h.task_of(delivery)
    assert task.finished_by == delivery_digest(delivery) and len(task.finished_by) == 16
    assert h.delivery("complete", delivery, payload=1) == first
    assert h.err("delivery.complete", delivery_id=delivery + "x", payload=1) == errors.STALE_CLAIM


def test_a_snapshot_from_before_loads_into_the_same_state() -> None:
    """Rows as written before: the finishing delivery's token, and empty lists of their own."""
    h, run_id = started()
    h.submit(run_id, "done")
    h.submit(run_id, "queued")
    (delivery,) = h.receive(run_id)
    answer = h.delivery("complete", delivery, payload={"r": 1})
    task_id = delivery.split(".", 1)[0]
    old = unpack(pack(to_snapshot(h.state)))
    for row in old["tasks"]:
        if row[0] == task_id:
            row[_TASK_FIELDS.index("finished_by")] = delivery
    restored = Core(from_snapshot(old))
    assert to_snapshot(restored.state) == to_snapshot(h.state)
    assert restored.state == h.state
    # The delivery that finished it is still known by its token.
    command = {"type": "delivery.complete", "v": 1, "space": h.space, "id": "c1",
               "args": {"delivery_id": delivery, "payload": {"r": 1}}}
    assert restored.apply(command, h.now_ms, h.epoch)[0] == answer
    assert restored.state.tasks[task_id].state == TaskState.SUCCEEDED
    assert [t.key for t in restored.state.tasks.values() if t.state == TaskState.QUEUED] == ["queued"]
    assert MAILBOX in restored.state.runs[run_id].queues


def test_only_a_task_that_sets_a_rare_field_has_an_extra_object() -> None:
    h, run_id = started()
    plain = h.task(h.submit(run_id, "plain"))
    assert plain.extra is None and plain.needs is None and plain.deadline_ms is None and plain.group_id is None
    timed = h.task(h.submit(run_id, "timed", deadline_ms=h.now_ms + 60_000))
    assert timed.extra is not None and timed.deadline_ms == h.now_ms + 60_000
    # Back to every default: the object goes, so the task equals one that never had it.
    h.ok("task.join", task_id=plain.id, run_id=run_id, subscriber="s1")
    assert plain.extra is not None and plain.subscribers == ["s1"]
    h.ok("task.detach", task_id=plain.id, subscriber="s1")
    assert plain.extra is None
    restored = from_snapshot(unpack(pack(to_snapshot(h.state))))
    assert restored == h.state
    assert restored.tasks[plain.id].extra is None and restored.tasks[timed.id].deadline_ms == timed.deadline_ms
