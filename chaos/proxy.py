"""A TCP proxy in front of one node's Raft port that knows which node dialed, so a partition needs
no root and every member can name every other by one address.

    proxy = NodeProxy("n1", listen_port=21001, target_port=25001, dialers=cluster.pids).start()
    proxy.partition()   # every live connection is closed both ways; new ones are accepted and closed
    proxy.block("n3")   # only n3's connections: closed now, refused until heal()
    proxy.heal()        # new connections are forwarded again
    proxy.stats()       # ProxyStats(connections=..., live_from={"n2": 1}, ...)
    proxy.close()

Why one proxy per node and not per pair: pysyncobj names a member by its Raft address, and applies
a membership entry (which carries the leader's name for the member) by that name, so every node
must name a member alike or a removal misses the nodes that name it otherwise. A node's Raft
address is therefore its proxy's (`--raft`), and the node binds another port (`--raft-bind`). Of
two nodes, the one with the greater address dials the other's proxy; the proxy tells who dialed
by looking the connection up in /proc (`dialer_of`: the dialing socket's inode in
/proc/net/tcp, then which node process holds it), so cutting one pair still cuts only that pair.
A connection whose dialer is not found (the process just died) is refused; pysyncobj dials again.

The harness is synchronous and threaded, so each proxy runs its own asyncio loop in a daemon
thread; the public methods are called from any other thread and wait (bounded) for the loop to
act. Every connection is accepted, then forwarded to the target; when either side ends, both end.
Linux only (/proc), as the harness already is (SIGSTOP, process groups).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections import Counter
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

HOST = "127.0.0.1"
_HOST_IN_PROC = "0100007F"  # 127.0.0.1 as /proc/net/tcp writes it (little-endian hex)
PROC_NET_TCP = "/proc/net/tcp"
# Live connections per proxy (pysyncobj keeps one per pair; a few more while it reconnects).
CONNECTIONS_MAX = 64
LISTEN_BACKLOG = 64
# Bytes read from one side before they are written to the other.
CHUNK_BYTES = 64 * 1024
# Connecting to the target; past it the client's connection is closed.
CONNECT_TIMEOUT_S = 2.0
# Telling who dialed (a read of /proc/net/tcp, thousands of lines on a busy machine, and of a few
# processes' descriptors): past it the connection is refused as unidentified.
IDENTIFY_TIMEOUT_S = 2.0
# A connection with no byte either way for this long is closed (pysyncobj sends heartbeats every
# 50 ms and drops a connection silent for 1 s itself, so this only bounds a wait).
IDLE_TIMEOUT_S = 120.0
# A write the other side does not take (a SIGSTOPped node's full buffers) for this long closes the pair.
DRAIN_TIMEOUT_S = 30.0
# The loop thread starting, acting on a call from another thread, and stopping.
START_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
# After close() aborts every connection, how long their tasks get to end before they are cancelled.
SHUTDOWN_GRACE_S = 1.0

Dialers = Callable[[], Mapping[str, int]]  # node id -> pid of every node process running now


class ProxyError(Exception):
    """The proxy could not start (its port is taken) or its loop did not answer in time."""


def dialer_of(peer_port: int, listen_port: int, dialers: Mapping[str, int]) -> str | None:
    """The node (of `dialers`, node id -> pid) whose socket 127.0.0.1:peer_port is connected to
    127.0.0.1:listen_port; None when no such socket or no listed process holds it."""
    local, remote = f"{_HOST_IN_PROC}:{peer_port:04X}", f"{_HOST_IN_PROC}:{listen_port:04X}"
    inode = None
    with open(PROC_NET_TCP) as table:
        next(table, None)  # the header
        for line in table:
            fields = line.split()
            if len(fields) > 9 and fields[1] == local and fields[2] == remote:
                inode = fields[9]
                break
    if inode is None or inode == "0":
        return None
    wanted = f"socket:[{inode}]"
    for node_id, pid in dialers.items():
        try:
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # ended meanwhile
            continue
        for descriptor in descriptors:
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{descriptor}") == wanted:
                    return node_id
    return None


@dataclass(frozen=True)
class ProxyStats:
    """Counters since start, for the report."""

    name: str  # the node it stands in front of
    listen_port: int
    target_port: int
    partitioned: bool
    blocked: list[str]  # dialers refused until heal()
    connections: int  # accepted and forwarded to the target
    live: int  # forwarded connections open now
    refused: int  # accepted and closed at once: partitioned, blocked, unidentified, or CONNECTIONS_MAX live
    unidentified: int  # of those refused, the ones whose dialer was not found
    connect_failures: int  # forwarded, but the target did not accept (a killed node)
    bytes_to_target: int
    bytes_from_target: int
    partitions: int  # partition() and block() calls
    cut: int  # live connections closed by them
    live_from: dict[str, int] = field(default_factory=dict)  # open connections by the node that dialed


class _Pair:
    """One forwarded connection: the dialer's streams and the target's."""

    def __init__(self, dialer: str, client: asyncio.StreamWriter, target: asyncio.StreamWriter) -> None:
        self.dialer = dialer
        self.client = client
        self.target = target

    def abort(self) -> None:
        # abort, not close: nothing buffered is delivered after a cut, as on a broken link.
        for writer in (self.client, self.target):
            writer.transport.abort()


class NodeProxy:
    """Listens on HOST:listen_port and forwards every connection of a node in `dialers` to
    HOST:target_port."""

    def __init__(self, name: str, listen_port: int, target_port: int, dialers: Dialers) -> None:
        self.name = name
        self.listen_port = listen_port
        self.target_port = target_port
        self._dialers = dialers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._pairs: set[_Pair] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._partitioned = False
        self._blocked: frozenset[str] = frozenset()
        self._closed = False
        self._connections = 0
        self._refused = 0
        self._unidentified = 0
        self._connect_failures = 0
        self._bytes_to_target = 0
        self._bytes_from_target = 0
        self._partitions = 0
        self._cut = 0

    def __repr__(self) -> str:
        stats = self.stats()
        state = "partitioned" if stats.partitioned else f"blocking {stats.blocked}" if stats.blocked else "forwarding"
        return (
            f"<NodeProxy {self.name} :{self.listen_port}->:{self.target_port} {state} "
            f"connections={stats.connections} live={stats.live_from} refused={stats.refused} "
            f"bytes={stats.bytes_to_target}/{stats.bytes_from_target}>"
        )

    # -- control (any thread but the loop's) -----------------------------------------------------

    def start(self) -> NodeProxy:
        """Bind the port and start forwarding; ProxyError if the port is taken."""
        assert self._thread is None, f"proxy {self.name} was already started"
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()
        self._loop = loop

        def serve() -> None:
            asyncio.set_event_loop(loop)
            try:
                self._server = loop.run_until_complete(
                    asyncio.start_server(self._accept, HOST, self.listen_port, backlog=LISTEN_BACKLOG)
                )
            except OSError as error:
                failure.append(error)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(self._shutdown())
                loop.close()

        self._thread = threading.Thread(target=serve, name=f"chaos-proxy-{self.name}", daemon=True)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S):
            raise ProxyError(f"proxy {self.name} did not start within {START_TIMEOUT_S} s")
        if failure:
            self._closed = True
            raise ProxyError(f"proxy {self.name} cannot listen on {HOST}:{self.listen_port}: {failure[0]}")
        return self

    def partition(self) -> int:
        """Close every live connection both ways and refuse new ones until heal(); returns how many
        connections were cut."""
        return self._call(self._cut_where(None))

    def block(self, dialer: str) -> int:
        """Close the live connections `dialer` made and refuse its new ones until heal(); returns
        how many were cut."""
        return self._call(self._cut_where(dialer))

    def heal(self) -> None:
        """Forward new connections again (the nodes reconnect by themselves)."""
        self._call(self._heal())

    @property
    def partitioned(self) -> bool:
        return self._partitioned

    def cut_off(self, dialer: str) -> bool:
        """Whether connections from `dialer` are refused now."""
        return self._partitioned or dialer in self._blocked

    def live_from(self, dialer: str) -> int:
        """Open connections that `dialer` made (any thread; one event stale at most)."""
        return sum(1 for pair in list(self._pairs) if pair.dialer == dialer)

    def stats(self) -> ProxyStats:
        # Counters are ints written by the loop thread only; a read here may be one event stale.
        return ProxyStats(
            name=self.name,
            listen_port=self.listen_port,
            target_port=self.target_port,
            partitioned=self._partitioned,
            blocked=sorted(self._blocked),
            connections=self._connections,
            live=len(self._pairs),
            refused=self._refused,
            unidentified=self._unidentified,
            connect_failures=self._connect_failures,
            bytes_to_target=self._bytes_to_target,
            bytes_from_target=self._bytes_from_target,
            partitions=self._partitions,
            cut=self._cut,
            live_from=dict(Counter(pair.dialer for pair in list(self._pairs))),
        )

    def close(self) -> None:
        """Stop listening, close every connection and stop the loop thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop already stopped
            loop.call_soon_threadsafe(loop.stop)
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            raise ProxyError(f"proxy {self.name}'s loop did not stop within {STOP_TIMEOUT_S} s")

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._closed or self._loop is None:
            coroutine.close()
            raise ProxyError(f"proxy {self.name} is not running")
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result(CALL_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ProxyError(f"proxy {self.name}'s loop did not answer within {CALL_TIMEOUT_S} s") from None

    # -- the loop thread -------------------------------------------------------------------------

    async def _cut_where(self, dialer: str | None) -> int:
        """Cut every connection (dialer None) or those of `dialer`, and refuse them from now on."""
        if dialer is None:
            self._partitioned = True
        else:
            self._blocked = self._blocked | {dialer}
        self._partitions += 1
        cut = [pair for pair in self._pairs if dialer is None or pair.dialer == dialer]
        for pair in cut:
            pair.abort()
        self._cut += len(cut)
        return len(cut)

    async def _heal(self) -> None:
        self._partitioned = False
        self._blocked = frozenset()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._forward(client_reader, client_writer)
        except asyncio.CancelledError:
            # Only _shutdown cancels, and only a connection still stuck after its abort; asyncio's
            # stream callback would log the cancellation as an error, so it ends here.
            client_writer.transport.abort()
        finally:
            self._tasks.discard(task)

    async def _identify(self, client_writer: asyncio.StreamWriter) -> str | None:
        peer = client_writer.get_extra_info("peername")
        if not isinstance(peer, tuple) or len(peer) < 2:
            return None
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(None, dialer_of, int(peer[1]), self.listen_port, dict(self._dialers())),
                IDENTIFY_TIMEOUT_S,
            )
        except (OSError, asyncio.TimeoutError):
            return None

    def _refuse(self, *writers: asyncio.StreamWriter) -> None:
        self._refused += 1
        for writer in writers:
            writer.transport.abort()

    async def _forward(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self._partitioned or len(self._pairs) >= CONNECTIONS_MAX:
            self._refuse(client_writer)
            return
        dialer = await self._identify(client_writer)
        if dialer is None:
            self._unidentified += 1
            self._refuse(client_writer)
            return
        if self.cut_off(dialer):
            self._refuse(client_writer)
            return
        try:
            target_reader, target_writer = await asyncio.wait_for(
                asyncio.open_connection(HOST, self.target_port), CONNECT_TIMEOUT_S
            )
        except (OSError, asyncio.TimeoutError):
            self._connect_failures += 1
            client_writer.transport.abort()
            return
        if self.cut_off(dialer):  # cut while we were connecting
            self._refuse(client_writer, target_writer)
            return
        self._connections += 1
        pair = _Pair(dialer, client_writer, target_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(
                self._pump(client_reader, target_writer, to_target=True),
                self._pump(target_reader, client_writer, to_target=False),
            )
        finally:
            self._pairs.discard(pair)
            pair.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, to_target: bool) -> None:
        """Copy one direction until EOF, an error or a timeout; then end the other direction too."""
        try:
            while True:
                data = await asyncio.wait_for(reader.read(CHUNK_BYTES), IDLE_TIMEOUT_S)
                if not data:
                    break
                writer.write(data)
                await asyncio.wait_for(writer.drain(), DRAIN_TIMEOUT_S)
                if to_target:
                    self._bytes_to_target += len(data)
                else:
                    self._bytes_from_target += len(data)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            # One side ended: a TCP proxy cannot half-close for pysyncobj's sake, so end both.
            writer.transport.abort()

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for pair in list(self._pairs):
            pair.abort()  # their pumps see EOF and end
        await asyncio.sleep(0)
        tasks = [task for task in self._tasks if not task.done()]
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S)
            for task in stuck:
                task.cancel()
            if stuck:
                await asyncio.wait(stuck, timeout=STOP_TIMEOUT_S)
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), STOP_TIMEOUT_S)
