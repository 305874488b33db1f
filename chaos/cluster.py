"""A three-node runstate cluster for chaos runs: `runstate node` processes on 127.0.0.1 whose Raft
traffic crosses one TCP proxy per pair, so a partition needs no root.

    cluster = ChaosCluster(root)
    leader = cluster.up()               # proxies, three nodes, one leader (bounded wait)
    cluster.partition(leader)           # isolate it: every pair with it is cut
    cluster.heal()
    cluster.kill(1); cluster.start(1)   # kill -9, then restart on the same data dir
    cluster.wait_healthy()
    cluster.close()                     # also run at exit: nothing is left running

Nodes are indexes 0, 1, 2 (ids n1, n2, n3). Node i logs to ROOT/n<i+1>.log and keeps its data in
ROOT/n<i+1>. Only the installed package is used (`python -m runstate_server.node.cli node`).

How the pairs are routed (pysyncobj 0.3.17, transport.py `_shouldConnect`): of two nodes, the one
whose own address is *greater* than the address it has for the other dials, once, and says who it
is by sending its own address, which the dialled node must know the caller by. So every node i
has a real Raft address R_i with R_1 < R_2 < R_3, and each pair a < b has a proxy P_ab below every
R, forwarding to R_a: node b lists node a at P_ab (R_b > P_ab, so b dials through the proxy) and
node a lists node b at R_b (R_a < R_b, so a never dials). All ports have five digits, so string
order is numeric order. Each node's --peer list carries its own view of the peer's Raft address,
and so do its /v1/health answers: `health()` maps them back to node ids.
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
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from chaos.proxy import PairProxy

NODES = 3
HOST = "127.0.0.1"
# Five-digit ports (string order is numeric order, which pysyncobj's dial rule compares), below
# Linux's ephemeral range so outgoing connections rarely take them.
PORT_RANGE = range(20000, 30000)
PORT_PICK_TRIES = 500
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


class ClusterError(Exception):
    """A bounded wait ran out, or a node exited on its own; the message says what was last seen."""


def _get_json(url: str, key: str | None = None) -> tuple[int, Any] | None:
    """(status, body) of a GET (with `key` as the bearer), or None when nothing answered."""
    return _call_json("GET", url, key, None, PROBE_TIMEOUT_S)


def _call_json(method: str, url: str, key: str | None, body: Any, timeout_s: float) -> tuple[int, Any] | None:
    """(status, body) of a call (with `key` as the bearer, `body` as JSON unless None), or None
    when nothing answered within timeout_s."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
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


def free_ports(count: int) -> list[int]:
    """`count` distinct ports of PORT_RANGE that bind now (all held while they are picked)."""
    chooser = random.SystemRandom()  # not the run's seed: a replay must not depend on port luck
    held: list[socket.socket] = []
    try:
        for candidate in chooser.sample(PORT_RANGE, PORT_PICK_TRIES):
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


class ChaosCluster:
    """Three nodes and their three pair proxies. Indexes are 0..2; node ids n1..n3."""

    def __init__(self, root: Path, *extra_args: str, log_level: str = LOG_LEVEL_DEFAULT) -> None:
        """Writes the secret and the bootstrap admin key under `root` and picks the ports; starts
        nothing (see up() and start())."""
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.extra_args = extra_args
        self.log_level = log_level
        self.ids = [f"n{index + 1}" for index in range(NODES)]
        self.secret_file = root / "cluster.secret"
        self.secret_file.write_text(secrets.token_urlsafe(SECRET_BYTES))
        self.admin_key = "rsk_" + secrets.token_urlsafe(SECRET_BYTES)
        self.admin_key_file = root / "bootstrap.key"
        self.admin_key_file.write_text(self.admin_key)

        pairs = [(a, b) for a in range(NODES) for b in range(a + 1, NODES)]
        ports = free_ports(2 * NODES + len(pairs))  # APIs, Raft addresses, proxies
        self.api_ports = ports[:NODES]
        raft_like = sorted(ports[NODES:])
        # Every proxy port below every Raft port, Raft ports ascending by index (see the module doc).
        self.raft_ports = raft_like[len(pairs):]
        self.proxy_ports = dict(zip(pairs, raft_like[: len(pairs)], strict=True))
        assert all(len(str(port)) == 5 for port in ports)
        assert max(self.proxy_ports.values()) < min(self.raft_ports) and self.raft_ports == sorted(self.raft_ports)

        self.urls = [f"http://{HOST}:{port}" for port in self.api_ports]
        self.rafts = [f"{HOST}:{port}" for port in self.raft_ports]
        self.proxies = {
            (a, b): PairProxy(f"{self.ids[a]}-{self.ids[b]}", self.proxy_ports[(a, b)], self.raft_ports[a])
            for (a, b) in pairs
        }
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * NODES
        self.pids_started: list[int] = []  # every process ever started, for leak checks
        self.paused: set[int] = set()
        self.isolated: set[int] = set()
        self.expected: set[int] = set()  # started and not killed or stopped on purpose
        self._proxies_started = False
        self._closed = False
        self._lock = threading.RLock()  # the injector's thread and the caller's both act on nodes
        atexit.register(self.close)

    def __repr__(self) -> str:
        states = []
        for index in range(NODES):
            state = "paused" if index in self.paused else "up" if self.running(index) else "down"
            states.append(f"{self.ids[index]}={state}{'/isolated' if index in self.isolated else ''}")
        return f"<ChaosCluster {self.root} {' '.join(states)}>"

    # -- where things are ----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """Every node's API, comma-separated (what RUNSTATE_BASE_URL holds)."""
        return ",".join(self.urls)

    def urls_from(self, index: int) -> str:
        """Every node's API starting with node `index` (so clients spread over the nodes)."""
        return ",".join(self.urls[index:] + self.urls[:index])

    def data_dir(self, index: int) -> Path:
        return self.root / self.ids[index]

    def log_path(self, index: int) -> Path:
        return self.root / f"{self.ids[index]}.log"

    def raft_view(self, viewer: int, other: int) -> str:
        """The Raft address node `viewer` has for node `other` (its own real one for itself)."""
        if viewer <= other:
            return self.rafts[other]  # the lower node never dials, so it knows the real address
        return f"{HOST}:{self.proxy_ports[(other, viewer)]}"  # the higher node dials through the proxy

    def index_in_view(self, viewer: int, raft_address: str | None) -> int | None:
        """Which node `raft_address`, as node `viewer` names it, is (None: unknown or None)."""
        for other in range(NODES):
            if raft_address == self.raft_view(viewer, other):
                return other
        return None

    def command(self, index: int) -> list[str]:
        command = [
            sys.executable, "-m", "runstate_server.node.cli", "node",
            "--node-id", self.ids[index],
            "--api", f"{HOST}:{self.api_ports[index]}",
            "--raft", self.rafts[index],
            "--data-dir", str(self.data_dir(index)),
            "--secret-file", str(self.secret_file),
            "--bootstrap-key-file", str(self.admin_key_file),
            "--log-level", self.log_level,
            *self.extra_args,
        ]
        for other in range(NODES):
            if other != index:
                command += ["--peer", f"{self.ids[other]},{self.raft_view(index, other)},{self.urls[other]}"]
        return command

    def layout(self) -> dict[str, Any]:
        """Ports and routes, for the report."""
        return {
            "nodes": [
                {"id": self.ids[index], "api": self.urls[index], "raft": self.rafts[index],
                 "peers": {self.ids[other]: self.raft_view(index, other) for other in range(NODES) if other != index}}
                for index in range(NODES)
            ],
            "proxies": [
                {"pair": f"{self.ids[a]}-{self.ids[b]}", "listen": self.proxy_ports[(a, b)], "target": self.rafts[a],
                 "dialer": self.ids[b]}
                for (a, b) in self.proxies
            ],
        }

    # -- process state -------------------------------------------------------------------------

    def running(self, index: int) -> bool:
        process = self.processes[index]
        return process is not None and process.poll() is None

    def live(self) -> list[int]:
        """Nodes running and not paused."""
        return [index for index in range(NODES) if self.running(index) and index not in self.paused]

    def pids(self) -> dict[str, int]:
        """The pid of every running node process, by node id."""
        return {
            self.ids[index]: process.pid
            for index, process in enumerate(self.processes)
            if process is not None and process.poll() is None
        }

    def exited(self) -> dict[str, int]:
        """Nodes that should be running but exited on their own: node id -> exit code."""
        found: dict[str, int] = {}
        for index in sorted(self.expected):
            process = self.processes[index]
            code = process.poll() if process is not None else None
            if code is not None:
                found[self.ids[index]] = code
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
                for proxy in self.proxies.values():
                    proxy.start()
            for index in indexes or range(NODES):
                self._spawn(index)

    def _spawn(self, index: int) -> None:
        assert not self.running(index), f"{self.ids[index]} is already running"
        command = self.command(index)
        with open(self.log_path(index), "ab") as log_file:
            log_file.write(f"--- {time.strftime('%H:%M:%S')} start {' '.join(command)}\n".encode())
            log_file.flush()
            # Its own session: a Ctrl-C at the terminal reaches the harness, which kills the nodes.
            process = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, env=os.environ.copy(), start_new_session=True
            )
        self.processes[index] = process
        self.pids_started.append(process.pid)
        self.paused.discard(index)
        self.expected.add(index)

    def kill(self, index: int) -> None:
        """kill -9: no chance to flush or say goodbye (a paused node dies too)."""
        with self._lock:
            self.expected.discard(index)
            process = self.processes[index]
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGKILL)
                try:
                    process.wait(KILL_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    raise ClusterError(f"{self.ids[index]} (pid {process.pid}) outlived SIGKILL for {KILL_TIMEOUT_S} s") from None
            self.paused.discard(index)

    def pause(self, index: int) -> None:
        """SIGSTOP: the process is frozen, its sockets stay open."""
        with self._lock:
            process = self.processes[index]
            assert process is not None and process.poll() is None, f"{self.ids[index]} is not running"
            process.send_signal(signal.SIGSTOP)
            self.paused.add(index)

    def resume(self, index: int) -> None:
        """SIGCONT a paused node."""
        with self._lock:
            process = self.processes[index]
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGCONT)
            self.paused.discard(index)

    def stop(self, index: int) -> int | None:
        """Graceful stop: SIGTERM, wait STOP_TIMEOUT_S, then SIGKILL. Its exit code."""
        return self._stop([index])[0]

    def stop_all(self) -> list[int | None]:
        """stop() of every node at once (one SIGTERM each, then one shared bounded wait)."""
        return self._stop(list(range(NODES)))

    def _stop(self, indexes: Sequence[int]) -> list[int | None]:
        with self._lock:
            signalled: list[subprocess.Popen[bytes] | None] = []
            for index in indexes:
                self.expected.discard(index)
                process = self.processes[index]
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

    # -- partitions ------------------------------------------------------------------------------

    def partition(self, index: int) -> None:
        """Isolate node `index`: every pair with it is cut until heal(). Its API still answers."""
        with self._lock:
            assert self._proxies_started, "start the cluster before partitioning it"
            for (a, b), proxy in self.proxies.items():
                if index in (a, b):
                    proxy.partition()
            self.isolated.add(index)

    def heal(self) -> None:
        """Reconnect every pair (the nodes redial by themselves)."""
        with self._lock:
            if self._proxies_started:
                for proxy in self.proxies.values():
                    proxy.heal()
            self.isolated.clear()

    def proxy_stats(self) -> list[dict[str, Any]]:
        return [asdict(proxy.stats()) for proxy in self.proxies.values()]

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
        answer = _get_json(f"{self.urls[index]}/v1/health")
        if answer is None or not isinstance(answer[1], dict):
            return view
        body = answer[1]
        leader = self.index_in_view(index, body.get("leader"))
        view.update(
            answering=True, status=body.get("status"), role=body.get("role"),
            leader=None if leader is None else self.ids[leader], leaderAddress=body.get("leader"),
            term=body.get("term"), appliedIndex=body.get("appliedIndex"), commitIndex=body.get("commitIndex"),
        )
        return view

    def health(self) -> dict[str, dict[str, Any]]:
        """Every node's node_health(), by node id."""
        return {self.ids[index]: self.node_health(index) for index in range(NODES)}

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

    def pairs_connected(self, indexes: Sequence[int]) -> bool:
        """Every pair of the given nodes has a live connection through its proxy (the Raft view
        the nodes' own health cannot give: an isolated follower still names the old leader)."""
        return all(
            proxy.stats().live > 0 and not proxy.partitioned
            for (a, b), proxy in self.proxies.items()
            if a in indexes and b in indexes
        )

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
            TRANSFER_CALL_TIMEOUT_S,
        )

    def digests(self) -> dict[str, dict[str, Any] | None]:
        """Every node's GET /v1/cluster/digest (appliedIndex, digest, dataDigest), by node id; None
        for a node that is down, paused or did not answer 200."""
        found: dict[str, dict[str, Any] | None] = {}
        for index in range(NODES):
            answer = _get_json(f"{self.urls[index]}/v1/cluster/digest", key=self.admin_key) if index in self.live() else None
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
        for index in range(NODES):
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
            for process in self.processes:
                if process is None or process.poll() is not None:
                    continue
                with contextlib.suppress(OSError):
                    process.send_signal(signal.SIGCONT)
                    process.send_signal(signal.SIGKILL)
            for process in self.processes:
                if process is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(KILL_TIMEOUT_S)
            self.paused.clear()
            for proxy in self.proxies.values():
                proxy.close()
            self.isolated.clear()

    def __enter__(self) -> ChaosCluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
