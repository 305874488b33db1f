"""Three real cluster nodes: what `GET /v1/cluster` shows of each node, a dead one included, and a
Raft port that unpickles nothing from a peer without the cluster secret."""

from __future__ import annotations

import pickle
import socket
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests._cluster import Cluster

CONNECT_TIMEOUT_S = 5.0
VIEW_AGREE_S = 30.0  # for the cluster view and the leader's health to agree (an election in between)


def test_the_cluster_view_shows_every_node_and_a_dead_one_as_unreachable(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    dead, asked = (leader + 1) % cluster.size, (leader + 2) % cluster.size
    cluster.kill(dead)
    cluster.api(asked).resending().ok("POST", "/v1/mailboxes", {"name": "work"})  # the two others still commit
    alive = (leader, asked)

    def agreed() -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """The leader, its health and `asked`'s view, once they agree (a loaded machine's pause may
        bring an election of the two left between two reads: read again)."""
        now_leading = cluster.leader_index(exclude=[dead])
        health, view = cluster.health(now_leading), cluster.api(asked).ok("GET", "/v1/cluster")
        terms = {node["term"] for node in view["nodes"] if node["id"] != cluster.ids[dead]}
        if health is None or view["leader"] != cluster.ids[now_leading] or terms != {health["term"]}:
            return None
        return now_leading, health, view

    leader, leader_health, view = cluster.wait_until("the view and the leader to agree", agreed, VIEW_AGREE_S)
    nodes = {node["id"]: node for node in view["nodes"]}
    assert sorted(nodes) == cluster.ids
    assert nodes[cluster.ids[dead]]["reachable"] is False
    for index in alive:
        node: dict[str, Any] = nodes[cluster.ids[index]]
        assert node["reachable"] is True and node["apiUrl"] == cluster.urls[index]
        assert node["role"] == ("leader" if index == leader else "follower")
        assert node["leader"] == cluster.rafts[leader]
        assert node["term"] == leader_health["term"]
        assert 0 < node["appliedIndex"] <= node["commitIndex"]


class _CreatesAFile:
    """Unpickling this creates `path`: what an outsider sends to a Raft port without a secret."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def send_raft_frame(address: str, payload: bytes) -> None:
    """One message as pysyncobj frames it: a native int length, then zlib(pickle(message))."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S) as connection:
        data = zlib.compress(payload)
        connection.sendall(struct.pack("i", len(data)) + data)
        connection.settimeout(CONNECT_TIMEOUT_S)
        try:
            while connection.recv(4096):  # the node drops the connection
                pass
        except OSError:
            pass


def test_a_raft_port_unpickles_nothing_from_a_sender_without_the_secret(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster().start()
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_CreatesAFile(marker))
    for index in range(cluster.size):
        send_raft_frame(cluster.rafts[index], payload)
    # Still one healthy cluster, and nothing was unpickled.
    cluster.wait_healthy(list(range(cluster.size)))
    cluster.api(cluster.leader_index()).resending().ok("POST", "/v1/mailboxes", {"name": "work"})
    assert not marker.exists(), "a Raft port unpickled a message from a sender without the secret"
