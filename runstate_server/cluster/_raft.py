"""The thin pysyncobj subclass: one @replicated method taking one bytes batch, nothing else.

Everything it needs arrives as `bridge` (the ReplicatedLog), set BEFORE SyncObj.__init__ so that
pysyncobj counts it among its own properties and never serializes it; so do `pre_vote`
(_prevote.py), which this class wires into pysyncobj's tick, message and disconnection handlers,
and `read_index` (_read_index.py), which sees the messages before pysyncobj.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
from collections.abc import Sequence
from typing import Any, Protocol

from runstate_server.cluster._catch_up import CatchUp
from runstate_server.cluster._prevote import PreVote
from runstate_server.cluster._pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
from runstate_server.cluster._read_index import ReadIndex
from runstate_server.cluster._transport import EPOCH_UNTOLD, KEEPALIVE, LEVEL_UNTOLD, BoundedTransport
from runstate_server.cluster.peer_tls import PeerTls


class Bridge(Protocol):
    def apply_batch(self, batch: bytes) -> list[Any]: ...




def without_snapshot_commit(message: Any, commit_index: int) -> Any:
    """A leader's snapshot chunk (an append_entries with `serialized` and no `prevLogIdx`) whose
    `commit_index` cannot move this follower's commit index.

    pysyncobj 0.3.17 handles every append_entries by ending with `commit = min(leader's commit,
    last index of OUR log)`, and a snapshot chunk neither checks nor truncates our log first. A
    follower that was a partitioned leader still holds the entries it appended but never
    committed; the first chunk of a snapshot from the new leader committed them, and the node
    applied them and answered their clients OK: acknowledged writes that the cluster never made
    (chaos seed 2718, a settle acknowledged and then absent; the snapshot, once loaded, replaced
    the diverged state, so the replicas' digests agreed again). With the leader's commit index held
    to ours, a chunk commits nothing; the loaded snapshot brings its own, and the next regular
    append_entries (checked against our log, whose stale suffix it truncates) moves it on."""
    if (
        isinstance(message, dict) and message.get("type") == "append_entries" and "serialized" in message
        and "prevLogIdx" not in message and isinstance(message.get("commit_index"), int)
        and message["commit_index"] > commit_index
    ):
        return {**message, "commit_index": commit_index}
    return message


_LEADER = 2  # pysyncobj's _RAFT_STATE.LEADER


def _no_wake_up() -> None:
    pass


class RaftNode(SyncObj):  # type: ignore[misc]
    def __init__(
        self,
        bridge: Bridge,
        self_address: str | None,
        peer_addresses: Sequence[Any],  # addresses, or pysyncobj node objects (membership.py)
        conf: SyncObjConf,
        pre_vote: PreVote | None = None,
        handshake_timeout_s: float = 2.0,
        read_index: ReadIndex | None = None,
        command_level: int = LEVEL_UNTOLD,
        epoch: int = EPOCH_UNTOLD,
        catch_up: CatchUp | None = None,
        peer_tls: PeerTls | None = None,
    ):
        self._bridge = bridge
        self.pre_vote = pre_vote
        self.read_index = read_index
        # Set while this node catches up after discarding damaged data: it votes for no one
        # (_catch_up.py); the log clears it once caught up.
        self.catch_up = catch_up
        try:
            # autoTick=False: binds the port here, synchronously. The transport bounds what an
            # unauthenticated peer can do (_transport.py).
            transport_class = functools.partial(
                BoundedTransport, handshake_timeout_s=handshake_timeout_s, command_level=command_level, epoch=epoch,
                peer_tls=peer_tls,
            )
            super().__init__(self_address, list(peer_addresses), conf, transportClass=transport_class)
            if conf.dynamicMembershipChange and not (conf.fullDumpFile and os.path.isfile(conf.fullDumpFile)):
                self.apply_logged_configuration()  # with a dump: once it is loaded (_SyncObj__loadDumpFile)
        except BaseException:
            self.destroy_transport()
            self.close_pipe()
            raise

    def apply_logged_configuration(self) -> None:
        """Apply the membership entries of the journal, in order, to the configuration the node
        starts with (its peers given, or the dump's). Raft uses the latest configuration in its
        log, committed or not; pysyncobj 0.3.17 applies a journal's membership entries only as they
        commit again after a restart, so a node restarted before its first dump took the peers it
        was given (a removed node among them) until then. A change already applied is refused by
        pysyncobj as a no-op, so applying again at the commit changes nothing. Tick thread, or the
        constructor's."""
        journal = self._SyncObj__raftLog
        for index in range(len(journal)):
            request = self._SyncObj__parseChangeClusterRequest(journal[index][0])
            if request is not None:
                self._SyncObj__doChangeCluster(request)

    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:
        SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        if self.conf.dynamicMembershipChange:
            self.apply_logged_configuration()  # the dump's configuration, then the journal's changes

    def _SyncObj__updateClusterConfiguration(self, newNodes: list[Any]) -> None:
        # pysyncobj calls this only from __loadDumpFile, with the configuration the dump holds: the
        # one of the dump's index, older than the entries its sender sends next. A dump installed
        # from a leader that joined after it was written does not name that leader, and pysyncobj
        # dropped the connection to it: a learner (which connects only to the voters it knows)
        # then heard nothing more, stuck at the dump's index (chaos seed 4042: a replacement never
        # caught up). The sender stays a member until the membership entries after the dump,
        # which it sends next, say what the configuration is (adding it again is then a no-op).
        leader = self._SyncObj__raftLeader
        if leader is not None and leader != self._SyncObj__selfNode and leader not in newNodes:
            newNodes = [*newNodes, leader]
        SyncObj._SyncObj__updateClusterConfiguration(self, newNodes)

    @replicated
    def apply_batch(self, batch: bytes) -> list[Any]:
        return self._bridge.apply_batch(batch)

    def _checkCommandsToApply(self) -> None:
        # pysyncobj forwards a queued command to the leader when this node is not the leader; ours
        # must never be forwarded (the node layer forwards over HTTP and knows the outcome), so a
        # command queued just before this node lost leadership fails with NOT_LEADER instead.
        if not self._isLeader():
            self._reject_queued_commands()
            super()._checkCommandsToApply()
            return
        # The leader appends each queued command and sends it to the followers at once; with a
        # durable journal its own sync waits until the end of this call (one for all of them),
        # so that it overlaps the followers' round trip instead of preceding it. Nothing in this
        # call counts the new entries towards a commit: _onTick does, at the start of the next
        # tick, after the sync.
        deferred_flush = getattr(self._SyncObj__raftLog, "deferred_flush", None)
        if deferred_flush is None:  # in-memory journal
            super()._checkCommandsToApply()
            return
        with deferred_flush():
            super()._checkCommandsToApply()

    def _SyncObj__applyLogEntries(self) -> bool:
        # pysyncobj (appendEntriesUseBatch=False) answers "send append_entries now" whenever a tick
        # applied something, so a leader sent every follower a second append per commit, carrying
        # nothing but the new commit index, and each follower answered it: half of the Raft
        # messages of a write, on every node's tick thread. The commit index rides on the next
        # append or heartbeat instead (DESIGN.md, "One append per write").
        SyncObj._SyncObj__applyLogEntries(self)
        return False

    # A leader of a group of one commits without ticking (ReplicatedLog._commit_alone; DESIGN.md,
    # "A single node's writes skip the tick"). Loop thread: such a node has no tick thread.

    def leads_alone(self) -> bool:
        """This node has no peers, leads, and is past its start-up (the dump is loaded, the port
        bound): a command it appends commits once its own journal has it, with no tick."""
        return (
            not self._SyncObj__otherNodes and self._SyncObj__raftState == _LEADER
            and self._SyncObj__transport.ready and not self._SyncObj__needLoadDumpFile
        )

    def append_queued(self) -> None:
        """Append the commands queued by apply_batch (what a tick's _checkCommandsToApply does)."""
        self._checkCommandsToApply()

    def commit_alone(self) -> None:
        """Commit and apply what this node appended (its caller synced the journal): for a leader
        without peers, the majority is itself. pysyncobj's tick commits an entry of an earlier term
        only with a later one of the current term (Raft's rule); so does this: the last entry is
        of the current term (the no-op a leader appends first is), or nothing commits here."""
        last_index = self._SyncObj__getCurrentLogIndex()
        if last_index > self.commit_index() and self._SyncObj__getCurrentLogTerm() == self.current_term():
            self._SyncObj__raftCommitIndex = last_index
            self._SyncObj__raftLog.setRaftCommitIndex(last_index)
        self._SyncObj__leaderCommitIndex = self._SyncObj__raftCommitIndex
        self._SyncObj__applyLogEntries()

    def silence_notifier(self) -> None:
        """A node that ticks on its event loop never waits in pysyncobj's poll, so the wake-up
        pysyncobj sends itself for every command (a pipe write, read back by the next tick) is
        work for nothing."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            notifier.notify = _no_wake_up

    # Pre-vote (_prevote.py). pysyncobj's methods call `self.__connectedToAnyone()` and its transport
    # calls the handler it was given in SyncObj.__init__, `self.__onMessageReceived`; both resolve
    # to the name-mangled attributes below: defining them here puts pre-vote in front of pysyncobj.

    def _SyncObj__connectedToAnyone(self) -> bool:
        # pysyncobj evaluates this last, and only here, when it starts an election: its deadline
        # passed and this node is a follower or candidate. Pre-vote decides at that very moment.
        if self.catch_up is not None:
            return False  # a node catching up never campaigns (_catch_up.py)
        connected = bool(SyncObj._SyncObj__connectedToAnyone(self))
        return connected and (self.pre_vote is None or self.pre_vote.may_elect(self))

    def _SyncObj__onNodeDisconnected(self, node: Any) -> None:
        if self.pre_vote is not None:
            self.pre_vote.on_disconnected(self, node)
        SyncObj._SyncObj__onNodeDisconnected(self, node)

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:
        if isinstance(message, dict) and message.get("type") == KEEPALIVE:
            return  # it was read: that is all it is for (_transport.py)
        catch_up = self.catch_up
        if catch_up is not None and catch_up.on_message(self, message):
            return  # a vote this node must not give while it catches up
        if self.pre_vote is not None and self.pre_vote.on_message(self, node, message):
            return
        if self.read_index is not None and self.read_index.on_message(self, node, message):
            return
        SyncObj._SyncObj__onMessageReceived(self, node, without_snapshot_commit(message, self.commit_index()))

    def commit_index(self) -> int:
        return int(self._SyncObj__raftCommitIndex)

    def applied_index(self) -> int:
        return int(self.raftLastApplied)

    # _prevote.RaftView: what pre-vote reads and changes in pysyncobj (tick thread only).

    def current_term(self) -> int:
        return int(self._SyncObj__raftCurrentTerm)

    def last_log(self) -> tuple[int, int]:
        last = self._SyncObj__raftLog[-1]
        return int(last[1]), int(last[2])

    def peers(self) -> set[Any]:
        return self._SyncObj__otherNodes  # type: ignore[no-any-return]

    def leader(self) -> Any:
        return self._SyncObj__raftLeader

    def node_id(self, node: Any) -> str:
        return str(node.id)

    def self_id(self) -> str:
        return str(self._SyncObj__selfNode.id)

    def advance_election(self, deadline: float) -> None:
        self._SyncObj__raftElectionDeadline = min(self.election_deadline(), deadline)

    def election_deadline(self) -> float:
        """When pysyncobj starts an election if no leader is heard from (its clock; tick thread)."""
        return float(self._SyncObj__raftElectionDeadline)

    def transfer_in_progress(self) -> bool:
        return bool(self._SyncObj__transferInProgress)

    def postpone_election(self, now: float) -> None:
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()

    def allow_election_now(self) -> None:
        self._SyncObj__raftElectionDeadline = 0

    def send(self, node: Any, message: dict[str, Any]) -> None:
        self._SyncObj__transport.send(node, message)

    def _reject_queued_commands(self) -> None:
        commands = self._SyncObj__commandsQueue
        while True:
            try:
                _, callback = commands.get_nowait()
            except queue.Empty:
                return
            self._SyncObj__callErrCallback(FAIL_REASON.NOT_LEADER, callback)

    # pysyncobj internals we read (single ints/objects: safe to read from another thread). Plain
    # methods, not properties: SyncObj.__init__ getattr()s every name in dir(self).

    def raft_state(self) -> int:
        return int(self._SyncObj__raftState)

    def majority_heard_at(self, now: float) -> float:
        """Check-quorum (tick thread): the latest time (pysyncobj's clock) by which a majority,
        this node included, had answered the leader; `now` for a single node. A peer without a
        recorded time counts as heard now (pysyncobj records one for every peer right after it
        becomes leader)."""
        responses = self._SyncObj__lastResponseTime
        peers = self._SyncObj__otherNodes  # the configuration now (it changes in this thread only)
        needed = (len(peers) + 1) // 2  # answers besides this node's own that make a majority
        if needed == 0:
            return now
        return sorted((responses.get(node, now) for node in peers), reverse=True)[needed - 1]

    def transport_counts(self) -> dict[str, int]:
        transport = getattr(self, "_SyncObj__transport", None)
        return transport.counts() if isinstance(transport, BoundedTransport) else {}

    def command_level_floor(self) -> int:
        """The lowest command level of this node and its peers (_transport.py); any thread."""
        transport = getattr(self, "_SyncObj__transport", None)
        return transport.level_floor if isinstance(transport, BoundedTransport) else LEVEL_UNTOLD

    def levels_told(self) -> dict[str, int]:
        """The command level each connected peer told, by its address (_transport.py); any thread."""
        transport = getattr(self, "_SyncObj__transport", None)
        return transport.levels_told if isinstance(transport, BoundedTransport) else {}

    def connected_peers(self) -> int:
        """The peers connected now that told their command level (_transport.py); any thread."""
        transport = getattr(self, "_SyncObj__transport", None)
        return transport.peers_told if isinstance(transport, BoundedTransport) else 0

    def messages(self) -> dict[tuple[str, str], int]:
        """The Raft messages sent and received so far, by (direction, type); empty without peers."""
        transport = getattr(self, "_SyncObj__transport", None)
        return dict(transport.messages) if isinstance(transport, BoundedTransport) else {}

    def frames_sealed(self) -> dict[str, int]:
        """The Raft frames this node sealed so far, by format ("fernet", "aead"); empty without a password."""
        transport = getattr(self, "_SyncObj__transport", None)
        ciphers = transport.frame_ciphers if isinstance(transport, BoundedTransport) else None
        return dict(ciphers.sealed) if ciphers is not None else {}

    def noop_index(self) -> int | None:
        """Index of the no-op entry this node appended when it last became leader."""
        return self._SyncObj__noopIDx  # type: ignore[no-any-return]

    def leader_commit_index(self) -> int | None:
        return self._SyncObj__leaderCommitIndex  # type: ignore[no-any-return]

    def get_journal(self) -> Any:
        return self._SyncObj__raftLog

    def set_journal(self, journal: Any) -> None:
        self._SyncObj__raftLog = journal

    def destroy_transport(self) -> None:
        transport = getattr(self, "_SyncObj__transport", None)
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.destroy()

    def close_pipe(self) -> None:
        """Close the notifier's pipe, which pysyncobj's destroy leaves open."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is None:
            return
        for name in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
            fd = getattr(notifier, name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(notifier, name, None)

    def wake(self) -> None:
        """Wake the tick thread's poll (used by stop)."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            with contextlib.suppress(OSError, TypeError):
                notifier.notify()
