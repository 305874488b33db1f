"""Random, malformed and cross-space ids and headers against a `runstate dev --auth` node: no answer
is a 5xx, and no answer to another space's key holds any id of the operator space."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._auth_world import World, auth_world, concrete
from tests._http import call

FUZZ_EXAMPLES = 150


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    yield from auth_world(tmp_path_factory)


def secret_of(api: Any) -> str:
    return str(api.headers["Authorization"].split()[1])


# An id: one of the operator space's real ids, a near miss, or anything at all.
ids = st.one_of(
    st.sampled_from(["scopes", "tasks", "deliveries", "claims", "groups", "barriers", "timers", "keys"]),
    st.text(min_size=0, max_size=40),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-/%", min_size=1, max_size=300),
    st.sampled_from(["..", "%2e%2e", "%00", "run_", "tsk_", "a" * 5000, "\u202e", "🙂", "key:.+"]),
)
headers = st.dictionaries(
    st.sampled_from(["Authorization", "X-Runstate-Holder", "Content-Type", "Idempotency-Key"]),
    st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=80),
    max_size=3,
)
bodies = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(["taskId", "key", "input", "ids", "result", "leaseMs", "permissions", "space", "name"]),
        st.one_of(st.text(max_size=20), st.integers(), st.lists(st.text(max_size=10), max_size=3), st.none()),
        max_size=4,
    ),
)


def forbidden_ids(world: World) -> set[str]:
    """The operator space's ids that a key of another space must never be shown."""
    # A cluster member's id is the node's own (GET /v1/health shows it to anyone), not the space's.
    return {value for family, value in world.ids.items() if family not in ("mailboxes", "claim-key", "cluster")}


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(route_index=st.integers(min_value=0), identifier=ids, extra_headers=headers, body=bodies,
       as_other=st.booleans())
def test_random_ids_and_headers_never_crash_and_never_leak(
    world: World, route_index: int, identifier: str, extra_headers: dict[str, str], body: Any, as_other: bool
) -> None:
    method, path, _ = world.routes[route_index % len(world.routes)]
    real = world.ids.get(identifier)
    value = real if real is not None else urllib.parse.quote(identifier, safe="")
    url_path = concrete(world, method, path, ids={family: value for family in world.ids})
    request_headers = dict(extra_headers)
    if as_other and "Authorization" not in request_headers:
        request_headers["Authorization"] = f"Bearer {secret_of(world.other)}"
    try:
        status, answer = call(world.node.url, method, url_path, body, headers=request_headers)
    except ValueError:  # a non-JSON answer (aiohttp's own 400 for a malformed request line is fine)
        return
    assert status < 500, (method, url_path, request_headers, body, status, answer)
    if request_headers.get("Authorization") == f"Bearer {secret_of(world.other)}":
        text = str(answer)
        leaked = [found for found in forbidden_ids(world) if found in text and found not in url_path]
        assert not leaked, (method, url_path, answer)
