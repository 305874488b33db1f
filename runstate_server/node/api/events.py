"""A space's event log (actors/events.py) over HTTP: one page from a cursor (`GET /events`), and a
long poll that answers as soon as events after the cursor match its filters (`GET /watch`).

A cursor is the number of the last event a client has seen, as a decimal string; every answer
names `nextCursor`, where to resume (also when it holds no events: the filters skipped what came
in between). Without a cursor both start from the oldest event kept. A cursor older than what the
log keeps is CURSOR_EXPIRED (410): start again without one. Pages are read under the node's read
lock after leadership is confirmed, so a cursor resumes on the next leader without loss or repeat.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from runstate_server.actors import events, limits
from runstate_server.actors.state import Event
from runstate_server.node._json import json_response
from runstate_server.node.api._poll import park, wait
from runstate_server.node.api.routes import READ, SPACE_PREFIX, RouteTable, caller_of, node_of
from runstate_server.node.api.schemas import STRING, STRING_OR_NULL, TIME, array, obj
from runstate_server.node.api.views import iso
from runstate_server.node.config import LONG_POLL_MS_MAX
from runstate_server.node.errors import ApiError

routes = RouteTable()

_CURSOR_DIGITS_MAX = 19  # a sequence number fits a signed 64-bit integer
_TYPE_CHARS_MAX = 128

EVENT = obj({
    "eventId": STRING, "cursor": STRING, "type": STRING, "createdAt": TIME, "scopeId": STRING_OR_NULL,
    "aggregateType": STRING, "aggregateId": STRING, "payload": {"type": "object"},
})
PAGE = obj({"events": array(EVENT), "nextCursor": STRING})
_PAGE_QUERY = {
    "cursor": {"type": "string", "pattern": r"^[0-9]{0,19}$"},
    "limit": {"type": "integer", "minimum": 1, "maximum": limits.events_page_max},
}
_FILTER_QUERY = {
    "types": STRING,  # comma-separated
    "aggregate": STRING,  # "<type>:<id>"
    "scopeId": STRING,
}


def _cursor(request: web.Request) -> int | None:
    raw = request.query.get("cursor") or None  # an empty cursor is none
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= _CURSOR_DIGITS_MAX):
        raise ApiError("VALIDATION_FAILED", "cursor must be a cursor an answer named (nextCursor or an event's cursor)")
    return int(raw)


def _limit(request: web.Request) -> int:
    raw = request.query.get("limit")
    if raw is None or raw == "":
        return limits.events_page_default
    if not (raw.isascii() and raw.isdigit() and 1 <= int(raw) <= limits.events_page_max):
        raise ApiError("VALIDATION_FAILED", f"limit must be an integer from 1 to {limits.events_page_max}")
    return int(raw)


def _types(request: web.Request) -> frozenset[str] | None:
    raw = request.query.get("types")
    if not raw:
        return None
    names = [name.strip() for name in raw.split(",") if name.strip()]
    if len(names) > limits.event_types_max or any(len(name) > _TYPE_CHARS_MAX for name in names):
        raise ApiError(
            "VALIDATION_FAILED",
            f"types names at most {limits.event_types_max} event types of at most {_TYPE_CHARS_MAX} characters",
        )
    return frozenset(names) or None


def _aggregate(request: web.Request) -> tuple[str, str] | None:
    raw = request.query.get("aggregate")
    if not raw:
        return None
    kind, _, entity_id = raw.partition(":")
    if not kind or not entity_id or len(kind) > _TYPE_CHARS_MAX or len(entity_id) > limits.key_chars_max:
        raise ApiError("VALIDATION_FAILED", "aggregate must be <type>:<id>, e.g. task:tsk_0123")
    return kind, entity_id


def _scope(request: web.Request) -> str | None:
    raw = request.query.get("scopeId") or None
    if raw is not None and len(raw) > limits.name_chars_max:
        raise ApiError("VALIDATION_FAILED", f"scopeId must be at most {limits.name_chars_max} characters")
    return raw


def _render(event: Event) -> dict[str, Any]:
    shown = events.describe(event)
    return {
        "eventId": shown["event_id"],
        "cursor": str(shown["seq"]),
        "type": shown["type"],
        "createdAt": iso(shown["created_ms"]),
        "scopeId": shown["run_id"],
        "aggregateType": shown["aggregate_type"],
        "aggregateId": shown["aggregate_id"],
        "payload": shown["payload"],
    }


def _page(request: web.Request, after_seq: int | None, limit: int, filtered: bool) -> tuple[list[dict[str, Any]], int]:
    """The events after `after_seq` (rendered) and the cursor to resume from."""
    space_id = caller_of(request).space
    with node_of(request).read() as state:
        space = state.spaces.get(space_id)
        match: Callable[[Event], bool] | None = None
        if filtered:
            match = events.matcher(state, _types(request), _aggregate(request), _scope(request))
        try:
            found, next_seq = events.read(space, after_seq, limit, match)
        except events.CursorExpired as expired:
            raise ApiError(
                "CURSOR_EXPIRED", f"{expired}: the log keeps {limits.events_per_space_max} events for "
                f"{limits.event_age_ms_max // 60_000} minutes at most; start again without a cursor",
            ) from None
        except events.CursorAhead as ahead:
            raise ApiError("VALIDATION_FAILED", f"{ahead}: not a cursor of this space") from None
        return [_render(event) for event in found], next_seq


@routes(
    "GET", SPACE_PREFIX + "/events",
    "One page of the space's events after the cursor (none: from the oldest kept), oldest first; nextCursor "
    "resumes after it. CURSOR_EXPIRED when events after the cursor were dropped",
    query={**_PAGE_QUERY, **_FILTER_QUERY}, errors=("VALIDATION_FAILED", "CURSOR_EXPIRED"), permission=READ, answer=PAGE,
)
async def list_events(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    after_seq, limit = _cursor(request), _limit(request)
    await node.confirm_leadership(caller)
    found, next_seq = _page(request, after_seq, limit, filtered=True)
    return json_response({"events": found, "nextCursor": str(next_seq)})


def _wait_s(request: web.Request) -> float:
    """waitSeconds: 0 (answer at once, the default) to limits.wait_ms_max / 1000; the node holds
    the poll at most LONG_POLL_MS_MAX."""
    raw = request.query.get("waitSeconds")
    if raw is None or raw == "":
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= limits.wait_ms_max / 1000:  # also refuses nan
        raise ApiError("VALIDATION_FAILED", f"waitSeconds must be a number from 0 to {limits.wait_ms_max // 1000}")
    return min(value, LONG_POLL_MS_MAX / 1000)


@routes(
    "GET", SPACE_PREFIX + "/watch",
    "Long poll: the events after the cursor (none: from the oldest kept) that match types (comma-separated), "
    "aggregate (<type>:<id>) and scopeId (that run and the runs below it), as soon as there are any, or after "
    "waitSeconds (held at most 30 s) an empty page; nextCursor resumes after it. CURSOR_EXPIRED when events "
    "after the cursor were dropped",
    query={**_PAGE_QUERY, **_FILTER_QUERY, "waitSeconds": {"type": "number", "minimum": 0, "maximum": limits.wait_ms_max / 1000}},
    errors=("VALIDATION_FAILED", "CURSOR_EXPIRED", "UNAUTHENTICATED"), permission=READ, answer=PAGE,
)
async def watch(request: web.Request) -> web.Response:
    node, caller = node_of(request), caller_of(request)
    after_seq, limit, wait_s = _cursor(request), _limit(request), _wait_s(request)
    for check in (_types, _aggregate, _scope):
        check(request)  # bad filters: 400 before any wait
    deadline = time.monotonic() + wait_s
    await node.confirm_leadership(caller)
    while True:
        with park(request, events.events_key(caller.space)) as waiter:
            found, next_seq = _page(request, after_seq, limit, filtered=True)
            remaining_s = deadline - time.monotonic()
            if found or remaining_s <= 0 or not waiter.parked:
                return json_response({"events": found, "nextCursor": str(next_seq)})
            after_seq = next_seq  # what the filters skipped is not looked at again
            await wait(request, waiter, remaining_s)
