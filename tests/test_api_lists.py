"""The list reads of the console (GET /scopes, /tasks, /task-groups, /barriers, /timers) and the
mailbox stats, against a real dev node: filters, newest-first paging with a cursor that holds
under concurrent inserts, bad query values, and space isolation."""

from __future__ import annotations

import random
from typing import Any

import pytest

from runstate_server.actors import limits
from runstate_server.node.api import _paging as paging
from tests._http import Api, new_space
from tests._nodes import DevNode


def _space(dev_node: DevNode) -> Api:
    return Api(dev_node.url, space=new_space(dev_node.url, "lists"))


def _all(api: Api, path: str, field: str, limit: int, **query: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    cursor = ""
    while True:
        params = "&".join(f"{k}={v}" for k, v in {**query, "limit": str(limit), "cursor": cursor}.items())
        answer = api.ok("GET", f"{path}?{params}")
        seen.extend(answer[field])
        if answer["nextCursor"] is None:
            return seen
        cursor = answer["nextCursor"]


def test_scopes_list_filters_and_pages_newest_first(dev_node: DevNode) -> None:
    api = _space(dev_node)
    root = api.ok("POST", "/v1/scopes", {"name": "Alpha Root"})
    children = [api.ok("POST", "/v1/scopes", {"parentId": root["id"], "name": f"child-{i}"}) for i in range(3)]
    other = api.ok("POST", "/v1/scopes", {"name": "beta"})
    api.ok("POST", f"/v1/scopes/{other['id']}/cancel", {})
    everything = _all(api, "/v1/scopes", "scopes", 2)
    assert [run["id"] for run in everything] == [other["id"], *[c["id"] for c in reversed(children)], root["id"]]
    assert everything[0] == api.ok("GET", f"/v1/scopes/{other['id']}")
    roots = api.ok("GET", "/v1/scopes?root=true")["scopes"]
    assert [run["id"] for run in roots] == [other["id"], root["id"]]
    assert [r["id"] for r in api.ok("GET", f"/v1/scopes?parentId={root['id']}&limit=2")["scopes"]] == [
        children[2]["id"], children[1]["id"]]
    assert [r["id"] for r in api.ok("GET", "/v1/scopes?name=ALPHA")["scopes"]] == [root["id"]]
    assert [r["id"] for r in api.ok("GET", "/v1/scopes?state=CANCELLED")["scopes"]] == [other["id"]]


def _work(api: Api) -> tuple[str, str]:
    """A run and a WORK mailbox of the space: (run id, mailbox id)."""
    run = api.ok("POST", "/v1/scopes", {})
    mailbox = api.ok("PUT", "/v1/mailboxes/by-name/jobs", {})
    return run["id"], mailbox["id"]


def test_tasks_list_filters_pages_and_mailbox_stats(dev_node: DevNode) -> None:
    api = _space(dev_node)
    run_id, mailbox_id = _work(api)
    child = api.ok("POST", "/v1/scopes", {"parentId": run_id})["id"]
    other_mailbox = api.ok("PUT", "/v1/mailboxes/by-name/other", {})["id"]
    submitted = [
        api.ok("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": mailbox_id, "taskKey": f"k{i}", "input": i})["taskId"]
        for i in range(5)
    ]
    in_child = api.ok("POST", "/v1/tasks", {"scopeId": child, "mailboxId": mailbox_id, "taskKey": "c", "input": 0})["taskId"]
    elsewhere = api.ok("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": other_mailbox, "taskKey": "o", "input": 0})["taskId"]
    # One succeeds, one fails for good, one is cancelled; two stay QUEUED.
    for outcome in ("complete", "reject"):
        given = api.ok("POST", f"/v1/mailboxes/{mailbox_id}/recv", {"scopeId": run_id})
        if outcome == "complete":
            api.ok("POST", f"/v1/messages/{given['message']['id']}/complete", {"token": given["token"], "result": {"payload": 1}})
        else:
            api.ok("POST", f"/v1/messages/{given['message']['id']}/nack", {"token": given["token"], "retry": False, "error": "no"})
    api.ok("POST", f"/v1/tasks/{submitted[2]}/cancel", {})

    everything = _all(api, "/v1/tasks", "tasks", 2)
    assert [task["id"] for task in everything] == [elsewhere, in_child, *reversed(submitted)]
    assert everything[0] == api.ok("GET", f"/v1/tasks/{elsewhere}")
    by_mailbox = _all(api, "/v1/tasks", "tasks", 3, mailboxId=mailbox_id)
    assert [task["id"] for task in by_mailbox] == [in_child, *reversed(submitted)]
    in_run = _all(api, "/v1/tasks", "tasks", 2, scopeId=run_id, mailboxId=mailbox_id)
    assert [task["id"] for task in in_run] == list(reversed(submitted))
    with_below = _all(api, "/v1/tasks", "tasks", 2, scopeId=run_id, includeDescendants="true")
    assert [task["id"] for task in with_below] == [elsewhere, in_child, *reversed(submitted)]
    queued = _all(api, "/v1/tasks", "tasks", 10, scopeId=run_id, state="QUEUED", mailboxId=mailbox_id)
    assert [task["id"] for task in queued] == [submitted[4], submitted[3]]
    failed = api.ok("GET", "/v1/tasks?state=FAILED")["tasks"]
    assert [(task["id"], task["error"], task["attempt"]) for task in failed] == [(submitted[1], "no", 1)]

    stats = api.ok("GET", f"/v1/mailboxes/{mailbox_id}")["stats"]
    assert stats == {"queued": 3, "inFlight": 0, "oldestQueuedAgeSeconds": stats["oldestQueuedAgeSeconds"],
                     "succeeded": 1, "failed": 1, "cancelled": 1, "expired": 0, "attemptsTotal": 2}
    assert stats["oldestQueuedAgeSeconds"] >= 0
    listed = {m["id"]: m["stats"] for m in api.ok("GET", "/v1/mailboxes")["mailboxes"]}
    assert listed[mailbox_id]["succeeded"] == 1
    assert listed[other_mailbox] == {"queued": 1, "inFlight": 0, "oldestQueuedAgeSeconds": listed[other_mailbox][
        "oldestQueuedAgeSeconds"], "succeeded": 0, "failed": 0, "cancelled": 0, "expired": 0, "attemptsTotal": 0}
    given = api.ok("POST", f"/v1/mailboxes/{other_mailbox}/recv", {"scopeId": run_id})
    assert api.ok("GET", f"/v1/mailboxes/{other_mailbox}")["stats"]["inFlight"] == 1
    assert api.ok("GET", f"/v1/mailboxes/{other_mailbox}")["stats"]["oldestQueuedAgeSeconds"] is None
    assert given["message"]["id"] == elsewhere


def test_the_cursor_holds_while_tasks_are_added(dev_node: DevNode) -> None:
    """Paging newest first while new tasks arrive: each task that existed at the first page shows
    exactly once, in order; the new ones sort above the cursor and do not show."""
    api = _space(dev_node)
    run_id, mailbox_id = _work(api)

    def submit(key: str) -> str:
        body = {"scopeId": run_id, "mailboxId": mailbox_id, "taskKey": key, "input": key}
        return str(api.ok("POST", "/v1/tasks", body)["taskId"])

    before = [submit(f"a{i}") for i in range(9)]
    seen: list[str] = []
    answer = api.ok("GET", "/v1/tasks?limit=2")
    while True:
        seen.extend(task["id"] for task in answer["tasks"])
        submit(f"b{len(seen)}")  # a new one between pages
        if answer["nextCursor"] is None:
            break
        answer = api.ok("GET", f"/v1/tasks?limit=2&cursor={answer['nextCursor']}")
    assert seen == list(reversed(before))


def test_a_batch_lists_in_the_order_it_was_submitted(dev_node: DevNode) -> None:
    """Tasks submitted in one batch share a millisecond (one log entry) and have random ids: they
    list newest first in the reverse of their batch order, on every page, also while more batches
    arrive between pages; the event log tells of their creation in batch order."""
    api = _space(dev_node)
    run_id, mailbox_id = _work(api)

    def batch(prefix: str, count: int) -> list[str]:
        items = [{"scopeId": run_id, "mailboxId": mailbox_id, "taskKey": f"{prefix}{i}", "input": i} for i in range(count)]
        return [str(item["taskId"]) for item in api.ok("POST", "/v1/tasks/batch", {"tasks": items})["tasks"]]

    submitted = batch("a", limits.submit_batch_max)
    assert len({api.ok("GET", f"/v1/tasks/{task_id}")["createdAt"] for task_id in submitted[:10]}) == 1
    made = list(submitted)  # every task of the space, in creation order
    for query in ({}, {"scopeId": run_id}, {"mailboxId": mailbox_id}):
        existing = list(reversed(made))
        seen: list[str] = []
        cursor = ""
        while True:
            params = "&".join(f"{k}={v}" for k, v in {**query, "limit": "7", "cursor": cursor}.items())
            answer = api.ok("GET", f"/v1/tasks?{params}")
            seen.extend(task["id"] for task in answer["tasks"])
            made.extend(batch(f"b{len(made)}-", 3))  # newer ones, between pages
            if answer["nextCursor"] is None:
                break
            cursor = answer["nextCursor"]
        assert seen == existing, query
    created = [e["aggregateId"] for e in api.ok("GET", "/v1/events?types=task.created&limit=500")["events"]]
    assert created == made[: len(created)] and len(created) >= len(submitted)


def test_groups_barriers_and_timers_lists(dev_node: DevNode) -> None:
    api = _space(dev_node)
    run_id, mailbox_id = _work(api)
    other_run = api.ok("POST", "/v1/scopes", {})["id"]
    group = api.ok("POST", "/v1/task-groups", {"mailboxId": mailbox_id, "condition": "ALL_TERMINAL", "parentScopeId": run_id})
    member = api.ok("POST", f"/v1/task-groups/{group['id']}/tasks", {"taskKey": "m", "input": 1})
    second = api.ok("POST", "/v1/task-groups", {"mailboxId": mailbox_id, "condition": "ALL_TERMINAL", "parentScopeId": other_run})
    groups = _all(api, "/v1/task-groups", "taskGroups", 1)
    assert [g["id"] for g in groups] == [second["id"], group["id"]]
    assert groups[1] == api.ok("GET", f"/v1/task-groups/{group['id']}")
    assert [g["id"] for g in api.ok("GET", f"/v1/task-groups?scopeId={run_id}")["taskGroups"]] == [group["id"]]
    assert api.ok("GET", "/v1/task-groups?state=FINALIZED")["taskGroups"] == []
    members = api.ok("GET", f"/v1/tasks?groupId={group['id']}")["tasks"]
    assert [task["id"] for task in members] == [member["taskId"]]

    barriers = [api.ok("POST", "/v1/barriers", {"scopeId": scope, "target": 2}) for scope in (run_id, run_id, other_run)]
    listed = _all(api, "/v1/barriers", "barriers", 2)
    assert [b["id"] for b in listed] == [b["id"] for b in reversed(barriers)]
    assert listed[0] == api.ok("GET", f"/v1/barriers/{barriers[2]['id']}")
    in_run = api.ok("GET", f"/v1/barriers?scopeId={run_id}&limit=1")
    assert [b["id"] for b in in_run["barriers"]] == [barriers[1]["id"]]
    rest = api.ok("GET", f"/v1/barriers?scopeId={run_id}&limit=1&cursor={in_run['nextCursor']}")
    assert [b["id"] for b in rest["barriers"]] == [barriers[0]["id"]] and rest["nextCursor"] is None

    timers = [api.ok("POST", "/v1/timers", {"scopeId": run_id, "afterSeconds": 3600}) for _ in range(2)]
    api.ok("POST", f"/v1/timers/{timers[0]['id']}/cancel", {})
    listed_timers = api.ok("GET", f"/v1/timers?scopeId={run_id}")["timers"]
    assert [t["id"] for t in listed_timers] == [timers[1]["id"], timers[0]["id"]]
    assert listed_timers[0] == api.ok("GET", f"/v1/timers/{timers[1]['id']}")
    assert [t["id"] for t in api.ok("GET", "/v1/timers?state=CANCELLED")["timers"]] == [timers[0]["id"]]


def test_bad_query_values_are_validation_failed(dev_node: DevNode) -> None:
    api = _space(dev_node)
    for path in ("/v1/scopes", "/v1/tasks", "/v1/task-groups", "/v1/barriers", "/v1/timers"):
        for query in ("state=NOPE", "limit=0", "limit=501", "limit=x", "cursor=%25%25", "cursor=bm9jb2xvbg"):
            assert api.error("GET", f"{path}?{query}") == (400, "VALIDATION_FAILED"), (path, query)
    assert api.error("GET", "/v1/scopes?root=maybe") == (400, "VALIDATION_FAILED")
    assert api.error("GET", "/v1/tasks?includeDescendants=1") == (400, "VALIDATION_FAILED")


def test_a_space_sees_only_its_own(dev_node: DevNode) -> None:
    mine, theirs = _space(dev_node), _space(dev_node)
    run_id, mailbox_id = _work(theirs)
    theirs.ok("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": mailbox_id, "taskKey": "x", "input": 1})
    theirs.ok("POST", "/v1/barriers", {"scopeId": run_id, "target": 1})
    theirs.ok("POST", "/v1/timers", {"scopeId": run_id, "afterSeconds": 60})
    theirs.ok("POST", "/v1/task-groups", {"mailboxId": mailbox_id, "condition": "ALL_TERMINAL", "parentScopeId": run_id})
    mine.ok("POST", "/v1/scopes", {})
    assert len(mine.ok("GET", "/v1/scopes")["scopes"]) == 1
    for path, field in (("tasks", "tasks"), ("task-groups", "taskGroups"), ("barriers", "barriers"), ("timers", "timers")):
        assert mine.ok("GET", f"/v1/{path}")[field] == []
    assert mine.ok("GET", f"/v1/tasks?scopeId={run_id}")["tasks"] == []
    assert mine.ok("GET", f"/v1/tasks?mailboxId={mailbox_id}")["tasks"] == []
    assert mine.ok("GET", f"/v1/barriers?scopeId={run_id}")["barriers"] == []


def test_paging_with_ties_inserts_and_a_small_scan_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """_paging.page on its own: entries share creation ms (in a stream order unlike their creation
    numbers', as a merge of several streams may give them), new ones arrive between pages, and a
    scan budget far below the table ends pages early; every matching entry that existed at the
    start shows exactly once, highest (ms, creation number) first."""
    monkeypatch.setattr(limits, "list_scan_max", 3)
    rng = random.Random(7)
    table: list[tuple[int, int]] = []  # ms never decreases; numbers shuffled within an ms
    ms = 0
    numbers = rng.sample(range(1, 10**6), 400)
    for _ in range(200):
        ms += rng.choice((0, 0, 1, 5))
        table.append((ms, numbers.pop()))
    start = list(table)

    def matches(entry: tuple[int, int]) -> bool:
        return entry[1] % 10 < 4

    for limit in (1, 2, 7):
        seen: list[tuple[int, int]] = []
        after: paging.Cursor | None = None
        table[:] = start
        while True:
            found, cursor = paging.page(reversed(table), lambda e: e, matches, limit, after)
            assert len(found) <= limit
            seen.extend(found)
            ms += 1
            table.append((ms, 10**6 + len(table) * 10))  # a newer one, matching, between pages
            if cursor is None:
                break
            after = paging.decode_cursor(cursor)
        assert seen == sorted((e for e in start if matches(e)), reverse=True), limit
