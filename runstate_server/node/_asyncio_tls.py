"""asyncio's TLS: a handshake that fails sends its alert, checked at import (a seam, as
node/_aiohttp.py's).

asyncio's TLS protocol (`asyncio.sslproto.SSLProtocol`, which serves the API's HTTPS and dials
the leader's) drops the fatal alert OpenSSL writes when a handshake fails, and only closes the
connection (CPython gh-98078, fixed upstream by python/cpython#153620; Python 3.11 has the bug):
a client the node refuses (no client certificate under `--tls-client-ca`, one of another CA) saw a
dropped connection, which it retries as it would a restart, and not why. `_do_handshake` below is
CPython's with that fix: what OpenSSL left to send (the alert) is flushed before the error is
handled. The SDKs then raise TlsError at once, naming the alert (e.g.
TLSV13_ALERT_CERTIFICATE_REQUIRED, TLSV1_ALERT_UNKNOWN_CA).

Installed by `install()` (node/http_server.py, at import), on Python 3.11 and later, whose TLS
protocol this is (3.10's is another, `_SSLPipe`, which drops the alert too: a client of a node on
3.10 sees a refused certificate as a dropped connection). The names it replaces and calls are
declared as seams and checked first: a Python whose asyncio renamed any of them stops the node at
start with a message naming it (node/cli.py), rather than serving without the fix or failing every
handshake.
"""

from __future__ import annotations

import ssl
import sys
from asyncio import sslproto

from runstate_server._seams import Attribute, Constant, DependencyMismatch, Method, Override, Seam

# The first Python whose asyncio TLS protocol is the one `_do_handshake` below belongs to.
PYTHON_WITH_THIS_PROTOCOL = (3, 11)
_USED_BY = "node/_asyncio_tls.py (a failed TLS handshake sends its alert)"
SEAMS: tuple[Seam, ...] = (
    Override(sslproto.SSLProtocol, "_do_handshake", _USED_BY),
    Method(sslproto.SSLProtocol, "_process_outgoing", _USED_BY),
    Method(sslproto.SSLProtocol, "_on_handshake_complete", _USED_BY),
    Attribute(sslproto.SSLProtocol, "_sslobj", _USED_BY),
    Constant(sslproto, "SSLAgainErrors", _USED_BY),
)


def _do_handshake(self: sslproto.SSLProtocol) -> None:
    """CPython's SSLProtocol._do_handshake, with the alert flushed on a failure (module docstring)."""
    try:
        self._sslobj.do_handshake()  # type: ignore[attr-defined]
    except sslproto.SSLAgainErrors:  # type: ignore[attr-defined]
        self._process_outgoing()  # type: ignore[attr-defined]
    except ssl.SSLError as exc:
        self._process_outgoing()  # type: ignore[attr-defined]  # the fatal alert OpenSSL wrote
        self._on_handshake_complete(exc)  # type: ignore[attr-defined]
    else:
        self._on_handshake_complete(None)  # type: ignore[attr-defined]


def check_seams() -> None:
    """DependencyMismatch unless this Python's asyncio has every name `_do_handshake` relies on."""
    problems = [(seam, problem) for seam in SEAMS if (problem := seam.problem("asyncio")) is not None]
    if problems:
        lines = "; ".join(f"{problem} (used by {seam.used_by})" for seam, problem in problems)
        raise DependencyMismatch(f"Python {sys.version.split()[0]}'s asyncio lacks what runstate reaches for: {lines}")


def install() -> None:
    """Check the seams, then make asyncio send a failed handshake's alert (idempotent; nothing on 3.10)."""
    if sys.version_info < PYTHON_WITH_THIS_PROTOCOL:
        return
    if sslproto.SSLProtocol._do_handshake is _do_handshake:  # type: ignore[attr-defined]
        return
    check_seams()
    sslproto.SSLProtocol._do_handshake = _do_handshake  # type: ignore[attr-defined]
