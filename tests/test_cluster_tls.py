"""TLS between the nodes of a real three-node cluster (cluster/peer_tls.py, _transport.py,
node/tls.py), with the certificates `runstate certs init` writes: HTTPS APIs and mutual TLS on
the Raft port survive a leader's kill -9 and forward through a follower; a node whose Raft
certificate another CA signed, or that has expired, is refused before any Raft message is read;
a cluster moves from the password to certificates one node at a time (--peer-tls-allow-plain);
a certificate replaced on disk is served after SIGHUP."""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests._cluster import Cluster
from tests._http import Api
from tests._prometheus import scrape, value
from tests._tls_nodes import sign_server_certificate

NODES = ("n1", "n2", "n3")
CLI_TIMEOUT_S = 60.0
REFUSAL_TIMEOUT_S = 20.0  # a refused peer's dials, logged and counted, well within this
RELOAD_TIMEOUT_S = 20.0  # a file change is seen within node/tls.py TLS_FILES_CHECK_EVERY_S (5 s)


def certs_init(out: Path, *nodes: str) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", "certs", "init", "--out", str(out), "--nodes", ",".join(nodes)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return certs_init(tmp_path_factory.mktemp("certs") / "tls", *NODES)


@pytest.fixture
def trusting(certs: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ssl.SSLContext]:
    """urllib in this process (tests/_http.py, _cluster.py, _prometheus.py) trusts the CA and
    presents the client certificate; the nodes are given the CA by flag only (their environment
    says nothing of it)."""
    context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    context.load_cert_chain(certs / "client.pem", certs / "client.key")
    monkeypatch.setattr(urllib.request, "_opener", urllib.request.build_opener(urllib.request.HTTPSHandler(context=context)))
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    yield context


def api_tls_args(certs: Path, node: str) -> tuple[str, ...]:
    return ("--tls-cert", str(certs / f"{node}.pem"), "--tls-key", str(certs / f"{node}.key"), "--tls-ca", str(certs / "ca.pem"))


def peer_tls_args(cert: Path, key: Path, ca: Path) -> tuple[str, ...]:
    return ("--peer-tls-cert", str(cert), "--peer-tls-key", str(key), "--peer-tls-ca", str(ca))


def tls_cluster(make_cluster: Callable[..., Cluster], certs: Path, *, https: bool = True) -> Cluster:
    """A cluster (not started) whose nodes speak mutual TLS on Raft and, with `https`, serve HTTPS
    to clients with a certificate of the CA only (so a forwarding node presents its own)."""
    cluster = make_cluster()
    for index, node in enumerate(cluster.ids):
        peer = peer_tls_args(certs / f"{node}.pem", certs / f"{node}.key", certs / "ca.pem")
        api = (*api_tls_args(certs, node), "--tls-client-ca", str(certs / "ca.pem"))
        cluster.node_args[index] = (*api, *peer) if https else peer
    if https:
        cluster.urls = [url.replace("http://", "https://") for url in cluster.urls]
    return cluster


def refusals(cluster: Cluster, index: int) -> float:
    samples, _ = scrape(cluster.urls[index], cluster.admin_key)
    return value(samples, "runstate_raft_connections_refused_total", reason="tls")


def test_a_cluster_with_https_apis_and_mutual_tls_on_raft_forwards_and_survives_a_leader_kill(
    make_cluster: Callable[..., Cluster], certs: Path, trusting: ssl.SSLContext,
) -> None:
    cluster = tls_cluster(make_cluster, certs).start()
    leader = cluster.leader_index()
    follower = (leader + 1) % cluster.size
    setup = cluster.api(follower).resending()  # through a follower: forwarded to the leader over HTTPS
    run_id = setup.ok("POST", "/v1/scopes", {"name": "before"})["id"]
    assert cluster.api(leader).ok("GET", f"/v1/scopes/{run_id}")["name"] == "before"
    samples, _ = scrape(cluster.urls[leader], cluster.admin_key)
    # TLS seals the Raft frames: none was sealed with the password.
    assert value(samples, "runstate_raft_frames_sealed_total", format="aead") == 0
    assert value(samples, "runstate_raft_frames_sealed_total", format="fernet") == 0
    assert value(samples, "runstate_raft_messages_total", direction="sent", type="append_entries") > 0
    assert value(samples, "runstate_tls_certificate_expiry_seconds", certificate="peer") > 0

    cluster.kill(leader)
    survivors = [index for index in range(cluster.size) if index != leader]
    new_leader = cluster.leader_index(exclude=[leader])
    through = next(index for index in survivors if index != new_leader)
    second = cluster.api(through).resending().ok("POST", "/v1/scopes", {"name": "after"})["id"]
    assert cluster.api(new_leader).ok("GET", f"/v1/scopes/{second}")["name"] == "after"
    cluster.start(leader)  # the killed node catches up over TLS
    cluster.wait_same_digest()


@pytest.mark.parametrize("bad", ["another-ca", "expired"])
def test_a_node_whose_raft_certificate_does_not_verify_is_refused(
    make_cluster: Callable[..., Cluster], certs: Path, tmp_path: Path, bad: str,
) -> None:
    cluster = tls_cluster(make_cluster, certs, https=False)
    if bad == "another-ca":
        other = certs_init(tmp_path / "other", *NODES)
        cert, key, ca = other / "n3.pem", other / "n3.key", other / "ca.pem"
    else:
        cert, key = sign_server_certificate(certs, "n3-expired", ["n3", "127.0.0.1"], expired=True, client_too=True)
        ca = certs / "ca.pem"
    cluster.node_args[2] = peer_tls_args(cert, key, ca)
    cluster.start(0, 1)
    cluster.spawn(2)
    cluster.wait_until(
        "n1 and n2 refusing n3's Raft connections", lambda: refusals(cluster, 0) + refusals(cluster, 1) > 0,
        REFUSAL_TIMEOUT_S,
    )
    leader = cluster.leader_index(exclude=[2])
    Api(cluster.urls[leader], key=cluster.admin_key).resending().ok("POST", "/v1/scopes", {})
    health = cluster.wait_until("n3's API answering", lambda: cluster.health(2), REFUSAL_TIMEOUT_S)
    leading = cluster.health(leader)
    assert leading is not None
    assert health["status"] != "ok" and health["appliedIndex"] < leading["appliedIndex"], (health, leading)
    logs = cluster.log_path(0).read_text() + cluster.log_path(1).read_text()
    assert "does not verify against --peer-tls-ca" in logs or "refused" in logs
    assert "Traceback" not in logs


def test_a_cluster_moves_from_the_password_to_certificates_one_node_at_a_time(
    make_cluster: Callable[..., Cluster], certs: Path,
) -> None:
    cluster = make_cluster().start()  # the password only
    written = [cluster.api(cluster.leader_index()).resending().ok("POST", "/v1/scopes", {})["id"]]

    def restart_each(args: Callable[[int], tuple[str, ...]]) -> None:
        for index in range(cluster.size):
            cluster.kill(index)
            cluster.node_args[index] = args(index)
            cluster.start(index)
            cluster.wait_healthy()
            leader = cluster.leader_index()
            written.append(cluster.api(leader).resending().ok("POST", "/v1/scopes", {})["id"])

    def with_certs(index: int) -> tuple[str, ...]:
        node = cluster.ids[index]
        return peer_tls_args(certs / f"{node}.pem", certs / f"{node}.key", certs / "ca.pem")

    restart_each(lambda index: (*with_certs(index), "--peer-tls-allow-plain"))  # TLS, and the password for the rest
    restart_each(with_certs)  # TLS only
    cluster.wait_same_digest()
    leader = cluster.leader_index()
    for run_id in written:
        cluster.api(leader).ok("GET", f"/v1/scopes/{run_id}")
    samples, _ = scrape(cluster.urls[leader], cluster.admin_key)
    before = value(samples, "runstate_raft_frames_sealed_total", format="aead")
    cluster.api(leader).resending().ok("POST", "/v1/scopes", {})
    samples, _ = scrape(cluster.urls[leader], cluster.admin_key)
    assert value(samples, "runstate_raft_frames_sealed_total", format="aead") == before  # nothing sealed: TLS


def test_a_certificate_replaced_on_disk_is_served_after_sighup_and_after_a_change(
    make_cluster: Callable[..., Cluster], certs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    served = tmp_path / "served"
    served.mkdir()
    for suffix in (".pem", ".key"):
        (served / f"n1{suffix}").write_bytes((certs / f"n1{suffix}").read_bytes())
    new = certs_init(tmp_path / "new", *NODES)
    cluster = make_cluster()
    cluster.node_args[0] = ("--tls-cert", str(served / "n1.pem"), "--tls-key", str(served / "n1.key"))
    cluster.urls[0] = cluster.urls[0].replace("http://", "https://")
    old_ca = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    new_ca = ssl.create_default_context(cafile=str(new / "ca.pem"))
    monkeypatch.setattr(urllib.request, "_opener", urllib.request.build_opener(urllib.request.HTTPSHandler(context=old_ca)))
    cluster.start()

    def served_by(context: ssl.SSLContext) -> bool:
        try:
            with urllib.request.urlopen(f"{cluster.urls[0]}/v1/health", timeout=10, context=context):
                return True
        except urllib.error.HTTPError:
            return True
        except (OSError, ssl.SSLError):
            return False

    assert served_by(old_ca) and not served_by(new_ca)
    # Replaced by SIGHUP's reload: the file-change check would also see it within 5 s, so the
    # watcher is outrun by the signal sent right after the copy.
    for suffix in (".pem", ".key"):
        (served / f"n1{suffix}").write_bytes((new / f"n1{suffix}").read_bytes())
    process = cluster.processes[0]
    assert process is not None
    process.send_signal(signal.SIGHUP)
    cluster.wait_until("n1 serving the new certificate", lambda: served_by(new_ca), RELOAD_TIMEOUT_S)
    assert not served_by(old_ca)
    # Back to the first one, by the file change alone.
    for suffix in (".pem", ".key"):
        (served / f"n1{suffix}").write_bytes((certs / f"n1{suffix}").read_bytes())
    cluster.wait_until("n1 serving the first certificate again", lambda: served_by(old_ca), RELOAD_TIMEOUT_S)
    log_text = cluster.log_path(0).read_text()
    assert "TLS files reloaded (SIGHUP)" in log_text and "TLS files reloaded (a file changed)" in log_text


@pytest.mark.parametrize(
    ("flags", "toml", "says"),
    [
        (["--peer-tls-cert", "{c}/n1.pem", "--peer-tls-key", "{c}/n1.key"], "", "go together"),
        (["--peer-tls-allow-plain"], "", "goes with"),
        ([], 'peer_tls_cert = "{c}/n1.pem"\npeer_tls_key = "{c}/n2.key"\npeer_tls_ca = "{c}/ca.pem"\n', "matching private key"),
        (["--peer-tls-cert", "{c}/n1.pem", "--peer-tls-key", "{c}/n1.key", "--peer-tls-ca", "{c}/n1.key"], "", "--peer-tls-ca"),
        (["--peer-tls-cert", "{c}/none.pem", "--peer-tls-key", "{c}/n1.key", "--peer-tls-ca", "{c}/ca.pem"], "", "cannot read"),
        (["--tls-ca", "{c}/n1.key"], "", "--tls-ca"),
    ],
)
def test_bad_cluster_tls_settings_stop_the_node_with_one_line(
    certs: Path, tmp_path: Path, flags: list[str], toml: str, says: str,
) -> None:
    config = tmp_path / "node.toml"
    config.write_text('node_id = "n1"\napi = "127.0.0.1:1"\nraft = "127.0.0.1:2"\n' + toml.format(c=certs))
    done = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", "node", "--config", str(config), "--data-dir",
         str(tmp_path / "d"), "--peer", "n2,127.0.0.1:3,https://n2:1", *(flag.format(c=certs) for flag in flags)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert done.stderr.startswith("runstate: ") and "Traceback" not in done.stderr


PAUSE_ROUNDS = 4  # each node in turn, this many times
PAUSE_S = 1.5  # beyond the connection timeout (1 s): its peers' connections to it time out


def test_paused_peers_reconnect_over_tls_without_a_byte_in_plain(make_cluster: Callable[..., Cluster], certs: Path) -> None:
    """A connection found timed out while pysyncobj handles one of its events was dialled again
    from inside that event, and pysyncobj sent the new socket's first frame in plain, before TLS:
    the peer refused it (WRONG_VERSION_NUMBER). No refusal may happen in a cluster whose nodes all
    hold good certificates, however they are paused."""
    cluster = tls_cluster(make_cluster, certs, https=False).start()
    for _ in range(PAUSE_ROUNDS):
        for index in range(cluster.size):
            cluster.pause(index)
            time.sleep(PAUSE_S)
            cluster.resume(index)
            cluster.wait_healthy()
    cluster.api(cluster.leader_index()).resending().ok("POST", "/v1/scopes", {})
    assert [refusals(cluster, index) for index in range(cluster.size)] == [0] * cluster.size, cluster.logs()
    assert "WRONG_VERSION_NUMBER" not in cluster.logs()
