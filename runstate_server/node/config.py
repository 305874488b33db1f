"""A node's settings: from `runstate dev` flags, or for a cluster node from flags and a TOML file."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runstate_server.actors import limits
from runstate_server.actors.dispatch import COMMAND_LEVEL
from runstate_server.cluster.peer_tls import PeerTlsFiles
from runstate_server.node.waiters import WAITERS_PER_KEY_MAX, WAITERS_TOTAL_MAX

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_SPACE = "default"
PROPOSE_TIMEOUT_S = 10.0  # a write whose outcome is not known by then answers UNAVAILABLE
# Once the node is stopping, a write still waiting for its commit after this long answers
# UNAVAILABLE (outcome unknown: keyed calls are safe to retry), so that the stop does not wait out
# PROPOSE_TIMEOUT_S when no majority is left to commit it (the whole cluster stopping at once).
WRITE_STOP_GRACE_S = 1.0
# A cluster read whose read index no majority confirmed by then commits a barrier instead (a leader
# cut off from its peers steps down within leader_fallback_timeout_s = 1 s: then UNAVAILABLE).
READ_INDEX_TIMEOUT_S = 1.0
LONG_POLL_MS_MAX = 30_000  # the longest a result/receive long poll is held; the SDK re-issues
LOCK_FILE_NAME = "LOCK"  # in the data dir: held by the node that uses it (flock)
READY_TIMEOUT_S = 30.0  # start-up: the longest to wait for the log to be replayed and a leader
SECRET_ENV = "RUNSTATE_CLUSTER_SECRET"
SECRET_CHARS_MIN = 16
BOOTSTRAP_KEY_ENV = "RUNSTATE_BOOTSTRAP_KEY"
BOOTSTRAP_KEY_CHARS_MIN = 32
BOOTSTRAP_KEY_CHARS_MAX = 256
BOOTSTRAP_KEY_FILE_NAME = "bootstrap.key"  # in the data dir, mode 0600, when no key was given
CLUSTER_NODES_MAX = 7
BACKUP_EVERY_MS_DEFAULT = 3_600_000  # scheduled backups, when --backup-dir is given: hourly
BACKUP_KEEP_DEFAULT = 24  # and the newest 24 kept
# A cluster's leader has the nodes compare their states this often (`--replica-check-every`; node/replicas.py).
REPLICA_CHECK_EVERY_MS_DEFAULT = 300_000

# The HTTP server's bounds (node/http_server.py). The first five are settings (HttpLimits); a
# client holding a connection past any of them is answered and disconnected, never waited for.
HTTP_CONNECTIONS_MAX = 10_000  # open API connections per node; never more than half the fd limit
HTTP_IDLE_TIMEOUT_MS = 60_000  # a connection with no request in progress is closed after this
HTTP_HEADER_TIMEOUT_MS = 10_000  # from a request's first byte to its last header line
HTTP_BODY_TIMEOUT_MS = 30_000  # from a request's last header line to the end of its body
HTTP_SEND_TIMEOUT_MS = 30_000  # from the start of an answer to its last byte handed to the kernel
HTTP_SHED_CONNECTIONS_MAX = 64  # connections past the cap (all busy) answered 503; more are closed at once
HTTP_LINE_BYTES_MAX = 8_190  # a request line or header line
HTTP_HEADERS_MAX = 128  # header lines in a request
HTTP_LINGER_MS = 5_000  # the rest of a body not read before the answer is drained at most this long


class ConfigError(Exception):
    """A setting is missing or malformed; the message names it."""


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """What one client may hold of the API server (`--http-*` flags, `http_*` keys of a node's file)."""

    connections_max: int = HTTP_CONNECTIONS_MAX
    idle_timeout_ms: int = HTTP_IDLE_TIMEOUT_MS
    header_timeout_ms: int = HTTP_HEADER_TIMEOUT_MS
    body_timeout_ms: int = HTTP_BODY_TIMEOUT_MS
    send_timeout_ms: int = HTTP_SEND_TIMEOUT_MS


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """HTTPS on the API (node/certs.py): its certificate chain and key (`--tls-cert`, `--tls-key`),
    and the CA its clients' certificates must chain to (`--tls-client-ca`; None: none asked)."""

    cert: Path
    key: Path
    client_ca: Path | None = None


@dataclass(frozen=True, slots=True)
class Peer:
    """Another node of the cluster: its id, its Raft address and its API's URL."""

    id: str
    raft_address: str
    api_url: str


@dataclass(slots=True)
class NodeConfig:
    node_id: str = "dev"
    host: str = DEFAULT_HOST  # where the API binds
    port: int = DEFAULT_PORT
    advertise_url: str | None = None  # how peers and clients reach the API (default http://host:port, https:// with tls)
    data_dir: Path | None = Path(".runstate")  # None: in memory, nothing on disk
    raft_address: str | None = None  # host:port as the peers know it; None: 127.0.0.1 and a free port
    raft_bind: str | None = None  # what the Raft port binds, when not raft_address (e.g. 0.0.0.0:9000)
    peers: tuple[Peer, ...] = ()
    # A node that joined a running cluster (`--join`, node/membership.py): it follows the log as a
    # learner (no vote) until the leader promotes it. `peers` are then the voters it knows of.
    learner: bool = False
    # A cluster's node (`runstate node`): its membership changes by the log, even while it is the
    # only voter (after a forced recovery). Else `runstate dev`: one node, for good.
    clustered: bool = False
    # The cluster's epoch (DESIGN.md "Membership"): 1, plus one per forced recovery; peers of
    # another epoch are refused.
    epoch: int = 1
    secret: str = ""  # the cluster secret (Raft password); "" on a dev node: a random one
    fsync: bool = True
    retention_ms: int = limits.retention_ms_default
    default_space: str = DEFAULT_SPACE  # without auth: the space of calls naming none; with: the operator space
    auth: bool = False  # require API keys (always on a cluster node; `runstate dev --auth`)
    bootstrap_key: str | None = None  # the first admin key's secret; None: generate one into the data dir
    # Snapshot the state and truncate the journal after this many log entries (a batch is one).
    compaction_entries: int = 5_000
    # Long polls parked at once, on the node and on one key (node/waiters.py); more answer at once.
    long_polls_max: int = WAITERS_TOTAL_MAX
    long_polls_per_key_max: int = WAITERS_PER_KEY_MAX
    http: HttpLimits = field(default_factory=HttpLimits)
    # The highest command level this node tells its peers and proposes at (DESIGN.md, "Command
    # levels"): below this release's, the cluster keeps writing what the older release applies.
    command_level: int = COMMAND_LEVEL
    # Scheduled backups (node/backup.py): into this dir (None: none), every this long, the newest N kept.
    backup_dir: Path | None = None
    backup_every_ms: int = BACKUP_EVERY_MS_DEFAULT
    backup_keep: int = BACKUP_KEEP_DEFAULT
    # A cluster's leader asks its nodes to compare their states this often (node/replicas.py); 0: never.
    replica_check_every_ms: int = REPLICA_CHECK_EVERY_MS_DEFAULT
    tls: TlsFiles | None = None  # HTTPS on the API; None: plain HTTP
    # The CA this node verifies other nodes' HTTPS APIs against (forwarding to the leader, joining,
    # membership and replica checks; `--tls-ca`); None: the system's CAs.
    tls_ca: Path | None = None
    # Mutual TLS on the Raft port (`--peer-tls-*`, cluster/peer_tls.py); None: the password's frames only.
    peer_tls: PeerTlsFiles | None = None

    @property
    def api_url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return (self.advertise_url or f"{scheme}://{self.host}:{self.port}").rstrip("/")


def split_address(text: str, what: str) -> tuple[str, int]:
    """'host:port' (or '[v6]:port') as (host, port); ConfigError naming `what` otherwise."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} must be HOST:PORT, not {text!r}")
    return host, int(port)


def parse_peer(text: str) -> Peer:
    """'ID,RAFT_HOST:PORT,API_URL' as a Peer."""
    parts = [part.strip() for part in text.split(",")]
    if len(parts) != 3 or not all(parts):
        raise ConfigError(f"a peer is ID,RAFT_HOST:PORT,API_URL, not {text!r}")
    peer_id, raft, api_url = parts
    split_address(raft, f"peer {peer_id}'s Raft address")
    if not api_url.startswith(("http://", "https://")):
        raise ConfigError(f"peer {peer_id}'s API URL must start with http:// or https://, not {api_url!r}")
    return Peer(peer_id, raft, api_url.rstrip("/"))


def load_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except OSError as error:
        raise ConfigError(f"cannot read the config file {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"the config file {path} is not valid TOML: {error}") from None


def read_secret(secret_file: str | None) -> str:
    """The cluster secret, from a file or the environment; ConfigError if missing or short."""
    if secret_file:
        try:
            secret = Path(secret_file).read_text().strip()
        except OSError as error:
            raise ConfigError(f"cannot read the secret file {secret_file}: {error.strerror}") from None
    else:
        secret = os.environ.get(SECRET_ENV, "").strip()
    if not secret:
        raise ConfigError(
            f"a cluster node needs the cluster secret: --secret-file FILE or {SECRET_ENV} "
            "(without it anyone who reaches the Raft port could feed it data)"
        )
    if len(secret) < SECRET_CHARS_MIN:
        raise ConfigError(f"the cluster secret must be at least {SECRET_CHARS_MIN} characters")
    return secret


def read_bootstrap_key(key_file: str | None) -> str | None:
    """The first admin key, from a file or RUNSTATE_BOOTSTRAP_KEY; None when neither is set."""
    if key_file:
        try:
            key = Path(key_file).read_text().strip()
        except OSError as error:
            raise ConfigError(f"cannot read the bootstrap key file {key_file}: {error.strerror}") from None
    else:
        key = os.environ.get(BOOTSTRAP_KEY_ENV, "").strip()
        if not key:
            return None
    if not BOOTSTRAP_KEY_CHARS_MIN <= len(key) <= BOOTSTRAP_KEY_CHARS_MAX or not key.isprintable() or " " in key:
        raise ConfigError(
            f"the bootstrap key must be {BOOTSTRAP_KEY_CHARS_MIN} to {BOOTSTRAP_KEY_CHARS_MAX} printable characters "
            "without spaces (e.g. python -c 'import secrets; print(\"rsk_\" + secrets.token_urlsafe(32))')"
        )
    return key
