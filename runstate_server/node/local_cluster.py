"""`runstate cluster up`: N cluster nodes on 127.0.0.1, in the foreground, for trying it out.

Each node is its own `runstate node` process (the same command a deployment runs), with its data
and its log in DATA_DIR/<id>. The cluster secret and the first admin key are generated once into
DATA_DIR/cluster.secret and DATA_DIR/bootstrap.key (mode 0600) and reused, so the same command
restarts the same cluster.

With --tls the APIs serve HTTPS: `runstate certs init` writes a private CA and each node's
certificate into DATA_DIR/certs once (reused by the next `cluster up --tls`), each node serves its
own, trusts the CA for the others' APIs (`--tls-ca`: forwarding, membership) and speaks mutual TLS
with the same certificate on the Raft port (`--peer-tls-*`). The banner says how a client connects
(the https:// URLs and RUNSTATE_CA_FILE).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from runstate_server.cluster.private_files import make_private_dir, open_private
from runstate_server.node.certs import CA_NAME, CERT_DAYS_DEFAULT, CertsError, certs_init
from runstate_server.node.config import (
    BOOTSTRAP_KEY_FILE_NAME,
    CLUSTER_NODES_MAX,
    DEFAULT_HOST,
    DEFAULT_SPACE,
    ConfigError,
)
from runstate_server.node.keys import new_key_secret
from runstate_server.node.server import NodeStartError, check_port_free

RAFT_PORT_OFFSET = 100  # node i: API on base_port + i, Raft on base_port + 100 + i
HEALTHY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
WATCH_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 1.0  # one health probe while the nodes start
SECRET_FILE_NAME = "cluster.secret"
# What `cluster up` reads of a node's log to say why it failed: the first error line of this start
# (a node that keeps failing writes megabytes of tracebacks), at most this much of the log, and
# the line cut to this length.
LOG_SCAN_BYTES_MAX = 1 << 20
ERROR_LINE_CHARS_MAX = 300
LOG_ERROR_LEVELS = (" ERROR ", " CRITICAL ")  # as the node's logging format writes levels (cli.py)
TRACEBACK_START = "Traceback (most recent call last):"
COMMAND_ERROR_PREFIX = "runstate: "  # a node that cannot start says why in one line so prefixed
CERTS_DIR_NAME = "certs"  # --tls: DATA_DIR/certs, as `runstate certs init --out` writes it


def cluster_up(nodes: int, base_port: int, data_dir: Path, *, fsync: str, log_level: str, tls: bool = False) -> int:
    if not 1 <= nodes <= CLUSTER_NODES_MAX:
        raise ConfigError(f"--nodes must be from 1 to {CLUSTER_NODES_MAX}")
    if not 1024 <= base_port <= 65535 - RAFT_PORT_OFFSET - nodes:
        raise ConfigError(f"--base-port must leave room for {nodes} API and Raft ports below 65536")
    for port in [base_port + index for index in range(nodes)] + [base_port + RAFT_PORT_OFFSET + index for index in range(nodes)]:
        try:
            check_port_free(DEFAULT_HOST, port)
        except NodeStartError as error:
            raise ConfigError(f"{error}; choose another --base-port (it takes {nodes} API ports from it "
                              f"and {nodes} Raft ports from it + {RAFT_PORT_OFFSET})") from None
    make_private_dir(data_dir)  # the secret, the key, the nodes' data and logs: 0700, files 0600
    secret_file = _secret_file(data_dir, SECRET_FILE_NAME, secrets.token_hex(32))
    key_file = _secret_file(data_dir, BOOTSTRAP_KEY_FILE_NAME, new_key_secret())
    ids = [f"n{index + 1}" for index in range(nodes)]
    certs = _certs(data_dir, ids) if tls else None
    scheme = "https" if certs else "http"
    api_urls = [f"{scheme}://{DEFAULT_HOST}:{base_port + index}" for index in range(nodes)]
    context = ssl.create_default_context(cafile=str(certs / f"{CA_NAME}.pem")) if certs else None
    rafts = [f"{DEFAULT_HOST}:{base_port + RAFT_PORT_OFFSET + index}" for index in range(nodes)]
    processes: dict[str, subprocess.Popen[bytes]] = {}
    logs = {node_id: _NodeLog(data_dir / f"{node_id}.log") for node_id in ids}
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        for index, node_id in enumerate(ids):
            command = [
                sys.executable, "-m", "runstate_server.node.cli", "node",
                "--node-id", node_id,
                "--api", f"{DEFAULT_HOST}:{base_port + index}",
                "--raft", rafts[index],
                "--data-dir", str(data_dir / node_id),
                "--secret-file", str(secret_file),
                "--bootstrap-key-file", str(key_file),
                "--fsync", fsync,
                "--log-level", log_level,
            ]
            if certs is not None:
                cert, key, ca = (str(certs / name) for name in (f"{node_id}.pem", f"{node_id}.key", f"{CA_NAME}.pem"))
                command += ["--tls-cert", cert, "--tls-key", key, "--tls-ca", ca,
                            "--peer-tls-cert", cert, "--peer-tls-key", key, "--peer-tls-ca", ca]
            for other in range(nodes):
                if other != index:
                    command += ["--peer", f"{ids[other]},{rafts[other]},{api_urls[other]}"]
            with open_private(logs[node_id].path, "ab") as log_file:
                logs[node_id].start_offset = log_file.tell()  # the log is kept across starts: read this one's
                processes[node_id] = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
        if not _wait_healthy(dict(zip(ids, api_urls, strict=True)), processes, logs, lambda: stopping, context):
            return 1
        print(f"runstate cluster of {nodes} nodes is up (data and logs in {data_dir})", flush=True)
        print("Point clients at it with:", flush=True)
        print(f"  export RUNSTATE_BASE_URL={','.join(api_urls)}", flush=True)
        print(f"  export RUNSTATE_SPACE_ID={DEFAULT_SPACE}", flush=True)
        print(f"  export RUNSTATE_API_KEY=$(cat {key_file})", flush=True)
        curl = "curl"
        if certs is not None:
            print(f"  export RUNSTATE_CA_FILE={certs / f'{CA_NAME}.pem'}", flush=True)
            curl = 'curl --cacert "$RUNSTATE_CA_FILE"'
        print(f'See the nodes with: {curl} -H "Authorization: Bearer $RUNSTATE_API_KEY" {api_urls[0]}/v1/cluster', flush=True)
        print("Stop them all with Ctrl-C.", flush=True)
        reported: set[str] = set()
        while not stopping:
            for node_id, process in processes.items():
                if process.poll() is not None and node_id not in reported:
                    reported.add(node_id)
                    print(f"runstate: node {node_id} exited with {process.returncode}: {logs[node_id].why()}", flush=True)
            time.sleep(WATCH_INTERVAL_S)
        print("runstate: stopping the cluster", flush=True)
        return 0
    finally:
        _stop_all(processes)


def _secret_file(data_dir: Path, name: str, secret: str) -> Path:
    """DATA_DIR/name holding `secret` (mode 0600), unless an earlier run wrote it: then that one."""
    path = data_dir / name
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secret)
    return path


def _certs(data_dir: Path, ids: list[str]) -> Path:
    """DATA_DIR/certs with the CA and every node's certificate and key: written by `certs init` if
    it holds no CA yet, else reused (ConfigError, one line, if a node's files are missing)."""
    out = data_dir / CERTS_DIR_NAME
    if not (out / f"{CA_NAME}.pem").exists():
        make_private_dir(out)
        try:
            certs_init(out, ids, [], CERT_DAYS_DEFAULT)
        except CertsError as error:
            raise ConfigError(f"--tls: {error}") from None
    missing = [str(out / f"{node_id}{suffix}") for node_id in ids for suffix in (".pem", ".key")
               if not (out / f"{node_id}{suffix}").exists()]
    if missing:
        raise ConfigError(f"--tls: {', '.join(missing)} missing: remove {out} to have every certificate made anew "
                          f"(runstate certs init), or write them with the CA there")
    return out


class _NodeLog:
    """A node's log file, and where this start of the node began writing to it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.start_offset = 0

    def first_error(self) -> str | None:
        """The first error this start of the node logged: a line logged at ERROR or CRITICAL, the
        last line of a traceback (the exception and its message), or a one-line error of the
        command (`runstate: ...`); else its last line; None when it wrote nothing (or the log
        cannot be read)."""
        try:
            with open(self.path, "rb") as file:
                file.seek(self.start_offset)
                text = file.read(LOG_SCAN_BYTES_MAX).decode(errors="replace")
        except OSError:
            return None
        lines = [line.rstrip() for line in text.splitlines() if line.strip()]
        in_traceback = False
        for line in lines:
            if in_traceback:
                if not line[:1].isspace():  # the frames are indented; the exception line is not
                    return _cut(line)
            elif line.startswith(TRACEBACK_START):
                in_traceback = True
            elif line.startswith(COMMAND_ERROR_PREFIX):
                return _cut(line.removeprefix(COMMAND_ERROR_PREFIX))
            elif any(level in line for level in LOG_ERROR_LEVELS):
                return _cut(line)
        return _cut(lines[-1]) if lines else None

    def why(self) -> str:
        """The first error of the node's log and the log's path, for a one-line message."""
        error = self.first_error()
        return f"{error if error is not None else 'its log is empty'} (log: {self.path})"


def _cut(line: str) -> str:
    return line if len(line) <= ERROR_LINE_CHARS_MAX else line[:ERROR_LINE_CHARS_MAX] + "..."


def _wait_healthy(
    urls: dict[str, str], processes: dict[str, subprocess.Popen[bytes]], logs: dict[str, _NodeLog], stopping: object,
    context: ssl.SSLContext | None,
) -> bool:
    """Whether every node answers healthy within HEALTHY_TIMEOUT_S. If not (a node exited, the
    time ran out, or a stop was asked for), says which node and why on stderr, one line a node."""
    deadline = time.monotonic() + HEALTHY_TIMEOUT_S
    pending = set(urls)
    while pending:
        for node_id, process in processes.items():
            if process.poll() is not None:
                print(f"runstate: node {node_id} exited with {process.returncode} while starting: {logs[node_id].why()}",
                      file=sys.stderr)
                return False
        if callable(stopping) and stopping():
            print(f"runstate: stopped while {', '.join(sorted(pending))} had not answered healthy", file=sys.stderr)
            return False
        if time.monotonic() > deadline:
            for node_id in sorted(pending):
                print(f"runstate: no healthy answer from node {node_id} ({urls[node_id]}) in {HEALTHY_TIMEOUT_S:.0f} s: "
                      f"{logs[node_id].why()}", file=sys.stderr)
            return False
        for node_id in sorted(pending):
            try:
                with urllib.request.urlopen(f"{urls[node_id]}/v1/health", timeout=PROBE_TIMEOUT_S, context=context) as response:
                    if json.load(response).get("status") == "ok":
                        pending.discard(node_id)
            except (OSError, urllib.error.URLError, ValueError):
                pass
        time.sleep(0.1)
    return True


def _stop_all(processes: dict[str, subprocess.Popen[bytes]]) -> None:
    for process in processes.values():
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes.values():
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
