"""A real three-node runstate cluster for tests: `runstate node` processes on free 127.0.0.1 ports.

    cluster = Cluster(tmp_path).start()      # all three, waits until they agree on a leader
    leader = cluster.leader_index()
    cluster.kill(leader)                     # kill -9
    cluster.start(leader)                    # restart on the same data dir
    cluster.wait_same_digest()               # every replica at one applied index and one digest

Every node logs to <root>/<id>.log; `logs()` gives the tails for failure messages. `cluster_factory`
(a fixture body: `yield from cluster_factory(tmp_path)`) kills every process at the end, whatever
happens, and prints the node logs (pytest shows them when the test failed).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from chaos.cluster import PORT_RANGE, free_ports
from tests._http import Api

START_TIMEOUT_S = 60.0  # a node replays its log and finds a leader (generous: 2 cores, 3 nodes)
LEADER_TIMEOUT_S = 30.0  # an election after a kill or pause
CONVERGE_TIMEOUT_S = 60.0  # replicas reach one digest
STOP_TIMEOUT_S = 15.0
POLL_S = 0.05
PROBE_TIMEOUT_S = 2.0
PAUSE_TIMEOUT_S = 10.0  # every thread of a SIGSTOPped process shows as stopped
LOG_TAIL_CHARS = 3000
SECRET = "cluster-test-secret-0123456789"
ADMIN_KEY = "rsk_cluster-test-admin-key-0123456789abcdef"  # the bootstrap admin key of every test cluster


PORT_BLOCK_BASES = PORT_RANGE  # below Linux's ephemeral range, as free_ports's ports
PORT_BLOCK_TRIES = 200


def free_port_block(offsets: Sequence[int]) -> int:
    """A base port such that base + offset is free for every offset (for `cluster up`)."""
    for base in random.sample(PORT_BLOCK_BASES, PORT_BLOCK_TRIES):
        try:
            for offset in offsets:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                    probe.bind(("127.0.0.1", base + offset))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no free port block for offsets {list(offsets)} in {PORT_BLOCK_TRIES} tries")


def get_json(url: str, timeout_s: float = PROBE_TIMEOUT_S, key: str | None = None) -> tuple[int, Any] | None:
    """(status, body) of a GET (with `key` as the bearer), or None when nothing answered."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
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


class Cluster:
    """Three (or `size`) cluster nodes; index i is node n{i+1}. Data dirs survive kill() and start()."""

    def __init__(self, root: Path, *extra_args: str, size: int = 3, admin_key: bool = True) -> None:
        """`admin_key=False`: the nodes get no bootstrap key, so the first leader generates one."""
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.extra_args = extra_args
        self.size = size
        self.secret_file = root / "cluster.secret"
        self.secret_file.write_text(SECRET)
        # The first admin key: every node is given it, the first leader creates it.
        self.admin_key = ADMIN_KEY
        self.admin_key_file: Path | None = None
        if admin_key:
            self.admin_key_file = root / "bootstrap.key"
            self.admin_key_file.write_text(ADMIN_KEY)
        ports = free_ports(2 * size)
        self.api_ports = ports[:size]
        self.raft_ports = ports[size:]
        self.ids = [f"n{index + 1}" for index in range(size)]
        self.urls = [f"http://127.0.0.1:{port}" for port in self.api_ports]
        self.rafts = [f"127.0.0.1:{port}" for port in self.raft_ports]
        self.node_args: list[tuple[str, ...]] = [()] * size  # one node's own flags, after extra_args
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * size
        self.paused: set[int] = set()
        self.stopped: set[int] = set(range(size))  # not started, or killed on purpose
        self.seed_size = size  # the nodes of the first configuration: each names the others with --peer
        self.joining: dict[int, list[int]] = {}  # a node added later -> the members it asks to join
        self.alone: set[int] = set()  # nodes started without --peer (after --force-new-cluster)

    # -- where things are ----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        """Every node, comma-separated (what RUNSTATE_BASE_URL holds)."""
        return ",".join(self.urls)

    def urls_from(self, index: int) -> str:
        """Every node, starting with node `index` (so clients spread over the nodes)."""
        return ",".join(self.urls[index:] + self.urls[:index])

    def data_dir(self, index: int) -> Path:
        return self.root / self.ids[index]

    def log_path(self, index: int) -> Path:
        return self.root / f"{self.ids[index]}.log"

    def index_of_raft(self, raft_address: str | None) -> int | None:
        return self.rafts.index(raft_address) if raft_address in self.rafts else None

    def running(self, index: int) -> bool:
        process = self.processes[index]
        return process is not None and process.poll() is None

    def live(self) -> list[int]:
        """Nodes running and not paused."""
        return [index for index in range(self.size) if self.running(index) and index not in self.paused]

    # -- processes -----------------------------------------------------------------------------

    def command(self, index: int) -> list[str]:
        command = [
            sys.executable, "-m", "runstate_server.node.cli", "node",
            "--node-id", self.ids[index],
            "--api", f"127.0.0.1:{self.api_ports[index]}",
            "--raft", self.rafts[index],
            "--data-dir", str(self.data_dir(index)),
            "--secret-file", str(self.secret_file),
            *(["--bootstrap-key-file", str(self.admin_key_file)] if self.admin_key_file else []),
            *self.extra_args,
            *self.node_args[index],
        ]
        if index in self.joining:
            return [*command, "--join", ",".join(self.urls[other] for other in self.joining[index])]
        if index in self.alone:
            return command
        for other in range(self.seed_size):
            if other != index:
                command += ["--peer", f"{self.ids[other]},{self.rafts[other]},{self.urls[other]}"]
        return command

    def add_node(self, join: Sequence[int]) -> int:
        """A new node (fresh ports and data dir, not started) that starts with `--join` the API URLs
        of the nodes `join`; its index."""
        index = self.size
        api_port, raft_port = free_ports(2)
        self.size += 1
        self.api_ports.append(api_port)
        self.raft_ports.append(raft_port)
        self.ids.append(f"n{index + 1}")
        self.urls.append(f"http://127.0.0.1:{api_port}")
        self.rafts.append(f"127.0.0.1:{raft_port}")
        self.node_args.append(())
        self.processes.append(None)
        self.stopped.add(index)
        self.joining[index] = list(join)
        return index

    def spawn(self, index: int) -> None:
        """Start node `index` without waiting for it."""
        assert not self.running(index), f"{self.ids[index]} is already running"
        with open(self.log_path(index), "ab") as log_file:
            log_file.write(f"--- start {' '.join(self.command(index))}\n".encode())
            log_file.flush()
            self.processes[index] = subprocess.Popen(
                self.command(index), stdout=log_file, stderr=subprocess.STDOUT, env=os.environ.copy()
            )
        self.paused.discard(index)
        self.stopped.discard(index)

    def start(self, *indexes: int) -> Cluster:
        """Start the given nodes (all when none is given) at once and wait until they are healthy."""
        chosen = list(indexes) if indexes else list(range(self.size))
        for index in chosen:
            self.spawn(index)
        self.wait_healthy(chosen)
        return self

    def kill(self, index: int) -> None:
        """kill -9: no chance to flush or say goodbye."""
        process = self.processes[index]
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait(STOP_TIMEOUT_S)
        self.paused.discard(index)
        self.stopped.add(index)

    def kill_all(self) -> None:
        for index in range(self.size):
            self.kill(index)

    def pause(self, index: int) -> None:
        """SIGSTOP: the process is frozen, its sockets stay open. Returns once every thread of it
        stopped: the kernel stops a process's threads one after another, after the thread it
        woke first gets a core, so on loaded cores another thread (Raft's) may run on for a while
        after kill() returned."""
        process = self.processes[index]
        assert process is not None and process.poll() is None, f"{self.ids[index]} is not running"
        process.send_signal(signal.SIGSTOP)
        self.paused.add(index)
        wait_stopped(process.pid)

    def resume(self, index: int) -> None:
        process = self.processes[index]
        assert process is not None
        process.send_signal(signal.SIGCONT)
        self.paused.discard(index)

    def wipe(self, index: int) -> None:
        """Remove a stopped node's data dir: it restarts with nothing."""
        assert not self.running(index), f"stop {self.ids[index]} before wiping it"
        shutil.rmtree(self.data_dir(index), ignore_errors=True)

    def stop(self) -> None:
        """Kill every process (resuming paused ones first so they can die) and reap it."""
        for index, process in enumerate(self.processes):
            self.stopped.add(index)
            if process is None or process.poll() is not None:
                continue
            with contextlib.suppress(OSError):
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_TIMEOUT_S)
            self.paused.discard(index)

    # -- what the nodes say --------------------------------------------------------------------

    def api(self, index: int) -> Api:
        """A JSON client of node `index` with the admin key."""
        return Api(self.urls[index], key=self.admin_key)

    def health(self, index: int) -> dict[str, Any] | None:
        """Node `index`'s /v1/health body (200 or 503), or None if it does not answer."""
        answer = get_json(f"{self.urls[index]}/v1/health")
        return answer[1] if answer is not None and isinstance(answer[1], dict) else None

    def digest(self, index: int) -> dict[str, Any] | None:
        answer = get_json(f"{self.urls[index]}/v1/cluster/digest", key=self.admin_key)
        return answer[1] if answer is not None and answer[0] == 200 else None

    def digests(self, indexes: Sequence[int] | None = None) -> list[dict[str, Any] | None]:
        return [self.digest(index) for index in (indexes if indexes is not None else range(self.size))]

    def logs(self) -> str:
        parts = []
        for index in range(self.size):
            try:
                text = self.log_path(index).read_text(errors="replace")[-LOG_TAIL_CHARS:]
            except OSError:
                text = "(no log)"
            parts.append(f"===== {self.ids[index]} ({self.log_path(index)}) =====\n{text}")
        return "\n".join(parts)

    # -- waiting (bounded; a timeout fails with what was last seen and the logs) -----------------

    def wait_until(self, what: str, probe: Callable[[], Any], timeout_s: float) -> Any:
        """Poll `probe` until it returns something truthy; fail after timeout_s."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            for index in range(self.size):
                process = self.processes[index]
                if process is not None and index not in self.stopped and process.poll() is not None:
                    raise AssertionError(
                        f"{self.ids[index]} exited with {process.returncode} while waiting for {what}\n{self.logs()}"
                    )
            last = probe()
            if last:
                return last
            if time.monotonic() >= deadline:
                raise AssertionError(f"gave up waiting for {what} after {timeout_s} s\n{self.logs()}")
            time.sleep(POLL_S)

    def _agreed_leader(self, indexes: Sequence[int]) -> int | None:
        """The index of the node that every listed node names as leader and that says it leads."""
        views = [self.health(index) for index in indexes]
        if any(view is None or view.get("status") != "ok" for view in views):
            return None
        leaders = {view["leader"] for view in views if view is not None}
        if len(leaders) != 1:
            return None
        leader = self.index_of_raft(leaders.pop())
        if leader is None or leader not in indexes:
            return None
        leader_view = views[list(indexes).index(leader)]
        return leader if leader_view is not None and leader_view.get("role") == "leader" else None

    def wait_healthy(self, indexes: Sequence[int] | None = None, timeout_s: float = START_TIMEOUT_S) -> int:
        """Wait until the given nodes (default: every live one) answer health 200 and agree on a
        leader among them; returns the leader's index."""
        chosen = list(indexes) if indexes is not None else self.live()
        live = self.live()
        # The leader may be a running node outside `chosen`: ask every live node.
        asked = sorted(set(chosen) | set(live))

        def probe() -> int | None:
            leader = self._agreed_leader(asked)
            return None if leader is None else leader + 1  # truthy

        return int(self.wait_until(f"{[self.ids[i] for i in chosen]} to be healthy under one leader", probe, timeout_s)) - 1

    def leader_index(self, *, exclude: Sequence[int] = (), timeout_s: float = LEADER_TIMEOUT_S) -> int:
        """The leader every live node (but `exclude`) agrees on; waits out an election."""
        asked = [index for index in self.live() if index not in exclude]

        def probe() -> int | None:
            leader = self._agreed_leader(asked)
            return None if leader is None else leader + 1

        return int(self.wait_until(f"a leader among {[self.ids[i] for i in asked]}", probe, timeout_s)) - 1

    def wait_same_digest(self, indexes: Sequence[int] | None = None, timeout_s: float = CONVERGE_TIMEOUT_S) -> str:
        """Wait until the given nodes (default all) report the same applied index and the same
        state digest; returns the digest. Ticks may move the index while idle, so this polls."""
        chosen = list(indexes) if indexes is not None else list(range(self.size))
        seen: list[Any] = []

        def probe() -> str | None:
            views = self.digests(chosen)
            seen[:] = views
            if any(view is None for view in views):
                return None
            if len({(view["appliedIndex"], view["digest"]) for view in views if view is not None}) != 1:
                return None
            return str(views[0]["digest"]) if views[0] is not None else None

        try:
            return str(self.wait_until("one digest on every node", probe, timeout_s))
        except AssertionError as error:
            raise AssertionError(f"digests never agreed; last seen {seen}\n{error}") from None


def cluster_factory(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """A fixture body: `make(*extra_args)` builds a Cluster in tmp_path (not started). Every
    process is killed at the end; the node logs are printed (shown by pytest on failure)."""
    made: list[Cluster] = []

    def make(*extra_args: str, admin_key: bool = True) -> Cluster:
        cluster = Cluster(tmp_path / f"cluster-{len(made)}", *extra_args, admin_key=admin_key)
        made.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            cluster.stop()
        for cluster in made:
            print(cluster.logs())


def wait_stopped(pid: int) -> None:
    """Wait until every thread of process `pid` is stopped (state T in /proc: Linux only)."""
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    while True:
        states = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                # "pid (comm) S ...": the state follows the last ")" (a comm may hold one).
                states.append((task / "stat").read_text().rpartition(")")[2].split()[0])
        if states and all(state in ("T", "t") for state in states):
            return
        assert time.monotonic() < deadline, f"process {pid} did not stop within {PAUSE_TIMEOUT_S} s: {states}"
        time.sleep(0.001)
