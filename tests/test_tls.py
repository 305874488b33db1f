"""HTTPS on the API (node/certs.py, node/http_server.py) against real `runstate dev` processes, with
the certificates `runstate certs init` writes: a client trusting the CA is served, one that does
not is refused by its own verification, plain HTTP and a stalled handshake are closed without a
traceback, mutual TLS refuses a client without a certificate of the CA, and bad TLS flags stop the
node at start with one line."""

from __future__ import annotations

import json
import os
import socket
import ssl
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from runstate_server.node.certs import certs_init
from runstate_server.node.config import NodeConfig, TlsFiles
from runstate_server.node.http_server import TLS_HANDSHAKES_MAX
from tests._nodes import DevNode

NODES = ("n1", "n2", "n3")
ANSWER_TIMEOUT_S = 10.0  # a client's wait for an answer or a close, far above the deadlines set here
CLI_TIMEOUT_S = 60.0
HEALTH_PATH = "/v1/health"


def runstate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", *args],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs") / "tls"
    done = runstate("certs", "init", "--out", str(out), "--nodes", ",".join(NODES), "--hosts", "db.example,10.1.2.3")
    assert done.returncode == 0, done.stderr
    return out


def client_context(certs: Path, *, client: str | None = None, ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca or certs / "ca.pem"))
    if client is not None:
        context.load_cert_chain(certs / f"{client}.pem", certs / f"{client}.key")
    return context


class TlsDevNode(DevNode):
    """`runstate dev` serving HTTPS; health is asked over HTTPS as a client trusting `ca` would."""

    def __init__(self, data_dir: Path, context: ssl.SSLContext, *extra_args: str) -> None:
        super().__init__(data_dir, "--log-level", "INFO", *extra_args)
        self.url = f"https://127.0.0.1:{self.port}"
        self.context = context

    def health_status(self) -> str:
        return get_health(self, self.context)


def get_health(node: DevNode, context: ssl.SSLContext) -> str:
    with urllib.request.urlopen(f"{node.url}{HEALTH_PATH}", timeout=ANSWER_TIMEOUT_S, context=context) as response:
        return str(json.load(response)["status"])


@pytest.fixture
def https_node(tmp_path: Path, certs: Path) -> Iterator[TlsDevNode]:
    node = TlsDevNode(
        tmp_path / "data", client_context(certs), "--tls-cert", str(certs / "n1.pem"), "--tls-key", str(certs / "n1.key"),
        "--http-header-timeout", "1s",
    )
    try:
        node.start()
        yield node
    finally:
        node.stop()


def closed_unanswered(sock: socket.socket) -> bool:
    """The node closed `sock` without a byte of answer (a reset counts as closed)."""
    sock.settimeout(ANSWER_TIMEOUT_S)
    try:
        return sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def test_certs_init_writes_a_ca_its_node_and_client_certificates_chain_to(certs: Path) -> None:
    names = {"ca", *NODES, "client"}
    assert sorted(path.name for path in certs.iterdir()) == sorted(f"{name}{suffix}" for name in names for suffix in (".pem", ".key"))
    for name in names:
        assert stat.S_IMODE(os.stat(certs / f"{name}.key").st_mode) == 0o600
    ca = x509.load_pem_x509_certificate((certs / "ca.pem").read_bytes())
    for name in (*NODES, "client"):
        cert = x509.load_pem_x509_certificate((certs / f"{name}.pem").read_bytes())
        cert.verify_directly_issued_by(ca)
        usages = set(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
        assert (x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH in usages) and (
            (x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in usages) == (name != "client")
        )
    sans = x509.load_pem_x509_certificate((certs / "n2.pem").read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["n2", "localhost", "db.example"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "10.1.2.3"]
    # Never overwrites: the second run writes nothing and says which files are in the way.
    before = (certs / "n1.key").read_bytes()
    again = runstate("certs", "init", "--out", str(certs), "--nodes", "n1")
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "refusing to overwrite" in again.stderr
    assert (certs / "n1.key").read_bytes() == before


def test_https_is_served_to_a_client_trusting_the_ca_and_refused_by_others(https_node: TlsDevNode, certs: Path) -> None:
    assert get_health(https_node, client_context(certs)) == "ok"
    log = https_node.log()
    assert f"listening on https://127.0.0.1:{https_node.port}" in log and "RUNSTATE_BASE_URL=https://" in log
    with pytest.raises(urllib.error.URLError) as refused:
        get_health(https_node, ssl.create_default_context())  # the system's CAs only
    assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP to the TLS port gets no answer
        urllib.request.urlopen(f"http://127.0.0.1:{https_node.port}{HEALTH_PATH}", timeout=ANSWER_TIMEOUT_S)
    with socket.create_connection(("127.0.0.1", https_node.port), timeout=ANSWER_TIMEOUT_S) as sock:
        sock.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert closed_unanswered(sock)
    assert get_health(https_node, client_context(certs)) == "ok"  # and it keeps serving
    log = https_node.log()
    assert "TLS handshake with 127.0.0.1:" in log and "HTTP_REQUEST" in log
    assert "Traceback" not in log


def test_a_stalled_handshake_is_closed_by_the_header_timeout(
    https_node: TlsDevNode, certs: Path,
) -> None:
    # Connected and silent, or half a ClientHello: closed by the 1 s header timeout, no traceback.
    with socket.create_connection(("127.0.0.1", https_node.port), timeout=ANSWER_TIMEOUT_S) as silent, \
            socket.create_connection(("127.0.0.1", https_node.port), timeout=ANSWER_TIMEOUT_S) as partial:
        partial.sendall(b"\x16\x03\x01\x02\x00\x01")
        assert closed_unanswered(silent) and closed_unanswered(partial)
    assert "Traceback" not in https_node.log()


def test_handshakes_past_the_cap_close_the_oldest(tmp_path: Path, certs: Path) -> None:
    # A header timeout far longer than the client's wait: only the cap can close the first one.
    node = TlsDevNode(
        tmp_path / "data", client_context(certs), "--tls-cert", str(certs / "n1.pem"), "--tls-key", str(certs / "n1.key"),
        "--http-header-timeout", "10m",
    ).start()
    stalled: list[socket.socket] = []
    try:
        for _ in range(TLS_HANDSHAKES_MAX):
            stalled.append(socket.create_connection(("127.0.0.1", node.port), timeout=ANSWER_TIMEOUT_S))
        assert get_health(node, client_context(certs)) == "ok"  # the newest handshake is served
        assert closed_unanswered(stalled[0])
    finally:
        for sock in stalled:
            sock.close()
        node.stop()
    assert "Traceback" not in node.log()


def test_mutual_tls_serves_only_clients_with_a_certificate_of_the_client_ca(tmp_path: Path, certs: Path) -> None:
    other = tmp_path / "other"
    certs_init(other, ["x1"], [], 1)
    node = TlsDevNode(
        tmp_path / "data", client_context(certs, client="client"), "--tls-cert", str(certs / "n1.pem"),
        "--tls-key", str(certs / "n1.key"), "--tls-client-ca", str(certs / "ca.pem"),
    ).start()
    try:
        assert get_health(node, client_context(certs, client="client")) == "ok"
        assert get_health(node, client_context(certs, client="n2")) == "ok"  # a node's certificate is a client's too
        other_client = client_context(certs)  # trusts the node, presents a certificate of another CA
        other_client.load_cert_chain(other / "client.pem", other / "client.key")
        for refused in (client_context(certs), other_client):  # no certificate; one the client CA did not sign
            with pytest.raises((urllib.error.URLError, ConnectionError, ssl.SSLError)):
                get_health(node, refused)
        assert get_health(node, client_context(certs, client="client")) == "ok"
    finally:
        node.stop()
    assert "Traceback" not in node.log()


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--tls-key", "{c}/n1.key"], "--tls-cert (tls_cert) and --tls-key (tls_key) go together"),
        (["--tls-cert", "{c}/n1.pem"], "go together"),
        (["--tls-cert", "{c}/missing.pem", "--tls-key", "{c}/n1.key"], "cannot read --tls-cert"),
        (["--tls-cert", "{c}/n1.pem", "--tls-key", "{c}/n2.key"], "not a PEM certificate and its matching private key"),
        (["--tls-cert", "{c}/n1.pem", "--tls-key", "{c}/n1.key", "--tls-client-ca", "{c}/n1.key"], "--tls-client-ca"),
    ],
)
def test_bad_tls_flags_stop_the_node_with_one_line(certs: Path, flags: list[str], says: str) -> None:
    done = runstate("dev", "--in-memory", "--port", "1", *(flag.format(c=certs) for flag in flags))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert done.stderr.startswith("runstate: ") and "Traceback" not in done.stderr


def test_a_cluster_nodes_toml_keys_and_advertised_url(tmp_path: Path, certs: Path) -> None:
    config = tmp_path / "node.toml"
    config.write_text(
        f'node_id = "n1"\napi = "127.0.0.1:1"\nraft = "127.0.0.1:2"\ntls_cert = "{certs}/n1.pem"\n'
        f'tls_key = "{certs}/n2.key"\n'
    )
    done = runstate("node", "--config", str(config), "--data-dir", str(tmp_path / "d"), "--peer", "n2,127.0.0.1:3,https://n2:1")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "matching private key" in done.stderr, done.stderr
    tls = TlsFiles(certs / "n1.pem", certs / "n1.key")
    assert NodeConfig(host="10.0.0.1", port=8443, tls=tls).api_url == "https://10.0.0.1:8443"
    assert NodeConfig(host="10.0.0.1", port=8080).api_url == "http://10.0.0.1:8080"


EXPIRY_DAYS_SHORT = 10  # below certs.EXPIRY_WARNING_DAYS: warned of


def test_a_certificate_near_its_expiry_is_warned_of_and_every_expiry_is_in_the_metrics(tmp_path: Path, certs: Path) -> None:
    short = tmp_path / "short"
    done = runstate("certs", "init", "--out", str(short), "--nodes", "n1", "--days", str(EXPIRY_DAYS_SHORT))
    assert done.returncode == 0, done.stderr
    for directory, warned in ((short, True), (certs, False)):
        context = client_context(directory, client="client")
        node = TlsDevNode(tmp_path / f"data-{directory.name}", context, "--tls-cert", str(directory / "n1.pem"),
                          "--tls-key", str(directory / "n1.key"), "--tls-client-ca", str(directory / "ca.pem"))
        try:
            node.start()
            request = urllib.request.Request(f"{node.url}/metrics")
            with urllib.request.urlopen(request, timeout=ANSWER_TIMEOUT_S, context=context) as response:
                text = response.read().decode()
            days = {
                line.split('certificate="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1]) / 86_400
                for line in text.splitlines() if line.startswith("runstate_tls_certificate_expiry_seconds{")
            }
            expected = EXPIRY_DAYS_SHORT if warned else 825
            assert set(days) == {"api", "client_ca"} and all(expected - 1 < left <= expected for left in days.values()), days
            assert ("expires in" in node.log()) is warned, node.log()
        finally:
            node.stop()
