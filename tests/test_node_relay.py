"""A follower's client to the leader's API (runstate_server/node/relay.py): its answer reading on
any split of the bytes, and its connections against real servers on 127.0.0.1 that answer as
scripted here (tests/test_cluster_routing.py forwards through real followers)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from hypothesis import given, settings

from runstate_server.node import relay
from runstate_server.node.relay import Answer, AnswerError, ConnectError, Origin, RelayClient, request_head
from tests._nodes import free_port
from tests.test_sdk_wire import (
    ENDING_ONE_ANSWER_IN,
    answer_bytes,
    answering,
    any_answer,
    chunked,
    holding_until,
    ok,
    scripted,
)

# --- reading an answer, fed in pieces to one connection ------------------------------------------


class Pipe(asyncio.Transport):
    """The transport under a connection whose answer bytes the test feeds itself."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def read(data: bytes, pieces: list[int], *, eof: bool = False, head_request: bool = False) -> tuple[Answer | BaseException, bool]:
    """The answer (or error) a connection reads from `data` fed in pieces of those sizes (the rest
    in one), then the connection's end if `eof`; and whether it stays open for the next call."""

    async def main() -> tuple[Answer | BaseException, bool]:
        connection = relay._Connection(Origin(False, "127.0.0.1", 1), relay._Pool(1))
        pipe = Pipe()
        connection.connection_made(pipe)
        exchange = asyncio.ensure_future(connection.exchange(b"GET / HTTP/1.1\r\n\r\n", head_request, 5.0))
        await asyncio.sleep(0)
        position = 0
        for size in [*pieces, len(data)]:
            piece = data[position:position + size]
            position += len(piece)
            if piece and not exchange.done():
                connection.data_received(piece)
        if eof and not exchange.done():
            connection.eof_received()
            connection.connection_lost(None)
        try:
            return await asyncio.wait_for(exchange, 1.0), not pipe.closed
        except (AnswerError, asyncio.TimeoutError) as error:
            return error, not pipe.closed

    return asyncio.run(main())


@settings(max_examples=300, deadline=None)
@given(**any_answer)
def test_an_answer_reads_the_same_whatever_pieces_its_bytes_arrive_in(
    status: int, headers: dict[str, str], body: bytes, framing: str, chunk_sizes: list[int], pieces: list[int],
    interim: bool,
) -> None:
    data = answer_bytes(status, headers, body, framing, chunk_sizes, interim)
    answer, reusable = read(data, pieces, eof=framing == "close")
    assert isinstance(answer, Answer), answer
    assert (answer.status, answer.body) == (status, body)
    for name, value in headers.items():
        assert answer.headers[name.lower()] == value
    assert reusable == (framing != "close")


def test_no_body_for_a_head_a_204_and_a_304_and_connection_close_ends_the_connection() -> None:
    answer, reusable = read(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n", [], head_request=True)
    assert isinstance(answer, Answer) and answer.body == b"" and reusable
    for status in (204, 304):
        answer, reusable = read(b"HTTP/1.1 %d X\r\n\r\n" % status, [])
        assert isinstance(answer, Answer) and (answer.status, answer.body, reusable) == (status, b"", True)
    answer, reusable = read(ok(b"[1]", b"Connection: close\r\n"), [3])
    assert isinstance(answer, Answer) and answer.body == b"[1]" and not reusable
    # Bytes past the answer: the connection cannot be trusted with another call.
    answer, reusable = read(ok() + b"HTTP/1.1 200", [])
    assert isinstance(answer, Answer) and not reusable


@pytest.mark.parametrize("data", [
    b"SMTP ready\r\n\r\n",
    b"HTTP/2 200\r\n\r\n",
    b"HTTP/1.1 2x0 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
])
def test_what_is_not_a_well_formed_answer_is_refused_and_ends_the_connection(data: bytes) -> None:
    answer, reusable = read(data, [])
    assert isinstance(answer, AnswerError) and not reusable


def test_the_bounds_on_an_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay, "HEAD_BYTES_MAX", 100)
    monkeypatch.setattr(relay, "CHUNK_LINE_BYTES_MAX", 10)
    monkeypatch.setattr(relay, "ANSWER_BYTES_MAX", 50)
    answer, _ = read(b"HTTP/1.1 200 OK\r\nX: " + b"y" * 200, [])
    assert isinstance(answer, AnswerError) and "head" in str(answer)
    answer, _ = read(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"0" * 20, [])
    assert isinstance(answer, AnswerError) and "chunk size line" in str(answer)
    for data in (ok(b"x" * 51), b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 51, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b"x" * 51, [30])):
        answer, _ = read(data, [7])
        assert isinstance(answer, AnswerError) and "over 50 bytes" in str(answer)
    answer, _ = read(ok(b"x" * 50), [7])
    assert isinstance(answer, Answer)


def test_a_half_answer_then_the_connections_end_is_an_answer_error() -> None:
    answer, reusable = read(ok(b"0123456789")[:-4], [], eof=True)
    assert isinstance(answer, AnswerError) and "before the whole answer" in str(answer) and not reusable


def test_a_request_head_is_the_bytes_the_follower_read() -> None:
    head = request_head("POST", "/v1/spaces/caf%C3%A9/tasks?x=1", "127.0.0.1:8080", {"X-Name": "caf\udcc3\udca9"}, 2)
    assert head == (
        b"POST /v1/spaces/caf%C3%A9/tasks?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Length: 2\r\n"
        b"X-Name: caf\xc3\xa9\r\n\r\n"
    )
    assert relay.origin_of("https://[::1]:9000/prefix/") == (Origin(True, "::1", 9000), "/prefix")
    assert relay.origin_of("http://node-2") == (Origin(False, "node-2", 80), "")
    with pytest.raises(ValueError):
        relay.origin_of("ftp://node-2")


# --- connections, against real servers -----------------------------------------------------------


def client(idle_max: int = 10, idle_reuse_s: float = 10.0) -> RelayClient:
    return RelayClient(idle_max=idle_max, idle_reuse_s=idle_reuse_s, connect_timeout_s=2.0)


def call(client: RelayClient, port: int, timeout_s: float = 5.0) -> Any:
    head = request_head("POST", "/v1/x", f"127.0.0.1:{port}", {}, 2)
    return client.request(Origin(False, "127.0.0.1", port), head + b"{}", head_request=False, timeout_s=timeout_s)


def test_one_connection_carries_call_after_call_and_an_ended_one_is_not_reused() -> None:
    async def main() -> None:
        async with scripted(answering()) as server:
            relay_client = client()
            for _ in range(5):
                assert (await call(relay_client, server.port)).body == b"{}"
            assert server.connections == 1 and relay_client.open_connections == 1
            relay_client.close()
        for script in ENDING_ONE_ANSWER_IN:
            async with scripted(script) as server:
                relay_client = client()
                for _ in range(3):
                    assert (await call(relay_client, server.port)).status == 200
                    await asyncio.sleep(0.05)  # the server's close arrives
                assert server.connections == 3
                relay_client.close()

    asyncio.run(main())


def test_a_connection_idle_too_long_is_not_reused() -> None:
    async def main() -> None:
        async with scripted(answering()) as server:
            relay_client = client(idle_reuse_s=0.2)
            await call(relay_client, server.port)
            await call(relay_client, server.port)
            assert server.connections == 1
            await asyncio.sleep(0.3)
            await call(relay_client, server.port)
            assert server.connections == 2
            relay_client.close()

    asyncio.run(main())


def test_no_answer_within_the_deadline_or_a_cancelled_call_drops_the_connection() -> None:
    async def main() -> None:
        async with scripted(answering(delay_s=0.5)) as server:
            relay_client = client()
            started = time.monotonic()
            with pytest.raises(AnswerError, match="no whole answer within"):
                await call(relay_client, server.port, timeout_s=0.1)
            assert time.monotonic() - started < 0.45
            pending = asyncio.ensure_future(call(relay_client, server.port))
            await asyncio.sleep(0.1)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
            await asyncio.sleep(0.05)
            assert relay_client.open_connections == 0
            assert (await call(relay_client, server.port)).status == 200  # on a new connection
            assert server.connections == 3
            relay_client.close()

    asyncio.run(main())


def test_nothing_listening_is_a_connect_error() -> None:
    async def main() -> None:
        with pytest.raises(ConnectError, match="cannot connect"):
            await call(client(), free_port())

    asyncio.run(main())


def test_calls_in_flight_are_not_capped_and_at_most_idle_max_stay_idle() -> None:
    calls = 30

    async def main() -> None:
        async with scripted(holding_until(calls)) as server:
            relay_client = client(idle_max=4)
            answers = await asyncio.gather(*(call(relay_client, server.port) for _ in range(calls)))
            assert [answer.status for answer in answers] == [200] * calls
            assert server.open_max == calls
            await asyncio.sleep(0.05)
            assert relay_client.open_connections == 4  # the rest were closed, not kept
            await asyncio.gather(*(call(relay_client, server.port) for _ in range(4)))
            assert server.connections == calls  # the 4 kept were reused
            relay_client.close()

    asyncio.run(main())
