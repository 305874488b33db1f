"""`run.timers.create(at=...)` through the SDK against a real dev node: an aware datetime, a naive
one (UTC), an ISO 8601 string with or without an offset, a time in the past (fires at once), and
the refusals (local misuse is ConfigError; what the server refuses, ValidationError, changing
nothing)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
import runstate
from runstate import AsyncRunstate

from tests._http import new_space
from tests._nodes import DevNode

WAIT_MS = 10_000


def test_a_timer_at_a_time(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=new_space(dev_node.url, "at")) as rs:
            run = await rs.scopes.create()
            when = (datetime.now(timezone.utc) + timedelta(seconds=0.3)).replace(microsecond=0) + timedelta(seconds=1)
            aware = await run.timers.create(at=when)
            naive = await run.timers.create(at=when.replace(tzinfo=None))  # a naive datetime is UTC
            text = await run.timers.create(at=when.isoformat())
            zulu = await run.timers.create(at=when.strftime("%Y-%m-%dT%H:%M:%SZ"))
            offset = await run.timers.create(at=when.astimezone(timezone(timedelta(hours=2))).isoformat())
            timers = [aware, naive, text, zulu, offset]
            assert {timer.fire_at for timer in timers} == {when}
            for timer in timers:
                fired = await timer.wait(timeout_ms=WAIT_MS)
                assert fired["fired_at"] >= when and fired["state"] == "ACKED"

            past = await run.timers.create(at=datetime.now(timezone.utc) - timedelta(hours=1))
            assert (await past.wait(timeout_ms=WAIT_MS))["state"] == "ACKED"  # due already: fires at once

            views = await asyncio.gather(*(run.timers.get(timer.id).status() for timer in [*timers, past]))
            assert {view["state"] for view in views} == {"ACKED"}  # re-attached by id
            for bad in (
                {"at": datetime.now(timezone.utc) + timedelta(days=400)},  # more than a year ahead
                {"at": "next tuesday"},
            ):
                with pytest.raises(runstate.ValidationError):
                    await run.timers.create(**bad)  # type: ignore[arg-type]
            for misuse in (
                {}, {"at": when, "after_seconds": 1}, {"after_seconds": -1}, {"after_seconds": float("nan")},
                {"after_seconds": float("inf")}, {"after_seconds": True},
            ):
                with pytest.raises(runstate.ConfigError):
                    await run.timers.create(**misuse)  # type: ignore[arg-type]

    asyncio.run(main())
