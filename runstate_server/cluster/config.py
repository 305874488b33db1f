"""Every knob and bound of the replicated log, named once. Why each value: see DESIGN.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runstate_server.actors import limits
from runstate_server.cluster._pysyncobj import SyncObjConf

KIB = 1024
MIB = 1024 * KIB

# Group commit: at most this many batches are proposed and not yet committed; the commands that
# arrive meanwhile accumulate into the next batch.
MAX_BATCHES_IN_FLIGHT = 2
# Commands in one batch (one Raft entry).
BATCH_COMMANDS_MAX = limits.batch_commands_max
# Encoded size of one command and of one batch; a batch closes early when the next command would
# push it over BATCH_BYTES_MAX (one command always fits: COMMAND_BYTES_MAX < BATCH_BYTES_MAX).
COMMAND_BYTES_MAX = 1 * MIB
BATCH_BYTES_MAX = 4 * MIB
# Commands accepted by propose() and not yet put in a batch; beyond it propose() raises LogUnavailable.
PENDING_COMMANDS_MAX = 10 * BATCH_COMMANDS_MAX
PROPOSE_TIMEOUT_S_DEFAULT = 5.0
# Reads waiting for a read index round (ReplicatedLog.read_index); beyond it a read raises
# LogUnavailable.
READS_WAITING_MAX = PENDING_COMMANDS_MAX

# Fixed by the design of this package, not tunable (see DESIGN.md "Configuration"):
# entries are sent as soon as they are appended, and the pipe notifier wakes our tick thread.
APPEND_ENTRIES_USE_BATCH = False
# Fail fast when there is no leader; the node layer retries or answers 503.
COMMANDS_WAIT_LEADER = False
# An entry larger than pysyncobj's append_entries batch is sent in chunks by a code path that
# miscounts the last chunk (it compares the pickled entry's offset with the raw command length);
# keeping the per-message budget above the largest batch means an entry is never chunked.
APPEND_ENTRIES_BYTES_MAX = 2 * BATCH_BYTES_MAX

# The Raft port (_transport.py, DESIGN.md "The Raft port"). Before its handshake is done (the key
# exchange, which needs the cluster password, and an incoming peer naming itself), a connection may
# send frames of at most HANDSHAKE_FRAME_BYTES_MAX (its handshake frames are ~200 bytes); a frame
# announcing more closes it before its body is read.
HANDSHAKE_FRAME_BYTES_MAX = 4 * KIB
# After it: the largest frame a node sends is an append_entries of entries up to
# APPEND_ENTRIES_BYTES_MAX plus the one entry (<= one batch) that crossed it, pickled, compressed
# and Fernet-encrypted (base64: x4/3), < 16.1 MiB; snapshots travel in 64 KiB chunks. Twice the raw
# size leaves room for the encoding.
PEER_FRAME_BYTES_MAX = 2 * (APPEND_ENTRIES_BYTES_MAX + BATCH_BYTES_MAX)
assert PEER_FRAME_BYTES_MAX > (APPEND_ENTRIES_BYTES_MAX + BATCH_BYTES_MAX + MIB) * 4 // 3
# Incoming connections still in their handshake, in all and from one remote address; beyond either
# an accepted connection is closed at once. A peer needs one (two while it reconnects).
UNAUTHENTICATED_CONNECTIONS_MAX = 32
UNAUTHENTICATED_CONNECTIONS_PER_HOST_MAX = 8

# In-memory mode never compacts (pysyncobj's in-memory compaction pickles the SyncObj's attributes
# and would ship a state without ours to a lagging follower).
_NEVER_ENTRIES = 2**62
_NEVER_S = 1e12


@dataclass(frozen=True)
class LogConfig:
    """Raft timing and log compaction. The defaults suit a LAN or one machine."""

    # Election timeout, drawn at random in [min, max]; pysyncobj requires min > 3 * append period.
    raft_timeout_s_min: float = 0.3
    raft_timeout_s_max: float = 0.6
    # Raft pre-vote (_prevote.py): a node campaigns (term + 1) only after a majority said it would
    # vote for it; a node says so only if it has not heard from a leader for raft_timeout_s_min.
    # Keeps a rejoining node from deposing a healthy leader. Off: pysyncobj's plain elections.
    pre_vote: bool = True
    # With pre-vote: once the connection to the live leader a follower follows closes (its process
    # died), the follower's election is due after lost_delay_s + rank * lost_stagger_s instead of
    # a whole election timeout of silence (rank: its place by address among the voters but the
    # leader; the stagger keeps two followers from campaigning at once and splitting the vote; the
    # delay lets the peers see the same close first, or they would refuse the pre-vote).
    leader_lost_delay_s: float = 0.02
    leader_lost_stagger_s: float = 0.1
    # Heartbeat period of the leader.
    append_entries_period_s: float = 0.05
    # A leader that has heard from no majority for this long steps down (pysyncobj default: 30 s).
    leader_fallback_timeout_s: float = 1.0
    # A connection silent this long is dead (>= raft_timeout_s_max).
    connection_timeout_s: float = 1.0
    # How often a node dials a peer it is not connected to (of two peers, only the one with the
    # higher address dials). At most leader_lost_stagger_s: a follower restarted just before the
    # leader died must be connected to the other follower before the second election is due, or
    # neither can reach a majority (DESIGN.md, "A restarted peer is dialled again soon").
    connection_retry_s: float = 0.1
    # An incoming Raft connection that has not finished its handshake this long after it was
    # accepted is closed (a peer's takes two round trips).
    handshake_timeout_s: float = 2.0
    # How long the tick thread waits for socket events when nothing of ours is pending (a single
    # node, which ticks on its event loop: how long until its next tick when nothing wakes it).
    tick_period_s: float = 0.05
    # A single node syncs its journal on its event loop while the last sync took at most this long,
    # else in a thread of its own while the loop serves on: a fast disk's sync costs less than the
    # two thread switches that would hand it over, and a slow disk holds up the API for at most one
    # slow sync (log.py, "Ticking").
    loop_sync_s_max: float = 0.001
    # Compact (dump the state, truncate the journal) after this many entries or this long, or once
    # the journal holds this many bytes of commands (it keeps them in memory too, and in its
    # memory-mapped file: 5,000 batches of up to 4 MiB would be 20 GiB). 16 MiB of commands is
    # some 17,000 small tasks submitted and completed with the batch calls (~1 KB of commands
    # each): the journal then costs at most ~32 MiB of memory, not ~130 as at 64 MiB (DESIGN.md
    # "Configuration").
    log_compaction_entries_min: int = 5_000
    log_compaction_time_s_min: float = 600.0
    log_compaction_bytes_min: int = 16 * MIB
    # ... but never before the journal holds this fraction of the last dump's size either: each
    # compaction writes the whole state, so with a fixed bound a node holding a million tasks would
    # write its whole state every 17,000 tasks. With a fraction, the work of dumping stays in
    # proportion to the work journaled, and the journal's memory to the state's.
    log_compaction_dump_fraction: float = 0.25
    # Address the Raft port binds; None binds self_address's host (pysyncobj alone would bind 0.0.0.0).
    bind_address: str | None = None
    # pysyncobj's configuration changes one member at a time, by log entries, and is kept in the dump
    # (DESIGN.md "Membership"), so the peers given seed only a data dir's first configuration. Off:
    # the configuration is the peers given, at every start (a dev node, which picks a new Raft
    # port at each start and never has a peer).
    dynamic_membership: bool = False
    # Raft entries (batches) queued in pysyncobj before its thread appends them.
    raft_queue_entries_max: int = 1_000
    # How long pysyncobj trusts a resolved peer address (its defaults, 600 s and 30 s, keep dialling
    # a restarted container's old IP for minutes).
    dns_cache_s: float = 2.0
    dns_fail_cache_s: float = 1.0

    def __post_init__(self) -> None:
        assert self.raft_timeout_s_min > 3 * self.append_entries_period_s, "pysyncobj needs min > 3 * period"
        assert self.raft_timeout_s_max > self.raft_timeout_s_min
        assert self.connection_timeout_s >= self.raft_timeout_s_max
        assert self.leader_fallback_timeout_s > self.append_entries_period_s
        assert self.log_compaction_entries_min >= 2
        assert self.log_compaction_dump_fraction >= 0
        assert self.tick_period_s > 0
        assert self.loop_sync_s_max >= 0
        assert self.leader_lost_delay_s >= 0 and self.leader_lost_stagger_s > 0
        assert 0 < self.connection_retry_s <= self.leader_lost_stagger_s, "redial a peer before the next election"
        assert self.handshake_timeout_s > 0

    def syncobj_conf(
        self,
        *,
        self_address: str | None,
        password: str,
        journal_file: str | None,
        dump_file: str | None,
        serializer: Any,
        deserializer: Any,
        serialize_checker: Any,
        on_state_changed: Any,
    ) -> SyncObjConf:
        assert password, "the Raft port must always be authenticated"
        assert (journal_file is None) == (dump_file is None), "a journal without a dump loses state"
        in_memory = journal_file is None
        conf = SyncObjConf(
            password=password,
            autoTick=False,
            appendEntriesUseBatch=APPEND_ENTRIES_USE_BATCH,
            appendEntriesBatchSizeBytes=APPEND_ENTRIES_BYTES_MAX,
            commandsWaitLeader=COMMANDS_WAIT_LEADER,
            dynamicMembershipChange=self.dynamic_membership,
            commandsQueueSize=self.raft_queue_entries_max,
            raftMinTimeout=self.raft_timeout_s_min,
            raftMaxTimeout=self.raft_timeout_s_max,
            appendEntriesPeriod=self.append_entries_period_s,
            leaderFallbackTimeout=self.leader_fallback_timeout_s,
            connectionTimeout=self.connection_timeout_s,
            connectionRetryTime=self.connection_retry_s,
            bindAddress=self.bind_address or self_address,
            dnsCacheTime=self.dns_cache_s,
            dnsFailCacheTime=self.dns_fail_cache_s,
            # Fail at once when the port is taken (unlimited retries would spin in the constructor).
            maxBindRetries=1,
            journalFile=journal_file,
            fullDumpFile=dump_file,
            serializer=None if in_memory else serializer,
            deserializer=None if in_memory else deserializer,
            serializeChecker=None if in_memory else serialize_checker,
            logCompactionMinEntries=_NEVER_ENTRIES if in_memory else self.log_compaction_entries_min,
            logCompactionMinTime=_NEVER_S if in_memory else self.log_compaction_time_s_min,
            onStateChanged=on_state_changed,
        )
        conf.validate()
        # Snapshot chunks must pass the Raft port's frame bound (_transport.py) with room to spare.
        assert conf.logCompactionBatchSize * 4 <= PEER_FRAME_BYTES_MAX
        return conf
