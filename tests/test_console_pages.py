"""The web console in a real browser against real nodes: sign-in (with a key, a bad key, a node
without auth), API keys (the secret shown once, revoking the console's own key signs it out),
a run's page (cancel with a confirmation: its tasks end CANCELLED), the banner when the node stops
answering, and every page at 1280 and 390 px without sideways scrolling of the page itself."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests._browser import NARROW, WIDE, Console, page_overflows, wait_true
from tests._http import Api
from tests._nodes import DevNode

# The console's own pages (the page table in console/src/routes.ts); "{run}" is a run's id.
PAGES = {"overview": "/overview", "runs": "/runs", "run": "/runs/{run}", "workers": "/workers", "cluster": "/cluster",
         "keys": "/keys", "spaces": "/spaces"}


def _run_with_tasks(api: Api, tasks: int = 2, held_by: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """A run with a child run and `tasks` queued tasks; `held_by` receives the first under a lease."""
    run = api.ok("POST", "/v1/scopes", {"name": f"console-{uuid.uuid4().hex[:8]}"})
    api.ok("POST", "/v1/scopes", {"name": "child", "parentId": run["id"]})
    mailbox = api.ok("POST", "/v1/mailboxes", {"name": f"jobs-{uuid.uuid4().hex[:8]}"})
    ids = [
        api.ok("POST", "/v1/tasks", {"mailboxId": mailbox["id"], "scopeId": run["id"], "input": {"n": n}})["taskId"]
        for n in range(tasks)
    ]
    if held_by is not None:
        api.ok("POST", f"/v1/mailboxes/{mailbox['id']}/recv", {"scopeId": run["id"], "holder": held_by, "holderSession": "s1"})
    return run, ids


def test_sign_in_with_a_key_shows_the_runs_and_the_operator_nav(console: Console, auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    page = console.new_page()
    page.goto(f"{node.url}/")  # the root redirects to the console
    page.locator('[data-page="sign-in"]').wait_for()
    console.screenshot(page, "sign-in")
    console.open(node.url, key=secret, page=page)
    page.locator('[data-page="overview"]').wait_for()  # the landing page
    assert page.locator('[data-nav-entry="spaces"]').count() == 1  # an operator admin key
    assert page.locator('[data-nav-entry="keys"]').count() == 1
    # The key lives in this tab's sessionStorage only.
    assert page.evaluate("Object.keys(localStorage).length") == 0
    assert page.context.cookies() == []


def test_a_bad_key_is_refused_with_a_clear_message(console: Console, auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    page = console.new_page()
    page.goto(f"{node.url}/console/")
    page.locator('[data-action="sign-in"]:not([disabled])').wait_for()
    page.fill('input[name="key"]', "rsk_not-a-key-of-this-node")
    page.click('[data-action="sign-in"]')
    error = page.locator("[data-error]")
    error.wait_for()
    assert "not valid" in error.inner_text()
    assert page.locator("[data-nav]").count() == 0
    page.fill('input[name="space"]', "another-space")  # a valid key of another space
    page.fill('input[name="key"]', secret)
    page.click('[data-action="sign-in"]')
    page.locator('[data-error]:has-text("belongs to the space")').wait_for()
    assert page.locator("[data-nav]").count() == 0


def test_a_key_without_admin_sees_no_keys_or_spaces_entry(console: Console, auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    reader = Api(node.url, key=secret).ok(
        "POST", "/v1/keys", {"space": "default", "name": "reader", "permissions": ["coordination_read"]}
    )
    page = console.open(node.url, key=reader["key"])
    page.locator('[data-page="overview"]').wait_for()
    assert page.locator('[data-nav-entry="keys"]').count() == 0
    assert page.locator('[data-nav-entry="spaces"]').count() == 0
    page.goto(f"{node.url}/console/#/keys")  # typed in by hand: the page says what the key lacks
    error = page.locator('[data-page="keys"] [data-error]')
    error.wait_for()
    assert "lacks admin" in error.inner_text()


def test_the_runs_list_follows_the_event_log_and_filters(console: Console, auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    api = Api(node.url, key=secret)
    page = console.open(node.url, key=secret)
    page.click('[data-nav-entry="runs"]')
    page.locator('[data-page="runs"]').wait_for()
    tag = uuid.uuid4().hex[:8]
    made = api.ok("POST", "/v1/scopes", {"name": f"live-{tag}"})
    page.locator(f'[data-table="runs"] [data-row="{made["id"]}"]').wait_for()  # no reload: the watch saw it
    other = api.ok("POST", "/v1/scopes", {"name": f"other-{tag}"})
    page.locator(f'[data-table="runs"] [data-row="{other["id"]}"]').wait_for()
    page.fill('input[name="name"]', f"LIVE-{tag}")  # a case-insensitive part of the name
    page.locator(f'[data-table="runs"] [data-row="{other["id"]}"]').wait_for(state="detached")
    assert page.locator('[data-table="runs"] [data-row]').count() == 1
    api.ok("POST", f"/v1/scopes/{made['id']}/cancel", {})
    page.locator(f'[data-row="{made["id"]}"] [data-run-state="CANCELLED"]').wait_for()
    page.select_option('select[name="state"]', "ACTIVE")
    page.locator('[data-page="runs"] [data-empty]').wait_for()


def test_complete_a_run_from_its_page(console: Console, auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    api = Api(node.url, key=secret)
    run, _ = _run_with_tasks(api, tasks=0)
    page = console.open(node.url, key=secret)
    page.goto(f"{node.url}/console/#/runs/{run['id']}")
    page.click('[data-action="complete"]')
    page.click('[data-confirm="complete"] [data-action="confirm"]')
    page.locator('[data-stored="COMPLETED"]').wait_for()
    assert page.locator('[data-action="cancel"]').count() == 0
    assert api.ok("GET", f"/v1/scopes/{run['id']}")["storedState"] == "COMPLETED"


def test_an_operator_creates_a_space(console: Console, auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    page = console.open(node.url, key=secret)
    page.click('[data-nav-entry="spaces"]')
    space = f"team-{uuid.uuid4().hex[:8]}"
    page.fill('[data-form="create-space"] input[name="id"]', space)
    page.fill('[data-form="create-space"] input[name="name"]', "Team")
    page.click('[data-form="create-space"] [data-action="create"]')
    page.locator(f'[data-table="spaces"] [data-row="{space}"]').wait_for()
    page.fill('[data-form="create-space"] input[name="id"]', space)  # again: the node's CONFLICT is shown
    page.click('[data-form="create-space"] [data-action="create"]')
    assert "CONFLICT" in page.locator('[data-page="spaces"] [data-error]').inner_text()


def test_a_node_without_auth_signs_in_by_itself_and_the_console_can_write(console: Console, dev_node: DevNode) -> None:
    api = Api(dev_node.url)
    run, tasks = _run_with_tasks(api, tasks=1)
    page = console.new_page()
    page.goto(f"{dev_node.url}/console/")
    page.locator("[data-nav]").wait_for()  # no sign-in form: GET /v1/whoami said no key is needed
    assert page.locator('[data-page="sign-in"]').count() == 0
    assert page.locator("[data-no-auth]").count() == 1
    assert page.locator('[data-action="sign-out"]').count() == 0  # nothing to sign out of
    # A POST from the console passes the guard of a node without auth (a loopback Origin).
    page.goto(f"{dev_node.url}/console/#/runs/{run['id']}")
    page.click('[data-action="cancel"]')
    page.click('[data-action="confirm"]')
    page.locator('[data-stored="CANCELLED"]').wait_for()
    assert api.ok("GET", f"/v1/tasks/{tasks[0]}")["state"] == "CANCELLED"
    page.click('[data-nav-entry="keys"]')  # such a node makes no keys: the page says so
    page.locator('[data-page="keys"] [data-no-auth]').wait_for()
    assert page.locator('[data-form="create-key"]').count() == 0
    # The space switch lists the node's spaces; choosing one opens it.
    space = f"other-{uuid.uuid4().hex[:8]}"
    api.ok("POST", "/v1/spaces", {"id": space})
    page.reload()
    page.locator("[data-space-switch] option", has_text=space).wait_for(state="attached")
    page.select_option("[data-space-switch]", space)
    wait_true(page, "s => JSON.parse(sessionStorage.getItem('runstate.console.session')).space === s", space)


def test_create_a_key_and_see_its_secret_once(console: Console, auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    page = console.open(node.url, key=secret)
    page.click('[data-nav-entry="keys"]')
    page.locator('[data-page="keys"]').wait_for()
    name = f"worker-{uuid.uuid4().hex[:6]}"
    page.fill('[data-form="create-key"] input[name="name"]', name)
    page.uncheck('input[name="coordination_write"]')
    page.click('[data-form="create-key"] [data-action="create"]')
    shown = page.locator("[data-secret-value]")
    shown.wait_for()
    new_secret = shown.inner_text().strip()
    assert new_secret.startswith("rsk_")
    who = Api(node.url, key=new_secret).ok("GET", "/v1/whoami")
    assert who["permissions"] == ["coordination_read"]
    # The list reloads after the secret is shown: wait for the new key's row (the reload races this test).
    page.locator(f'[data-table="keys"] [data-row="{who["keyId"]}"]').wait_for()
    assert page.locator(f'[data-table="keys"] [data-row="{who["keyId"]}"]').count() == 1
    console.screenshot(page, "keys-secret-once")
    page.reload()
    page.locator('[data-table="keys"]').wait_for()
    assert page.locator("[data-secret-value]").count() == 0
    assert new_secret not in page.content()
    row = page.locator(f'[data-table="keys"] [data-row="{who["keyId"]}"]')
    row.locator('[data-action="revoke"]').click()
    assert Api(node.url, key=new_secret).ok("GET", "/v1/whoami")["keyId"] == who["keyId"]  # not before the confirmation
    row.locator('[data-action="confirm"]').click()
    row.locator('[data-state="REVOKED"]').wait_for()
    assert Api(node.url, key=new_secret)("GET", "/v1/whoami")[0] == 401


def test_revoking_the_consoles_key_mid_session_signs_it_out(console: Console, auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    admin = Api(node.url, key=secret)
    made = admin.ok("POST", "/v1/keys", {"space": "default", "name": "short-lived", "permissions": ["admin", "coordination_read"]})
    page = console.open(node.url, key=made["key"])
    page.locator('[data-page="overview"]').wait_for()
    admin.ok("POST", f"/v1/keys/{made['id']}/revoke")
    message = page.locator("[data-signed-out]")
    message.wait_for()  # the open watch, or the shell's next whoami, meets the 401
    assert "Signed out" in message.inner_text() and "Sign in again" in message.inner_text()
    assert page.evaluate("sessionStorage.length") == 0


def test_cancel_a_run_from_its_page_cancels_its_tasks(console: Console, auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    api = Api(node.url, key=secret)
    run, tasks = _run_with_tasks(api, tasks=2, held_by="worker-7")
    page = console.open(node.url, key=secret)
    page.click('[data-nav-entry="runs"]')
    page.locator(f'[data-table="runs"] [data-row="{run["id"]}"] a').click()
    page.locator('[data-page="run"]').wait_for()
    page.locator(f'[data-table="tasks"] [data-row="{tasks[0]}"]').wait_for()
    assert page.locator("[data-tree-node]").count() == 2
    # The worker and what it holds: the task it received.
    page.locator(f'[data-table="workers"] [data-row="worker-7"] a[href="#/tasks/{tasks[0]}"]').wait_for()
    # The run's own groups, barriers, timers and waits are one click away.
    for linked in ("groups", "barriers", "timers", "waits"):
        assert page.get_attribute(f'[data-link="run-{linked}"]', "href") == f"#/{linked}?scopeId={run['id']}"
    page.click('[data-link="run-groups"]')
    page.locator('[data-page="groups"]').wait_for()
    page.go_back()
    page.locator('[data-page="run"] [data-action="cancel"]').wait_for()
    page.click('[data-action="cancel"]')
    page.locator('[data-confirm="cancel"]').wait_for()  # asks first
    assert api.ok("GET", f"/v1/scopes/{run['id']}")["effective"] == "ACTIVE"
    page.click('[data-action="confirm"]')
    page.locator('[data-stored="CANCELLED"]').wait_for()
    for task in tasks:
        page.locator(f'[data-table="tasks"] [data-row="{task}"] [data-state="CANCELLED"]').wait_for()
    assert api.ok("GET", f"/v1/scopes/{run['id']}")["storedState"] == "CANCELLED"


def test_a_node_that_stops_answering_shows_a_banner_and_recovers(node_factory: Callable[..., DevNode], console: Console) -> None:
    node = node_factory(in_memory=True).start()
    page = console.open(node.url)
    page.locator('[data-page="overview"]').wait_for()
    node.kill()
    page.locator('[data-banner="down"]').wait_for()
    assert node.url.replace("http://", "") in page.locator('[data-banner="down"]').inner_text()
    assert page.locator('[data-page="overview"]').count() == 1  # not a blank page
    node.start()
    page.locator('[data-banner="down"]').wait_for(state="detached")
    page.locator('[data-page="overview"] [data-tile="queued"]').wait_for()


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1280", "390"])
def test_every_page_fits_the_width(console: Console, auth_node: tuple[DevNode, str], viewport: dict[str, int]) -> None:
    node, secret = auth_node
    run, _ = _run_with_tasks(Api(node.url, key=secret), tasks=3, held_by="worker-1")
    page = console.open(node.url, key=secret, viewport=viewport)
    for name, path in PAGES.items():
        page.goto(f"{node.url}/console/#{path.format(run=run['id'])}")
        page.locator(f'[data-page="{name}"] table, [data-page="{name}"] [data-empty]').first.wait_for()
        wait_true(page, "() => !document.querySelector('[data-loading]')")  # every part of the page loaded
        assert not page_overflows(page), f"the {name} page scrolls sideways at {viewport['width']} px"
        console.screenshot(page, name if viewport is WIDE else f"{name}-{viewport['width']}")
    if viewport is NARROW:  # the nav folds into a menu
        assert not page.locator("[data-nav]").is_visible()
        page.click('[data-action="menu"]')
        assert page.locator("[data-nav]").is_visible()


def test_the_cluster_page_shows_the_last_scheduled_backup(node_factory: Callable[..., DevNode], console: Console,
                                                          tmp_path: Path) -> None:
    node = node_factory("--backup-dir", str(tmp_path / "backups"), "--backup-every", "1s").start()
    page = console.open(node.url)
    page.click('[data-nav-entry="cluster"]')
    shown = page.locator('[data-table="nodes"] [data-backup="taken"]')
    shown.wait_for()
    assert "at index" in shown.inner_text() and "MiB" in shown.inner_text()
