"""The console tells the story of a run, in a real browser against a real node fed through the API:
a run's progress counts and its tasks by key (an unkeyed task says so), an error that wraps in a
readable width, money as money, one name for the keys a worker holds, an unnamed run's id shown
once, a task's history without raw JSON, a task's attempts as a timeline, the overview, the
workers page, and charts that start from the node's recent history."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests._browser import UI_TIMEOUT_MS, Console, wait_true
from tests._http import Api
from tests._nodes import DevNode

_EXPECT_TIMEOUT_MS_DEFAULT = 5_000  # Playwright's own
LONG_ERROR = "the upstream model refused the request because the prompt was too long for its context window " * 3
ERROR_WIDTH_PX_MIN = 200  # a wrapped error column is at least this wide (it was a few letters)
BUDGET_LIMIT_MINOR = "25000000"  # 25.00 USD at scale 6
RESERVED_MINOR = "3500000"  # 3.50 USD


@pytest.fixture(autouse=True)
def _patient_expectations() -> Iterator[None]:
    expect.set_options(timeout=UI_TIMEOUT_MS)
    try:
        yield
    finally:
        expect.set_options(timeout=_EXPECT_TIMEOUT_MS_DEFAULT)


def _space(node: DevNode) -> Api:
    """An API client of a new space of the node (made first: a space must exist before it is used)."""
    space = Api(node.url).ok("POST", "/v1/spaces", {"id": f"story-{uuid.uuid4().hex[:10]}"})["id"]
    return Api(node.url, space=space)


def _receive(api: Api, mailbox_id: str, run_id: str, holder: str) -> dict[str, Any]:
    return api.ok("POST", f"/v1/mailboxes/{mailbox_id}/recv", {"scopeId": run_id, "holder": holder, "holderSession": holder})


def _story(api: Api) -> dict[str, Any]:
    """A named run with an unnamed child run and five tasks: one succeeded (keyed), one failed with
    a long error after a lapsed attempt's takeover, one running under worker-b, one queued without a
    key, one cancelled; worker-b also holds a budget reservation of 3.50 USD."""
    run = api.ok("POST", "/v1/scopes", {"name": "nightly-report"})
    child = api.ok("POST", "/v1/scopes", {"parentId": run["id"]})
    mailbox = api.ok("POST", "/v1/mailboxes", {"name": "reports"})
    submit = lambda body: api.ok("POST", "/v1/tasks", {"mailboxId": mailbox["id"], "scopeId": run["id"], "attempts": 3, **body})["taskId"]  # noqa: E731
    done = submit({"taskKey": "report:acme", "input": {"customer": "acme"}})
    failed = submit({"taskKey": "report:globex", "input": {"customer": "globex"}})
    first = _receive(api, mailbox["id"], run["id"], "worker-a")
    assert first["message"]["id"] == done
    api.ok("POST", f"/v1/messages/{done}/complete", {"token": first["token"], "result": {"payload": {"pages": 12}}})
    second = _receive(api, mailbox["id"], run["id"], "worker-a")
    assert second["message"]["id"] == failed
    api.ok("POST", f"/v1/messages/{failed}/nack", {"token": second["token"], "retry": True, "delayMs": 0})
    again = _receive(api, mailbox["id"], run["id"], "worker-b")
    assert again["message"]["id"] == failed
    api.ok("POST", f"/v1/messages/{failed}/nack", {"token": again["token"], "retry": False, "error": LONG_ERROR})
    running = submit({"taskKey": "report:initech", "input": {"customer": "initech"}})
    cancelled = submit({"taskKey": "report:umbrella", "input": {"customer": "umbrella"}})
    unkeyed = api.ok("POST", "/v1/tasks", {"mailboxId": mailbox["id"], "scopeId": child["id"], "input": {"customer": "hooli"}})["taskId"]
    held = _receive(api, mailbox["id"], run["id"], "worker-b")
    assert held["message"]["id"] == running
    api.ok("POST", f"/v1/tasks/{cancelled}/cancel", {})
    budget = api.ok("POST", "/v1/budgets", {"name": "model-usd", "limitMinor": BUDGET_LIMIT_MINOR, "currency": "USD", "scale": 6})
    api.ok("POST", f"/v1/budgets/{budget['id']}/reserve", {"scopeId": run["id"], "amountMinor": RESERVED_MINOR, "holder": "worker-b"})
    return {"run": run, "child": child, "mailbox": mailbox, "done": done, "failed": failed, "running": running,
            "cancelled": cancelled, "unkeyed": unkeyed}


def _go(page: Any, path: str, name: str) -> Any:
    page.evaluate("path => { location.hash = path }", path)
    root = page.locator(f'[data-page="{name}"]')
    root.wait_for()
    return root


def test_a_runs_page_tells_its_progress_and_lists_its_tasks_by_key(console: Console, dev_node: DevNode) -> None:
    api = _space(dev_node)
    story = _story(api)
    page = console.open(dev_node.url, space=api.space or "")
    run = _go(page, f"/runs/{story['run']['id']}", "run")
    progress = run.locator("[data-progress]")
    for state, count in (("SUCCEEDED", 1), ("FAILED", 1), ("CANCELLED", 1), ("RUNNING", 1), ("QUEUED", 1)):
        expect(progress.locator(f'[data-count="{state}"] [data-count-value]')).to_have_text(str(count))
    tasks = run.locator('[data-table="tasks"]')
    expect(tasks.locator(f'[data-row="{story["done"]}"] [data-task-key]')).to_have_text("report:acme")
    unkeyed = tasks.locator(f'[data-row="{story["unkeyed"]}"]')
    expect(unkeyed.locator('[data-task-key="unkeyed"]')).to_contain_text("unkeyed")
    assert len(unkeyed.locator('[data-task-key="unkeyed"]').inner_text()) < 20  # not its 64-character hash
    expect(unkeyed.locator('a[data-link="run"]')).to_have_text(story["child"]["id"])  # a child run's task
    error = tasks.locator(f'[data-row="{story["failed"]}"] [data-error-text]')
    expect(error).to_contain_text("the upstream model refused")
    assert error.bounding_box()["width"] >= ERROR_WIDTH_PX_MIN
    # A count filters the table.
    progress.locator('[data-count="FAILED"]').click()
    expect(tasks.locator("[data-row]")).to_have_count(1)
    progress.locator('[data-count="FAILED"]').click()
    expect(tasks.locator("[data-row]")).to_have_count(5)
    # The worker holding a task and a reservation: one name for its keys, its money as money.
    workers = run.locator('[data-table="workers"]')
    expect(workers.locator("th", has_text="Keys held")).to_have_count(1)
    expect(workers.locator('[data-row="worker-b"] [data-reservation]')).to_contain_text("model-usd: 3.50 USD")
    console.screenshot(page, "story-run")
    _go(page, f"/waits?scopeId={story['run']['id']}", "waits")
    expect(page.locator('[data-table="workers"] [data-row="worker-b"] [data-reservation]')).to_contain_text("3.50 USD")
    # The runs list: a named run with its id below, an unnamed one's id once.
    runs = _go(page, "/runs", "runs")
    runs.locator('input[name="root"]').uncheck()
    child_row = runs.locator(f'[data-table="runs"] [data-row="{story["child"]["id"]}"]')
    expect(child_row.locator("[data-unnamed]")).to_have_text(story["child"]["id"])
    assert child_row.inner_text().count(story["child"]["id"]) == 1
    # A task's history: its events, each with what the other columns do not say.
    task = _go(page, f"/tasks/{story['failed']}", "task")
    history = task.locator('[data-table="history"]')
    expect(history.locator('[data-event-type="task.failed"]')).to_have_count(1)
    assert "taskId" not in history.inner_text() and "{" not in history.inner_text()


def test_the_overview_workers_and_a_tasks_attempts_tell_what_happened_before_the_page_opened(
    console: Console, dev_node: DevNode
) -> None:
    api = _space(dev_node)
    story = _story(api)  # everything happened before the browser opened: the pages read the past
    opened_ms = time.time() * 1000
    page = console.open(dev_node.url, space=api.space or "")
    overview = page.locator('[data-page="overview"]')  # the landing page
    tile = lambda name: overview.locator(f'[data-tile="{name}"] [data-tile-value]')  # noqa: E731
    expect(tile("runs-active")).to_have_text("1")
    expect(tile("queued")).to_have_text("1")
    expect(tile("in-flight")).to_have_text("1")
    expect(tile("succeeded")).to_have_text("1")
    expect(tile("failed")).to_have_text("1")
    expect(tile("cluster")).to_have_text("1 of 1")
    expect(overview.locator(f'[data-table="longest-waits"] [data-row="{story["mailbox"]["id"]}"]')).to_have_count(1)
    # The charts start from the log: two ended tasks plotted, and the depth's past (five tasks
    # queued at once, before any ran) drawn, not a line that starts now.
    expect(overview.locator('[data-chart="throughput"] [data-line="ended"]')).to_have_count(1)
    depth = overview.locator('[data-chart="depth"] [data-line="queued"]')
    expect(depth).to_have_count(1)
    assert float(depth.get_attribute("data-from")) < opened_ms
    assert depth.get_attribute("d").count("V") >= 4  # steps: up with each submit, down as each ran
    console.screenshot(page, "story-overview")

    page.click('[data-nav-entry="workers"]')
    workers = page.locator('[data-page="workers"] [data-table="workers"]')
    worker_b = workers.locator('[data-row="worker-b"]')
    expect(worker_b.locator('[data-last-seen="now"]')).to_have_count(1)
    expect(worker_b.locator('[data-task-key="report:initech"]')).to_have_count(1)
    expect(worker_b.locator("[data-reservation]")).to_contain_text("model-usd: 3.50 USD")
    worker_a = workers.locator('[data-row="worker-a"]')
    expect(worker_a.locator('[data-last-seen="before"]')).to_have_count(1)
    expect(worker_a.locator("[data-succeeded]")).to_have_text("1")
    console.screenshot(page, "story-workers")

    # The failed task's attempts: worker-a's retried one, then worker-b's that failed.
    page.evaluate("path => { location.hash = path }", f"/tasks/{story['failed']}")
    timeline = page.locator('[data-page="task"] [data-timeline]')
    expect(timeline.locator("[data-attempt]")).to_have_count(2)
    expect(timeline.locator('[data-attempt="1"] [data-ended]')).to_have_text("queued again")
    expect(timeline.locator('[data-attempt="2"] [data-ended="FAILED"]')).to_have_count(1)
    expect(timeline.locator('[data-attempt="2"] [data-link="worker"]')).to_have_text("worker-b")
    console.screenshot(page, "story-task-attempts")


def test_the_queues_depth_chart_starts_from_the_log(console: Console, dev_node: DevNode) -> None:
    api = _space(dev_node)
    run = api.ok("POST", "/v1/scopes", {"name": "depth"})
    mailbox = api.ok("POST", "/v1/mailboxes", {"name": "depth"})
    for n in range(3):
        api.ok("POST", "/v1/tasks", {"mailboxId": mailbox["id"], "scopeId": run["id"], "input": {"n": n}})
    _receive(api, mailbox["id"], run["id"], "worker-d")
    opened_ms = time.time() * 1000
    page = console.open(dev_node.url, space=api.space or "")
    page.click('[data-nav-entry="queues"]')
    chart = page.locator('[data-page="queues"] [data-chart="depth"]')
    # Before the page opened: 1, 2, 3 queued, then 2 once one ran; the page's own samples follow.
    for line in ("queued", "inFlight"):
        wait_true(page, "([el, before]) => Number(el.getAttribute('data-from')) < before",
                  [chart.locator(f'[data-line="{line}"]').element_handle(), opened_ms])
