"""Paging of the list reads (GET /scopes, /tasks, /task-groups, /barriers, /timers): newest first,
in creation order, `limit` entries a page and an opaque `cursor` to resume after.

The order is total and the same on every replica: (createdAt ms, creation number) descending, the
creation number being the entity's `seq` (State.creation_seq, replicated and in snapshots), so
entries created in one millisecond (a batch submit, one log entry) list in the order they were
created, never by their random ids. The cursor names the last entry a page showed, (its creation
ms, its creation number); the next page holds the entries strictly below it. An entry created later
sorts above every cursor already given (its number is higher, and the state's clock never goes
backwards), so paging on while entries are added shows each entry that existed at the first page
exactly once, in order, and one removed meanwhile simply no longer shows.

The state keeps each table in creation order (a dict in insertion order, the order of the log), so
a page walks the table from its newest end and stops once it has `limit` matches and has passed
their creation ms: it reads what lies above the cursor and the page, not the whole table (unless
the filter matches little of it)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aiohttp import web

from runstate_server.actors import limits
from runstate_server.node.api import _request as req
from runstate_server.node.errors import ApiError

if TYPE_CHECKING:
    from runstate_server.actors.state import Run, State
    from runstate_server.node.caller import Caller
    from runstate_server.node.server import Node

T = TypeVar("T")
Cursor = tuple[int, int]  # (creation ms, creation number)

PAGE_QUERY: dict[str, Any] = {
    "limit": {"type": "integer", "minimum": 1, "maximum": limits.list_page_max},
    "cursor": {"type": "string", "maxLength": limits.list_cursor_chars_max},
}
_BAD_CURSOR = "cursor must be a nextCursor an earlier page of this list answered"


def page_args(request: web.Request) -> tuple[int, Cursor | None]:
    """The request's limit and cursor (None: from the newest); VALIDATION_FAILED if malformed."""
    limit = req.query_integer(request, "limit", minimum=1, maximum=limits.list_page_max, default=limits.list_page_default)
    raw = request.query.get("cursor") or None  # an empty cursor is none
    return limit, None if raw is None else decode_cursor(raw)


def decode_cursor(raw: str) -> Cursor:
    """A cursor an answer named, decoded; VALIDATION_FAILED if it is none."""
    if len(raw) > limits.list_cursor_chars_max:
        raise ApiError("VALIDATION_FAILED", _BAD_CURSOR)
    try:
        text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
        ms_text, seq_text = text.split(":", 1)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ApiError("VALIDATION_FAILED", _BAD_CURSOR) from None
    # Number 0: below every entry of that ms (a page that spent its scan budget). A cursor of an
    # earlier release (ms and an id) is refused: start the list again.
    if not (ms_text.isdigit() and seq_text.isdigit() and ms_text.isascii() and seq_text.isascii()):
        raise ApiError("VALIDATION_FAILED", _BAD_CURSOR)
    return (int(ms_text), int(seq_text))


def cursor_of(created_ms: int, seq: int) -> str:
    return base64.urlsafe_b64encode(f"{created_ms}:{seq}".encode()).decode().rstrip("=")


class Sequenced(Protocol):
    """What the lists order by: a run, task, group, barrier or timer."""

    created_ms: int
    seq: int


def creation_key(entity: Sequenced) -> Cursor:
    """An entity's place in its list, (creation ms, creation number): creation order."""
    return (entity.created_ms, entity.seq)


def page(
    newest_first: Iterable[T], key: Callable[[T], Cursor], matches: Callable[[T], bool], limit: int, after: Cursor | None
) -> tuple[list[T], str | None]:
    """One page of `newest_first` (entities in non-increasing creation ms, as a table kept in
    creation order walked from its end): the `limit` matching entities below `after`, highest
    (created ms, creation number) first, and the cursor of the next page (None: this is the last).

    A page reads at most about limits.list_scan_max entries below the cursor: past them it ends
    with the entries of the creation ms it reached, and its cursor resumes below that ms, so a
    filter that matches little answers short (even empty) pages with a nextCursor, not a walk of
    everything."""
    found: list[T] = []
    boundary_ms: int | None = None  # the page is full: read on only the entries of this ms
    stop_ms: int | None = None  # the scan budget is spent: read on only the entries of this ms
    scanned = 0
    for entity in newest_first:
        entity_key = key(entity)
        if boundary_ms is not None and entity_key[0] < boundary_ms:
            break  # everything further is older than the page's last entry
        if after is not None and entity_key >= after:
            continue
        if stop_ms is not None and entity_key[0] < stop_ms:
            found.sort(key=key, reverse=True)
            return found, cursor_of(stop_ms, 0)  # below every entry of stop_ms: all were read
        scanned += 1
        if matches(entity):
            found.append(entity)
            if boundary_ms is None and len(found) > limit:
                # One more than a page: the rest of the page shares this creation ms at the least;
                # the entries of the same ms further on may still sort above it (a stream merged
                # from several, or sorted whole, may hold them in another order).
                boundary_ms = entity_key[0]
        if boundary_ms is None and stop_ms is None and scanned >= limits.list_scan_max:
            stop_ms = entity_key[0]
    found.sort(key=key, reverse=True)
    if len(found) <= limit:
        return found, None
    last = key(found[limit - 1])
    return found[:limit], cursor_of(*last)


def page_sorted(
    entities: Iterable[T], key: Callable[[T], Cursor], matches: Callable[[T], bool], limit: int, after: Cursor | None
) -> tuple[list[T], str | None]:
    """As page(), for entities in any order (a small set: it is sorted whole)."""
    return page(sorted(entities, key=key, reverse=True), key, matches, limit, after)


def state_filter(request: web.Request, allowed: Iterable[str]) -> str | None:
    """The `state` query value, one of `allowed`; VALIDATION_FAILED otherwise."""
    value = request.query.get("state") or None
    allowed = tuple(allowed)
    if value is not None and value not in allowed:
        raise ApiError("VALIDATION_FAILED", f"state must be one of {', '.join(allowed)}")
    return value


def text_filter(request: web.Request, field: str) -> str | None:
    value = request.query.get(field) or None
    if value is not None and len(value) > limits.run_name_chars_max:
        raise ApiError("VALIDATION_FAILED", f"{field} must be at most {limits.run_name_chars_max} characters")
    return value


def bool_filter(request: web.Request, field: str) -> bool | None:
    value = request.query.get(field)
    if value is None or value == "":
        return None
    if value not in ("true", "false"):
        raise ApiError("VALIDATION_FAILED", f"{field} must be true or false")
    return value == "true"


class RunOwned(Protocol):
    """A barrier or a timer: what run_owned_page reads of one."""

    space: str
    state: str
    created_ms: int
    seq: int


R = TypeVar("R", bound=RunOwned)


async def run_owned_page(
    request: web.Request,
    node: Node,
    caller: Caller,
    states: tuple[str, ...],
    table: Callable[[State], dict[str, R]],
    of_run: Callable[[Run], list[str]],
    view: Callable[[R], dict[str, Any]],
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the space's barriers or timers (GET /barriers, /timers), newest first, filtered
    by `state` and `scopeId` (then only that run's own, which it keeps in creation order, bounded
    per run): their views and the next page's cursor."""
    limit, after = page_args(request)
    wanted_state = state_filter(request, states)
    scope_id = text_filter(request, "scopeId")
    space = caller.space

    def matches(entity: R) -> bool:
        return entity.space == space and (wanted_state is None or entity.state == wanted_state)

    await node.confirm_leadership(caller)
    with node.read() as state:
        entities = table(state)
        if scope_id is not None:
            run = state.runs.get(scope_id)
            ids = of_run(run) if run is not None and run.space == space else []
            newest_first: Iterable[R] = (entities[entity_id] for entity_id in reversed(ids) if entity_id in entities)
        else:
            newest_first = reversed(entities.values())
        found, next_cursor = page(newest_first, creation_key, matches, limit, after)
        return [view(entity) for entity in found], next_cursor
