"""The SDK's HTTP/1.1 client: keep-alive connections on asyncio's protocols, and nothing more.

The SDK sends small JSON requests to servers it was given and reads whole JSON answers. A general
client (aiohttp's, which the SDK used) spends most of a call in its own layers: on the test
machine a submit through it cost the calling process 0.31-0.36 ms of CPU; through this module
0.12 ms, and the call's p50 fell from 0.97 to 0.76 ms (a dev node, one call outstanding). This
client does only what the SDK needs:

- Connections: one per request in flight to an origin (scheme, host, port), kept alive and
  reused, the most recently used first. Requests in flight are not capped: a long poll holds its
  connection while it waits, and under a cap the waits could starve the very calls that end them
  (a process waiting on 120 results while it consumes them, with a cap of 100 connections, saw its
  completes wait for a free connection until the waits gave up); each is a call the application
  awaits, so its own concurrency bounds them. At most `idle_max` idle connections are kept per
  origin (the one idle longest is closed to make room). An idle connection that has waited
  IDLE_REUSE_S_MAX is closed instead of reused: a server may have closed it meanwhile (a runstate
  node does after 60 s), and a request sent on a connection the server is closing is lost.
- Answers framed by Content-Length, by chunks, or by the connection's close; 1xx answers are
  skipped. A head past HEAD_BYTES_MAX, a chunk size line past CHUNK_LINE_BYTES_MAX, a body past
  ANSWER_BYTES_MAX or anything that is not HTTP/1.x is refused (AnswerError) and the connection
  closed. An answer that says `Connection: close`, or that ends with the connection, is the
  connection's last; so is one a deadline or a cancellation interrupted.
- Three errors: ConnectError, the request was not sent (no connection: refused, unknown host, a
  handshake cut short, connect timeout), so any server may be tried with it; AnswerError, it was
  sent and may have been applied (the connection closed or the deadline passed before the whole
  answer, or the answer was malformed); HandshakeError, TLS failed for a reason that trying again
  will not change (see `handshake_refusal`), and the server read no request.
- https:// verifies the server's certificate against the system's CAs (`ssl.create_default_context`,
  which also reads SSL_CERT_FILE and SSL_CERT_DIR), or against the pool's `ssl_context` (the
  client's CA file and client certificate: _http.py's `tls_context`).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence

# Bounds on what a server can make the client hold.
HEAD_BYTES_MAX = 64 * 1024  # status line and headers of one answer
CHUNK_LINE_BYTES_MAX = 4096  # one chunk's size line, extensions included
ANSWER_BYTES_MAX = 256 * 1024 * 1024  # one answer's body
# An idle keep-alive connection is reused for this long, then closed at its next use.
IDLE_REUSE_S_MAX = 15.0

_CRLF = b"\r\n"
_HEAD_END = b"\r\n\r\n"
_NO_BODY_STATUSES = frozenset({204, 304})


class WireError(Exception):
    """A request that got no (well-formed) answer."""


class ConnectError(WireError):
    """The request was not sent: no connection to the server could be made."""


class AnswerError(WireError):
    """The request was sent (it may have been applied) but no whole, well-formed answer came."""


class HandshakeError(WireError):
    """TLS with the server failed for good: its certificate does not verify, or it refused the
    handshake (our certificate, or none, or no protocol in common), or it does not speak TLS. The
    server read no request. `reason` says which, in words."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# OpenSSL's reasons (ssl.SSLError.reason) that the server ended the handshake on purpose: an alert
# it sent (TLSV13_ALERT_CERTIFICATE_REQUIRED, SSLV3_ALERT_BAD_CERTIFICATE, TLSV1_ALERT_UNKNOWN_CA,
# SSLV3_ALERT_HANDSHAKE_FAILURE, ...), or an answer that is not TLS at all (a plain HTTP port).
# Anything else (an EOF or a reset mid-handshake: a node restarting, a handshake cap) may pass.
_REFUSAL_REASON_PARTS = ("ALERT", "WRONG_VERSION_NUMBER")


def handshake_refusal(error: BaseException | None) -> HandshakeError | None:
    """The HandshakeError that `error` (raised by a TLS handshake, or a TLS connection's first
    read) stands for, or None when it is not one that trying again would meet again."""
    if isinstance(error, ssl.SSLCertVerificationError):
        return HandshakeError(f"the server's certificate does not verify: {error.verify_message or error.reason or error}")
    if isinstance(error, ssl.SSLError) and not isinstance(error, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)):
        reason = error.reason or ""
        if reason == "WRONG_VERSION_NUMBER":
            return HandshakeError(f"the server does not speak TLS on this port ({reason})")
        if any(part in reason for part in _REFUSAL_REASON_PARTS):
            hint = "" if "CERTIFICATE" not in reason and "UNKNOWN_CA" not in reason else (
                ": it requires a client certificate that its client CA signed (client_cert, client_key)"
            )
            return HandshakeError(f"the server refused the TLS handshake ({reason}){hint}")
    return None


class Answer:
    """One answer: its status, its headers (names in lower case; a repeated one joined by ", "),
    and its whole body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def text(self) -> str:
        """The body as text: the charset the Content-Type names, else UTF-8; bytes that are not
        valid in it become U+FFFD."""
        charset = "utf-8"
        for parameter in self.headers.get("content-type", "").split(";")[1:]:
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "charset" and value.strip():
                charset = value.strip().strip('"')
        try:
            return self.body.decode(charset, "replace")
        except LookupError:  # a charset Python does not know
            return self.body.decode("utf-8", "replace")


class ResponseParser:
    """Reads one answer to a `method` request from the bytes a connection receives, in any pieces.

    `feed(data)` returns the Answer once it is whole (None until then); `feed_eof()` at the
    connection's end returns it if the connection's end was its end. Both raise AnswerError for
    what is not a well-formed HTTP/1.x answer. After the answer, `keep_alive` says whether the
    connection may carry another request (bytes past the answer say it may not)."""

    def __init__(self, method: str) -> None:
        self._head_only = method == "HEAD"
        self._buffer = bytearray()
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body = bytearray()
        self._length: int | None = None  # body bytes still to read (framed by Content-Length)
        self._chunked = False
        self._chunk_left = 0  # bytes of the current chunk still to read
        self._chunk_end_due = False  # the CRLF after a chunk's bytes is still to read
        self._in_trailers = False
        self._until_close = False
        self._head_done = False
        self.keep_alive = False
        self.done = False

    def feed(self, data: bytes) -> Answer | None:
        if self.done:
            self.keep_alive = False  # bytes nobody asked for: the connection is not reused
            return None
        self._buffer += data
        if not self._head_done and not self._read_head():
            return None
        if self._until_close:
            self._take_body(len(self._buffer))
            return None
        if self._chunked:
            return self._read_chunks()
        assert self._length is not None
        self._take_body(min(self._length - len(self._body), len(self._buffer)))
        return self._finish() if len(self._body) == self._length else None

    def feed_eof(self) -> Answer | None:
        if self.done:
            return None
        if self._head_done and self._until_close:
            self.keep_alive = False
            return self._finish()
        raise AnswerError("the server closed the connection before the whole answer")

    # The head.

    def _read_head(self) -> bool:
        """Parse the head once all of it is buffered (skipping 1xx answers); False until then."""
        while True:
            end = self._buffer.find(_HEAD_END)
            if end < 0:
                if len(self._buffer) > HEAD_BYTES_MAX:
                    raise AnswerError(f"the answer's head is longer than {HEAD_BYTES_MAX} bytes")
                return False
            if end > HEAD_BYTES_MAX:
                raise AnswerError(f"the answer's head is longer than {HEAD_BYTES_MAX} bytes")
            head = bytes(self._buffer[:end])
            del self._buffer[:end + len(_HEAD_END)]
            status, http_10, headers = _parse_head(head)
            if 100 <= status < 200:
                if status == 101:
                    raise AnswerError("the server switched protocols, which the client never asks for")
                continue  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            self._status, self._headers = status, headers
            self._head_done = True
            connection = {token.strip().lower() for token in headers.get("connection", "").split(",")}
            self.keep_alive = "keep-alive" in connection if http_10 else "close" not in connection
            self._frame_body()
            return True

    def _frame_body(self) -> None:
        headers = self._headers
        if self._head_only or self._status in _NO_BODY_STATUSES:
            self._length = 0
            return
        coding = headers.get("transfer-encoding")
        if coding is not None:
            if coding.split(",")[-1].strip().lower() == "chunked":
                self._chunked = True
            else:
                self._until_close = True
                self.keep_alive = False
            return
        length = headers.get("content-length")
        if length is None:
            self._until_close = True
            self.keep_alive = False
            return
        values = {value.strip() for value in length.split(",")}
        value = values.pop()
        if values or not value.isdigit() or not value.isascii():
            raise AnswerError(f"the answer's Content-Length is not a length: {length[:100]!r}")
        if int(value) > ANSWER_BYTES_MAX:
            raise AnswerError(f"the answer's body ({value} bytes) is longer than {ANSWER_BYTES_MAX} bytes")
        self._length = int(value)

    # The body.

    def _take_body(self, count: int) -> None:
        if len(self._body) + count > ANSWER_BYTES_MAX:
            raise AnswerError(f"the answer's body is longer than {ANSWER_BYTES_MAX} bytes")
        self._body += self._buffer[:count]
        del self._buffer[:count]

    def _read_chunks(self) -> Answer | None:
        buffer = self._buffer
        while True:
            if self._in_trailers:
                end = buffer.find(_CRLF)
                if end < 0:
                    if len(buffer) > HEAD_BYTES_MAX:
                        raise AnswerError(f"the answer's trailers are longer than {HEAD_BYTES_MAX} bytes")
                    return None
                del buffer[:end + 2]
                if end == 0:
                    return self._finish()
                continue
            if self._chunk_left > 0:
                take = min(len(buffer), self._chunk_left)
                self._take_body(take)
                self._chunk_left -= take
                if self._chunk_left:
                    return None
                self._chunk_end_due = True
            if self._chunk_end_due:
                if len(buffer) < len(_CRLF):
                    return None
                if buffer[:2] != _CRLF:
                    raise AnswerError("a chunk of the answer does not end with CRLF")
                del buffer[:2]
                self._chunk_end_due = False
                continue
            end = buffer.find(_CRLF)
            if end < 0:
                if len(buffer) > CHUNK_LINE_BYTES_MAX:
                    raise AnswerError(f"a chunk size line of the answer is longer than {CHUNK_LINE_BYTES_MAX} bytes")
                return None
            if end > CHUNK_LINE_BYTES_MAX:
                raise AnswerError(f"a chunk size line of the answer is longer than {CHUNK_LINE_BYTES_MAX} bytes")
            size_text = bytes(buffer[:end]).split(b";", 1)[0].strip()
            del buffer[:end + 2]
            try:
                size = int(size_text, 16) if size_text and size_text.isalnum() else -1
            except ValueError:
                size = -1
            if size < 0:
                raise AnswerError(f"a chunk size of the answer is not a hex number: {size_text[:40]!r}")
            if size == 0:
                self._in_trailers = True
            elif len(self._body) + size > ANSWER_BYTES_MAX:
                raise AnswerError(f"the answer's body is longer than {ANSWER_BYTES_MAX} bytes")
            else:
                self._chunk_left = size

    def _finish(self) -> Answer:
        self.done = True
        if self._buffer:
            self.keep_alive = False  # the server sent more than the answer
        return Answer(self._status, self._headers, bytes(self._body))


def _parse_head(head: bytes) -> tuple[int, bool, dict[str, str]]:
    """(status, whether it is HTTP/1.0, headers) of an answer's head, without its final CRLFs."""
    lines = head.split(_CRLF)
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise AnswerError(f"not an HTTP/1.x answer: {lines[0][:100]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip() or name.startswith((b" ", b"\t")):
            raise AnswerError(f"a header line of the answer is malformed: {line[:100]!r}")
        key = name.decode("latin-1").lower()
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return int(parts[1]), parts[0] == b"HTTP/1.0", headers


Origin = tuple[str, str, int]  # (scheme, host, port)


class _Connection(asyncio.Protocol):
    """One connection to an origin: at most one request at a time."""

    def __init__(self, pool: ConnectionPool, origin: Origin) -> None:
        self._pool = pool
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.idle_since = 0.0
        self.closed = False
        self.answered = False  # an answer came on it (a TLS refusal can come only before one)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        parser = self.parser
        if parser is None:  # bytes while no request is in flight: never reuse it
            self.close()
            return
        try:
            answer = parser.feed(data)
        except AnswerError as error:
            self._fail(error)
            return
        if answer is not None:
            self._answer(answer)

    def eof_received(self) -> bool:
        parser = self.parser
        if parser is not None:
            try:
                answer = parser.feed_eof()
            except AnswerError as error:
                self._fail(error)
                return False
            if answer is not None:
                self._answer(answer)
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        # With TLS 1.3 the client's side of the handshake ends before the server checks the
        # client's certificate: its refusal comes as the first read of the connection.
        refusal = handshake_refusal(exc) if not self.answered else None
        if refusal is not None:
            self._fail(refusal)
            return
        detail = f": {exc}" if exc is not None else ""
        self._fail(AnswerError(f"the connection closed before the whole answer{detail}"))

    def _answer(self, answer: Answer) -> None:
        self.answered = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    def _fail(self, error: WireError) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
            self.close()

    def deadline_passed(self, timeout_s: float) -> None:
        self._fail(AnswerError(f"no whole answer within {timeout_s:g} s"))

    def close(self) -> None:
        """Drop the connection (an abort: nothing it may still have to send matters)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class ConnectionPool:
    """Keep-alive connections to any number of origins, at most `idle_max` of them idle per origin,
    all on the event loop of the first request (a request from another loop starts the pool afresh
    there)."""

    def __init__(self, *, idle_max: int, connect_timeout_s: float, ssl_context: ssl.SSLContext | None = None) -> None:
        if idle_max < 0:
            raise ValueError(f"idle_max must be at least 0, got {idle_max}")
        self.idle_max = idle_max
        self.connect_timeout_s = connect_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: dict[Origin, list[_Connection]] = {}
        self._open: set[_Connection] = set()
        # https:// connections' context: the one given, else the system's CAs (made at first use).
        self._ssl: ssl.SSLContext | None = ssl_context
        self._closed = False

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def request(self, origin: Origin, head: bytes, body: bytes | None, method: str, timeout_s: float) -> Answer:
        """Send one request (`head`: its request line and headers, up to and with the blank
        line; `body`, if any, after it) to `origin` and read its whole answer within `timeout_s`."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._start_on(loop)
        deadline = loop.time() + timeout_s
        connection = self._take_idle(origin, loop.time())
        if connection is None:
            connection = await self._connect(loop, origin, deadline)
        return await self._exchange(loop, connection, head, body, method, deadline, timeout_s)

    def close(self) -> None:
        """Close every connection; a request in flight keeps its own until it ends."""
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    def forget(self, connection: _Connection) -> None:
        """`connection` closed: it neither counts nor waits to be reused any longer."""
        self._open.discard(connection)
        idle = self._idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)

    def _start_on(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._closed:
            raise RuntimeError("the connection pool is closed")
        for connection in list(self._open):
            try:
                connection.close()
            except RuntimeError:  # its loop is closed: its socket went with it
                pass
        self._open.clear()
        self._idle.clear()
        self._loop = loop

    def _take_idle(self, origin: Origin, now: float) -> _Connection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.closed or connection.transport is None or connection.transport.is_closing():
                continue  # the server ended it (its end is being handled): a request on it would be lost
            if now - connection.idle_since > IDLE_REUSE_S_MAX:
                connection.close()
                continue
            return connection
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, origin: Origin, deadline: float) -> _Connection:
        scheme, host, port = origin
        context: ssl.SSLContext | None = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        timeout_s = min(self.connect_timeout_s, max(0.0, deadline - loop.time()))
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self, origin), host, port, ssl=context,
                    server_hostname=host if context is not None else None,
                ),
                timeout_s,
            )
        except asyncio.TimeoutError:
            raise ConnectError(f"cannot connect to {host}:{port} within {timeout_s:g} s") from None
        except (OSError, ssl.SSLError, ssl.CertificateError) as error:
            refusal = handshake_refusal(error)
            if refusal is not None:
                raise refusal from error
            raise ConnectError(f"cannot connect to {host}:{port}: {error}") from error
        self._open.add(connection)
        return connection

    async def _exchange(
        self, loop: asyncio.AbstractEventLoop, connection: _Connection, head: bytes, body: bytes | None,
        method: str, deadline: float, timeout_s: float,
    ) -> Answer:
        transport = connection.transport
        if connection.closed or transport is None or transport.is_closing():
            raise AnswerError("the connection closed before the request was sent")
        parser = ResponseParser(method)
        connection.parser = parser
        waiter: asyncio.Future[Answer] = loop.create_future()
        connection.waiter = waiter
        transport.write(head + body if body else head)
        timer = loop.call_at(deadline, connection.deadline_passed, timeout_s)
        try:
            answer = await waiter
        except BaseException:  # a deadline, a cancellation, a lost connection: the connection's state is unknown
            connection.close()
            raise
        finally:
            timer.cancel()
            connection.parser = None
            connection.waiter = None
        if parser.keep_alive and not self._closed and not connection.closed and not transport.is_closing():
            connection.idle_since = loop.time()
            idle = self._idle.setdefault(connection.origin, [])
            idle.append(connection)
            if len(idle) > self.idle_max:
                oldest = idle.pop(0)  # the one idle longest (the list is in the order they came back)
                self._open.discard(oldest)
                oldest.close()
        else:
            connection.close()
        return answer


def request_head(method: str, target: str, host_header: str, headers: Sequence[tuple[str, str]], body_bytes: int | None) -> bytes:
    """The request line and headers of a request, with Host and (for a body) Content-Length."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}"]
    lines.extend(f"{name}: {value}" for name, value in headers)
    if body_bytes is not None:
        lines.append(f"Content-Length: {body_bytes}")
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8")
