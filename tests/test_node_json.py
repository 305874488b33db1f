"""node/_json.py's encoders write json.dumps' text; json_body's C check refuses what the walk does."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from aiohttp import web
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from runstate_server.actors import limits
from runstate_server.node._json import canonical_text, encoder, json_response, raw_value, stored_value
from runstate_server.node.api._request import (
    _PAYLOAD_TEXTS,
    _canonical_body,
    _refuse_unstorable,
    _storable_canonical,
    payload,
)
from runstate_server.node.errors import ApiError

# Text with lone surrogates, numbers that are not finite, keys that sort by code point.
_texts = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()), max_size=8)
_scalars = st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | _texts
_values = st.recursive(
    _scalars, lambda children: st.lists(children, max_size=4) | st.dictionaries(_texts, children, max_size=4), max_leaves=30
)
_OPTIONS = [
    {"ensure_ascii": True, "sort_keys": False, "separators": (", ", ": "), "allow_nan": True},
    {"ensure_ascii": False, "sort_keys": True, "separators": (",", ":"), "allow_nan": False},
    {"ensure_ascii": True, "sort_keys": True, "separators": (",", ":"), "allow_nan": True},
]


def _outcome(function: Any, value: Any) -> tuple[str, Any]:
    try:
        return "text", function(value)
    except (ValueError, TypeError) as error:
        return "error", (type(error), str(error))


@settings(max_examples=300, deadline=None)
@given(_values)
def test_an_encoder_writes_what_json_dumps_writes(value: Any) -> None:
    for options in _OPTIONS:
        assert _outcome(encoder(**options), value) == _outcome(lambda v, o=options: json.dumps(v, **o), value)


def test_what_json_cannot_hold_is_json_dumps_type_error() -> None:
    for options in _OPTIONS:
        assert _outcome(encoder(**options), {"a": object()})[1][0] is TypeError
    assert canonical_text({"b": 1, "a": [1.5, "é"]}) == '{"a":[1.5,"é"],"b":1}'


def _nested(depth: int) -> Any:
    """`depth` containers, one in the other."""
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_texts, _values, max_size=4))
def test_the_c_check_refuses_exactly_what_the_walk_refuses(body: dict[str, Any]) -> None:
    raw = json.dumps(body).encode()  # stands for the request's bytes (only its brackets are counted)
    try:
        _refuse_unstorable(body)
    except ApiError:
        assert _storable_canonical(raw, body) is None
    else:
        expected = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        assert _storable_canonical(raw, body) == expected


@pytest.mark.parametrize("depth", [limits.json_depth_max - 1, limits.json_depth_max, limits.json_depth_max + 1, 500])
def test_the_c_check_refuses_a_body_deeper_than_json_depth_max(depth: int) -> None:
    body = {"a": _nested(depth - 1)} if depth > 1 else {}
    raw = json.dumps(body).encode()
    refused = depth > limits.json_depth_max
    assert (_storable_canonical(raw, body) is None) == refused
    with pytest.raises(ApiError) if refused else _no_error():
        _refuse_unstorable(body)


def test_the_c_check_refuses_numbers_that_are_not_finite_and_lone_surrogates() -> None:
    for body in ({"x": math.nan}, {"x": [math.inf]}, {"x": {"y": "\ud800"}}, {"\udfff": 1}):
        assert _storable_canonical(json.dumps(body).encode(), body) is None


class _no_error:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return False


@settings(max_examples=300, deadline=None)
@given(_values)
def test_a_stored_payload_reads_as_json_loads_reads_it(value: Any) -> None:
    try:
        data = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except ValueError:
        return  # not storable (a lone surrogate, NaN)
    assert stored_value(data) == json.loads(data)
    assert json.dumps(stored_value(data)) == json.dumps(json.loads(data))


def test_a_value_that_is_not_canonical_json_is_read_by_json_loads() -> None:
    assert stored_value(None) is None
    assert stored_value(b' {"a": 1} ') == {"a": 1}
    assert stored_value('{"a":1}') == {"a": 1}
    with pytest.raises(json.JSONDecodeError):
        stored_value(b"{")
    with pytest.raises(json.JSONDecodeError):
        stored_value(b"1 2")


@settings(max_examples=200, deadline=None)
@given(_values, st.sampled_from([200, 201, 409]))
def test_an_answer_is_the_bytes_and_headers_aiohttp_json_response_makes(value: Any, status: int) -> None:
    headers = {"X-Request-Id": "req_1"}
    expected = web.json_response(value, status=status, headers=headers)  # NaN too, as json.dumps writes it
    answer = json_response(value, status=status, headers=headers)
    assert (answer.status, answer.body, dict(answer.headers)) == (expected.status, expected.body, dict(expected.headers))


def _storable(value: Any) -> bytes | None:
    """The canonical JSON a payload is stored as (storage.json_bytes), None if it cannot be."""
    try:
        return canonical_text(value).encode()
    except ValueError:
        return None  # a lone surrogate, NaN: not storable


@settings(max_examples=300, deadline=None)
@given(st.lists(_values, min_size=1, max_size=4), _values)
def test_an_answer_carries_stored_payloads_as_their_canonical_text(payloads: list[Any], around: Any) -> None:
    stored = [_storable(payload) for payload in payloads]
    assume(all(data is not None for data in stored))
    answer = {"items": [{"payload": raw_value(data), "n": index} for index, data in enumerate(stored)], "around": around}
    parsed = {"items": [{"payload": stored_value(data), "n": index} for index, data in enumerate(stored)], "around": around}
    body = json_response(answer).body
    assert isinstance(body, bytes)
    assert _loads_with_nan(body) == _loads_with_nan(json_response(parsed).body)
    for data in stored:
        assert data in body  # as stored: compact, sorted, not escaped to ASCII


def _loads_with_nan(body: Any) -> Any:
    """The answer's value, NaN made comparable (NaN != NaN)."""
    return json.loads(body, parse_constant=lambda name: f"<{name}>")


def test_a_string_of_the_caller_that_looks_like_a_placeholder_stays_as_it_is() -> None:
    looks_like = ["\x00raw", "\x00raw0", "\x00raw" + "0" * 32 + ":0", '"\\u0000raw:0"']
    answer = json_response({"payload": raw_value(b'{"a":1}'), "keys": looks_like, "none": raw_value(None)}).body
    assert json.loads(answer) == {"payload": {"a": 1}, "keys": looks_like, "none": None}


_FIELD_NAMES = st.sampled_from(["input", "payload", "result", "observation", "tasks", "items", "taskKey"]) | _texts
_bodies = st.recursive(
    _scalars, lambda children: st.lists(children, max_size=4) | st.dictionaries(_FIELD_NAMES, children, max_size=4),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_FIELD_NAMES, _bodies, max_size=4))
def test_a_body_whose_payloads_are_encoded_apart_has_the_canonical_text_of_the_whole(body: dict[str, Any]) -> None:
    try:
        expected = canonical_text(body).encode()
    except ValueError:
        with pytest.raises(ValueError):
            _canonical_body(body)
        return
    assert _canonical_body(body) == expected
    # Each payload's text, as `payload` takes it, is the canonical text of that very value.
    texts = _PAYLOAD_TEXTS.get() or {}
    for value, text in texts.values():
        assert text == canonical_text(value).encode()
    tasks = body.get("tasks")
    for item in [body, *(tasks if isinstance(tasks, list) else [])]:
        if isinstance(item, dict) and "input" in item:
            assert payload(item, "input", code="VALIDATION_FAILED")[1] == canonical_text(item["input"]).encode()


def test_payloads_are_found_where_the_routes_keep_them() -> None:
    batch = {"tasks": [{"input": {"n": n, "list": [n]}, "taskKey": f"k{n}"} for n in range(3)]}
    completes = {"items": [{"id": "tsk_1", "token": "t", "result": {"payload": {"doubled": [2]}}}]}
    for body, payloads in ((batch, [task["input"] for task in batch["tasks"]]), (completes, [{"doubled": [2]}])):
        assert _canonical_body(body) == canonical_text(body).encode()
        texts = _PAYLOAD_TEXTS.get() or {}
        assert sorted(text for _, text in texts.values()) == sorted(canonical_text(value).encode() for value in payloads)
