"""TLS on the API: the node's server context (`--tls-cert`, `--tls-key`, `--tls-client-ca`), and
`runstate certs init`, a private CA with a certificate per node and one for clients.

The server context is the standard library's defaults for a server
(`ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)`) with TLS 1.2 at least; with a client CA it
also requires every client to present a certificate that CA signed (mutual TLS; API keys are still
required on top when auth is on). The files are read once, at start: a missing or unreadable
file, or a key that does not match its certificate, stops the node with one line.

`certs init` writes, with the `cryptography` package (no openssl command): DIR/ca.pem and
DIR/ca.key (the CA, kept to sign more later), DIR/<node>.pem and DIR/<node>.key per node (serverAuth
and clientAuth, so one pair serves the API and, later, the Raft port; SANs: the node's name,
localhost, 127.0.0.1 and every --hosts entry), and DIR/client.pem with DIR/client.key. Keys are
written 0600; an existing file is never overwritten (nothing is written then).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import ssl
import sys
from pathlib import Path

from cryptography import x509

from runstate_server.cluster.private_files import PRIVATE_FILE_MODE
from runstate_server.node.config import ConfigError, TlsFiles

TLS_MINIMUM_VERSION = ssl.TLSVersion.TLSv1_2
CERT_DAYS_DEFAULT = 825  # how long `certs init`'s certificates are valid (the CA's too)
CERT_DAYS_MAX = 36_500  # --days at most (a hundred years)
CERT_NODES_MAX = 64  # --nodes at most; a cluster has at most 7, the rest is headroom for renaming
CERT_HOSTS_MAX = 64  # --hosts entries at most
CERT_NAME_CHARS_MAX = 253  # a node name or host (a DNS name's longest)
CLIENT_NAME = "client"  # DIR/client.pem and DIR/client.key; no node may be named so
CA_NAME = "ca"  # DIR/ca.pem and DIR/ca.key
EC_CURVE_NAME = "secp256r1"  # keys are ECDSA P-256: small, fast, accepted by every TLS 1.2+ client
BACKDATE = datetime.timedelta(minutes=5)  # certificates are valid from a little before now (clock skew)
PUBLIC_FILE_MODE = 0o644  # certificates (public); keys are PRIVATE_FILE_MODE, 0600
EXIT_OK = 0
EXIT_USAGE = 2


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """The API's server context; ConfigError (one line, naming the file) if a file is missing,
    unreadable, not PEM, or the key does not match the certificate."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = TLS_MINIMUM_VERSION
    for path, what in ((files.cert, "--tls-cert"), (files.key, "--tls-key"), (files.client_ca, "--tls-client-ca")):
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as error:
            raise ConfigError(f"cannot read {what} {path}: {error.strerror or error}") from None
    try:
        context.load_cert_chain(files.cert, files.key)
    except ssl.SSLError as error:
        raise ConfigError(
            f"--tls-cert {files.cert} with --tls-key {files.key}: not a PEM certificate and its matching "
            f"private key ({error.reason or error})"
        ) from None
    if files.client_ca is not None:
        try:
            context.load_verify_locations(cafile=files.client_ca)
        except ssl.SSLError as error:
            raise ConfigError(f"--tls-client-ca {files.client_ca}: not PEM CA certificates ({error.reason or error})") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context


# A certificate that expires within this many days is logged as a warning (at start, then daily).
EXPIRY_WARNING_DAYS = 30
EXPIRY_CHECK_EVERY_S = 24 * 3600.0


def expiries(files: dict[str, Path]) -> dict[str, float]:
    """When each certificate (by name: node/tls.py certificate_files) expires, in Unix seconds: for
    GET /metrics and the warning; a CA file's first certificate. A file that cannot be read or
    parsed now is left out (the contexts in use were built from it before)."""
    found: dict[str, float] = {}
    for name, path in files.items():
        try:
            certificate = x509.load_pem_x509_certificate(Path(path).read_bytes())
        except (OSError, ValueError):
            continue
        found[name] = certificate.not_valid_after_utc.timestamp()
    return found


def expiring(files: dict[str, Path], now_s: float) -> list[str]:
    """One line per certificate that expires within EXPIRY_WARNING_DAYS (or has expired)."""
    lines = []
    for name, expires_s in expiries(files).items():
        days = (expires_s - now_s) / 86_400
        if days < EXPIRY_WARNING_DAYS:
            state = f"expires in {days:.1f} days" if days >= 0 else f"expired {-days:.1f} days ago"
            lines.append(
                f"the TLS certificate {files[name]} ({name}) {state}: replace the file (the node reloads it within "
                "seconds, or at once on SIGHUP)"
            )
    return lines


def tls_files(cert: str | Path | None, key: str | Path | None, client_ca: str | Path | None) -> TlsFiles | None:
    """The flags' (or the file's keys') TLS files: None without any; ConfigError for a partial set."""
    if cert is None and key is None and client_ca is None:
        return None
    if cert is None or key is None:
        raise ConfigError("--tls-cert (tls_cert) and --tls-key (tls_key) go together: give both, or neither")
    return TlsFiles(Path(cert), Path(key), Path(client_ca) if client_ca is not None else None)


# -- runstate certs init ----------------------------------------------------------------------------


class CertsError(Exception):
    """`certs init` cannot do what it was asked; the message says why."""


def add_certs_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    certs = commands.add_parser(
        "certs", help="make TLS certificates: a private CA, one certificate per node, one for clients",
    )
    certs_commands = certs.add_subparsers(dest="certs_command", required=True)
    init = certs_commands.add_parser(
        "init",
        help="write a private CA, a certificate and key per node and a client certificate into a directory",
        description="Write DIR/ca.pem (with DIR/ca.key), DIR/<node>.pem and DIR/<node>.key for each node "
        "(server and client use; names: the node's, localhost, 127.0.0.1 and each --hosts entry), and "
        "DIR/client.pem with DIR/client.key. Keys are 0600. Refuses to overwrite any file.",
    )
    init.add_argument("--out", required=True, type=Path, metavar="DIR", help="the directory to write (created if missing)")
    init.add_argument("--nodes", required=True, metavar="N1,N2,...", help="the nodes' names, e.g. n1,n2,n3")
    init.add_argument(
        "--hosts", default="", metavar="NAME_OR_IP,...",
        help="more DNS names or IP addresses every node certificate holds (e.g. the hosts' names)",
    )
    init.add_argument(
        "--days", type=int, default=CERT_DAYS_DEFAULT, metavar="N",
        help=f"how long the certificates are valid (default {CERT_DAYS_DEFAULT}, at most {CERT_DAYS_MAX})",
    )
    init.set_defaults(certs_action=run_certs_init)


def run_certs_init(args: argparse.Namespace) -> int:
    try:
        written = certs_init(args.out, _names(args.nodes, "--nodes"), _names(args.hosts, "--hosts"), args.days)
    except CertsError as error:
        print(f"runstate: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {', '.join(str(path) for path in written)}")
    return EXIT_OK


def _names(text: str, flag: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    for name in names:
        if len(name) > CERT_NAME_CHARS_MAX or not name.isprintable() or any(c in name for c in "/\\ "):
            raise CertsError(f"{flag}: {name[:40]!r} is not a host name or address")
    return names


def certs_init(out: Path, nodes: list[str], hosts: list[str], days: int) -> list[Path]:
    """Write the CA, the node certificates and the client certificate into `out`; the paths written."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not nodes:
        raise CertsError("--nodes needs at least one node name, e.g. --nodes n1,n2,n3")
    if len(nodes) > CERT_NODES_MAX or len(hosts) > CERT_HOSTS_MAX:
        raise CertsError(f"at most {CERT_NODES_MAX} --nodes and {CERT_HOSTS_MAX} --hosts")
    if len(set(nodes)) != len(nodes) or {CA_NAME, CLIENT_NAME} & set(nodes):
        raise CertsError(f"--nodes must be distinct and none named {CA_NAME} or {CLIENT_NAME}")
    if not 1 <= days <= CERT_DAYS_MAX:
        raise CertsError(f"--days must be from 1 to {CERT_DAYS_MAX}, not {days}")
    names = [CA_NAME, *nodes, CLIENT_NAME]
    paths = [out / f"{name}{suffix}" for name in names for suffix in (".pem", ".key")]
    existing = [str(path) for path in paths if os.path.lexists(path)]
    if existing:
        raise CertsError(f"refusing to overwrite {', '.join(existing)}: remove them or choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise CertsError(f"cannot create --out {out}: {error.strerror or error}") from None

    now = datetime.datetime.now(datetime.timezone.utc)
    not_before, not_after = now - BACKDATE, now + datetime.timedelta(days=days)

    def new_key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    ca_key = new_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "runstate private CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common_name: str, usages: list[x509.ObjectIdentifier], sans: list[str]) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = new_key()
        builder = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False,
            )
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName([_san(name) for name in sans]), critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    pairs = [(CA_NAME, ca_cert, ca_key)]
    for node in nodes:
        sans = list(dict.fromkeys([node, "localhost", "127.0.0.1", *hosts]))
        cert, key = leaf(node, [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], sans)
        pairs.append((node, cert, key))
    client_cert, client_key = leaf(CLIENT_NAME, [ExtendedKeyUsageOID.CLIENT_AUTH], [])
    pairs.append((CLIENT_NAME, client_cert, client_key))

    written: list[Path] = []
    try:
        for name, cert, key in pairs:
            key_path, cert_path = out / f"{name}.key", out / f"{name}.pem"
            _write_new(key_path, key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption(),
            ), private=True)
            written.append(key_path)
            _write_new(cert_path, cert.public_bytes(serialization.Encoding.PEM), private=False)
            written.append(cert_path)
    except OSError as error:
        raise CertsError(f"cannot write into {out}: {error.strerror or error} (wrote {len(written)} files)") from None
    return written


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write_new(path: Path, data: bytes, *, private: bool) -> None:
    """Write a file that must not exist yet (O_EXCL): keys 0600 whatever the umask, certificates 0644."""
    mode = PRIVATE_FILE_MODE if private else PUBLIC_FILE_MODE
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    with os.fdopen(descriptor, "wb") as file:
        if private:
            os.fchmod(descriptor, PRIVATE_FILE_MODE)
        file.write(data)
