"""`runstate cluster up`: three nodes in the foreground, one URL list, Ctrl-C stops them all."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from runstate_server.node import local_cluster
from runstate_server.node.config import ConfigError
from runstate_server.node.local_cluster import RAFT_PORT_OFFSET
from tests._cluster import free_port_block

UP_TIMEOUT_S = 60.0


def test_cluster_up_starts_three_nodes_and_ctrl_c_stops_them(tmp_path: Path) -> None:
    # The command takes base_port .. base_port+2 for the APIs and base_port+100 .. for Raft.
    base_port = free_port_block([*range(3), *(RAFT_PORT_OFFSET + index for index in range(3))])
    process = subprocess.Popen(
        [sys.executable, "-m", "runstate_server.node.cli", "cluster", "up", "--nodes", "3", "--base-port", str(base_port),
         "--data-dir", str(tmp_path / "cluster"), "--fsync", "never"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        umask=0,  # a permissive umask: the data and the logs stay private all the same
    )
    try:
        assert process.stdout is not None
        urls: list[str] = []
        printed: list[str] = []
        for line in process.stdout:
            printed.append(line)
            if "RUNSTATE_BASE_URL=" in line:
                urls = line.strip().split("=", 1)[1].split(",")
                break
        assert urls == [f"http://127.0.0.1:{base_port + index}" for index in range(3)], "".join(printed)
        key_file = tmp_path / "cluster" / "bootstrap.key"
        banner = "".join(process.stdout.readline() for _ in range(2))  # the space, then the key
        assert f"RUNSTATE_API_KEY=$(cat {key_file})" in banner, banner
        assert key_file.stat().st_mode & 0o777 == 0o600
        request = urllib.request.Request(f"{urls[1]}/v1/cluster", headers={"Authorization": f"Bearer {key_file.read_text()}"})
        with urllib.request.urlopen(request, timeout=UP_TIMEOUT_S) as answer:
            view = json.load(answer)
        assert sorted(node["id"] for node in view["nodes"]) == ["n1", "n2", "n3"]
        assert view["leader"] in ("n1", "n2", "n3")
        assert (tmp_path / "cluster" / "cluster.secret").stat().st_mode & 0o777 == 0o600
        process.send_signal(signal.SIGINT)
        assert process.wait(UP_TIMEOUT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(UP_TIMEOUT_S)
        if process.stdout is not None:
            process.stdout.close()
    pids = subprocess.run(["pgrep", "-f", f"--api 127.0.0.1:{base_port}"], capture_output=True, text=True).stdout
    assert pids.strip() == ""  # no node left behind
    # Every directory 0700 and every file 0600: the secret, the key, the node logs, the journals.
    cluster_dir = tmp_path / "cluster"
    modes = {path: stat.S_IMODE(path.lstat().st_mode) for path in [cluster_dir, *cluster_dir.rglob("*")]}
    assert {"n1.log", "raft.journal", "LOCK"} <= {path.name for path in modes}
    wrong = {str(path): oct(mode) for path, mode in modes.items() if mode != (0o700 if path.is_dir() else 0o600)}
    assert wrong == {}, wrong


def test_cluster_up_refuses_a_taken_port_before_starting_anything(tmp_path: Path) -> None:
    base_port = free_port_block([*range(3), *(RAFT_PORT_OFFSET + index for index in range(3))])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", base_port + RAFT_PORT_OFFSET + 1))
        taken.listen()
        finished = subprocess.run(
            [sys.executable, "-m", "runstate_server.node.cli", "cluster", "up", "--base-port", str(base_port),
             "--data-dir", str(tmp_path / "cluster")],
            capture_output=True, text=True, timeout=UP_TIMEOUT_S,
        )
    assert finished.returncode == 2, finished.stderr
    assert f"127.0.0.1:{base_port + RAFT_PORT_OFFSET + 1}" in finished.stderr
    assert "--base-port" in finished.stderr
    assert not (tmp_path / "cluster" / "n1.log").exists()  # no node was started


def test_cluster_up_tls_serves_https_to_a_client_trusting_its_ca(tmp_path: Path) -> None:
    base_port = free_port_block([*range(3), *(RAFT_PORT_OFFSET + index for index in range(3))])
    data_dir = tmp_path / "cluster"
    process = subprocess.Popen(
        [sys.executable, "-m", "runstate_server.node.cli", "cluster", "up", "--tls", "--base-port", str(base_port),
         "--data-dir", str(data_dir), "--fsync", "never"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert process.stdout is not None
        printed: list[str] = []
        for line in process.stdout:
            printed.append(line)
            if "See the nodes with:" in line:
                break
        exports = dict(line.strip().removeprefix("export ").split("=", 1) for line in printed if "export " in line)
        urls = exports["RUNSTATE_BASE_URL"].split(",")
        assert urls == [f"https://127.0.0.1:{base_port + index}" for index in range(3)], "".join(printed)
        ca_file = data_dir / "certs" / "ca.pem"
        assert exports["RUNSTATE_CA_FILE"] == str(ca_file) and '--cacert "$RUNSTATE_CA_FILE"' in printed[-1]
        key = (data_dir / "bootstrap.key").read_text()
        # A client trusting the CA is served, by each node; one that does not is refused.
        context = ssl.create_default_context(cafile=str(ca_file))
        request = urllib.request.Request(f"{urls[0]}/v1/cluster", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(request, timeout=UP_TIMEOUT_S, context=context) as answer:
            view = json.load(answer)
        assert [node["apiUrl"] for node in sorted(view["nodes"], key=lambda node: node["id"])] == urls
        metrics = urllib.request.Request(f"{urls[1]}/metrics", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(metrics, timeout=UP_TIMEOUT_S, context=context) as answer:
            assert 'certificate="peer"' in answer.read().decode()  # mutual TLS on the Raft port too
        with pytest.raises(urllib.error.URLError) as refused:
            urllib.request.urlopen(request, timeout=UP_TIMEOUT_S, context=ssl.create_default_context())
        assert isinstance(refused.value.reason, ssl.SSLCertVerificationError)
        # The admin commands with what the banner printed: a write through a follower, forwarded
        # to the leader over HTTPS.
        follower = next(url for url in urls if url != urls[int(view["leader"].removeprefix("n")) - 1])
        environment = {**os.environ, "RUNSTATE_CA_FILE": str(ca_file), "RUNSTATE_API_KEY": key}
        environment.pop("SSL_CERT_FILE", None)
        created = subprocess.run(
            [sys.executable, "-m", "runstate_server.node.cli", "spaces", "create", "--id", "tls-up", "--url", follower],
            capture_output=True, text=True, timeout=UP_TIMEOUT_S, env=environment,
        )
        assert created.returncode == 0 and "created space tls-up" in created.stdout, created.stderr
        process.send_signal(signal.SIGINT)
        assert process.wait(UP_TIMEOUT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(UP_TIMEOUT_S)
        if process.stdout is not None:
            process.stdout.close()
    assert stat.S_IMODE((data_dir / "certs" / "n1.key").stat().st_mode) == 0o600


def test_cluster_up_tls_writes_the_certificates_once_and_reuses_them(tmp_path: Path) -> None:
    data_dir = tmp_path / "cluster"
    certs = local_cluster._certs(data_dir, ["n1", "n2", "n3"])
    ca = (certs / "ca.pem").read_bytes()
    assert local_cluster._certs(data_dir, ["n1", "n2"]) == certs and (certs / "ca.pem").read_bytes() == ca
    with pytest.raises(ConfigError, match="n4.pem"):  # more nodes than the certificates were made for
        local_cluster._certs(data_dir, ["n1", "n2", "n3", "n4"])


def test_cluster_up_names_the_node_that_failed_its_first_error_and_its_log(tmp_path: Path) -> None:
    """Issue 43: not only `no healthy answer`, but which node failed, the first error of its log
    and the log's path, in one line."""
    base_port = free_port_block([*range(3), *(RAFT_PORT_OFFSET + index for index in range(3))])
    data_dir = tmp_path / "cluster"
    data_dir.mkdir(mode=0o700)
    (data_dir / "n2").write_text("a file where n2's data directory belongs\n")
    finished = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", "cluster", "up", "--base-port", str(base_port),
         "--data-dir", str(data_dir), "--fsync", "never"],
        capture_output=True, text=True, timeout=UP_TIMEOUT_S,
    )
    assert finished.returncode == 1, finished.stderr
    (line,) = finished.stderr.splitlines()
    assert line.startswith("runstate: node n2 exited with 2 while starting: cannot read "), line
    assert "Not a directory" in line and line.endswith(f"(log: {data_dir / 'n2.log'})"), line
    assert "Traceback" not in finished.stderr


def test_the_first_error_of_a_node_log_is_that_of_its_latest_start(tmp_path: Path) -> None:
    path = tmp_path / "n1.log"
    earlier_start = "2026-12-07 10:00:00,000 ERROR runstate.node: an old failure, fixed since\n"
    path.write_text(earlier_start)
    log = local_cluster._NodeLog(path)
    log.start_offset = len(earlier_start)
    assert log.first_error() is None and log.why() == f"its log is empty (log: {path})"
    with path.open("a") as file:
        file.write("2026-12-07 10:01:00,000 INFO runstate.node: starting\n")
        file.write("Traceback (most recent call last):\n")
        file.write('  File "x.py", line 1, in <module>\n    raise ValueError("the first")\n')
        file.write("ValueError: the first\n")
        file.write("2026-12-07 10:01:01,000 ERROR runstate.node: a later one\n" * 3)
    assert log.first_error() == "ValueError: the first"
    with path.open("w") as file:
        file.write("2026-12-07 10:02:00,000 WARNING pysyncobj: no quorum yet " + "x" * 1000 + "\n")
    log.start_offset = 0
    last = log.first_error()
    assert last is not None and last.startswith("2026-12-07 10:02:00,000 WARNING") and len(last) == local_cluster.ERROR_LINE_CHARS_MAX + len("...")
