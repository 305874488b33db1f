"""A node's TLS material, reloaded without a restart (docs/tls.md; DESIGN.md "Mutual TLS on the Raft port").

`NodeTls` holds:
- the API's server context (`--tls-cert`, `--tls-key`, `--tls-client-ca`; node/certs.py);
- the context the node dials other nodes' HTTPS APIs with (a follower forwarding to the leader,
  membership and replica checks): it verifies them against `--tls-ca` (the system's CAs without
  it) and presents the node's own API certificate, so peers that require client certificates
  take it;
- the Raft port's contexts (`--peer-tls-*`, cluster/peer_tls.py `PeerTls`).

`reload()` reads every file again and replaces each context whose files still make one; a part
whose files do not (a half-written certificate, a key that no longer matches) keeps the context in
use and is named in the log line. It runs on SIGHUP and when a file's modification time or size
changed (checked every TLS_FILES_CHECK_EVERY_S). A connection already up keeps its own; each
new one uses the new certificate.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable
from pathlib import Path

import aiohttp

from runstate_server.cluster.peer_tls import PeerTls, PeerTlsError
from runstate_server.node.certs import TLS_MINIMUM_VERSION, server_context
from runstate_server.node.config import ConfigError, NodeConfig, TlsFiles

log = logging.getLogger(__name__)

# How often the node looks at its TLS files' modification times and sizes for a change.
TLS_FILES_CHECK_EVERY_S = 5.0


def client_context(ca: Path | None, own: TlsFiles | None) -> ssl.SSLContext:
    """The context for dialling another node's HTTPS API: verify it against `ca` (None: the
    system's CAs), present `own` certificate (the node's API certificate) when there is one.
    ConfigError naming the file if one cannot be used."""
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    except (OSError, ssl.SSLError) as error:
        raise ConfigError(f"--tls-ca {ca}: not readable PEM CA certificates ({getattr(error, 'reason', None) or error})") from None
    context.minimum_version = TLS_MINIMUM_VERSION
    if own is not None:
        try:
            context.load_cert_chain(own.cert, own.key)
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(f"--tls-cert {own.cert} with --tls-key {own.key}: {getattr(error, 'reason', None) or error}") from None
    return context


# What a certificate file is, by the name GET /metrics gives it.
def certificate_files(config: NodeConfig) -> dict[str, Path]:
    """The certificates a node serves or trusts, by name: api, client_ca, ca, peer, peer_ca."""
    files: dict[str, Path | None] = {"ca": config.tls_ca}
    if config.tls is not None:
        files.update(api=config.tls.cert, client_ca=config.tls.client_ca)
    if config.peer_tls is not None:
        files.update(peer=config.peer_tls.cert, peer_ca=config.peer_tls.ca)
    return {name: path for name, path in files.items() if path is not None}


class NodeTls:
    """A node's TLS contexts (module docstring). Each is an attribute replaced whole by `reload`."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.server: ssl.SSLContext | None = server_context(config.tls) if config.tls is not None else None
        self.client = client_context(config.tls_ca, config.tls)
        try:
            self.peer = PeerTls(config.peer_tls) if config.peer_tls is not None else None
        except PeerTlsError as error:
            raise ConfigError(str(error)) from None
        self.reloads = 0  # reloads that replaced every context
        self.reload_failures = 0  # reloads that kept a context (its files could not be used)
        self.on_server_context: Callable[[ssl.SSLContext], None] | None = None  # the API site's hook
        self._stamps = self._file_stamps()

    def _file_stamps(self) -> dict[Path, tuple[int, int] | None]:
        paths = set(certificate_files(self.config).values())
        for files in (self.config.tls, self.config.peer_tls):
            if files is not None:
                paths.add(files.key)
        stamps: dict[Path, tuple[int, int] | None] = {}
        for path in sorted(paths):
            try:
                status = os.stat(path)
                stamps[path] = (status.st_mtime_ns, status.st_size)
            except OSError:
                stamps[path] = None
        return stamps

    def reload(self, why: str) -> list[str]:
        """Read the files again; the problems (a part kept its context), none when all were replaced."""
        self._stamps = self._file_stamps()
        problems: list[str] = []
        if self.config.tls is not None:
            try:
                server = server_context(self.config.tls)
            except ConfigError as error:
                problems.append(f"the API's: {error}")
            else:
                self.server = server
                if self.on_server_context is not None:
                    self.on_server_context(server)
        try:
            self.client = client_context(self.config.tls_ca, self.config.tls)
        except ConfigError as error:
            problems.append(f"for other nodes' APIs: {error}")
        if self.peer is not None:
            try:
                self.peer.reload()
            except PeerTlsError as error:
                problems.append(f"the Raft port's: {error}")
        if problems:
            self.reload_failures += 1
            log.warning("TLS files reloaded (%s), but kept the certificates in use for %s", why, "; ".join(problems))
        else:
            self.reloads += 1
            # A warning so that the default log level shows it: the operator's rotation took effect.
            log.warning("TLS files reloaded (%s): new connections use them", why)
        return problems

    @property
    def any(self) -> bool:
        return self.config.tls is not None or self.config.peer_tls is not None or self.config.tls_ca is not None

    async def watch(self) -> None:
        """Reload whenever a file changed (checked every TLS_FILES_CHECK_EVERY_S); runs until cancelled."""
        while True:
            await asyncio.sleep(TLS_FILES_CHECK_EVERY_S)
            if self._file_stamps() != self._stamps:
                self.reload("a file changed")  # a few small files: read on the loop, as SIGHUP's reload is


class PeerSession:
    """An aiohttp session for other nodes' APIs, made again after a reload changed the client
    context (a connector keeps the context it was made with). Loop only."""

    def __init__(self, tls: NodeTls, timeout: aiohttp.ClientTimeout) -> None:
        self._tls = tls
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._context: ssl.SSLContext | None = None

    async def get(self) -> aiohttp.ClientSession:
        if self._session is not None and self._context is self._tls.client:
            return self._session
        await self.close()
        self._context = self._tls.client
        self._session = aiohttp.ClientSession(timeout=self._timeout, connector=aiohttp.TCPConnector(ssl=self._context))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def __aenter__(self) -> PeerSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
