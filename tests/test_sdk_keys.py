"""Keys of once calls and queue jobs: RFC 8785 canonical JSON, argument binding, conversions.

`tests/key_vectors.json` is shared with other SDKs (sdk/typescript/test/keys.test.ts reads it too):
a list of `{"name", "args", "canonical", "key"}` where `args` is the JSON list that is hashed (the
arguments as passed), `canonical` its RFC 8785 text and `key` =
`name + ":" + sha256(canonical, UTF-8)[:32 hex]`. A vector may say how each SDK makes that key from
a call: `"python": {"parameters", "args", "kwargs"}` (the wrapped function's parameter list, as
source, and the call) and `"typescript": {"parameters", "args"}`; without one, the call passes
`args` to a function of as many parameters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import runstate
from runstate.sdk._time import parse_duration_ms
from runstate.sdk.errors import ConfigError
from runstate.sdk.keys import canonical_json, json_value, make_key

VECTORS = json.loads((Path(__file__).parent / "key_vectors.json").read_text(encoding="utf-8"))


def _function_of(parameters: str) -> Any:
    """A function with the parameter list `parameters` (Python source; never called)."""
    namespace: dict[str, Any] = {}
    exec(f"def f({parameters}): pass", namespace)  # noqa: S102 - a signature the vector names
    return namespace["f"]


@pytest.mark.parametrize("vector", VECTORS, ids=[vector["name"] for vector in VECTORS])
def test_key_vectors(vector: dict[str, Any]) -> None:
    assert canonical_json(vector["args"]) == vector["canonical"]
    digest = hashlib.sha256(vector["canonical"].encode("utf-8")).hexdigest()[:32]
    assert vector["key"] == f"{vector['name']}:{digest}"
    assert make_key(vector["name"], vector["args"]) == vector["key"]
    # The same key through a once-wrapped function called as the vector says.
    call = vector.get("python", {})
    parameters = call.get("parameters", ", ".join(f"p{index}" for index in range(len(vector["args"]))))
    wrapped = runstate.once(_function_of(parameters), name=vector["name"])
    assert wrapped.once_key(*call.get("args", vector["args"]), **call.get("kwargs", {})) == vector["key"]


def test_vectors_cover_what_other_sdks_get_wrong() -> None:
    names = {vector["name"] for vector in VECTORS}
    assert {"unicode", "utf16_order", "nested", "floats", "ints", "empty_containers", "nulls", "rfc8785"} <= names
    # How a call becomes the hashed list: defaults, *args, keyword-only and **kwargs arguments.
    assert {
        "xlang-default", "default_passed", "xlang-varargs", "varargs_none", "varargs_after_first", "kwargs",
        "keyword_only_left_out", "keyword_only_passed", "keyword_after_a_default_left_out", "json_kinds_by_keyword",
        "json_kinds_positional",
    } <= names
    assert all("typescript" in vector for vector in VECTORS if "python" in vector)


def test_rfc8785_examples() -> None:
    text = (
        '{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],'
        '"string":"\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/","literals":[null,true,false]}'
    )
    assert canonical_json(json.loads(text)) == (
        '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
        '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
    )
    sorted_members = canonical_json({"\u20ac": 1, "\r": 2, "\ufb33": 3, "1": 4, "\U0001f600": 5, "\u0080": 6, "\u00f6": 7})
    assert sorted_members == '{"\\r":2,"1":4,"\u0080":6,"ö":7,"€":1,"\U0001f600":5,"\ufb33":3}'


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1e21, "1e+21"), (1e20, "100000000000000000000"), (1.5e-7, "1.5e-7"), (1e-6, "0.000001"),
        (-0.0, "0"), (0.0, "0"), (100.0, "100"), (-2.5, "-2.5"), (5e-324, "5e-324"),
        (2**53, "9007199254740992"), (2**53 + 1, "9007199254740992"), (2**64, "18446744073709552000"),
        (10**21, "1e+21"), (-(2**60), "-1152921504606847000"), (True, "true"), (None, "null"),
    ],
)
def test_numbers_as_ecmascript_writes_them(value: Any, text: str) -> None:
    assert canonical_json(value) == text


def test_a_default_left_out_is_not_hashed_as_in_typescript() -> None:
    """Issue 39: `f("acme")` of `def f(company, depth=2)` hashed `["acme", 2]`, while TypeScript's
    `once(async (c, d = 2) => 1, { name: 'xlang-default' }).onceKey('acme')` and the published
    client hash `["acme"]`."""

    @runstate.once(name="xlang-default")
    def f(company: str, depth: int = 2) -> None: ...

    assert f.once_key("acme") == "xlang-default:07fad54f7446269afc481e306a48f046"  # TypeScript's key
    assert f.once_key("acme") == make_key("xlang-default", ["acme"])
    assert f.once_key("acme", 2) == f.once_key("acme", depth=2) == make_key("xlang-default", ["acme", 2])

    @runstate.once(name="xlang-varargs")
    def g(*names: str) -> None: ...

    assert g.once_key("acme", "globex") == "xlang-varargs:d4b94c9e4d9992b4d62acd5480625c3c"


def test_arguments_are_hashed_as_passed() -> None:
    @runstate.once
    def research(name: str, depth: int = 2, *, verbose: bool = False) -> None: ...

    key = research.once_key("acme")
    assert key == make_key("research", ["acme"])
    # By name, and the same call by position, are one key.
    assert research.once_key(name="acme") == key
    assert research.once_key(name="acme", depth=3) == research.once_key("acme", 3) == make_key("research", ["acme", 3])
    # Passing a default is another call than leaving it out, as it is in TypeScript.
    assert research.once_key("acme", 2) != key
    assert research.once_key("acme", verbose=False) == make_key("research", ["acme", {"verbose": False}])
    with pytest.raises(TypeError):
        research.once_key()

    @runstate.once
    def skip(a: str, b: int = 2, c: int = 3) -> None: ...

    assert skip.once_key("x", c=5) == make_key("skip", ["x", {"c": 5}])


def test_var_args_are_positional_and_keywords_one_object() -> None:
    @runstate.once
    def gather(first: str, *rest: int, **options: Any) -> None: ...

    assert gather.once_key("a", 1, 2, fast=True) == make_key("gather", ["a", 1, 2, {"fast": True}])
    assert gather.once_key("a") == make_key("gather", ["a"])
    assert gather.once_key(first="a", fast=True) == make_key("gather", ["a", {"fast": True}])


def test_key_function_hashes_its_return_value() -> None:
    @dataclasses.dataclass
    class Company:
        domain: str
        name: str

    @runstate.once(name="research", key=lambda company, http: company.domain)
    def research(company: Company, http: object) -> None: ...

    assert research.once_key(Company("acme.com", "Acme"), object()) == "research:acme.com"  # as the published clients
    assert research.once_name == "research"


def test_tuples_dataclasses_and_models_are_converted() -> None:
    @dataclasses.dataclass
    class Point:
        x: int
        y: tuple[int, int]

    class Model:  # what pydantic offers: model_dump(mode="json")
        def model_dump(self, mode: str = "python") -> dict[str, Any]:
            assert mode == "json"
            return {"when": "2026-01-01T00:00:00Z", "n": (1, 2)}

    assert json_value((1, Point(1, (2, 3)), Model())) == [
        1, {"x": 1, "y": [2, 3]}, {"when": "2026-01-01T00:00:00Z", "n": [1, 2]}
    ]

    @runstate.once
    def f(point: Point) -> None: ...

    assert f.once_key(Point(1, (2, 3))) == make_key("f", [{"x": 1, "y": [2, 3]}])


@pytest.mark.parametrize(
    "argument",
    [object(), {1, 2}, b"bytes", float("nan"), float("inf"), {1: "int key"}, "\ud800", [[object()]], Path("/tmp")],
    ids=["object", "set", "bytes", "nan", "inf", "int-key", "lone-surrogate", "nested-object", "path"],
)
def test_arguments_that_are_not_json_raise_config_error(argument: Any) -> None:
    @runstate.once
    def f(value: Any) -> None:
        raise AssertionError("never called")

    with pytest.raises(ConfigError, match="value"):
        f.once_key(argument)
    # A call refuses before any request (no server is configured for this test).
    with pytest.raises(ConfigError):
        f(argument)


def test_queue_keys_hash_the_input_or_take_its_key() -> None:
    """As the published clients: `<name>:` and the hash of `[input]`, or the text `key(input)`
    returns; a key function's other JSON values are hashed (an extension)."""
    @runstate.queue("keys-q", key=lambda input: input["company"])
    def research(input: dict[str, Any]) -> None: ...

    assert research.key_of({"company": "acme", "at": 1}) == "keys-q:acme"

    @runstate.queue("keys-q2")
    def plain(input: Any) -> None: ...

    assert plain.key_of({"b": 1, "a": [1.0]}) == make_key("keys-q2", [{"a": [1], "b": 1}])
    # The published 0.3.0 client's key of the quickstart's input, worked out by its own code.
    assert plain.key_of({"n": 21}) == "keys-q2:" + hashlib.sha256(b'[{"n":21}]').hexdigest()[:32]

    @runstate.queue("keys-q3", key=lambda input: [input["a"], input["b"]])
    def pair(input: dict[str, Any]) -> None: ...

    assert pair.key_of({"a": 1, "b": "x"}) == make_key("keys-q3", [1, "x"])
    for bad in ("", "k" * 256):
        @runstate.queue("keys-q4", key=lambda input, bad=bad: bad)
        def refused(input: Any) -> None: ...

        with pytest.raises(ConfigError):
            refused.key_of(1)
    with pytest.raises(ConfigError):
        plain.send(object())


@pytest.mark.parametrize(
    ("value", "ms"),
    [(30, 30_000), (0.5, 500), ("60s", 60_000), ("500ms", 500), ("2m", 120_000), ("1.5s", 1_500), ("1h", 3_600_000),
     (" 10 S ", 10_000), ("7", 7_000), (timedelta(seconds=3), 3_000)],
)
def test_durations(value: Any, ms: int) -> None:
    assert parse_duration_ms(value, "lease") == ms


@pytest.mark.parametrize("value", ["", "soon", "-1s", 0, True, None, "5 parsecs", float("nan")])
def test_bad_durations(value: Any) -> None:
    with pytest.raises(ConfigError, match="lease"):
        parse_duration_ms(value, "lease")
