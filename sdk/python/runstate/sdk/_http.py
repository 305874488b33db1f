"""The HTTP transport: one connection pool (_wire.py), the list of servers, failover and bounded retries.

Retry rules. A request that never reached a server (connection refused, connect timeout) is
retried on the next listed server, whatever it is. A request that may have reached a server (a
read timeout, a dropped connection, a 503 answer) is retried only when the caller marked it safe:
a GET, a POST the server deduplicates (a submit carries a key), or one whose repetition changes
nothing (cancel, complete, renew, the delivery calls). An unsafe one (receive, creating a run)
raises `OutcomeUnknownError` instead, so the caller decides. Every mutation of a space carries an
Idempotency-Key, one per call and the same on its retries, so a safe call retried after a lost
answer is applied once (a reserve reserves once). A `408 REQUEST_TIMEOUT` answer (the
node did not receive the whole request in time, so it applied nothing) is retried whatever the
call. A retry goes to the next listed server at once while some server has not been tried since
the last pause; once every one has failed, retries pause (RETRY_BACKOFF_S_INITIAL, doubling up to
RETRY_BACKOFF_S_MAX) and stop after `UNAVAILABLE_AFTER_S` seconds without an answer, with
`UnavailableError`.

TLS. An https:// server's certificate is verified against the system's CAs, or only against
`ca_file` when one is given; `client_cert` with `client_key` is presented to a server that asks
(mutual TLS). A TLS failure that another attempt would meet again (the certificate does not
verify, the server refused the handshake, the port does not speak TLS) raises `TlsError` at once,
not retried, and the client's next call starts at the next listed server.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import secrets
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote, urlencode, urlsplit

from runstate.sdk._wire import AnswerError, ConnectError, ConnectionPool, HandshakeError, request_head
from runstate.sdk.errors import (
    ConfigError,
    RunstateError,
    TlsError,
    UnavailableError,
    error_from_response,
)

if TYPE_CHECKING:
    from runstate.sdk._coalesce import ResultBatcher, SubmitBatcher

# The node did not receive the whole request in time and applied nothing: always safe to resend.
NOT_RECEIVED_CODE = "REQUEST_TIMEOUT"
# Set by a node that forwarded a call to the leader: the leader's API URL.
LEADER_HEADER = "X-Runstate-Leader"
LEADER_HEADER_LOWER = LEADER_HEADER.lower()  # as an answer's headers are keyed

logger = logging.getLogger("runstate.sdk")

BASE_URL_ENV = "RUNSTATE_BASE_URL"
SPACE_ID_ENV = "RUNSTATE_SPACE_ID"
API_KEY_ENV = "RUNSTATE_API_KEY"
BASE_URL_DEFAULT = "http://localhost:8080"
CA_FILE_ENV = "RUNSTATE_CA_FILE"
CLIENT_CERT_ENV = "RUNSTATE_CLIENT_CERT"
CLIENT_KEY_ENV = "RUNSTATE_CLIENT_KEY"

# How long the SDK keeps retrying without any answer before it raises UnavailableError.
UNAVAILABLE_AFTER_S = 5.0
# The pause once every listed server failed since the last one (none before an untried server).
RETRY_BACKOFF_S_INITIAL = 0.05
RETRY_BACKOFF_S_MAX = 0.5
# Connecting to one server; past it, the next listed server is tried.
CONNECT_TIMEOUT_S = 2.0
# Total time of one ordinary request (not a long poll).
REQUEST_TIMEOUT_S_DEFAULT = 10.0
# Added to a long poll's server-side wait for its client-side timeout.
LONG_POLL_MARGIN_S = 5.0
# Idle keep-alive connections a client keeps per server (calls in flight are not capped: _wire.py).
IDLE_CONNECTIONS_MAX = 100
# How much of an unexpected (non-JSON) answer goes into an error message.
ERROR_BODY_CHARS_MAX = 500

HEADER_HOLDER = "X-Runstate-Holder"
# Every mutation of a space carries a fresh key, the same on each retry of that call: the server
# applies it once and answers a retry with the first answer (PROTOCOL.md: 24 lowercase hex).
IDEMPOTENCY_HEADER = "Idempotency-Key"
IDEMPOTENCY_KEY_BYTES = 12
# A path that does not start with this is relative to the client's space: `/scopes` is sent as
# `/v1/spaces/{spaceId}/scopes`. Operator routes (`/v1/whoami`, `/v1/keys`, ...) are absolute.
API_ROOT = "/v1/"


class OutcomeUnknownError(UnavailableError):
    """A request that is unsafe to repeat may have reached the server, but no answer came back."""


def parse_base_urls(base_url: str | Sequence[str] | None) -> list[str]:
    """The servers to talk to: the argument, else `RUNSTATE_BASE_URL`, else `BASE_URL_DEFAULT`.

    Either may be a comma-separated list (or the argument a list). Trailing slashes are dropped.
    Raises ConfigError for an entry that is not an http(s) URL with a host.
    """
    raw: str | Sequence[str] | None = base_url
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        raw = os.environ.get(BASE_URL_ENV, "").strip() or BASE_URL_DEFAULT
    parts = raw.split(",") if isinstance(raw, str) else list(raw)
    urls: list[str] = []
    for part in parts:
        if not isinstance(part, str):
            raise ConfigError(f"base_url entries must be strings, got {part!r}")
        candidate = part.strip().rstrip("/")
        if not candidate:
            continue
        try:
            parsed = urlsplit(candidate)
            parsed.port  # noqa: B018 (raises ValueError for a port that is not one)
        except ValueError as exc:
            raise ConfigError(f"base_url {candidate!r} is not a URL: {exc}") from exc
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ConfigError(f"base_url {candidate!r} must be an http:// or https:// URL with a host")
        if parsed.query or parsed.fragment or _UNSAFE_IN_TARGET.search(candidate):
            raise ConfigError(f"base_url {candidate!r} must be a plain URL: no query, fragment, spaces or control characters")
        if candidate not in urls:
            urls.append(candidate)
    if not urls:
        raise ConfigError("base_url lists no URL")
    return urls


def resolve_optional(value: str | None, env: str) -> str | None:
    """The argument, else the environment variable; an empty string counts as unset."""
    if value is None:
        value = os.environ.get(env)
    if value is None or not value.strip():
        return None
    return value.strip()


def tls_context(ca_file: str | None, client_cert: str | None, client_key: str | None) -> ssl.SSLContext | None:
    """The https:// context of a client: None (the system's CAs, made at first use) when neither
    argument nor RUNSTATE_CA_FILE, RUNSTATE_CLIENT_CERT, RUNSTATE_CLIENT_KEY names a file; else one
    that trusts only `ca_file`'s CAs (when given) and presents `client_cert` with `client_key`
    (when given). An argument wins over its variable. Raises ConfigError naming the file for one
    that is missing, unreadable or not PEM, or a key that does not match its certificate."""
    ca_file = resolve_optional(ca_file, CA_FILE_ENV)
    client_cert = resolve_optional(client_cert, CLIENT_CERT_ENV)
    client_key = resolve_optional(client_key, CLIENT_KEY_ENV)
    if ca_file is None and client_cert is None and client_key is None:
        return None
    if (client_cert is None) != (client_key is None):
        raise ConfigError(
            f"client_cert ({CLIENT_CERT_ENV}) and client_key ({CLIENT_KEY_ENV}) go together: give both, or neither"
        )
    for path, what in ((ca_file, "ca_file"), (client_cert, "client_cert"), (client_key, "client_key")):
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as error:
            raise ConfigError(f"cannot read {what} {path}: {error.strerror or error}") from None
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except ssl.SSLError as error:
        raise ConfigError(f"ca_file {ca_file}: not PEM CA certificates ({error.reason or error})") from None
    if client_cert is not None:
        try:
            context.load_cert_chain(client_cert, client_key)
        except ssl.SSLError as error:
            raise ConfigError(
                f"client_cert {client_cert} with client_key {client_key}: not a PEM certificate and its matching "
                f"private key ({error.reason or error})"
            ) from None
    return context


def default_holder() -> str:
    """The worker identity when none is given: `<hostname>:<pid>`."""
    return f"{socket.gethostname()}:{os.getpid()}"


# The characters quote(value, safe="") leaves as they are (RFC 3986's unreserved ones): a value
# made of them only, as the ids the server hands out are, is its own path segment.
_UNRESERVED = re.compile(r"[A-Za-z0-9_.~-]+")
# What a request target or a header value must not hold as it is (a request line or a header
# line would end there, or be ambiguous): whitespace, control characters and DEL.
_UNSAFE_IN_TARGET = re.compile(r"[\x00-\x20\x7f]")
_UNSAFE_IN_HEADER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# The characters a request target keeps as they are: RFC 3986's unreserved, sub-delims, ":", "@",
# "/", "?" and "%" (a path is sent as the SDK built it, its segments percent-encoded already).
_TARGET_SAFE = "/:@!$&'()*+,;=?%-._~"


def path_segment(value: str, what: str) -> str:
    """One path segment (a name or an id), percent-encoded; ConfigError if empty or not a string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{what} must be a non-empty string, got {value!r}")
    if _UNRESERVED.fullmatch(value):
        return value
    return quote(value, safe="")


def _body_encoder() -> Callable[[Any], str]:
    """Compact JSON text, as json.dumps(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    gives it. json's C encoder is made once (JSONEncoder.encode makes one per call) and without its
    check for circular references (a dict per call, and an entry in it per container: a fifth of the
    time of a payload of small objects); a value that contains itself nests until RecursionError."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # an interpreter without json's C accelerator
        return json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
    encode = make(None, json.JSONEncoder().default, json.encoder.encode_basestring, None, ":", ",", False, False, False)

    def encode_c(value: Any) -> str:
        return "".join(encode(value, 0))

    return encode_c


_ENCODE_BODY = _body_encoder()


def encode_body(body: Mapping[str, Any]) -> bytes:
    """Compact JSON for a request body; ConfigError for values JSON cannot carry (one nested
    deeper than the interpreter's recursion limit, or containing itself, included)."""
    try:
        text = _ENCODE_BODY(body)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"request body is not JSON-serializable: {exc}") from exc
    except RecursionError:
        raise ConfigError("request body is not JSON-serializable: it nests too deep (or contains itself)") from None
    return text.encode("utf-8")


def _error_from_body(status: int, text: str) -> RunstateError:
    code: str | None = None
    message: str | None = None
    try:
        parsed = json.loads(text) if text else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        error = parsed["error"]
        code = error.get("code") if isinstance(error.get("code"), str) else None
        message = error.get("message") if isinstance(error.get("message"), str) else None
    if message is None and text:
        message = text[:ERROR_BODY_CHARS_MAX]
    return error_from_response(status, code, message)


class _Endpoint(NamedTuple):
    """Where one base URL's requests go."""

    origin: tuple[str, str, int]  # (scheme, host, port): the connection pool's key
    host_header: str
    prefix: str  # the base URL's path, before each request's


def _endpoint(base_url: str) -> _Endpoint:
    parts = urlsplit(base_url)
    scheme = parts.scheme
    host = parts.hostname or ""
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as exc:
            raise ConfigError(f"base_url {base_url!r} names a host that is not a domain name: {exc}") from exc
    default_port = 443 if scheme == "https" else 80
    port = parts.port or default_port
    host_name = f"[{host}]" if ":" in host else host
    host_header = host_name if port == default_port else f"{host_name}:{port}"
    return _Endpoint((scheme, host, port), host_header, _target(parts.path.rstrip("/")))


def _target(path: str) -> str:
    """`path` as a request target: percent-encoded where it holds what a target may not."""
    return path if path.isascii() and not _UNSAFE_IN_TARGET.search(path) else quote(path, safe=_TARGET_SAFE)


def _header_value(value: str, what: str) -> str:
    if _UNSAFE_IN_HEADER.search(value):
        raise ConfigError(f"{what} must not contain line breaks or control characters")
    return value


class Transport:
    """One client's connection to the servers. Create it anywhere; connections open lazily."""

    def __init__(
        self,
        base_urls: list[str],
        *,
        space_id: str | None,
        api_key: str | None,
        holder: str,
        timeout_s: float,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if not base_urls:
            raise ConfigError("base_url lists no URL")
        if timeout_s <= 0:
            raise ConfigError(f"timeout_s must be positive, got {timeout_s!r}")
        self.base_urls = base_urls
        self.space_id = space_id
        self.holder = _header_value(holder, "holder")
        # This client instance among the holder's (a restarted worker has a new one): sent as
        # `holderSession` next to `holder` on every call that creates a lease.
        self.holder_session = secrets.token_hex(8)
        # Mailbox names this client resolved to ids (a mailbox is never renamed or removed).
        self.mailbox_ids: dict[str, str] = {}
        self.timeout_s = timeout_s
        # Set by the client when it coalesces concurrent submits and result waits (_coalesce.py).
        self.submits: SubmitBatcher | None = None
        self.results: ResultBatcher | None = None
        self._api_key = None if api_key is None else _header_value(api_key, "api_key")
        from runstate import __version__  # here: the package imports this module before it sets it

        self._fixed_headers = (*self.headers().items(), ("User-Agent", f"runstate-sdk-python/{__version__}"))
        self._endpoints = {base: _endpoint(base) for base in base_urls}
        self._space_lock = asyncio.Lock()
        self._url_index = 0
        self._pool = ConnectionPool(
            idle_max=IDLE_CONNECTIONS_MAX, connect_timeout_s=CONNECT_TIMEOUT_S, ssl_context=ssl_context
        )
        self._closed = False

    def headers(self) -> dict[str, str]:
        headers = {HEADER_HOLDER: self.holder, "Accept": "application/json"}
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    async def aclose(self) -> None:
        self._closed = True
        self._pool.close()

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Mapping[str, Any] | None = None,
        encoded_body: bytes | None = None,
        params: Mapping[str, str] | None = None,
        safe: bool,
        long_poll_ms: int = 0,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Send one call and return its JSON object.

        A `path` outside API_ROOT is relative to the client's space (see `space`). A call that is
        not a GET on a space's route carries an Idempotency-Key (`idempotency_key`, else a fresh
        one), the same on every retry of the call, so that the server applies it once.
        `encoded_body` is a body already encoded with `encode_body` (instead of `body`).
        Raises the mapped RunstateError for an error answer, OutcomeUnknownError when an unsafe
        call may have been applied without an answer, UnavailableError when no server answered
        within UNAVAILABLE_AFTER_S.
        """
        data = encode_body(body) if body is not None else encoded_body  # ConfigError before any request
        if self._closed:
            raise ConfigError("this client is closed")
        if not path.startswith(API_ROOT):
            path = f"/v1/spaces/{path_segment(await self.space(), 'space id')}{path}"
        headers = list(self._fixed_headers)
        if data is not None:
            headers.append(("Content-Type", "application/json"))
        if method != "GET" and path.startswith("/v1/spaces/") and path.count("/") > 3:
            key = idempotency_key or secrets.token_hex(IDEMPOTENCY_KEY_BYTES)
            headers.append((IDEMPOTENCY_HEADER, _header_value(key, "idempotency key")))
        target = _target(path)
        if params:
            target = f"{target}?{urlencode(params, quote_via=quote)}"
        # A body's length always; an empty POST says it is empty (a GET has none to announce).
        body_bytes = len(data) if data is not None else (None if method in ("GET", "HEAD") else 0)
        timeout_s = self.timeout_s + (long_poll_ms / 1000 + LONG_POLL_MARGIN_S if long_poll_ms > 0 else 0)
        loop = asyncio.get_running_loop()
        give_up_at: float | None = None
        backoff_s = RETRY_BACKOFF_S_INITIAL
        failed_since_pause: set[str] = set()
        while True:
            base = self.base_urls[self._url_index]
            endpoint = self._endpoints[base]
            head = request_head(method, endpoint.prefix + target, endpoint.host_header, headers, body_bytes)
            last_status: int | None = None
            try:
                answer = await self._pool.request(endpoint.origin, head, data, method, timeout_s)
            except HandshakeError as exc:
                # Another attempt would fail the same way: say so now. The next call starts at the
                # next listed server (one node with a bad certificate does not stop a cluster's client).
                self._move_past(base)
                raise TlsError(base, exc.reason) from exc
            except ConnectError as exc:
                # Never reached a server: always safe to try the next one.
                failure = f"cannot connect to {base} ({exc})"
            except AnswerError as exc:
                failure = f"no answer from {base} ({exc})"
                if not safe:
                    raise OutcomeUnknownError(
                        f"{method} {path}: {failure}; the call may or may not have been applied",
                        status=None,
                    ) from exc
            else:
                self._follow_leader(answer.headers.get(LEADER_HEADER_LOWER))
                status = answer.status
                text = answer.text()
                if 200 <= status < 300:
                    return self._decode(status, text, method, path)
                error = _error_from_body(status, text)
                not_received = error.code == NOT_RECEIVED_CODE
                if not not_received and (not isinstance(error, UnavailableError) or not safe):
                    raise error
                failure = f"{base} answered {error}"
                last_status = status
            now = loop.time()
            if give_up_at is None:
                give_up_at = now + UNAVAILABLE_AFTER_S
            if now >= give_up_at:
                raise UnavailableError(
                    f"{method} {path}: no server answered within {UNAVAILABLE_AFTER_S} s "
                    f"(tried {', '.join(self.base_urls)}); last: {failure}",
                    status=last_status,
                )
            logger.debug("retrying %s %s on the next server: %s", method, path, failure)
            self._move_past(base)
            failed_since_pause.add(base)
            if self.base_urls[self._url_index] in failed_since_pause:
                # Every server failed since the last pause (or the next one just did): pause before
                # going round again. Before a server not yet tried, a pause would only add delay.
                logger.debug("every server failed for %s %s: pausing %.2f s", method, path, backoff_s)
                await asyncio.sleep(min(backoff_s, give_up_at - now))
                backoff_s = min(backoff_s * 2, RETRY_BACKOFF_S_MAX)
                failed_since_pause.clear()

    async def space(self) -> str:
        """The space this client works in: `space_id` if given, else the API key's space (asked
        once, from `GET /v1/whoami`; without auth the node's default space)."""
        if self.space_id is None:
            async with self._space_lock:
                if self.space_id is None:
                    identity = await self.request("GET", "/v1/whoami", safe=True)
                    space = identity.get("space")
                    if not isinstance(space, str) or not space:
                        raise RunstateError(
                            "GET /v1/whoami did not name the key's space", code="INVALID_RESPONSE", status=None
                        )
                    self.space_id = space
        return self.space_id

    def _move_past(self, base: str) -> None:
        """Move on from the server `base` that failed, unless a concurrent call already did: calls
        that fail together must not each advance the shared index (by len(urls) they would all land
        on the dead node again)."""
        if self.base_urls[self._url_index] == base:
            self._url_index = (self._url_index + 1) % len(self.base_urls)

    def _follow_leader(self, leader_url: str | None) -> None:
        """A follower that forwarded this call named the leader: talk to it directly from now on
        (one hop less), if it is one of the configured nodes."""
        if leader_url and leader_url in self.base_urls:
            self._url_index = self.base_urls.index(leader_url)

    @staticmethod
    def _decode(status: int, text: str, method: str, path: str) -> dict[str, Any]:
        if not text:
            return {}
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise RunstateError(
                f"{method} {path}: expected a JSON object, got {text[:ERROR_BODY_CHARS_MAX]!r}",
                code="INVALID_RESPONSE",
                status=status,
            )
        return parsed
