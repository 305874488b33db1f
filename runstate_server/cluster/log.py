"""ReplicatedLog: commands in, results out, every replica applies the same batches in the same order.

Threads, on a cluster: the asyncio event loop (propose, flush, futures, callbacks) and one daemon
tick thread that owns pysyncobj (network, journal, commit, apply, snapshots). They meet at three
points only: pysyncobj's thread-safe command queue (loop -> tick thread),
`loop.call_soon_threadsafe` (tick thread -> loop) and `self.lock` (held while the state machine
changes, taken by readers). A single node has no tick thread: it ticks pysyncobj on its event
loop (`ticks_on_loop`), and syncs its journal there too unless the disk is slow (then in a sync
thread of its own). See DESIGN.md for the why of each choice.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import copy
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from runstate_server.cluster import _dumper, _journal
from runstate_server.cluster._catch_up import MARKER_FILE_NAME, CatchUp
from runstate_server.cluster._prevote import PreVote
from runstate_server.cluster._pysyncobj import FAIL_REASON, raft_clock
from runstate_server.cluster._raft import RaftNode
from runstate_server.cluster._read_index import ReadIndex
from runstate_server.cluster._transport import EPOCH_UNTOLD, LEVEL_UNTOLD
from runstate_server.cluster.codec import BatchFormatError, decode_batch, encode_batch, encode_command
from runstate_server.cluster.config import (
    BATCH_BYTES_MAX,
    BATCH_COMMANDS_MAX,
    COMMAND_BYTES_MAX,
    MAX_BATCHES_IN_FLIGHT,
    PENDING_COMMANDS_MAX,
    PROPOSE_TIMEOUT_S_DEFAULT,
    READS_WAITING_MAX,
    LogConfig,
)
from runstate_server.cluster.errors import ChangeRefused, LogUnavailable, NotLeader
from runstate_server.cluster.membership import Member, member_of, names_by_address, raft_node, with_names
from runstate_server.cluster.peer_tls import PeerTls
from runstate_server.cluster.private_files import make_private, make_private_dir
from runstate_server.cluster.snapshot import (
    Dump,
    DumpFormatError,
    check_dump,
    decode_dump,
    encode_dump,
    fsync_directory,
    fsync_file,
)
from runstate_server.histogram import HistogramView

logger = logging.getLogger(__name__)

JOURNAL_FILE_NAME = "raft.journal"
DUMP_FILE_NAME = "raft.dump"
# A cluster node that found its Raft data damaged keeps the files it discarded under this suffix (the
# last ones only: a later discard replaces them), for the operator to inspect and delete.
DISCARDED_SUFFIX = ".discarded"

# pysyncobj's _RAFT_STATE values.
_ROLES = {0: "follower", 1: "candidate", 2: "leader"}
_LEADER = 2

# stop(): the longest to wait for the tick thread to close the port and the files (a single node:
# for a sync of its journal on its way).
STOP_TIMEOUT_S = 10.0
# A single node's ticks in one turn of its event loop, at most: an entry appended in one tick
# commits in the next, and a command queued meanwhile is appended by the second and committed by a
# third; one more to spare (what is left waits for the next proposal or the tick timer).
LOOP_TICKS_MAX = 4
# How often wait_ready looks at the Raft state (startup only).
_READY_POLL_S = 0.01
# A node that does not lead hands the effects of what it applied to its event loop at most this
# often (and at once with anything else for the loop), not once per entry: its loop only counts
# them into its metrics (DESIGN.md, "A follower hands its applied effects over in bulk").
FOLLOWER_EFFECTS_HANDOFF_S = 0.02
# ... and at the latest once this many applied batches wait to be handed over.
FOLLOWER_EFFECTS_WAITING_MAX = 1_000


class StateMachine(Protocol):
    """The deterministic core (runstate_server.actors)."""

    @property
    def clock_ms(self) -> int: ...  # the last now_ms applied (never goes backwards)

    def apply(self, command: dict[str, Any], now_ms: int, epoch: int) -> tuple[Any, list[Any]]: ...

    # What in `command` only a newer release applies (a type or version unknown here), or None; a
    # state machine without this method applies whatever it is given.
    # def unknown_kind(self, command: Any) -> str | None: ...

    def snapshot(self) -> dict[str, Any]: ...

    def restore(self, snapshot: dict[str, Any]) -> None: ...


def internal_error(message: str) -> dict[str, Any]:
    return {"error": {"code": "INTERNAL", "message": message}}


class _LogHalted(Exception):
    """Raised in the tick thread to stop applying: the log cannot continue safely."""


_UNSETTLED = object()  # an outcome not in yet


@dataclass(eq=False)
class _Waiting:
    """One caller of propose or propose_many: the outcome of each of its commands (a result, or
    the exception its propose raises), and one future, set once every outcome is in or the caller's
    deadline passed. One future and one timer per caller, however many commands it proposes: a
    batch route proposes up to fifty at once, and a future, a timeout and a done callback per
    command cost more loop time than committing them."""

    future: asyncio.Future[list[Any]]
    outcomes: list[Any]
    unsettled: int
    proposals: list[_Proposal]

    def settle(self, index: int, outcome: Any) -> None:
        if self.future.done():  # the caller gave up (deadline, cancel): a late outcome is ignored
            return
        self.outcomes[index] = outcome
        self.unsettled -= 1
        if self.unsettled == 0:
            self.future.set_result(self.outcomes)


@dataclass(eq=False, slots=True)
class _Proposal:
    command: bytes
    waiting: _Waiting
    index: int  # in waiting.outcomes
    in_flight: _InFlightBatch | None = None  # the batch it was submitted in


@dataclass(eq=False)
class _InFlightBatch:
    proposals: list[_Proposal]
    abandoned: int = 0  # proposals whose caller gave up before the batch was called back
    released: bool = False


@dataclass(eq=False)
class _Transfer:
    """A leadership transfer under way (ReplicatedLog.transfer_leadership): set by the loop thread,
    read by the tick thread, which sets `sent` once pysyncobj told the target to campaign."""

    target: str | None  # the voter's Raft address; None: the most caught-up connected voter
    done: asyncio.Future[None]  # resolved on the loop once this node stopped leading
    sent: bool = False


@dataclass
class _Counters:
    commands_proposed: int = 0
    batches_proposed: int = 0
    batches_applied: int = 0
    commands_failed_internal: int = 0
    read_index_fallbacks: int = 0  # times a read index round went unconfirmed and reads fell back to barriers
    commits_alone: int = 0  # times a single node committed its new batches with no tick (_commit_alone)
    leadership_transfers: int = 0  # times this leader told a voter to campaign at once (transfer_leadership)
    loop_handoffs: int = 0  # times the tick thread woke the loop with the calls it gathered (_hand_calls_to_loop)
    local_data_discarded: int = 0  # times this node found its Raft data damaged at start and discarded it


class ReplicatedLog:
    def __init__(
        self,
        state_machine: StateMachine,
        *,
        self_address: str | None,
        peer_addresses: Sequence[str] = (),
        data_dir: Path | None,
        password: str,
        fsync: bool = True,
        on_applied: Callable[[list[Any]], None] | None = None,
        on_role_change: Callable[[], None] | None = None,
        config: LogConfig | None = None,
        command_level: int = LEVEL_UNTOLD,
        members: Sequence[Member] = (),
        epoch: int = EPOCH_UNTOLD,
        peer_tls: PeerTls | None = None,
    ) -> None:
        if not password:
            raise ValueError("a Raft password is required: pysyncobj unpickles whatever reaches its port")
        self.lock = threading.Lock()
        # None: a learner (pysyncobj's read-only node): it dials the voters, receives the log and
        # snapshots, and never votes, campaigns nor counts for a commit (DESIGN.md "Membership").
        self.self_address = self_address
        self.learner = self_address is None
        self.peer_addresses = tuple(address for address in peer_addresses if address != self_address)
        # The node layer's names (node id, API URL) of this node and its first peers, by address:
        # a member the configuration does not name (a release before membership changes wrote
        # it) is named from these (membership.py).
        self._names = {member.address: member for member in members}
        self.data_dir = data_dir
        self.counters = _Counters()
        self._state_machine = state_machine
        self._password = password
        self._fsync = fsync
        self._on_applied = on_applied
        self._on_role_change = on_role_change
        self._config = config or LogConfig()
        self.peer_tls = peer_tls  # mutual TLS on the Raft port (peer_tls.py); None: the password's frames
        # The commands this node's state machine applies (its peers are told: _transport.py).
        self._command_level = command_level
        self.epoch = epoch  # the cluster's (_transport.py): peers of another epoch are refused
        self._loop: asyncio.AbstractEventLoop | None = None
        self._raft: RaftNode | None = None
        self._journal: _journal.DurableJournal | None = None
        self._compaction_forced_at: int | None = None  # journal.compactions when one was last asked for
        self._dump_size_at: tuple[int, int] | None = None  # (journal.compactions, the dump's bytes) then
        self._dumper: _dumper.Dumper | None = None
        self._thread: threading.Thread | None = None
        # One node (no peers): pysyncobj ticks on the event loop, with no tick thread (_tick_on_loop).
        # A cluster's node, whatever its peers now (a cluster of one after a forced recovery may
        # grow): it ticks in its thread and confirms reads by read index. Else a single node.
        self.clustered = bool(self.peer_addresses) or self._config.dynamic_membership
        self.ticks_on_loop = not self.clustered
        self._tick_timer: asyncio.Handle | None = None  # the loop's next tick when nothing comes first
        self._ticking = False  # the loop is inside _tick_on_loop
        self._ticks_ended = False  # _end_ticks ran: pysyncobj is destroyed
        # A sync of the journal in the sync thread, while which the loop does not tick (_sync_journal).
        self._sync_thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._sync_future: asyncio.Future[None] | None = None
        self._stopping = threading.Event()
        self._stopped = False
        self._waits_ended = False  # end_waits ran: every call is refused
        self._halt_reason: str | None = None
        # When pysyncobj last made this node leader, and by when a majority last answered it (its
        # clock; both set in the tick thread, read by is_leader from any thread).
        self._leading_since = float("-inf")
        self._quorum_heard_at = float("-inf")
        # Loop-thread state.
        self._pending: collections.deque[_Proposal] = collections.deque()
        self._flush_scheduled = False
        self._batches_in_flight = 0
        self._in_flight: set[_InFlightBatch] = set()
        self._last_now_ms = 0
        # Reads waiting for their read index round (read_index), by round number: oldest first.
        self._read_index = ReadIndex()
        self._reads_waiting: dict[int, asyncio.Future[None]] = {}
        # A read index round timed out under this leadership and none was confirmed since: reads
        # commit a barrier at once (read_index). Loop thread.
        self.read_index_unconfirmed = False
        # Calls the tick thread gathered for the loop during a tick (_call_on_loop); tick thread only.
        self._tick_thread_id: int | None = None
        self._loop_calls: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        # Of those, whether one is not an applied batch's effects (it goes to the loop at once),
        # and when the gathered calls were last handed over (raft_clock; tick thread only).
        self._loop_calls_urgent = False
        self._loop_calls_handed_at = 0.0
        # Batches of this node queued in pysyncobj and not yet called back (both threads).
        self._uncommitted_lock = threading.Lock()
        self._uncommitted = 0
        # A leadership transfer under way: new batches wait meanwhile (loop thread sets it whole;
        # the tick thread reads it).
        self._transfer: _Transfer | None = None

    def __repr__(self) -> str:
        c = self.counters
        return (
            f"<ReplicatedLog {self.self_address} {self.role} term={self.term} "
            f"applied={self.applied_index} commit={self.commit_index} pending={len(self._pending)} "
            f"in_flight={self._batches_in_flight} commands={c.commands_proposed} batches={c.batches_proposed}>"
        )

    # Lifecycle.

    async def start(self) -> None:
        """Bind the Raft port, open (and restore from) the dump and journal, start ticking."""
        assert self._raft is None, "start() is called once"
        self._loop = asyncio.get_running_loop()
        journal_file = dump_file = None
        if self.data_dir is not None:
            make_private_dir(self.data_dir)
            journal_file = str(self.data_dir / JOURNAL_FILE_NAME)
            dump_file = str(self.data_dir / DUMP_FILE_NAME)
            _journal.remove_leftovers(journal_file)
            _dumper.remove_leftovers(dump_file)
            self._dumper = _dumper.Dumper(dump_file, fsync=self._fsync)
        conf = self._config.syncobj_conf(
            self_address=self.self_address,
            password=self._password,
            journal_file=journal_file,
            dump_file=dump_file,
            serializer=self._write_dump,
            deserializer=self._read_dump,
            serialize_checker=self._check_dump,
            on_state_changed=self._on_state_changed,
        )
        catch_up: CatchUp | None = None
        if journal_file is not None and dump_file is not None:
            catch_up = await asyncio.to_thread(self._check_dump_at_start, journal_file, dump_file)
        raft: RaftNode | None = None
        while raft is None:
            try:
                # Reads (and checks) the whole journal and binds the port: not on the loop.
                pre_vote = PreVote(
                    silence_s=self._config.raft_timeout_s_min,
                    lost_delay_s=self._config.leader_lost_delay_s,
                    lost_stagger_s=self._config.leader_lost_stagger_s,
                ) if self._config.pre_vote and not self.learner else None
                peers = [raft_node(with_names(Member(address), self._names)) for address in self.peer_addresses]
                raft = await asyncio.to_thread(
                    RaftNode, self, self.self_address, peers, conf, pre_vote, self._config.handshake_timeout_s,
                    self._read_index, self._command_level, self.epoch, catch_up, self.peer_tls,
                )
            except _journal.JournalDamaged as damaged:
                if catch_up is not None and catch_up.discarded:
                    raise LogUnavailable(f"the Raft journal is damaged again after a discard: {damaged}") from None
                assert journal_file is not None and dump_file is not None
                catch_up = await asyncio.to_thread(self._discard_or_refuse, str(damaged), journal_file, dump_file)
            except Exception as error:
                raise LogUnavailable(f"cannot start the Raft node on {self.self_address}: {error!r}") from error
        if journal_file is not None:
            self._journal = _journal.DurableJournal(raft.get_journal(), journal_file, fsync=self._fsync)
            self._journal.sync_later = self.ticks_on_loop
            raft.set_journal(self._journal)
        self._raft = raft
        raft.addOnTickCallback(self._hand_calls_to_loop)
        if catch_up is not None:
            raft.addOnTickCallback(self._check_caught_up)
        if self.ticks_on_loop:
            raft.silence_notifier()
            self._tick_timer = self._loop.call_soon(self._tick_on_loop)
            return
        self._thread = threading.Thread(target=self._run_ticks, name=f"raft-{self.self_address}", daemon=True)
        self._thread.start()

    # Damaged data at start (DESIGN.md "Checksums and damaged data"). In a thread: file I/O.

    def _check_dump_at_start(self, journal_file: str, dump_file: str) -> CatchUp | None:
        """Check the dump's checksum (the journal is checked as pysyncobj opens it: JournalDamaged).
        A damaged dump is discarded with the journal (a cluster node) or refuses the start; a node
        that discarded its data before and has not caught up yet goes on catching up."""
        catch_up = None
        marker = os.path.join(os.path.dirname(journal_file), MARKER_FILE_NAME)
        if os.path.exists(marker):
            if not self._may_discard():
                raise LogUnavailable(
                    f"{marker}: this node discarded damaged Raft data and has not caught up from a leader since, "
                    "and it has no peers to catch up from: restore its data dir from a backup"
                )
            logger.warning("this node discarded damaged Raft data and has not caught up yet (%s): it grants no vote "
                           "until it has", marker)
            catch_up = CatchUp(marker, fsync=self._fsync)
        try:
            with open(dump_file, "rb") as file:
                data = file.read()
        except FileNotFoundError:
            return catch_up
        try:
            check_dump(data)
        except DumpFormatError as error:
            return self._discard_or_refuse(
                f"the Raft dump {dump_file} is damaged at byte {error.offset}: {error}", journal_file, dump_file,
            )
        return catch_up

    def _may_discard(self) -> bool:
        """A node with peers (or a learner, which follows voters) can catch up from a leader; a dev
        node or a cluster's only voter has no other copy of its data."""
        return self.learner or bool(self.peer_addresses)

    def _discard_or_refuse(self, damage: str, journal_file: str, dump_file: str) -> CatchUp:
        """`damage` names the file and the byte. A node without peers refuses to start (LogUnavailable,
        one line); a cluster's node keeps what identifies it (the node layer's membership.json, its
        id and secret, the term and vote of its .meta), moves the journal and dump aside
        (DISCARDED_SUFFIX), and starts empty, catching up from the leader by snapshot, voting for
        no one until it has (_catch_up.py)."""
        if not self._may_discard():
            raise LogUnavailable(
                f"{damage}; a node without peers has no other copy of its data: restore the data dir from a backup, "
                'or move the damaged file aside to start empty (README, "Data integrity")'
            )
        directory = os.path.dirname(journal_file) or "."
        marker = os.path.join(directory, MARKER_FILE_NAME)
        CatchUp.mark(marker, fsync=self._fsync)  # first: a crash halfway still catches up without voting
        for path in (journal_file, dump_file):
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, path + DISCARDED_SUFFIX)
        _journal.keep_term_and_vote(journal_file + ".meta", fsync=self._fsync)
        if self._fsync:
            fsync_directory(directory)
        self.counters.local_data_discarded += 1
        logger.error(
            "%s: this node discarded its Raft journal and dump (kept as *%s for inspection) and catches up from "
            "the leader by snapshot; it grants no vote until it has (runstate_local_data_discarded_total)",
            damage, DISCARDED_SUFFIX,
        )
        catch_up = CatchUp(marker, fsync=self._fsync)
        catch_up.discarded = True
        return catch_up

    def _check_caught_up(self) -> None:
        """Tick thread: end the catch-up once this node holds what the leader may count it for."""
        raft = self._raft
        if raft is not None and raft.catch_up is not None and raft.catch_up.caught_up(raft):
            raft.catch_up = None

    @property
    def catching_up(self) -> bool:
        """This node discarded damaged data and has not caught up yet: it grants no vote. Any thread."""
        raft = self._raft
        return raft is not None and raft.catch_up is not None

    def end_waits(self) -> None:
        """Answer every call that waits for the log now, and refuse new ones (LogUnavailable): the
        first step of stop(). A stopping node takes it early, once its calls had a grace to end: a
        write that cannot commit (the other nodes are stopping too) would hold the node's stop for
        its whole timeout. A write already in a batch may still commit: its outcome is unknown."""
        if self._waits_ended:
            return
        self._waits_ended = True
        self._fail_pending(LogUnavailable("the log is stopping"))
        self._fail_reads(LogUnavailable("the log is stopping"))
        self._fail_in_flight(LogUnavailable("the log is stopping; the outcome is unknown"))

    async def stop(self) -> None:
        """Stop ticking, close the port and the files; what waits fails with LogUnavailable."""
        if self._stopped:
            return
        self._stopped = True
        self.end_waits()
        if self._raft is None:
            return
        self._stopping.set()
        if self.ticks_on_loop:
            await self._stop_loop_ticks()
            return
        self._raft.wake()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, STOP_TIMEOUT_S)
            if self._thread.is_alive():
                logger.error("the Raft thread of %s did not stop within %s s", self.self_address, STOP_TIMEOUT_S)

    async def wait_ready(self, timeout_s: float) -> None:
        """Return once a leader is known and this node has applied the log up to the leader's commit
        index (a new leader: up to its own no-op, so everything committed before it is applied)."""
        deadline = time.monotonic() + timeout_s
        while not self._is_ready():
            self._check_running()
            if time.monotonic() >= deadline:
                raise LogUnavailable(f"not ready within {timeout_s} s ({self!r})")
            await asyncio.sleep(_READY_POLL_S)

    def _is_ready(self) -> bool:
        raft = self._raft
        if raft is None or self.leader_address is None or not raft.isReady():
            return False
        applied = raft.raftLastApplied
        if raft.raft_state() == _LEADER:
            noop_index = raft.noop_index()
            return noop_index is not None and applied >= noop_index and applied >= raft.raftCommitIndex
        leader_commit_index = raft.leader_commit_index()
        return leader_commit_index is not None and applied >= leader_commit_index

    # Raft state, read from the loop (stale by at most one tick, or by as long as the tick thread is
    # stuck: hence the check-quorum in is_leader).

    @property
    def is_leader(self) -> bool:
        """pysyncobj says this node leads AND a majority answered it within
        leader_fallback_timeout_s (check-quorum, DESIGN.md): a leader whose tick thread is stuck
        never runs pysyncobj's own check, and its followers may have elected another leader."""
        raft = self._raft
        if raft is None or self._halt_reason is not None or raft.raft_state() != _LEADER:
            return False  # a halted log commits nothing more
        if not self.clustered:
            return True  # a single node is its own majority
        since = raft_clock() - self._config.leader_fallback_timeout_s
        # Stale when the tick thread is stuck, which is the point: then it stops counting.
        return self._leading_since >= since or self._quorum_heard_at >= since

    def reads_locally(self) -> bool:
        """Whether a linearizable read may be answered from this node's applied state with no log
        entry: only on a single voter (no peers, and membership is static: no other node can ever
        lead or commit) that runs, leads, and has applied its own no-op (so every entry committed
        before it led, a restart's journal included). Every write it acknowledged was applied
        before its answer (the callback runs after apply, in the tick thread), so such a read sees
        it. Committed entries not yet applied were not acknowledged: concurrent with the read. On
        a cluster a leader confirms a read index instead (reads_by_index)."""
        raft = self._raft
        if raft is None or self.clustered or self._stopped or self._halt_reason is not None:
            return False
        if raft.raft_state() != _LEADER:
            return False
        noop_index = raft.noop_index()
        return noop_index is not None and raft.raftLastApplied >= noop_index

    def reads_by_index(self) -> bool:
        """Whether a linearizable read on this cluster node may wait for `read_index` instead of
        committing a barrier: it runs, leads (check-quorum included) and has applied its own no-op."""
        raft = self._raft
        if raft is None or not self.clustered or self._stopped or self._halt_reason is not None:
            return False
        if not self.is_leader:
            return False
        noop_index = raft.noop_index()
        return noop_index is not None and raft.raftLastApplied >= noop_index

    async def read_index(self, timeout_s: float) -> None:
        """Return once a linearizable read that began before this call may look at the applied
        state (Raft read index, _read_index.py): after the call began, a majority confirmed that
        this node led in its term, and this node applied its commit index of that moment (which
        holds every write acknowledged before the call). No log entry. Many calls share a round.

        Raises NotLeader when this node stops leading meanwhile, LogUnavailable when no majority
        confirmed within `timeout_s` (a leader cut off from its peers, or peers that do not know the
        read index: the caller may fall back to a barrier entry).

        Once a round went unconfirmed under this leadership, LogUnavailable comes at once, until a
        round is confirmed again (`read_index_unconfirmed`): peers of an older version, which never
        acknowledge a round, would otherwise cost every read the whole timeout before its barrier
        (a rolling upgrade whose first upgraded node leads). Each such call asks for a round that
        no read waits on, so the first one its peers confirm (upgraded, or reachable again) ends it."""
        self._check_running()
        if not self.is_leader:
            raise NotLeader(self.leader_address)
        assert self._loop is not None and self._raft is not None
        if self.read_index_unconfirmed:
            _, wake = self._read_index.request()
            if wake:
                self._raft.wake()
            raise LogUnavailable("a read index round went unconfirmed; reads commit a barrier until one is confirmed")
        if len(self._reads_waiting) >= READS_WAITING_MAX:
            raise LogUnavailable(f"{READS_WAITING_MAX} reads already wait for their read index")
        seq, wake = self._read_index.request()
        future: asyncio.Future[None] = self._loop.create_future()
        self._reads_waiting[seq] = future
        if wake:
            self._raft.wake()
        # One timer on the future itself, not wait_for's second future and done callback: the
        # results and status routes of a cluster's leader wait here on every call.
        deadline = self._loop.call_later(timeout_s, self._time_out_read, future, timeout_s)
        try:
            await future
        finally:
            deadline.cancel()
            self._reads_waiting.pop(seq, None)

    def _time_out_read(self, future: asyncio.Future[None], timeout_s: float) -> None:
        if future.done():
            return
        future.set_exception(LogUnavailable(f"no majority confirmed the read index within {timeout_s} s"))
        if self.is_leader and not self.read_index_unconfirmed:
            self.read_index_unconfirmed = True
            self.counters.read_index_fallbacks += 1
            logger.warning(
                "no majority confirmed a read index round within %s s (peers of an older version, or "
                "cut off): reads commit a barrier entry until a round is confirmed", timeout_s,
            )

    def _on_read_confirmed(self, seq: int) -> None:
        """Loop thread: round `seq` is confirmed and applied; so is every read numbered up to it."""
        if self.read_index_unconfirmed:
            self.read_index_unconfirmed = False
            logger.info("a read index round was confirmed: reads use the read index again")
        waiting = self._reads_waiting
        while waiting:
            first = next(iter(waiting))
            if first > seq:
                return
            future = waiting.pop(first)
            if not future.done():
                future.set_result(None)

    def _fail_reads(self, error: Exception) -> None:
        futures = list(self._reads_waiting.values())
        self._reads_waiting.clear()
        for future in futures:
            if not future.done():
                future.set_exception(copy.copy(error))

    @property
    def leader_address(self) -> str | None:
        raft = self._raft
        if raft is None or self._halt_reason is not None or (raft.raft_state() == _LEADER and not self.is_leader):
            return None  # a leader without a quorum knows no leader; a halted log, none at all
        leader = raft._getLeader()
        return None if leader is None else str(leader.address)

    @property
    def role(self) -> str:
        raft = self._raft
        if raft is None:
            return "follower"
        state = raft.raft_state()
        # A leader without a quorum: what pysyncobj makes it at its next check.
        return "follower" if state == _LEADER and not self.is_leader else _ROLES[state]

    @property
    def term(self) -> int:
        return int(self._raft.raftCurrentTerm) if self._raft is not None else 0

    @property
    def applied_index(self) -> int:
        return int(self._raft.raftLastApplied) if self._raft is not None else 0

    @property
    def commit_index(self) -> int:
        return int(self._raft.raftCommitIndex) if self._raft is not None else 0

    def command_level(self, proven: int = LEVEL_UNTOLD) -> int:
        """The highest command level this node may propose: the lowest of its own and its peers'
        (a peer not connected, or of a release that tells none, counts as level 1), or `proven`,
        the level the applied log already proves every node applies (capped at this node's own),
        whichever is higher. Any thread.

        A peer that is paused or cut off for a moment drops the floor to 1; without `proven` the
        leader would then propose a request in another form than the one it had (or will have) the
        moment before or after, and a retry in the other form would not find the first one's
        idempotency record (issue 47, DESIGN.md "Command levels")."""
        raft = self._raft
        floor = raft.command_level_floor() if raft is not None else LEVEL_UNTOLD
        return max(floor, min(self._command_level, proven))

    @property
    def dynamic_membership(self) -> bool:
        """The configuration may change (a cluster node's log); else it is the peers given, for good."""
        return self._config.dynamic_membership

    def voters(self) -> list[Member]:
        """The voters of the configuration this node applies now, itself first when it is one,
        named (membership.py). Any thread: pysyncobj's set is copied whole."""
        raft = self._raft
        others = raft.otherNodes if raft is not None else [Member(address) for address in self.peer_addresses]
        own = [] if self.self_address is None else [Member(self.self_address)]
        return [with_names(member, self._names) for member in [*own, *sorted(map(member_of, others), key=_address)]]

    def reachable(self, address: str) -> bool:
        """This node's Raft connection to the member at `address` is up (itself: True). Any thread."""
        raft = self._raft
        if address == self.self_address:
            return True
        return raft is not None and bool(raft.isNodeConnected(raft_node(Member(address))))

    def levels_told(self) -> dict[str, int]:
        """The command level each peer connected now told, by its Raft address. Any thread."""
        raft = self._raft
        return raft.levels_told() if raft is not None else {}

    def connected_peers(self) -> int:
        """The peers this node is connected to now that told their command level. Any thread."""
        raft = self._raft
        return raft.connected_peers() if raft is not None else 0

    def raft_messages(self) -> dict[tuple[str, str], int]:
        """Raft messages sent and received so far, by (direction, type); empty on a single node."""
        raft = self._raft
        return raft.messages() if raft is not None and self.clustered else {}

    def raft_transport_counts(self) -> dict[str, int]:
        """The Raft port's connection counts (_transport.py `counts`); empty on a single node. Any thread."""
        raft = self._raft
        return raft.transport_counts() if raft is not None and self.clustered else {}

    def raft_frames_sealed(self) -> dict[str, int]:
        """Raft frames sealed so far, by format ("fernet", "aead"); empty on a single node."""
        raft = self._raft
        return raft.frames_sealed() if raft is not None and self.clustered else {}

    @property
    def fsync_seconds(self) -> HistogramView | None:
        """The journal's fsync times so far; None without a data dir (nothing is written)."""
        return self._journal.fsync_seconds.view() if self._journal is not None else None

    # Handing leadership over (loop thread).

    async def transfer_leadership(self, to_address: str | None, timeout_s: float) -> None:
        """Hand this leader's leadership to the voter at `to_address` (None: the most caught-up
        connected one), as Raft's TimeoutNow (pysyncobj's `transferLeadership`). Commands proposed
        meanwhile wait in the pending queue (no new batch goes out); once every batch of this leader
        committed and the target holds every entry, the target is told to campaign at once, which
        skips pre-vote; its higher term makes this node step down. Nothing acknowledged or in flight
        is lost: the target has every entry, and the waiting commands are answered NotLeader when
        this node stops leading (never appended: safe to send again to the new leader).

        Returns once this node stopped leading. NotLeader when it did not lead at the call;
        LogUnavailable when another transfer is under way or no handover came within `timeout_s`
        (the target unreachable or behind): then this node leads on and the waiting commands go
        out. ValueError when there is no other voter."""
        self._check_running()
        if not self.is_leader:
            raise NotLeader(self.leader_address)
        if len(self.voters()) < 2:
            raise ValueError("a cluster of one voter has no other voter to hand leadership to")
        if to_address is not None and to_address not in {member.address for member in self.voters()}:
            raise ValueError(f"{to_address} is not a voter of this cluster")
        if self._transfer is not None:
            raise LogUnavailable("a leadership transfer is already under way")
        assert self._loop is not None and self._raft is not None
        transfer = _Transfer(to_address, self._loop.create_future())
        self._transfer = transfer
        self._raft.wake()
        try:
            await asyncio.wait_for(asyncio.shield(transfer.done), timeout_s)
        except asyncio.TimeoutError:
            raise LogUnavailable(
                f"no handover within {timeout_s} s (the target is unreachable or behind); this node leads on"
            ) from None
        finally:
            if self._transfer is transfer:
                self._transfer = None
            self._schedule_flush()  # still leading: what waited goes out; else it is refused

    # Changing the configuration (loop thread).

    async def change_membership(self, change: str, member: Member, timeout_s: float) -> None:
        """Commit one change of the configuration: "add" `member` as a voter, or "remove" it, with
        pysyncobj's membership entry (DESIGN.md "Membership"), which takes effect on each node when
        appended. Returns once it committed.

        NotLeader when this node does not lead; ChangeRefused when pysyncobj refused it (another
        change not yet committed, this leader's first entry not yet applied, the member already
        in or not in the configuration); LogUnavailable when it did not commit within `timeout_s`
        (then its outcome is unknown)."""
        self._check_running()
        if change not in ("add", "remove"):
            raise ValueError(f"unknown membership change {change!r}")
        if not self.is_leader:
            raise NotLeader(self.leader_address)
        raft = self._raft
        assert self._loop is not None and raft is not None
        done: asyncio.Future[int] = self._loop.create_future()

        def committed(_: Any, reason: int) -> None:  # tick thread
            self._call_on_loop(_settle_change, done, reason)

        node = raft_node(member)
        if change == "add":
            raft.addNodeToCluster(node, callback=committed)
        else:
            raft.removeNodeFromCluster(node, callback=committed)
        try:
            reason = await asyncio.wait_for(asyncio.shield(done), timeout_s)
        except asyncio.TimeoutError:
            raise LogUnavailable(f"the membership change did not commit within {timeout_s} s; its outcome is unknown") from None
        if reason == FAIL_REASON.REQUEST_DENIED:
            raise ChangeRefused("another membership change is not yet committed (or the member is already in the "
                                "configuration, or not in it)")
        if reason != FAIL_REASON.SUCCESS:
            raise self._error_for(reason)

    # Proposing (loop thread).

    async def propose(self, command: dict[str, Any], timeout_s: float = PROPOSE_TIMEOUT_S_DEFAULT) -> Any:
        """Replicate `command` and return its result from the state machine.

        Raises NotLeader at once on a follower; LogUnavailable when the queue is full, there is no
        leader, or no commit within `timeout_s` (then the outcome is unknown); TypeError/ValueError
        when the command is not msgpack-able or larger than COMMAND_BYTES_MAX.
        """
        self._check_running()
        if not self.is_leader:
            raise NotLeader(self.leader_address)
        encoded = encode_command(command)
        if len(encoded) > COMMAND_BYTES_MAX:
            raise ValueError(f"command of {len(encoded)} bytes exceeds {COMMAND_BYTES_MAX}")
        if len(self._pending) >= PENDING_COMMANDS_MAX:
            raise LogUnavailable(f"{PENDING_COMMANDS_MAX} commands already wait for a batch")
        outcome = (await self._wait(self._waiting([encoded]), timeout_s))[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    async def propose_many(
        self, commands: Sequence[dict[str, Any]], timeout_s: float = PROPOSE_TIMEOUT_S_DEFAULT
    ) -> list[Any]:
        """Replicate each command as `propose` would, together, and return, in order, each one's
        result or the exception its own `propose` would have raised (a state machine's results
        are never exceptions). The commands are queued in order, so they go into the same batch
        while it has room; `timeout_s` bounds the whole call. Raises NotLeader or LogUnavailable
        (not running) as `propose` does, for all of them."""
        self._check_running()
        if not self.is_leader:
            raise NotLeader(self.leader_address)
        queued: list[bytes | BaseException] = []
        waiting_for = 0
        for command in commands:
            try:
                encoded = encode_command(command)
                if len(encoded) > COMMAND_BYTES_MAX:
                    raise ValueError(f"command of {len(encoded)} bytes exceeds {COMMAND_BYTES_MAX}")
            except (TypeError, ValueError) as error:
                queued.append(error)
                continue
            if len(self._pending) + waiting_for >= PENDING_COMMANDS_MAX:
                queued.append(LogUnavailable(f"{PENDING_COMMANDS_MAX} commands already wait for a batch"))
                continue
            queued.append(encoded)
            waiting_for += 1
        if waiting_for == 0:
            return queued
        return await self._wait(self._waiting(queued), timeout_s)

    def _waiting(self, queued: list[bytes | BaseException]) -> _Waiting:
        """Queue the encoded commands (an exception: that command's outcome already) for one caller."""
        assert self._loop is not None
        outcomes = [_UNSETTLED if isinstance(item, bytes) else item for item in queued]
        waiting = _Waiting(self._loop.create_future(), outcomes, 0, [])
        for index, item in enumerate(queued):
            if isinstance(item, bytes):
                proposal = _Proposal(item, waiting, index)
                waiting.proposals.append(proposal)
                self._pending.append(proposal)
        waiting.unsettled = len(waiting.proposals)
        assert len(self._pending) <= PENDING_COMMANDS_MAX
        self.counters.commands_proposed += waiting.unsettled
        self._schedule_flush()
        return waiting

    async def _wait(self, waiting: _Waiting, timeout_s: float) -> list[Any]:
        assert self._loop is not None
        deadline = self._loop.call_later(timeout_s, self._time_out, waiting, timeout_s)
        try:
            return await waiting.future
        finally:
            deadline.cancel()
            if waiting.unsettled:  # timed out or cancelled
                self._abandon(waiting)

    @staticmethod
    def _time_out(waiting: _Waiting, timeout_s: float) -> None:
        if waiting.future.done():
            return
        for proposal in waiting.proposals:
            if waiting.outcomes[proposal.index] is _UNSETTLED:
                waiting.outcomes[proposal.index] = LogUnavailable(
                    f"not committed within {timeout_s} s; the outcome is unknown"
                )
        waiting.future.set_result(waiting.outcomes)

    def _schedule_flush(self) -> None:
        if self._transfer is not None and self.is_leader:
            return  # held until the transfer ends (transfer_leadership)
        if not self._flush_scheduled and self._pending and self._batches_in_flight < MAX_BATCHES_IN_FLIGHT:
            assert self._loop is not None
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Turn the pending commands into batches while a slot is free (once per loop turn); a
        single node then ticks at once (no tick thread to wake)."""
        self._flush_scheduled = False
        submitted = False
        while self._pending and self._batches_in_flight < MAX_BATCHES_IN_FLIGHT:
            if self._transfer is not None and self.is_leader:
                break  # held until the transfer ends (transfer_leadership)
            proposals = self._take_batch()
            if not proposals:
                break
            if not self.is_leader or self._halt_reason is not None or self._stopped:
                error: Exception = NotLeader(self.leader_address)
                if self._halt_reason is not None or self._stopped:
                    error = LogUnavailable(self._halt_reason or "the log is stopping")
                _fail(proposals, error)
                self._fail_pending(error)
                break
            self._submit(proposals)
            submitted = True
        if submitted and self.ticks_on_loop:
            self._commit_alone()

    def _take_batch(self) -> list[_Proposal]:
        proposals: list[_Proposal] = []
        batch_bytes = 0
        while self._pending and len(proposals) < BATCH_COMMANDS_MAX:
            proposal = self._pending[0]
            if proposal.waiting.future.done():  # timed out or cancelled before it was sent: never proposed
                self._pending.popleft()
                continue
            if proposals and batch_bytes + len(proposal.command) > BATCH_BYTES_MAX:
                break
            self._pending.popleft()
            proposals.append(proposal)
            batch_bytes += len(proposal.command)
        return proposals

    def _submit(self, proposals: list[_Proposal]) -> None:
        raft = self._raft
        assert raft is not None
        # The leader stamps time once per batch; it never goes backwards, across leaders too
        # (clock_ms is replicated state).
        now_ms = max(int(time.time() * 1000), self._state_machine.clock_ms, self._last_now_ms)
        assert now_ms >= self._last_now_ms
        self._last_now_ms = now_ms
        batch = encode_batch(now_ms, raft.raftCurrentTerm, [proposal.command for proposal in proposals])
        in_flight = _InFlightBatch(proposals)
        self._batches_in_flight += 1
        self._in_flight.add(in_flight)
        assert self._batches_in_flight <= MAX_BATCHES_IN_FLIGHT
        self.counters.batches_proposed += 1
        for proposal in proposals:
            proposal.in_flight = in_flight
        with self._uncommitted_lock:
            self._uncommitted += 1
        raft.apply_batch(batch, callback=functools.partial(self._on_batch_done_in_tick_thread, in_flight))

    def _on_batch_done_in_tick_thread(self, in_flight: _InFlightBatch, results: Any, reason: int) -> None:
        with self._uncommitted_lock:
            self._uncommitted -= 1
        self._call_on_loop(self._on_batch_done, in_flight, results, reason)
        # Its callers wait: hand over now (with the apply's effects, gathered just before), not
        # after the rest of the tick (the leader's appends to its followers come next).
        self._hand_calls_to_loop()

    def _on_batch_done(self, in_flight: _InFlightBatch, results: Any, reason: int) -> None:
        if reason == FAIL_REASON.SUCCESS:
            assert isinstance(results, list) and len(results) == len(in_flight.proposals)
            for proposal, result in zip(in_flight.proposals, results, strict=True):
                proposal.waiting.settle(proposal.index, result)  # ignored if its caller gave up
        else:
            _fail(in_flight.proposals, self._error_for(reason))
        self._release(in_flight)

    def _abandon(self, waiting: _Waiting) -> None:
        # Once every command of a batch has its answer or its caller gave up waiting, its slot is
        # free even if pysyncobj never calls back (an entry stranded by a lost leadership).
        for proposal in waiting.proposals:
            in_flight = proposal.in_flight
            if in_flight is not None and not in_flight.released:
                in_flight.abandoned += 1
                if in_flight.abandoned == len(in_flight.proposals):
                    self._release(in_flight)

    def _release(self, in_flight: _InFlightBatch) -> None:
        if in_flight.released:
            return
        in_flight.released = True
        self._in_flight.discard(in_flight)
        self._batches_in_flight -= 1
        assert self._batches_in_flight >= 0
        self._schedule_flush()

    def _error_for(self, reason: int) -> Exception:
        if reason in (FAIL_REASON.NOT_LEADER, FAIL_REASON.LEADER_CHANGED, FAIL_REASON.DISCARDED):
            # Never appended, or overwritten by a new leader: not applied, safe to forward.
            return NotLeader(self.leader_address)
        if reason == FAIL_REASON.QUEUE_FULL:
            return LogUnavailable("the Raft queue is full")
        if reason == FAIL_REASON.MISSING_LEADER:
            return LogUnavailable("no Raft leader")
        return LogUnavailable(f"Raft failure {reason}; the outcome is unknown")

    def _fail_pending(self, error: Exception) -> None:
        proposals = list(self._pending)
        self._pending.clear()
        _fail(proposals, error)

    def _check_running(self) -> None:
        if self._raft is None:
            raise LogUnavailable("the log is not started")
        if self._stopped or self._waits_ended:
            raise LogUnavailable("the log is stopping")
        if self._halt_reason is not None:
            raise LogUnavailable(f"the log halted: {self._halt_reason}")

    def _fail_in_flight(self, error: LogUnavailable) -> None:
        """Answer the callers of every batch proposed and not yet called back with `error` (its
        entry may still commit: the outcome is unknown), and free their slots."""
        for in_flight in list(self._in_flight):
            _fail(in_flight.proposals, error)
            self._release(in_flight)

    def _on_role_changed(self) -> None:
        self.read_index_unconfirmed = False  # a new leadership tries the read index afresh
        if not self.is_leader:
            transfer = self._transfer
            if transfer is not None and not transfer.done.done():
                transfer.done.set_result(None)
            self._fail_pending(NotLeader(self.leader_address))
            self._fail_reads(NotLeader(self.leader_address))
            # pysyncobj answers them only once this node applies their index again (committed by a
            # new leader, or another entry there): in a partition, not before it heals. Their
            # callers would wait out their whole timeout (10 s) before retrying elsewhere.
            self._fail_in_flight(LogUnavailable("this node stopped leading; the outcome is unknown"))
        if self._on_role_change is not None:
            self._on_role_change()

    # The tick thread.

    def compaction_bytes(self) -> int:
        """The journal's bytes of commands at which _compact_if_large asks for a compaction:
        log_compaction_bytes_min, or log_compaction_dump_fraction of the last dump if that is more
        (the dump's size is read once per compaction)."""
        journal = self._journal
        compactions = journal.compactions if journal is not None else 0
        if self._dump_size_at is None or self._dump_size_at[0] != compactions:
            try:
                size = os.path.getsize(self.data_dir / DUMP_FILE_NAME) if self.data_dir is not None else 0
            except OSError:  # none yet
                size = 0
            self._dump_size_at = (compactions, size)
        dump_bound = int(self._dump_size_at[1] * self._config.log_compaction_dump_fraction)
        return max(self._config.log_compaction_bytes_min, dump_bound)

    def _compact_if_large(self) -> None:
        """Once the journal holds compaction_bytes() of commands, ask pysyncobj for a compaction
        (it starts one at its next chance); once per compaction, not on every tick while one runs,
        which would start another right after it."""
        journal, raft = self._journal, self._raft
        if journal is None or raft is None or journal.command_bytes < self._config.log_compaction_bytes_min:
            return
        if journal.command_bytes < self.compaction_bytes():
            return
        if self._compaction_forced_at == journal.compactions:
            return  # asked already; wait for that compaction to finish
        self._compaction_forced_at = journal.compactions
        raft.forceLogCompaction()

    def _tick(self, raft: RaftNode, timeout_s: float) -> None:
        """One pysyncobj tick (its poll waits up to `timeout_s`) and what follows it, in the tick
        thread or, on a single node, on the loop."""
        self._compact_if_large()
        try:
            raft.doTick(timeout_s)
        finally:
            journal = self._journal
            if journal is not None and journal.sync_error is not None and self._halt_reason is None:
                # Before a next tick could count the unsynced entries towards a commit.
                self._halt(f"cannot sync the Raft journal: {journal.sync_error!r}")
        if raft.raft_state() == _LEADER:
            self._quorum_heard_at = raft.majority_heard_at(raft_clock())
            transfer = self._transfer
            if transfer is not None and not transfer.sent and self._uncommitted == 0:
                self._send_timeout_now(raft, transfer)
        if self.clustered:
            confirmed = self._read_index.on_tick(raft)
            if confirmed is not None:
                self._call_on_loop(self._on_read_confirmed, confirmed)
        self._hand_calls_to_loop()

    def _send_timeout_now(self, raft: RaftNode, transfer: _Transfer) -> None:
        """Tick thread, a leader with no batch of its own uncommitted: tell the transfer's target to
        campaign, unless pysyncobj refuses (the target not connected, or without every entry yet:
        it is sent the rest meanwhile, and the next tick asks again)."""

        def told(_: Any, reason: int) -> None:
            if reason == FAIL_REASON.SUCCESS:
                transfer.sent = True
                self.counters.leadership_transfers += 1
                logger.info("Raft %s: told %s to campaign (leadership transfer)", self.self_address,
                            transfer.target or "the most caught-up voter")

        raft.transferLeadership(transfer.target, told)

    def _ours_uncommitted(self, raft: RaftNode) -> bool:
        """A batch of this leader waits for its commit. On one node an entry appended in tick T
        commits at the start of tick T+1 and nothing wakes the poll in between: tick again at once."""
        return self._uncommitted > 0 and raft.raft_state() == _LEADER

    def _run_ticks(self) -> None:
        """The tick thread (a cluster node)."""
        raft = self._raft
        assert raft is not None
        self._tick_thread_id = threading.get_ident()
        try:
            while not self._stopping.is_set() and self._halt_reason is None:
                try:
                    self._tick(raft, self._poll_s(raft))
                except _LogHalted:
                    break
                except Exception:
                    if self._halt_reason is not None:
                        break
                    logger.exception("Raft tick failed on %s", self.self_address)
                    time.sleep(self._config.tick_period_s)
        finally:
            self._end_ticks()

    def _tick_on_loop(self) -> None:
        """A single node's ticks, on its event loop: tick until no batch of ours waits for its commit
        (at most LOOP_TICKS_MAX), or until a sync of the journal goes to the sync thread; then again
        when a batch is proposed (_flush), when that sync is done, or after `_poll_s` (timers,
        elections, the Raft port's connections, a compaction's progress)."""
        raft = self._raft
        if raft is None or self._ticking or self._ticks_ended or self._sync_future is not None:
            return
        if self._tick_timer is not None:
            self._tick_timer.cancel()
            self._tick_timer = None
        with self._on_the_loop("Raft tick"):
            for _ in range(LOOP_TICKS_MAX):
                if self._stopping.is_set() or self._halt_reason is not None:
                    break
                self._tick(raft, 0.0)
                journal = self._journal
                if journal is not None and journal.sync_due and not self._sync_journal(journal):
                    return  # _on_synced ticks on
                if not self._ours_uncommitted(raft):
                    break
        if self._halt_reason is not None:
            self._end_ticks()
        elif not self._stopping.is_set():
            assert self._loop is not None
            self._tick_timer = self._loop.call_later(self._poll_s(raft), self._tick_on_loop)

    def _commit_alone(self) -> None:
        """A single node that leads, right after its batches were proposed: append them, sync the
        journal, commit and apply them, without a whole tick (or two: one appends, the next
        commits). A tick also serves the Raft port, elections, compaction and the transport's
        timers, ~35 µs each; the periodic ticks (`_poll_s`) still do. Anything else (not leading
        yet, a tick or a sync under way, a slow disk whose sync goes to the sync thread) takes
        the ticks' way."""
        raft = self._raft
        if raft is None or self._ticking or self._ticks_ended or self._sync_future is not None or not raft.leads_alone():
            self._tick_on_loop()
            return
        with self._on_the_loop("a commit"):
            raft.append_queued()
            journal = self._journal
            if journal is not None and journal.sync_due and not self._sync_journal(journal):
                return  # the sync thread has it; the tick after it (_on_synced) commits
            if self._halt_reason is None and not self._stopping.is_set():
                raft.commit_alone()
                self.counters.commits_alone += 1
        if self._halt_reason is not None:
            self._end_ticks()

    @contextlib.contextmanager
    def _on_the_loop(self, what: str) -> Iterator[None]:
        """A single node's work on pysyncobj from its loop: what it hands to the loop is gathered
        meanwhile and handed over after it (`_call_on_loop`); a halt ends it quietly, anything
        else is logged (the next tick or commit tries again)."""
        self._ticking = True
        try:
            yield
        except _LogHalted:
            pass
        except Exception:
            logger.exception("%s failed on %s", what, self.self_address)
        finally:
            self._ticking = False
            self._hand_calls_to_loop()

    def _sync_journal(self, journal: _journal.DurableJournal) -> bool:
        """A single node: sync what its last tick appended, before any tick counts it towards a
        commit. On the loop while the last sync took at most loop_sync_s_max (True: done), else in
        the sync thread while the loop serves on (False: no tick until it is done, _on_synced)."""
        if journal.last_sync_s <= self._config.loop_sync_s_max:
            self._sync_or_halt(journal)
            return True
        assert self._loop is not None
        if self._sync_thread is None:
            self._sync_thread = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix=f"journal-sync-{self.self_address}"
            )
        self._sync_future = self._loop.run_in_executor(self._sync_thread, self._sync_or_halt, journal)
        self._sync_future.add_done_callback(self._on_synced)
        return False

    def _sync_or_halt(self, journal: _journal.DurableJournal) -> None:
        """Sync the journal; a failed sync halts the log (DESIGN.md, "Durability")."""
        try:
            journal.sync()
        except Exception as error:
            self._halt(f"cannot sync the Raft journal: {error!r}")

    def _on_synced(self, _: asyncio.Future[None]) -> None:
        self._sync_future = None
        if self._stopping.is_set():
            return  # stop() ends the ticks
        self._tick_on_loop()

    async def _stop_loop_ticks(self) -> None:
        """stop() of a single node: let a sync on its way finish (it writes the journal's file),
        then close pysyncobj on the loop."""
        if self._tick_timer is not None:
            self._tick_timer.cancel()
            self._tick_timer = None
        if self._sync_future is not None:
            done, _ = await asyncio.wait([self._sync_future], timeout=STOP_TIMEOUT_S)
            if not done:
                logger.error("a sync of the Raft journal of %s did not end within %s s", self.self_address, STOP_TIMEOUT_S)
                return  # its file is still in use: leave pysyncobj open
        self._end_ticks()
        if self._sync_thread is not None:
            self._sync_thread.shutdown(wait=False)

    def _end_ticks(self) -> None:
        """No tick comes after this: close pysyncobj (the Raft port, the journal) and, if the log
        halted, answer what waits for a batch or its commit."""
        if self._ticks_ended:
            return
        self._ticks_ended = True
        raft = self._raft
        assert raft is not None
        if self._dumper is not None:
            self._dumper.abort()
        try:
            raft.destroy()  # transport, then journal (msync + close)
        except Exception:
            logger.exception("closing the Raft node %s failed", self.self_address)
        raft.close_pipe()
        if self._halt_reason is not None:
            self._call_on_loop(self._fail_pending, LogUnavailable(f"the log halted: {self._halt_reason}"))
            self._call_on_loop(
                self._fail_in_flight, LogUnavailable(f"the log halted: {self._halt_reason}; the outcome is unknown")
            )
        self._hand_calls_to_loop(all_now=True)

    def _poll_s(self, raft: RaftNode) -> float:
        """How long the tick may wait for socket events: tick_period_s, but a follower or candidate
        wakes at its election deadline (pysyncobj checks it once per tick), not up to a period late."""
        period = self._config.tick_period_s
        if raft.raft_state() == _LEADER:
            return period
        now = raft_clock()
        if self._loop_calls:  # effects kept back: hand them over in time (_effects_may_wait)
            period = min(period, max(0.0, self._loop_calls_handed_at + FOLLOWER_EFFECTS_HANDOFF_S - now))
        due_in = raft.election_deadline() - now
        # Passed: this tick's _onTick (before its poll) elects or holds it (pre-vote, no peer
        # connected) and moves it, or leaves it behind: never spin on it.
        return period if due_in <= 0 else min(period, due_in)

    def apply_batch(self, data: bytes) -> list[Any]:
        """The @replicated method's body, in the tick thread, on every replica."""
        if self._halt_reason is not None:
            raise _LogHalted(self._halt_reason)
        try:
            batch = decode_batch(data)
        except BatchFormatError as error:
            # Skipping the entry would diverge from replicas that can read it: stop instead.
            self._halt(f"cannot decode a committed batch: {error}")
            raise _LogHalted(str(error)) from error
        unknown_kind: Callable[[Any], str | None] | None = getattr(self._state_machine, "unknown_kind", None)
        if unknown_kind is not None:
            for command in batch.commands:
                unknown = unknown_kind(command)
                if unknown is not None:
                    # A newer release wrote it (a downgraded node: DESIGN.md, "Command levels").
                    # Refusing it while the others apply it would diverge: stop before the batch.
                    reason = f"a committed command has a {unknown} this release does not know: run the newer release"
                    self._halt(reason)
                    raise _LogHalted(reason)
        results: list[Any] = []
        effects: list[Any] = []
        with self.lock:
            for command in batch.commands:
                try:
                    result, command_effects = self._state_machine.apply(command, batch.now_ms, batch.epoch)
                except Exception as error:
                    # A bug in the core. pysyncobj would retry the entry forever if we raised: answer
                    # INTERNAL for this command and go on with the next.
                    logger.exception(
                        "apply failed for command %r",
                        command.get("type") if isinstance(command, dict) else command,
                    )
                    self.counters.commands_failed_internal += 1
                    result, command_effects = internal_error(f"{type(error).__name__}: {error}"), []
                results.append(result)
                effects.extend(command_effects)
        self.counters.batches_applied += 1
        if self._on_applied is not None:
            self._call_on_loop(self._on_applied, effects)
        return results

    def _on_state_changed(self, old_state: int, new_state: int) -> None:
        # At INFO, so a run at --log-level INFO shows every election (the pre-vote logs its rounds).
        raft = self._raft
        logger.info("Raft %s: %s -> %s (from term %s)", self.self_address, _ROLES.get(old_state), _ROLES.get(new_state),
                    raft.current_term() if raft is not None else "?")
        if new_state == _LEADER:
            # Before pysyncobj records its peers' answer times (is_leader must not read the old ones).
            self._leading_since = raft_clock()
        if (old_state == _LEADER) != (new_state == _LEADER):
            self._call_on_loop(self._on_role_changed)

    def _call_on_loop(self, callback: Callable[..., Any], *args: Any) -> None:
        """Run `callback(*args)` on the loop. From the tick thread the calls are gathered and
        handed over together (`_hand_calls_to_loop`): one wake-up of the loop per answered batch
        or tick, not one per call (a commit's apply and its answer were two, each a self-pipe
        write and a round of the two threads handing the interpreter lock back and forth). A
        single node's tick on the loop gathers them too: they run after it, never inside it."""
        if self._ticking or threading.get_ident() == self._tick_thread_id:
            self._loop_calls.append((callback, args))
            if callback != self._on_applied:
                self._loop_calls_urgent = True
            return
        loop = self._loop
        if loop is None:
            return
        try:
            if self.ticks_on_loop:
                loop.call_soon(callback, *args)  # on the loop (a sync thread never calls this)
            else:
                loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the process is shutting down
            pass

    def _hand_calls_to_loop(self, *, all_now: bool = False) -> None:
        """Tick thread (a single node: its tick on the loop): hand the calls gathered so far to the
        loop, in order. Called when a batch's callers are answered, before the tick's poll
        (pysyncobj's on-tick callbacks) and after it, so no call waits out a poll. A tick thread
        that does not lead keeps applied batches' effects a little (`_effects_may_wait`)."""
        calls = self._loop_calls
        if not calls or (not all_now and self._effects_may_wait()):
            return
        self._loop_calls = []
        self._loop_calls_urgent = False
        loop = self._loop
        if loop is None:
            return
        try:
            if self.ticks_on_loop:
                loop.call_soon(_run_calls, calls)
            else:
                self._loop_calls_handed_at = raft_clock()
                self.counters.loop_handoffs += 1
                loop.call_soon_threadsafe(_run_calls, calls)
        except RuntimeError:  # the loop is closed: the process is shutting down
            pass

    def _effects_may_wait(self) -> bool:
        """The gathered calls are only applied batches' effects, on a cluster node that does not
        lead, handed over less than FOLLOWER_EFFECTS_HANDOFF_S ago, and not too many: they may wait
        for the next hand-over. Such a node's loop only counts them into its metrics (a follower
        forwards every call that could wait on an effect), and waking it for each entry cost each
        follower a self-pipe write, a turn of its loop and two hand-overs of the interpreter lock
        per write (DESIGN.md, "A follower hands its applied effects over in bulk")."""
        raft = self._raft
        return (
            not self._loop_calls_urgent and not self.ticks_on_loop and raft is not None
            and raft.raft_state() != _LEADER and len(self._loop_calls) < FOLLOWER_EFFECTS_WAITING_MAX
            and raft_clock() - self._loop_calls_handed_at < FOLLOWER_EFFECTS_HANDOFF_S
        )

    def _halt(self, reason: str) -> None:
        logger.critical("replicated log %s halts: %s", self.self_address, reason)
        self._halt_reason = reason

    # Snapshots (tick thread). pysyncobj calls _write_dump right after applying, then _check_dump
    # every tick until it reports the outcome; the dump is written by a forked child (_dumper.py).

    def _write_dump(self, file_name: str, data: tuple[Any, Any, Any]) -> None:
        last, previous, cluster = data
        dumper = self._dumper
        assert dumper is not None, "dumps are written only with a data dir"
        dump_last, dump_previous = _entry(last), _entry(previous)
        members = [with_names(member_of(node), self._names) for node in cluster]
        addresses = [member.address for member in members]
        names = names_by_address(members)
        state_machine = self._state_machine

        def encode() -> bytes:
            # In the forked child: the state after exactly `last` (apply runs in the tick thread).
            return encode_dump(Dump(state_machine.snapshot(), dump_last, dump_previous, addresses, names))

        # pysyncobj renames file_name over the dump when this returns; the child's file goes into
        # place only when it is complete (_check_dump), so nothing may be at file_name.
        with contextlib.suppress(FileNotFoundError):
            os.remove(file_name)
        dumper.start(encode)

    def _check_dump(self) -> int:
        assert self._dumper is not None
        return self._dumper.check()

    def _read_dump(self, file_name: str) -> tuple[Any, Any, list[Any]]:
        if self._dumper is not None:
            self._dumper.abort()  # a dump installed from the leader replaces the one being written
        try:
            with open(file_name, "rb") as file:
                dump = decode_dump(file.read())
            make_private(file_name)  # one installed from the leader was written by pysyncobj
            if self._fsync:  # a dump installed from the leader was renamed into place unsynced
                fsync_file(file_name)
                fsync_directory(os.path.dirname(file_name) or ".")
            self._finish_interrupted_compaction(dump)
            with self.lock:
                self._state_machine.restore(dump.state)
            cluster = [
                raft_node(Member(address, names.get("id"), names.get("apiUrl")))
                for address in dump.cluster for names in [dump.members.get(address, {})]
            ]
            return (dump.last, dump.previous, cluster)
        except Exception as error:
            # pysyncobj would log this and replay the journal over an empty state: stop instead.
            self._halt(f"cannot load the Raft dump {file_name}: {error!r}")
            raise

    def _finish_interrupted_compaction(self, dump: Dump) -> None:
        # pysyncobj keeps the journal only if it starts with the dump's two entries, else it clears
        # it down to them. A crash between writing a dump and trimming the journal leaves a journal
        # that starts earlier and holds committed entries past the dump: trim it here so they stay.
        journal = self._journal
        if journal is None:
            return
        position = journal.position_of(dump.previous)
        if position is not None and position > 0 and journal.position_of(dump.last) == position + 1:
            journal.deleteEntriesTo(position)


def _settle_change(done: asyncio.Future[int], reason: int) -> None:
    if not done.done():
        done.set_result(reason)


def _address(member: Member) -> str:
    return member.address


def _entry(entry: Any) -> tuple[bytes, int, int]:
    command, index, term = entry
    return (bytes(command), int(index), int(term))


def _fail(proposals: list[_Proposal], error: Exception) -> None:
    for proposal in proposals:
        proposal.waiting.settle(proposal.index, copy.copy(error))  # one instance per waiter (tracebacks)


def _run_calls(calls: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> None:
    """Loop thread: the calls one tick gathered, in order; one that raises does not stop the rest
    (each was its own loop callback before they were gathered)."""
    for callback, args in calls:
        try:
            callback(*args)
        except Exception:
            logger.exception("a call from the Raft thread failed: %r", callback)
