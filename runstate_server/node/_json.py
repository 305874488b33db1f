"""JSON text without json.dumps' set-up on every call.

json.dumps with options builds a JSONEncoder per call, and JSONEncoder.iterencode builds its C
encoder per call too: for the small values the API encodes by the thousand (a task's input) that
set-up costs twice the encoding (3.9 us against 1.2 us for `{"n": 1}`). `encoder` builds the C
encoder once. Same text as json.dumps with the same options (tests/test_node_json.py), except that
no circular reference is looked for: what is encoded here was parsed from JSON, which has none.
Answers (answer_text) put each stored payload's text (RawJson) in its place: their encoder's
`default` stands a placeholder for it, replaced once the encoder is done.
"""

from __future__ import annotations

import json
import json.encoder
import re
import secrets
import threading
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

_DEFAULT = json.JSONEncoder().default  # raises json.dumps' TypeError for what JSON cannot hold


def encoder(
    *, ensure_ascii: bool, sort_keys: bool, separators: tuple[str, str], allow_nan: bool,
    default: Callable[[Any], Any] = _DEFAULT,
) -> Callable[[Any], str]:
    """json.dumps(value, ensure_ascii=, sort_keys=, separators=, allow_nan=, default=) as a function
    of value."""
    item_separator, key_separator = separators
    make = json.encoder.c_make_encoder  # type: ignore[attr-defined]
    if make is None:  # an interpreter without json's C accelerator
        return json.JSONEncoder(
            ensure_ascii=ensure_ascii, sort_keys=sort_keys, separators=separators, allow_nan=allow_nan, default=default,
        ).encode
    strings = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring  # type: ignore[attr-defined]
    encode = make(None, default, strings, None, key_separator, item_separator, sort_keys, False, allow_nan)

    def dumps(value: Any) -> str:
        return "".join(encode(value, 0))

    return dumps


# Compact JSON with sorted keys, no NaN or Infinity: equal values give equal text.
canonical_text = encoder(ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # the C scanner json.loads runs, without its Python set-up


def stored_value(data: bytes | str | None) -> Any:
    """A payload the state keeps (its canonical JSON: actors/storage.py json_value) as the JSON
    value it encodes, None for none: json.loads' value at a seventh of its time for a small one
    (0.26 us against 1.7 us for `{"n":1}`), since canonical JSON needs no encoding detection and
    has no white space around it. Anything else is read by json.loads itself."""
    if data is None:
        return None
    try:
        text = data.decode() if isinstance(data, bytes) else data
        value, end = _SCAN(text, 0)
    except (StopIteration, ValueError):
        return json.loads(data)
    return value if end == len(text) else json.loads(data)


class RawJson:
    """A JSON text an answer carries as it is: a stored payload (a task's input or outcome, kept as
    its canonical JSON), which would otherwise be parsed only to be encoded again. Parsing and
    encoding 10 KB of small objects costs ~90 + ~160 µs; a delivery and a result each did both."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"RawJson({self.text!r})"


def raw_value(data: bytes | None) -> RawJson | None:
    """A stored payload (canonical JSON: storage.json_bytes) for an answer, as its text; None for none."""
    return None if data is None else RawJson(data.decode())


# A RawJson stands in the encoded answer as this string until its text replaces it; the random
# part, never in an answer, keeps any string of a caller's from looking like one.
_RAW_MARK = "\x00raw" + secrets.token_hex(16) + ":"
_RAW_PLACEHOLDER = re.compile(re.escape(json.dumps(_RAW_MARK)[:-1]) + r'(\d+)"')


def _splicing(*, ensure_ascii: bool, sort_keys: bool, separators: tuple[str, str], allow_nan: bool) -> Callable[[Any], str]:
    """`encoder(...)` whose text has each RawJson's text in its place. Its encoder is made once;
    the texts of the call under way are kept per thread (an encode never starts another)."""
    calls = threading.local()

    def default(item: Any) -> Any:
        if type(item) is RawJson:
            raw: list[str] = calls.raw
            raw.append(item.text)
            return f"{_RAW_MARK}{len(raw) - 1}"
        return _DEFAULT(item)

    encode_all = encoder(
        ensure_ascii=ensure_ascii, sort_keys=sort_keys, separators=separators, allow_nan=allow_nan, default=default
    )

    def dumps(value: Any) -> str:
        raw: list[str] = []
        calls.raw = raw
        text = encode_all(value)
        if not raw:
            return text
        return _RAW_PLACEHOLDER.sub(lambda found: raw[int(found.group(1))], text)

    return dumps


# json.dumps' own text (aiohttp's json_response default), with each RawJson's text in its place,
# without json.dumps' set-up on every call and without the circular-reference check, which costs
# as much as the rest for an answer of fifty small objects (an answer is built from views of the
# state, which hold no cycle).
answer_text = _splicing(ensure_ascii=True, sort_keys=False, separators=(", ", ": "), allow_nan=True)
# canonical_text with each RawJson's text (a canonical text itself) in its place: the same text as
# canonical_text of the value the RawJson stands for.
canonical_spliced = _splicing(ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


def json_response(
    data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """aiohttp's json_response(data, status=, headers=), the same bytes but for RawJson payloads
    (their canonical text: compact, not escaped to ASCII), for every JSON answer."""
    return web.json_response(data, status=status, headers=headers, dumps=answer_text)
