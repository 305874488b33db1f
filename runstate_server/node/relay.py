"""A follower's HTTP/1.1 client to the leader's API: keep-alive connections on asyncio's protocols.

A follower forwards every call it does not serve to the leader and relays the answer (routing.py).
aiohttp's client did that at ~0.3 ms of the follower's CPU per call, about as much as serving the
call itself; this client sends the request in one write and reads the answer in place, the least
a forward needs:

- Connections: one per forwarded call in flight (a forwarded long poll holds its own, so no other
  call waits behind it; the API's connection cap bounds the calls in flight), kept alive and
  reused, the most recently used first, at most `idle_max` idle per origin (the one idle longest
  closed to make room). One idle longer than `idle_reuse_s` is closed instead of reused: the
  leader closes an idle connection after its idle timeout, and a call sent on a connection the
  leader is closing gets no answer.
- Answers framed by Content-Length, by chunks, or by the connection's close (1xx skipped; a HEAD's
  or a 204's has no body). A head past HEAD_BYTES_MAX, a chunk size line past CHUNK_LINE_BYTES_MAX,
  a body past ANSWER_BYTES_MAX or anything that is not HTTP/1.x ends the exchange with AnswerError
  and closes the connection; so does a deadline, a cancellation, or the connection's end before
  the whole answer. An answer that says `Connection: close` is the connection's last.
- Two errors: ConnectError, no connection could be made (the call was never sent: another leader
  may be tried with it); AnswerError, it was sent and may have been applied.
- https:// verifies the leader's certificate with the context the client is given per connection:
  the node's (node/tls.py: against `--tls-ca`, else the system's CAs, presenting the node's own
  API certificate), so a reload reaches the next connection.

The Python SDK has a client of the same kind (runstate/sdk/_wire.py); the server package does not
ship the SDK (a node's image installs the server alone), and a forward needs less of one: no
request of its own to build, the answer's headers as given.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import urlsplit

# Bounds on what a leader's answer can make the follower hold.
HEAD_BYTES_MAX = 64 * 1024  # status line and headers
CHUNK_LINE_BYTES_MAX = 4096  # one chunk's size line, extensions included
ANSWER_BYTES_MAX = 256 * 1024 * 1024  # one answer's body

_CRLF = b"\r\n"
_HEAD_END = b"\r\n\r\n"
_NO_BODY_STATUSES = frozenset({204, 304})


class RelayError(Exception):
    """A forwarded call that got no (well-formed) answer."""


class ConnectError(RelayError):
    """The call was not sent: no connection to the leader could be made."""


class AnswerError(RelayError):
    """The call was sent (it may have been applied) but no whole, well-formed answer came."""


class Origin(NamedTuple):
    secure: bool
    host: str
    port: int


class Answer(NamedTuple):
    status: int
    headers: dict[str, str]  # lower-case names; a repeated header's last value
    body: bytes


def origin_of(url: str) -> tuple[Origin, str]:
    """The origin of an http(s) URL and its path without the trailing slash (a prefix to paths)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL with a host: {url!r}")
    secure = parts.scheme == "https"
    return Origin(secure, parts.hostname, parts.port or (443 if secure else 80)), parts.path.rstrip("/")


def request_head(method: str, target: str, host: str, headers: dict[str, str], body_bytes: int) -> bytes:
    """The request line and headers, with Host and Content-Length, up to and with the blank line.
    Names and values are the ones the follower's own parser read (no CR or LF in them); they are
    written back as the bytes it read (aiohttp decodes header bytes as UTF-8, surrogates escaped)."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"Content-Length: {body_bytes}"]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    lines.append("\r\n")
    return "\r\n".join(lines).encode("utf-8", "surrogateescape")


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one exchange at a time."""

    def __init__(self, origin: Origin, pool: _Pool) -> None:
        self.origin = origin
        self._pool = pool  # told when the connection closes
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0  # time.monotonic(), set when it goes back to the pool
        self.closed = False
        self._buffer = bytearray()
        self._answer: asyncio.Future[Answer] | None = None
        self._head_request = False
        # The answer being read: its head once parsed, then how its body is framed.
        self._status = 0
        self._headers: dict[str, str] = {}
        self._body_left = -1  # bytes of a Content-Length body still to come; -1: none being read
        self._chunked = False
        self._until_close = False
        self._body = bytearray()
        self._last = False  # the answer said Connection: close

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._answer is None or self._answer.done():
            self.close()  # bytes nobody asked for: the connection cannot be trusted any more
            return
        self._buffer += data
        try:
            self._parse()
        except AnswerError as error:
            self._fail(error)

    def eof_received(self) -> bool:
        self.closed = True  # the leader ends the connection: never taken for another call
        if self._until_close and self._answer is not None and not self._answer.done():
            self._finish()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.forget(self)
        if self._answer is not None and not self._answer.done():
            if self._until_close and exc is None:
                self._finish()
            else:
                reason = f": {exc}" if exc is not None else ""
                self._fail(AnswerError(f"the connection closed before the whole answer{reason}"))

    # -- one exchange

    async def exchange(self, request: bytes, head_request: bool, timeout_s: float) -> Answer:
        assert self.transport is not None and self._answer is None
        loop = asyncio.get_running_loop()
        self._answer = loop.create_future()
        self._head_request = head_request
        self.transport.write(request)
        handle = loop.call_later(timeout_s, self._time_out, timeout_s)
        try:
            return await self._answer
        except asyncio.CancelledError:
            self.close()  # the answer may still come: the connection is never reused
            raise
        finally:
            handle.cancel()
            self._answer = None

    def _time_out(self, timeout_s: float) -> None:
        self._fail(AnswerError(f"no whole answer within {timeout_s:g} s"))

    def _fail(self, error: AnswerError) -> None:
        self.close()
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(error)

    def _finish(self) -> None:
        answer = Answer(self._status, self._headers, bytes(self._body))
        reusable = not (self._last or self._until_close or self._buffer)
        self._status, self._headers, self._body = 0, {}, bytearray()
        self._body_left, self._chunked, self._until_close = -1, False, False
        assert self._answer is not None
        self._answer.set_result(answer)
        if not reusable:
            self.close()

    def _parse(self) -> None:
        while self._answer is not None and not self._answer.done():
            if not self._status:
                if not self._parse_head():
                    return
                continue
            if self._chunked:
                if not self._parse_chunk():
                    return
                continue
            if self._until_close:
                self._take_body(len(self._buffer))
                return
            taken = min(self._body_left, len(self._buffer))
            self._take_body(taken)
            self._body_left -= taken
            if self._body_left:
                return
            self._finish()

    def _take_body(self, count: int) -> None:
        if len(self._body) + count > ANSWER_BYTES_MAX:
            raise AnswerError(f"the answer's body is over {ANSWER_BYTES_MAX} bytes")
        self._body += self._buffer[:count]
        del self._buffer[:count]

    def _parse_head(self) -> bool:
        end = self._buffer.find(_HEAD_END)
        if end < 0:
            if len(self._buffer) > HEAD_BYTES_MAX:
                raise AnswerError(f"the answer's head is over {HEAD_BYTES_MAX} bytes")
            return False
        if end > HEAD_BYTES_MAX:
            raise AnswerError(f"the answer's head is over {HEAD_BYTES_MAX} bytes")
        lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
        del self._buffer[:end + len(_HEAD_END)]
        version, _, rest = lines[0].partition(" ")
        status_text = rest[:3]
        if not version.startswith("HTTP/1.") or len(status_text) != 3 or not status_text.isdigit():
            raise AnswerError(f"not an HTTP/1.x answer: {lines[0][:100]!r}")
        status = int(status_text)
        if status < 200:
            return True  # 100 Continue and the like: the answer follows
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise AnswerError(f"a malformed header line: {line[:100]!r}")
            headers[name.strip().lower()] = value.strip()
        self._status, self._headers = status, headers
        self._last = headers.get("connection", "").lower() == "close"
        if self._head_request or status in _NO_BODY_STATUSES:
            self._body_left = 0
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            self._chunked = True
            self._body_left = -1
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise AnswerError(f"a malformed Content-Length: {length[:40]!r}")
            self._body_left = int(length)
            if self._body_left > ANSWER_BYTES_MAX:
                raise AnswerError(f"the answer's body is over {ANSWER_BYTES_MAX} bytes")
        else:
            self._until_close = True
        return True

    def _parse_chunk(self) -> bool:
        """One step of a chunked body: a chunk (its size line, data and CRLF) or the last chunk
        with its trailers. False when the buffer holds too little for the step."""
        if self._body_left > 0:  # inside a chunk's data, and its CRLF
            if len(self._buffer) < self._body_left + 2:
                return False
            self._take_body(self._body_left)
            if self._buffer[:2] != _CRLF:
                raise AnswerError("a chunk does not end with CRLF")
            del self._buffer[:2]
            self._body_left = -1
            return True
        if self._body_left == 0:  # after the last chunk: trailers up to a blank line
            end = self._buffer.find(_CRLF)
            if end < 0:
                if len(self._buffer) > HEAD_BYTES_MAX:
                    raise AnswerError(f"the answer's trailers are over {HEAD_BYTES_MAX} bytes")
                return False
            del self._buffer[:end + 2]
            if end == 0:
                self._chunked = False
                self._finish()
            return True
        end = self._buffer.find(_CRLF)
        if end < 0:
            if len(self._buffer) > CHUNK_LINE_BYTES_MAX:
                raise AnswerError(f"a chunk size line is over {CHUNK_LINE_BYTES_MAX} bytes")
            return False
        size_text = bytes(self._buffer[:end]).split(b";", 1)[0].strip()
        del self._buffer[:end + 2]
        try:
            self._body_left = int(size_text, 16)
        except ValueError:
            raise AnswerError(f"a malformed chunk size: {size_text[:40]!r}") from None
        if self._body_left < 0:
            raise AnswerError(f"a malformed chunk size: {size_text[:40]!r}")
        return True

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Pool:
    def __init__(self, idle_max: int) -> None:
        self.idle_max = idle_max
        self.idle: dict[Origin, list[_Connection]] = {}
        self.open: set[_Connection] = set()

    def forget(self, connection: _Connection) -> None:
        self.open.discard(connection)
        idle = self.idle.get(connection.origin)
        if idle and connection in idle:
            idle.remove(connection)


class RelayClient:
    """Keep-alive connections to the leaders' APIs, at most `idle_max` idle per origin, each reused
    while it has been idle at most `idle_reuse_s`."""

    def __init__(
        self, *, idle_max: int, idle_reuse_s: float, connect_timeout_s: float,
        context: Callable[[], ssl.SSLContext] = ssl.create_default_context,
    ) -> None:
        if idle_max < 0:
            raise ValueError(f"idle_max must be at least 0, got {idle_max}")
        self._pool = _Pool(idle_max)
        self.idle_reuse_s = idle_reuse_s
        self.connect_timeout_s = connect_timeout_s
        # The context an https:// origin is dialled with (asked per connection: a reload replaces it).
        self._context = context
        self._closed = False

    @property
    def open_connections(self) -> int:
        return len(self._pool.open)

    async def request(self, origin: Origin, request: bytes, *, head_request: bool, timeout_s: float) -> Answer:
        """Send `request` (head and body, as `request_head` and the body make it) to `origin` and
        read its whole answer within `timeout_s` (the connect within the client's connect timeout)."""
        if self._closed:
            raise RuntimeError("the relay client is closed")
        connection = self._take_idle(origin)
        if connection is None:
            connection = await self._connect(origin)
        answer = await connection.exchange(request, head_request, timeout_s)
        self._give_back(connection)
        return answer

    def close(self) -> None:
        """Close every idle connection; a call in flight keeps its own until it ends."""
        self._closed = True
        for connections in self._pool.idle.values():
            for connection in connections:
                connection.close()
        self._pool.idle.clear()

    def _take_idle(self, origin: Origin) -> _Connection | None:
        idle = self._pool.idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()  # the most recently used
            if connection.closed or connection.transport is None or connection.transport.is_closing():
                continue
            if now - connection.idle_since > self.idle_reuse_s:
                connection.close()
                continue
            return connection
        return None

    async def _connect(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if origin.secure:
            context = self._context()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(origin, self._pool), origin.host, origin.port, ssl=context,
                ),
                self.connect_timeout_s,
            )
        except (OSError, asyncio.TimeoutError, ssl.SSLError) as error:
            detail = str(error) or type(error).__name__
            raise ConnectError(f"cannot connect to {origin.host}:{origin.port}: {detail}") from None
        self._pool.open.add(connection)
        return connection

    def _give_back(self, connection: _Connection) -> None:
        if connection.closed or self._closed:
            connection.close()
            return
        idle = self._pool.idle.setdefault(connection.origin, [])
        if len(idle) >= self._pool.idle_max:
            if not idle:
                connection.close()
                return
            idle.pop(0).close()  # the one idle longest
        connection.idle_since = time.monotonic()
        idle.append(connection)
