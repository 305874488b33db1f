"""Raw requests against a furnished `runstate dev --auth` node (tests/_auth_world.py): hypothesis
picks a route of the route table and sends it bodies of any bytes, JSON nested deeply, numbers and
strings JSON cannot carry into the log (huge, not finite, lone surrogates), fields of the wrong type,
header values of any bytes (Authorization, Idempotency-Key, X-Runstate-Holder, Content-Type,
Origin, a forwarded X-Request-Id) and path and query values of any bytes. No answer is a server
error, every error is the JSON envelope with a known code and its status, and the node logs no
traceback.

Short form by default; the long form raises the examples per route, e.g.
`RUNSTATE_FUZZ_EXAMPLES=200 .venv/bin/python -m pytest tests/test_raw_fuzz.py` (the variable
test_openapi_fuzz.py reads too)."""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from runstate_server.node.api.backup import BACKUP_MEDIA_TYPE
from runstate_server.node.config import LONG_POLL_MS_MAX
from runstate_server.node.errors import STATUS_BY_CODE
from tests._auth_world import SPACE_ROUTE_PREFIX, World, auth_world, concrete
from tests._http import Api
from tests._raw_http import send

# Examples per route (about 1500 in all by default, some 10 s).
# The successes that are not JSON: GET /metrics (Prometheus text) and GET /v1/cluster/backup (a backup file).
NOT_JSON = ("text/plain", BACKUP_MEDIA_TYPE)
EXAMPLES_PER_ROUTE = int(os.environ.get("RUNSTATE_FUZZ_EXAMPLES", "20"))
_PARAMETER = re.compile(r"{(\w+)}")

pytestmark = pytest.mark.slow


@dataclass
class Target:
    world: World
    key: str
    fields: dict[tuple[str, str], list[str]]  # (method, path) -> the body's fields, from the document
    in_space: set[str]  # the paths (as World names them) under /v1/spaces/{spaceId}/
    log_offset: int = 0

    def new_log(self) -> str:
        """What the node logged since the last call."""
        with open(self.world.node.log_path, "rb") as log:
            log.seek(self.log_offset)
            text = log.read()
        self.log_offset += len(text)
        return text.decode(errors="replace")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    for world in auth_world(tmp_path_factory):
        document = Api(world.node.url).ok("GET", "/v1/openapi.json")
        fields = {
            (method.upper(), path.replace(SPACE_ROUTE_PREFIX, "/v1/", 1)): sorted(
                operation.get("requestBody", {}).get("content", {}).get("application/json", {})
                .get("schema", {}).get("properties", {})
            )
            for path, operations in document["paths"].items()
            for method, operation in operations.items()
        }
        in_space = {
            path.replace(SPACE_ROUTE_PREFIX, "/v1/", 1) for path in document["paths"] if path.startswith(SPACE_ROUTE_PREFIX)
        }
        target = Target(world, world.admin.headers["Authorization"].split()[1], fields, in_space)
        target.new_log()  # what building the world logged is not the fuzz's
        yield target


# Header values of any bytes HTTP/1.1 lets a header carry (no CR, LF or other control byte).
header_bytes = st.binary(max_size=60).map(
    lambda raw: bytes(byte for byte in raw if byte == 0x09 or 0x20 <= byte != 0x7F)
)
path_values = st.binary(min_size=1, max_size=40).map(lambda raw: urllib.parse.quote(raw, safe=""))
surrogates = st.sampled_from(["\ud800", "a\udfff", "\udc80\udc80", "ok\ud83d"])
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30]),
    st.floats(), st.text(max_size=20), surrogates,
    st.sampled_from(["0001-01-01T00:00:00+23:59", "9999-12-31T23:59:59-01:00", "2026-01-01T00:00:00Z"]),
)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.one_of(st.text(max_size=8), surrogates), children, max_size=3)
    ),
    max_leaves=8,
)
# Literals json.dumps would not write: beyond a float, beyond the parser's digit limit, deep.
literals = st.one_of(
    st.sampled_from(["1e999", "-1e999", "NaN", "Infinity", "1" * 5000, "-0", "0.0000001", '"\\ud800"', '"\\udfff"']),
    st.integers(min_value=60, max_value=3000).map(lambda depth: "[" * depth + "]" * depth),
    st.integers(min_value=60, max_value=3000).map(lambda depth: '{"a":' * depth + "1" + "}" * depth),
)


def _safe_wait(body: dict[str, Any]) -> dict[str, Any]:
    """No long poll that would hold the example: a valid waitMs is 0."""
    wait = body.get("waitMs")
    if isinstance(wait, int) and not isinstance(wait, bool) and 0 < wait <= LONG_POLL_MS_MAX:
        body["waitMs"] = 0
    return body


@st.composite
def bodies(draw: st.DrawFn, base: dict[str, Any] | None, fields: list[str]) -> bytes | None:
    kind = draw(st.sampled_from(["none", "bytes", "deep", "fields", "literal", "valid"]))
    if kind == "none":
        return None
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        return ("[" * draw(st.integers(min_value=1, max_value=100_000))).encode()
    body = dict(base or {})
    names = st.sampled_from(fields) if fields else st.text(max_size=8)
    if kind == "valid":
        return json.dumps(body).encode()
    if kind == "literal":
        name = draw(names)
        body.pop(name, None)
        prefix = json.dumps(body)[:-1] + (", " if body else "")
        return f"{prefix}{json.dumps(name)}: {draw(literals)}}}".encode()
    for name in draw(st.lists(names, min_size=1, max_size=3)):
        body[name] = draw(json_values)
    return json.dumps(_safe_wait(body)).encode()  # ensure_ascii: a lone surrogate goes out as \ud800


@st.composite
def requests(draw: st.DrawFn, target: Target) -> tuple[str, str, bytes | None, dict[str, bytes | str]]:
    world = target.world
    method, path, _ = draw(st.sampled_from(world.routes))
    fields = target.fields.get((method, path), [])
    base = world.bodies.get((method, path))
    if method == "GET":  # the fuzzed fields of a GET go in its query
        base = None
    if draw(st.booleans()):
        url = concrete(world, method, path)
    else:
        url = _PARAMETER.sub(lambda _: draw(path_values), path)
    if path in target.in_space:
        space = draw(st.one_of(st.just("default"), st.just("default"), st.just("default"), path_values))
        url = f"/v1/spaces/{space}/{url[len('/v1/'):]}"
    query = draw(st.lists(st.tuples(st.sampled_from([*fields, "waitMs", "space", "name", "scopeId", "x"]), st.binary(max_size=30)), max_size=2))
    if query:
        url += "?" + "&".join(
            f"{name}={urllib.parse.quote(value if name != 'waitMs' else b'0', safe='')}" for name, value in query
        )
    if draw(st.integers(min_value=0, max_value=9)) == 0:
        method = draw(st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH"]))
    headers: dict[str, bytes | str] = {}
    if draw(st.integers(min_value=0, max_value=9)) > 0:
        headers["Authorization"] = f"Bearer {target.key}"
    elif draw(st.booleans()):
        headers["Authorization"] = b"Bearer " + draw(header_bytes)
    content_type = draw(st.integers(min_value=0, max_value=9))
    if content_type > 1:
        headers["Content-Type"] = "application/json"
    elif content_type == 1:
        headers["Content-Type"] = draw(header_bytes)
    for name in ("Idempotency-Key", "X-Runstate-Holder", "Origin", "X-Request-Id"):
        if draw(st.integers(min_value=0, max_value=3)) == 0:
            headers[name] = draw(header_bytes)
    if "X-Request-Id" in headers and draw(st.booleans()):
        headers["X-Runstate-Forwarded-By"] = "n9"
    return method, url, draw(bodies(base, fields)), headers


def test_raw_requests_never_crash_the_node(target: Target) -> None:
    @settings(
        max_examples=EXAMPLES_PER_ROUTE * len(target.world.routes), deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(request=requests(target))
    def check(request: tuple[str, str, bytes | None, dict[str, bytes | str]]) -> None:
        method, url, body, headers = request
        answer = send(target.world.node.url, method, url, body, headers)
        what = (method, url, body[:200] if body else body, headers, answer.status, answer.body[:500])
        assert answer.status < 500, what
        event(f"{answer.status} {answer.code or ''}")  # --hypothesis-show-statistics tallies them
        if answer.status >= 400:
            envelope = answer.json()
            assert set(envelope) == {"error"} and set(envelope["error"]) == {"code", "message", "requestId"}, what
            code = envelope["error"]["code"]
            assert STATUS_BY_CODE.get(code) == answer.status, what
            assert envelope["error"]["requestId"] == answer.headers["X-Request-Id"], what
        elif answer.status != 204 and not answer.headers.get("Content-Type", "").startswith(NOT_JSON):
            answer.json()  # a success is JSON (but GET /metrics: Prometheus text; a backup: its file)
        log = target.new_log()
        assert "Traceback" not in log and " ERROR " not in log, (what, log[-4000:])

    check()
