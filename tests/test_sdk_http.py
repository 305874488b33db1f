"""The SDK's transport and settings, without a runstate server (a fake aiohttp app stands in)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from typing import Any

import hypothesis
import pytest
import runstate
from aiohttp import web
from runstate import AsyncRunstate
from runstate.sdk import _http
from runstate.sdk._http import BASE_URL_DEFAULT, default_holder, parse_base_urls
from runstate.sdk._time import format_deadline, parse_time

from tests._nodes import free_port


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RUNSTATE_BASE_URL", "RUNSTATE_SPACE_ID", "RUNSTATE_API_KEY"):
        monkeypatch.delenv(name, raising=False)


# --- settings ---------------------------------------------------------------------------------


@hypothesis.given(hypothesis.strategies.text(min_size=1))
def test_a_path_segment_is_what_quote_makes_of_it(value: str) -> None:
    assert _http.path_segment(value, "id") == urllib.parse.quote(value, safe="")


@pytest.mark.parametrize("value", ["tsk_0a1b", "a.b-c~d_e", "a b", "a/b", "é", "%41", "?", "#"])
def test_path_segments_of_ids_and_of_other_names(value: str) -> None:
    assert _http.path_segment(value, "id") == urllib.parse.quote(value, safe="")


def test_a_body_json_cannot_carry_is_refused() -> None:
    looped: dict[str, Any] = {}
    looped["self"] = looped
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    for body in ({"v": {1, 2}}, {"v": float("nan")}, {"v": object()}, looped, {"v": deep}):
        with pytest.raises(runstate.ConfigError, match="not JSON-serializable"):
            _http.encode_body(body)
    assert _http.encode_body({"v": "é\u2028"}) == '{"v":"é\u2028"}'.encode()  # not escaped to ASCII


_JSON_VALUES = hypothesis.strategies.recursive(
    hypothesis.strategies.none() | hypothesis.strategies.booleans() | hypothesis.strategies.integers()
    | hypothesis.strategies.floats(allow_nan=False, allow_infinity=False) | hypothesis.strategies.text(),
    lambda children: hypothesis.strategies.lists(children) | hypothesis.strategies.dictionaries(hypothesis.strategies.text(), children),
)


@hypothesis.given(hypothesis.strategies.dictionaries(hypothesis.strategies.text(), _JSON_VALUES))
def test_a_body_is_what_json_dumps_makes_of_it(body: dict[str, Any]) -> None:
    expected = json.dumps(body, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    assert _http.encode_body(body) == expected


@pytest.mark.parametrize("value", ["", None, 3])
def test_a_path_segment_is_a_non_empty_string(value: Any) -> None:
    with pytest.raises(runstate.ConfigError, match="id must be a non-empty string"):
        _http.path_segment(value, "id")


def test_base_url_default_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_base_urls(None) == [BASE_URL_DEFAULT] == ["http://localhost:8080"]
    monkeypatch.setenv("RUNSTATE_BASE_URL", "https://api.example.com/")
    assert parse_base_urls(None) == ["https://api.example.com"]
    assert parse_base_urls("http://a:1") == ["http://a:1"]  # the argument wins


def test_base_url_list() -> None:
    assert parse_base_urls(" http://a:1, http://b:2/ ,,http://a:1") == ["http://a:1", "http://b:2"]
    assert parse_base_urls(["http://a:1", "https://b"]) == ["http://a:1", "https://b"]


@pytest.mark.parametrize("bad", ["localhost:8080", "ftp://a", "http://", ","])
def test_base_url_malformed(bad: str) -> None:
    with pytest.raises(runstate.ConfigError):
        parse_base_urls(bad)


def test_client_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTATE_BASE_URL", "http://n1:8080,http://n2:8080")
    monkeypatch.setenv("RUNSTATE_SPACE_ID", "space-1")
    monkeypatch.setenv("RUNSTATE_API_KEY", "secret")
    rs = AsyncRunstate(holder="worker-7")
    assert rs.base_urls == ["http://n1:8080", "http://n2:8080"]
    assert rs.space_id == "space-1"
    assert rs.holder == "worker-7"
    headers = rs._transport.headers()
    assert headers["Authorization"] == "Bearer secret"
    assert headers["X-Runstate-Holder"] == "worker-7"
    assert "secret" not in repr(rs)


def test_client_defaults_omit_headers() -> None:
    rs = AsyncRunstate()
    assert rs.holder == default_holder()
    assert rs.holder.endswith(f":{__import__('os').getpid()}")
    headers = rs._transport.headers()
    assert "Authorization" not in headers
    assert rs.space_id is None  # learned from GET /v1/whoami on the first call


@pytest.mark.parametrize("kwargs", [{"holder": ""}, {"timeout_s": 0}, {"base_url": "nope"}])
def test_client_rejects_bad_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(runstate.ConfigError):
        AsyncRunstate(**kwargs)


# --- deadlines --------------------------------------------------------------------------------


def test_deadline_formats() -> None:
    aware = datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert format_deadline(aware) == "2026-11-29T09:00:00.123Z"
    assert format_deadline(datetime(2026, 11, 29, 9, 0)) == "2026-11-29T09:00:00.000Z"  # naive is UTC
    assert format_deadline("2026-11-29T09:00:00Z") == "2026-11-29T09:00:00.000Z"
    assert format_deadline("2026-11-29T10:00:00.500+01:00") == "2026-11-29T09:00:00.500Z"
    assert format_deadline("2026-11-29T09:00:00") == "2026-11-29T09:00:00.000Z"
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert format_deadline(timedelta(hours=1), now=now) == "2026-01-01T01:00:00.000Z"
    assert format_deadline(None) is None
    assert parse_time("2026-11-29T09:00:00.000Z") == datetime(2026, 11, 29, 9, tzinfo=timezone.utc)


@pytest.mark.parametrize("bad", ["tomorrow", 1700000000, object()])
def test_deadline_rejects(bad: Any) -> None:
    with pytest.raises(runstate.ConfigError):
        format_deadline(bad)


# --- import isolation -------------------------------------------------------------------------


def test_sdk_imports_no_server_package() -> None:
    code = (
        "import sys, runstate, runstate.sdk.sync, runstate.sdk.client\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'runstate_server')\n"
        "assert not bad, bad\n"
        "assert 'pysyncobj' not in sys.modules and 'msgpack' not in sys.modules\n"
        "assert 'aiohttp' not in sys.modules and 'yarl' not in sys.modules\n"  # its own HTTP client: _wire.py
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# --- transport against nothing / a fake server ------------------------------------------------


def test_unavailable_when_nothing_listens() -> None:
    async def main() -> None:
        async with AsyncRunstate(
            base_url=f"http://127.0.0.1:{free_port()},http://127.0.0.1:{free_port()}"
        ) as rs:
            with pytest.raises(runstate.UnavailableError) as caught:
                await rs.mailboxes.ensure("work")
            assert caught.value.status is None
            assert "127.0.0.1" in str(caught.value)

    asyncio.run(main())


def test_unavailable_blocking_client() -> None:
    with runstate.Runstate(base_url=f"http://127.0.0.1:{free_port()}") as rs:
        with pytest.raises(runstate.UnavailableError):
            rs.mailboxes.get("work")


Route = Callable[[web.Request], Awaitable[web.StreamResponse]]


FAKE_SPACE = "fake-space"


async def whoami(request: web.Request) -> web.Response:
    return web.json_response({"space": FAKE_SPACE})


@asynccontextmanager
async def fake_server(routes: dict[tuple[str, str], Route]) -> AsyncIterator[str]:
    """A server with `routes`: paths are given relative to a space (`/v1/mailboxes`) and served
    under it (`/v1/spaces/{spaceId}/mailboxes`); `GET /v1/whoami` names FAKE_SPACE."""
    app = web.Application()
    app.router.add_get("/v1/whoami", whoami)
    for (method, path), handler in routes.items():
        if not path.startswith("/v1/spaces/"):
            path = "/v1/spaces/{spaceId}/" + path.removeprefix("/v1/")
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def test_headers_and_body_reach_the_server() -> None:
    seen: list[tuple[dict[str, str], Any]] = []

    async def ensure(request: web.Request) -> web.Response:
        seen.append((dict(request.headers), await request.json()))
        return web.json_response({"id": "mbx_1", "name": "work", "mode": "WORK"}, status=201)

    async def main() -> None:
        async with fake_server({("POST", "/v1/spaces/sp/mailboxes"): ensure}) as url:
            async with AsyncRunstate(base_url=url, space_id="sp", api_key="k", holder="h1") as rs:
                created = await rs.mailboxes.ensure("work")
                assert created == {"id": "mbx_1", "name": "work", "mode": "WORK", "created": True}

    asyncio.run(main())
    headers, body = seen[0]
    assert headers["Authorization"] == "Bearer k"
    assert headers["X-Runstate-Holder"] == "h1"
    assert body == {"name": "work", "mode": "WORK"}


def test_error_answers_are_mapped() -> None:
    async def scope(request: web.Request) -> web.Response:
        return error(404, "NOT_FOUND", f"no run {request.match_info['id']}")

    async def plain(request: web.Request) -> web.Response:
        return web.Response(status=409, text="not json")

    async def main() -> None:
        async with fake_server(
            {("GET", "/v1/spaces/sp/scopes/{id}"): scope, ("GET", "/v1/spaces/sp/mailboxes"): plain}
        ) as url:
            async with AsyncRunstate(base_url=url, space_id="sp") as rs:
                with pytest.raises(runstate.NotFoundError, match="no run run_x"):
                    await rs.scopes.status("run_x")
                with pytest.raises(runstate.ConflictError, match="not json"):
                    await rs.mailboxes.get("work")

    asyncio.run(main())


def test_failover_on_503_and_dead_node_for_safe_calls() -> None:
    calls: list[str] = []

    async def unavailable(request: web.Request) -> web.Response:
        calls.append("503")
        return error(503, "UNAVAILABLE", "no leader")

    async def ok(request: web.Request) -> web.Response:
        calls.append("ok")
        return web.json_response({"mailboxes": [{"id": "mbx_1", "name": "work", "mode": "WORK"}]})

    async def main() -> None:
        async with fake_server({("GET", "/v1/spaces/sp/mailboxes"): unavailable}) as down:
            async with fake_server({("GET", "/v1/spaces/sp/mailboxes"): ok}) as up:
                dead = f"http://127.0.0.1:{free_port()}"
                async with AsyncRunstate(base_url=[dead, down, up], space_id="sp") as rs:
                    assert (await rs.mailboxes.get("work"))["mode"] == "WORK"
                    # The client stays on the server that answered.
                    assert (await rs.mailboxes.get("work"))["mode"] == "WORK"

    asyncio.run(main())
    assert calls == ["503", "ok", "ok"]


def test_retries_pause_only_once_every_server_failed(caplog: pytest.LogCaptureFixture) -> None:
    """After a leader is killed, the next listed server is tried at once (it may be about to lead,
    or forwards to the next leader); only a round of failures on every server pauses, doubling."""
    answers: dict[str, list[int]] = {"down": [], "first": [], "second": []}

    def failing(name: str, failures: int) -> Route:
        async def handler(request: web.Request) -> web.Response:
            answers[name].append(503 if len(answers[name]) < failures else 200)
            if answers[name][-1] == 503:
                return error(503, "UNAVAILABLE", "no leader")
            return web.json_response({"mailboxes": [{"id": "mbx_1", "name": "work", "mode": "WORK"}]})
        return handler

    def pauses() -> list[str]:
        found = [record.getMessage() for record in caplog.records if "pausing" in record.getMessage()]
        caplog.clear()
        return [message.rsplit("pausing ", 1)[1] for message in found]

    async def main() -> None:
        route = ("GET", "/v1/spaces/sp/mailboxes")
        async with fake_server({route: failing("down", 100)}) as down, \
                fake_server({route: failing("first", 1)}) as first, fake_server({route: failing("second", 2)}) as second:
            dead = f"http://127.0.0.1:{free_port()}"
            async with AsyncRunstate(base_url=[dead, down, first], space_id="sp") as rs:
                await rs.mailboxes.get("work")  # dead, down, first (503), a pause; dead, down, first
                assert pauses() == ["0.05 s"]
            async with AsyncRunstate(base_url=[second], space_id="sp") as rs:
                await rs.mailboxes.get("work")  # one server: each failure is a round of its own
                assert pauses() == ["0.05 s", "0.10 s"]

    with caplog.at_level(logging.DEBUG, logger="runstate.sdk"):
        asyncio.run(main())
    assert answers == {"down": [503, 503], "first": [503, 200], "second": [503, 503, 200]}


def test_every_mutation_carries_one_idempotency_key_across_its_retries() -> None:
    """A mutation retried after a 503 (the server may have applied it) sends the key it was first
    sent with, so the server applies it once; the next call has a key of its own; a GET none."""
    keys: list[str | None] = []

    async def cancel(request: web.Request) -> web.Response:
        keys.append(request.headers.get("Idempotency-Key"))
        if len(keys) == 1:
            return error(503, "UNAVAILABLE", "no leader")
        return web.json_response({"id": "run_1", "state": "CANCELLED"})

    async def status(request: web.Request) -> web.Response:
        keys.append(request.headers.get("Idempotency-Key"))
        return web.json_response({"id": "run_1", "state": "CANCELLED"})

    async def main() -> None:
        routes = {("POST", "/v1/spaces/sp/scopes/{id}/cancel"): cancel, ("GET", "/v1/spaces/sp/scopes/{id}"): status}
        async with fake_server(routes) as url:
            async with AsyncRunstate(base_url=url, space_id="sp") as rs:
                await rs.scope("run_1").cancel()
                await rs.scope("run_1").cancel()
                await rs.scopes.status("run_1")

    asyncio.run(main())
    first, retried, second, read = keys
    assert first is not None and re.fullmatch(r"[0-9a-f]{24}", first)
    assert retried == first and second not in (None, first) and read is None


def test_unsafe_call_is_not_repeated_after_a_503(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    async def create(request: web.Request) -> web.Response:
        calls.append("create")
        return error(503, "UNAVAILABLE", "outcome unknown")

    async def main() -> None:
        async with fake_server({("POST", "/v1/spaces/sp/scopes"): create}) as url:
            async with AsyncRunstate(base_url=url, space_id="sp") as rs:
                with pytest.raises(runstate.UnavailableError):
                    await rs.scopes.create()

    asyncio.run(main())
    assert calls == ["create"]


def test_a_call_the_node_did_not_receive_in_time_is_sent_again_even_if_unsafe() -> None:
    """408 REQUEST_TIMEOUT: the node read only part of the request and applied nothing."""
    calls: list[str] = []

    async def create(request: web.Request) -> web.Response:
        calls.append("create")
        if len(calls) == 1:
            return error(408, "REQUEST_TIMEOUT", "the request body did not arrive within 30 s")
        return web.json_response({"id": "run_1", "state": "ACTIVE"}, status=201)

    async def main() -> None:
        async with fake_server({("POST", "/v1/spaces/sp/scopes"): create}) as url:
            async with AsyncRunstate(base_url=url, space_id="sp") as rs:
                assert (await rs.scopes.create()).id == "run_1"

    asyncio.run(main())
    assert calls == ["create", "create"]


def test_receive_with_a_lost_answer_returns_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(_http, "LONG_POLL_MARGIN_S", 0.2)

    async def receive(request: web.Request) -> web.Response:
        calls.append(await request.json())
        await asyncio.sleep(5)  # longer than waitMs + margin: the client gives up
        return web.Response(status=204)

    async def mailboxes(request: web.Request) -> web.Response:
        return web.json_response({"mailboxes": [{"id": "mbx_1", "name": "work", "mode": "WORK"}]})

    async def main() -> None:
        routes = {("POST", "/v1/spaces/sp/mailboxes/{id}/recv"): receive, ("GET", "/v1/spaces/sp/mailboxes"): mailboxes}
        async with fake_server(routes) as url:
            async with AsyncRunstate(base_url=url, space_id="sp", holder="h1", timeout_s=0.2) as rs:
                assert await rs.scope("run_1").mailbox("work").receive(max=3, lease_ms=500, wait_ms=100) == []

    asyncio.run(main())
    ((body),) = calls
    assert {key: body[key] for key in ("scopeId", "holder", "max", "leaseSeconds", "waitMs")} == {
        "scopeId": "run_1", "holder": "h1", "max": 3, "leaseSeconds": 0.5, "waitMs": 100,
    }
    assert isinstance(body["holderSession"], str) and body["holderSession"]


def test_result_polls_in_slices_until_done() -> None:
    waits: list[str] = []

    async def result(request: web.Request) -> web.Response:
        waits.append(request.query["waitMs"])
        done = len(waits) >= 3
        return web.json_response(
            {
                "id": "tsk_1",
                "state": "SUCCEEDED" if done else "QUEUED",
                "done": done,
                "outcome": 1,
                "error": None,
            }
        )

    async def main() -> None:
        async with fake_server({("GET", "/v1/spaces/sp/tasks/{id}"): result}) as url:
            async with AsyncRunstate(base_url=url, space_id="sp") as rs:
                outcome = await rs.scope("run_1").task("tsk_1").result(timeout_ms=100_000)
                assert (outcome["state"], outcome["outcome"]) == ("SUCCEEDED", 1)

    asyncio.run(main())
    assert len(waits) == 3 and all(0 < int(wait) <= 30_000 for wait in waits)


def test_result_timeout() -> None:
    async def result(request: web.Request) -> web.Response:
        await asyncio.sleep(int(request.query["waitMs"]) / 1000)
        return web.json_response(
            {"id": "tsk_9", "state": "RUNNING", "done": False, "outcome": None, "error": None}
        )

    async def main() -> None:
        async with fake_server({("GET", "/v1/spaces/sp/tasks/{id}"): result}) as url:
            async with AsyncRunstate(base_url=url, space_id="sp") as rs:
                with pytest.raises(runstate.ResultTimeoutError) as caught:
                    await rs.scope("run_1").task("tsk_9").result(timeout_ms=300)
                assert caught.value.task_id == "tsk_9" and caught.value.state == "RUNNING"

    asyncio.run(main())


def test_local_misuse_raises_config_error_before_any_request() -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=f"http://127.0.0.1:{free_port()}", space_id="sp") as rs:
            mailbox = rs.scope("run_1").mailbox("work")
            with pytest.raises(runstate.ConfigError):
                await mailbox.submit({"x": float("nan")})
            with pytest.raises(runstate.ConfigError):
                await mailbox.submit({"x": object()})
            with pytest.raises(runstate.ConfigError):
                await mailbox.receive(max=0)
            with pytest.raises(runstate.ConfigError):
                await mailbox.consume(lambda data, delivery: None, concurrency=0)
            with pytest.raises(runstate.ConfigError):
                rs.scope("")
            with pytest.raises(runstate.ConfigError):
                await rs.scopes.create(deadline="soon")

    asyncio.run(main())


def test_json_dumps_compact_roundtrip() -> None:
    assert json.loads(_http.encode_body({"a": [1, "é"]})) == {"a": [1, "é"]}
