"""JSON text without json.dumps' set-up on every call.

json.dumps with options builds a JSONEncoder per call, and JSONEncoder.iterencode builds its C
encoder per call too: for the small values the API encodes by the thousand (a task's input) that
set-up costs twice the encoding (3.9 us against 1.2 us for `{"n": 1}`). `encoder` builds the C
encoder once. Same text as json.dumps with the same options (tests/test_node_json.py), except that
no circular reference is looked for: what is encoded here was parsed from JSON, which has none.
"""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

_DEFAULT = json.JSONEncoder().default  # raises json.dumps' TypeError for what JSON cannot hold


def encoder(*, ensure_ascii: bool, sort_keys: bool, separators: tuple[str, str], allow_nan: bool) -> Callable[[Any], str]:
    """json.dumps(value, ensure_ascii=, sort_keys=, separators=, allow_nan=) as a function of value."""
    item_separator, key_separator = separators
    make = json.encoder.c_make_encoder  # type: ignore[attr-defined]
    if make is None:  # an interpreter without json's C accelerator
        return json.JSONEncoder(
            ensure_ascii=ensure_ascii, sort_keys=sort_keys, separators=separators, allow_nan=allow_nan
        ).encode
    strings = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring  # type: ignore[attr-defined]
    encode = make(None, _DEFAULT, strings, None, key_separator, item_separator, sort_keys, False, allow_nan)

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


# json.dumps' own text (aiohttp's json_response default), without its set-up on every call and
# without the circular-reference check, which costs as much as the rest for an answer of fifty
# small objects (an answer is built from views of the state, which hold no cycle).
answer_text = encoder(ensure_ascii=True, sort_keys=False, separators=(", ", ": "), allow_nan=True)


def json_response(
    data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """aiohttp's json_response(data, status=, headers=), the same bytes, for every JSON answer."""
    return web.json_response(data, status=status, headers=headers, dumps=answer_text)
