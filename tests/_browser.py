"""Browser tests of the web console: Python Playwright driving Debian's chromium (never a browser
download). A session-scoped browser per test worker, a fresh context (cookies, sessionStorage) per
test, closed after it. Ask for `console` after a test's own node fixture (`node_factory`,
`make_cluster`), so its pages (and their open long polls) close before the nodes stop.

    def test_x(console: Console, dev_node: DevNode) -> None:
        page = console.open(dev_node.url)           # a node without auth signs in by itself
        page = console.open(url, key=secret)        # or with a key, through the sign-in form

Screenshots: `console.screenshot(page, "runs")` saves <dir>/runs.png only when
RUNSTATE_CONSOLE_SCREENSHOTS=<dir> is set (the committed ones live in docs/console/).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from playwright.sync_api import expect

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SCREENSHOTS_ENV = "RUNSTATE_CONSOLE_SCREENSHOTS"
WIDE = {"width": 1280, "height": 860}
NARROW = {"width": 390, "height": 844}
# How long a page may take to show what a test waits for: the console's own polls (the shell's
# whoami every 5 s, the cluster view every 2 s) plus a loaded machine.
UI_TIMEOUT_MS = 20_000
EVALUATE_POLL_S = 0.05  # wait_true's pause between two evaluations


class Console:
    """Opens the console of a node in a fresh browser context of the test."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser
        self.contexts: list[Any] = []

    def new_page(self, viewport: dict[str, int] = WIDE, *, ignore_https_errors: bool = False) -> Any:
        """`ignore_https_errors`: for a node serving a private CA's certificate (Chromium is not told the CA)."""
        context = self.browser.new_context(viewport=viewport, ignore_https_errors=ignore_https_errors)
        context.set_default_timeout(UI_TIMEOUT_MS)
        self.contexts.append(context)
        return context.new_page()

    def open(self, base_url: str, *, key: str | None = None, space: str = "default", viewport: dict[str, int] = WIDE,
             page: Any = None) -> Any:
        """A page signed in to the console of the node at base_url (no key: a node without auth, which
        signs in by itself to the space the URL names)."""
        page = page or self.new_page(viewport)
        if key is None:
            page.goto(f"{base_url}/console/?{urlencode({'space': space})}")
            page.locator("[data-nav]").wait_for(state="attached")
            expect(page.locator("[data-space-switch]")).to_have_value(space)
            return page
        page.goto(f"{base_url}/console/")
        sign_in(page, key=key, space=space)
        return page

    def screenshot(self, page: Any, name: str) -> None:
        folder = os.environ.get(SCREENSHOTS_ENV)
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(folder) / f"{name}.png"), full_page=True)

    def close(self) -> None:
        for context in self.contexts:
            context.close()
        self.contexts.clear()


def sign_in(page: Any, *, key: str, space: str = "default") -> None:
    """Fills the sign-in form of a node with auth and waits for the shell."""
    form = page.locator('[data-page="sign-in"]')
    form.wait_for()
    page.locator('[data-action="sign-in"]:not([disabled])').wait_for()
    page.fill('input[name="space"]', space)
    page.fill('input[name="key"]', key)
    page.click('[data-action="sign-in"]')
    page.locator("[data-nav]").wait_for(state="attached")


def page_overflows(page: Any) -> bool:
    """The page itself scrolls sideways (a table's own scroll box may; the page may not)."""
    return bool(page.evaluate("document.documentElement.scrollWidth > document.documentElement.clientWidth + 1"))


def chromium_missing_message() -> str:
    return (
        f"the console's browser tests need Debian's chromium at {CHROMIUM}: "
        "apt-get update && apt-get install -y chromium (the README's test command and .ci/run do this)"
    )


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(chromium_missing_message())
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS, headless=True)
        own_loop = asyncio.events._get_running_loop()
        try:
            yield launched
        finally:
            # The session ends in some test's teardown, which may be one run with no running loop.
            asyncio.events._set_running_loop(own_loop)
            launched.close()


@contextlib.contextmanager
def playwright_loop_set_aside(item: pytest.Item) -> Iterator[None]:
    """Playwright's sync API leaves its event loop set as the thread's running loop while it runs
    (here: the whole session, once a test started the browser), so a later test on the same worker
    that called asyncio.run() failed ("cannot be called from a running event loop"). A test that
    does not use the browser runs each phase with no running loop; after it, the loop that was
    there is put back (or Playwright's, if the phase started it: its calls need it set)."""
    if "browser" in getattr(item, "fixturenames", ()):
        yield
        return
    before = asyncio.events._get_running_loop()
    asyncio.events._set_running_loop(None)
    try:
        yield
    finally:
        asyncio.events._set_running_loop(asyncio.events._get_running_loop() or before)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with playwright_loop_set_aside(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with playwright_loop_set_aside(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    with playwright_loop_set_aside(item):
        return (yield)


@pytest.fixture
def console(browser: Any) -> Iterator[Console]:
    opened = Console(browser)
    try:
        yield opened
    finally:
        opened.close()


def wait_true(page: Any, expression: str, arg: Any = None, timeout_ms: int = UI_TIMEOUT_MS) -> None:
    """Until `expression` (a function of `arg`) is true in the page. Not Playwright's
    wait_for_function: it polls with `new Function`, which the console's Content Security Policy
    (no 'unsafe-eval') refuses as soon as the first evaluation is false (on loaded cores)."""
    deadline = time.monotonic() + timeout_ms / 1000
    while not page.evaluate(expression, arg):
        assert time.monotonic() < deadline, f"still false after {timeout_ms} ms: {expression}"
        time.sleep(EVALUATE_POLL_S)
