"""pysyncobj, the cluster's Raft engine: everything of it the project touches, checked at import.

The cluster layer extends pysyncobj from the inside (DESIGN.md, "pysyncobj internals we touch"):
it overrides methods by their name-mangled names, reads and replaces private attributes, and
wraps its transport and journal. Every module of the project imports pysyncobj through this one,
and this module declares each name reached beyond pysyncobj's public API (a `Seam` of
runstate_server/_seams.py) and checks them all when it is first imported: a release other than
the tested one, or one that renamed any of them, stops the node at start with a message naming
pysyncobj, its version and the missing name (runstate_server/node/cli.py). An override that
pysyncobj no longer calls would otherwise be dead code, and pre-vote, the read index's routing
or the snapshot-commit fix would switch off without a word.

tests/test_dependency_seams.py holds the list to the code (every mangled name the project writes
is declared here) and checks in real processes that a missing name stops a node and that each
override is called by pysyncobj.
"""

from __future__ import annotations

from runstate_server._seams import (
    Attribute,
    Constant,
    DependencyMismatch,
    Method,
    Override,
    Seam,
    check,
    installed_version,
)

try:
    import pysyncobj.pickle as pysyncobj_pickle
    from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
    from pysyncobj.config import SERIALIZER_STATE
    from pysyncobj.encryptor import SALT as ENCRYPTOR_SALT
    from pysyncobj.journal import FileJournal, Journal, MemoryJournal, MetaStorer
    from pysyncobj.monotonic import monotonic as raft_clock
    from pysyncobj.node import TCPNode
    from pysyncobj.pipe_notifier import PipeNotifier
    from pysyncobj.poller import POLL_EVENT_TYPE
    from pysyncobj.syncobj import _COMMAND_TYPE as COMMAND_TYPE
    from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
    from pysyncobj.tcp_server import TcpServer
    from pysyncobj.transport import TCPTransport
except ImportError as error:  # a name moved or gone: the same refusal as a missing seam
    raise DependencyMismatch(
        f"pysyncobj {installed_version('pysyncobj')} lacks what runstate imports: {error}; runstate was tested "
        'with pysyncobj 0.3.17: install the releases of the lock (README, "Dependencies and the lock")'
    ) from error

__all__ = [
    "COMMAND_TYPE", "CONNECTION_STATE", "ENCRYPTOR_SALT", "FAIL_REASON", "POLL_EVENT_TYPE", "SERIALIZER_STATE", "SEAMS",
    "TESTED_VERSIONS", "FileJournal", "Journal", "MemoryJournal", "MetaStorer", "SyncObj", "SyncObjConf", "TCPTransport",
    "TCPNode", "TcpConnection", "TcpServer", "pysyncobj_pickle", "raft_clock", "replicated",
]

DISTRIBUTION = "pysyncobj"
# The releases the whole test suite and a chaos run passed with; pyproject.toml pins the same.
TESTED_VERSIONS = ("0.3.17",)

_RAFT = "cluster/_raft.py"
_PREVOTE = "cluster/_raft.py (pre-vote, _prevote.py)"
_READ_INDEX = "cluster/_raft.py (read index, _read_index.py)"
_LOG = "cluster/log.py"
_TRANSPORT = "cluster/_transport.py"
_JOURNAL = "cluster/_journal.py"
_CIPHER = "cluster/_frame_cipher.py"


def _syncobj_seams() -> list[Seam]:
    overridden = {
        "_checkCommandsToApply": _RAFT,  # queued commands fail NOT_LEADER instead of being forwarded
        "_SyncObj__applyLogEntries": _RAFT,  # one append per write (DESIGN.md)
        "_SyncObj__connectedToAnyone": _PREVOTE,  # pre-vote decides as an election would start
        "_SyncObj__onNodeDisconnected": _PREVOTE,
        "_SyncObj__onMessageReceived": f"{_PREVOTE}, {_READ_INDEX}, snapshot chunks' commit index",
        "_SyncObj__loadDumpFile": f"{_RAFT} (the journal's membership entries applied after the dump)",
        "_SyncObj__updateClusterConfiguration": f"{_RAFT} (a dump's configuration keeps its sender)",
    }
    called = {
        "_isLeader": _RAFT, "_getLeader": _LOG, "_SyncObj__getCurrentLogIndex": _RAFT,
        "_SyncObj__getCurrentLogTerm": _RAFT, "_SyncObj__generateRaftTimeout": _PREVOTE,
        "_SyncObj__callErrCallback": _RAFT, "doTick": _LOG, "addOnTickCallback": _LOG,
        "_SyncObj__parseChangeClusterRequest": _RAFT, "_SyncObj__doChangeCluster": _RAFT,
        "forceLogCompaction": _LOG, "isReady": _LOG, "destroy": _LOG, "transferLeadership": _LOG,
        "addNodeToCluster": _LOG, "removeNodeFromCluster": _LOG, "isNodeConnected": _LOG,
    }
    attributes = {
        "_SyncObj__raftLog": f"{_RAFT} (the journal replaced)", "_SyncObj__otherNodes": _RAFT,
        "_SyncObj__raftState": _RAFT, "_SyncObj__transport": _RAFT, "_SyncObj__needLoadDumpFile": _RAFT,
        "_SyncObj__raftCommitIndex": _RAFT, "_SyncObj__leaderCommitIndex": _RAFT,
        "_SyncObj__pipeNotifier": _RAFT, "_SyncObj__raftCurrentTerm": _PREVOTE, "_SyncObj__selfNode": _PREVOTE,
        "_SyncObj__raftLeader": _PREVOTE, "_SyncObj__raftElectionDeadline": _PREVOTE,
        "_SyncObj__transferInProgress": _PREVOTE, "_SyncObj__commandsQueue": _RAFT,
        "_SyncObj__lastResponseTime": f"{_RAFT} (check-quorum)", "_SyncObj__noopIDx": _READ_INDEX,
        "_poller": _TRANSPORT, "raftLastApplied": _LOG, "raftCommitIndex": _LOG, "raftCurrentTerm": _LOG,
        "conf": _TRANSPORT, "encryptor": _TRANSPORT,
    }
    return [
        *(Override(SyncObj, name, used_by) for name, used_by in overridden.items()),
        *(Method(SyncObj, name, used_by) for name, used_by in called.items()),
        *(Attribute(SyncObj, name, used_by) for name, used_by in attributes.items()),
        Method(PipeNotifier, "notify", _RAFT),
        Attribute(PipeNotifier, "_PipeNotifier__pipeR", f"{_RAFT} (closed: pysyncobj leaks it)"),
        Attribute(PipeNotifier, "_PipeNotifier__pipeW", f"{_RAFT} (closed: pysyncobj leaks it)"),
        Attribute(TCPNode, "id", _PREVOTE), Attribute(TCPNode, "host", _TRANSPORT),
        Attribute(TCPNode, "address", _TRANSPORT),
    ]


def _transport_seams() -> list[Seam]:
    connection_overrides = (
        "send", "connect", "_TcpConnection__processRead", "_TcpConnection__processParseMessage",
        "_TcpConnection__processConnection", "_TcpConnection__processSend",  # TLS (peer_tls.py)
    )
    connection_calls = ("_TcpConnection__trySendBuffer", "disconnect",
                        "setOnConnectedCallback", "setOnMessageReceivedCallback", "setOnDisconnectedCallback")
    connection_attributes = (
        "_TcpConnection__readBuffer", "_TcpConnection__writeBuffer", "_TcpConnection__socket",
        "_TcpConnection__recvBufferSize", "_TcpConnection__fileno", "_TcpConnection__poller", "sendRandKey",
        "recvRandKey", "recvLastTimestamp", "encryptor", "state", "_TcpConnection__lastReadTime",
    )
    server_attributes = (
        "_TcpServer__socket", "_TcpServer__poller", "_TcpServer__sendBufferSize", "_TcpServer__recvBufferSize",
        "_TcpServer__connectionTimeout", "_TcpServer__keepalive", "_TcpServer__onNewConnectionCallback",
    )
    transport_overrides = (
        "send", "_onMessageReceived", "_onNodeConnected", "_onNodeDisconnected", "_createServer", "addNode",
        "_onNewIncomingConnection", "_onIncomingMessageReceived", "_onOutgoingMessageReceived", "_onTick",
    )
    transport_calls = ("_onOutgoingConnected", "_onDisconnected", "destroy")
    transport_attributes = (
        "_server", "_connections", "_unknownConnections", "_nodes", "_syncObj", "_selfNode", "ready", "_nodeAddrToNode",
    )
    return [
        *(Override(TcpConnection, name, _TRANSPORT) for name in connection_overrides),
        *(Method(TcpConnection, name, _TRANSPORT) for name in connection_calls),
        *(Attribute(TcpConnection, name, _TRANSPORT) for name in connection_attributes),
        Override(TcpServer, "_TcpServer__onNewConnection", _TRANSPORT),
        Method(TcpServer, "unbind", _TRANSPORT),
        *(Attribute(TcpServer, name, _TRANSPORT) for name in server_attributes),
        *(Override(TCPTransport, name, _TRANSPORT) for name in transport_overrides),
        *(Method(TCPTransport, name, _TRANSPORT) for name in transport_calls),
        *(Attribute(TCPTransport, name, _TRANSPORT) for name in transport_attributes),
    ]


# What pysyncobj calls on its journal (SyncObj's `__raftLog`): DurableJournal implements each one,
# so the set must be the one pysyncobj's Journal declares, no more, no less.
JOURNAL_METHODS = frozenset({
    "add", "clear", "deleteEntriesFrom", "deleteEntriesTo", "__getitem__", "__len__", "_destroy",
    "setRaftCommitIndex", "getRaftCommitIndex", "setCurrentTerm", "getCurrentTerm", "getVotedForNodeId",
    "onOneSecondTimer",
})


def _journal_seams() -> list[Seam]:
    return [
        *(Method(Journal, name, _JOURNAL) for name in sorted(JOURNAL_METHODS)),
        Override(MetaStorer, "getMeta", f"{_JOURNAL} (patched to close its file)"),
        Override(MetaStorer, "storeMeta", _JOURNAL),
        Method(MetaStorer, "getPath", _JOURNAL),
    ]


def _module_seams() -> list[Seam]:
    import pysyncobj.encryptor
    import pysyncobj.syncobj

    return [
        Constant(pysyncobj.encryptor, "SALT", f"{_CIPHER} (the frame key, derived as pysyncobj derives it)"),
        Constant(pysyncobj.syncobj, "_COMMAND_TYPE", "cluster/recovery.py (a membership entry made a no-op)"),
        # SyncObj.__init__ builds its journal by this module-level name: replaced by ours (a checksum
        # per record, checked at open: DESIGN.md "Checksums").
        Constant(pysyncobj.syncobj, "createJournal", f"{_JOURNAL} (the record journal, format 2)"),
    ]


SEAMS: tuple[Seam, ...] = (*_syncobj_seams(), *_transport_seams(), *_journal_seams(), *_module_seams())


def check_seams() -> None:
    """DependencyMismatch unless pysyncobj is a tested release with every seam in place."""
    check(DISTRIBUTION, "pysyncobj", lambda version: version in TESTED_VERSIONS, " or ".join(TESTED_VERSIONS), SEAMS)
    declared = frozenset(name for name, value in vars(Journal).items() if callable(value))
    if declared != JOURNAL_METHODS:
        raise DependencyMismatch(
            f"pysyncobj's journal interface changed (cluster/_journal.py implements it): new {sorted(declared - JOURNAL_METHODS)}, "
            f"gone {sorted(JOURNAL_METHODS - declared)}"
        )


check_seams()
