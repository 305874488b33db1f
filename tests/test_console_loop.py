"""The browser's event loop never leaks into the tests that do not use it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest


async def _answer() -> int:
    await asyncio.sleep(0)
    return 42


@pytest.fixture
def browser_started(request: pytest.FixtureRequest) -> Any:
    """The session's browser, started if it was not, without naming `browser` among this test's
    fixtures: as on a worker where a console test ran before a test that uses asyncio."""
    return request.getfixturevalue("browser")  # no call on it here: see playwright_loop_set_aside


def test_asyncio_run_works_beside_a_started_browser(browser_started: Any) -> None:
    # It failed so ("cannot be called from a running event loop") on a worker that had run a
    # console test before a test of the event watch.
    assert asyncio.run(_answer()) == 42
