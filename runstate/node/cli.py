"""The `runstate` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import signal
import sys
from pathlib import Path

from runstate._version import __version__
from runstate.node.config import DEFAULT_HOST, DEFAULT_PORT, DEFAULT_SPACE, NodeConfig

log = logging.getLogger("runstate")

_DURATION = re.compile(r"^(\d+)(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
COMPACTION_ENTRIES_MIN = 10
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runstate", description="runstate coordination server")
    parser.add_argument("--version", action="version", version=f"runstate {__version__}")
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
    dev.add_argument(
        "--fsync", choices=("always", "never"), default="always",
        help="always (default): every write reaches the disk before it is acknowledged; never: faster, "
        "but the last writes can be lost on power loss",
    )
    dev.add_argument("--raft-port", type=int, default=0, help="Raft port on 127.0.0.1 (default: a free port)")
    dev.add_argument(
        "--retention", type=duration_ms, default="7d",
        help="how long a finished run stays readable before it is removed (default 7d)",
    )
    dev.add_argument(
        "--compact-after", type=compaction_entries, default=5_000, metavar="ENTRIES",
        help="snapshot the state and truncate the journal after this many log entries (default 5000)",
    )
    dev.add_argument("--log-level", default="WARNING", help="Python log level (default WARNING)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "dev":
        if args.host not in LOOPBACK_HOSTS:
            print(
                f"runstate dev serves without authentication, so it binds only loopback addresses, not {args.host}",
                file=sys.stderr,
            )
            return 2
        config = NodeConfig(
            host=args.host,
            port=args.port,
            data_dir=None if args.in_memory else args.data_dir,
            raft_port=args.raft_port,
            fsync=args.fsync == "always",
            retention_ms=args.retention,
            compaction_entries=args.compact_after,
        )
        return asyncio.run(_serve(config))
    return 2


async def _serve(config: NodeConfig) -> int:
    from runstate.node.server import Node, NodeStartError

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    node: Node | None = None
    try:
        node = Node(config)
        await node.start()
    except (NodeStartError, OSError) as error:
        print(f"runstate: {error}", file=sys.stderr)
        if node is not None:
            await node.stop()
        return 1
    storage = "in memory" if config.data_dir is None else f"data in {config.data_dir}, fsync {'always' if config.fsync else 'never'}"
    print(f"runstate dev node listening on {node.url} ({storage})", flush=True)
    print("Point clients at it with:", flush=True)
    print(f"  export RUNSTATE_BASE_URL={node.url}", flush=True)
    print(f"  export RUNSTATE_SPACE_ID={DEFAULT_SPACE}", flush=True)
    print("Stop it with Ctrl-C.", flush=True)
    await stop.wait()
    print("runstate: stopping", flush=True)
    await node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
