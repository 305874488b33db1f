"""A node's settings, from the command line (and later a config file)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runstate.actors import limits

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_SPACE = "default"
PROPOSE_TIMEOUT_S = 10.0  # a write whose outcome is not known by then answers UNAVAILABLE
LONG_POLL_MS_MAX = 30_000  # the longest a result/receive long poll is held; the SDK re-issues
READY_TIMEOUT_S = 30.0  # start-up: the longest to wait for the log to be replayed and a leader


@dataclass(slots=True)
class NodeConfig:
    node_id: str = "dev"
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    data_dir: Path | None = Path(".runstate")  # None: in memory, nothing on disk
    raft_host: str = DEFAULT_HOST
    raft_port: int = 0  # 0: pick a free port at start
    peers: tuple[str, ...] = ()
    raft_password: str = ""
    fsync: bool = True
    retention_ms: int = limits.retention_ms_default
    default_space: str = DEFAULT_SPACE
    # Snapshot the state and truncate the journal after this many log entries (a batch is one).
    compaction_entries: int = 5_000
