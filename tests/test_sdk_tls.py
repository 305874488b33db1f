"""The Python SDK over HTTPS (ca_file, client_cert, client_key and their RUNSTATE_* variables;
TlsError), against real `runstate dev` processes: the README's quickstart with the CA given by
environment variable, mutual TLS with the client's certificate, and each refusal raising TlsError
that names the server and the reason, at once rather than UnavailableError after retries. The
TypeScript SDK's are in tests/test_typescript_sdk.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from runstate import AsyncRunstate, ConfigError, Runstate, TlsError, UnavailableError

from runstate_server.node._asyncio_tls import PYTHON_WITH_THIS_PROTOCOL
from tests._nodes import DevNode
from tests._tls_nodes import https_node, make_ca, sign_server_certificate, unverified_context
from tests.test_tls import TlsDevNode

QUICKSTART = Path(__file__).resolve().parent / "quickstart"
PROCESS_TIMEOUT_S = 60.0
TLS_ENV = ("RUNSTATE_CA_FILE", "RUNSTATE_CLIENT_CERT", "RUNSTATE_CLIENT_KEY")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = make_ca(tmp_path_factory.mktemp("ca") / "tls")
    sign_server_certificate(made, "expired", ["localhost", "127.0.0.1"], expired=True)
    sign_server_certificate(made, "elsewhere", ["elsewhere.example"])
    return made


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ca(tmp_path_factory.mktemp("other-ca") / "tls")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, ca: Path) -> Iterator[TlsDevNode]:
    with https_node(tmp_path_factory.mktemp("https") / "data", ca) as made:
        yield made


@pytest.fixture(scope="module")
def mutual_node(tmp_path_factory: pytest.TempPathFactory, ca: Path) -> Iterator[TlsDevNode]:
    """Mutual TLS: a refused client hears why (the node sends the alert: node/_asyncio_tls.py)."""
    with https_node(tmp_path_factory.mktemp("mutual") / "data", ca, client_ca=ca) as made:
        yield made


@pytest.fixture(autouse=True)
def no_tls_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TLS_ENV:
        monkeypatch.delenv(name, raising=False)


def client_files(ca: Path, name: str = "client") -> dict[str, str]:
    return {"client_cert": str(ca / f"{name}.pem"), "client_key": str(ca / f"{name}.key")}


def test_the_quickstart_over_https_with_the_ca_from_the_environment(node: TlsDevNode, ca: Path, tmp_path: Path) -> None:
    env = {**os.environ, "RUNSTATE_BASE_URL": node.url, "RUNSTATE_CA_FILE": str(ca / "ca.pem"), "PYTHONUNBUFFERED": "1"}
    for name in ("RUNSTATE_SPACE_ID", "RUNSTATE_API_KEY", "RUNSTATE_SCOPE_ID"):
        env.pop(name, None)
    started: list[subprocess.Popen[str]] = []

    def python(script: str, run_env: dict[str, str]) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, str(QUICKSTART / script)], env=run_env, cwd=tmp_path,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        started.append(process)
        return process

    try:
        producer = python("producer.py", env)
        assert producer.stdout is not None
        first = producer.stdout.readline()
        assert first.startswith("RUNSTATE_SCOPE_ID="), first + producer.stdout.read()
        worker = python("worker.py", {**env, "RUNSTATE_SCOPE_ID": first.strip().split("=", 1)[1]})
        rest, _ = producer.communicate(timeout=PROCESS_TIMEOUT_S)
        assert producer.returncode == 0 and rest.strip().splitlines()[-1] == "SUCCEEDED {'doubled': 42}", rest
        assert worker.stdout is not None
        assert any(line.startswith("completed") for line in worker.stdout), "the worker completed nothing"
    finally:
        for process in started:
            process.kill()
            process.communicate(timeout=PROCESS_TIMEOUT_S)


def test_mutual_tls_with_the_client_certificate_as_arguments_or_variables(
    mutual_node: TlsDevNode, ca: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    with Runstate(mutual_node.url, ca_file=ca / "ca.pem", **client_files(ca)) as rs:
        rs.mailboxes.ensure("work", mode="WORK")
        assert rs.scopes.create().mailbox("work").submit({"n": 1}, key="k1").id
    for name, value in zip(TLS_ENV, (str(ca / "ca.pem"), str(ca / "client.pem"), str(ca / "client.key")), strict=True):
        monkeypatch.setenv(name, value)

    async def from_the_environment() -> str:
        async with AsyncRunstate(mutual_node.url) as rs:
            return (await rs.whoami()).space

    assert asyncio.run(from_the_environment()) == "default"


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("the system's CAs", "unable to get local issuer certificate"),
        ("another CA", "unable to get local issuer certificate"),
        ("an expired certificate", "certificate has expired"),
        ("a certificate for another host", "IP address mismatch"),
    ],
)
def test_a_server_certificate_that_does_not_verify_raises_tls_error_at_once(
    tmp_path: Path, ca: Path, other_ca: Path, node: TlsDevNode, case: str, says: str,
) -> None:
    trusted: Path | None = {"the system's CAs": None, "another CA": other_ca}.get(case, ca)
    if case in ("an expired certificate", "a certificate for another host"):
        cert = "expired" if case.startswith("an expired") else "elsewhere"
        with https_node(tmp_path / "data", ca, cert=cert, health=unverified_context()) as bad:
            error = refusal(bad.url, node.url, trusted)
    else:
        error = refusal(node.url, node.url, trusted)
    assert says in error.reason, error.reason
    assert error.code == "TLS_FAILED" and error.status is None and not isinstance(error, UnavailableError)


def refusal(url: str, other_url: str, trusted: Path | None) -> TlsError:
    """The TlsError of a first call to `url`, listed before `other_url`: raised without trying
    `other_url` (not retried), which the next call then reaches (when it trusts its CA)."""
    ca_file = str(trusted / "ca.pem") if trusted is not None else None
    with Runstate([url, other_url] if url != other_url else url, ca_file=ca_file) as rs:
        with pytest.raises(TlsError) as raised:
            rs.whoami()
        if url != other_url:
            assert rs.whoami().space == "default"  # the next call went to the next listed node
    error = raised.value
    assert error.url == url and str(error).startswith(f"TLS_FAILED: {url}: "), str(error)
    return error


@pytest.mark.skipif(sys.version_info < PYTHON_WITH_THIS_PROTOCOL, reason="a node on Python 3.10 sends no TLS alert")
@pytest.mark.parametrize("client", ["no certificate", "a certificate of another CA"])
def test_mutual_tls_refuses_a_client_without_a_certificate_of_the_client_ca(
    mutual_node: TlsDevNode, ca: Path, other_ca: Path, client: str,
) -> None:
    certificate = client_files(other_ca) if client.startswith("a certificate") else {}
    with Runstate(mutual_node.url, ca_file=ca / "ca.pem", **certificate) as rs:
        with pytest.raises(TlsError) as raised:
            rs.scopes.create()  # an unsafe call: refused, not OutcomeUnknownError
    error = raised.value
    assert error.url == mutual_node.url and "refused the TLS handshake" in error.reason, str(error)
    assert "client_cert" in error.reason


def test_https_to_a_plain_http_port_raises_tls_error(dev_node: DevNode) -> None:
    url = dev_node.url.replace("http://", "https://")
    with Runstate(url) as rs:
        with pytest.raises(TlsError) as raised:
            rs.whoami()
    assert "does not speak TLS" in raised.value.reason, str(raised.value)


def test_tls_files_are_checked_when_the_client_is_made(
    tmp_path: Path, ca: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    missing = tmp_path / "missing.pem"
    cases: list[tuple[dict[str, object], str]] = [
        ({"ca_file": missing}, f"cannot read ca_file {missing}"),
        ({"ca_file": not_pem}, f"ca_file {not_pem}: not PEM"),
        ({"client_cert": ca / "client.pem"}, "client_cert (RUNSTATE_CLIENT_CERT) and client_key (RUNSTATE_CLIENT_KEY) go together"),
        ({"client_cert": ca / "client.pem", "client_key": missing}, f"cannot read client_key {missing}"),
        ({"client_cert": ca / "client.pem", "client_key": ca / "n1.key"}, "not a PEM certificate and its matching private key"),
    ]
    for arguments, says in cases:
        for make in (Runstate, AsyncRunstate):
            with pytest.raises(ConfigError) as raised:
                make("https://127.0.0.1:1", **arguments)  # type: ignore[arg-type]
            assert says in str(raised.value), (arguments, str(raised.value))
    monkeypatch.setenv("RUNSTATE_CA_FILE", str(missing))
    with pytest.raises(ConfigError, match="cannot read ca_file"):
        AsyncRunstate("https://127.0.0.1:1")
    AsyncRunstate("https://127.0.0.1:1", ca_file=ca / "ca.pem")  # an argument wins over its variable
