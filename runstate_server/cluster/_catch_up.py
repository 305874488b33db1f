"""A node that discarded its damaged Raft data votes for no one until it has caught up again.

A voter that lost entries it had acknowledged breaks Raft's majority arguments (the "disk loss"
problem): a commit counted its copy, and an empty log makes it grant its vote to any candidate, one
that lacks the committed entries included. So after a discard (ReplicatedLog, DESIGN.md "Checksums
and damaged data") the node keeps a marker file (`raft.catching-up`) and, while it is there:

- it drops `request_vote`, `timeout_now` and pre-vote requests unanswered (as lost messages) and
  never campaigns itself: no election counts it until it holds what it may have acknowledged;
- it records, for the term of the first leader it hears from (and again for each later leader's
  term), the highest index that leader may count this node for: the leader's `prevLogIdx` in that
  first append (its next index for this node less one, which is never below the match index it
  kept for this node's copy from before the discard) and its commit index then;
- it has caught up once it has committed and applied that index under that leader's term: from
  then on it holds every entry a commit may have counted its copy for, and the marker is removed.

It still acknowledges appends while it catches up: an acknowledgement counts only what it holds
now. Why this is enough is in DESIGN.md. Tick thread only.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Protocol

from runstate_server.cluster._prevote import PRE_VOTE_REQUEST
from runstate_server.cluster.snapshot import fsync_directory

logger = logging.getLogger(__name__)

MARKER_FILE_NAME = "raft.catching-up"
# What a node catching up drops: pysyncobj's vote request and leadership hand-over, and pre-vote's
# request (its answer would let the asker campaign with a vote this node then refuses).
DROPPED_MESSAGES = frozenset({"request_vote", "timeout_now", PRE_VOTE_REQUEST})


class RaftView(Protocol):
    def current_term(self) -> int: ...
    def commit_index(self) -> int: ...
    def applied_index(self) -> int: ...
    def leader(self) -> Any: ...


class CatchUp:
    def __init__(self, marker_path: str, *, fsync: bool) -> None:
        self.marker_path = marker_path
        self._fsync = fsync
        self.term: int | None = None  # the leader's term whose target is known
        self.target: int | None = None  # the index to commit and apply under that term
        self.done = False
        self.discarded = False  # this start discarded the data (not a restart before catching up)

    @staticmethod
    def mark(marker_path: str, *, fsync: bool) -> None:
        """Write the marker (before anything is discarded: a crash halfway still finds it)."""
        with open(marker_path, "wb") as file:
            file.write(b"this node discarded damaged Raft data; it grants no vote until it has caught up\n")
            file.flush()
            if fsync:
                os.fsync(file.fileno())
        if fsync:
            fsync_directory(os.path.dirname(marker_path) or ".")

    def on_message(self, raft: RaftView, message: Any) -> bool:
        """True: drop the message (a vote this node must not give)."""
        if not isinstance(message, dict):
            return False
        kind = message.get("type")
        if kind in DROPPED_MESSAGES:
            return True
        if kind == "append_entries":
            term, commit_index = message.get("term"), message.get("commit_index")
            if isinstance(term, int) and isinstance(commit_index, int) and term >= raft.current_term():
                if self.term is None or term > self.term:
                    previous = message.get("prevLogIdx")
                    self.term = term
                    self.target = max(commit_index, previous if isinstance(previous, int) else 0)
        return False

    def caught_up(self, raft: RaftView) -> bool:
        """Whether this node now holds, committed and applied, every entry the current leader may have
        counted its copy for; then the marker is removed (once)."""
        if self.done:
            return True
        if self.term is None or self.target is None or raft.leader() is None or raft.current_term() != self.term:
            return False
        if raft.commit_index() < self.target or raft.applied_index() < self.target:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.marker_path)
        if self._fsync:
            fsync_directory(os.path.dirname(self.marker_path) or ".")
        self.done = True
        logger.warning("caught up from the leader after discarding damaged Raft data (index %d, term %d): this "
                       "node votes again", self.target, self.term)
        return True
