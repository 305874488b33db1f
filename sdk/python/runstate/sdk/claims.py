"""Claims: do a piece of work once per run and key (docs/http-api.md, "Claims"). `rs.claims`.

`runstate.once` is built on these calls; use them directly from code that wants its own loop.
Every call is safe to repeat after a lost answer except `acquire`, which is repeated anyway: a
repeat after a lost GRANTED answers HELD (by this holder), and the lease then lapses and counts as a
failed attempt.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from runstate.sdk._http import Transport
from runstate.sdk.errors import ConfigError

# One long poll of GET .../claims/{key}; the server's own bound.
CLAIM_WAIT_MS_MAX = 30_000


def _segment(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what} must be a non-empty string, got {value!r}")
    return quote(value, safe="")


class Claims:
    """The claim calls of the HTTP API, one method per route."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def acquire(
        self,
        scope_id: str,
        key: str,
        lease_ms: int | None = None,
        attempts: int | None = None,
        holder: str | None = None,
    ) -> dict[str, Any]:
        """Try to take the claim `key` of the run. Returns `{"outcome", "claim", "leaseId"?}`:
        GRANTED (with `leaseId`: this caller holds it), HELD (someone else does; `wait` then acquire
        again), DONE (`claim["result"]`) or FAILED (`claim["error"]`).

        Raises ScopeCancelledError / DeadlineExceededError if the run stopped (unless the claim is
        already DONE or FAILED), NotFoundError for an unknown run, ValidationError for bad values.
        """
        body: dict[str, Any] = {"key": key, "holder": holder or self._transport.holder}
        if lease_ms is not None:
            body["leaseMs"] = lease_ms
        if attempts is not None:
            body["attempts"] = attempts
        path = f"/scopes/{_segment(scope_id, 'scope id')}/claims"
        return await self._transport.request("POST", path, body=body, safe=True)

    async def wait(self, scope_id: str, key: str, wait_ms: int = CLAIM_WAIT_MS_MAX) -> dict[str, Any]:
        """The claim's view with `scopeEffective`, as soon as it is not HELD (FREE, DONE or
        FAILED) or its run stopped (`scopeEffective` "INACTIVE"), or after `wait_ms` (at most
        30000) with it still HELD. An unknown key is a FREE view with attempt 0."""
        wait_ms = max(0, min(wait_ms, CLAIM_WAIT_MS_MAX))
        path = f"/scopes/{_segment(scope_id, 'scope id')}/claims/{_segment(key, 'claim key')}"
        return await self._transport.request(
            "GET", path, params={"waitMs": str(wait_ms)}, safe=True, long_poll_ms=wait_ms
        )

    async def renew(self, lease_id: str, lease_ms: int | None = None) -> dict[str, Any]:
        """Extend the lease from now; returns `{"leaseExpiresAt"}`. LeaseLostError if it lapsed or
        was taken over, ScopeCancelledError / DeadlineExceededError if the run stopped."""
        body: dict[str, Any] = {} if lease_ms is None else {"leaseMs": lease_ms}
        return await self._post(lease_id, "renew", body)

    async def complete(self, lease_id: str, result: Any) -> dict[str, Any]:
        """Record the result (a JSON value of at most 64 KB); returns the DONE claim view.
        LeaseLostError from a lost lease (nothing recorded), ScopeCancelledError /
        DeadlineExceededError if the run stopped, ResultTooLargeError over 64 KB."""
        return await self._post(lease_id, "complete", {"result": result})

    async def fail(self, lease_id: str, error: str | None = None) -> dict[str, Any]:
        """Record a failed attempt; returns the claim view (FREE, or FAILED when the attempts are
        used). LeaseLostError if the lease is gone."""
        return await self._post(lease_id, "fail", {} if error is None else {"error": error})

    async def release(self, lease_id: str) -> dict[str, Any]:
        """Hand the claim back, no attempt counted; returns the claim view (FREE)."""
        return await self._post(lease_id, "release", {})

    async def _post(self, lease_id: str, action: str, body: dict[str, Any]) -> dict[str, Any]:
        path = f"/claims/{_segment(lease_id, 'lease id')}/{action}"
        return await self._transport.request("POST", path, body=body, safe=True)
