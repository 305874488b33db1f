"""aiohttp, the API's HTTP server: everything of it the project touches beyond its public API, checked at import.

node/http_server.py extends aiohttp from the inside, to put a bound on everything a client can
hold: it subclasses aiohttp's connection protocol (`RequestHandler`, from the internal module
aiohttp.web_protocol), overrides its methods, reads and sets its private attributes, and replaces
the server a runner makes. Every module of the project imports aiohttp's internals through this
one, and this module declares each name reached beyond aiohttp's documented API (a `Seam` of
runstate_server/_seams.py) and checks them all when it is first
imported: a release other than 3.14.x (the range pyproject.toml pins), or one that renamed any of
them, stops the node at start with a message naming aiohttp, its version and the missing name
(runstate_server/node/cli.py). A renamed one would not fail by itself: an override aiohttp no
longer calls is dead code, and a header deadline, the connection cap or the JSON error envelope
would switch off without a word.

The seams, by class (all used by node/http_server.py, `request.protocol` by node/api/_poll.py too):

- `aiohttp.web_protocol.RequestHandler`, subclassed by `Connection`:
  - `connection_made`, `connection_lost`, `data_received` (asyncio calls them): `Signature`, that
    aiohttp itself still defines each with the same parameters, so `super()` reaches aiohttp's
    code and not asyncio.Protocol's no-op. connection_made admits the connection under the cap;
    connection_lost frees its place and ends its long poll; data_received arms the header
    deadline and counts a request's head complete.
  - `finish_response(request, resp, start_time)`, `handle_error(request, status, exc, message)`:
    `Signature(called=True)`: aiohttp's own code still calls them (as an `Override`), with the
    same parameters in the same order (aiohttp passes them positionally). finish_response arms the send deadline and
    marks the connection idle; handle_error answers aiohttp's 400 and 500 with the JSON envelope.
  - `__init__`'s `manager`, `loop`, `keepalive_timeout`, `access_log`, `max_line_size`,
    `max_field_size`, `max_headers`, `lingering_time`: `Signature`. `LimitedServer.__call__`
    builds a Connection with them without aiohttp's fallback for a keyword it no longer takes, so
    a renamed one would fail every connection instead of the start.
  - `_force_close`, `_close` (read: a closing connection reads nothing), `_request_count` (read: a
    head completed), `_waiter` (read: waiting for the next request), `_manager` (set to None: a
    refused connection has nothing for connection_lost to undo), `_loop` (the deadlines' timers),
    `transport` (the late head's 408 and the send deadline): `Attribute`.
  - `force_close`, `close`: `Method` (a deadline or a displaced idle connection closes it).
- `aiohttp.web.Server`, subclassed by `LimitedServer`: `__call__` (`Signature`: our override
  makes every connection a Connection, asyncio calls it); `_loop` and `_kwargs` (read, to build a
  Connection as aiohttp's own `__call__` does) and `request_handler`, `request_factory`,
  `handler_cancellation` (read from the server AppRunner made, to build ours the same):
  `Attribute`; `__init__`'s `handler`, `request_factory`, `handler_cancellation`, `loop`: `Signature`.
- `aiohttp.web.AppRunner`: `_make_server` (`Override`: `setup` calls it; `Runner` serves through a
  LimitedServer) and `_kwargs` (`Attribute`: the protocol's keywords, handed on to LimitedServer).
- `aiohttp.web.BaseSite`, subclassed by `Site` (which accepts one connection at a time): `_runner`,
  `_backlog`, `name` (`Attribute`); `start`, `stop` (`Method`, each called through `super()`), and
  `CalledBy(BaseRunner.cleanup, "stop")`: the runner's cleanup stops our Site, which ends its
  accept loop.
- `aiohttp.web.BaseRequest`: `protocol` (the request's Connection: its shed flag, its body
  deadline, its long poll) and `writer` (`Attribute`); `aiohttp.abc.AbstractStreamWriter.output_size`
  (`Attribute`: an answer partly sent cannot be replaced by an error envelope).
- `aiohttp.streams.StreamReader` (a request's body): `is_eof`, `set_exception`, `feed_eof`
  (`Method`; `set_exception`'s first parameter by `Signature`): a late body is ended with
  REQUEST_TIMEOUT.

Beyond these, the project uses aiohttp's public API only (`aiohttp.web`, the client). Our own
subclasses must not shadow a name aiohttp's classes define or store, or aiohttp's code would
read ours: `check_own_names`, which node/http_server.py calls on its four classes at import.
tests/test_aiohttp_seams.py holds the list to http_server.py's code and checks in real processes
that a missing name stops a node and that the overrides are called.
"""

from __future__ import annotations

from typing import Any

from runstate_server._seams import (
    LOCK_HINT,
    Attribute,
    CalledBy,
    DependencyMismatch,
    Method,
    Override,
    Seam,
    Signature,
    attributes_stored,
    check,
    installed_version,
    stores_attribute,
)

DISTRIBUTION = "aiohttp"
PACKAGE = "aiohttp"
# The minor release the whole test suite passed with; pyproject.toml pins the same range.
TESTED_MINOR = "3.14"
TESTED_TEXT = f"{TESTED_MINOR}.x"

try:
    from aiohttp import web
    from aiohttp.abc import AbstractStreamWriter
    from aiohttp.streams import StreamReader
    from aiohttp.web_protocol import RequestHandler
except ImportError as error:  # a module or name moved or gone: the same refusal as a missing seam
    raise DependencyMismatch(
        f"{DISTRIBUTION} {installed_version(DISTRIBUTION)} lacks what runstate imports: {error}; runstate was "
        f"tested with {DISTRIBUTION} {TESTED_TEXT}: {LOCK_HINT}"
    ) from error

__all__ = ["SEAMS", "RequestHandler", "StreamReader", "check_own_names", "check_seams", "tested"]


_SERVER = "node/http_server.py"
# Names Python itself gives every class of an ABC (abc.ABCMeta's cache), not names of ours.
_CLASS_MACHINERY = frozenset({"_abc_impl"})
_POLL = "node/api/_poll.py"


def _connection_seams() -> list[Seam]:
    asyncio_callbacks = {"connection_made": ("transport",), "connection_lost": ("exc",), "data_received": ("data",)}
    overridden = {
        "finish_response": ("request", "resp", "start_time"),
        "handle_error": ("request", "status", "exc", "message"),
    }
    protocol_keywords = (
        "manager", "loop", "keepalive_timeout", "access_log", "max_line_size", "max_field_size", "max_headers",
        "lingering_time",
    )
    attributes = ("_force_close", "_close", "_request_count", "_waiter", "_manager", "_loop", "transport")
    return [
        *(Signature(RequestHandler, name, _SERVER, parameters) for name, parameters in asyncio_callbacks.items()),
        *(Signature(RequestHandler, name, _SERVER, parameters, called=True) for name, parameters in overridden.items()),
        Signature(RequestHandler, "__init__", f"{_SERVER} (LimitedServer.__call__)", protocol_keywords, exact=False),
        *(Attribute(RequestHandler, name, _SERVER) for name in attributes),
        Method(RequestHandler, "force_close", _SERVER),
        Method(RequestHandler, "close", _SERVER),
    ]


def _server_seams() -> list[Seam]:
    attributes = ("_loop", "_kwargs", "request_handler", "request_factory", "handler_cancellation")
    return [
        Signature(web.Server, "__call__", _SERVER, ()),
        Signature(
            web.Server, "__init__", _SERVER, ("handler", "request_factory", "handler_cancellation", "loop"), exact=False
        ),
        *(Attribute(web.Server, name, _SERVER) for name in attributes),
        Override(web.AppRunner, "_make_server", _SERVER),
        Attribute(web.AppRunner, "_kwargs", _SERVER),
        Attribute(web.BaseSite, "_runner", _SERVER),
        Attribute(web.BaseSite, "_backlog", _SERVER),
        Attribute(web.BaseSite, "name", _SERVER),
        Method(web.BaseSite, "start", _SERVER),
        Method(web.BaseSite, "stop", _SERVER),
        CalledBy(web.BaseRunner, "cleanup", f"{_SERVER} (Site.stop ends its accept loop)", called="stop"),
    ]


def _request_seams() -> list[Seam]:
    return [
        Attribute(web.BaseRequest, "protocol", f"{_SERVER}, {_POLL}"),
        Attribute(web.BaseRequest, "writer", _SERVER),
        Attribute(AbstractStreamWriter, "output_size", _SERVER),
        Method(StreamReader, "is_eof", _SERVER),
        Method(StreamReader, "feed_eof", _SERVER),
        Signature(StreamReader, "set_exception", _SERVER, ("exc",), exact=False),
    ]


SEAMS: tuple[Seam, ...] = (*_connection_seams(), *_server_seams(), *_request_seams())


def tested(version: str) -> bool:
    """`version` is a release of the tested minor (3.14.x), pre-releases included."""
    return version == TESTED_MINOR or version.startswith(f"{TESTED_MINOR}.")


def check_seams() -> None:
    """DependencyMismatch unless aiohttp is a tested release with every seam in place."""
    check(DISTRIBUTION, PACKAGE, tested, TESTED_TEXT, SEAMS)


def own_names(ours: type) -> frozenset[str]:
    """The names `ours` (a project's subclass) defines or stores, dunders aside."""
    names = set(vars(ours)) | set(getattr(ours, "__slots__", ())) | attributes_stored(ours, ours.__module__.split(".")[0])
    return frozenset(
        name for name in names - _CLASS_MACHINERY if not (name.startswith("__") and name.endswith("__"))
    )


def shadowed(ours: type) -> frozenset[str]:
    """The names of `ours` that one of aiohttp's classes it extends defines or stores too, but
    those declared as overrides in SEAMS."""
    bases = [klass for klass in ours.__mro__ if klass.__module__.split(".")[0] == PACKAGE]
    declared = {seam.name for seam in SEAMS if isinstance(seam.owner, type) and seam.owner in bases}
    return frozenset(
        name for name in own_names(ours) - declared
        if any(hasattr(base, name) or stores_attribute(base, PACKAGE, name) for base in bases)
    )


def check_own_names(*classes: Any) -> None:
    """DependencyMismatch when one of our subclasses of aiohttp's classes uses a name aiohttp's
    code uses too (an aiohttp release that added it would read or overwrite ours)."""
    clashes = {ours.__qualname__: sorted(names) for ours in classes if (names := shadowed(ours))}
    if clashes:
        lines = "; ".join(f"{name} shadows {', '.join(names)}" for name, names in clashes.items())
        raise DependencyMismatch(
            f"{DISTRIBUTION} {installed_version(DISTRIBUTION)} uses names runstate's subclasses use too ({_SERVER}): "
            f"{lines}. runstate was tested with {DISTRIBUTION} {TESTED_TEXT}: {LOCK_HINT}"
        )


check_seams()
