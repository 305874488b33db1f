"""Raft read index (Ongaro's thesis, section 6.4) for pysyncobj 0.3.17, which has none: a leader
answers a linearizable read from its applied state, with no log entry, once a majority confirmed
after the read began that it still leads in its term.

Rounds. A read asks for one (`request`, loop thread): it takes the next sequence number. The tick
thread (`on_tick`, after every tick) sends the newest number asked for to every peer as
`{"type": "runstate_read_index", "term": T, "seq": S}` and notes the round's read index: its
commit index at that moment. A peer answers `{"type": "runstate_read_index_ack", "term": T,
"seq": S}` only while its own current term is T (`on_message`). Round S is confirmed when a
majority (the leader included) acknowledged S or a later round, at term T; it confirms every read
numbered S or lower, so all the reads that arrive while a round is out share the next one. A
confirmed round is handed to the reads (`on_tick` returns its number) once the leader applied up
to its read index. No round is sent before the leader committed an entry of its own term (its
no-op), so a read index covers every entry committed before this leader.

Why a message of our own and not pysyncobj's append_entries answers: those (`next_node_idx`) carry
neither a term nor which request they answer, and a snapshot chunk gets none; which answer acks a
heartbeat sent after the read began cannot be told from them. Our answer names its round and term.
A peer without this code ignores the request (pysyncobj drops unknown types): its leader's reads
then time out and the node layer falls back to a barrier entry (Node.confirm_leadership).

Why it is safe: DESIGN.md, "Linearizable reads".
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any, Protocol

READ_INDEX_REQUEST = "runstate_read_index"
READ_INDEX_RESPONSE = "runstate_read_index_ack"

_LEADER = 2
# Rounds sent and not yet confirmed that are remembered; an older one is forgotten (a later round
# confirms every read it would have: a round confirms all lower numbers).
ROUNDS_MAX = 64


class ReadIndexView(Protocol):
    """What the read index reads and does on the pysyncobj node (RaftNode implements it)."""

    def raft_state(self) -> int: ...

    def current_term(self) -> int: ...

    def commit_index(self) -> int: ...

    def applied_index(self) -> int: ...

    def noop_index(self) -> int | None: ...

    def peers(self) -> set[Any]: ...

    def send(self, node: Any, message: dict[str, Any]) -> None: ...


@dataclass
class ReadIndexCounters:
    rounds: int = 0  # rounds sent
    rounds_confirmed: int = 0  # rounds handed to the reads
    acks_sent: int = 0  # requests of a leader this node acknowledged
    requests_refused: int = 0  # requests of another term, not acknowledged


class ReadIndex:
    def __init__(self) -> None:
        self.counters = ReadIndexCounters()
        self._lock = threading.Lock()  # _requested and _sent: the loop asks, the tick thread sends
        self._requested = 0
        self._sent = 0
        # Tick thread only.
        self._term: int | None = None  # the term of the rounds below; None when not leading
        self._rounds: collections.deque[tuple[int, int]] = collections.deque()  # (seq, read index)
        self._acked: dict[Any, int] = {}  # peer -> highest round it acknowledged at _term
        self._confirmed: tuple[int, int] | None = None  # (seq, read index): confirmed, not yet applied

    def __repr__(self) -> str:
        return f"<ReadIndex requested={self._requested} sent={self._sent} term={self._term} {self.counters}>"

    # Loop thread.

    def request(self) -> tuple[int, bool]:
        """A read's round number, and whether the tick thread must be woken to send it (no round
        was asked for since the last one was sent)."""
        with self._lock:
            wake = self._requested == self._sent
            self._requested += 1
            return self._requested, wake

    # Tick thread.

    def on_tick(self, raft: ReadIndexView) -> int | None:
        """Send the newest round asked for, if leading with an entry of this term committed; return
        the newest round that a majority confirmed and whose read index is applied (else None)."""
        if raft.raft_state() != _LEADER:
            self._reset(None)
            return None
        term = raft.current_term()
        if term != self._term:
            self._reset(term)
        noop_index = raft.noop_index()
        commit_index = raft.commit_index()
        if noop_index is None or commit_index < noop_index:
            return None  # this leader's no-op is not committed: its commit index may lag the cluster's
        with self._lock:
            seq = self._requested if self._requested > self._sent else None
            if seq is not None:
                self._sent = seq
        if seq is not None:
            self._rounds.append((seq, commit_index))
            if len(self._rounds) > ROUNDS_MAX:
                self._rounds.popleft()
            self.counters.rounds += 1
            message = {"type": READ_INDEX_REQUEST, "term": term, "seq": seq}
            for node in raft.peers():
                raft.send(node, message)
        self._confirm(raft)
        confirmed = self._confirmed
        if confirmed is None or raft.applied_index() < confirmed[1]:
            return None
        self._confirmed = None
        self.counters.rounds_confirmed += 1
        return confirmed[0]

    def _confirm(self, raft: ReadIndexView) -> None:
        peers = raft.peers()
        needed = (len(peers) + 1) // 2  # acks besides the leader's own that make a majority
        if needed == 0:
            majority_seq = self._sent
        else:
            acked = sorted((self._acked.get(node, 0) for node in peers), reverse=True)
            majority_seq = acked[needed - 1]
        while self._rounds and self._rounds[0][0] <= majority_seq:
            self._confirmed = self._rounds.popleft()

    def _reset(self, term: int | None) -> None:
        self._term = term
        self._rounds.clear()
        self._acked.clear()
        self._confirmed = None

    def on_message(self, raft: ReadIndexView, node: Any, message: Any) -> bool:
        """Handle our two message types (True: consumed); anything else is pysyncobj's."""
        if not isinstance(message, dict):
            return False
        kind = message.get("type")
        if kind not in (READ_INDEX_REQUEST, READ_INDEX_RESPONSE):
            return False
        term, seq = message.get("term"), message.get("seq")
        if not (isinstance(term, int) and isinstance(seq, int)):
            return True
        if kind == READ_INDEX_REQUEST:
            # Only at the sender's term: this node has then not voted in a later term (terms never
            # go back), which is what the leader counts on.
            if term == raft.current_term() and raft.raft_state() != _LEADER:
                self.counters.acks_sent += 1
                raft.send(node, {"type": READ_INDEX_RESPONSE, "term": term, "seq": seq})
            else:
                self.counters.requests_refused += 1
            return True
        if raft.raft_state() == _LEADER and term == raft.current_term() == self._term and node in raft.peers():
            if seq > self._acked.get(node, 0):
                self._acked[node] = seq
        return True
