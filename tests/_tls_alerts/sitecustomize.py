"""Imported at start by a `runstate dev` that tests/_tls_nodes.py starts with this folder on
PYTHONPATH: asyncio's TLS server then sends its fatal alert when a handshake fails, as a blocking
`ssl` socket, nginx or Go do (CPython gh-98078: asyncio drops the alert and only closes, so a
client cannot tell a refused client certificate from a dropped connection). This is the change
CPython made (python/cpython#153620): flush what OpenSSL left to send before the fatal error.
Remove this folder once the node does it itself."""

from __future__ import annotations

import ssl
from asyncio import sslproto


def _do_handshake(self: sslproto.SSLProtocol) -> None:
    try:
        self._sslobj.do_handshake()  # type: ignore[attr-defined]
    except sslproto.SSLAgainErrors:
        self._process_outgoing()  # type: ignore[attr-defined]
    except ssl.SSLError as exc:
        self._process_outgoing()  # type: ignore[attr-defined]  # the alert
        self._on_handshake_complete(exc)  # type: ignore[attr-defined]
    else:
        self._on_handshake_complete(None)  # type: ignore[attr-defined]


sslproto.SSLProtocol._do_handshake = _do_handshake  # type: ignore[method-assign]
