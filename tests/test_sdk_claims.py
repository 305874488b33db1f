"""`rs.claims`: fenced mutex leases through the SDK, against a real dev node."""

from __future__ import annotations

import asyncio

import pytest
import runstate
from runstate.sdk.client import AsyncRunstate

from tests._http import new_space
from tests._nodes import DevNode

KEY = "reports/2024 q1"  # sent percent-encoded in the path


def test_one_holder_at_a_time_and_the_generation_grows(dev_node: DevNode) -> None:
    space = new_space(dev_node.url, "sdk-claims")

    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space, holder="a") as a, AsyncRunstate(
            base_url=dev_node.url, space_id=space, holder="b"
        ) as b:
            run = await a.scopes.create()
            first = await a.claims.acquire(run.id, KEY, lease_seconds=30)
            assert (first["generation"], first["holder"], first["holderSession"]) == (
                1, "a", a._transport.holder_session
            )
            assert a._transport.holder_session != b._transport.holder_session
            with pytest.raises(runstate.ClaimHeldError) as held:
                await b.claims.acquire(run.id, KEY)
            assert held.value.code == "CLAIM_HELD" and isinstance(held.value, runstate.ConflictError)
            renewed = await a.claims.renew(KEY, first["token"], lease_seconds=60)
            assert renewed["leaseExpiresAt"] > first["leaseExpiresAt"]
            await a.claims.release(KEY, first["token"], observation={"pages": 3})
            with pytest.raises(runstate.LeaseLostError):  # released: the token is stale
                await a.claims.release(KEY, first["token"])
            second = await b.claims.acquire(run.id, KEY)
            assert (second["generation"], second["holder"]) == (2, "b")
            with pytest.raises(runstate.LeaseLostError):
                await a.claims.renew(KEY, first["token"])
            view = await a.claims.get(run.id, KEY)
            assert (view["generation"], view["held"], view["holder"], view["observation"]) == (2, True, "b", {"pages": 3})

    asyncio.run(main())
