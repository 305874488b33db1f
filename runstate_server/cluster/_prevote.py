"""Raft pre-vote (Ongaro's thesis, section 9.6) for pysyncobj 0.3.17, which has none.

Without it, a follower that stops hearing from the leader (a partition, a SIGSTOP, a restart whose
connections are not up yet) becomes a candidate and increments its term as soon as it is connected
to anyone; when it is back, its higher term deposes the healthy leader (pysyncobj steps down on any
request_vote or append_entries with a higher term), ~1-2 s of 503s for nothing.

With pre-vote, a node whose election timeout passed first asks every peer "would you vote for me
at term T+1, with my last log (index, term)?", without changing its term or anything else. A peer
answers yes only if that log is at least as up to date as its own AND it has not heard from a
leader for at least `silence_s` (raft_timeout_s_min), and it is not the leader itself. Only with a
majority of yes (itself included) does the node let pysyncobj start the real election (term + 1,
request_vote). Pre-vote only ever holds an election back; it decides nothing: the real vote keeps
every safety rule (DESIGN.md, "Pre-vote").

How it is wired (RaftNode, _raft.py; the pysyncobj internals are listed in DESIGN.md):
- `may_elect` is asked at the very moment SyncObj._onTick decides to start an election (its
  `__raftElectionDeadline` passed, a follower or candidate; RaftNode answers pysyncobj's own
  "connected to anyone?" check, the last condition it evaluates, with it). Unless a round won
  within `silence_s` for exactly term + 1 is pending, it moves that deadline by a fresh election
  timeout, sends the pre-vote requests and answers no: pysyncobj does not elect. Asked at the
  decision itself, not before the tick, so no clock reading can differ from pysyncobj's.
- `on_message` sees every message before pysyncobj. It consumes our two message types (pysyncobj's
  own handler ignores any type it does not know, so a node without pre-vote ignores them too) and
  notes when a leader's append_entries is accepted. A won round sets the election deadline to 0, so
  the election starts on the next tick.
- A leadership transfer (pysyncobj's timeout_now, which we never send) skips pre-vote: the peers
  still hear from the old leader and would refuse.
- `on_disconnected` is told when a connection to a peer closes. When it is the live leader this
  node follows (its process died: kill -9, a crash and a stop close its sockets; a partition or a
  pause closes nothing here), the leader is lost now, not after an election timeout of silence:
  the election is moved to `lost_delay_s + rank * lost_stagger_s` from now (rank: this node's
  place among the voters but the lost leader, by address, so that two followers that saw the same
  close do not campaign at once and split the vote), and until a leader is heard again this node
  grants pre-votes as if it had not heard from one for `silence_s`. A live leader whose connection
  to one follower closed keeps leading: the other followers still hear it and refuse.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

# pysyncobj's clock (CLOCK_MONOTONIC_RAW), which its election deadline is measured on.
from runstate_server.cluster._pysyncobj import raft_clock

logger = logging.getLogger(__name__)

PRE_VOTE_REQUEST = "runstate_pre_vote"
PRE_VOTE_RESPONSE = "runstate_pre_vote_response"

_FOLLOWER, _CANDIDATE, _LEADER = 0, 1, 2
_NEVER = float("-inf")


class RaftView(Protocol):
    """What pre-vote reads and does on the pysyncobj node (RaftNode implements it)."""

    def raft_state(self) -> int: ...

    def current_term(self) -> int: ...

    def last_log(self) -> tuple[int, int]: ...  # (index, term) of the last entry

    def peers(self) -> set[Any]: ...  # pysyncobj Node objects of the voting peers

    def leader(self) -> Any: ...  # the Node this node last followed (None: none, or itself)

    def node_id(self, node: Any) -> str: ...  # a peer's address

    def self_id(self) -> str: ...  # this node's address

    def advance_election(self, deadline: float) -> None: ...  # deadline = min(deadline, the current one)

    def transfer_in_progress(self) -> bool: ...

    def postpone_election(self, now: float) -> None: ...  # deadline = now + a fresh election timeout

    def allow_election_now(self) -> None: ...  # deadline = 0: the next tick elects

    def send(self, node: Any, message: dict[str, Any]) -> None: ...


@dataclass
class _Round:
    term: int  # the term this node would campaign at (its current term + 1)
    started_at: float
    granted_by: set[Any] = field(default_factory=set)
    won_at: float | None = None


@dataclass
class PreVoteCounters:
    rounds: int = 0  # pre-vote rounds started
    rounds_won: int = 0  # rounds that let an election start
    granted: int = 0  # pre-votes this node gave
    refused_leader_alive: int = 0  # refused: this node leads, or heard from a leader within silence_s
    refused_log_behind: int = 0  # refused: the asker's log is behind ours
    rounds_skipped_behind_leader: int = 0  # elections let through: a leader lives at a lower term
    leaders_lost: int = 0  # the connection to the live leader this node followed closed


class PreVote:
    """One node's pre-vote state. Runs in the tick thread only (pysyncobj's)."""

    def __init__(self, silence_s: float, lost_delay_s: float = 0.0, lost_stagger_s: float = 0.0) -> None:
        assert silence_s > 0 and lost_delay_s >= 0 and lost_stagger_s >= 0
        # A peer grants only after this long without a leader; a won round stays usable this long.
        self.silence_s = silence_s
        # After the leader's connection closed: the election of the voter of rank r (0, 1, ...) is
        # due lost_delay_s + r * lost_stagger_s later.
        self.lost_delay_s = lost_delay_s
        self.lost_stagger_s = lost_stagger_s
        self.counters = PreVoteCounters()
        self._round: _Round | None = None
        self._leader_heard_at = _NEVER
        # When the connection to the leader this node followed last closed (while it was live).
        self._leader_lost_at = _NEVER
        # When a leader's append_entries at a term BELOW ours last arrived (pysyncobj drops it).
        self._lower_leader_heard_at = _NEVER

    def __repr__(self) -> str:
        c = self.counters
        return (
            f"<PreVote rounds={c.rounds} won={c.rounds_won} granted={c.granted} "
            f"refused={c.refused_leader_alive}+{c.refused_log_behind}>"
        )

    # Candidate side.

    def may_elect(self, raft: RaftView, now: float | None = None) -> bool:
        """pysyncobj is starting an election now (tick thread): True lets it, False holds it back
        (a round was started instead, or is under way)."""
        now = raft_clock() if now is None else now
        if raft.transfer_in_progress():
            return True
        if now - self._lower_leader_heard_at < self.silence_s:
            # A leader lives at a term below ours: we are ahead in term (an election of ours that
            # reached nobody, before a kill or a partition) and drop its messages, and the peers
            # that hear from it refuse every pre-vote, so we would never rejoin. A real election
            # (plain pysyncobj, as etcd's node answers such a leader) makes it adopt our term and
            # lets the cluster elect again at once: one election, never a node stuck outside.
            self._round = None
            self.counters.rounds_skipped_behind_leader += 1
            return True
        if self._won_round_usable(raft, now):
            self._round = None  # used once: the next election needs a new round
            return True
        self._start_round(raft, now)
        if self._won_round_usable(raft, now):  # a single node wins with its own vote
            self._round = None
            return True
        return False

    def _won_round_usable(self, raft: RaftView, now: float) -> bool:
        round_ = self._round
        return (
            round_ is not None
            and round_.won_at is not None
            and round_.term == raft.current_term() + 1
            and now - round_.won_at <= self.silence_s
        )

    def _start_round(self, raft: RaftView, now: float) -> None:
        raft.postpone_election(now)
        last_index, last_term = raft.last_log()
        self._round = _Round(term=raft.current_term() + 1, started_at=now)
        self.counters.rounds += 1
        request = {
            "type": PRE_VOTE_REQUEST,
            "term": self._round.term,
            "last_log_index": last_index,
            "last_log_term": last_term,
        }
        for node in raft.peers():
            raft.send(node, request)
        self._check_won(raft, now)

    def _on_response(self, raft: RaftView, node: Any, message: dict[str, Any], now: float) -> None:
        round_ = self._round
        if round_ is None or round_.won_at is not None or message.get("term") != round_.term:
            return  # late, or for an older round
        if message.get("granted") is True and node in raft.peers():
            round_.granted_by.add(node)
            self._check_won(raft, now)

    def _check_won(self, raft: RaftView, now: float) -> None:
        round_ = self._round
        assert round_ is not None
        voters = len(raft.peers()) + 1
        if 2 * (len(round_.granted_by) + 1) > voters:
            round_.won_at = now
            self.counters.rounds_won += 1
            logger.info("pre-vote for term %d won (%d of %d)", round_.term, len(round_.granted_by) + 1, voters)
            raft.allow_election_now()

    # Voter side, and every message.

    def on_message(self, raft: RaftView, node: Any, message: Any, now: float | None = None) -> bool:
        """True when the message was ours (pysyncobj must not see it)."""
        if not isinstance(message, dict):
            return False
        kind = message.get("type")
        now = raft_clock() if now is None else now
        if kind == "append_entries":
            term = message.get("term")
            if isinstance(term, int) and term >= raft.current_term():
                # pysyncobj accepts it: a live leader (it resets its election deadline likewise).
                self._leader_heard_at = now
                self._round = None
            elif isinstance(term, int):
                self._lower_leader_heard_at = now
            return False
        if kind == PRE_VOTE_REQUEST:
            if node in raft.peers():
                self._on_request(raft, node, message, now)
            return True
        if kind == PRE_VOTE_RESPONSE:
            self._on_response(raft, node, message, now)
            return True
        return False

    def _on_request(self, raft: RaftView, node: Any, message: dict[str, Any], now: float) -> None:
        term, last_index, last_term = message.get("term"), message.get("last_log_index"), message.get("last_log_term")
        if not (isinstance(term, int) and isinstance(last_index, int) and isinstance(last_term, int)):
            return  # not from our version: no answer, like a lost message
        behind_before = self.counters.refused_log_behind
        granted = self.would_grant(raft, (last_term, last_index), now)
        if self.counters.refused_log_behind > behind_before:
            # No live leader, and the asker's log is behind ours: we are the better candidate, and
            # the asker's deadline passed already. Campaign now rather than after our own timeout.
            raft.advance_election(now)
        if granted:
            logger.info("pre-vote for term %d granted to %s (a leader last heard %.3f s ago)",
                        term, node, now - self._leader_heard_at)
        raft.send(node, {"type": PRE_VOTE_RESPONSE, "term": term, "granted": granted})

    def on_disconnected(self, raft: RaftView, node: Any, now: float | None = None) -> None:
        """The connection to `node` closed (tick thread, before pysyncobj hears of it)."""
        now = raft_clock() if now is None else now
        if raft.raft_state() != _FOLLOWER or node is None or node != raft.leader():
            return
        if now - self._leader_heard_at >= self.silence_s or self._leader_lost_at >= self._leader_heard_at:
            return  # silent for long (the election timeout runs already), or lost already
        self._leader_lost_at = now
        self.counters.leaders_lost += 1
        others = sorted([raft.self_id(), *(raft.node_id(peer) for peer in raft.peers() if peer != node)])
        rank = others.index(raft.self_id())
        due_in = self.lost_delay_s + rank * self.lost_stagger_s
        logger.info("lost the connection to the leader %s: election due in %.3f s (rank %d)", node, due_in, rank)
        raft.advance_election(now + due_in)

    def _leader_alive(self, now: float) -> bool:
        """A leader was heard within silence_s, and its connection has not closed since."""
        return now - self._leader_heard_at < self.silence_s and self._leader_lost_at < self._leader_heard_at

    def would_grant(self, raft: RaftView, asker_last: tuple[int, int], now: float) -> bool:
        """Raft's vote rule on the log, plus: no live leader. The term is not compared: a pre-vote
        changes no state, and a real request_vote at a lower term is ignored by pysyncobj anyway."""
        if raft.raft_state() == _LEADER or self._leader_alive(now):
            self.counters.refused_leader_alive += 1
            return False
        own_index, own_term = raft.last_log()
        if asker_last < (own_term, own_index):
            self.counters.refused_log_behind += 1
            return False
        self.counters.granted += 1
        return True
