"""Pre-vote (runstate_server/cluster/_prevote.py). Its rules on a fake pysyncobj node first; then on real
processes: a follower cut off by a partition, frozen by SIGSTOP, or killed with kill -9 and
restarted, for several election timeouts, rejoins without deposing the healthy leader: every node
names the same leader at the same term afterwards, and no write to the leader failed meanwhile.

Without pre-vote each of these costs an election: the rejoining node starts one at term + 1 as
soon as it is connected again (its election deadline passed long ago), and pysyncobj's leader steps
down on the first message with a higher term."""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.pickle import dumps as pysyncobj_dumps
from pysyncobj.pickle import loads as pysyncobj_loads
from runstate import Runstate

from chaos.cluster import NODES, POLL_S, START_TIMEOUT_S, ChaosCluster
from runstate_server.cluster._prevote import PRE_VOTE_REQUEST, PRE_VOTE_RESPONSE, PreVote
from runstate_server.cluster.config import LogConfig
from tests._cluster import Cluster

# Timing-sensitive (no election may happen while a peer is paused, cut off or flooded): alone.
pytestmark = pytest.mark.serial

# How long the follower stays away: several election timeouts (0.3-0.6 s) and past pysyncobj's
# connection timeout (1 s), so the other nodes drop it too.
AWAY_S = 10 * LogConfig().raft_timeout_s_max
# One write never waits longer than this (a failure, not a timing assertion: nothing is measured).
WRITE_TIMEOUT_S = 10.0
# The writer pauses this long between writes, so the log keeps moving while the follower is away.
WRITE_PAUSE_S = 0.02

SILENCE_S = 0.3


@dataclass
class FakeRaft:
    """The RaftView pre-vote drives: a follower at term 5 that pysyncobj is about to make a candidate
    (may_elect is asked only then)."""

    state: int = 0
    term: int = 5
    log: tuple[int, int] = (10, 5)  # (index, term)
    nodes: set[str] = field(default_factory=lambda: {"b", "c"})
    deadline: float = 0.0
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    followed: str | None = "c"  # the leader this node follows
    address: str = "a"

    def raft_state(self) -> int:
        return self.state

    def current_term(self) -> int:
        return self.term

    def last_log(self) -> tuple[int, int]:
        return self.log

    def peers(self) -> set[str]:
        return self.nodes

    def leader(self) -> str | None:
        return self.followed

    def node_id(self, node: str) -> str:
        return node

    def self_id(self) -> str:
        return self.address

    def advance_election(self, deadline: float) -> None:
        self.deadline = min(self.deadline, deadline)

    def transfer_in_progress(self) -> bool:
        return False

    def postpone_election(self, now: float) -> None:
        self.deadline = now + 0.45

    def allow_election_now(self) -> None:
        self.deadline = 0

    def send(self, node: str, message: dict[str, Any]) -> None:
        self.sent.append((node, message))


def grant(term: int, granted: bool = True) -> dict[str, Any]:
    return {"type": PRE_VOTE_RESPONSE, "term": term, "granted": granted}


def test_a_due_election_becomes_a_pre_vote_round_and_a_majority_lets_it_start() -> None:
    raft, pre_vote = FakeRaft(), PreVote(SILENCE_S)
    assert not pre_vote.may_elect(raft, now=100.0)
    # Held back: the deadline moved, the term did not, every peer was asked about term 6.
    assert raft.deadline > 100.0 and raft.term == 5
    assert sorted(node for node, _ in raft.sent) == ["b", "c"]
    assert {message["term"] for _, message in raft.sent} == {6}
    assert all(message["type"] == PRE_VOTE_REQUEST and message["last_log_index"] == 10 for _, message in raft.sent)
    assert pre_vote.on_message(raft, "b", grant(6, granted=False), now=100.1)
    assert pre_vote.on_message(raft, "b", grant(5), now=100.1)  # an older round's answer
    assert raft.deadline > 100.0
    assert pre_vote.on_message(raft, "c", grant(6), now=100.1)
    assert raft.deadline == 0  # won: 2 of 3
    raft.sent.clear()
    assert pre_vote.may_elect(raft, now=100.2)  # pysyncobj elects in this tick
    assert raft.sent == []
    # Used once: the next due election (the real one failed, term now 6) needs a new round.
    raft.term = 6
    assert not pre_vote.may_elect(raft, now=101.0)
    assert raft.deadline > 101.0 and {message["term"] for _, message in raft.sent} == {7}


def test_every_election_pysyncobj_starts_goes_through_the_gate() -> None:
    """Under load (two cores, three nodes, fsync always) an election checked before the tick but
    started by pysyncobj's later clock reading went without a round and deposed a live leader. The
    gate is pysyncobj's own last condition: with pre-vote on, a node never becomes a candidate
    without a won round, whatever its deadline was at any earlier moment."""
    from runstate_server.cluster._raft import RaftNode

    class Gate(RaftNode):
        def __init__(self, pre_vote: PreVote | None, connected: bool) -> None:  # no pysyncobj start
            self.pre_vote = pre_vote
            self.catch_up = None  # not catching up after a discard (_catch_up.py)
            self._SyncObj__connectedNodes = {"b"} if connected else set()
            self._SyncObj__otherNodes = {"b", "c"}
            self._SyncObj__transferInProgress = False
            self._SyncObj__raftCurrentTerm = 5
            self._SyncObj__raftLog = [(b"", 10, 5)]
            self._SyncObj__raftElectionDeadline = 0.0
            self.sent: list[Any] = []

        def _SyncObj__generateRaftTimeout(self) -> float:
            return 0.45

        def send(self, node: Any, message: dict[str, Any]) -> None:
            self.sent.append((node, message))

    held = Gate(PreVote(SILENCE_S), connected=True)
    assert held._SyncObj__connectedToAnyone() is False  # what _onTick reads: no election
    assert {message["term"] for _, message in held.sent} == {6}
    assert held._SyncObj__raftElectionDeadline > 0
    assert Gate(None, connected=True)._SyncObj__connectedToAnyone() is True  # pre-vote off: pysyncobj's
    alone = Gate(PreVote(SILENCE_S), connected=False)
    assert alone._SyncObj__connectedToAnyone() is False and alone.sent == []  # not connected: no round


def test_a_won_round_expires_and_a_leader_message_cancels_it() -> None:
    raft, pre_vote = FakeRaft(), PreVote(SILENCE_S)
    assert not pre_vote.may_elect(raft, now=100.0)
    pre_vote.on_message(raft, "b", grant(6), now=100.1)
    assert raft.deadline == 0
    # The election could not start at once (no connection); much later, the grant is stale.
    assert not pre_vote.may_elect(raft, now=100.1 + SILENCE_S + 0.01)
    assert raft.deadline > 100.4  # a new round instead
    pre_vote.on_message(raft, "b", grant(6), now=100.5)
    assert raft.deadline == 0
    # A leader's heartbeat (at our term) cancels the won round: no election.
    assert not pre_vote.on_message(raft, "b", {"type": "append_entries", "term": 5}, now=100.55)
    assert not pre_vote.may_elect(raft, now=100.6)
    assert raft.deadline > 100.6


def test_a_node_ahead_of_a_live_leader_in_term_elects_without_a_pre_vote() -> None:
    """A node whose term passed the leader's (its election reached nobody) drops the leader's
    heartbeats and is refused every pre-vote by peers that hear from it: stuck for good. Once it
    has heard such a lower-term leader, its due election goes ahead, so the leader adopts its term
    and the cluster elects again with it."""
    raft, pre_vote = FakeRaft(term=9, log=(10, 5)), PreVote(SILENCE_S)
    assert not pre_vote.on_message(raft, "b", {"type": "append_entries", "term": 8}, now=100.0)
    assert pre_vote.may_elect(raft, now=100.1)
    assert raft.sent == []
    assert pre_vote.counters.rounds_skipped_behind_leader == 1
    # Once that leader is silent (stepped down), due elections need pre-votes again.
    assert not pre_vote.may_elect(raft, now=100.0 + SILENCE_S + 0.01)
    assert raft.deadline > 100.0 and {message["term"] for _, message in raft.sent} == {10}


def test_a_single_node_wins_its_own_round() -> None:
    raft, pre_vote = FakeRaft(nodes=set()), PreVote(SILENCE_S)
    assert pre_vote.may_elect(raft, now=100.0)
    assert raft.sent == []
    assert pre_vote.may_elect(raft, now=100.0)


def test_a_peer_grants_only_without_a_live_leader_and_with_a_log_as_up_to_date() -> None:
    raft, pre_vote = FakeRaft(deadline=1e9), PreVote(SILENCE_S)

    def ask(last_index: int, last_term: int, now: float) -> bool:
        raft.sent.clear()
        request = {"type": PRE_VOTE_REQUEST, "term": 6, "last_log_index": last_index, "last_log_term": last_term}
        assert pre_vote.on_message(raft, "b", request, now=now)
        [(node, answer)] = raft.sent
        assert node == "b" and answer["type"] == PRE_VOTE_RESPONSE and answer["term"] == 6
        return bool(answer["granted"])

    assert ask(10, 5, now=100.0)  # never heard from a leader; same log
    assert ask(3, 6, now=100.0)  # a later last term wins over a longer log
    assert not ask(9, 5, now=100.0)  # shorter log, same last term
    assert not ask(20, 4, now=100.0)  # older last term
    pre_vote.on_message(raft, "c", {"type": "append_entries", "term": 5}, now=100.0)
    assert not ask(10, 5, now=100.0 + SILENCE_S / 2)  # heard from the leader just now
    assert ask(10, 5, now=100.0 + SILENCE_S + 0.01)
    pre_vote.on_message(raft, "c", {"type": "append_entries", "term": 4}, now=101.0)  # a stale leader
    assert ask(10, 5, now=101.0)
    raft.state = 2
    assert not ask(10, 5, now=102.0)  # the leader never grants


def test_a_closed_connection_to_the_live_leader_brings_the_election_forward_by_rank() -> None:
    """kill -9 closes the leader's sockets: its followers need not wait out an election timeout of
    silence. Each brings its election forward by its rank among the other voters (by address), so
    two followers that saw the same close do not campaign at once."""
    first, second = FakeRaft(deadline=1e9, address="a"), FakeRaft(deadline=1e9, address="b", nodes={"a", "c"})
    pre_votes = [PreVote(SILENCE_S, lost_delay_s=0.02, lost_stagger_s=0.1) for _ in range(2)]
    for raft, pre_vote in zip((first, second), pre_votes, strict=True):
        pre_vote.on_message(raft, "c", {"type": "append_entries", "term": 5}, now=100.0)
        pre_vote.on_disconnected(raft, "b" if raft is first else "a", now=100.01)  # not the leader
        assert raft.deadline == 1e9
        pre_vote.on_disconnected(raft, "c", now=100.01)
    assert first.deadline == pytest.approx(100.03) and second.deadline == pytest.approx(100.13)
    assert [pre_vote.counters.leaders_lost for pre_vote in pre_votes] == [1, 1]
    # Reconnection attempts that fail close it again: counted once, the deadline is not moved again.
    first.deadline = 1e9
    pre_votes[0].on_disconnected(first, "c", now=100.05)
    assert first.deadline == 1e9 and pre_votes[0].counters.leaders_lost == 1


def test_a_peer_is_redialled_before_the_second_follower_campaigns() -> None:
    """Of two peers only the one with the higher address dials. When the leader dies just after a
    follower restarted, the other follower may have last dialled it while it was down: until it
    dials again, neither survivor reaches a majority, and both campaign at once when they connect
    (a split vote: bench.failover's kills over 0.5 s, with a 0.5 s redial period)."""
    config = LogConfig()
    assert config.connection_retry_s <= config.leader_lost_stagger_s
    with pytest.raises(AssertionError, match="redial"):
        LogConfig(connection_retry_s=config.leader_lost_stagger_s * 2)


def test_a_closed_connection_reaches_pre_vote_before_pysyncobj() -> None:
    from pysyncobj.node import TCPNode

    from runstate_server.cluster._raft import RaftNode

    leader, peer = TCPNode("127.0.0.1:3"), TCPNode("127.0.0.1:2")

    class Wired(RaftNode):
        def __init__(self, pre_vote: PreVote) -> None:  # no pysyncobj start
            self.pre_vote = pre_vote
            self._SyncObj__raftState = 0
            self._SyncObj__raftCurrentTerm = 0
            self._SyncObj__raftLeader = leader
            self._SyncObj__selfNode = TCPNode("127.0.0.1:1")
            self._SyncObj__otherNodes = {leader, peer}
            self._SyncObj__connectedNodes = {leader, peer}
            self._SyncObj__raftElectionDeadline = 1e12

    pre_vote = PreVote(SILENCE_S, lost_delay_s=0.02, lost_stagger_s=0.1)
    node = Wired(pre_vote)
    pre_vote.on_message(node, leader, {"type": "append_entries", "term": 0})
    node._SyncObj__onNodeDisconnected(leader)
    assert node._SyncObj__connectedNodes == {peer}  # pysyncobj's own handler ran too
    assert pre_vote.counters.leaders_lost == 1 and node.election_deadline() < 1e12


def test_a_closed_connection_moves_nothing_for_a_silent_leader_or_a_leader_itself() -> None:
    raft, pre_vote = FakeRaft(deadline=1e9), PreVote(SILENCE_S, lost_delay_s=0.02, lost_stagger_s=0.1)
    pre_vote.on_disconnected(raft, "c", now=100.0)  # never heard from it: the timeout runs already
    pre_vote.on_message(raft, "c", {"type": "append_entries", "term": 5}, now=100.0)
    pre_vote.on_disconnected(raft, "c", now=100.0 + SILENCE_S + 0.01)  # silent for long already
    assert raft.deadline == 1e9
    pre_vote.on_message(raft, "c", {"type": "append_entries", "term": 5}, now=101.0)
    raft.state, raft.followed = 2, None
    pre_vote.on_disconnected(raft, "c", now=101.01)  # this node leads
    assert raft.deadline == 1e9 and pre_vote.counters.leaders_lost == 0


def test_a_peer_whose_leader_connection_closed_grants_until_it_hears_a_leader_again() -> None:
    raft, pre_vote = FakeRaft(deadline=1e9), PreVote(SILENCE_S, lost_delay_s=0.02, lost_stagger_s=0.1)
    request = {"type": PRE_VOTE_REQUEST, "term": 6, "last_log_index": 10, "last_log_term": 5}

    def granted(now: float) -> bool:
        raft.sent.clear()
        assert pre_vote.on_message(raft, "b", request, now=now)
        return bool(raft.sent[-1][1]["granted"])

    pre_vote.on_message(raft, "c", {"type": "append_entries", "term": 5}, now=100.0)
    assert not granted(now=100.01)  # the leader lives
    pre_vote.on_disconnected(raft, "c", now=100.02)
    assert granted(now=100.03)  # its connection closed: lost, without waiting silence_s
    pre_vote.on_message(raft, "c", {"type": "append_entries", "term": 5}, now=100.1)  # back (reconnected)
    assert not granted(now=100.11)


def test_a_peer_that_refuses_a_shorter_log_without_a_leader_campaigns_at_once() -> None:
    """The asker's election was due and ours is the longer log: ours should be the next election."""
    raft, pre_vote = FakeRaft(deadline=1e9), PreVote(SILENCE_S)
    behind = {"type": PRE_VOTE_REQUEST, "term": 6, "last_log_index": 9, "last_log_term": 5}
    pre_vote.on_message(raft, "c", {"type": "append_entries", "term": 5}, now=100.0)
    pre_vote.on_message(raft, "b", behind, now=100.1)  # refused: a leader lives
    assert raft.deadline == 1e9
    pre_vote.on_message(raft, "b", behind, now=100.0 + SILENCE_S + 0.01)  # refused: log behind
    assert raft.sent[-1][1]["granted"] is False and raft.deadline == pytest.approx(100.0 + SILENCE_S + 0.01)


def test_malformed_and_foreign_messages_are_dropped_or_passed_on() -> None:
    raft, pre_vote = FakeRaft(deadline=1e9), PreVote(SILENCE_S)
    assert pre_vote.on_message(raft, "b", {"type": PRE_VOTE_REQUEST, "term": "6"}, now=100.0)
    assert pre_vote.on_message(raft, "z", {"type": PRE_VOTE_REQUEST, "term": 6, "last_log_index": 1,
                                           "last_log_term": 1}, now=100.0)  # not a peer
    assert raft.sent == []
    assert pre_vote.on_message(raft, "b", {"type": PRE_VOTE_RESPONSE}, now=100.0)  # no round: ignored
    assert not pre_vote.on_message(raft, "b", "not a dict", now=100.0)
    assert not pre_vote.on_message(raft, "b", {"type": "request_vote", "term": 9}, now=100.0)


# Real processes.


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    """The nodes log at INFO (every election and pre-vote grant, printed if the test fails). The
    pair proxies run in this process's threads: a collection of this (large, late in a run) heap
    would hold every Raft message for longer than an election timeout, which is the harness
    failing, not pre-vote; so the collector is off while the cluster runs."""
    made = ChaosCluster(tmp_path / "cluster", log_level="INFO")
    gc.collect()
    gc.disable()
    try:
        yield made
    finally:
        gc.enable()
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
                except Exception as error:  # every failure is the finding
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


@pytest.mark.slow
def test_a_partitioned_follower_heals_without_an_election(cluster: ChaosCluster) -> None:
    rejoin_keeps_the_leader(cluster, cluster.partition, lambda _index: cluster.heal())


@pytest.mark.slow
def test_a_paused_follower_resumes_without_an_election(cluster: ChaosCluster) -> None:
    rejoin_keeps_the_leader(cluster, cluster.pause, cluster.resume)


@pytest.mark.slow
def test_a_killed_follower_restarts_without_an_election(cluster: ChaosCluster) -> None:
    rejoin_keeps_the_leader(cluster, cluster.kill, cluster.start)


@pytest.mark.slow
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


def test_a_follower_ahead_of_the_leader_in_term_rejoins(make_cluster: Callable[..., Cluster]) -> None:
    """A follower whose stored term passed the leader's (an election of its that reached nobody,
    before a kill) drops the leader's heartbeats, and its peers, hearing the leader, refuse its
    pre-votes: without help it stays out for good (seen in a 20-minute chaos run). It must rejoin
    (at the cost of one election) and catch up."""
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    follower = next(index for index in range(cluster.size) if index != leader)
    cluster.kill(follower)
    health = cluster.health(leader)
    assert health is not None
    ahead = int(health["term"]) + 5
    meta_path = cluster.data_dir(follower) / "raft.journal.meta"
    meta = pysyncobj_loads(meta_path.read_bytes())
    meta.update(currentTerm=ahead, votedForNodeId=None)
    meta_path.write_bytes(pysyncobj_dumps(meta))
    api = cluster.api(leader).resending()
    for _ in range(20):  # the follower falls behind in the log as well
        api.ok("POST", "/v1/scopes", {})
    cluster.start(follower)  # healthy under one leader, or it times out
    cluster.wait_same_digest()
    terms = {int((cluster.health(index) or {}).get("term", 0)) for index in range(cluster.size)}
    assert len(terms) == 1 and terms.pop() > ahead
