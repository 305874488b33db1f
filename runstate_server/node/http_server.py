"""The API's HTTP server: aiohttp's, with a bound on everything a client can hold.

aiohttp alone takes every connection the process can open, waits forever for a request's headers
or body, and answers its own parser errors in plain text. A node built on it alone stopped
answering anyone once 1,100 idle connections had used up its file descriptors. Here:

- Connections: at most `HttpLimits.connections_max` are served, never more than half the
  process's file-descriptor limit (the rest is for Raft, the journal and forwarding; the soft
  limit is raised to the hard one at start). A connection past the cap takes the place of the one
  that has waited longest for a request (HTTP lets a server close an idle keep-alive connection
  at any time). If every served connection is busy with a request, up to
  HTTP_SHED_CONNECTIONS_MAX more are answered `503 UNAVAILABLE` with Retry-After; past that a new
  connection is closed at once, unanswered. The Site accepts one connection at a time: asyncio's
  server accepts up to its backlog at once, a burst that alone can exhaust the descriptors.
- Deadlines: an idle connection is closed after `idle_timeout_ms`; a request's line and headers
  must arrive within `header_timeout_ms` of its first byte, its body within `body_timeout_ms` of
  its headers; either late one is answered `408 REQUEST_TIMEOUT` and its connection closed. What
  the kernel's socket buffer cannot take of an answer waits in the transport's buffer: if some is
  still there `send_timeout_ms` after the answer began, the connection is dropped with it (a
  client that asks for large answers and never reads would otherwise keep them in memory, and a
  close waits for the buffer to drain).
- TLS (`--tls-cert`, node/certs.py): each accepted connection's handshake runs in its own task,
  so a slow one never holds up the accept loop. It must finish within `header_timeout_ms`, else
  the connection is closed; at most TLS_HANDSHAKES_MAX handshakes are under way at once, and one
  past that takes the place of the oldest (as an idle connection does). A connection counts toward
  `connections_max` once its handshake is done. A failed handshake (plain HTTP to the TLS port, a
  client that does not trust the certificate or presents none the client CA signed) closes the
  connection with one rate-limited INFO line, no traceback.
- aiohttp's own answers (a malformed request; an exception no middleware caught) are the JSON
  error envelope with X-Request-Id.
- A client that goes away mid-request is logged at debug, and asyncio's and aiohttp's logs are
  rate-limited (LogRateLimit), so a flood cannot fill the disk with tracebacks.

Everything of aiohttp used here beyond its public API comes through node/_aiohttp.py, which checks
at import that each name is still there (and this module, that our subclasses shadow none of
aiohttp's): a release that changed one stops the node at start.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import logging
import re
import resource
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, cast

from aiohttp import web

from runstate_server.node import _asyncio_tls
from runstate_server.node._aiohttp import RequestHandler, StreamReader, check_own_names
from runstate_server.node.config import (
    HTTP_HEADERS_MAX,
    HTTP_LINE_BYTES_MAX,
    HTTP_LINGER_MS,
    HTTP_SHED_CONNECTIONS_MAX,
    HttpLimits,
)
from runstate_server.node.errors import ApiError, error_response, new_request_id
from runstate_server.node.waiters import Waiter

log = logging.getLogger(__name__)

_asyncio_tls.install()  # a TLS handshake the node refuses tells the client why (its alert)

# Of the file descriptors the process may open, API connections take at most 1/FD_SHARE_DIVISOR.
FD_SHARE_DIVISOR = 2
# When the hard limit is "unlimited", the soft limit is raised this far (macOS refuses more).
FD_LIMIT_UNLIMITED_TARGET = 1 << 20
# Log rate limit: per logger and message template, this many records per window, then a count.
LOG_RECORDS_PER_WINDOW_MAX = 10
LOG_WINDOW_S = 10.0
LOG_TEMPLATES_MAX = 1_000  # templates tracked at once; past it the table starts again
# The loggers a stranger can make noisy: accept and parser errors on the API, and the Raft port's
# refused connections and frames (one stranger opening connections in a loop wrote 700 KB/s).
RATE_LIMITED_LOGGERS = (
    "asyncio", "aiohttp.server", "aiohttp.web", "aiohttp.internal", __name__, "runstate_server.cluster._transport",
)
CLIENT_GONE = (ConnectionError, asyncio.CancelledError)  # a client closed its side mid-request
# Out of file descriptors or memory at accept: wait this long before accepting again.
ACCEPT_RETRY_S = 0.1
# TLS handshakes under way at once (each bounded by the header timeout); past it the oldest is closed.
# Their descriptors come on top of the served connections' (which take at most half the fd limit).
TLS_HANDSHAKES_MAX = 256
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def client_gone(request: web.BaseRequest, error: BaseException) -> bool:
    """`error` says the request's client closed its connection (the node is not at fault)."""
    return isinstance(error, CLIENT_GONE) and (request.transport is None or request.transport.is_closing())


def raise_fd_limit() -> int:
    """Raise the soft limit on open files to the hard limit (a common soft default, 1,024, is
    too few for a server); return the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_LIMIT_UNLIMITED_TARGET if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as error:
        log.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, error)
        return soft
    return target


def connections_max_for(limits: HttpLimits, fd_limit: int) -> int:
    """The connection cap in force: the setting, or half the fd limit if that is lower."""
    if fd_limit == resource.RLIM_INFINITY:
        return limits.connections_max
    cap = max(1, min(limits.connections_max, fd_limit // FD_SHARE_DIVISOR))
    if cap < limits.connections_max:
        log.warning(
            "serving at most %d API connections (half the open-file limit of %d), not %d", cap, fd_limit,
            limits.connections_max,
        )
    return cap


class LogRateLimit(logging.Filter):
    """At most `records_max` records per `window_s` for each (logger, message template); the first
    record let through after some were dropped says how many."""

    def __init__(
        self, records_max: int = LOG_RECORDS_PER_WINDOW_MAX, window_s: float = LOG_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.records_max = records_max
        self.window_s = window_s
        self._clock = clock
        self._windows: dict[tuple[str, str], list[float]] = {}  # -> [window start, let through, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, str(record.msg))
        now = self._clock()
        window = self._windows.get(key)
        if window is None or now - window[0] >= self.window_s:
            if len(self._windows) >= LOG_TEMPLATES_MAX:
                self._windows.clear()
            self._windows[key] = [now, 1, 0]
            if window is not None and window[2]:
                record.msg = f"{record.msg} [{int(window[2])} more like this dropped in {self.window_s:g} s]"
            return True
        if window[1] < self.records_max:
            window[1] += 1
            return True
        window[2] += 1
        return False


def limit_log_rate() -> None:
    """Rate-limit the loggers a client can make noisy (accept errors, parser errors, the Raft port's
    refusals); idempotent."""
    for name in RATE_LIMITED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, LogRateLimit) for existing in logger.filters):
            logger.addFilter(LogRateLimit())


class Admission(enum.Enum):
    SERVE = "serve"
    SHED = "shed"  # past the cap with every connection busy: one answer, 503
    REFUSE = "refuse"  # past the cap and the shed connections too: closed at once


class Connection(RequestHandler):
    """One client connection (aiohttp's protocol), under the server's deadlines and cap."""

    __slots__ = ("_limited_server", "_head_timer", "_head_started", "_shed", "_parked", "_send_timer")

    def __init__(self, manager: LimitedServer, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._limited_server = manager  # aiohttp forgets its manager when the connection is lost
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_started = False  # bytes of a request's head arrived, not all of it yet
        self._shed = False
        self._parked: Waiter | None = None  # the long poll its request waits in, if any
        self._send_timer: asyncio.TimerHandle | None = None  # the send deadline of an answer

    def parked_on(self, waiter: Waiter | None) -> None:
        """Its request's long poll waits in `waiter` (None: no longer); a lost connection ends it."""
        self._parked = waiter

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        admission = self._limited_server.admit(self)
        if admission is Admission.REFUSE:
            self._manager = None  # so connection_lost has nothing to undo
            transport.close()
            return
        super().connection_made(transport)
        if admission is Admission.SHED:
            self._shed = True  # answered 503 at its first request, which must come promptly
            self._arm_head_timer()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._limited_server.forget(self)
        if self._parked is not None:  # nobody left to answer: the poll ends now, not at its waitMs
            self._parked.interrupt()
            self._parked = None
        self._cancel_head_timer()
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._force_close or self._close:
            return  # closing: aiohttp reads nothing more either
        waiting = self.waiting_for_request()
        requests_before = self._request_count
        super().data_received(data)
        if self._request_count != requests_before:  # a request's head is complete (or malformed)
            self._head_started = False
            self._cancel_head_timer()
            self._limited_server.mark_busy(self)
        elif waiting and data and not self._head_started:
            # Bytes that arrive while a request is handled (a body, a pipelined head) are not
            # timed here: the body deadline and the idle timeout bound those.
            self._head_started = True
            self._arm_head_timer()

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        # aiohttp hands an answer to the transport and returns (or waits within, for a stream):
        # the deadline bounds how long the unsent rest may stay in the transport's buffer.
        if self._send_timer is None:
            self._send_timer = self._loop.call_later(self._limited_server.send_timeout_s, self._send_timed_out)
        answered = await super().finish_response(request, resp, start_time)
        self._limited_server.mark_idle(self)
        return answered

    def waiting_for_request(self) -> bool:
        """No request is being handled or queued: the connection waits for the next one."""
        return self._request_count == 0 or (self._waiter is not None and not self._waiter.done())

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse (400) or whose handler raised past the
        middlewares (500): the JSON error envelope, and the connection closed."""
        if exc is not None and client_gone(request, exc):
            log.debug("client %s went away mid-request: %r", request.remote, exc)
        elif status >= 500:
            log.error("error handling a request from %s", request.remote, exc_info=exc)
        else:
            # A client's malformed request is its error, not the node's.
            log.debug("malformed request from %s: %r", request.remote, exc)
        if request.writer.output_size > 0:
            raise ConnectionError("the answer was partly sent; the connection is dropped")
        if status < 500:
            code, text = "VALIDATION_FAILED", f"malformed HTTP request: {_parser_error(message, exc)}"
        else:
            code, text = "INTERNAL", "internal server error; the node's log has the details"
        response = error_response(code, text, new_request_id())
        response.force_close()
        return response

    # -- deadlines -------------------------------------------------------------------------------

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            timeout_s = self._limited_server.header_timeout_s
            self._head_timer = self._loop.call_later(timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        transport = self.transport
        if transport is None or not self.waiting_for_request():
            return
        if self._head_started:
            timeout_s = self._limited_server.header_timeout_s
            message = f"the request line and headers did not arrive within {timeout_s:g} s"
            response = error_response("REQUEST_TIMEOUT", message, new_request_id())
            transport.write(_serialize(response))  # the transport sends it before it closes
        self.force_close()

    def _send_timed_out(self) -> None:
        """An answer began `send_timeout_s` ago: if the transport still holds bytes the client has
        not taken, drop the connection and them (a write waiting for the client ends with
        ConnectionResetError, a client gone); else the next answer arms the deadline again."""
        self._send_timer = None
        transport = self.transport
        if transport is not None and transport.get_write_buffer_size() > 0:
            log.debug("an answer was not taken within %g s; the connection is dropped", self._limited_server.send_timeout_s)
            transport.abort()

    def body_timed_out(self, payload: StreamReader) -> None:
        """The body did not arrive in time: whoever reads it gets REQUEST_TIMEOUT (answered as
        any ApiError), and the connection is closed after that answer."""
        if payload.is_eof():
            return
        self.close()  # read nothing more; close once answered
        timeout_s = self._limited_server.body_timeout_s
        message = f"the request body did not arrive within {timeout_s:g} s"
        payload.set_exception(ApiError("REQUEST_TIMEOUT", message))
        payload.feed_eof()  # nothing left to drain after the answer


def _parser_error(message: str | None, exc: BaseException | None) -> str:
    """aiohttp's parser error, as one line without the bytes it quotes."""
    detail = (message or str(exc) or "").strip()
    if detail.startswith(_PARSER_ERROR_HTTP2):
        return "HTTP/2 is not served here; use HTTP/1.1"
    detail = _QUOTED_BYTES.sub("", detail.splitlines()[0] if detail else "").rstrip(":. ")
    return detail or "cannot parse it"


_PARSER_ERROR_HTTP2 = "Pause on PRI"  # the HTTP/2 connection preface, "PRI * HTTP/2.0"
_QUOTED_BYTES = re.compile(r":?\s*(bytearray\()?b['\"].*$")


def _serialize(response: web.Response) -> bytes:
    """An answer written straight to the socket, outside any request (a late head)."""
    body = cast(bytes, response.body)
    lines = [f"HTTP/1.1 {response.status} {response.reason}"]
    lines += [f"{name}: {value}" for name, value in response.headers.items()]  # type, request id
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class LimitedServer(web.Server):
    """aiohttp's Server with a cap on the connections it serves (see the module's docstring)."""

    def __init__(
        self, handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]], *, limits: HttpLimits,
        connections_max: int, **kwargs: Any,
    ) -> None:
        super().__init__(self._handle, **kwargs)
        self._app_handler = handler
        self.connections_max = connections_max
        self.header_timeout_s = limits.header_timeout_ms / 1000
        self.body_timeout_s = limits.body_timeout_ms / 1000
        self.send_timeout_s = limits.send_timeout_ms / 1000
        self._serving: dict[Connection, None] = {}  # in the order they connected
        self._idle: dict[Connection, None] = {}  # served and waiting for a request, longest first
        self._shed: set[Connection] = set()

    def __call__(self) -> Connection:
        return Connection(self, loop=self._loop, **self._kwargs)

    def __repr__(self) -> str:
        return (
            f"<LimitedServer serving={len(self._serving)}/{self.connections_max} idle={len(self._idle)} "
            f"shed={len(self._shed)}>"
        )

    def admit(self, connection: Connection) -> Admission:
        if len(self._serving) >= self.connections_max:
            if self._idle:
                longest_idle = next(iter(self._idle))
                self.forget(longest_idle)
                longest_idle.force_close()
            elif len(self._shed) < HTTP_SHED_CONNECTIONS_MAX:
                self._shed.add(connection)
                return Admission.SHED
            else:
                log.warning("all %d API connections are busy; new ones are closed", self.connections_max)
                return Admission.REFUSE
        self._serving[connection] = None
        self._idle[connection] = None
        return Admission.SERVE

    def forget(self, connection: Connection) -> None:
        self._serving.pop(connection, None)
        self._idle.pop(connection, None)
        self._shed.discard(connection)

    def mark_busy(self, connection: Connection) -> None:
        self._idle.pop(connection, None)

    def mark_idle(self, connection: Connection) -> None:
        if connection in self._serving:
            self._idle.pop(connection, None)
            self._idle[connection] = None  # now the most recently idle

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        connection = cast(Connection, request.protocol)
        if connection._shed:
            response = ApiError(
                "UNAVAILABLE", f"this node serves {self.connections_max} connections and all are busy; retry"
            ).response(new_request_id())  # with Retry-After
            response.force_close()
            return response
        body_timer = None
        if not request.content.is_eof():
            payload = request.content
            body_timer = self._loop.call_later(self.body_timeout_s, connection.body_timed_out, payload)
        try:
            return await self._app_handler(request)
        finally:
            if body_timer is not None:
                body_timer.cancel()


class Runner(web.AppRunner):
    """aiohttp's AppRunner serving through a LimitedServer."""

    __slots__ = ("_limits", "_connections_max")

    def __init__(self, app: web.Application, limits: HttpLimits, *, connections_max: int) -> None:
        super().__init__(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=limits.idle_timeout_ms / 1000,
            max_line_size=HTTP_LINE_BYTES_MAX,
            max_field_size=HTTP_LINE_BYTES_MAX,
            max_headers=HTTP_HEADERS_MAX,
            lingering_time=HTTP_LINGER_MS / 1000,
        )
        self._limits = limits
        self._connections_max = connections_max

    async def _make_server(self) -> web.Server:
        plain = await super()._make_server()  # starts the application as AppRunner does
        return LimitedServer(
            plain.request_handler,
            limits=self._limits,
            connections_max=self._connections_max,
            request_factory=plain.request_factory,
            handler_cancellation=plain.handler_cancellation,
            **self._kwargs,
        )


class Site(web.BaseSite):
    """Listens on host:port and accepts one connection at a time, each handed to the runner's
    server before the next is taken, so the descriptors open stay within the server's cap (plus
    the one being refused). Binds the one address `host` names (IPv6 if it holds a colon). With
    an SSL context, serves HTTPS: each handshake in a task of its own (see the module's docstring)."""

    __slots__ = ("_host", "_port", "_accepting", "_tls", "_handshakes")

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, *, backlog: int, ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, backlog=backlog)
        self._host = host
        self._port = port
        self._accepting: asyncio.Task[None] | None = None
        self._tls = ssl_context
        # TLS handshakes under way, oldest first, each with its socket until the task takes it over.
        self._handshakes: dict[asyncio.Task[None], socket.socket | None] = {}

    @property
    def name(self) -> str:
        return f"{'https' if self._tls is not None else 'http'}://{self._host}:{self._port}"

    def use_tls(self, context: ssl.SSLContext) -> None:
        """Serve the handshakes from now on with `context` (a reload, node/tls.py); those under way keep theirs."""
        assert self._tls is not None, "a plain HTTP site does not turn into an HTTPS one"
        self._tls = context

    async def start(self) -> None:
        await super().start()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        listener = socket.create_server((self._host, self._port), family=family, backlog=self._backlog)
        listener.setblocking(False)
        self._accepting = asyncio.create_task(self._accept(listener), name=f"accept {self.name}")

    async def stop(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
            try:
                await self._accepting
            except asyncio.CancelledError:
                pass
            self._accepting = None
        handshakes = list(self._handshakes)
        for task, client in list(self._handshakes.items()):
            task.cancel()
            if client is not None:
                client.close()  # the task never ran
        await asyncio.gather(*handshakes, return_exceptions=True)
        await super().stop()

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        with listener:
            while True:
                try:
                    client, address = await loop.sock_accept(listener)
                except OSError as error:
                    if error.errno in _OUT_OF_RESOURCES:
                        log.error("cannot accept a connection on %s: %s", self.name, error)
                        await asyncio.sleep(ACCEPT_RETRY_S)
                    continue  # else a connection reset before it was accepted
                if self._tls is not None:
                    self._start_handshake(server, client, address)
                    continue
                try:
                    await loop.connect_accepted_socket(server, client)
                except OSError as error:
                    log.debug("connection dropped as it was accepted: %s", error)
                    client.close()

    def _start_handshake(self, server: web.Server, client: socket.socket, address: Any) -> None:
        if len(self._handshakes) >= TLS_HANDSHAKES_MAX:
            oldest = next(iter(self._handshakes))
            socket_of_oldest = self._handshakes.pop(oldest)
            oldest.cancel()  # once it ran, asyncio closes the transport it made of the socket
            if socket_of_oldest is not None:
                socket_of_oldest.close()  # it never ran: the socket is still only ours
        task = asyncio.create_task(self._handshake(server, client, address), name=f"TLS handshake {address}")
        self._handshakes[task] = client
        task.add_done_callback(self._handshake_done)

    def _handshake_done(self, task: asyncio.Task[None]) -> None:
        self._handshakes.pop(task, None)

    async def _handshake(self, server: web.Server, client: socket.socket, address: Any) -> None:
        """Serve `client` once its TLS handshake is done; a failed or late one closes it (asyncio
        closes the transport it made of the socket)."""
        loop = asyncio.get_running_loop()
        timeout_s = cast(LimitedServer, server).header_timeout_s
        task = asyncio.current_task()
        if task in self._handshakes:
            self._handshakes[task] = None  # from here on asyncio closes the socket, whatever happens
        try:
            await loop.connect_accepted_socket(server, client, ssl=self._tls, ssl_handshake_timeout=timeout_s)
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError; a timeout ConnectionAbortedError
            log.info("TLS handshake with %s failed: %s", _address_text(address), _handshake_error(error))


def _address_text(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


def _handshake_error(error: BaseException) -> str:
    if isinstance(error, ssl.SSLError):
        return error.reason or error.__class__.__name__  # e.g. HTTP_REQUEST: plain HTTP to the TLS port
    return str(error) or error.__class__.__name__


# Last, once the four classes exist: a name of ours that aiohttp's code uses too stops the node.
check_own_names(Connection, LimitedServer, Runner, Site)
