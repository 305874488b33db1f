"""The Raft port against strangers (cluster/_transport.py), and a leader that loses its quorum.

One real three-node cluster for the module. Whoever can reach the Raft port without the cluster
password must not be able to depose the leader, stall writes or hold connections: a frame
announcing 2 GiB closes the connection before its body is read (pysyncobj 0.3.17 buffered it,
copying the whole buffer on every read: the leader's tick thread stalled and another node was
elected), an idle connection is closed after the handshake deadline, and connections beyond the
per-address cap are closed at once. Last, a leader cut off from both followers (SIGSTOP) stops
calling itself leader (check-quorum)."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from runstate_server.cluster.config import (
    HANDSHAKE_FRAME_BYTES_MAX,
    UNAUTHENTICATED_CONNECTIONS_PER_HOST_MAX,
    LogConfig,
)
from runstate_server.node.http_server import LOG_RECORDS_PER_WINDOW_MAX
from tests._cluster import LEADER_TIMEOUT_S, Cluster
from tests._http import Api

# Timing-sensitive (no election may happen while a peer is paused, cut off or flooded): alone.
pytestmark = pytest.mark.serial

# How long the stranger keeps sending (nothing is timed: this is how long the attack lasts).
ATTACK_S = 3.0
ATTACK_CHUNK = bytes(64 * 1024)
ATTACK_PAUSE_S = 0.01  # between two connections of the stranger
# One write never waits longer than this; a failure, not a timing assertion.
WRITE_TIMEOUT_S = 10.0
# The longest a test waits for the node to close a connection (the deadline is 2 s).
CLOSE_TIMEOUT_S = 5 * LogConfig().handshake_timeout_s


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    made = Cluster(tmp_path_factory.mktemp("raft-port"))
    try:
        made.start()
        yield made
    finally:
        made.stop()
        print(made.logs())


def raft_endpoint(cluster: Cluster, index: int) -> tuple[str, int]:
    host, port = cluster.rafts[index].rsplit(":", 1)
    return host, int(port)


def write(cluster: Cluster, index: int) -> tuple[int, str]:
    """Create a run through node `index`: (status, body), (0, error) when nothing answered."""
    api = Api(cluster.urls[index], key=cluster.admin_key)
    request = urllib.request.Request(
        cluster.urls[index] + api.space_path("/v1/scopes"), data=b"{}", method="POST",
        headers={**api.headers, "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=WRITE_TIMEOUT_S) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        body = error.read().decode(errors="replace")
        error.close()
        return error.code, body
    except OSError as error:
        return 0, repr(error)


def closed_by_peer(connection: socket.socket, timeout_s: float) -> bool:
    """Wait (bounded) for the node to close `connection`: True on EOF or a reset."""
    connection.settimeout(timeout_s)
    try:
        return connection.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def still_open(connection: socket.socket) -> bool:
    connection.setblocking(False)
    try:
        return connection.recv(1) != b""  # data from a stranger's point of view: not closed either
    except BlockingIOError:
        return True
    except OSError:
        return False


def leaders(cluster: Cluster) -> dict[str, tuple[str | None, int, str]]:
    views = {cluster.ids[index]: cluster.health(index) or {} for index in range(cluster.size)}
    return {node: (view.get("leader"), view.get("term", -1), view.get("role", "?")) for node, view in views.items()}


class Stranger(threading.Thread):
    """For ATTACK_S: connects, sends a frame header announcing 2 GiB, then zeros until the node
    closes the connection (or the time is up), and again. `attempts` counts the connections,
    `closed` those the node closed (a reset, or EOF)."""

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(name="raft-stranger", daemon=True)
        self.address = address
        self.sent = 0
        self.attempts = 0
        self.closed = 0

    def run(self) -> None:
        deadline = time.monotonic() + ATTACK_S
        while time.monotonic() < deadline:
            self.attempts += 1
            if self.attack_once(deadline):
                self.closed += 1
            time.sleep(ATTACK_PAUSE_S)

    def attack_once(self, deadline: float) -> bool:
        """True if the node closed the connection."""
        with socket.create_connection(self.address, timeout=WRITE_TIMEOUT_S) as connection:
            connection.settimeout(1.0)  # a node that reads nothing must not block the attack's end
            try:
                connection.sendall(struct.pack("i", 2**31 - 1))
                while time.monotonic() < deadline:
                    connection.sendall(ATTACK_CHUNK)
                    self.sent += len(ATTACK_CHUNK)
            except (ConnectionResetError, BrokenPipeError):
                return True
            except TimeoutError:
                pass  # the node stopped reading, without closing
            return closed_by_peer(connection, 1.0)


def test_a_stranger_announcing_a_huge_frame_to_the_leader_is_cut_off_and_the_leader_keeps_leading(
    cluster: Cluster,
) -> None:
    leader = cluster.wait_healthy()
    before = leaders(cluster)
    stranger = Stranger(raft_endpoint(cluster, leader))
    failures: list[tuple[int, str]] = []
    written = 0
    stranger.start()
    while stranger.is_alive() or written == 0:
        status, body = write(cluster, leader)
        if status in (200, 201):
            written += 1
        else:
            failures.append((status, body))
        if failures:
            break
    stranger.join(WRITE_TIMEOUT_S + ATTACK_S)
    assert not stranger.is_alive()
    after = leaders(cluster)
    seen = json.dumps({
        "before": before, "after": after, "failures": failures[:5], "written": written,
        "attempts": stranger.attempts, "closed": stranger.closed, "sent": stranger.sent,
    })
    assert after == before, seen  # same leader, same term, same roles on every node
    assert failures == [] and written > 0, seen
    assert stranger.attempts > 0 and stranger.closed == stranger.attempts, seen  # every one cut off
    assert write(cluster, leader)[0] in (200, 201)


def test_an_idle_or_half_handshaken_connection_is_closed_after_the_handshake_deadline(cluster: Cluster) -> None:
    address = raft_endpoint(cluster, 0)
    with socket.create_connection(address) as idle, socket.create_connection(address) as half:
        half.sendall(struct.pack("i", HANDSHAKE_FRAME_BYTES_MAX) + b"x" * 100)  # a frame never finished
        assert closed_by_peer(idle, CLOSE_TIMEOUT_S), "an idle connection to the Raft port was kept"
        assert closed_by_peer(half, CLOSE_TIMEOUT_S), "a half-sent handshake frame was waited for"


def test_connections_beyond_the_per_address_cap_are_closed_at_once(cluster: Cluster) -> None:
    address = raft_endpoint(cluster, 0)
    with contextlib.ExitStack() as stack:
        held = [
            stack.enter_context(socket.create_connection(address))
            for _ in range(UNAUTHENTICATED_CONNECTIONS_PER_HOST_MAX)
        ]
        extra = stack.enter_context(socket.create_connection(address))
        # Accepted in order (the kernel's accept queue): the first ones fill the cap, and are still
        # in their handshake (2 s deadline) when the extra one is closed.
        assert closed_by_peer(extra, CLOSE_TIMEOUT_S), "a connection beyond the cap was kept"
        assert all(still_open(connection) for connection in held), "the connections within the cap were closed"
    # The peers' own connections were never touched.
    leader = cluster.wait_healthy()
    assert write(cluster, leader)[0] in (200, 201)


def test_a_flood_of_refused_connections_is_logged_a_few_times_not_once_each(cluster: Cluster) -> None:
    """Each refused connection logged a WARNING line: one stranger opening connections in a loop
    wrote 3.5 MB of log in 5 s. The Raft port's log is rate-limited like the API's."""
    flood = 100  # within the listen backlog: accepted, and refused, at once
    address = raft_endpoint(cluster, 0)
    log_path = cluster.log_path(0)
    log_bytes_before = log_path.stat().st_size
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(socket.create_connection(address)) for _ in range(flood)]
        # Once the node has closed every one (beyond the cap at once, the rest at the handshake
        # deadline), it has logged whatever it logs for them.
        assert all(closed_by_peer(connection, CLOSE_TIMEOUT_S) for connection in held), "a connection was kept"
    with open(log_path, "rb") as log_file:
        log_file.seek(log_bytes_before)
        new_log = log_file.read().decode(errors="replace")
    refusals_logged = new_log.count("Raft port: refusing a connection")
    # At most a window's worth of lines (a few windows if this test is slow), not one per refusal.
    assert 0 < refusals_logged <= 3 * LOG_RECORDS_PER_WINDOW_MAX < flood // 2, new_log[-3000:]
    leader = cluster.wait_healthy()
    assert write(cluster, leader)[0] in (200, 201)


def test_a_leader_cut_off_from_both_followers_stops_calling_itself_leader(cluster: Cluster) -> None:
    leader = cluster.wait_healthy()
    followers = [index for index in range(cluster.size) if index != leader]
    try:
        for index in followers:
            cluster.pause(index)

        def deposed() -> bool:
            view = cluster.health(leader) or {}
            return view.get("role") != "leader" and view.get("status") == "unavailable" and view.get("leader") is None

        cluster.wait_until("the cut-off leader to stop calling itself leader", deposed, LEADER_TIMEOUT_S)
        status, body = write(cluster, leader)
        assert status == 503, (status, body)
    finally:
        for index in followers:
            cluster.resume(index)
    cluster.wait_healthy()



def test_a_frame_larger_than_the_socket_buffer_is_sent_on_when_the_socket_is_writable() -> None:
    """pysyncobj sends what the socket takes and kept the rest for its next send (a heartbeat, up
    to a period later, once per socket buffer: a big append_entries crawled). The connection asks
    the poller for the write event as soon as something is left, and drops it once all is sent."""
    import os

    from pysyncobj.poller import POLL_EVENT_TYPE

    from runstate_server.cluster._transport import BoundedConnection

    class Poller:
        def __init__(self) -> None:
            self.masks: dict[int, int] = {}

        def subscribe(self, fileno: int, callback: object, mask: int) -> None:
            self.masks[fileno] = mask

        def unsubscribe(self, fileno: int) -> None:
            self.masks.pop(fileno, None)

    ours, peer = socket.socketpair()
    with ours, peer:
        ours.setblocking(False)
        peer.setblocking(False)
        poller = Poller()
        connection = BoundedConnection(poller=poller, socket=ours, timeout=10.0)
        connection._TcpConnection__processConnection(ours.fileno(), POLL_EVENT_TYPE.WRITE)  # connected, idle
        assert not poller.masks[ours.fileno()] & POLL_EVENT_TYPE.WRITE
        connection.send(os.urandom(4 << 20))  # incompressible: far more than the socket takes
        assert connection._TcpConnection__writeBuffer
        assert poller.masks[ours.fileno()] & POLL_EVENT_TYPE.WRITE
        while connection._TcpConnection__writeBuffer:
            with contextlib.suppress(BlockingIOError):
                while peer.recv(1 << 20):
                    pass
            connection._TcpConnection__processConnection(ours.fileno(), POLL_EVENT_TYPE.WRITE)
        assert not poller.masks[ours.fileno()] & POLL_EVENT_TYPE.WRITE
