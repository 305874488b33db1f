"""Pre-vote on real processes (runstate/cluster/_prevote.py): a follower cut off by a partition,
frozen by SIGSTOP, or killed with kill -9 and restarted, for several election timeouts, rejoins
without deposing the healthy leader: every node names the same leader at the same term afterwards,
and no write to the leader failed meanwhile.

Without pre-vote each of these costs an election: the rejoining node starts one at term + 1 as
soon as it is connected again (its election deadline passed long ago), and pysyncobj's leader steps
down on the first message with a higher term."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.cluster import NODES, POLL_S, START_TIMEOUT_S, ChaosCluster
from runstate import Runstate
from runstate.cluster.config import LogConfig

pytestmark = pytest.mark.slow

# How long the follower stays away: several election timeouts (0.3-0.6 s) and past pysyncobj's
# connection timeout (1 s), so the other nodes drop it too.
AWAY_S = 10 * LogConfig().raft_timeout_s_max
# One write never waits longer than this (a failure, not a timing assertion: nothing is measured).
WRITE_TIMEOUT_S = 10.0
# The writer pauses this long between writes, so the log keeps moving while the follower is away.
WRITE_PAUSE_S = 0.02


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    made = ChaosCluster(tmp_path / "cluster")
    try:
        yield made
    finally:
        made.close()
        print(made.logs_tail())


class Writer(threading.Thread):
    """Creates runs through one node, one after the other, until stopped; keeps every failure."""

    def __init__(self, url: str, key: str) -> None:
        super().__init__(name="prevote-writer", daemon=True)
        self.url, self.key = url, key
        self.written = 0
        self.failures: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        with Runstate(base_url=self.url, api_key=self.key, timeout_s=WRITE_TIMEOUT_S) as rs:
            while not self._stop_event.is_set():
                try:
                    rs.scopes.create(name=f"w{self.written}")
                    self.written += 1
                except Exception as error:  # noqa: BLE001 (every failure is the finding)
                    self.failures.append(repr(error))
                self._stop_event.wait(WRITE_PAUSE_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(WRITE_TIMEOUT_S * 2)
        assert not self.is_alive()


def rejoin_keeps_the_leader(
    cluster: ChaosCluster,
    leave: Callable[[int], None],
    come_back: Callable[[int], None],
    pick: Callable[[list[int]], int] = max,
) -> None:
    leader = cluster.up()
    term = cluster.health()[cluster.ids[leader]]["term"]
    follower = pick([index for index in range(NODES) if index != leader])
    writer = Writer(cluster.urls[leader], cluster.admin_key)
    writer.start()
    try:
        leave(follower)
        # The writes go on without the follower (and the leader's election deadline is irrelevant:
        # it leads); this is how long it is away, nothing is timed.
        writer._stop_event.wait(AWAY_S)
        written_while_away = writer.written
        come_back(follower)
        # Every node answers under one leader, every pair connected, for a stable stretch.
        assert cluster.wait_healthy() == leader, json.dumps(cluster.health())
    finally:
        writer.stop()
    cluster.wait_converged()  # the follower caught up with everything written while it was away
    views = cluster.health()
    seen = json.dumps(views)
    assert {view["leader"] for view in views.values()} == {cluster.ids[leader]}, seen
    assert {view["term"] for view in views.values()} == {term}, seen
    assert views[cluster.ids[leader]]["role"] == "leader", seen
    assert writer.failures == [], writer.failures
    assert written_while_away > 0 and writer.written > written_while_away


def test_a_partitioned_follower_heals_without_an_election(cluster: ChaosCluster) -> None:
    rejoin_keeps_the_leader(cluster, cluster.partition, lambda _index: cluster.heal())


def test_a_paused_follower_resumes_without_an_election(cluster: ChaosCluster) -> None:
    rejoin_keeps_the_leader(cluster, cluster.pause, cluster.resume)


def test_a_killed_follower_restarts_without_an_election(cluster: ChaosCluster) -> None:
    rejoin_keeps_the_leader(cluster, cluster.kill, cluster.start)


def test_a_restarted_follower_connects_late_without_an_election(cluster: ChaosCluster) -> None:
    """kill -9, then a restart whose Raft connections come up only after several election
    timeouts (here: behind a partition; in Docker: a peer's name not resolving yet)."""

    def kill_and_cut(index: int) -> None:
        cluster.kill(index)
        cluster.partition(index)

    def restart_then_heal(index: int) -> None:
        cluster.start(index)
        wait_answering(cluster, index)
        threading.Event().wait(AWAY_S)  # the restarted node's election deadline passes, alone
        cluster.heal()

    rejoin_keeps_the_leader(cluster, kill_and_cut, restart_then_heal)


def wait_answering(cluster: ChaosCluster, index: int) -> None:
    """Until node `index` answers /v1/health at all (its Raft node is started by then)."""
    gave_up = threading.Event()
    timer = threading.Timer(START_TIMEOUT_S, gave_up.set)
    timer.start()
    try:
        while not cluster.node_health(index)["answering"]:
            assert not gave_up.wait(POLL_S), f"{cluster.ids[index]} never answered\n{cluster.logs_tail()}"
    finally:
        timer.cancel()
