"""The once calls of the HTTP API (docs/http-api.md, "Once"). `rs.once`.

`runstate.once` is built on these calls; use them directly from code that wants its own loop.
Every call is safe to repeat after a lost answer except `acquire`, which is repeated anyway: a
repeat after a lost GRANTED answers HELD (by this holder), and the lease then lapses and counts as a
failed attempt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runstate.sdk._http import Transport

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

# One long poll of GET /once; the server's own bound.
ONCE_WAIT_MS_MAX = 30_000
LEASE_SECONDS_DEFAULT = 30


class OnceCalls:
    """One method per once route. Each answer carries `state`, `attempts` (failed attempts so far),
    `result` when DONE, `lastError` once an attempt failed, and `scopeEffective`."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def acquire(
        self,
        scope_id: str,
        key: str,
        lease_seconds: int = LEASE_SECONDS_DEFAULT,
        max_attempts: int | None = None,
        holder: str | None = None,
    ) -> dict[str, Any]:
        """Try to take the once entry `key` of the run. `state` is GRANTED (with `token` and
        `leaseExpiresAt`: this caller holds it), HELD (someone else does; `wait`, then acquire
        again), DONE (`result`) or FAILED (`lastError`). `max_attempts` is the limit a lapsed lease
        is checked against until a failure names one.

        Raises ScopeCancelledError / DeadlineExceededError if the run stopped (unless the entry is
        already DONE or FAILED), NotFoundError for an unknown run, ValidationError for bad values.
        """
        body: dict[str, Any] = {
            "scopeId": scope_id, "key": key, "holder": holder or self._transport.holder,
            "holderSession": self._transport.holder_session, "leaseSeconds": lease_seconds,
        }
        if max_attempts is not None:
            body["maxAttempts"] = max_attempts
        return await self._transport.request("POST", "/once/acquire", body=body, safe=True)

    async def wait(self, scope_id: str, key: str, wait_ms: int = ONCE_WAIT_MS_MAX) -> dict[str, Any]:
        """The entry's view with `scopeEffective`, as soon as it is not HELD (OPEN, DONE or
        FAILED) or its run stopped (`scopeEffective` "INACTIVE"), or after `wait_ms` (at most
        30000) with it still HELD. An unknown key is OPEN with no attempts."""
        wait_ms = max(0, min(wait_ms, ONCE_WAIT_MS_MAX))
        params = {"scopeId": scope_id, "key": key, "waitMs": str(wait_ms)}
        return await self._transport.request("GET", "/once", params=params, safe=True, long_poll_ms=wait_ms)

    async def renew(self, scope_id: str, key: str, token: str, lease_seconds: int) -> dict[str, Any]:
        """Extend the lease from now; the answer has `leaseExpiresAt`. LeaseLostError if it lapsed
        or was taken over, ScopeCancelledError / DeadlineExceededError if the run stopped."""
        return await self._post("renew", scope_id, key, token, {"leaseSeconds": lease_seconds})

    async def complete(self, scope_id: str, key: str, token: str, result: Any) -> dict[str, Any]:
        """Record the result (a JSON value of at most 64 KB); answers DONE with the recorded
        result. LeaseLostError from a lost lease (nothing recorded), ScopeCancelledError /
        DeadlineExceededError if the run stopped, ResultTooLargeError over 64 KB."""
        return await self._post("complete", scope_id, key, token, {"result": result})

    async def fail(
        self, scope_id: str, key: str, token: str, error: str | None = None, max_attempts: int | None = None
    ) -> dict[str, Any]:
        """Record a failed attempt; `state` is FAILED when it used the last of `max_attempts`
        (server default 3), else OPEN for the next caller. LeaseLostError if the lease is gone."""
        body: dict[str, Any] = {}
        if error is not None:
            body["error"] = error
        if max_attempts is not None:
            body["maxAttempts"] = max_attempts
        return await self._post("fail", scope_id, key, token, body)

    async def release(self, scope_id: str, key: str, token: str) -> dict[str, Any]:
        """Hand the entry back, no attempt counted; answers OPEN."""
        return await self._post("release", scope_id, key, token, {})

    async def _post(self, action: str, scope_id: str, key: str, token: str, fields: dict[str, Any]) -> dict[str, Any]:
        body = {"scopeId": scope_id, "key": key, "token": token, **fields}
        return await self._transport.request("POST", f"/once/{action}", body=body, safe=True)


class BlockingOnceCalls:
    """`rs.once` of the blocking client (see `OnceCalls`)."""

    def __init__(self, inner: OnceCalls, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def acquire(
        self, scope_id: str, key: str, lease_seconds: int = 30, max_attempts: int | None = None, holder: str | None = None
    ) -> dict[str, Any]:
        return self._portal.call(lambda: self._inner.acquire(scope_id, key, lease_seconds, max_attempts, holder))

    def wait(self, scope_id: str, key: str, wait_ms: int = ONCE_WAIT_MS_MAX) -> dict[str, Any]:
        return self._portal.call(self._inner.wait, scope_id, key, wait_ms)

    def renew(self, scope_id: str, key: str, token: str, lease_seconds: int) -> dict[str, Any]:
        return self._portal.call(self._inner.renew, scope_id, key, token, lease_seconds)

    def complete(self, scope_id: str, key: str, token: str, result: Any) -> dict[str, Any]:
        return self._portal.call(self._inner.complete, scope_id, key, token, result)

    def fail(
        self, scope_id: str, key: str, token: str, error: str | None = None, max_attempts: int | None = None
    ) -> dict[str, Any]:
        return self._portal.call(self._inner.fail, scope_id, key, token, error, max_attempts)

    def release(self, scope_id: str, key: str, token: str) -> dict[str, Any]:
        return self._portal.call(self._inner.release, scope_id, key, token)
