"""HTTPS dev nodes for the SDKs' TLS tests (tests/test_sdk_tls.py, tests/test_typescript_sdk.py):
a private CA (`certs init`), a second CA, server certificates the CA signs with chosen names and
validity (an expired one, one for another host), and `runstate dev` serving them."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from runstate_server.node.certs import certs_init
from tests.test_tls import TlsDevNode, client_context

CERT_DAYS = 30  # the test CAs' certificates' validity


def make_ca(directory: Path) -> Path:
    """`runstate certs init`'s files for one node, `n1`, in `directory`."""
    certs_init(directory, ["n1"], [], CERT_DAYS)
    return directory


def sign_server_certificate(
    ca: Path, name: str, hosts: list[str], *, expired: bool = False, client_too: bool = False,
) -> tuple[Path, Path]:
    """ca/<name>.pem and .key: a server certificate `ca`'s CA signs for `hosts` (DNS names or IP
    addresses), valid now, or expired a day ago; `client_too`: for clients too (a Raft peer's)."""
    ca_cert = x509.load_pem_x509_certificate((ca / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((ca / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = (now - datetime.timedelta(days=10), now - datetime.timedelta(days=1)) if expired else (
        now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=CERT_DAYS))
    certificate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([_general_name(host) for host in hosts]), critical=False)
        .add_extension(x509.ExtendedKeyUsage(
            [ExtendedKeyUsageOID.SERVER_AUTH, *([ExtendedKeyUsageOID.CLIENT_AUTH] if client_too else [])]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem, key_path = ca / f"{name}.pem", ca / f"{name}.key"
    pem.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    key_path.chmod(0o600)
    return pem, key_path


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def unverified_context() -> ssl.SSLContext:
    """For asking the health of a node whose certificate does not verify (on purpose)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@contextmanager
def https_node(
    data_dir: Path, ca: Path, *, cert: str = "n1", client_ca: Path | None = None,
    health: ssl.SSLContext | None = None,
) -> Iterator[TlsDevNode]:
    """`runstate dev` serving ca/<cert>.pem over HTTPS (with `client_ca`: mutual TLS), stopped at the end."""
    if health is None:
        health = client_context(ca, client="client" if client_ca is not None else None)
    args = ["--tls-cert", str(ca / f"{cert}.pem"), "--tls-key", str(ca / f"{cert}.key")]
    if client_ca is not None:
        args += ["--tls-client-ca", str(client_ca / "ca.pem")]
    node = TlsDevNode(data_dir, health, *args)
    try:
        node.start()
        yield node
    finally:
        node.stop()
