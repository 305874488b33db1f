"""What a request must be before anything reads it: a body is JSON, and a node without keys is
reached from this machine only.

A browser may send a "simple" cross-site request without asking the server first (no CORS
preflight): a POST whose body is `text/plain`, a form, or no body at all. Two rules keep a page on
another site from driving a node:

- Every request that has a body says `Content-Type: application/json` (or `application/<x>+json`;
  a `charset` parameter, if any, is UTF-8). Anything else is 415 UNSUPPORTED_MEDIA_TYPE, so a
  browser can only send a body the node reads after a preflight, which the node never answers
  (it sends no CORS headers). A POST without a body needs no content type.
- A node without auth (`runstate dev` without --auth, loopback only) refuses, 403
  FORBIDDEN_ORIGIN, a request whose `Origin` is not a loopback origin (a page elsewhere: no
  preflight covers a POST without a body) and one whose `Host` is not a loopback name or address
  or the node's own host (DNS rebinding: a name of the attacker's that resolves to 127.0.0.1 makes
  the page same-origin with the node, and only the Host header tells). Clients that are not
  browsers send no Origin and a loopback Host.

A node with auth ignores `Origin` and `Host`: browsers never attach a bearer key by themselves, so
a cross-site request reaches no route without one (401), and without CORS headers a page cannot
read an answer. Cluster nodes always require keys, so a request a follower forwards to the leader
(with the leader's Host) meets the content-type rule only, which it passed on the first node.
"""

from __future__ import annotations

import functools
import ipaddress
from urllib.parse import urlsplit

from aiohttp import web

from runstate_server.node.api.routes import NODE_KEY, Handler
from runstate_server.node.errors import ApiError

JSON_MEDIA_TYPE = "application/json"
_JSON_SUFFIX = "+json"
_UTF8_CHARSETS = frozenset({"utf-8", "utf8"})
_LOOPBACK_NAMES = frozenset({"localhost"})
_ORIGIN_SCHEMES = frozenset({"http", "https"})
# Origin and Host values whose verdict is remembered (a client sends the same few on every call).
_VERDICTS_CACHED_MAX = 256


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    node = request.app[NODE_KEY]
    if not node.config.auth:
        _refuse_foreign_origin(request, node.config.host)
    await _refuse_other_media_types(request)
    return await handler(request)


def is_json_media_type(content_type: str) -> bool:
    """`application/json` or `application/<x>+json`, with no parameter but a UTF-8 charset."""
    media_type, *parameters = content_type.split(";")
    media_type = media_type.strip().lower()
    if media_type != JSON_MEDIA_TYPE and not (
        media_type.startswith("application/") and media_type.endswith(_JSON_SUFFIX)
    ):
        return False
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in _UTF8_CHARSETS:
            return False
    return True


async def _refuse_other_media_types(request: web.Request) -> None:
    if not request.body_exists:
        return
    content_type = request.headers.get("Content-Type")
    if content_type is not None and is_json_media_type(content_type):
        return
    if request.content_length is None:  # chunked: it may turn out empty
        try:
            if not await request.read():
                return
        except web.HTTPRequestEntityTooLarge:
            pass
    elif request.content_length == 0:
        return
    raise ApiError(
        "UNSUPPORTED_MEDIA_TYPE",
        f"a request body must be JSON, sent as Content-Type: {JSON_MEDIA_TYPE}, not {content_type or 'none'}",
    )


def _refuse_foreign_origin(request: web.Request, own_host: str) -> None:
    origin = request.headers.get("Origin")
    if origin is not None and not _is_loopback_origin(origin):
        raise ApiError(
            "FORBIDDEN_ORIGIN",
            "this node runs without auth and serves only this machine: a request from a web page of "
            "another origin is refused (start the node with --auth to serve other machines)",
        )
    host = request.headers.get("Host")
    if host is not None and not _is_own_host(host, own_host):
        raise ApiError(
            "FORBIDDEN_ORIGIN",
            "this node runs without auth and serves only this machine: the Host header must name a "
            "loopback address or the node's own host",
        )


@functools.lru_cache(maxsize=_VERDICTS_CACHED_MAX)
def _is_loopback_origin(origin: str) -> bool:
    try:
        parts = urlsplit(origin.strip())
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError:
        return False
    if parts.scheme not in _ORIGIN_SCHEMES or parts.username is not None or parts.path or parts.query:
        return False
    return _is_loopback_name(parts.hostname)


@functools.lru_cache(maxsize=_VERDICTS_CACHED_MAX)
def _is_own_host(host: str, own_host: str) -> bool:
    try:
        parts = urlsplit("//" + host.strip())
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError:
        return False
    if parts.username is not None or parts.path or parts.query or parts.fragment:
        return False
    return _is_loopback_name(parts.hostname) or (parts.hostname is not None and parts.hostname == own_host.lower())


def _is_loopback_name(name: str | None) -> bool:
    if not name:
        return False
    if name in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
