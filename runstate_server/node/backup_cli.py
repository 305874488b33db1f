"""`runstate backup --out FILE`, `runstate backup inspect FILE` and `runstate restore FILE --data-dir
DIR` (README "Backups and restore"; node/backup.py does the work).

Exit codes as the other admin commands: 0 done, 1 the node refused or the file is not an intact
backup (`runstate: ...` on stderr, one line), 2 a usage error (a path that cannot be written,
flags that do not go together).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runstate_server.cluster.membership import Member
from runstate_server.cluster.snapshot import fsync_directory
from runstate_server.node.admin_cli import EXIT_API_ERROR, EXIT_OK, EXIT_USAGE, add_client_flags, client_of
from runstate_server.node.backup import RestoreError, restore
from runstate_server.node.backup_file import BackupFileError, Header, read_backup
from runstate_server.node.config import ConfigError, split_address
from runstate_server.node.operator_client import (
    OperatorClient,
    OperatorError,
    UsageError,
    download,
)

BACKUP_PATH = "/v1/cluster/backup"


class CommandFailed(Exception):
    """One line for stderr and the exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def add_backup_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    backup = commands.add_parser(
        "backup", help="write a backup of a live cluster's whole state to a file (an operator admin key)",
        description="Write a consistent copy of the whole state, at one committed index, taken from a live node "
        "(a follower when the cluster has one) while it keeps serving. `runstate backup inspect FILE` "
        "shows what a backup holds and verifies its SHA-256.",
    )
    backup.add_argument("--out", metavar="FILE", help="the file to write (atomically: a failed backup leaves none)")
    add_client_flags(backup)  # --url, --api-key (an operator admin key's), --json (the backup's header)
    backup.set_defaults(backup_action=_backup)
    backup_commands = backup.add_subparsers(dest="backup_command")
    inspect = backup_commands.add_parser(
        "inspect", help="show a backup's header and verify its SHA-256 (exit 1 if it is damaged or truncated)",
    )
    inspect.add_argument("file", metavar="FILE")
    inspect.add_argument("--json", action="store_true", help="print JSON")
    inspect.set_defaults(backup_action=_inspect)

    restore_parser = commands.add_parser(
        "restore", help="build a data dir from a backup, for runstate dev or the first node of a new cluster",
        description="Build DIR from a backup: for `runstate dev --data-dir DIR`, or, with --node-id, --raft and "
        "--advertise-url, for the first voter of a new cluster (a new cluster id and epoch; the others join it "
        "with --join). Refuses a damaged or truncated file, one of a later release, and a DIR that holds anything.",
    )
    restore_parser.add_argument("file", metavar="FILE")
    restore_parser.add_argument("--data-dir", required=True, type=Path, help="the data dir to build (new or empty)")
    restore_parser.add_argument("--node-id", help="a cluster node's id (with --raft and --advertise-url)")
    restore_parser.add_argument("--raft", metavar="HOST:PORT", help="that node's Raft address, as it will run")
    restore_parser.add_argument("--advertise-url", metavar="URL", help="that node's API URL, as others reach it")
    restore_parser.add_argument("--json", action="store_true", help="print JSON")
    restore_parser.set_defaults(backup_action=_restore)


def run_backup_command(args: argparse.Namespace) -> int:
    try:
        text, machine = args.backup_action(args)
    except CommandFailed as failure:
        print(f"runstate: {failure}", file=sys.stderr)
        return failure.status
    print(json.dumps(machine, indent=2) if args.json else text)
    return EXIT_OK


def _backup(args: argparse.Namespace) -> tuple[str, Any]:
    if args.out is None:
        raise CommandFailed("runstate backup needs --out FILE (or `runstate backup inspect FILE`)", EXIT_USAGE)
    out = Path(args.out)
    try:
        client = client_of(args)
    except UsageError as error:
        raise CommandFailed(str(error), EXIT_USAGE) from None
    if out.is_dir():
        raise CommandFailed(f"--out {out} is a directory: name the file to write", EXIT_USAGE)
    try:  # before asking any node: a path that cannot be written fails at once
        descriptor, partial = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial")
    except OSError as error:
        raise CommandFailed(f"cannot write --out {out}: {error.strerror or error}", EXIT_USAGE) from None
    try:
        with os.fdopen(descriptor, "wb") as file:
            source = _source(client)
            download(source, BACKUP_PATH, client.api_key, file, client.context)
            file.flush()
            os.fsync(file.fileno())
        try:
            backup = read_backup(Path(partial), body=False)
        except BackupFileError as error:
            raise CommandFailed(f"the backup {source} sent is not intact ({error}); nothing written", EXIT_API_ERROR) from None
        os.replace(partial, out)
        fsync_directory(str(out.parent))
    except OperatorError as error:
        raise CommandFailed(f"{error.code}: {error.message}", EXIT_API_ERROR) from None
    except OSError as error:
        raise CommandFailed(f"cannot write --out {out}: {error.strerror or error}", EXIT_USAGE) from None
    finally:
        with contextlib.suppress(OSError):
            os.remove(partial)
    header = backup.header
    text = (f"wrote {out} ({backup.size:,} bytes, sha256 {backup.sha256}) from {header.node_id} ({source}): "
            f"index {header.index}, term {header.term}, {header.tasks:,} tasks in {len(header.spaces)} spaces")
    return text, {"file": str(out), "bytes": backup.size, "sha256": backup.sha256, "source": source, **header.to_json()}


def _source(client: OperatorClient) -> str:
    """A follower's API URL when the cluster lists one (the leader's work is not disturbed), else
    the node the client reaches first."""
    view = client.request("GET", "/v1/cluster")
    nodes = view.get("nodes", []) if isinstance(view, dict) else []
    for node in nodes:
        if node.get("role") == "follower" and node.get("reachable") and node.get("status") == "ok" and node.get("apiUrl"):
            return str(node["apiUrl"]).rstrip("/")
    for node in nodes:
        if node.get("reachable") and node.get("apiUrl"):
            return str(node["apiUrl"]).rstrip("/")
    return client.base_urls[0]


def _inspect(args: argparse.Namespace) -> tuple[str, Any]:
    try:
        backup = read_backup(Path(args.file), body=False)
    except OSError as error:
        raise CommandFailed(f"cannot read {args.file}: {error.strerror or error}", EXIT_API_ERROR) from None
    except BackupFileError as error:
        raise CommandFailed(f"{args.file}: {error}", EXIT_API_ERROR) from None
    header = backup.header
    machine = {"file": args.file, "bytes": backup.size, "sha256": backup.sha256, "checksum": "ok", **header.to_json()}
    return _header_text(header, [
        f"file:          {args.file}", f"size:          {backup.size:,} bytes",
        f"sha256:        {backup.sha256} (verified)",
    ]), machine


def _header_text(header: Header, first: list[str]) -> str:
    taken = datetime.fromtimestamp(header.created_ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
    lines = [
        *first,
        f"format:        {header.format}",
        f"cluster:       {header.cluster_id or '(no id yet)'}, epoch {header.epoch}",
        f"taken:         {taken} from node {header.node_id}",
        f"log:           index {header.index}, term {header.term}",
        f"release:       runstate {header.release}, command level {header.command_level} (the state proves "
        f"{header.proven_level})",
        f"content:       {header.tasks:,} tasks, {header.runs:,} runs, "
        f"{len(header.spaces) + header.spaces_left_out:,} spaces",
    ]
    for space in header.spaces:
        name = f" ({space['name']})" if space.get("name") else ""
        lines.append(f"  space {space['id']}{name}: {space['tasks']:,} tasks, {space['runs']:,} runs")
    if header.spaces_left_out:
        lines.append(f"  ... and {header.spaces_left_out:,} more spaces")
    return "\n".join(lines)


def _restore(args: argparse.Namespace) -> tuple[str, Any]:
    cluster_flags = (args.node_id, args.raft, args.advertise_url)
    node = None
    if any(flag is not None for flag in cluster_flags):
        if not all(cluster_flags):
            raise CommandFailed("a cluster node's restore needs --node-id, --raft and --advertise-url together "
                                "(none of them: a data dir for runstate dev)", EXIT_USAGE)
        try:
            split_address(args.raft, "--raft")
        except ConfigError as error:
            raise CommandFailed(str(error), EXIT_USAGE) from None
        if not args.advertise_url.startswith(("http://", "https://")):
            raise CommandFailed(f"--advertise-url must start with http:// or https://, not {args.advertise_url!r}", EXIT_USAGE)
        node = Member(args.raft, args.node_id, args.advertise_url.rstrip("/"))
    try:
        restored = restore(Path(args.file), args.data_dir, node=node)
    except RestoreError as error:
        raise CommandFailed(f"{error}; nothing written", EXIT_API_ERROR) from None
    except OSError as error:
        raise CommandFailed(f"cannot build {args.data_dir}: {error.strerror or error}; nothing written", EXIT_API_ERROR) from None
    header = restored.header
    if node is None:
        after = f"Start it with: runstate dev --data-dir {args.data_dir}"
    else:
        after = (f"Start it with: runstate node --node-id {node.node_id} --raft {node.address} --advertise-url "
                 f"{node.api_url} --data-dir {args.data_dir} (no --peer: it is a cluster of one), then add the other "
                 "nodes with runstate node --join " + str(node.api_url))
    text = "\n".join([
        f"restored {args.file} (index {header.index}, taken {header.created_ms} ms since the epoch from "
        f"{header.node_id}) into {args.data_dir} in {restored.seconds:.2f} s",
        f"new cluster id {restored.cluster_id}, epoch {restored.epoch}; data digest {restored.data_digest}",
        after,
    ])
    machine = {
        "dataDir": str(args.data_dir), "clusterId": restored.cluster_id, "epoch": restored.epoch,
        "dataDigest": restored.data_digest, "seconds": round(restored.seconds, 3), "backup": header.to_json(),
    }
    return text, machine
