"""The space's events: `rs.events.list(cursor=...)` reads one page, `rs.events.watch(...)` follows
the log as it grows (long polls) and resumes from its cursor.

Each event is a dict: `eventId`, `cursor` (resume after it), `type` (e.g. `scope.cancelled`,
`task.succeeded`), `createdAt`, `scopeId`, `aggregateType`, `aggregateId`, `payload` (ids and
states). The server keeps a space's latest 10,000 events for at most an hour; a cursor older than
that raises CursorExpiredError (or, with `restart_on_expired=True`, the watch starts again from the
oldest event kept).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from runstate.sdk.errors import ConfigError, CursorExpiredError

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from runstate.sdk._http import Transport

WAIT_SECONDS_DEFAULT = 20  # what one long poll of a watch asks the server to hold (it holds at most 30 s)


def _params(
    cursor: str | None, types: Sequence[str] | None, aggregate: str | tuple[str, str] | None, scope_id: str | None,
    limit: int | None,
) -> dict[str, str]:
    params: dict[str, str] = {}
    if cursor:
        params["cursor"] = cursor
    if types:
        if isinstance(types, str):
            raise ConfigError("types must be a list of event types, not one string")
        params["types"] = ",".join(types)
    if aggregate:
        params["aggregate"] = aggregate if isinstance(aggregate, str) else f"{aggregate[0]}:{aggregate[1]}"
    if scope_id:
        params["scopeId"] = scope_id
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"limit must be a positive integer, got {limit!r}")
        params["limit"] = str(limit)
    return params


class Events:
    """`rs.events`: the space's event log."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def list(
        self,
        cursor: str | None = None,
        types: Sequence[str] | None = None,
        aggregate: str | tuple[str, str] | None = None,
        scope_id: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """One page of events after `cursor` (None: from the oldest kept), oldest first, filtered
        like `watch`: `{"events": [...], "nextCursor": str}`; pass `nextCursor` to read on.
        CursorExpiredError when events after `cursor` were dropped."""
        params = _params(cursor, types, aggregate, scope_id, limit)
        return await self._transport.request("GET", "/events", params=params, safe=True)

    async def watch(
        self,
        cursor: str | None = None,
        types: Sequence[str] | None = None,
        aggregate: str | tuple[str, str] | None = None,
        scope_id: str | None = None,
        limit: int | None = None,
        wait_seconds: float = WAIT_SECONDS_DEFAULT,
        restart_on_expired: bool = False,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The events after `cursor` (None: from the oldest kept) as they happen, forever: break
        out of the loop to stop. Filters: `types` (any of them), `aggregate` (`"task:<id>"` or
        `("task", id)`), `scope_id` (that run and the runs below it). Each event's `cursor`
        resumes a later watch right after it, without loss or repeat (also on another server of
        the cluster). CursorExpiredError when events after the cursor were dropped, unless
        `restart_on_expired`: then it goes on from the oldest event kept."""
        if isinstance(wait_seconds, bool) or not isinstance(wait_seconds, (int, float)) or not 0 < wait_seconds <= 30:
            raise ConfigError(f"wait_seconds must be a number above 0, at most 30, got {wait_seconds!r}")
        base = _params(None, types, aggregate, scope_id, limit)
        current = cursor
        while True:
            params = {**base, "waitSeconds": str(wait_seconds)}
            if current:
                params["cursor"] = current
            try:
                page = await self._transport.request(
                    "GET", "/watch", params=params, safe=True, long_poll_ms=int(wait_seconds * 1000)
                )
            except CursorExpiredError:
                if not restart_on_expired:
                    raise
                current = None
                continue
            for event in page["events"]:
                yield event
            current = page["nextCursor"]


class BlockingEvents:
    """`rs.events` of the blocking client."""

    def __init__(self, inner: Events, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def list(
        self,
        cursor: str | None = None,
        types: Sequence[str] | None = None,
        aggregate: str | tuple[str, str] | None = None,
        scope_id: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """One page of events after `cursor` (see `Events.list`)."""
        return self._portal.call(lambda: self._inner.list(cursor, types, aggregate, scope_id, limit))

    def watch(
        self,
        cursor: str | None = None,
        types: Sequence[str] | None = None,
        aggregate: str | tuple[str, str] | None = None,
        scope_id: str | None = None,
        limit: int | None = None,
        wait_seconds: float = WAIT_SECONDS_DEFAULT,
        restart_on_expired: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """The events as they happen (see `Events.watch`); break out of the loop to stop."""
        stream = self._inner.watch(cursor, types, aggregate, scope_id, limit, wait_seconds, restart_on_expired)
        try:
            while True:
                try:
                    yield self._portal.call(stream.__anext__)
                except StopAsyncIteration:
                    return
        finally:
            try:
                self._portal.call(lambda: stream.aclose())
            except RuntimeError:
                pass  # the client was closed first: its loop ended the stream with it
