"""Mutual TLS on the Raft port (`--peer-tls-cert`, `--peer-tls-key`, `--peer-tls-ca`; DESIGN.md
"Mutual TLS on the Raft port").

Both ends of a Raft connection present a certificate and verify the other's against the peer CA
before any Raft frame is read: the dialling node checks that the certificate names the host it
dialled (as a browser does), the accepting one that it names the host of the Raft address the
peer then gives as its own (a learner, which names no address, needs a certificate for servers:
what `runstate certs init` gives a node and not a client). Inside TLS the frames are not sealed
with the cluster password (TLS seals them); pysyncobj's key exchange still runs, unsealed, so
the connection's protocol is the one it always was.

`PeerTls` holds the two contexts (the accepting and the dialling side) and replaces them whole on
`reload()`: a connection made afterwards uses the new certificate, one already up keeps its own.
With `allow_plain` (`--peer-tls-allow-plain`, for moving a running cluster from the password to
certificates one node at a time) a node also accepts a connection that does not start with a TLS
record, sealed with the password as before, and dials a peer without TLS after a TLS handshake
with it failed for another reason than its certificate.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

PEER_TLS_MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
# A TLS connection starts with a handshake record: type 22, then the protocol version's major byte
# 3. pysyncobj's first frame starts with its length, a native int of at most a few KiB before the
# handshake (HANDSHAKE_FRAME_BYTES_MAX): its third byte is 0, a TLS record's (the minor version) 1
# to 4. So three bytes tell them apart.
TLS_SNIFF_BYTES = 3
_TLS_HANDSHAKE_RECORD = 22
_TLS_MAJOR_VERSION = 3


class PeerTlsError(Exception):
    """A peer TLS file cannot be used; the message names the flag and the file."""


@dataclass(frozen=True, slots=True)
class PeerTlsFiles:
    """The Raft port's certificate chain and key, and the CA every peer's certificate must chain to."""

    cert: Path
    key: Path
    ca: Path
    allow_plain: bool = False  # also speak the password-sealed frames without TLS (a cluster moving to certificates)


def contexts(files: PeerTlsFiles) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(accepting, dialling) contexts: each presents the node's certificate and requires the
    peer's, verified against the peer CA; TLS 1.2 at least. PeerTlsError for a file that is
    missing, not PEM, or a key that does not match its certificate."""
    accepting = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    dialling = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    for context in (accepting, dialling):
        context.minimum_version = PEER_TLS_MINIMUM_VERSION
        try:
            context.load_cert_chain(files.cert, files.key)
        except OSError as error:
            raise PeerTlsError(
                f"--peer-tls-cert {files.cert} with --peer-tls-key {files.key}: "
                f"{_reason(error)}"
            ) from None
        try:
            context.load_verify_locations(cafile=files.ca)
        except OSError as error:
            raise PeerTlsError(f"--peer-tls-ca {files.ca}: {_reason(error)}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    dialling.check_hostname = True
    return accepting, dialling


def _reason(error: OSError) -> str:
    if isinstance(error, ssl.SSLError):
        return f"not a PEM certificate and its matching private key, or not PEM CA certificates ({error.reason or error})"
    return f"cannot read it ({error.strerror or error})"


class PeerTls:
    """The Raft port's TLS contexts (module docstring). `contexts` is one tuple, replaced whole:
    the tick thread reads it, `reload` (any thread) replaces it."""

    def __init__(self, files: PeerTlsFiles) -> None:
        self.files = files
        self.allow_plain = files.allow_plain
        self.contexts = contexts(files)

    def reload(self) -> None:
        """Read the files again (PeerTlsError, keeping the contexts in use, if they cannot be used)."""
        self.contexts = contexts(self.files)

    def wrap(self, sock: Any, *, server_hostname: str | None) -> ssl.SSLSocket:
        """`sock` (connected, non-blocking) as the accepting side (server_hostname None) or the
        dialling one; its handshake is left to the caller (do_handshake until it is done)."""
        accepting, dialling = self.contexts
        if server_hostname is None:
            return accepting.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return dialling.wrap_socket(sock, server_hostname=server_hostname, do_handshake_on_connect=False)


def looks_like_tls(prefix: bytes) -> bool:
    """Whether a connection's first TLS_SNIFF_BYTES bytes are a TLS handshake record's."""
    return (
        len(prefix) >= TLS_SNIFF_BYTES and prefix[0] == _TLS_HANDSHAKE_RECORD and prefix[1] == _TLS_MAJOR_VERSION
        and prefix[2] != 0
    )


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    """What a verified peer certificate says: its DNS and IP names, and whether it is for servers."""

    names: frozenset[str]
    server: bool


def peer_identity(sock: ssl.SSLSocket) -> PeerIdentity:
    """The identity of a verified peer's certificate (after its handshake)."""
    der = sock.getpeercert(binary_form=True)
    if not der:
        return PeerIdentity(frozenset(), False)
    certificate = x509.load_der_x509_certificate(der)
    names: set[str] = set()
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        sans = None
    if sans is not None:
        names.update(name.lower() for name in sans.get_values_for_type(x509.DNSName))
        names.update(str(address) for address in sans.get_values_for_type(x509.IPAddress))
    try:
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        server = ExtendedKeyUsageOID.SERVER_AUTH in usages
    except x509.ExtensionNotFound:
        server = True  # no restriction on the key's use
    return PeerIdentity(frozenset(names), server)


def names_host(identity: PeerIdentity, host: str) -> bool:
    """Whether the certificate names `host` (a DNS name, any case, or an IP address)."""
    return host.lower() in identity.names
