"""Events over HTTP (the published protocol's §5.13), against a real dev node: a page from a
cursor, a watch that answers at once or when a change lands, its filters (types, aggregate, a run
and the runs below it), the cursor's errors; and what permits, allowances and budgets tell."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests._http import Api, new_space
from tests._nodes import DevNode


@pytest.fixture
def api(dev_node: DevNode) -> Api:
    api = Api(dev_node.url, space=new_space(dev_node.url, "events"))
    api.ok("POST", "/v1/mailboxes", {"name": "work"})
    return api


def mailbox_id(api: Api) -> str:
    return str(api.ok("GET", "/v1/mailboxes")["mailboxes"][0]["id"])


def new_run(api: Api, parent: str | None = None) -> str:
    return str(api.ok("POST", "/v1/scopes", {} if parent is None else {"parentId": parent})["id"])


def types_of(page: dict[str, Any]) -> list[str]:
    return [event["type"] for event in page["events"]]


def test_a_page_from_a_cursor_resumes_without_loss_or_repeat(api: Api) -> None:
    assert api.ok("GET", "/v1/events") == {"events": [], "nextCursor": "0"}
    run_id = new_run(api)
    task_id = api.ok("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": mailbox_id(api), "taskKey": "k", "input": 1})["taskId"]
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    page = api.ok("GET", "/v1/events")
    assert types_of(page) == ["scope.created", "task.created", "scope.cancelled", "task.cancelled"]
    created = page["events"][0]
    assert created["eventId"].startswith("evt_") and created["createdAt"].endswith("Z")
    assert (created["scopeId"], created["aggregateType"], created["aggregateId"]) == (run_id, "scope", run_id)
    assert page["events"][3]["payload"] == {"taskId": task_id, "state": "CANCELLED", "attempt": 0}
    assert page["nextCursor"] == page["events"][-1]["cursor"]
    # Two at a time, from a cursor: the same events, once each.
    first = api.ok("GET", "/v1/events?limit=2")
    second = api.ok("GET", f"/v1/events?limit=2&cursor={first['nextCursor']}")
    assert [e["eventId"] for e in first["events"] + second["events"]] == [e["eventId"] for e in page["events"]]
    assert api.ok("GET", f"/v1/events?cursor={second['nextCursor']}") == {"events": [], "nextCursor": second["nextCursor"]}


def test_bad_cursors_and_filters_are_refused(api: Api) -> None:
    new_run(api)
    for query in ("cursor=abc", "cursor=-1", "cursor=99", "limit=0", "limit=1001", "limit=x"):
        assert api.error("GET", f"/v1/events?{query}") == (400, "VALIDATION_FAILED"), query
    for query in ("waitSeconds=-1", "waitSeconds=nan", "waitSeconds=x", "aggregate=task", "aggregate=:x",
                  "types=" + ",".join(f"t{i}" for i in range(40))):
        assert api.error("GET", f"/v1/watch?{query}") == (400, "VALIDATION_FAILED"), query


def test_a_watch_answers_at_once_or_when_a_change_lands(api: Api) -> None:
    run_id = new_run(api)
    page = api.ok("GET", "/v1/watch?waitSeconds=5")  # events are there: at once
    assert types_of(page) == ["scope.created"]
    cursor = page["nextCursor"]
    threading.Timer(0.5, lambda: api.ok("POST", f"/v1/scopes/{run_id}/complete", {})).start()
    started = time.monotonic()
    page = api.ok("GET", f"/v1/watch?cursor={cursor}&waitSeconds=10")
    assert 0.3 < time.monotonic() - started < 5
    assert types_of(page) == ["scope.completed"]
    # Nothing after it: an empty page after the wait, with the same cursor.
    started = time.monotonic()
    empty = api.ok("GET", f"/v1/watch?cursor={page['nextCursor']}&waitSeconds=0.3")
    assert empty == {"events": [], "nextCursor": page["nextCursor"]} and time.monotonic() - started >= 0.25


def test_watch_filters_by_type_aggregate_and_run_with_the_runs_below_it(api: Api) -> None:
    parent, other = new_run(api), new_run(api)
    child = new_run(api, parent)
    mailbox = mailbox_id(api)
    task_id = api.ok("POST", "/v1/tasks", {"scopeId": child, "mailboxId": mailbox, "taskKey": "k", "input": 1})["taskId"]
    api.ok("POST", "/v1/tasks", {"scopeId": other, "mailboxId": mailbox, "taskKey": "k", "input": 1})
    api.ok("POST", f"/v1/scopes/{parent}/cancel", {})
    page = api.ok("GET", f"/v1/watch?scopeId={parent}")
    assert [(e["type"], e["scopeId"]) for e in page["events"]] == [
        ("scope.created", parent), ("scope.created", child), ("task.created", child), ("scope.cancelled", parent),
        ("scope.cancelled", child), ("task.cancelled", child),
    ]
    page = api.ok("GET", f"/v1/watch?scopeId={parent}&types=scope.cancelled")
    assert [(e["type"], e["scopeId"], e["payload"]["stoppedBy"]) for e in page["events"]] == [
        ("scope.cancelled", parent, parent), ("scope.cancelled", child, parent),
    ]
    # The watch of the run below sees its own stop.
    page = api.ok("GET", f"/v1/watch?scopeId={child}&types=scope.cancelled")
    assert [(e["type"], e["scopeId"]) for e in page["events"]] == [("scope.cancelled", child)]
    page = api.ok("GET", f"/v1/watch?aggregate=task:{task_id}")
    assert types_of(page) == ["task.created", "task.cancelled"]
    # A filtered empty page moves the cursor past what it skipped.
    head = api.ok("GET", "/v1/events")["nextCursor"]
    assert api.ok("GET", "/v1/watch?types=timer.fired") == {"events": [], "nextCursor": head}


def test_a_delivery_its_lease_lapse_and_its_success(api: Api) -> None:
    run_id = new_run(api)
    task_id = api.ok("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": mailbox_id(api), "taskKey": "k", "input": 1})["taskId"]
    admit = {"scopeId": run_id, "mailboxId": mailbox_id(api), "holder": "w", "holderSession": "s", "leaseSeconds": 1}
    cursor = api.ok("GET", "/v1/events")["nextCursor"]  # before the admit: its lease may lapse at once
    first = api.ok("POST", "/v1/tasks/admit", admit)
    assert first["taskId"] == task_id
    lapse = "types=delivery.lease_lost,task.queued"  # the lapse, after 1 s (the admit's task.running before it)
    page = api.ok("GET", f"/v1/watch?cursor={cursor}&aggregate=task:{task_id}&{lapse}&waitSeconds=10")
    assert types_of(page)[:2] == ["delivery.lease_lost", "task.queued"]
    second = api.ok("POST", "/v1/tasks/admit", admit)
    api.ok("POST", f"/v1/messages/{second['messageId']}/complete", {"token": second["token"]})
    page = api.ok("GET", f"/v1/watch?cursor={page['nextCursor']}&aggregate=task:{task_id}")
    assert [(e["type"], e["payload"]["attempt"]) for e in page["events"]] == [("task.running", 2), ("task.succeeded", 2)]


def test_a_cursor_older_than_the_log_is_expired(api: Api) -> None:
    # 5,100 tasks and their run's stop: 10,202 events, past the log's 10,000; the oldest dropped.
    run_id, mailbox = new_run(api), mailbox_id(api)
    for batch in range(51):
        tasks = [{"scopeId": run_id, "mailboxId": mailbox, "taskKey": f"{batch}-{i}", "input": None} for i in range(100)]
        api.ok("POST", "/v1/tasks/batch", {"tasks": tasks})
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    status, answer = api("GET", "/v1/watch?cursor=0&waitSeconds=5")
    assert status == 410 and answer["error"]["code"] == "CURSOR_EXPIRED" and "requestId" in answer["error"]
    assert api.error("GET", "/v1/events?cursor=201") == (410, "CURSOR_EXPIRED")
    page = api.ok("GET", "/v1/events?cursor=202&limit=1")  # the oldest kept is 203: nothing lost after 202
    assert [e["cursor"] for e in page["events"]] == ["203"]
    oldest = api.ok("GET", "/v1/watch?limit=1")  # without a cursor: from the oldest kept
    assert [e["cursor"] for e in oldest["events"]] == ["203"]


# -- through the SDK -------------------------------------------------------------------------------


def test_the_sdk_watches_resumes_and_lists(dev_node: DevNode) -> None:
    import asyncio

    from runstate import AsyncRunstate, ConfigError, CursorExpiredError, Runstate
    from runstate.sdk.errors import error_from_response

    space_id = new_space(dev_node.url, "events-sdk")

    async def main() -> str:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space_id) as rs:
            run = await rs.scopes.create()
            seen: list[dict[str, Any]] = []

            async def watch() -> None:
                async for event in rs.events.watch(scope_id=run.id, types=["scope.created", "scope.cancelled"], wait_seconds=5):
                    seen.append(event)
                    if event["type"] == "scope.cancelled":
                        return

            watcher = asyncio.ensure_future(watch())
            await asyncio.sleep(0.3)
            await run.cancel()
            await asyncio.wait_for(watcher, 10)
            assert [e["type"] for e in seen] == ["scope.created", "scope.cancelled"]
            page = await rs.events.list(cursor=seen[0]["cursor"])
            assert [e["eventId"] for e in page["events"]] == [seen[1]["eventId"]]
            with pytest.raises(ConfigError):
                await rs.events.list(types="scope.created")  # type: ignore[arg-type]
            return str(seen[0]["cursor"])

    cursor = asyncio.run(main())
    with Runstate(base_url=dev_node.url, space_id=space_id) as rs:
        event = next(iter(rs.events.watch(cursor=cursor, wait_seconds=1)))
        assert event["type"] == "scope.cancelled"
        assert rs.events.list(limit=1)["events"][0]["cursor"] == cursor
    assert isinstance(error_from_response(410, "CURSOR_EXPIRED", "gone"), CursorExpiredError)


def test_permits_allowances_and_budgets_tell_their_changes(api: Api) -> None:
    run_id = new_run(api)
    permit_id = api.ok("POST", "/v1/permits", {"name": "gpu", "units": 2})["id"]
    grant = api.ok("POST", f"/v1/permits/{permit_id}/acquire", {"scopeId": run_id, "units": 2, "holder": "w"})
    api.ok("POST", f"/v1/grants/{grant['grantId']}/release", {"token": grant["token"]})
    allowance_id = api.ok("POST", "/v1/allowances", {"name": "llm", "unitsLimit": 3, "windowSeconds": 60})["id"]
    consumed = api.ok("POST", f"/v1/allowances/{allowance_id}/consume", {"scopeId": run_id, "units": 2, "holder": "w"})
    api.ok("POST", f"/v1/allowances/{allowance_id}/cooldown", {"seconds": 30, "reason": "provider 429"})
    budget_id = api.ok("POST", "/v1/budgets", {"name": "usd", "limitMinor": "100"})["id"]
    reserved = api.ok("POST", f"/v1/budgets/{budget_id}/reserve", {"scopeId": run_id, "holder": "w", "amountMinor": "40"})
    api.ok("POST", f"/v1/budgets/{budget_id}/settle",
           {"reservationId": reserved["reservationId"], "amountMinor": "25", "workKey": "call-1"})
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})  # voids the rest
    page = api.ok("GET", f"/v1/watch?aggregate=permit:{permit_id}")
    assert [(e["type"], e["scopeId"], e["payload"]["grantId"], e["payload"]["units"]) for e in page["events"]] == [
        ("permit.granted", run_id, grant["grantId"], 2), ("permit.released", run_id, grant["grantId"], 2),
    ]
    page = api.ok("GET", f"/v1/watch?aggregate=allowance:{allowance_id}")
    assert types_of(page) == ["allowance.consumed", "allowance.cooldown"]
    assert page["events"][0]["payload"]["consumptionId"] == consumed["consumptionId"]
    assert page["events"][1]["scopeId"] is None and page["events"][1]["payload"]["reason"] == "provider 429"
    page = api.ok("GET", f"/v1/watch?aggregate=budget:{budget_id}")
    assert [(e["type"], e["payload"]["state"]) for e in page["events"]] == [
        ("budget.reserved", "ACTIVE"), ("budget.settled", "ACTIVE"), ("budget.voided", "SETTLED"),
    ]
    assert page["events"][1]["payload"]["chargedMinor"] == "25" and page["events"][2]["payload"]["reason"] == "scope_stopped"
    # A run's watch sees what was done in it, but not a cooldown (no run's).
    page = api.ok("GET", f"/v1/watch?scopeId={run_id}&types=permit.granted,allowance.consumed,allowance.cooldown,budget.voided")
    assert types_of(page) == ["permit.granted", "allowance.consumed", "budget.voided"]
