"""consume() frees a handler slot when the handler returns: the next delivery's handler runs while
the previous one's complete is still on its way, up to SETTLING_PER_SLOT deliveries being settled
per slot (sdk/_consume.py). The node is real; a small proxy in front of it holds every complete's
answer back for a while, so the order of the two is not left to chance."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from runstate import AsyncRunstate
from runstate.sdk._consume import SETTLING_PER_SLOT

pytestmark = pytest.mark.slow

# The proxy holds each complete's answer this long: far longer than a receive and a handler take.
COMPLETE_HELD_S = 2.0
RESULT_TIMEOUT_MS = 20_000
STOP_TIMEOUT_S = 20.0


async def start_proxy(node_url: str, completes_answered: list[float]) -> tuple[web.AppRunner, str]:
    """An HTTP proxy to the node that answers each complete COMPLETE_HELD_S late (after the node
    committed it), noting when it answered."""
    session = aiohttp.ClientSession()

    async def relay(request: web.Request) -> web.Response:
        body = await request.read()
        headers = {name: value for name, value in request.headers.items() if name.lower() not in ("host", "content-length")}
        async with session.request(request.method, node_url + request.path_qs, data=body, headers=headers) as answer:
            payload = await answer.read()
            status, content_type = answer.status, answer.content_type
        if request.method == "POST" and request.path.endswith("/complete"):
            await asyncio.sleep(COMPLETE_HELD_S)
            completes_answered.append(time.monotonic())
        return web.Response(body=payload, status=status, content_type=None if status == 204 else content_type)

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", relay)
    app.on_cleanup.append(lambda _app: session.close())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def test_the_next_handlers_run_while_the_previous_completes_are_on_their_way_up_to_the_bound(dev_node: Any) -> None:
    async def scenario() -> None:
        completes_answered: list[float] = []
        runner, proxy_url = await start_proxy(dev_node.url, completes_answered)
        try:
            async with AsyncRunstate(base_url=proxy_url) as rs:
                await rs.mailboxes.ensure("settle", mode="WORK")
                run = await rs.scopes.create()
                mailbox = run.mailbox("settle")
                # One slot: its handler and SETTLING_PER_SLOT deliveries being completed, then one more.
                held_max = 1 + SETTLING_PER_SLOT
                tickets = await mailbox.submit_many([{"n": n} for n in range(held_max + 1)])
                started: list[float] = []

                async def handle(data: dict[str, Any], _delivery: Any) -> int:
                    started.append(time.monotonic())
                    return int(data["n"])

                stop = asyncio.Event()
                consuming = asyncio.create_task(mailbox.consume(handle, stop=stop, concurrency=1))
                try:
                    outcomes = [await ticket.result(timeout_ms=RESULT_TIMEOUT_MS) for ticket in tickets]
                finally:
                    stop.set()
                    await asyncio.wait_for(consuming, STOP_TIMEOUT_S)
                assert [outcome["state"] for outcome in outcomes] == ["SUCCEEDED"] * (held_max + 1)
                assert len(started) == held_max + 1 and completes_answered
                # The handlers after the first started before its complete was answered, as long as
                # the deliveries held stayed within the bound; the next one only after that answer.
                assert started[held_max - 1] < completes_answered[0] < started[held_max]
                await run.cancel()
        finally:
            await runner.cleanup()

    asyncio.run(scenario())
