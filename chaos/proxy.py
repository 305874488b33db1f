"""A TCP proxy for one pair of nodes, so a partition needs no root: close its connections, refuse new ones.

    proxy = PairProxy("n1-n2", listen_port=21001, target_port=25001).start()
    proxy.partition()   # every live connection is closed both ways; new ones are accepted and closed
    proxy.heal()        # new connections are forwarded again
    proxy.stats()       # ProxyStats(connections=..., bytes_forwarded=..., refused=...)
    proxy.close()

The harness is synchronous and threaded, so each proxy runs its own asyncio loop in a daemon
thread; the public methods are called from any other thread and wait (bounded) for the loop to
act. Every connection is accepted, then forwarded to the target; when either side ends, both end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

HOST = "127.0.0.1"
# Live connections per proxy (pysyncobj keeps one per pair; a few more while it reconnects).
CONNECTIONS_MAX = 64
LISTEN_BACKLOG = 64
# Bytes read from one side before they are written to the other.
CHUNK_BYTES = 64 * 1024
# Connecting to the target; past it the client's connection is closed.
CONNECT_TIMEOUT_S = 2.0
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


class ProxyError(Exception):
    """The proxy could not start (its port is taken) or its loop did not answer in time."""


@dataclass(frozen=True)
class ProxyStats:
    """Counters since start, for the report."""

    name: str
    listen_port: int
    target_port: int
    partitioned: bool
    connections: int  # accepted and forwarded to the target
    live: int  # forwarded connections open now
    refused: int  # accepted and closed at once: partitioned, or CONNECTIONS_MAX live
    connect_failures: int  # forwarded, but the target did not accept (a killed node)
    bytes_to_target: int
    bytes_from_target: int
    partitions: int  # partition() calls that cut the pair
    cut: int  # live connections closed by partition()


class _Pair:
    """One forwarded connection: the client's streams and the target's."""

    def __init__(self, client: asyncio.StreamWriter, target: asyncio.StreamWriter) -> None:
        self.client = client
        self.target = target

    def abort(self) -> None:
        # abort, not close: nothing buffered is delivered after a cut, as on a broken link.
        for writer in (self.client, self.target):
            writer.transport.abort()


class PairProxy:
    """Listens on HOST:listen_port and forwards every connection to HOST:target_port."""

    def __init__(self, name: str, listen_port: int, target_port: int) -> None:
        self.name = name
        self.listen_port = listen_port
        self.target_port = target_port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.Server | None = None
        self._pairs: set[_Pair] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._partitioned = False
        self._closed = False
        self._connections = 0
        self._refused = 0
        self._connect_failures = 0
        self._bytes_to_target = 0
        self._bytes_from_target = 0
        self._partitions = 0
        self._cut = 0

    def __repr__(self) -> str:
        stats = self.stats()
        state = "partitioned" if stats.partitioned else "forwarding"
        return (
            f"<PairProxy {self.name} :{self.listen_port}->:{self.target_port} {state} "
            f"connections={stats.connections} live={stats.live} refused={stats.refused} "
            f"bytes={stats.bytes_to_target}/{stats.bytes_from_target}>"
        )

    # -- control (any thread but the loop's) -----------------------------------------------------

    def start(self) -> PairProxy:
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
        return self._call(self._partition())

    def heal(self) -> None:
        """Forward new connections again (the nodes reconnect by themselves)."""
        self._call(self._heal())

    @property
    def partitioned(self) -> bool:
        return self._partitioned

    def stats(self) -> ProxyStats:
        # Counters are ints written by the loop thread only; a read here may be one event stale.
        return ProxyStats(
            name=self.name,
            listen_port=self.listen_port,
            target_port=self.target_port,
            partitioned=self._partitioned,
            connections=self._connections,
            live=len(self._pairs),
            refused=self._refused,
            connect_failures=self._connect_failures,
            bytes_to_target=self._bytes_to_target,
            bytes_from_target=self._bytes_from_target,
            partitions=self._partitions,
            cut=self._cut,
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

    async def _partition(self) -> int:
        self._partitioned = True
        self._partitions += 1
        cut = len(self._pairs)
        for pair in list(self._pairs):
            pair.abort()
        self._cut += cut
        return cut

    async def _heal(self) -> None:
        self._partitioned = False

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

    async def _forward(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        if self._partitioned or len(self._pairs) >= CONNECTIONS_MAX:
            self._refused += 1
            client_writer.transport.abort()
            return
        try:
            target_reader, target_writer = await asyncio.wait_for(
                asyncio.open_connection(HOST, self.target_port), CONNECT_TIMEOUT_S
            )
        except (OSError, asyncio.TimeoutError):
            self._connect_failures += 1
            client_writer.transport.abort()
            return
        if self._partitioned:  # cut while we were connecting
            self._refused += 1
            client_writer.transport.abort()
            target_writer.transport.abort()
            return
        self._connections += 1
        pair = _Pair(client_writer, target_writer)
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
