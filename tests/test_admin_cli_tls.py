"""The admin commands (`runstate whoami`, `runstate backup`, ...: node/admin_cli.py over
node/operator_client.py) against a real `runstate dev --auth` node serving HTTPS with mutual TLS:
the CA and the client certificate from flags or from the SDKs' environment variables, and each TLS
failure one line on stderr with its exit status, no traceback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from runstate_server.node.certs import certs_init
from tests._nodes import DevNode, read_bootstrap_key
from tests.test_admin_cli import runstate
from tests.test_tls import TlsDevNode, client_context

TLS_ENV = ("RUNSTATE_CA_FILE", "RUNSTATE_CLIENT_CERT", "RUNSTATE_CLIENT_KEY", "SSL_CERT_FILE")
CERT_DAYS = 1


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("admin-tls") / "certs"
    certs_init(out, ["n1"], [], CERT_DAYS)
    return out


@pytest.fixture(scope="module")
def mutual_node(tmp_path_factory: pytest.TempPathFactory, tls_dir: Path) -> Iterator[tuple[TlsDevNode, str]]:
    """A dev node with --auth that requires client certificates of `tls_dir`'s CA; its admin key."""
    node = TlsDevNode(
        tmp_path_factory.mktemp("admin-tls-node") / "data", client_context(tls_dir, client="client"), "--auth",
        "--tls-cert", str(tls_dir / "n1.pem"), "--tls-key", str(tls_dir / "n1.key"), "--tls-client-ca", str(tls_dir / "ca.pem"),
    )
    try:
        node.start()
        yield node, read_bootstrap_key(node)
    finally:
        node.stop()


def client_flags(tls_dir: Path) -> tuple[str, ...]:
    return ("--ca-file", str(tls_dir / "ca.pem"), "--client-cert", str(tls_dir / "client.pem"),
            "--client-key", str(tls_dir / "client.key"))


def no_tls_env(**more: str) -> dict[str, str]:
    """The environment's TLS settings blanked (an empty variable counts as unset), plus `more`."""
    return {**dict.fromkeys(TLS_ENV, ""), **more}


def test_admin_commands_speak_https_with_a_ca_and_a_client_certificate(
    mutual_node: tuple[TlsDevNode, str], tls_dir: Path, tmp_path: Path,
) -> None:
    node, key = mutual_node
    whoami = ["whoami", "--url", node.url, "--api-key", key, "--json"]
    done = runstate(*whoami, *client_flags(tls_dir), env=no_tls_env())
    assert done.returncode == 0 and json.loads(done.stdout)["operator"] is True, done.stderr
    # The same from the SDKs' variables.
    from_env = no_tls_env(
        RUNSTATE_CA_FILE=str(tls_dir / "ca.pem"), RUNSTATE_CLIENT_CERT=str(tls_dir / "client.pem"),
        RUNSTATE_CLIENT_KEY=str(tls_dir / "client.key"),
    )
    done = runstate(*whoami, env=from_env)
    assert done.returncode == 0 and json.loads(done.stdout)["operator"] is True, done.stderr
    # A backup streams over HTTPS too (from the node GET /v1/cluster names).
    out = tmp_path / "state.backup"
    done = runstate("backup", "--out", str(out), "--url", node.url, "--api-key", key, *client_flags(tls_dir), env=no_tls_env())
    assert done.returncode == 0 and out.stat().st_size > 0, done.stderr
    assert runstate("backup", "inspect", str(out)).returncode == 0


def test_tls_failures_are_one_line_and_a_nonzero_exit(
    mutual_node: tuple[TlsDevNode, str], tls_dir: Path, tmp_path: Path, dev_node: DevNode,
) -> None:
    node, key = mutual_node
    other = tmp_path / "other"
    certs_init(other, ["x1"], [], CERT_DAYS)
    base = ("whoami", "--url", node.url, "--api-key", key)
    client = ("--client-cert", str(tls_dir / "client.pem"), "--client-key", str(tls_dir / "client.key"))
    cases = [
        # (flags, exit status, what the line says)
        ((*base, *client), 1, f"runstate: TLS: {node.url}: the node's certificate is not trusted"),  # the system's CAs
        ((*base, "--ca-file", str(other / "ca.pem"), *client), 1, "certificate is not trusted"),  # another CA
        # Without a client certificate, or with one of another CA: the node's alert says which.
        ((*base, "--ca-file", str(tls_dir / "ca.pem")), 1, f"runstate: TLS: {node.url}: the node requires a client certificate"),
        ((*base, "--ca-file", str(tls_dir / "ca.pem"), "--client-cert", str(other / "client.pem"),
          "--client-key", str(other / "client.key")), 1, "the node refused the client certificate"),
        (("whoami", "--url", node.url.replace("https://", "http://"), "--api-key", key), 1, "UNAVAILABLE"),  # plain HTTP
        (("whoami", "--url", dev_node.url.replace("http://", "https://"), "--ca-file", str(tls_dir / "ca.pem")), 1,
         "the TLS handshake failed"),  # HTTPS to a plain HTTP node
        ((*base, "--ca-file", str(tmp_path / "missing.pem")), 2, "--ca-file (RUNSTATE_CA_FILE)"),
        ((*base, "--ca-file", str(tls_dir / "n1.key")), 2, "not PEM CA certificates"),
        ((*base, "--client-cert", str(tls_dir / "client.pem")), 2, "go together"),
        ((*base, "--client-cert", str(tls_dir / "client.pem"), "--client-key", str(tls_dir / "n1.key")), 2,
         "matching private key"),
    ]
    for flags, status, says in cases:
        done = runstate(*flags, env=no_tls_env())
        assert (done.returncode, done.stdout) == (status, ""), (flags, done.stdout, done.stderr)
        assert done.stderr.startswith("runstate: ") and done.stderr.count("\n") == 1 and says in done.stderr, (flags, done.stderr)
    # Another node that does not answer is skipped; a TLS failure is not (it is a setting to fix).
    done = runstate("whoami", "--url", f"http://127.0.0.1:1,{node.url}", "--api-key", key, *client, env=no_tls_env())
    assert done.returncode == 1 and "runstate: TLS: " in done.stderr, done.stderr
    assert "Traceback" not in node.log()
