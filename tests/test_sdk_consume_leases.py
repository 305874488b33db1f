"""consume() keeps the lease of every handler that outlives it, renews none of those that return
at once, hands deliveries back when it is cancelled, and lets a handler's own CancelledError lapse
its lease (sdk/_consume.py: one task per delivery, one renewal timer per receive)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from runstate import AsyncRunstate
from runstate.sdk import _consume

pytestmark = pytest.mark.slow

LEASE_MS = 300
# The lease of the handler that must be renewed, and how long it runs: three and a half leases, so
# it keeps its delivery only if renewed, while a stall of the test's loop or the node of up to two
# thirds of a lease (the SDK renews every third: a loaded 2-core CI machine stalled one 200 ms)
# does not lapse it.
RENEWED_LEASE_MS = 1_000
LONG_HANDLER_S = 3.5
WAIT_TIMEOUT_S = 20.0
RESULT_TIMEOUT_MS = 20_000


async def consume_until_done(mailbox: Any, handler: Any, tickets: list[Any], **options: Any) -> list[dict[str, Any]]:
    stop = asyncio.Event()
    consuming = asyncio.create_task(mailbox.consume(handler, stop=stop, **options))
    try:
        return [await ticket.result(timeout_ms=RESULT_TIMEOUT_MS) for ticket in tickets]
    finally:
        stop.set()
        await asyncio.wait_for(consuming, WAIT_TIMEOUT_S)


def test_a_long_handler_among_quick_ones_of_one_receive_keeps_its_lease(dev_node: Any) -> None:
    """The quick handlers of a receive end before its renewal timer; the long one is still renewed."""

    async def scenario() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("leases", mode="WORK")
            run = await rs.scopes.create()
            mailbox = run.mailbox("leases")
            tickets = await mailbox.submit_many([{"n": n, "long": n == 0} for n in range(4)])
            renewed: list[bool] = []

            async def handle(data: dict[str, Any], delivery: Any) -> int:
                if data["long"]:
                    first_expiry = delivery.lease_expires_at
                    await asyncio.sleep(LONG_HANDLER_S)
                    renewed.append(delivery.lease_expires_at > first_expiry)
                return int(data["n"]) * 2

            outcomes = await consume_until_done(mailbox, handle, tickets, concurrency=4, lease_ms=RENEWED_LEASE_MS)
            assert [(outcome["state"], outcome["attempt"]) for outcome in outcomes] == [("SUCCEEDED", 1)] * 4
            assert renewed == [True]
            await run.cancel()

    asyncio.run(scenario())


def test_cancelling_consume_hands_running_deliveries_back(dev_node: Any) -> None:
    async def scenario() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("leases", mode="WORK")
            run = await rs.scopes.create()
            mailbox = run.mailbox("leases")
            await mailbox.submit({"n": 1})
            started = asyncio.Event()
            cancelled = asyncio.Event()

            async def handle(data: Any, delivery: Any) -> None:
                started.set()
                try:
                    await asyncio.sleep(WAIT_TIMEOUT_S)
                except asyncio.CancelledError:
                    cancelled.set()
                    raise

            consuming = asyncio.create_task(mailbox.consume(handle, lease_ms=60_000))
            await asyncio.wait_for(started.wait(), WAIT_TIMEOUT_S)
            consuming.cancel()
            with pytest.raises(asyncio.CancelledError):
                await consuming
            assert cancelled.is_set()
            # Released, not left to its 60 s lease: another receive gets it now.
            again = await mailbox.receive(wait_ms=5_000)
            assert len(again) == 1
            await again[0].complete()
            await run.cancel()

    asyncio.run(scenario())


def test_a_handler_raising_cancelled_error_itself_lets_its_lease_lapse(dev_node: Any) -> None:
    """Not a shutdown: the delivery is neither settled nor handed back, and consume() goes on."""

    async def scenario() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("leases", mode="WORK")
            run = await rs.scopes.create()
            mailbox = run.mailbox("leases")
            tickets = [await mailbox.submit({"n": 1}, attempts=3)]
            attempts: list[int] = []

            async def handle(data: Any, delivery: Any) -> str:
                attempts.append(delivery.attempt)
                if delivery.attempt == 1:
                    raise asyncio.CancelledError
                return "done"

            outcomes = await consume_until_done(mailbox, handle, tickets, lease_ms=LEASE_MS)
            assert (outcomes[0]["state"], attempts) == ("SUCCEEDED", [1, 2])
            await run.cancel()

    asyncio.run(scenario())


def test_a_delivery_signal_is_one_event_made_on_first_use(dev_node: Any) -> None:
    async def scenario() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("leases", mode="WORK")
            run = await rs.scopes.create()
            mailbox = run.mailbox("leases")
            await mailbox.submit({"n": 1})
            [delivery] = await mailbox.receive(wait_ms=5_000)
            signals = await asyncio.gather(*(asyncio.to_thread(lambda: delivery.signal) for _ in range(8)))
            assert all(signal is delivery.signal for signal in signals) and not delivery.signal.is_set()
            await delivery.complete()
            await run.cancel()

    asyncio.run(scenario())


def test_a_handler_that_ignores_its_cancel_is_left_running_and_its_delivery_handed_back(
    dev_node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_consume, "HANDLER_CANCEL_WAIT_S", 0.2)

    async def scenario() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("leases", mode="WORK")
            run = await rs.scopes.create()
            mailbox = run.mailbox("leases")
            await mailbox.submit({"n": 1})
            started = asyncio.Event()
            let_go = asyncio.Event()

            async def handle(data: Any, delivery: Any) -> str:
                started.set()
                while not let_go.is_set():
                    with contextlib.suppress(asyncio.CancelledError):  # deaf to its cancel
                        await let_go.wait()
                return "late"

            consuming = asyncio.create_task(mailbox.consume(handle, lease_ms=60_000))
            await asyncio.wait_for(started.wait(), WAIT_TIMEOUT_S)
            consuming.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(consuming, WAIT_TIMEOUT_S)
            again = await mailbox.receive(wait_ms=5_000)
            assert len(again) == 1  # handed back although its handler still runs
            let_go.set()
            await asyncio.sleep(0.1)  # the late handler ends: its result is not settled
            await again[0].complete(result={"payload": "second"})
            await run.cancel()

    asyncio.run(scenario())
