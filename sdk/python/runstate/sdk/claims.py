"""Claims: fenced mutex leases on a (run, key) (docs/http-api.md, "Claims"). `rs.claims`.

    granted = await rs.claims.acquire(run.id, "reindex", lease_seconds=30)
    try:
        ...  # write with granted["generation"] as the fencing number
    finally:
        await rs.claims.release("reindex", granted["token"])

One holder at a time: `acquire` raises ClaimHeldError while another lease is live (`.retry_after_s`
says when it runs out unless renewed). Every grant has a fresh `token` and a `generation` one above
the last grant's, so whatever the claim guards can refuse a write with an older generation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runstate.sdk._http import Transport, path_segment

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

LEASE_SECONDS_DEFAULT = 30


class Claims:
    """The claim calls of the HTTP API, one method per route."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def acquire(
        self, scope_id: str, key: str, lease_seconds: int = LEASE_SECONDS_DEFAULT, holder: str | None = None
    ) -> dict[str, Any]:
        """Take the claim `key` of the run. Returns `{"key", "scopeId", "generation", "token",
        "holder", "holderSession", "leaseExpiresAt"}`.

        Raises ClaimHeldError while another lease is live (this client's own included: a claim is
        not re-entrant), ScopeCancelledError / DeadlineExceededError if the run stopped,
        NotFoundError for an unknown run, ValidationError for bad values.
        """
        body = {
            "scopeId": scope_id, "key": key, "holder": holder or self._transport.holder,
            "holderSession": self._transport.holder_session, "leaseSeconds": lease_seconds,
        }
        return await self._transport.request("POST", "/claims", body=body, safe=True)

    async def renew(self, key: str, token: str, lease_seconds: int | None = None) -> dict[str, Any]:
        """Extend the lease from now (by `lease_seconds`, else its last length); returns the
        claim with the new `leaseExpiresAt`. LeaseLostError if the token was released, lapsed or
        superseded; ScopeCancelledError / DeadlineExceededError if the run stopped."""
        body: dict[str, Any] = {"token": token}
        if lease_seconds is not None:
            body["leaseSeconds"] = lease_seconds
        return await self._transport.request("POST", f"/claims/{path_segment(key, 'claim key')}/renew", body=body, safe=True)

    async def release(self, key: str, token: str, observation: Any = None) -> dict[str, Any]:
        """Free the claim at once, leaving `observation` (a JSON value of at most 4 KB) in its view.
        LeaseLostError if the token no longer holds it (nothing to release)."""
        body: dict[str, Any] = {"token": token}
        if observation is not None:
            body["observation"] = observation
        path = f"/claims/{path_segment(key, 'claim key')}/release"
        return await self._transport.request("POST", path, body=body, safe=True)

    async def get(self, scope_id: str, key: str) -> dict[str, Any]:
        """The claim's view: `generation`, `held`, `holder`, `holderSession`, `leaseExpiresAt`,
        `observation` (an unknown key: generation 0, not held)."""
        path = f"/claims/{path_segment(key, 'claim key')}"
        return await self._transport.request("GET", path, params={"scopeId": scope_id}, safe=True)


class BlockingClaims:
    """`rs.claims` of the blocking client (see `Claims`)."""

    def __init__(self, inner: Claims, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def acquire(self, scope_id: str, key: str, lease_seconds: int = 30, holder: str | None = None) -> dict[str, Any]:
        return self._portal.call(lambda: self._inner.acquire(scope_id, key, lease_seconds, holder))

    def renew(self, key: str, token: str, lease_seconds: int | None = None) -> dict[str, Any]:
        return self._portal.call(self._inner.renew, key, token, lease_seconds)

    def release(self, key: str, token: str, observation: Any = None) -> dict[str, Any]:
        return self._portal.call(self._inner.release, key, token, observation)

    def get(self, scope_id: str, key: str) -> dict[str, Any]:
        return self._portal.call(self._inner.get, scope_id, key)
