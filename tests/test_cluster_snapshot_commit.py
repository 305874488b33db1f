"""A snapshot chunk from a new leader commits nothing of a follower's stale log (cluster/_raft.py,
`without_snapshot_commit`).

pysyncobj 0.3.17 ends every append_entries with `commit = min(leader's commit, our last index)`,
and a snapshot chunk neither checks nor truncates the follower's log first. A partitioned leader
that rejoins still holds the entries it appended and never committed: the first chunk of the new
leader's snapshot committed them, the node applied them and acknowledged their clients, though the
cluster never made those writes (chaos seed 2718 found an acknowledged budget settle that was
never applied). Here: a real RaftNode, three stale entries of an old term, one chunk."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pysyncobj import SyncObjConf

from runstate_server.cluster import _raft
from runstate_server.cluster._raft import RaftNode, without_snapshot_commit
from tests._nodes import free_port

STALE_ENTRIES = 3


class Bridge:
    def __init__(self) -> None:
        self.applied: list[bytes] = []

    def apply_batch(self, batch: bytes) -> list[Any]:
        self.applied.append(batch)
        return []


@pytest.fixture
def follower() -> Iterator[tuple[RaftNode, Bridge]]:
    """A follower at term 1 whose log ends with STALE_ENTRIES entries it never committed."""
    port, bridge = free_port(), Bridge()
    conf = SyncObjConf(autoTick=False, bindAddress=f"127.0.0.1:{port}", password="secret", dynamicMembershipChange=False)
    node = RaftNode(bridge, f"127.0.0.1:{port}", [f"127.0.0.1:{free_port()}"], conf)
    try:
        node._SyncObj__raftCurrentTerm = 1
        log = node._SyncObj__raftLog
        first = log[-1][1] + 1
        for index in range(first, first + STALE_ENTRIES):
            log.add(b"stale", index, 1)
        yield node, bridge
    finally:
        node.destroy()


def chunk(commit_index: int) -> dict[str, Any]:
    """The first of several chunks of a term-2 leader's snapshot."""
    return {"type": "append_entries", "term": 2, "commit_index": commit_index, "serialized": (b"part", True, False)}


def test_a_snapshot_chunk_commits_none_of_the_stale_entries(follower: tuple[RaftNode, Bridge]) -> None:
    node, bridge = follower
    committed = node.commit_index()
    peer = next(iter(node._SyncObj__otherNodes))
    node._SyncObj__onMessageReceived(peer, chunk(commit_index=committed + 100))
    assert node.commit_index() == committed
    node._onTick(0.0)  # would apply whatever is committed
    assert bridge.applied == []


def test_without_the_guard_pysyncobj_commits_them(
    follower: tuple[RaftNode, Bridge], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test above would fail on pysyncobj alone: it commits the whole stale suffix."""
    node, _bridge = follower
    monkeypatch.setattr(_raft, "without_snapshot_commit", lambda message, _commit: message)
    committed = node.commit_index()
    node._SyncObj__onMessageReceived(next(iter(node._SyncObj__otherNodes)), chunk(commit_index=committed + 100))
    assert node.commit_index() == committed + STALE_ENTRIES


def test_only_snapshot_chunks_are_changed() -> None:
    regular = {"type": "append_entries", "term": 2, "commit_index": 9, "prevLogIdx": 3, "prevLogTerm": 1, "entries": []}
    assert without_snapshot_commit(regular, 1) is regular
    assert without_snapshot_commit(chunk(commit_index=9), 4)["commit_index"] == 4
    assert without_snapshot_commit(chunk(commit_index=3), 4)["commit_index"] == 3
    assert without_snapshot_commit({"type": "request_vote", "term": 2}, 1) == {"type": "request_vote", "term": 2}
