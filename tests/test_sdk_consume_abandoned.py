"""consume(): sync handlers that ignore their lost lease are left running in their threads, but
only up to ABANDONED_HANDLERS_PER_SLOT per handler slot; beyond that they hold the consumer back
from taking more work, so a handler that hangs on every attempt cannot pile up threads."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

import pytest
from runstate import AsyncRunstate
from runstate.sdk import _consume

pytestmark = pytest.mark.slow

LEASE_MS = 300
# Long enough for a 300 ms lease to lapse while the node is stopped.
NODE_PAUSE_S = 1.0
# How long the test watches that no further attempt is taken while the bound is reached.
HELD_BACK_S = 1.5
WAIT_TIMEOUT_S = 20.0
HANDLER_WAIT_S_MAX = 60.0


async def wait_until(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def pause(node: Any) -> None:
    """SIGSTOP the node past the lease: the consumer's next renewal is refused (STALE_CLAIM)."""
    node.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(NODE_PAUSE_S)
    finally:
        node.process.send_signal(signal.SIGCONT)


def test_abandoned_sync_handlers_are_bounded_per_slot(node_factory: Any) -> None:
    assert _consume.ABANDONED_HANDLERS_PER_SLOT == 1  # the scenario below counts on it
    node = node_factory().start()
    attempts: list[int] = []
    gate = threading.Event()

    def handler(data: Any, delivery: Any) -> str:
        attempts.append(delivery.attempt)
        gate.wait(HANDLER_WAIT_S_MAX)  # ignores delivery.signal: abandoned once its lease is lost
        return "done"

    async def scenario() -> None:
        async with AsyncRunstate(base_url=node.url) as rs:
            await rs.mailboxes.ensure("hangs", mode="WORK")
            run = await rs.scopes.create()
            mailbox = run.mailbox("hangs")
            ticket = await mailbox.submit({"n": 1}, attempts=5)
            consuming = asyncio.create_task(mailbox.consume(handler, concurrency=1, lease_ms=LEASE_MS))
            try:
                await wait_until(lambda: attempts == [1], "attempt 1")
                await asyncio.to_thread(pause, node)
                # One abandoned thread is tolerated: attempt 2 is taken (and hangs as well).
                await wait_until(lambda: attempts == [1, 2], "attempt 2")
                await asyncio.to_thread(pause, node)
                await asyncio.sleep(HELD_BACK_S)
                # Two abandoned threads on one slot: the consumer takes nothing more.
                assert attempts == [1, 2]
                task = await run.task(ticket.id).status()
                assert (task["state"], task["attempt"]) == ("QUEUED", 2)  # two attempts made, the third waits
                gate.set()  # the abandoned threads return: the consumer goes on
                outcome = await ticket.result(timeout_ms=int(WAIT_TIMEOUT_S * 1000))
                assert (outcome["state"], attempts) == ("SUCCEEDED", [1, 2, 3])
            finally:
                gate.set()
                await run.cancel()
                await asyncio.wait_for(consuming, WAIT_TIMEOUT_S)

    asyncio.run(scenario())
