"""Reading and validating request input. Every failure is a 400 VALIDATION_FAILED naming the field."""

from __future__ import annotations

import codecs
import contextvars
import hashlib
import json
import math
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from aiohttp import web

from runstate_server.actors import limits
from runstate_server.node._json import RawJson, canonical_spliced, canonical_text
from runstate_server.node.api.routes import CALLER_KEY, NODE_KEY, ROUTE_BY_HANDLER_KEY, is_unicode
from runstate_server.node.errors import ApiError

_MISSING = object()
Checked = TypeVar("Checked")


async def json_body(request: web.Request, *, required: bool = True) -> dict[str, Any]:
    """The request's JSON object, read to its end (a body left half-read would make aiohttp drop
    the keep-alive connection under the client's next request)."""
    try:
        raw = await request.read()  # bounded by the app's client_max_size = body_bytes_max
    except web.HTTPRequestEntityTooLarge:
        raise ApiError("VALIDATION_FAILED", f"request body over {limits.body_bytes_max} bytes") from None
    if not raw.strip():
        if required:
            raise ApiError("VALIDATION_FAILED", "a JSON object body is required")
        return {}
    try:
        body = json.loads(utf8_text(raw))
    except RecursionError:
        raise ApiError("VALIDATION_FAILED", f"body nests deeper than {limits.json_depth_max} levels") from None
    except ValueError as error:
        raise ApiError("VALIDATION_FAILED", f"body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise ApiError("VALIDATION_FAILED", "body must be a JSON object")
    canonical = _storable_canonical(raw, body)
    if canonical is None:
        _refuse_unstorable(body)  # raises, naming what cannot be stored
    else:
        request[_CANONICAL_BODY] = canonical  # the idempotency fingerprint's: the body is not parsed twice
    _refuse_unknown_fields(request, body)
    return body


# Byte-order marks: of UTF-8, and those json.loads would take as UTF-16 or UTF-32.
_BYTE_ORDER_MARKS = (codecs.BOM_UTF8, codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def utf8_text(raw: bytes) -> str:
    """The body's text, which must be UTF-8 without a byte-order mark (RFC 8259 section 8.1, and
    docs/http-api.md's charset). json.loads(bytes) would guess UTF-16 or UTF-32 and skip a mark;
    VALIDATION_FAILED instead, before anything is read or changed."""
    if raw.startswith(_BYTE_ORDER_MARKS):
        raise ApiError("VALIDATION_FAILED", "body starts with a byte-order mark: a JSON body is UTF-8 without one")
    if b"\x00" in raw:  # never in JSON text (a control character is escaped): UTF-16 or UTF-32
        raise ApiError("VALIDATION_FAILED", "body holds a NUL byte: a JSON body is UTF-8, not UTF-16 or UTF-32")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError("VALIDATION_FAILED", f"body is not UTF-8 (byte {error.start}): a JSON body is UTF-8") from None


def _storable_canonical(raw: bytes, body: dict[str, Any]) -> bytes | None:
    """The body's canonical JSON if _refuse_unstorable would let it through, else None. Encoding it
    refuses what cannot be stored as _refuse_unstorable does (a lone surrogate fails UTF-8, a
    number that is not finite fails allow_nan=False) but in C, at a fifth of the walk's time;
    only the depth is walked, and only when the body has more brackets than json_depth_max."""
    try:
        canonical = _canonical_body(body)
    except (ValueError, RecursionError):
        return None
    if raw.count(b"{") + raw.count(b"[") > limits.json_depth_max and _deeper_than(body, limits.json_depth_max):
        return None
    return canonical


# Fields whose object or array value is a payload that the state keeps as its canonical JSON
# (`payload`): json_body encodes each such value once, splices that text into the body's canonical
# text (the same text: canonical_spliced) and leaves it to `payload`, which encoded it a second time.
# With 10 KB of small objects in each input, the canonical encoding was 44% of a node's CPU.
_PAYLOAD_FIELDS = frozenset({"input", "payload", "observation", "result"})
# How deep json_body looks for them: a batch's result payload is four levels down.
_PAYLOAD_DEPTH_MAX = 4
# The canonical texts json_body made for this request's payloads, by id, with the value itself (its
# identity is checked, and it is kept alive, so an id cannot stand for another value). Each request's
# handler runs in a task of its own: the mapping is the request's.
_PAYLOAD_TEXTS: contextvars.ContextVar[dict[int, tuple[Any, bytes]] | None] = contextvars.ContextVar(
    "runstate_payload_texts", default=None
)


def _canonical_body(body: dict[str, Any]) -> bytes:
    """canonical_json(body), each payload encoded once (see _PAYLOAD_FIELDS)."""
    texts: dict[int, tuple[Any, bytes]] = {}
    spliced = _payloads_raw(body, texts, 1)
    canonical = canonical_spliced(spliced).encode() if texts else canonical_json(body)
    _PAYLOAD_TEXTS.set(texts)
    return canonical


def _payloads_raw(value: Any, texts: dict[int, tuple[Any, bytes]], depth: int) -> Any:
    """`value` with each payload below it (an object or array under one of _PAYLOAD_FIELDS) as a
    RawJson of its canonical text, recorded in `texts`; the containers on the way are copied,
    `value` itself is left as it is. ValueError for a payload that cannot be stored."""
    kind = type(value)
    if kind is dict:
        copied: dict[str, Any] | None = None
        for key, member in value.items():
            member_kind = type(member)
            if member_kind is not dict and member_kind is not list:
                continue
            # A complete's result is {"payload": ...}: its payload is the one kept.
            if key in _PAYLOAD_FIELDS and not (key == "result" and member_kind is dict and "payload" in member):
                text = canonical_text(member)
                texts[id(member)] = (member, text.encode())
                replaced: Any = RawJson(text)
            elif depth < _PAYLOAD_DEPTH_MAX:
                replaced = _payloads_raw(member, texts, depth + 1)
                if replaced is member:
                    continue
            else:
                continue
            if copied is None:
                copied = dict(value)
            copied[key] = replaced
        return value if copied is None else copied
    if kind is list and depth < _PAYLOAD_DEPTH_MAX:
        items = [_payloads_raw(member, texts, depth + 1) for member in value]
        return value if all(new is old for new, old in zip(items, value, strict=True)) else items
    return value


def _deeper_than(container: Any, depth_max: int, depth: int = 1) -> bool:
    """`container` (a dict or list parsed from JSON) nests deeper than `depth_max` levels."""
    if depth > depth_max:
        return True
    children = container.values() if type(container) is dict else container
    for child in children:
        kind = type(child)
        if (kind is dict or kind is list) and _deeper_than(child, depth_max, depth + 1):
            return True
    return False


def _refuse_unstorable(body: dict[str, Any]) -> None:
    """Refuse what parses but cannot be stored or rendered: nesting deeper than json_depth_max,
    a string that is not valid Unicode (a lone surrogate, which JSON can escape: `"\\ud800"`) and
    a number that is not finite (NaN, Infinity, 1e999). Walked with a stack, not recursion."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > limits.json_depth_max:
                raise ApiError("VALIDATION_FAILED", f"body nests deeper than {limits.json_depth_max} levels")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
            if isinstance(value, dict):
                stack.extend((key, depth) for key in value)
        elif isinstance(value, str):
            if not value.isascii() and not is_unicode(value):
                raise ApiError("VALIDATION_FAILED", "body holds a string that is not valid Unicode (a lone surrogate)")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ApiError("VALIDATION_FAILED", "body holds a number that is not finite")


def _refuse_unknown_fields(request: web.Request, body: dict[str, Any]) -> None:
    """A field the route does not take is an error, never dropped: a misspelt `parentId` must not
    silently create a root run."""
    route = request.app[ROUTE_BY_HANDLER_KEY].get(request.match_info.handler)
    known = (route.body or {}) if route is not None else {}
    unknown = sorted(set(body) - set(known))
    if unknown:
        takes = f"this call takes {', '.join(sorted(known))}" if known else "this call takes no fields"
        raise ApiError("VALIDATION_FAILED", f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; {takes}")


IDEMPOTENCY_HEADER = "Idempotency-Key"
# The canonical JSON of the body json_body read (so the fingerprint does not parse it again).
_CANONICAL_BODY: web.RequestKey[bytes] = web.RequestKey("canonical_body", bytes)
# A request's (key, fingerprint), worked out once however many commands it proposes.
_IDEMPOTENCY_CACHE: web.RequestKey[tuple[str, str] | None] = web.RequestKey("idempotency", object)  # type: ignore[arg-type]
_IDEMPOTENCY_KEY = re.compile(r"^[\x21-\x7e]{1,%d}$" % limits.idempotency_key_chars_max)  # noqa: UP031


def idempotency_key(request: web.Request) -> str | None:
    """The request's Idempotency-Key, None without one; VALIDATION_FAILED for one outside the
    documented pattern. Checked for every mutation, whether or not it writes (app.py), so every
    route has the one rule."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is not None and not _IDEMPOTENCY_KEY.match(key):
        raise ApiError(
            "VALIDATION_FAILED",
            f"{IDEMPOTENCY_HEADER} must be 1 to {limits.idempotency_key_chars_max} printable ASCII characters",
        )
    return key


async def idempotency(request: web.Request) -> tuple[str, str] | None:
    """The request's idempotency key and the fingerprint of what it asks (method, path, query and
    body, with `{}` and no body alike), for `node.propose(..., idempotency=)`; None without the
    header. A malformed key is VALIDATION_FAILED."""
    if _IDEMPOTENCY_CACHE in request:
        return request[_IDEMPOTENCY_CACHE]
    key = idempotency_key(request)
    if key is None:
        request[_IDEMPOTENCY_CACHE] = None
        return None
    body = request.get(_CANONICAL_BODY)
    if body is None:
        raw = await request.read()
        try:
            body = canonical_json(json.loads(raw)) if raw.strip() else b"{}"
        except (ValueError, UnicodeDecodeError, RecursionError):
            body = raw
    fingerprint = hashlib.sha256(f"{request.method} {request.path_qs}\n".encode() + body).hexdigest()
    request[_IDEMPOTENCY_CACHE] = (key, fingerprint)
    return key, fingerprint


async def propose(request: web.Request, kind: str, args: dict[str, Any]) -> Any:
    """Commit the command that carries out this request, for its caller, under the request's
    idempotency key: a retry of the request (same key, same request) gets this command's first
    result and applies nothing. Use it for the one command a request is about; render the answer
    from the result it returns, so a replay renders the same answer."""
    return await request.app[NODE_KEY].propose(
        request[CALLER_KEY], kind, args, idempotency=await idempotency(request)
    )


class BoundExceeded(ApiError):
    """A well-formed value over a bound its schema cannot state (a payload's canonical bytes): in a
    batch, that item's own error, not the batch's (batch_item)."""


def batch_item(index: int, item: Any, check: Callable[[Any], Checked]) -> Checked:
    """`check(item)` for the item at `index` of a batch. An item the route's schema refuses (a
    VALIDATION_FAILED) refuses the whole batch, a 400 naming the item that changes nothing: it is
    the caller's bug, not the item's fate. A well-formed item over a bound the schema cannot state
    raises BoundExceeded, for the caller to answer as that item's own error, as it answers a
    well-formed item the core refuses (a lost lease)."""
    try:
        return check(item)
    except BoundExceeded:
        raise
    except ApiError as error:
        raise ApiError(error.code, f"item {index} of the batch: {error.message}") from None


def refuse_nulls(body: dict[str, Any], *fields: str, absent_means: str) -> None:
    """VALIDATION_FAILED for a field of `fields` given as null, where leaving it out means
    something else (`absent_means`, e.g. a look-up instead of a declaration): null is not absent."""
    nulls = [field for field in fields if field in body and body[field] is None]
    if nulls:
        raise ApiError(
            "VALIDATION_FAILED",
            f"{', '.join(nulls)} must not be null: give a value, or leave {'it' if len(nulls) == 1 else 'them'} out "
            f"({absent_means})",
        )


def text(body: dict[str, Any], field: str, *, max_chars: int, required: bool = False) -> str | None:
    value = body.get(field)
    if value is None:
        if required:
            raise ApiError("VALIDATION_FAILED", f"{field} is required")
        return None
    if not isinstance(value, str) or not 0 < len(value) <= max_chars or not is_unicode(value):
        raise ApiError("VALIDATION_FAILED", f"{field} must be a string of 1 to {max_chars} characters (valid Unicode)")
    return value


def whole_number(value: Any) -> int | None:
    """`value` as an int when it is a JSON integer: an int, or a number with no fraction (`2.0`, an
    integer to JSON Schema's `"type": "integer"`, which the OpenAPI document promises); else None."""
    kind = type(value)
    if kind is int:
        return value  # type: ignore[no-any-return]
    if kind is float and value.is_integer():
        return int(value)
    return None


def requirements(body: dict[str, Any]) -> Any:
    """The body's `requirements` for the core, which checks their shape (tasks.needs_of), with each
    entry's `units` or `reserveMinor` given as a number with no fraction (`2.0`) taken as the
    integer it is, as `integer` takes one (the document's `"type": "integer"` promises it)."""
    value = body.get("requirements")
    if not isinstance(value, dict):
        return value
    normalized = dict(value)
    for kind, field in (("pools", "units"), ("quotas", "units"), ("budgets", "reserveMinor")):
        entries = value.get(kind)
        if isinstance(entries, list):
            normalized[kind] = [_with_whole(entry, field) for entry in entries]
    return normalized


def _with_whole(entry: Any, field: str) -> Any:
    """`entry` with its `field` as an int when it is a float with no fraction; else as it is."""
    if not isinstance(entry, dict) or type(entry.get(field)) is not float:
        return entry
    whole = whole_number(entry[field])
    return entry if whole is None else {**entry, field: whole}


def integer(body: dict[str, Any], field: str, *, minimum: int, maximum: int, default: int | None = None) -> int | None:
    value = body.get(field)
    if value is None:
        return default
    whole = whole_number(value)
    if whole is None or not minimum <= whole <= maximum:
        raise ApiError("VALIDATION_FAILED", f"{field} must be an integer from {minimum} to {maximum}")
    return whole


def flag(body: dict[str, Any], field: str) -> bool:
    value = body.get(field, False)
    if not isinstance(value, bool):
        raise ApiError("VALIDATION_FAILED", f"{field} must be true or false")
    return value


def query_integer(request: web.Request, field: str, *, minimum: int, maximum: int, default: int) -> int:
    raw = request.query.get(field)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError("VALIDATION_FAILED", f"{field} must be an integer") from None
    if not minimum <= value <= maximum:
        raise ApiError("VALIDATION_FAILED", f"{field} must be from {minimum} to {maximum}")
    return value


# The times a request may name: those of years 1 to 9999 in UTC, which every answer can render
# (a time of 0001-01-01 with a positive offset is in the year 0).
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
TIME_MS_MIN = (datetime(1, 1, 1, tzinfo=timezone.utc) - _EPOCH) // timedelta(milliseconds=1)
TIME_MS_MAX = (datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=timezone.utc) - _EPOCH) // timedelta(milliseconds=1)


def timestamp_ms(body: dict[str, Any], field: str) -> int | None:
    """An ISO 8601 time (a naive one is taken as UTC) as milliseconds since the epoch, in the
    years 1 to 9999 UTC."""
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError("VALIDATION_FAILED", f"{field} must be an ISO 8601 string")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ApiError("VALIDATION_FAILED", f"{field} is not an ISO 8601 time: {value!r}") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    moment_ms = (parsed - _EPOCH) // timedelta(milliseconds=1)
    if not TIME_MS_MIN <= moment_ms <= TIME_MS_MAX:
        raise ApiError("VALIDATION_FAILED", f"{field} must be a time in the years 0001 to 9999 UTC: {value!r}")
    return moment_ms


def canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted keys: equal values give equal bytes (the basis of input hashes)."""
    return canonical_text(value).encode()


def payload(body: dict[str, Any], field: str, *, code: str, required: bool = True) -> tuple[Any, bytes]:
    """A JSON value of at most `payload_bytes_max`, with its canonical encoding."""
    value = body.get(field, _MISSING)
    if value is _MISSING:
        if required:
            raise ApiError("VALIDATION_FAILED", f"{field} is required")
        value = None
    texts = _PAYLOAD_TEXTS.get()
    known = texts.get(id(value)) if texts else None
    if known is not None and known[0] is value:
        encoded = known[1]  # json_body encoded it already
    else:
        try:
            encoded = canonical_json(value)
        except ValueError as error:
            raise ApiError("VALIDATION_FAILED", f"{field} is not a JSON value: {error}") from None
    if len(encoded) > limits.payload_bytes_max:
        raise BoundExceeded(code, f"{field} exceeds {limits.payload_bytes_max} bytes (it is {len(encoded)} bytes)")
    return value, encoded


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def lease_ms(body: dict[str, Any]) -> int:
    """The `leaseMs` of a receive, acquire or renew (default 30 s)."""
    value = integer(
        body, "leaseMs", minimum=limits.lease_ms_min, maximum=limits.lease_ms_max, default=limits.lease_ms_default
    )
    assert value is not None
    return value


LEASE_SECONDS_MIN = limits.lease_ms_min / 1000
LEASE_SECONDS_MAX = limits.lease_ms_max // 1000
LEASE_SECONDS = {"type": "number", "minimum": LEASE_SECONDS_MIN, "maximum": LEASE_SECONDS_MAX}


def lease_seconds_ms(body: dict[str, Any], *, required: bool = False) -> int:
    """The `leaseSeconds` of a lease's grant or renew (a number of seconds, fractions allowed, from
    LEASE_SECONDS_MIN to LEASE_SECONDS_MAX; default 30) as milliseconds."""
    value = optional_lease_seconds_ms(body)
    if value is None:
        if required:
            raise ApiError("VALIDATION_FAILED", "leaseSeconds is required")
        return limits.lease_ms_default
    return value


def optional_lease_seconds_ms(body: dict[str, Any]) -> int | None:
    """The `leaseSeconds` of the body as milliseconds, or None when it names none."""
    value = body.get("leaseSeconds")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not LEASE_SECONDS_MIN <= value <= LEASE_SECONDS_MAX:
        raise ApiError("VALIDATION_FAILED", f"leaseSeconds must be a number from {LEASE_SECONDS_MIN} to {LEASE_SECONDS_MAX}")
    return max(limits.lease_ms_min, min(limits.lease_ms_max, round(value * 1000)))


def error_text(body: dict[str, Any]) -> str | None:
    """The `error` a worker reports, cut to `error_message_chars_max`."""
    error = body.get("error")
    if error is None:
        return None
    if not isinstance(error, str):
        raise ApiError("VALIDATION_FAILED", "error must be a string")
    return error[: limits.error_message_chars_max]


def task_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The fields of a task to submit (to a mailbox or a group): its input, the input's hash, its
    key (`taskKey`, or `key` for a group member; the hash when none is given), attempts (None: the
    mailbox's maxAttempts, else the default) and keyOnly, as the core's submit takes them."""
    _, encoded = payload(body, "input", code="VALIDATION_FAILED")
    input_hash = sha256_hex(encoded)
    key = text(body, "taskKey", max_chars=limits.key_chars_max) or text(body, "key", max_chars=limits.key_chars_max)
    return {
        "key": key or input_hash,
        "input": encoded,  # the state keeps payloads as their canonical JSON bytes
        "input_hash": input_hash,
        "attempts": integer(body, "attempts", minimum=1, maximum=limits.attempts_max),
        "key_only": flag(body, "keyOnly"),
    }


def holder_session(body: dict[str, Any]) -> str | None:
    """The `holderSession` next to `holder`: one live client instance of that holder."""
    return text(body, "holderSession", max_chars=limits.name_chars_max)
