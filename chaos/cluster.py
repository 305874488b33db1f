"""A runstate cluster for chaos runs: `runstate node` processes on 127.0.0.1 whose Raft traffic
crosses one TCP proxy per node, so a partition needs no root; three nodes to start with, and
membership changes while it serves (a node replaced by a fresh one, nodes added and removed).

    cluster = ChaosCluster(root)
    leader = cluster.up()               # proxies, three nodes, one leader (bounded wait)
    cluster.partition(leader)           # isolate it: every pair with it is cut
    cluster.heal()
    cluster.kill(1); cluster.start(1)   # kill -9, then restart on the same data dir
    cluster.wait_healthy()
    cluster.kill(1); cluster.remove_member(cluster.ids[1], asked=[0, 2])
    cluster.join(1)                     # a fresh node n4 in n2's place, started with --join
    cluster.wait_members(10.0)          # every member lists the same voters, n4 among them
    cluster.close()                     # also run at exit: nothing is left running

Nodes are indexes (slots) 0, 1, 2, ... in `ids` order: n1, n2, n3 first. A slot keeps its index
when a fresh node takes it (`join(index)`: a new id, n4, n5, ..., new ports, a new data dir), so
whoever holds an index (the workload's clients, a fault's target) follows the membership; slots
added after the first three (`join()`) are dropped from the end (`drop()`). Node `nK` logs to
ROOT/nK.log and keeps its data in ROOT/nK. Only the installed package is used (`python -m
runstate_server.node.cli node`).

How the Raft traffic is routed (chaos/proxy.py): every node's Raft address (`--raft`, what every
member names it by, in --peer flags, in membership entries and in /v1/health's `leader`) is its
proxy's port, and the node binds another one (`--raft-bind`). Of two nodes, the one whose address
is greater dials the other's proxy (pysyncobj 0.3.17, transport.py `_shouldConnect`; a learner
dials every voter); the proxy finds which node dialed, so `partition(i)` cuts exactly the pairs
of node i: every connection into its proxy, and its own connections into the others'.

With `tls=True` (`python -m chaos run --tls`) the APIs serve HTTPS and the Raft traffic is mutual
TLS: `runstate certs init` writes a private CA and node certificates into ROOT/certs, each node
serves its own (`--tls-cert`, `--tls-key`), trusts the CA for the others' APIs (`--tls-ca`:
forwarding, joining) and presents the same certificate on the Raft port (`--peer-tls-*`; the
proxies carry the TLS bytes as they are), and the harness's clients trust the CA (`context`; the
SDK's `once` callers through the environment).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chaos.proxy import NodeProxy

# What a node that joined keeps in its data dir (the server's runstate_server/node/membership.py;
# the harness imports nothing of the server).
MEMBERSHIP_FILE_NAME = "membership.json"

NODES = 3  # the cluster's first members (and how many voters a replace keeps)
NODES_MAX = 5  # the most it ever has (a grow adds two)
HOST = "127.0.0.1"
# Five-digit ports below Linux's ephemeral range, so outgoing connections rarely take them.
PORT_RANGE = range(20000, 30000)
PORT_PICK_TRIES = 500
PORTS_PER_NODE = 3  # its API, its proxy (its Raft address), the Raft port it binds
# Bounds of every wait.
START_TIMEOUT_S = 60.0  # fresh nodes find a leader (2 cores, 3 nodes, Python startup)
HEALTHY_TIMEOUT_S = 30.0  # the cluster comes back after a fault
LEADER_TIMEOUT_S = 30.0  # an election
CONVERGE_TIMEOUT_S = 30.0  # replicas reach one applied index and digest
# SIGTERM until exit, before SIGKILL. A node drains its in-flight requests first (aiohttp's own
# bound is 60 s): under load, with all three stopping at once, followers took ~10 s.
STOP_TIMEOUT_S = 20.0
KILL_TIMEOUT_S = 10.0  # SIGKILL until reaped
PROBE_TIMEOUT_S = 1.0  # one HTTP probe of one node
# One POST /v1/cluster/transfer-leader: the node's own bound on the handover (5 s) and on learning
# the new leader afterwards (2 s), plus a follower's forwarding and a busy machine's slack.
TRANSFER_CALL_TIMEOUT_S = 15.0
# One DELETE /v1/cluster/members/{id}: the node's bound on the membership entry's commit (10 s),
# plus forwarding and slack. Refusals that a moment cures (503: no leader or it stopped leading;
# 409: another change under way, or a majority not reachable yet) are asked again, through the
# next member, for at most REMOVE_TIMEOUT_S in all.
REMOVE_CALL_TIMEOUT_S = 15.0
REMOVE_TIMEOUT_S = 30.0
REMOVE_RETRY_PAUSE_S = 0.5
# One GET /v1/cluster: the node asks every other member's health (0.5 s each, in parallel).
VIEW_TIMEOUT_S = 3.0
# A fresh node started with --join until every member lists it as a voter: its own start and join
# (the node asks the members for up to 60 s), catching up with the log, its promotion.
JOIN_TIMEOUT_S = 90.0
MEMBERS_POLL_S = 0.25
POLL_S = 0.05
# Health must hold this long to count: a node that has just reconnected (after a partition or a
# SIGSTOP) tries an election within a tick or two if its election deadline passed meanwhile
# (pysyncobj only campaigns while connected to someone). Pre-vote (runstate_server/cluster/_prevote.py)
# keeps it from deposing a healthy leader; a leader that really lost its majority is still being
# replaced in that window. Above raft_timeout_s_min (0.3 s) plus a few 50 ms ticks.
HEALTHY_STABLE_S = 0.5
LOG_TAIL_CHARS = 3000
SECRET_BYTES = 32
LOG_LEVEL_DEFAULT = "WARNING"
# --tls: certificates made once per run with `runstate certs init` for n1 .. nCERT_IDS (its --nodes
# at most), of its default validity (825 days: one within 30 days of its end would be warned of in
# every node's log at each start). A node whose id is past them (a long run's replaces and grows
# give new ids) serves the certificate CERT_IDS ids below its own: the same CA's, and every one
# names 127.0.0.1, the host of every Raft address here.
CERTS_DIR_NAME = "certs"
CERT_IDS = 64
CERTS_TIMEOUT_S = 60.0  # `certs init` writes 64 keys and certificates (a second or so)
# What ssl.create_default_context() reads: the SDK's `once` callers trust the CA through it (an SDK
# without RUNSTATE_CA_FILE). The nodes are given the CA by flag, and their environment holds neither.
OPENSSL_CA_FILE_ENV = "SSL_CERT_FILE"
CA_FILE_ENV = "RUNSTATE_CA_FILE"  # the SDKs' own setting (issue 42)


class ClusterError(Exception):
    """A bounded wait ran out, or a node exited on its own; the message says what was last seen."""


def _get_json(
    url: str, key: str | None = None, timeout_s: float = PROBE_TIMEOUT_S, context: ssl.SSLContext | None = None,
) -> tuple[int, Any] | None:
    """(status, body) of a GET (with `key` as the bearer), or None when nothing answered."""
    return _call_json("GET", url, key, None, timeout_s, context)


def _call_json(
    method: str, url: str, key: str | None, body: Any, timeout_s: float, context: ssl.SSLContext | None = None,
) -> tuple[int, Any] | None:
    """(status, body) of a call (with `key` as the bearer, `body` as JSON unless None; an https://
    one verified with `context`), or None when nothing answered within timeout_s."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        payload = error.read()
        error.close()
        try:
            return error.code, json.loads(payload or b"null")
        except ValueError:
            return error.code, None
    except (OSError, ValueError):
        return None


def error_code(body: Any) -> str | None:
    """The error code of an answer's envelope (`{"error": {"code": ...}}`), None when it has none."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def free_ports(count: int, avoid: Collection[int] = ()) -> list[int]:
    """`count` distinct ports of PORT_RANGE, none of `avoid`, that bind now (all held while they
    are picked)."""
    chooser = random.SystemRandom()  # not the run's seed: a replay must not depend on port luck
    held: list[socket.socket] = []
    try:
        for candidate in chooser.sample(PORT_RANGE, PORT_PICK_TRIES):
            if candidate in avoid:
                continue
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                probe.bind((HOST, candidate))
            except OSError:
                probe.close()
                continue
            held.append(probe)
            if len(held) == count:
                return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()
    raise ClusterError(f"no {count} free ports in {PORT_RANGE} after {PORT_PICK_TRIES} tries")


def make_certs(out: Path) -> Path:
    """`runstate certs init` into `out`: a private CA and certificates for n1 .. nCERT_IDS; `out`."""
    command = [
        sys.executable, "-m", "runstate_server.node.cli", "certs", "init", "--out", str(out),
        "--nodes", ",".join(f"n{number}" for number in range(1, CERT_IDS + 1)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CERTS_TIMEOUT_S)
    if done.returncode != 0:
        raise ClusterError(f"runstate certs init failed ({done.returncode}): {done.stderr.strip()}")
    return out


def cert_name(node_id: str) -> str:
    """The certificate node `node_id` (nK) serves: its own, or for K past CERT_IDS one CERT_IDS below."""
    number = int(node_id.removeprefix("n"))
    return f"n{(number - 1) % CERT_IDS + 1}"


@dataclass(frozen=True)
class Peer:
    """Another member as a node's --peer flag names it."""

    id: str
    raft: str
    url: str


@dataclass
class _Slot:
    """One node: its names, its ports, its proxy, its process (None until started)."""

    id: str
    api_port: int
    raft_port: int  # its proxy's: the Raft address every member names it by
    bind_port: int  # the Raft port the node itself binds
    proxy: NodeProxy
    peers: tuple[Peer, ...]  # a first member's --peer flags; empty for a node that joins
    scheme: str = "http"  # its API's: https with --tls
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.api_port}"

    @property
    def raft(self) -> str:
        return f"{HOST}:{self.raft_port}"


class ChaosCluster:
    """Three nodes to start with, one proxy each; indexes are slots (module docstring)."""

    def __init__(self, root: Path, *extra_args: str, log_level: str = LOG_LEVEL_DEFAULT, tls: bool = False) -> None:
        """Writes the secret and the bootstrap admin key (and with `tls` the certificates) under
        `root` and picks the first three nodes' ports; starts nothing (see up() and start())."""
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.extra_args = extra_args
        self.log_level = log_level
        # --tls: the CA every client of the harness trusts (None: plain HTTP).
        self.certs: Path | None = make_certs(root / CERTS_DIR_NAME) if tls else None
        self.ca_file: Path | None = self.certs / "ca.pem" if self.certs else None
        self.context: ssl.SSLContext | None = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file else None
        self.secret_file = root / "cluster.secret"
        self.secret_file.write_text(secrets.token_urlsafe(SECRET_BYTES))
        self.admin_key = "rsk_" + secrets.token_urlsafe(SECRET_BYTES)
        self.admin_key_file = root / "bootstrap.key"
        self.admin_key_file.write_text(self.admin_key)

        self.slots: list[_Slot] = []
        self.departed: list[_Slot] = []  # nodes replaced or dropped, for the report and close()
        self._ports_used: set[int] = set()  # every port ever given to a node or a proxy
        self._ids_given = 0
        firsts = [self._new_slot(()) for _ in range(NODES)]
        peers = [Peer(slot.id, slot.raft, slot.url) for slot in firsts]
        for slot in firsts:
            slot.peers = tuple(peer for peer in peers if peer.id != slot.id)
        self.slots = firsts
        self.pids_started: list[int] = []  # every process ever started, for leak checks
        self.paused: set[int] = set()
        self.isolated: set[int] = set()
        self.expected: set[int] = set()  # started and not killed or stopped on purpose
        self._watchers: list[Callable[[list[str]], None]] = []
        self._proxies_started = False
        self._closed = False
        self._lock = threading.RLock()  # the injector's thread and the caller's both act on nodes
        atexit.register(self.close)

    def __repr__(self) -> str:
        states = []
        for index in range(self.size):
            state = "paused" if index in self.paused else "up" if self.running(index) else "down"
            states.append(f"{self.ids[index]}={state}{'/isolated' if index in self.isolated else ''}")
        return f"<ChaosCluster {self.root} {' '.join(states)}>"

    def _new_slot(self, peers: tuple[Peer, ...]) -> _Slot:
        api_port, raft_port, bind_port = free_ports(PORTS_PER_NODE, avoid=self._ports_used)
        self._ports_used.update((api_port, raft_port, bind_port))
        self._ids_given += 1
        node_id = f"n{self._ids_given}"
        proxy = NodeProxy(node_id, raft_port, bind_port, self.pids)
        return _Slot(node_id, api_port, raft_port, bind_port, proxy, peers, "https" if self.certs else "http")

    # -- where things are ----------------------------------------------------------------------

    @property
    def size(self) -> int:
        """How many nodes the cluster has now (slots)."""
        return len(self.slots)

    @property
    def ids(self) -> list[str]:
        return [slot.id for slot in self.slots]

    @property
    def urls(self) -> list[str]:
        return [slot.url for slot in self.slots]

    @property
    def rafts(self) -> list[str]:
        """Every node's Raft address, as all members name it (its proxy's)."""
        return [slot.raft for slot in self.slots]

    @property
    def base_url(self) -> str:
        """Every node's API, comma-separated (what RUNSTATE_BASE_URL holds)."""
        return ",".join(self.urls)

    def urls_from(self, index: int) -> str:
        """Every node's API starting with node `index` (so clients spread over the nodes)."""
        urls = self.urls
        return ",".join(urls[index:] + urls[:index])

    def data_dir(self, index: int) -> Path:
        return self.root / self.slots[index].id

    def log_path(self, index: int) -> Path:
        return self.root / f"{self.slots[index].id}.log"

    def index_of(self, raft_address: str | None) -> int | None:
        """Which node has the Raft address `raft_address` (None: unknown or None)."""
        return next((index for index, slot in enumerate(self.slots) if slot.raft == raft_address), None)

    def watch(self, callback: Callable[[list[str]], None]) -> None:
        """Call `callback(urls)` with every node's API (index order) after each membership change
        the harness makes (join, drop); from the thread that made it."""
        self._watchers.append(callback)

    def command(self, index: int) -> list[str]:
        """Node `index`'s command line: a first member names the others with --peer; a node that
        joins names the running members' APIs with --join (which a restart on its data dir ignores:
        the data dir names its role and the voters)."""
        slot = self.slots[index]
        command = [
            sys.executable, "-m", "runstate_server.node.cli", "node",
            "--node-id", slot.id,
            "--api", f"{HOST}:{slot.api_port}",
            "--raft", slot.raft,
            "--raft-bind", f"{HOST}:{slot.bind_port}",
            "--data-dir", str(self.data_dir(index)),
            "--secret-file", str(self.secret_file),
            "--bootstrap-key-file", str(self.admin_key_file),
            "--log-level", self.log_level,
            *self.extra_args,
        ]
        if self.certs is not None:
            cert, key = (str(self.certs / f"{cert_name(slot.id)}{suffix}") for suffix in (".pem", ".key"))
            command += ["--tls-cert", cert, "--tls-key", key, "--tls-ca", str(self.ca_file),
                        "--peer-tls-cert", cert, "--peer-tls-key", key, "--peer-tls-ca", str(self.ca_file)]
        for peer in slot.peers:
            command += ["--peer", f"{peer.id},{peer.raft},{peer.url}"]
        # A node that joined keeps its role and the voters in its data dir: a restart needs no --join
        # (and at a restart of every node there is no member running to name).
        if not slot.peers and not (self.data_dir(index) / MEMBERSHIP_FILE_NAME).exists():
            members = [other.url for other_index, other in enumerate(self.slots) if other_index != index and self.running(other_index)]
            command += ["--join", ",".join(members)]
        return command

    def layout(self) -> dict[str, Any]:
        """Ports and routes, for the report."""
        return {
            "nodes": [
                {"id": slot.id, "api": slot.url, "raft": slot.raft, "bind": f"{HOST}:{slot.bind_port}",
                 "peers": [peer.id for peer in slot.peers], "joins": not slot.peers}
                for slot in self.slots
            ],
            "proxies": [
                {"node": slot.id, "listen": slot.raft_port, "target": slot.bind_port} for slot in self.slots
            ],
        }

    # -- process state -------------------------------------------------------------------------

    def running(self, index: int) -> bool:
        process = self.slots[index].process
        return process is not None and process.poll() is None

    def live(self) -> list[int]:
        """Nodes running and not paused."""
        return [index for index in range(self.size) if self.running(index) and index not in self.paused]

    def pids(self) -> dict[str, int]:
        """The pid of every running node process, by node id (any thread: the proxies ask)."""
        return {
            slot.id: slot.process.pid
            for slot in list(self.slots)
            if slot.process is not None and slot.process.poll() is None
        }

    def exited(self) -> dict[str, int]:
        """Nodes that should be running but exited on their own: node id -> exit code."""
        found: dict[str, int] = {}
        for index in sorted(self.expected):
            process = self.slots[index].process
            code = process.poll() if process is not None else None
            if code is not None:
                found[self.slots[index].id] = code
        return found

    # -- processes -----------------------------------------------------------------------------

    def up(self, timeout_s: float = START_TIMEOUT_S) -> int:
        """Start the proxies and every node, wait until they agree on a leader; its index."""
        self.start()
        return self.wait_healthy(timeout_s)

    def start(self, *indexes: int) -> None:
        """Start the given nodes (all when none is given) without waiting; proxies first."""
        with self._lock:
            assert not self._closed, "this cluster was closed"
            if not self._proxies_started:
                self._proxies_started = True
                for slot in self.slots:
                    slot.proxy.start()
            for index in indexes or range(self.size):
                self._spawn(index)

    def _spawn(self, index: int) -> None:
        assert not self.running(index), f"{self.slots[index].id} is already running"
        command = self.command(index)
        with open(self.log_path(index), "ab") as log_file:
            log_file.write(f"--- {time.strftime('%H:%M:%S')} start {' '.join(command)}\n".encode())
            log_file.flush()
            # Its own session: a Ctrl-C at the terminal reaches the harness, which kills the nodes.
            process = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, env=self.node_environment(), start_new_session=True
            )
        self.slots[index].process = process
        self.pids_started.append(process.pid)
        self.paused.discard(index)
        self.expected.add(index)

    def node_environment(self) -> dict[str, str]:
        """A node's environment: the harness's, without the CA settings `chaos run --tls` gives the
        SDK (a node trusts the CA by its --tls-ca, and nothing else may make it)."""
        return {name: value for name, value in os.environ.items() if name not in (OPENSSL_CA_FILE_ENV, CA_FILE_ENV)}

    def kill(self, index: int) -> None:
        """kill -9: no chance to flush or say goodbye (a paused node dies too)."""
        with self._lock:
            self.expected.discard(index)
            self._kill_process(self.slots[index])
            self.paused.discard(index)

    @staticmethod
    def _kill_process(slot: _Slot) -> None:
        process = slot.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            try:
                process.wait(KILL_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise ClusterError(f"{slot.id} (pid {process.pid}) outlived SIGKILL for {KILL_TIMEOUT_S} s") from None

    def pause(self, index: int) -> None:
        """SIGSTOP: the process is frozen, its sockets stay open."""
        with self._lock:
            process = self.slots[index].process
            assert process is not None and process.poll() is None, f"{self.slots[index].id} is not running"
            process.send_signal(signal.SIGSTOP)
            self.paused.add(index)

    def resume(self, index: int) -> None:
        """SIGCONT a paused node."""
        with self._lock:
            process = self.slots[index].process
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
            self.paused.discard(index)

    def stop(self, index: int) -> int | None:
        """Graceful stop: SIGTERM, wait STOP_TIMEOUT_S, then SIGKILL. Its exit code."""
        return self._stop([index])[0]

    def stop_all(self) -> list[int | None]:
        """stop() of every node at once (one SIGTERM each, then one shared bounded wait)."""
        return self._stop(list(range(self.size)))

    def _stop(self, indexes: Sequence[int]) -> list[int | None]:
        with self._lock:
            signalled: list[subprocess.Popen[bytes] | None] = []
            for index in indexes:
                self.expected.discard(index)
                process = self.slots[index].process
                if process is not None and process.poll() is None:
                    if index in self.paused:
                        process.send_signal(signal.SIGCONT)  # SIGTERM waits while it is stopped
                    process.send_signal(signal.SIGTERM)
                    signalled.append(process)
                else:
                    signalled.append(None)
                self.paused.discard(index)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            codes: list[int | None] = []
            for index, process in zip(indexes, signalled, strict=True):
                if process is None:
                    codes.append(None)
                    continue
                try:
                    codes.append(process.wait(max(0.0, deadline - time.monotonic())))
                except subprocess.TimeoutExpired:
                    self.kill(index)
                    codes.append(process.returncode)
            return codes

    def restart(self, index: int) -> None:
        """Graceful restart of one node on its data dir (stop(), then start()); does not wait for health."""
        self.stop(index)
        self.start(index)

    def restart_all(self) -> None:
        """Graceful restart of every node (stop_all(), then start()); does not wait for health."""
        self.stop_all()
        self.start()

    # -- membership ------------------------------------------------------------------------------

    def join(self, index: int | None = None) -> int:
        """Start a fresh node (a new id, new ports, an empty data dir) with --join the running
        members' APIs: in slot `index`, whose node must be down (killed, and removed from the
        configuration by the caller), or in a new slot at the end (None). Does not wait. Its index."""
        with self._lock:
            assert not self._closed, "this cluster was closed"
            slot = self._new_slot(())
            if index is None:
                assert self.size < NODES_MAX, f"a chaos cluster has at most {NODES_MAX} nodes"
                self.slots.append(slot)
                index = self.size - 1
            else:
                assert not self.running(index), f"{self.slots[index].id} is still running"
                self._depart(index)
                self.slots[index] = slot
            if self._proxies_started:
                slot.proxy.start()
            self._spawn(index)
        self._tell_watchers()
        return index

    def drop(self, index: int) -> None:
        """kill -9 the last slot's node (removed from the configuration by the caller, or never
        in it) and forget the slot; the others keep their indexes."""
        with self._lock:
            assert index == self.size - 1 and index >= NODES, "only a slot added by join() is dropped, the last first"
            self.kill(index)
            self._depart(index)
            self.slots.pop()
        self._tell_watchers()

    def _depart(self, index: int) -> None:
        """Slot `index`'s node leaves: its proxy closes (after the cut it carries nothing), the
        slot's state is forgotten."""
        slot = self.slots[index]
        slot.proxy.close()
        self.departed.append(slot)
        for states in (self.paused, self.isolated, self.expected):
            states.discard(index)

    def _tell_watchers(self) -> None:
        urls = self.urls
        for callback in self._watchers:
            callback(urls)

    def remove_member(self, node_id: str, asked: Sequence[int], timeout_s: float = REMOVE_TIMEOUT_S) -> dict[str, Any]:
        """DELETE /v1/cluster/members/{node_id} with the admin key, through the nodes `asked` in
        turn (a follower forwards it to the leader), until it is answered 200 or 404 (no such
        voter: an earlier call whose answer was lost removed it), another refusal that waiting
        does not cure, or timeout_s passed. Returns {"status", "answer", "calls", "removeS",
        "removed"} of the last call (status None: nothing answered)."""
        began = time.monotonic()
        deadline = began + timeout_s
        calls = 0
        answer: tuple[int, Any] | None = None
        while True:
            index = asked[calls % len(asked)]
            calls += 1
            answer = _call_json(
                "DELETE", f"{self.urls[index]}/v1/cluster/members/{node_id}", self.admin_key, None,
                min(REMOVE_CALL_TIMEOUT_S, max(PROBE_TIMEOUT_S, deadline - time.monotonic())), self.context,
            )
            status = None if answer is None else answer[0]
            if status in (200, 404) or (status is not None and status not in (409, 503)):
                break
            if time.monotonic() + REMOVE_RETRY_PAUSE_S >= deadline:
                break
            time.sleep(REMOVE_RETRY_PAUSE_S)
        return {
            "status": None if answer is None else answer[0], "answer": None if answer is None else answer[1],
            "calls": calls, "removeS": round(time.monotonic() - began, 3),
            "removed": answer is not None and answer[0] in (200, 404),
        }

    def cluster_view(self, index: int) -> dict[str, Any] | None:
        """Node `index`'s GET /v1/cluster (leader, nodes with voter flags), None unless it answered 200."""
        answer = _get_json(f"{self.urls[index]}/v1/cluster", self.admin_key, VIEW_TIMEOUT_S, self.context)
        return answer[1] if answer is not None and answer[0] == 200 and isinstance(answer[1], dict) else None

    def members_agree(self) -> tuple[bool, dict[str, Any]]:
        """Whether every running, unpaused node's GET /v1/cluster lists exactly the nodes of the
        slots, each a voter; and what each said (node id -> [[id, voter], ...], or None)."""
        wanted = sorted(self.ids)
        seen: dict[str, Any] = {}
        agreed = bool(self.live())
        for index in self.live():
            view = self.cluster_view(index)
            nodes = view.get("nodes") if view is not None else None
            if not isinstance(nodes, list):
                seen[self.ids[index]] = None
                agreed = False
                continue
            listed = sorted([str(node.get("id")), node.get("voter") is True] for node in nodes)
            seen[self.ids[index]] = listed
            agreed = agreed and listed == [[node_id, True] for node_id in wanted]
        return agreed, seen

    def wait_members(self, timeout_s: float = JOIN_TIMEOUT_S) -> float:
        """Wait until members_agree(): every member lists the slots' nodes, all voters (a node
        that joined was promoted, a removed one is gone everywhere); the seconds it took.
        ClusterError after timeout_s, or at once if a node exited on its own."""
        began = time.monotonic()
        deadline = began + timeout_s
        while True:
            exited = self.exited()
            if exited:
                raise ClusterError(f"waiting for the members to agree: exited on their own {exited}")
            agreed, seen = self.members_agree()
            if agreed:
                return round(time.monotonic() - began, 3)
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"the members did not list {sorted(self.ids)} as voters within {timeout_s} s; last seen {json.dumps(seen)}"
                )
            time.sleep(MEMBERS_POLL_S)

    # -- partitions ------------------------------------------------------------------------------

    def partition(self, index: int) -> None:
        """Isolate node `index`: every pair with it is cut until heal(). Its API still answers."""
        with self._lock:
            assert self._proxies_started, "start the cluster before partitioning it"
            isolated = self.slots[index]
            for slot in self.slots:
                if slot is isolated:
                    slot.proxy.partition()
                else:
                    slot.proxy.block(isolated.id)
            self.isolated.add(index)

    def heal(self) -> None:
        """Reconnect every pair (the nodes redial by themselves)."""
        with self._lock:
            if self._proxies_started:
                for slot in self.slots:
                    slot.proxy.heal()
            self.isolated.clear()

    def proxy_stats(self) -> list[dict[str, Any]]:
        """Every proxy's counters, those of departed nodes too."""
        return [asdict(slot.proxy.stats()) for slot in [*self.slots, *self.departed]]

    # -- what the nodes say --------------------------------------------------------------------

    def node_health(self, index: int) -> dict[str, Any]:
        """Node `index`'s /v1/health, with its leader as a node id; a paused or stopped node is not
        asked (`answering` false)."""
        view: dict[str, Any] = {
            "id": self.ids[index], "running": self.running(index), "paused": index in self.paused,
            "isolated": index in self.isolated, "answering": False, "status": None, "role": None,
            "leader": None, "leaderAddress": None, "term": None, "appliedIndex": None, "commitIndex": None,
        }
        if not view["running"] or view["paused"]:
            return view
        answer = _get_json(f"{self.urls[index]}/v1/health", context=self.context)
        if answer is None or not isinstance(answer[1], dict):
            return view
        body = answer[1]
        leader = self.index_of(body.get("leader"))
        view.update(
            answering=True, status=body.get("status"), role=body.get("role"),
            leader=None if leader is None else self.ids[leader], leaderAddress=body.get("leader"),
            term=body.get("term"), appliedIndex=body.get("appliedIndex"), commitIndex=body.get("commitIndex"),
        )
        return view

    def health(self) -> dict[str, dict[str, Any]]:
        """Every node's node_health(), by node id."""
        return {self.ids[index]: self.node_health(index) for index in range(self.size)}

    def agreed_leader(self, indexes: Sequence[int], views: dict[str, dict[str, Any]] | None = None) -> int | None:
        """The index of the node every listed node names as leader and that says it leads; None
        when one of them does not answer 200 or they disagree."""
        if not indexes:
            return None
        views = views if views is not None else self.health()
        asked = [views[self.ids[index]] for index in indexes]
        if any(not view["answering"] or view["status"] != "ok" for view in asked):
            return None
        leaders = {view["leader"] for view in asked}
        if len(leaders) != 1 or None in leaders:
            return None
        leader = self.ids.index(leaders.pop())
        if leader not in indexes or views[self.ids[leader]]["role"] != "leader":
            return None
        return leader

    def pairs_connected(self, indexes: Collection[int]) -> bool:
        """Every pair of the given nodes has a live connection through one of their proxies (the
        Raft view the nodes' own health cannot give: an isolated follower still names the old
        leader)."""
        chosen = sorted(indexes)
        for position, a in enumerate(chosen):
            for b in chosen[position + 1:]:
                first, second = self.slots[a], self.slots[b]
                if a in self.isolated or b in self.isolated:
                    return False
                if first.proxy.live_from(second.id) + second.proxy.live_from(first.id) == 0:
                    return False
        return True

    def _wait_for_leader(self, what: str, asked: Callable[[], list[int]], timeout_s: float) -> tuple[int, float]:
        """(leader, since): the first moment of a stretch of at least HEALTHY_STABLE_S in which
        the asked nodes answered 200, named one leader at one term, and had every pair connected."""
        deadline = time.monotonic() + timeout_s
        views: dict[str, dict[str, Any]] = {}
        stable: tuple[int, Any] | None = None  # (leader, its term) of the current stretch
        since = 0.0
        while True:
            exited = self.exited()
            if exited:
                raise ClusterError(f"waiting for {what}: exited on their own {exited}\n{self.logs_tail()}")
            nodes = asked()
            if not nodes:
                raise ClusterError(f"waiting for {what}: no node is running and reachable ({self!r})")
            probed_at = time.monotonic()
            views = self.health()
            leader = self.agreed_leader(nodes, views)
            if leader is None or not self.pairs_connected(nodes):
                stable = None
            else:
                seen = (leader, views[self.ids[leader]]["term"])
                if seen != stable:
                    stable, since = seen, probed_at
                if time.monotonic() - since >= HEALTHY_STABLE_S:
                    return leader, since
            if time.monotonic() >= deadline:
                raise ClusterError(f"gave up waiting for {what} after {timeout_s} s; last seen {json.dumps(views)}")
            time.sleep(POLL_S)

    def wait_healthy(self, timeout_s: float = HEALTHY_TIMEOUT_S) -> int:
        """Wait until every running, unpaused node answers health 200, they agree on one leader
        among them, and every pair of them is connected, for HEALTHY_STABLE_S; the leader's index.
        ClusterError after timeout_s, or at once if a node exited on its own."""
        return self.wait_healthy_since(timeout_s)[0]

    def wait_healthy_since(self, timeout_s: float = HEALTHY_TIMEOUT_S) -> tuple[int, float]:
        """wait_healthy(), and the time.monotonic() at which the healthy stretch began."""
        return self._wait_for_leader("every live node healthy under one leader", self.live, timeout_s)

    def leader(self, timeout_s: float = LEADER_TIMEOUT_S) -> int:
        """The leader that the live nodes outside any partition agree on (waits out an election,
        and HEALTHY_STABLE_S more); ClusterError after timeout_s."""
        return self._wait_for_leader(
            "a leader", lambda: [index for index in self.live() if index not in self.isolated], timeout_s
        )[0]

    def transfer_leader(self, asked: int, to: int) -> tuple[int, Any] | None:
        """POST /v1/cluster/transfer-leader `{"to": <node to's id>}` to node `asked`'s API (a
        follower forwards it to the leader) with the admin key: (status, body), or None when nothing
        answered within TRANSFER_CALL_TIMEOUT_S."""
        return _call_json(
            "POST", f"{self.urls[asked]}/v1/cluster/transfer-leader", self.admin_key, {"to": self.ids[to]},
            TRANSFER_CALL_TIMEOUT_S, self.context,
        )

    def digests(self) -> dict[str, dict[str, Any] | None]:
        """Every node's GET /v1/cluster/digest (appliedIndex, digest, dataDigest), by node id; None
        for a node that is down, paused or did not answer 200."""
        found: dict[str, dict[str, Any] | None] = {}
        live = self.live()
        for index in range(self.size):
            answer = (
                _get_json(f"{self.urls[index]}/v1/cluster/digest", key=self.admin_key, context=self.context)
                if index in live else None
            )
            found[self.ids[index]] = answer[1] if answer is not None and answer[0] == 200 else None
        return found

    def wait_converged(self, timeout_s: float = CONVERGE_TIMEOUT_S) -> str:
        """Wait until every live node reports one applied index and one digest (ticks move the
        index while idle, so this polls); the digest. ClusterError after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            live = self.live()
            views = self.digests()
            seen = [views[self.ids[index]] for index in live]
            agreed = {(view["appliedIndex"], view["digest"]) for view in seen if view is not None}
            if live and None not in seen and len(agreed) == 1:
                return str(agreed.pop()[1])
            if time.monotonic() >= deadline:
                raise ClusterError(f"digests never agreed within {timeout_s} s; last seen {json.dumps(views)}")
            time.sleep(POLL_S)

    def logs_tail(self) -> str:
        """The end of every node's log, for failure messages."""
        parts = []
        for index in range(self.size):
            try:
                text = self.log_path(index).read_text(errors="replace")[-LOG_TAIL_CHARS:]
            except OSError:
                text = "(no log)"
            parts.append(f"===== {self.ids[index]} ({self.log_path(index)}) =====\n{text}")
        return "\n".join(parts)

    # -- the end ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Resume paused nodes, kill every node, stop the proxies. Idempotent; also run at exit."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            atexit.unregister(self.close)
            self.expected.clear()
            processes = [slot.process for slot in [*self.slots, *self.departed] if slot.process is not None]
            for process in processes:
                if process.poll() is not None:
                    continue
                with contextlib.suppress(OSError):
                    process.send_signal(signal.SIGCONT)
                    process.send_signal(signal.SIGKILL)
            for process in processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(KILL_TIMEOUT_S)
            self.paused.clear()
            for slot in [*self.slots, *self.departed]:
                slot.proxy.close()
            self.isolated.clear()

    def __enter__(self) -> ChaosCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
