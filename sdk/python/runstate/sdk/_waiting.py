"""Waiting on a server long poll in slices until a condition holds or a timeout passes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from runstate.sdk.errors import ConfigError, WaitTimeoutError

# One long poll (the server's bound); the shortest pause between two polls that answered early.
POLL_SLICE_MS = 30_000
POLL_PAUSE_S_MIN = 0.05


async def wait_until(
    poll: Callable[[int], Awaitable[dict[str, Any]]],
    done: Callable[[dict[str, Any]], bool],
    *,
    timeout_ms: int,
    what: str,
) -> dict[str, Any]:
    """Call `poll(wait_ms)` (a long poll) until `done(answer)`; WaitTimeoutError after timeout_ms."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or timeout_ms < 0:
        raise ConfigError(f"timeout_ms must be a non-negative integer, got {timeout_ms!r}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000
    while True:
        started = loop.time()
        answer = await poll(min(max(0, int((deadline - started) * 1000)), POLL_SLICE_MS))
        if done(answer):
            return answer
        now = loop.time()
        if now >= deadline:
            raise WaitTimeoutError(what, timeout_ms)
        if now - started < POLL_PAUSE_S_MIN:
            await asyncio.sleep(min(POLL_PAUSE_S_MIN, deadline - now))
