"""The console's Queues, Tasks, Groups, Capacity and Waits pages in a real browser against a real
node, fed by the Python SDK: a queue drains live while the page is open (no reload); a task short
of a permit leads from its page to the permit and the task holding it; a task's history shows its
events; groups, barriers and timers show what the SDK made; every page fits 390 px, and an
unknown id shows an error, not a blank page; a read-only key sees the pages, a key without read is
told what it lacks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect
from runstate import Runstate

from tests._browser import NARROW, UI_TIMEOUT_MS, Console, page_overflows
from tests._http import Api, new_space
from tests._nodes import DevNode

_EXPECT_TIMEOUT_MS_DEFAULT = 5_000  # Playwright's own


@pytest.fixture(autouse=True)
def _patient_expectations() -> Iterator[None]:
    """The pages refresh some views every 5 s (barrier arrivals have no event): expectations wait
    as long as the browser fixture's other waits."""
    expect.set_options(timeout=UI_TIMEOUT_MS)
    try:
        yield
    finally:
        expect.set_options(timeout=_EXPECT_TIMEOUT_MS_DEFAULT)


def _space(node: DevNode) -> str:
    """A new space of the node (made first: a space must exist before it is used)."""
    return new_space(node.url, "console")


def _go(page: Any, path: str, name: str) -> Any:
    """Opens #<path> in the signed-in page and waits for the page `name`."""
    page.evaluate("path => { location.hash = path }", path)
    root = page.locator(f'[data-page="{name}"]')
    root.wait_for()
    return root


def test_a_queue_drains_live_and_a_task_shows_its_history(console: Console, dev_node: DevNode) -> None:
    space = _space(dev_node)
    with Runstate(base_url=dev_node.url, space_id=space) as rs:
        rs.mailboxes.ensure("jobs")
        run = rs.scopes.create(name="drain")
        jobs = run.mailbox("jobs")
        tickets = jobs.submit_many([{"n": n} for n in range(5)])
        mailbox_id = tickets[0].status()["mailboxId"]

        page = console.open(dev_node.url, space=space)
        _go(page, "/queues", "queues")
        row = page.locator(f'[data-table="mailboxes"] [data-row="{mailbox_id}"]')
        expect(row.locator('[data-stat="queued"]')).to_have_text("5")
        page.evaluate("window.__notReloaded = true")

        # A worker takes them one by one; the page follows the watch down to 0, without a reload.
        for left in range(4, -1, -1):
            (delivery,) = jobs.receive(max=1, lease_ms=60_000)
            delivery.complete({"payload": {"double": delivery.input["n"] * 2}})
            expect(row.locator('[data-stat="queued"]')).to_have_text(str(left))
        expect(row.locator('[data-stat="succeeded"]')).to_have_text("5")
        expect(page.locator('[data-chart="throughput"] figcaption')).to_contain_text("5 seen")
        assert page.evaluate("window.__notReloaded") is True
        console.screenshot(page, "queues")

        # The mailbox's tasks, filtered by state, and one task's page with its history.
        page.click(f'[data-table="mailboxes"] [data-row="{mailbox_id}"] a')
        mailbox = page.locator('[data-page="mailbox"]')
        mailbox.wait_for()
        expect(mailbox.locator('[data-table="tasks"] [data-row]')).to_have_count(5)
        page.select_option('[data-filter="state"]', "FAILED")
        expect(page.locator('[data-page="mailbox"] [data-empty]').first).to_contain_text("No FAILED tasks")
        page.select_option('[data-filter="state"]', "SUCCEEDED")
        expect(page.locator('[data-page="mailbox"] [data-table="tasks"] [data-row]')).to_have_count(5)

        task_id = tickets[2].id
        page.click(f'[data-table="tasks"] [data-row="{task_id}"] a[data-link="task"]')
        task = page.locator('[data-page="task"]')
        task.wait_for()
        expect(task.locator("[data-task-id]")).to_have_text(task_id)
        expect(task.locator('[data-json="outcome"]')).to_contain_text('"double": 4')
        history = task.locator('[data-table="history"]')
        for event_type in ("task.created", "task.running", "task.succeeded"):
            expect(history.locator(f'[data-event-type="{event_type}"]')).to_have_count(1)
        console.screenshot(page, "task")


def test_a_task_short_of_a_permit_leads_to_the_permit_and_its_holder(console: Console, dev_node: DevNode) -> None:
    space = _space(dev_node)
    with Runstate(base_url=dev_node.url, space_id=space, holder="gpu-worker") as rs:
        rs.pools.ensure("gpu", 1)
        rs.mailboxes.ensure("renders")
        run = rs.scopes.create(name="permits")
        jobs = run.mailbox("renders")
        holding = jobs.submit({"frame": 1}, slots="gpu")
        (delivery,) = jobs.receive(max=1, lease_ms=120_000)
        assert delivery.task_id == holding.id
        waiting = jobs.submit({"frame": 2}, slots="gpu")
        assert jobs.receive(max=1) == []  # a worker asks: the permit is full, the task stays queued

        page = console.open(dev_node.url, space=space)
        _go(page, f"/tasks/{waiting.id}", "task")
        why = page.locator('[data-section="why-waiting"]')
        permit_link = why.locator('[data-waits-for="permit"] a[data-link="permit"]')
        expect(permit_link).to_have_text("gpu")
        expect(why.locator('[data-holder="gpu-worker"]')).to_have_count(1)

        permit_link.click()
        permit = page.locator('[data-page="permit"]')
        permit.wait_for()
        grant = permit.locator('[data-table="grants"] [data-row]')
        expect(grant).to_have_count(1)
        expect(grant.locator('[data-link="worker"]')).to_have_text("gpu-worker")
        expect(permit.locator('[data-table="waiting"]')).to_contain_text(waiting.id)

        # The holder's task, and the worker in its run's diagnostics.
        grant.locator('a[data-link="task"]').click()
        page.locator('[data-page="task"] [data-task-id]').filter(has_text=holding.id).wait_for()
        expect(page.locator('[data-page="task"] [data-state="RUNNING"]').first).to_be_visible()
        page.locator('[data-page="task"] [data-field="Holder"] a[data-link="worker"]').click()
        waits = page.locator('[data-page="waits"]')
        waits.wait_for()
        expect(waits.locator('[data-table="workers"] [data-row="gpu-worker"]')).to_contain_text(holding.id)
        expect(waits.locator('[data-table="waiting"]')).to_contain_text(waiting.id)

        _go(page, "/waits", "waits")
        expect(page.locator('[data-page="waits"] [data-table="waiting"]')).to_contain_text(waiting.id)
        console.screenshot(page, "waits")

        rs.limits.ensure("search", 10, per="60s")
        run.limits.take("search", 3)
        rs.budgets.ensure("spend", 5.0)
        run.budgets.reserve("spend", 1.25)
        _go(page, "/capacity", "capacity")
        gpu = page.locator('[data-table="permits"] [data-row]').filter(has_text="gpu")
        expect(gpu.locator("[data-usage]")).to_have_attribute("data-usage", "1")
        expect(gpu.locator("[data-waiters]")).to_contain_text(waiting.id)
        expect(gpu.locator("[data-sparkline] path")).to_have_count(1)
        search = page.locator('[data-table="allowances"] [data-row]').filter(has_text="search")
        expect(search.locator("[data-usage]")).to_have_attribute("data-usage", "3")
        spend = page.locator('[data-table="budgets"] [data-row]').filter(has_text="spend")
        expect(spend.locator("[data-usage]")).to_contain_text("1.25")
        console.screenshot(page, "capacity")

        # Once the holder finishes, the waiting task runs: the permit page follows live.
        _go(page, f"/permits/{rs.pools.status('gpu')['id']}", "permit")
        delivery.complete({"ok": True})
        (second,) = jobs.receive(max=1, lease_ms=60_000, wait_ms=5_000)
        assert second.task_id == waiting.id
        expect(page.locator('[data-table="grants"] a[data-link="task"]')).to_have_text(waiting.id)
        second.complete({"ok": True})


def test_groups_barriers_and_timers_show_what_the_sdk_made(console: Console, dev_node: DevNode) -> None:
    space = _space(dev_node)
    with Runstate(base_url=dev_node.url, space_id=space) as rs:
        rs.mailboxes.ensure("votes")
        run = rs.scopes.create(name="together")
        group = run.groups.create("votes", "N_ACCEPTED", threshold=1, expected_members=2, parent_scope_id=run.id)
        first = group.submit({"vote": 1}, key="first")
        group.submit({"vote": 2}, key="second")
        for delivery in rs.scope(group.scope_id).mailbox("votes").receive(max=2, lease_ms=60_000):
            delivery.complete({"vote": delivery.input["vote"]})
        group.accept(first.id)
        barrier = run.barriers.by_name("stage", 3)
        barrier.arrive("worker-a")
        run.timers.create(after_seconds=3600)

        page = console.open(dev_node.url, space=space)
        _go(page, f"/groups?scopeId={run.id}", "groups")
        row = page.locator(f'[data-table="groups"] [data-row="{group.id}"]')
        expect(row.locator('[data-state="FINALIZED"]')).to_have_count(1)
        expect(row).to_contain_text("1 accepted")
        row.locator("a").first.click()
        members = page.locator('[data-page="group"] [data-table="members"]')
        expect(members.locator("[data-row]")).to_have_count(2)
        expect(members.locator(f'[data-row="{first.id}"] [data-verdict="ACCEPTED"]')).to_have_count(1)
        expect(page.locator('[data-page="group"] [data-field="Outcome"]')).to_contain_text("SUCCESS")
        console.screenshot(page, "groups")

        page.click('[data-page="group"] a[href="#/groups"]')
        page.locator('[data-page="groups"]').wait_for()
        _go(page, f"/barriers?scopeId={run.id}", "barriers")
        barrier_row = page.locator(f'[data-table="barriers"] [data-row="{barrier.id}"]')
        expect(barrier_row.locator("[data-arrivals]")).to_have_text("1 of 3")
        barrier.arrive("worker-b")  # no event of its own: the page's refresh shows it
        expect(barrier_row.locator("[data-arrivals]")).to_have_text("2 of 3")
        page.click('[data-tab="timers"]')
        timers = page.locator('[data-page="timers"] [data-table="timers"] [data-row]')
        expect(timers).to_have_count(1)
        expect(timers.locator('[data-state="ARMED"]')).to_have_count(1)


def test_the_pages_fit_a_narrow_screen(console: Console, dev_node: DevNode) -> None:
    space = _space(dev_node)
    with Runstate(base_url=dev_node.url, space_id=space) as rs:
        rs.pools.ensure("narrow-gpu", 2)
        rs.mailboxes.ensure("narrow-jobs")
        run = rs.scopes.create(name="narrow")
        ticket = run.mailbox("narrow-jobs").submit({"a-rather-long-input-field": "x" * 80}, slots="narrow-gpu")
        mailbox_id = ticket.status()["mailboxId"]
        permit_id = rs.pools.status("narrow-gpu")["id"]
        page = console.open(dev_node.url, space=space, viewport=NARROW)
        for path, name in [
            ("/queues", "queues"), (f"/queues/{mailbox_id}", "mailbox"), (f"/tasks/{ticket.id}", "task"),
            (f"/groups?scopeId={run.id}", "groups"), (f"/barriers?scopeId={run.id}", "barriers"),
            (f"/timers?scopeId={run.id}", "timers"), ("/capacity", "capacity"), (f"/permits/{permit_id}", "permit"),
            ("/waits", "waits"), (f"/waits?scopeId={run.id}", "waits"),
        ]:
            root = _go(page, path, name)
            root.locator("[data-table], [data-empty], [data-fields]").first.wait_for()
            assert not page_overflows(page), path
        # An id that is not there: the page says so (never a blank page).
        for path, name in [("/tasks/tsk_missing", "task"), ("/permits/pmt_missing", "permit"),
                           ("/groups/grp_missing", "group"), ("/waits?scopeId=run_missing", "waits")]:
            root = _go(page, path, name)
            expect(root.locator("[data-error]").first).to_contain_text("NOT_FOUND")


def test_a_reader_key_sees_the_pages_and_a_key_without_read_is_told(console: Console, auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    admin = Api(node.url, key=secret)
    tag = uuid.uuid4().hex[:8]
    reader = admin.ok("POST", "/v1/keys", {"space": "default", "name": f"reader-{tag}", "permissions": ["coordination_read"]})
    page = console.open(node.url, key=reader["key"])
    for entry in ("queues", "groups", "capacity", "waits"):
        expect(page.locator(f'[data-nav-entry="{entry}"]')).to_have_count(1)
    page.click('[data-nav-entry="capacity"]')
    page.locator('[data-page="capacity"] [data-table="permits"], [data-page="capacity"] [data-empty]').first.wait_for()
    assert page.locator('[data-page="capacity"] [data-error]').count() == 0

    configurer = admin.ok("POST", "/v1/keys", {"space": "default", "name": f"config-{tag}", "permissions": ["resource_config"]})
    page = console.open(node.url, key=configurer["key"])
    expect(page.locator('[data-nav-entry="queues"]')).to_have_count(0)
    page.goto(f"{node.url}/console/#/queues")  # typed in by hand: the page says what the key lacks
    expect(page.locator('[data-page="queues"] [data-error]').first).to_contain_text("lacks coordination_read")
