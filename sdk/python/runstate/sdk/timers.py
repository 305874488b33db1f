"""The durable timers of a run: `run.timers.create(at= | after_seconds=)`, `run.timers.by_name(name,
at= | after_seconds=)`, `run.timers.poll()`, `run.timers.get(id)`.

A timer fires on the server at its time whether or not anyone waits; `wait()` returns the firing
and acknowledges it in the same call (have one process wait on a given timer); `poll()` lists the
run's fired, unacknowledged timers with their tokens, and `timer.ack(token)` acknowledges one.
A named timer is the run's timer of that name: armed by the first `by_name`, returned as it is by
every later one (a durable sleep: a restarted process waits only for what is left).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from runstate.sdk._time import format_time, parse_time
from runstate.sdk._waiting import wait_until
from runstate.sdk.errors import ConfigError

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from runstate.sdk._http import Transport

WAIT_TIMEOUT_MS_DEFAULT = 60_000


class Timers:
    """`run.timers`: arm a timer in this run, or get a handle on one by id."""

    def __init__(self, transport: Transport, scope_id: str) -> None:
        self._transport = transport
        self.scope_id = scope_id

    async def create(self, at: datetime | str | None = None, after_seconds: float | None = None) -> Timer:
        """Arm a timer at `at` (a datetime, naive = UTC, or an ISO 8601 string) or after
        `after_seconds`; exactly one of them. Returns the `Timer` (`.fire_at`). ScopeCancelledError
        if the run stopped."""
        body = {"scopeId": self.scope_id, **_when(at, after_seconds)}
        view = await self._transport.request("POST", "/timers", body=body, safe=False)
        return Timer(self._transport, view["id"], view)

    async def by_name(self, name: str, at: datetime | str | None = None, after_seconds: float | None = None) -> Timer:
        """The run's timer named `name`: armed at `at` or after `after_seconds` (exactly one) by the
        first call, returned as it is by every later one whatever time it names. Its `view` has
        `state`, `fireAt`, `now` (the server's time) and, once it fired, `token`.
        ScopeCancelledError when it does not exist yet and the run stopped."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name must be a non-empty string, got {name!r}")
        body = {"scopeId": self.scope_id, **_when(at, after_seconds)}
        view = await self._transport.request("PUT", f"/timers/by-name/{quote(name, safe='')}", body=body, safe=True)
        return Timer(self._transport, view["id"], view)

    async def poll(self) -> list[dict[str, Any]]:
        """The run's fired, unacknowledged timers, oldest firing first: `id`, `token`, `firedAt`,
        `fireAt`, `name`. Changes nothing: ack each with `get(id).ack(token)`."""
        answer = await self._transport.request("POST", "/timers/poll", body={"scopeId": self.scope_id}, safe=True)
        found: list[dict[str, Any]] = answer["timers"]
        return found

    def get(self, timer_id: str) -> Timer:
        """A handle on timer `timer_id` (no request; `fire_at` is known after `status()`)."""
        return Timer(self._transport, timer_id)


def _when(at: datetime | str | None, after_seconds: float | None) -> dict[str, Any]:
    if (at is None) == (after_seconds is None):
        raise ConfigError("give exactly one of at= and after_seconds=")
    if at is not None:
        return {"at": format_time(at) if isinstance(at, datetime) else at}
    if isinstance(after_seconds, bool) or not isinstance(after_seconds, (int, float)) or after_seconds < 0:
        raise ConfigError(f"after_seconds must be a non-negative number, got {after_seconds!r}")
    return {"afterSeconds": after_seconds}


class Timer:
    """One timer. `fire_at` (aware UTC datetime) once known; `view` is the last state seen:
    `state` ARMED, FIRED, ACKED or CANCELLED."""

    def __init__(self, transport: Transport, timer_id: str, view: dict[str, Any] | None = None) -> None:
        if not isinstance(timer_id, str) or not timer_id:
            raise ConfigError(f"timer id must be a non-empty string, got {timer_id!r}")
        self._transport = transport
        self.id = timer_id
        self._path = f"/timers/{quote(timer_id, safe='')}"
        self.view: dict[str, Any] | None = None
        self.fire_at: datetime | None = None
        self._see(view)

    def __repr__(self) -> str:
        return f"<Timer {self.id} fire_at={self.fire_at}>"

    def _see(self, view: dict[str, Any] | None) -> dict[str, Any] | None:
        if view is not None:
            self.view = view
            self.fire_at = parse_time(view["fireAt"]) if view.get("fireAt") else self.fire_at
        return view

    async def status(self) -> dict[str, Any]:
        view = await self._transport.request("GET", self._path, safe=True)
        self._see(view)
        return view

    async def wait(self, timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT) -> dict[str, Any]:
        """Wait for the firing and acknowledge it (so the key needs `coordination_write`:
        ForbiddenError without it; `status()` only reads); returns the view with `fired_at` (an
        aware datetime) added. ConflictError if the timer was cancelled, WaitTimeoutError after
        `timeout_ms` (the timer stays armed)."""

        async def poll(wait_ms: int) -> dict[str, Any]:
            return await self._transport.request(
                "POST", f"{self._path}/wait", params={"waitMs": str(wait_ms)}, safe=True, long_poll_ms=wait_ms
            )

        view = await wait_until(poll, lambda answer: bool(answer.get("done")), timeout_ms=timeout_ms, what=f"timer {self.id}")
        self._see(view)
        return {**view, "fired_at": parse_time(view["firedAt"])}

    async def ack(self, token: str) -> dict[str, Any]:
        """Acknowledge the firing with its token (from `poll()`, or the `view` of `by_name` once it
        fired). LeaseLostError (STALE_CLAIM) for a token that is not the timer's; ConflictError
        (CONFLICT) when it was acked already, has not fired, or was cancelled."""
        if not isinstance(token, str) or not token:
            raise ConfigError(f"token must be a non-empty string, got {token!r}")
        view = await self._transport.request("POST", f"{self._path}/ack", body={"token": token}, safe=True)
        self._see(view)
        return view

    async def cancel(self) -> dict[str, Any]:
        """Disarm the timer (idempotent). ConflictError if it already fired."""
        view = await self._transport.request("POST", f"{self._path}/cancel", safe=True)
        self._see(view)
        return view


class BlockingTimers:
    """`run.timers` of the blocking client."""

    def __init__(self, inner: Timers, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    @property
    def scope_id(self) -> str:
        return self._inner.scope_id

    def create(self, at: datetime | str | None = None, after_seconds: float | None = None) -> BlockingTimer:
        timer = self._portal.call(lambda: self._inner.create(at=at, after_seconds=after_seconds))
        return BlockingTimer(timer, self._portal)

    def by_name(self, name: str, at: datetime | str | None = None, after_seconds: float | None = None) -> BlockingTimer:
        timer = self._portal.call(lambda: self._inner.by_name(name, at=at, after_seconds=after_seconds))
        return BlockingTimer(timer, self._portal)

    def poll(self) -> list[dict[str, Any]]:
        return self._portal.call(self._inner.poll)

    def get(self, timer_id: str) -> BlockingTimer:
        return BlockingTimer(self._inner.get(timer_id), self._portal)


class BlockingTimer:
    """One timer, blocking calls (see `Timer`)."""

    def __init__(self, inner: Timer, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    @property
    def view(self) -> dict[str, Any] | None:
        """The timer's view as last seen (None before the first look)."""
        return self._inner.view

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def fire_at(self) -> datetime | None:
        return self._inner.fire_at

    def status(self) -> dict[str, Any]:
        return self._portal.call(self._inner.status)

    def wait(self, timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT) -> dict[str, Any]:
        return self._portal.call(self._inner.wait, timeout_ms)

    def ack(self, token: str) -> dict[str, Any]:
        return self._portal.call(self._inner.ack, token)

    def cancel(self) -> dict[str, Any]:
        return self._portal.call(self._inner.cancel)
