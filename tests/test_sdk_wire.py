"""The SDK's HTTP/1.1 client (runstate/sdk/_wire.py): its answer parser on any split of the bytes,
and its connection pool against real servers on 127.0.0.1 that answer as scripted here."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import runstate
from hypothesis import given, settings
from hypothesis import strategies as st
from runstate import AsyncRunstate
from runstate.sdk import _wire
from runstate.sdk._wire import (
    Answer,
    AnswerError,
    ConnectError,
    ConnectionPool,
    HandshakeError,
    ResponseParser,
    handshake_refusal,
    request_head,
)

# --- the answer parser --------------------------------------------------------------------------


def parse(data: bytes, method: str = "POST", pieces: list[int] | None = None, eof: bool = False) -> tuple[Answer | None, ResponseParser]:
    """Feed `data` in pieces of the given sizes (the rest in one), then the connection's end if `eof`."""
    parser = ResponseParser(method)
    answer: Answer | None = None
    position = 0
    for size in [*(pieces or []), len(data)]:
        piece = data[position:position + size]
        position += len(piece)
        if piece:
            answer = parser.feed(piece) or answer
    if eof:
        answer = parser.feed_eof() or answer
    return answer, parser


def chunked(body: bytes, sizes: list[int]) -> bytes:
    out, position = b"", 0
    for size in [*sizes, len(body)]:
        piece = body[position:position + max(1, size)]
        if not piece:
            break
        position += len(piece)
        out += b"%x;ext=1\r\n%s\r\n" % (len(piece), piece)
    return out + b"0\r\nTrailer-One: x\r\n\r\n"


def answer_bytes(
    status: int, headers: dict[str, str], body: bytes, framing: str, chunk_sizes: list[int], interim: bool,
) -> bytes:
    """An answer framed by Content-Length, by chunks or by the connection's close, with an interim
    100 Continue before it if `interim`."""
    head = b"HTTP/1.1 100 Continue\r\n\r\n" if interim else b""
    head += b"HTTP/1.1 %d Whatever It Says\r\n" % status
    head += b"".join(f"{name}: {value}\r\n".encode() for name, value in headers.items())
    if framing == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    if framing == "chunked":
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body, chunk_sizes)
    return head + b"\r\n" + body


# Any answer an HTTP/1.1 server may send, as answer_bytes' arguments (a parser test's @given).
any_answer = {
    "status": st.integers(200, 599).filter(lambda status: status not in (204, 304)),
    "headers": st.dictionaries(
        st.from_regex(r"X-[A-Za-z][A-Za-z0-9-]{0,12}", fullmatch=True),  # names
        st.from_regex(r"[ -~]{0,30}", fullmatch=True).map(str.strip),  # values
        max_size=4,
    ),
    "body": st.binary(max_size=3000),
    "framing": st.sampled_from(["length", "chunked", "close"]),
    "chunk_sizes": st.lists(st.integers(1, 700), max_size=8),
    "pieces": st.lists(st.integers(1, 400) | st.integers(1, 3), max_size=40),
    "interim": st.booleans(),
}


@settings(max_examples=300, deadline=None)
@given(**any_answer)
def test_an_answer_reads_the_same_whatever_pieces_its_bytes_arrive_in(
    status: int, headers: dict[str, str], body: bytes, framing: str, chunk_sizes: list[int], pieces: list[int],
    interim: bool,
) -> None:
    data = answer_bytes(status, headers, body, framing, chunk_sizes, interim)
    answer, parser = parse(data, pieces=pieces, eof=framing == "close")
    assert answer is not None
    assert (answer.status, answer.body) == (status, body)
    assert {name: answer.headers[name.lower()] for name in headers} == headers
    assert parser.keep_alive is (framing != "close")


def test_no_body_for_head_204_and_304_and_keep_alive_by_version() -> None:
    for method, status in (("HEAD", 200), ("GET", 204), ("GET", 304)):
        answer, parser = parse(b"HTTP/1.1 %d X\r\nContent-Length: 12\r\n\r\n" % status, method)
        assert answer is not None and answer.body == b"" and parser.keep_alive
    _, parser = parse(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
    assert not parser.keep_alive
    _, parser = parse(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
    assert not parser.keep_alive
    _, parser = parse(b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 2\r\n\r\nok")
    assert parser.keep_alive
    answer, parser = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA")
    assert answer is not None and answer.body == b"ok" and not parser.keep_alive  # bytes nobody asked for


@pytest.mark.parametrize("data", [
    b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
    b"HTTP/2 200\r\n\r\n",
    b"HTTP/1.1 2000 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n folded: header\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nName : value\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: \xd9\xa1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokNO",
    b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
])
def test_what_is_not_a_well_formed_answer_is_refused(data: bytes) -> None:
    with pytest.raises(AnswerError):
        parse(data)


def test_the_bounds_on_an_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(AnswerError, match="head is longer"):
        parse(b"HTTP/1.1 200 OK\r\n" + b"X-A: " + b"a" * _wire.HEAD_BYTES_MAX)
    with pytest.raises(AnswerError, match="chunk size line"):
        parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1;" + b"x" * _wire.CHUNK_LINE_BYTES_MAX)
    monkeypatch.setattr(_wire, "ANSWER_BYTES_MAX", 10)
    with pytest.raises(AnswerError, match="body"):
        parse(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\n")
    with pytest.raises(AnswerError, match="body"):
        parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\n123456\r\n6\r\n")
    with pytest.raises(AnswerError, match="body"):
        parse(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 11)
    with pytest.raises(AnswerError, match="closed the connection"):
        parse(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc", eof=True)


def test_text_follows_the_charset_and_never_raises() -> None:
    assert Answer(200, {"content-type": "text/plain; charset=latin-1"}, "é".encode("latin-1")).text() == "é"
    assert Answer(200, {"content-type": "application/json"}, b"\xff{}").text() == "\ufffd{}"
    assert Answer(200, {"content-type": "text/plain; charset=no-such"}, b"ok").text() == "ok"


def test_a_request_head() -> None:
    assert request_head("POST", "/v1/x?a=1", "h:81", [("X-A", "é")], 2) == (
        "POST /v1/x?a=1 HTTP/1.1\r\nHost: h:81\r\nX-A: é\r\nContent-Length: 2\r\n\r\n".encode()
    )
    assert request_head("GET", "/", "h", [], None) == b"GET / HTTP/1.1\r\nHost: h\r\n\r\n"


# --- the pool, against scripted servers -----------------------------------------------------------

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    def __init__(self) -> None:
        self.connections = 0  # accepted so far
        self.open = 0  # open now
        self.open_max = 0
        self.port = 0


@asynccontextmanager
async def scripted(script: Script, context: ssl.SSLContext | None = None) -> AsyncIterator[Server]:
    server = Server()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        server.open += 1
        server.open_max = max(server.open_max, server.open)
        try:
            await script(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            server.open -= 1
            writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()
        await asyncio.wait_for(listener.wait_closed(), 5)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            await reader.readexactly(int(line.split(b":")[1]))
    return head


def ok(body: bytes = b"{}", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (extra, len(body), body)


def answering(delay_s: float = 0.0) -> Script:
    """A server that answers every request on a connection, each `delay_s` after it arrived."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            if delay_s:
                await asyncio.sleep(delay_s)
            writer.write(ok())
            await writer.drain()

    return script


keep_answering = answering()


def holding_until(calls: int, timeout_s: float = 10.0) -> Script:
    """A server that answers no request before `calls` requests have arrived (as long polls wait
    for what other calls bring), then every one at once, and each later one as it comes."""
    arrived = 0
    all_arrived = asyncio.Event()

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal arrived
        while True:
            await read_request(reader)
            arrived += 1
            if arrived == calls:
                all_arrived.set()
            await asyncio.wait_for(all_arrived.wait(), timeout_s)
            writer.write(ok())
            await writer.drain()

    return script


def call(pool: ConnectionPool, port: int, timeout_s: float = 5.0, scheme: str = "http") -> Awaitable[Answer]:
    head = request_head("POST", "/v1/x", f"127.0.0.1:{port}", [], 2)
    return pool.request((scheme, "127.0.0.1", port), head, b"{}", "POST", timeout_s)


def pool_of(idle_max: int = 10) -> ConnectionPool:
    return ConnectionPool(idle_max=idle_max, connect_timeout_s=2.0)


def test_one_connection_carries_request_after_request() -> None:
    async def main() -> None:
        async with scripted(keep_answering) as server:
            pool = pool_of()
            for _ in range(5):
                assert (await call(pool, server.port)).body == b"{}"
            assert server.connections == 1 and pool.open_connections == 1
            pool.close()

    asyncio.run(main())


async def answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(ok())  # keep-alive by its headers, closed right after
    await writer.drain()


async def close_header(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(ok(extra=b"Connection: close\r\n"))
    await writer.drain()
    await asyncio.sleep(1)  # the client closes it, not the server


# Servers that end each connection after one answer: by closing it, or by saying so.
ENDING_ONE_ANSWER_IN = (answer_then_close, close_header)


def test_a_connection_the_server_ends_is_not_reused() -> None:
    async def main() -> None:
        for script in ENDING_ONE_ANSWER_IN:
            async with scripted(script) as server:
                pool = pool_of()
                for _ in range(3):
                    assert (await call(pool, server.port)).status == 200
                    await asyncio.sleep(0.05)  # the server's close arrives
                assert server.connections == 3
                pool.close()

    asyncio.run(main())


def test_a_connection_idle_too_long_is_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_wire, "IDLE_REUSE_S_MAX", 0.0)

    async def main() -> None:
        async with scripted(keep_answering) as server:
            pool = pool_of()
            for _ in range(3):
                await call(pool, server.port)
                await asyncio.sleep(0.01)
            assert server.connections == 3 and pool.open_connections == 1
            pool.close()

    asyncio.run(main())


def test_no_answer_within_the_deadline_or_a_cancelled_call_drops_the_connection() -> None:
    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()  # until the client closes

    async def main() -> None:
        async with scripted(never_answer) as server:
            pool = pool_of()
            with pytest.raises(AnswerError, match="within 0.2 s"):
                await call(pool, server.port, timeout_s=0.2)
            task = asyncio.ensure_future(call(pool, server.port))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.1)
            assert pool.open_connections == 0 and server.open == 0 and server.connections == 2

    asyncio.run(main())


def test_a_half_answer_then_a_close_is_an_answer_error() -> None:
    async def half(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b'{"a": 1}')[:-3])

    async def main() -> None:
        async with scripted(half) as server:
            with pytest.raises(AnswerError, match="closed"):
                await call(pool_of(), server.port)

    asyncio.run(main())


def test_nothing_listening_is_a_connect_error() -> None:
    async def main() -> None:
        async with scripted(keep_answering) as server:
            port = server.port
        with pytest.raises(ConnectError):
            await call(pool_of(), port)

    asyncio.run(main())


def test_calls_in_flight_are_not_capped_and_at_most_idle_max_stay_idle() -> None:
    """150 calls the server holds until the last one arrives (as long polls wait for what other
    calls bring) are all answered; afterwards only `idle_max` connections stay open, and the next
    calls reuse them."""
    calls = 150

    async def main() -> None:
        async with scripted(holding_until(calls)) as server:
            pool = pool_of(idle_max=4)
            answers = await asyncio.gather(*(call(pool, server.port) for _ in range(calls)))
            assert [answer.status for answer in answers] == [200] * calls
            assert server.open_max == calls
            await asyncio.sleep(0.1)  # the closed ones' ends arrive
            assert pool.open_connections == 4 and server.open == 4
            for _ in range(3):
                await call(pool, server.port)
            assert server.connections == calls
            pool.close()

    asyncio.run(main())


def test_an_answer_in_one_byte_pieces_and_chunks() -> None:
    async def trickle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(b'{"n": 12345}', [3, 1, 4])
            for index in range(len(data)):
                writer.write(data[index:index + 1])
                await writer.drain()
                await asyncio.sleep(0)

    async def main() -> None:
        async with scripted(trickle) as server:
            pool = pool_of()
            for _ in range(2):
                assert (await call(pool, server.port)).body == b'{"n": 12345}'
            assert server.connections == 1
            pool.close()

    asyncio.run(main())


def self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "runstate test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return cert_path, key_path


def test_https_verifies_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert_path, key_path = self_signed(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)

    async def main() -> None:
        async with scripted(keep_answering, context) as server:
            with pytest.raises(HandshakeError, match="certificate does not verify"):
                await call(pool_of(), server.port, scheme="https")  # a certificate nobody vouched for
            monkeypatch.setenv("SSL_CERT_FILE", str(cert_path))  # now trusted (OpenSSL reads it)
            pool = pool_of()
            assert (await call(pool, server.port, scheme="https")).status == 200
            pool.close()

    asyncio.run(main())


# --- through the SDK ------------------------------------------------------------------------------


def test_the_sdk_sends_what_it_means_to() -> None:
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await read_request(reader))
            writer.write(ok(b'{"id": "run_1", "state": "ACTIVE"}'))
            await writer.drain()

    async def main() -> None:
        async with scripted(record) as server:
            base = f"http://127.0.0.1:{server.port}/prefix/"
            async with AsyncRunstate(base_url=base, space_id="s p", holder="wörker", api_key="k") as rs:
                await rs.scopes.create()

    asyncio.run(main())
    (head,) = seen
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /prefix/v1/spaces/s%20p/scopes HTTP/1.1"
    headers = dict(line.split(": ", 1) for line in lines[1:] if line)
    assert headers["Host"].startswith("127.0.0.1:") and headers["X-Runstate-Holder"] == "wörker"
    assert headers["Authorization"] == "Bearer k" and headers["Content-Type"] == "application/json"
    assert headers["User-Agent"] == f"runstate-sdk-python/{runstate.__version__}"
    assert len(headers["Idempotency-Key"]) == 24 and int(headers["Content-Length"]) > 0


@pytest.mark.parametrize("kwargs", [
    {"holder": "a\r\nX-Evil: 1"}, {"api_key": "k\nX-Evil: 1"}, {"base_url": "http://h:1/a b"},
    {"base_url": "http://h:1/?q=1"}, {"base_url": "http://h:99999"},
])
def test_what_would_break_a_request_line_or_header_is_refused(kwargs: dict[str, Any]) -> None:
    with pytest.raises(runstate.ConfigError):
        AsyncRunstate(**kwargs)


def test_a_target_and_a_host_are_sent_as_http_wants_them() -> None:
    from runstate.sdk._http import _endpoint, _target

    assert _target("/v1/spaces/a%2Fb/x") == "/v1/spaces/a%2Fb/x"  # percent-encoded already: as it is
    assert _target("/v1/é x") == "/v1/%C3%A9%20x"
    assert _endpoint("http://exämple.com:81/pré") == (("http", "xn--exmple-cua.com", 81), "xn--exmple-cua.com:81", "/pr%C3%A9")
    assert _endpoint("https://[::1]/") == (("https", "::1", 443), "[::1]", "")
    assert _endpoint("http://h:80") == (("http", "h", 80), "h", "")


def test_only_a_tls_failure_a_retry_would_meet_again_is_a_handshake_error() -> None:
    def ssl_error(cls: type[ssl.SSLError], reason: str | None) -> ssl.SSLError:
        error = cls(1, f"[SSL: {reason}] failed")
        error.reason = reason  # as OpenSSL's errors carry it
        return error

    for reason, says in (
        ("TLSV13_ALERT_CERTIFICATE_REQUIRED", "refused the TLS handshake"),
        ("TLSV1_ALERT_UNKNOWN_CA", "refused the TLS handshake"),
        ("SSLV3_ALERT_HANDSHAKE_FAILURE", "refused the TLS handshake"),
        ("WRONG_VERSION_NUMBER", "does not speak TLS"),
    ):
        refusal = handshake_refusal(ssl_error(ssl.SSLError, reason))
        assert refusal is not None and says in refusal.reason and reason in refusal.reason
    # A handshake cut short (a node restarting, the node's handshake cap) may pass: retried.
    for error in (
        ssl_error(ssl.SSLEOFError, "UNEXPECTED_EOF_WHILE_READING"), ssl_error(ssl.SSLError, "DECRYPTION_FAILED"),
        ConnectionResetError(), None,
    ):
        assert handshake_refusal(error) is None
