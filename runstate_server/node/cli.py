"""The `runstate` command."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import gc
import logging
import re
import signal
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runstate_server._seams import DependencyMismatch
from runstate_server._version import __version__

# The server's modules check, as they are imported, that pysyncobj's and aiohttp's internals that
# runstate reaches for are there (runstate_server/_seams.py): if not, the node does not start.
try:
    from runstate_server.actors import COMPILED, limits
    from runstate_server.actors.dispatch import COMMAND_LEVEL
    from runstate_server.cluster.log import DUMP_FILE_NAME, JOURNAL_FILE_NAME
    from runstate_server.cluster.membership import Member
    from runstate_server.cluster.peer_tls import PeerTlsError, PeerTlsFiles
    from runstate_server.cluster.peer_tls import contexts as peer_tls_contexts
    from runstate_server.cluster.recovery import NoData, force_alone
    from runstate_server.node.admin_cli import (
        ADMIN_COMMANDS,
        add_admin_commands,
        add_cluster_commands,
        run_admin_command,
    )
    from runstate_server.node.api.app import build_app
    from runstate_server.node.backup_cli import add_backup_commands, run_backup_command
    from runstate_server.node.certs import add_certs_commands, server_context, tls_files
    from runstate_server.node.config import (
        BACKUP_EVERY_MS_DEFAULT,
        BACKUP_KEEP_DEFAULT,
        BOOTSTRAP_KEY_ENV,
        BOOTSTRAP_KEY_FILE_NAME,
        CLUSTER_NODES_MAX,
        DEFAULT_HOST,
        DEFAULT_PORT,
        DEFAULT_SPACE,
        HTTP_BODY_TIMEOUT_MS,
        HTTP_CONNECTIONS_MAX,
        HTTP_HEADER_TIMEOUT_MS,
        HTTP_IDLE_TIMEOUT_MS,
        HTTP_SEND_TIMEOUT_MS,
        LOCK_FILE_NAME,
        REPLICA_CHECK_EVERY_MS_DEFAULT,
        SECRET_CHARS_MIN,
        SECRET_ENV,
        ConfigError,
        HttpLimits,
        NodeConfig,
        Peer,
        TlsFiles,
        load_toml,
        parse_peer,
        read_bootstrap_key,
        read_secret,
        split_address,
    )
    from runstate_server.node.membership import (
        LEARNER,
        REMOVED,
        VOTER,
        JoinError,
        Membership,
        ask_to_join,
        read_membership,
        write_membership,
    )
    from runstate_server.node.tls import client_context
    from runstate_server.node.waiters import WAITERS_PER_KEY_MAX, WAITERS_TOTAL_MAX
except DependencyMismatch as mismatch:
    print(f"runstate: cannot start: {mismatch}", file=sys.stderr)
    sys.exit(3)  # DEPENDENCY_MISMATCH_EXIT, defined below the imports

log = logging.getLogger("runstate")

# The exit status of a node that refuses to start on a dependency it was not built for.
DEPENDENCY_MISMATCH_EXIT = 3

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
COMPACTION_ENTRIES_MIN = 10
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
# How the core runs, as `--version` tells it (README, "A compiled core").
CORE = "compiled core" if COMPILED else "interpreted core"


def duration_ms(text: str) -> int:
    """'500ms', '30s', '15m', '12h', '7d' as milliseconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 30s, 15m, 12h or 7d")
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def compaction_entries(text: str) -> int:
    value = int(text)
    if value < COMPACTION_ENTRIES_MIN:
        raise argparse.ArgumentTypeError(f"must be at least {COMPACTION_ENTRIES_MIN}")
    return value


def _add_storage_flags(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """--fsync, --retention, --compact-after, --log-level: shared by dev and node. Without
    defaults (node), an absent flag leaves the config file's value or the built-in default."""
    parser.add_argument(
        "--fsync", choices=("always", "never"), default="always" if defaults else None,
        help="always (default): every write reaches the disk before it is acknowledged; never: faster, "
        "but the last writes can be lost on power loss",
    )
    parser.add_argument(
        "--retention", type=duration_ms, default=duration_ms("7d") if defaults else None,
        help="how long a finished run stays readable before it is removed (default 7d)",
    )
    parser.add_argument(
        "--compact-after", type=compaction_entries, default=5_000 if defaults else None, metavar="ENTRIES",
        help="snapshot the state and truncate the journal after this many log entries (default 5000)",
    )
    parser.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")


def positive_integer(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def check_every_ms(text: str) -> int:
    """--replica-check-every: a duration, or 0 for never."""
    return 0 if text.strip() == "0" else duration_ms(text)


def positive_duration_ms(text: str) -> int:
    value = duration_ms(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be longer than 0")
    return value


# (flag, NodeConfig.http field, parse, help); a node's TOML file names them http_<field without _ms>.
_HTTP_FLAGS = (
    ("--http-connections-max", "connections_max", positive_integer,
     f"open API connections at most (default {HTTP_CONNECTIONS_MAX:,}, and never more than half the "
     "file-descriptor limit); past it a new connection takes the place of the one idle longest, or is "
     "answered 503 if every one is busy"),
    ("--http-idle-timeout", "idle_timeout_ms", positive_duration_ms,
     f"close a connection that has no request in progress after this (default {HTTP_IDLE_TIMEOUT_MS // 1000}s)"),
    ("--http-header-timeout", "header_timeout_ms", positive_duration_ms,
     f"a request's line and headers must arrive within this of its first byte (default {HTTP_HEADER_TIMEOUT_MS // 1000}s)"),
    ("--http-body-timeout", "body_timeout_ms", positive_duration_ms,
     f"a request's body must arrive within this of its headers (default {HTTP_BODY_TIMEOUT_MS // 1000}s)"),
    ("--http-send-timeout", "send_timeout_ms", positive_duration_ms,
     f"an answer must be taken by its client within this, else the connection is dropped (default "
     f"{HTTP_SEND_TIMEOUT_MS // 1000}s)"),
)


def _add_http_flags(parser: argparse.ArgumentParser) -> None:
    for flag, _, parse, help_text in _HTTP_FLAGS:
        parser.add_argument(flag, type=parse, default=None, help=help_text)


def http_limits(args: argparse.Namespace, file: dict[str, Any]) -> HttpLimits:
    """The --http-* flags over the file's http_* keys over the defaults."""
    values: dict[str, int] = {}
    for flag, field, parse, _ in _HTTP_FLAGS:
        value = getattr(args, flag.lstrip("-").replace("-", "_"))
        key = "http_" + field.removesuffix("_ms")
        if value is None and key in file:
            try:
                value = parse(str(file[key]))
            except (ValueError, argparse.ArgumentTypeError) as error:
                raise ConfigError(f"{key} in the config file: {error}") from None
        if value is not None:
            values[field] = value
    return HttpLimits(**values)


def _add_tls_flags(parser: argparse.ArgumentParser) -> None:
    """--tls-cert, --tls-key, --tls-client-ca: HTTPS on the API (node/certs.py), dev and node."""
    parser.add_argument(
        "--tls-cert", default=None, metavar="FILE",
        help="serve the API over HTTPS (TLS 1.2 at least) with this PEM certificate (chain); needs --tls-key",
    )
    parser.add_argument("--tls-key", default=None, metavar="FILE", help="the PEM private key of --tls-cert")
    parser.add_argument(
        "--tls-client-ca", default=None, metavar="FILE",
        help="with --tls-cert: also require every client to present a certificate this CA signed (mutual TLS; "
        "API keys are still required when auth is on)",
    )


def _add_cluster_tls_flags(parser: argparse.ArgumentParser) -> None:
    """--tls-ca and --peer-tls-*: TLS between the nodes of a cluster (cluster/peer_tls.py)."""
    parser.add_argument(
        "--tls-ca", default=None, metavar="FILE",
        help="verify the other nodes' HTTPS APIs (a follower forwarding to the leader, --join, membership and "
        "replica checks) against this CA (default: the system's CAs)",
    )
    parser.add_argument(
        "--peer-tls-cert", default=None, metavar="FILE",
        help="mutual TLS on the Raft port: this node's PEM certificate (chain); needs --peer-tls-key and --peer-tls-ca",
    )
    parser.add_argument("--peer-tls-key", default=None, metavar="FILE", help="the PEM private key of --peer-tls-cert")
    parser.add_argument(
        "--peer-tls-ca", default=None, metavar="FILE",
        help="the CA every peer's Raft certificate must chain to; a peer whose certificate does not verify, or does "
        "not name the host of its Raft address, is refused before any Raft message is read",
    )
    parser.add_argument(
        "--peer-tls-allow-plain", action="store_true", default=None,
        help="while a running cluster moves to certificates one node at a time: also accept, and fall back to, "
        "the password-sealed Raft connections of peers without certificates yet",
    )


def cluster_tls_settings(args: argparse.Namespace, file: dict[str, Any]) -> tuple[Path | None, PeerTlsFiles | None]:
    """--tls-ca and the --peer-tls-* flags over the file's keys; the files are read now (ConfigError if bad)."""
    ca = args.tls_ca or file.get("tls_ca")
    if ca is not None:
        try:
            ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError) as error:
            raise ConfigError(f"--tls-ca {ca}: not readable PEM CA certificates ({getattr(error, 'reason', None) or error})") from None
    cert, key, peer_ca = (
        getattr(args, f"peer_tls_{name}") or file.get(f"peer_tls_{name}") for name in ("cert", "key", "ca")
    )
    allow_plain = args.peer_tls_allow_plain if args.peer_tls_allow_plain is not None else file.get("peer_tls_allow_plain")
    if cert is None and key is None and peer_ca is None:
        if allow_plain:
            raise ConfigError("--peer-tls-allow-plain goes with --peer-tls-cert, --peer-tls-key and --peer-tls-ca")
        return (Path(ca) if ca else None), None
    if cert is None or key is None or peer_ca is None:
        raise ConfigError(
            "--peer-tls-cert (peer_tls_cert), --peer-tls-key (peer_tls_key) and --peer-tls-ca (peer_tls_ca) go "
            "together: give all three, or none"
        )
    if allow_plain is not None and type(allow_plain) is not bool:
        raise ConfigError(f"peer_tls_allow_plain must be true or false, not {allow_plain!r}")
    files = PeerTlsFiles(Path(cert), Path(key), Path(peer_ca), allow_plain=bool(allow_plain))
    try:
        peer_tls_contexts(files)  # a missing file or a key not matching stops the node before anything starts
    except PeerTlsError as error:
        raise ConfigError(str(error)) from None
    return (Path(ca) if ca else None), files


def tls_settings(args: argparse.Namespace, file: dict[str, Any]) -> TlsFiles | None:
    """The --tls-* flags over the file's tls_* keys; the files are read now (ConfigError if bad)."""
    files = tls_files(
        args.tls_cert or file.get("tls_cert"), args.tls_key or file.get("tls_key"),
        args.tls_client_ca or file.get("tls_client_ca"),
    )
    if files is not None:
        server_context(files)  # a missing file or a key not matching stops the node before anything starts
    return files


def _add_bootstrap_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-key-file",
        help=f"file holding the first admin key's secret (or set {BOOTSTRAP_KEY_ENV}); without either, the "
        f"first start writes a generated one to DATA_DIR/{BOOTSTRAP_KEY_FILE_NAME}",
    )


def _add_long_poll_flags(parser: argparse.ArgumentParser) -> None:
    """--long-polls and --long-polls-per-key: shared by dev and node (absent: the config file's
    value, then the default)."""
    parser.add_argument(
        "--long-polls", type=positive_integer, default=None, metavar="N",
        help=f"long polls parked on this node at once; more are answered at once (default {WAITERS_TOTAL_MAX})",
    )
    parser.add_argument(
        "--long-polls-per-key", type=positive_integer, default=None, metavar="N",
        help=f"long polls parked on one task, queue or resource; more are answered at once (default {WAITERS_PER_KEY_MAX})",
    )


def _add_backup_flags(parser: argparse.ArgumentParser) -> None:
    """--backup-dir, --backup-every, --backup-keep: scheduled backups (node/backup.py), dev and node."""
    parser.add_argument(
        "--backup-dir", type=Path, default=None, metavar="DIR",
        help="take scheduled backups into DIR (one node of a cluster takes each; README \"Backups and restore\")",
    )
    parser.add_argument(
        "--backup-every", type=duration_ms, default=None, metavar="DURATION",
        help=f"how often, with --backup-dir (default {BACKUP_EVERY_MS_DEFAULT // 60_000}m, at least 1s)",
    )
    parser.add_argument(
        "--backup-keep", type=positive_integer, default=None, metavar="N",
        help=f"keep the newest N scheduled backups, removing older ones (default {BACKUP_KEEP_DEFAULT})",
    )


def backup_settings(args: argparse.Namespace, file: dict[str, Any]) -> dict[str, Any]:
    """NodeConfig's backup_* fields: the flags over the file's keys over the defaults."""
    directory = args.backup_dir if args.backup_dir is not None else file.get("backup_dir")
    every = args.backup_every
    if every is None and "backup_every" in file:
        try:
            every = duration_ms(str(file["backup_every"]))
        except argparse.ArgumentTypeError as error:
            raise ConfigError(f"backup_every in the config file: {error}") from None
    keep = args.backup_keep if args.backup_keep is not None else file.get("backup_keep", BACKUP_KEEP_DEFAULT)
    if not directory and (args.backup_every is not None or args.backup_keep is not None):
        raise ConfigError("--backup-every and --backup-keep need --backup-dir")
    every = BACKUP_EVERY_MS_DEFAULT if every is None else every
    if every < 1000:
        raise ConfigError("--backup-every (backup_every) must be at least 1s")
    if type(keep) is not int or keep < 1:
        raise ConfigError(f"--backup-keep (backup_keep) must be an integer of at least 1, not {keep!r}")
    return {"backup_dir": Path(directory) if directory else None, "backup_every_ms": every, "backup_keep": keep}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runstate", description="runstate coordination server")
    parser.add_argument("--version", action="version", version=f"runstate {__version__} ({CORE})")
    commands = parser.add_subparsers(dest="command", required=True)

    dev = commands.add_parser(
        "dev",
        help="run a single-node development server",
        description="Run one runstate node: a one-node Raft group with its journal in the data dir.",
    )
    dev.add_argument("--host", default=DEFAULT_HOST, help=f"API address to bind (default {DEFAULT_HOST})")
    dev.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"API port (default {DEFAULT_PORT})")
    dev.add_argument("--data-dir", type=Path, default=Path(".runstate"), help="where the journal and snapshot live (default ./.runstate)")
    dev.add_argument("--in-memory", action="store_true", help="keep nothing on disk; everything is lost on exit")
    dev.add_argument("--raft-port", type=int, default=0, help="Raft port on 127.0.0.1 (default: a free port)")
    dev.add_argument(
        "--auth", action="store_true",
        help="require API keys as a cluster does; the first start creates an admin key (see --bootstrap-key-file)",
    )
    _add_bootstrap_flag(dev)
    _add_storage_flags(dev, defaults=True)
    _add_backup_flags(dev)
    _add_long_poll_flags(dev)
    _add_http_flags(dev)
    _add_tls_flags(dev)

    node = commands.add_parser(
        "node",
        help="run one node of a cluster",
        description="Run one cluster node. Settings come from flags, or from a TOML file (--config) with "
        "the same names in snake_case and [[peers]] tables (id, raft, api_url); flags win.",
    )
    node.add_argument("--config", type=Path, help="a TOML file with the settings below")
    node.add_argument("--node-id", help="this node's id, e.g. n1")
    node.add_argument("--api", help="HOST:PORT the HTTP API binds, e.g. 0.0.0.0:8080")
    node.add_argument("--advertise-url", help="how peers and clients reach this API (default http://HOST:PORT of --api; https:// with --tls-cert)")
    node.add_argument("--raft", help="this node's Raft address as the peers know it, HOST:PORT")
    node.add_argument("--raft-bind", help="what the Raft port binds, HOST:PORT (default: the --raft address)")
    node.add_argument(
        "--peer", action="append", default=None, metavar="ID,RAFT_HOST:PORT,API_URL",
        help="another node of the cluster, once per peer: the first configuration of a new cluster (its data "
        "dir keeps the configuration after that)",
    )
    node.add_argument(
        "--join", default=None, metavar="URL[,URL...]",
        help="join a running cluster: the API URL of one or more of its members, which record this node as a "
        "learner; the leader makes it a voter once it has caught up. Not with --peer; a restart needs neither",
    )
    node.add_argument(
        "--force-new-cluster", action="store_true",
        help="after losing a majority for good: start this survivor's data dir as a new cluster of one voter "
        "that keeps its data (a new cluster epoch: nodes of the old one are refused); then add members back with "
        "--join. Writes the others acknowledged that this node never received are lost",
    )
    node.add_argument("--data-dir", type=Path, help="where the journal and snapshot live (default ./.runstate)")
    node.add_argument(
        "--secret-file", help=f"file holding the cluster secret (or set {SECRET_ENV}); required, at least "
        f"{SECRET_CHARS_MIN} characters",
    )
    node.add_argument(
        "--command-level", type=int, default=None, metavar="N",
        help=f"the highest command level this node tells its peers and proposes at, 1 to {COMMAND_LEVEL} "
        f"(default {COMMAND_LEVEL}, this release's); the cluster uses the lowest of its nodes' levels. Keep it "
        "at the older release's level during a rolling upgrade you may roll back",
    )
    node.add_argument(
        "--replica-check-every", type=check_every_ms, default=None, metavar="DURATION",
        help="how often the leader has the nodes compare a digest of their states at one log entry, e.g. 5m "
        "(default 5m; 0 turns the periodic checks off; README, \"Replica checks\")",
    )
    _add_bootstrap_flag(node)
    _add_storage_flags(node, defaults=False)
    _add_backup_flags(node)
    _add_long_poll_flags(node)
    _add_http_flags(node)
    _add_tls_flags(node)
    _add_cluster_tls_flags(node)

    cluster = commands.add_parser(
        "cluster", help="a local cluster for trying runstate out and for tests; a cluster's members and leader",
    )
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True)
    up = cluster_commands.add_parser(
        "up",
        help="start a local cluster in the foreground",
        description="Start N cluster nodes on 127.0.0.1 in the foreground: APIs on BASE_PORT, BASE_PORT+1, "
        "...; Raft on BASE_PORT+100, ...; data and logs in DATA_DIR/<node id>; the cluster secret in "
        "DATA_DIR/cluster.secret. Ctrl-C stops them all.",
    )
    up.add_argument("--nodes", type=int, default=3, help=f"how many nodes, 1 to {CLUSTER_NODES_MAX} (default 3)")
    up.add_argument("--base-port", type=int, default=DEFAULT_PORT, help=f"the first API port (default {DEFAULT_PORT})")
    up.add_argument("--data-dir", type=Path, default=Path("cluster"), help="where the nodes keep their data (default ./cluster)")
    up.add_argument("--fsync", choices=("always", "never"), default="always")
    up.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")
    up.add_argument(
        "--tls", action="store_true",
        help="serve the APIs over HTTPS with a private CA's certificates, written once into DATA_DIR/certs "
        "(runstate certs init) and reused",
    )
    add_cluster_commands(cluster_commands)
    add_admin_commands(commands)
    add_backup_commands(commands)
    add_certs_commands(commands)
    return parser


# The garbage collector's thresholds in a node process (Python's defaults: 700, 10, 10). A node
# allocates a few hundred objects per task it handles, nearly all freed at once by their reference
# counts, while its state holds hundreds of thousands that live long: at 700 allocations a young
# collection ran every few tasks and every tenth one walked the survivors again. Collecting the
# young generation every 100,000 allocations lets the short-lived die first (they are never
# scanned); cyclic garbage waits at most that long (a few MB). Full collections still follow
# Python's own rule (when the objects added since the last one exceed a quarter of the total).
# bench.throughput --cluster --batch 50: node CPU per task -5 to -25% in interleaved pairs.
GC_YOUNG_ALLOCATIONS = 100_000
GC_YOUNG_COLLECTIONS_PER_MIDDLE = 50
GC_MIDDLE_COLLECTIONS_PER_OLD = 100


def tune_garbage_collector() -> None:
    gc.set_threshold(GC_YOUNG_ALLOCATIONS, GC_YOUNG_COLLECTIONS_PER_MIDDLE, GC_MIDDLE_COLLECTIONS_PER_OLD)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "backup_action", None) is not None:
        return run_backup_command(args)
    if getattr(args, "certs_action", None) is not None:
        return int(args.certs_action(args))
    if args.command in ADMIN_COMMANDS or getattr(args, "admin_action", None) is not None:
        return run_admin_command(args)
    tune_garbage_collector()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "dev":
            return _dev(args)
        if args.command == "node":
            config = node_config(args)
            return asyncio.run(_serve(config, banner=f"runstate cluster node {config.node_id}"))
        if args.command == "cluster":
            from runstate_server.node.local_cluster import cluster_up

            return cluster_up(
                args.nodes, args.base_port, args.data_dir, fsync=args.fsync, log_level=args.log_level, tls=args.tls,
            )
    except ConfigError as error:
        print(f"runstate: {error}", file=sys.stderr)
        return 2
    except DependencyMismatch as mismatch:  # the cluster layer is imported as the node starts
        print(f"runstate: cannot start: {mismatch}", file=sys.stderr)
        return DEPENDENCY_MISMATCH_EXIT
    return 2


def _dev(args: argparse.Namespace) -> int:
    backups = backup_settings(args, {})
    if args.host not in LOOPBACK_HOSTS and not args.auth:
        print(
            f"runstate dev serves without authentication, so it binds only loopback addresses, not {args.host} "
            "(add --auth to require API keys)",
            file=sys.stderr,
        )
        return 2
    config = NodeConfig(
        host=args.host,
        port=args.port,
        data_dir=None if args.in_memory else args.data_dir,
        raft_address=f"{DEFAULT_HOST}:{args.raft_port}" if args.raft_port else None,
        fsync=args.fsync == "always",
        retention_ms=args.retention,
        compaction_entries=args.compact_after,
        auth=args.auth,
        bootstrap_key=read_bootstrap_key(args.bootstrap_key_file) if args.auth else None,
        long_polls_max=args.long_polls or WAITERS_TOTAL_MAX,
        long_polls_per_key_max=args.long_polls_per_key or WAITERS_PER_KEY_MAX,
        http=http_limits(args, {}),
        **backups,
        tls=tls_settings(args, {}),
    )
    return asyncio.run(_serve(config, banner="runstate dev node"))


@contextlib.contextmanager
def locked_data_dir(data_dir: Path) -> Iterator[None]:
    """The data dir's lock (the one a running node holds: node/server.py) while the block runs;
    ConfigError when a node has it."""
    if not data_dir.is_dir():
        raise ConfigError(f"--force-new-cluster needs the data dir of a survivor: {data_dir} does not exist")
    with open(data_dir / LOCK_FILE_NAME, "ab") as lock_file:
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise ConfigError(f"a runstate node is using the data dir {data_dir}: stop it first") from None
        yield


def force_new_cluster(data_dir: Path, node_id: str, raft: str, api_url: str, epoch: int) -> int:
    """Make the survivor's data dir that of a new one-voter cluster (cluster/recovery.py), say
    what it keeps, and return the new epoch. ConfigError on a data dir with no data."""
    try:
        with locked_data_dir(data_dir):
            kept = force_alone(
                data_dir / JOURNAL_FILE_NAME, data_dir / DUMP_FILE_NAME, Member(raft, node_id, api_url), fsync=True,
            )
    except NoData as error:
        raise ConfigError(f"--force-new-cluster needs the data dir of a survivor: {error}") from None
    except (OSError, ValueError) as error:
        raise ConfigError(f"--force-new-cluster cannot rewrite {data_dir}: {error!r}") from None
    epoch += 1
    write_membership(data_dir, Membership(VOTER, (Peer(node_id, raft, api_url),), epoch))
    print(
        f"runstate: {node_id} starts a new cluster of one voter, epoch {epoch}, with its log up to index "
        f"{kept.last_index} (term {kept.last_term}); {kept.membership_entries} membership entries dropped. Add "
        "members with --join; restart this node without --force-new-cluster.", flush=True,
    )
    return epoch


def node_config(args: argparse.Namespace) -> NodeConfig:
    """A cluster node's settings: flags over the TOML file over the defaults."""
    file: dict[str, Any] = load_toml(args.config) if args.config else {}

    def setting(flag: Any, key: str) -> Any:
        return flag if flag is not None else file.get(key)

    node_id = setting(args.node_id, "node_id")
    api = setting(args.api, "api")
    raft = setting(args.raft, "raft")
    for value, what in ((node_id, "--node-id (node_id)"), (api, "--api (api)"), (raft, "--raft (raft)")):
        if not value:
            raise ConfigError(f"a cluster node needs {what}")
    host, port = split_address(api, "--api")
    split_address(raft, "--raft")
    tls = tls_settings(args, file)
    tls_ca, peer_tls = cluster_tls_settings(args, file)
    scheme = "https" if tls is not None else "http"
    raft_bind = setting(args.raft_bind, "raft_bind")
    if raft_bind:
        split_address(raft_bind, "--raft-bind")
    if args.peer is not None:
        peers = tuple(parse_peer(text) for text in args.peer)
    else:
        peers = tuple(
            parse_peer(f"{entry.get('id', '')},{entry.get('raft', '')},{entry.get('api_url', '')}")
            for entry in file.get("peers", [])
        )
    join = setting(args.join, "join")
    join_urls = [url.strip().rstrip("/") for url in join.split(",") if url.strip()] if isinstance(join, str) else []
    if join is not None and not join_urls:
        raise ConfigError("--join needs the API URL of a member, e.g. --join http://10.0.0.1:8080")
    if join_urls and peers:
        raise ConfigError("--join and --peer exclude each other: a joining node learns its peers from the cluster")
    if any(not url.startswith(("http://", "https://")) for url in join_urls):
        raise ConfigError(f"--join takes API URLs starting with http:// or https://, not {join!r}")
    data_dir = setting(args.data_dir, "data_dir")
    data_path = Path(data_dir) if data_dir else Path(".runstate")
    kept = read_membership(data_path)
    learner, epoch = False, 1 if kept is None else kept.epoch
    if args.force_new_cluster:
        if join_urls or peers:
            raise ConfigError("--force-new-cluster starts this node alone: not with --peer or --join")
        api_url = (setting(args.advertise_url, "advertise_url") or f"{scheme}://{host}:{port}").rstrip("/")
        epoch = force_new_cluster(data_path, node_id, raft, api_url, epoch)
        peers = ()
    elif kept is not None and kept.role == REMOVED:
        raise ConfigError(
            f"{node_id} was removed from its cluster: it does not start again on {data_path}; wipe that data dir and "
            "start it with --join to be a member again"
        )
    elif kept is not None:  # a node that joined once: its data dir names its role and the voters
        peers, learner = tuple(peer for peer in kept.voters if peer.id != node_id), kept.role == LEARNER
    elif join_urls:
        if (data_path / JOURNAL_FILE_NAME).exists() or (data_path / DUMP_FILE_NAME).exists():
            raise ConfigError(f"--join needs an empty data dir; {data_path} holds a node's data (wipe it to join anew)")
        try:
            joined = ask_to_join(
                join_urls, read_secret(setting(args.secret_file, "secret_file")), node_id, raft,
                (setting(args.advertise_url, "advertise_url") or f"{scheme}://{host}:{port}").rstrip("/"),
                context=client_context(tls_ca, tls),
            )
        except JoinError as error:
            raise ConfigError(f"cannot join the cluster: {error}") from None
        write_membership(data_path, joined)
        peers, learner, epoch = tuple(peer for peer in joined.voters if peer.id != node_id), True, joined.epoch
    if not peers and kept is None and not args.force_new_cluster:
        raise ConfigError(
            "a cluster node needs its peers (--peer ID,RAFT_HOST:PORT,API_URL for each other node of a new cluster) "
            "or a member to join (--join URL)"
        )
    if len(peers) + 1 > CLUSTER_NODES_MAX:
        raise ConfigError(f"a cluster has at most {CLUSTER_NODES_MAX} nodes")
    ids = [node_id, *(peer.id for peer in peers)]
    if len(set(ids)) != len(ids):
        raise ConfigError(f"node ids must differ: {', '.join(ids)}")
    fsync = setting(args.fsync, "fsync") or "always"
    if fsync not in ("always", "never"):
        raise ConfigError(f"fsync must be always or never, not {fsync!r}")
    retention = setting(args.retention, "retention")
    compact_after = setting(args.compact_after, "compact_after")
    command_level = setting(args.command_level, "command_level")
    if command_level is None:
        command_level = COMMAND_LEVEL
    if type(command_level) is not int or not 1 <= command_level <= COMMAND_LEVEL:
        raise ConfigError(f"command_level must be an integer from 1 to {COMMAND_LEVEL}, not {command_level!r}")
    replica_check_every = setting(args.replica_check_every, "replica_check_every")
    if isinstance(replica_check_every, str):
        try:
            replica_check_every = check_every_ms(replica_check_every)
        except argparse.ArgumentTypeError as error:
            raise ConfigError(f"replica_check_every: {error}") from None
    if replica_check_every is None:
        replica_check_every = REPLICA_CHECK_EVERY_MS_DEFAULT
    if type(replica_check_every) is not int or replica_check_every < 0:
        raise ConfigError(f"replica_check_every must be a duration such as 5m, or 0, not {replica_check_every!r}")
    return NodeConfig(
        node_id=node_id,
        host=host,
        port=port,
        advertise_url=setting(args.advertise_url, "advertise_url"),
        data_dir=data_path,
        raft_address=raft,
        raft_bind=raft_bind,
        peers=peers,
        learner=learner,
        clustered=True,
        epoch=epoch,
        secret=read_secret(setting(args.secret_file, "secret_file")),
        auth=True,  # a cluster node always requires keys
        bootstrap_key=read_bootstrap_key(setting(args.bootstrap_key_file, "bootstrap_key_file")),
        fsync=fsync == "always",
        retention_ms=duration_ms(retention) if isinstance(retention, str) else (retention or limits.retention_ms_default),
        compaction_entries=int(compact_after) if compact_after else 5_000,
        long_polls_max=int(setting(args.long_polls, "long_polls") or WAITERS_TOTAL_MAX),
        long_polls_per_key_max=int(setting(args.long_polls_per_key, "long_polls_per_key") or WAITERS_PER_KEY_MAX),
        http=http_limits(args, file),
        command_level=command_level,
        **backup_settings(args, file),
        replica_check_every_ms=replica_check_every,
        tls=tls,
        tls_ca=tls_ca,
        peer_tls=peer_tls,
    )


async def _serve(config: NodeConfig, *, banner: str) -> int:
    from runstate_server.node.server import Node, NodeStartError

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    node: Node | None = None
    try:
        node = Node(config, build_app)
        await node.start()
        tls = node.tls
        loop.add_signal_handler(signal.SIGHUP, lambda: tls.reload("SIGHUP"))
    except (NodeStartError, OSError) as error:
        print(f"runstate: {error}", file=sys.stderr)
        if node is not None:
            await node.stop()
        return 1
    storage = "in memory" if config.data_dir is None else f"data in {config.data_dir}, fsync {'always' if config.fsync else 'never'}"
    print(f"{banner} listening on {node.url} ({storage})", flush=True)
    print("Point clients at it with:", flush=True)
    print(f"  export RUNSTATE_BASE_URL={','.join([config.api_url, *(peer.api_url for peer in config.peers)])}", flush=True)
    print(f"  export RUNSTATE_SPACE_ID={DEFAULT_SPACE}", flush=True)
    if config.auth:
        print(node.bootstrap_message or "  export RUNSTATE_API_KEY=<an API key of the space>", flush=True)
    print("Stop it with Ctrl-C.", flush=True)
    await stop.wait()
    print("runstate: stopping", flush=True)
    await node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
