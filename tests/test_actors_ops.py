"""The space's waits view (runstate_server.actors.ops.waits_view): jobs short of a resource are
listed whether or not a worker asked for them yet, oldest first, within a bounded look."""

from __future__ import annotations

from typing import Any

import pytest

from runstate_server.actors import limits, ops
from tests.test_actors_harness import MAILBOX, Harness


def job(h: Harness, run_id: str, key: str, mailbox: str, **needs: Any) -> str:
    task_id: str = h.ok("task.submit", **{**h.submit_args(run_id, key), "mailbox": mailbox, "needs": needs})["task_id"]
    return task_id


def waiting_tasks(h: Harness) -> list[tuple[str, list[str]]]:
    view = ops.waits_view(h.state, h.space, h.now_ms)
    return [(entry["taskId"], [wait["kind"] for wait in entry["waitsFor"]]) for entry in view["waiting"]]


def test_jobs_short_of_a_resource_are_listed_before_any_worker_asked(h: Harness, run_id: str) -> None:
    h.ensure("second")
    h.ok("pool.ensure", name="browser", size=1)
    h.ok("pool.ensure", name="free", size=5)
    h.ok("pool.acquire", name="browser", run_id=run_id, lease_ms=60_000, holder="w9")
    first = job(h, run_id, "a", "second", slots=["browser"])
    h.advance(1)
    job(h, run_id, "fits", "second", slots=["free"])  # nothing in its way: not here
    h.advance(1)
    h.submit(run_id, "plain")  # no needs: waits only for a worker, in its run's view
    h.advance(1)
    third = job(h, run_id, "b", MAILBOX, slots=["browser", "free"])
    # Nobody received: no resource remembers a blocked queue, and both jobs are listed, oldest first.
    assert waiting_tasks(h) == [(first, ["permit"]), (third, ["permit"])]
    assert ops.waits_view(h.state, h.space, h.now_ms)["truncated"] is False
    assert ops.waits_view(h.state, "another-space", h.now_ms) == {"waiting": [], "truncated": False}


def test_the_look_is_bounded_and_says_so(h: Harness, run_id: str, monkeypatch: pytest.MonkeyPatch) -> None:
    h.ok("pool.ensure", name="browser", size=1)
    h.ok("pool.acquire", name="browser", run_id=run_id, lease_ms=60_000, holder="w9")
    for index in range(3):
        h.submit(run_id, f"plain-{index}")
        h.advance(1)
    blocked = job(h, run_id, "late", MAILBOX, slots=["browser"])
    assert [task_id for task_id, _ in waiting_tasks(h)] == [blocked]
    monkeypatch.setattr(limits, "ops_queued_scan_max", 3)
    view = ops.waits_view(h.state, h.space, h.now_ms)
    assert view == {"waiting": [], "truncated": True}
