"""Backups of a live node, scheduled backups, and a data dir restored from a backup (README,
"Backups and restore"; the file's format: backup_file.py).

A backup is taken the way the Raft dump is (cluster/_dumper.py `ForkedWrite`): under the log's lock,
so the state is at one applied index, the node forks; the child, which sees the memory as it was at
the fork, counts the spaces, encodes the state and writes the file, while the node goes on
applying and serving. The lock is held for the fork only (tens of ms at a million tasks: bench/backup.py).

Scheduled backups (`--backup-dir`, `--backup-every`, `--backup-keep`): one node of a cluster takes
each (`takes_scheduled_backups`): the first follower in node-id order of the configuration, so the
leader's work is not disturbed; the leader when it has no follower (`runstate dev`, a cluster of
one) or cannot reach that one. Every node applies the same configuration, so they agree on the
node, but for a moment around an election or a partition (then two may take one, or none: the next
period takes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runstate_server._version import __version__
from runstate_server.actors import dispatch
from runstate_server.actors.state import from_snapshot
from runstate_server.cluster._dumper import ForkedWrite, writing_path
from runstate_server.cluster.log import DUMP_FILE_NAME
from runstate_server.cluster.membership import Member, names_by_address
from runstate_server.cluster.private_files import make_private_dir
from runstate_server.cluster.restore import write_restored
from runstate_server.cluster.snapshot import fsync_directory
from runstate_server.node.backup_file import (
    Backup,
    BackupFileError,
    Header,
    decode_body,
    encode_backup,
    read_backup,
    space_counts,
)
from runstate_server.node.config import Peer
from runstate_server.node.membership import VOTER, Membership, write_membership
from runstate_server.node.replicas import snapshot_digest

if TYPE_CHECKING:
    from runstate_server.node.server import Node

log = logging.getLogger(__name__)

# One backup at a time on a node (a second request is refused with CONFLICT): each is a forked
# process as large as the node.
BACKUPS_AT_ONCE_MAX = 1
# The longest a backup's child may take to write the file (a million tasks take ~30 s here).
BACKUP_TIMEOUT_S = 600.0
BACKUP_POLL_S = 0.05  # how often the loop looks whether the child finished
# Scheduled backups: how often a node looks whether one is due, at most.
SCHEDULE_CHECK_S = 1.0
BACKUP_EVERY_MS_MIN = 1_000
BACKUP_KEEP_MAX = 10_000
SCHEDULED_NAME = re.compile(r"^runstate-backup-(\d{8}T\d{6}\d{3}Z)-(\d+)\.backup$")
_WRITING_PREFIX = ".runstate-backup-"


class BackupBusy(Exception):
    """A backup is being taken on this node already."""


@dataclass
class BackupFigures:
    """Scheduled backups on this node (GET /metrics, GET /v1/cluster): node memory, from its start."""

    last_success_ms: int | None = None
    last_size_bytes: int = 0
    last_duration_s: float = 0.0
    last_file: str | None = None
    last_index: int = 0
    successes: int = 0
    failures: int = 0
    last_error: str | None = None
    last_stall_s: float = 0.0  # how long the lock was held to fork (any backup of this node)


def data_digest(snapshot: dict[str, Any]) -> str:
    """The SHA-256 of a state snapshot without its clock and its cluster id: what GET
    /v1/cluster/digest calls `dataDigest`. Equal on every replica at one index, and between a
    backup and the state it was taken from (a restore gives the state a new cluster id)."""
    data = {key: value for key, value in snapshot.items() if key != "cluster_id"}
    return snapshot_digest({**data, "clock_ms": None})


class Backups:
    """A node's backups: the route's (`take`) and the scheduled ones (`run_schedule`)."""

    def __init__(self, node: Node) -> None:
        self._node = node
        self._taking = 0
        self._taken = 0  # names each backup's temporary file
        self.figures = BackupFigures()

    def temporary_path(self) -> str:
        """Where a backup for the route is written: beside the dump (a node's start removes what a
        killed one left there: _dumper.remove_leftovers), or the system's temporary dir."""
        self._taken += 1
        name = f"backup-{os.getpid()}-{self._taken}"
        data_dir = self._node.config.data_dir
        if data_dir is None:
            return os.path.join(tempfile.gettempdir(), f"runstate-{name}.writing")
        return writing_path(str(data_dir / DUMP_FILE_NAME), name)

    async def take(self, path: str, *, fsync: bool) -> Header:
        """Write a backup of this node's state at its applied index to `path`; its header.
        BackupBusy when one is being taken; OSError or BackupFileError when it failed (no file left)."""
        if self._taking >= BACKUPS_AT_ONCE_MAX:
            raise BackupBusy("a backup is being taken on this node; ask again when it is done")
        self._taking += 1
        try:
            return await self._take(path, fsync=fsync)
        finally:
            self._taking -= 1

    async def _take(self, path: str, *, fsync: bool) -> Header:
        node = self._node
        started = time.monotonic()
        with node.read() as state:
            locked_at = time.monotonic()
            header = Header(
                cluster_id=state.cluster_id, epoch=node.config.epoch, index=node.log.applied_index,
                term=max(node.log.term, state.epoch), release=__version__, command_level=dispatch.COMMAND_LEVEL,
                proven_level=dispatch.proven_level(state), created_ms=int(time.time() * 1000),
                node_id=node.config.node_id,
            )

            def produce() -> bytes:
                # In the forked child: the state as it was at the fork, at `header.index`.
                spaces, left_out = space_counts(state)
                counted = dataclasses.replace(
                    header, spaces=spaces, spaces_left_out=left_out, tasks=len(state.tasks), runs=len(state.runs),
                )
                return encode_backup(counted, state)

            child = ForkedWrite(path, produce, fsync=fsync, what="a backup")
            self.figures.last_stall_s = time.monotonic() - locked_at
        deadline = started + BACKUP_TIMEOUT_S
        while (done := child.poll()) is None:
            if time.monotonic() > deadline:
                child.abort()
                raise OSError(f"the backup took longer than {BACKUP_TIMEOUT_S:.0f} s")
            await asyncio.sleep(BACKUP_POLL_S)
        if not done:
            raise OSError("the process writing the backup failed (the node's log says why)")
        log.info("backup at index %d written to %s in %.3f s (the state held %.4f s)", header.index, path,
                 time.monotonic() - started, self.figures.last_stall_s)
        return header

    # Scheduled backups.

    async def run_schedule(self, directory: Path, every_ms: int, keep: int) -> None:
        """Take a backup into `directory` every `every_ms` while this node is the one that takes
        them; keep the newest `keep`. A failure is logged and counted, never fatal."""
        try:
            make_private_dir(directory)
        except OSError as error:
            log.error("scheduled backups: cannot create %s: %s", directory, error)
        _remove_leftovers(directory)
        newest = newest_scheduled(directory)
        last_attempt = newest.stat().st_mtime if newest is not None else 0.0
        while True:
            await asyncio.sleep(min(SCHEDULE_CHECK_S, every_ms / 1000))
            if time.time() - last_attempt < every_ms / 1000 or not takes_scheduled_backups(self._node):
                continue
            last_attempt = time.time()
            try:
                await self.take_scheduled(directory, keep)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # noqa: BLE001 - a failed backup must never stop the node
                self.figures.failures += 1
                self.figures.last_error = f"{type(error).__name__}: {error}"
                log.error("scheduled backup into %s failed: %s", directory, self.figures.last_error)

    async def take_scheduled(self, directory: Path, keep: int) -> Path:
        started = time.monotonic()
        moment = datetime.now(timezone.utc)
        stamp = moment.strftime("%Y%m%dT%H%M%S") + f"{moment.microsecond // 1000:03d}Z"
        writing = directory / f"{_WRITING_PREFIX}{stamp}-{os.getpid()}.writing"
        try:
            header = await self.take(str(writing), fsync=True)
            final = directory / f"runstate-backup-{stamp}-{header.index}.backup"
            os.replace(writing, final)
            fsync_directory(str(directory))
        finally:
            with contextlib.suppress(OSError):
                os.remove(writing)
        figures = self.figures
        figures.last_success_ms = int(time.time() * 1000)
        figures.last_size_bytes = final.stat().st_size
        figures.last_duration_s = time.monotonic() - started
        figures.last_file = final.name
        figures.last_index = header.index
        figures.successes += 1
        figures.last_error = None
        prune(directory, keep)
        return final

    def view(self) -> dict[str, Any] | None:
        """The last scheduled backup this node took, for GET /v1/cluster (None: none yet)."""
        figures = self.figures
        if figures.last_success_ms is None and figures.failures == 0:
            return None
        return {
            "at": figures.last_success_ms, "file": figures.last_file, "index": figures.last_index,
            "bytes": figures.last_size_bytes, "seconds": round(figures.last_duration_s, 3),
            "failures": figures.failures, "lastError": figures.last_error,
        }


def takes_scheduled_backups(node: Node) -> bool:
    """Whether this node takes the cluster's scheduled backups now (the module's docstring)."""
    leader = node.leader()
    if leader is None:
        return False
    followers = sorted(
        (member for member in node.members() if member.address != leader.address),
        key=lambda member: (member.node_id or "", member.address),
    )
    if not followers:
        return node.log.is_leader
    if followers[0].address == node.log.self_address:
        return True
    return node.log.is_leader and not node.log.reachable(followers[0].address)


def scheduled_files(directory: Path) -> list[Path]:
    """The scheduled backups in `directory`, oldest first (their names sort by time)."""
    try:
        names = sorted(name for name in os.listdir(directory) if SCHEDULED_NAME.match(name))
    except OSError:
        return []
    return [directory / name for name in names]


def newest_scheduled(directory: Path) -> Path | None:
    files = scheduled_files(directory)
    return files[-1] if files else None


def prune(directory: Path, keep: int) -> None:
    for old in scheduled_files(directory)[:-keep]:
        try:
            os.remove(old)
        except OSError as error:
            log.warning("cannot remove the old backup %s: %s", old, error)


def _remove_leftovers(directory: Path) -> None:
    """Files of scheduled backups whose node was killed while writing them."""
    with contextlib.suppress(OSError):
        for name in os.listdir(directory):
            if name.startswith(_WRITING_PREFIX) and name.endswith(".writing"):
                with contextlib.suppress(OSError):
                    os.remove(directory / name)


# Restore (the `runstate restore` command: node/cli.py).


class RestoreError(Exception):
    """The restore was refused or failed; nothing was written. The message says why."""


@dataclass(frozen=True)
class Restored:
    header: Header
    cluster_id: str
    epoch: int
    data_digest: str
    seconds: float


def restore(
    file: Path, data_dir: Path, *, node: Member | None, fsync: bool = True,
    new_cluster_id: Callable[[], str] | None = None,
) -> Restored:
    """Build `data_dir` from the backup `file`: for `runstate dev` (node None) or for the first
    voter of a new cluster (`node`: its id, Raft address and API URL), with a new cluster id and,
    for a cluster, the backup's epoch plus one (nodes of the old cluster are refused). RestoreError
    when the file is not an intact backup this release can restore or `data_dir` holds anything;
    nothing is written then."""
    started = time.monotonic()
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise RestoreError(f"{data_dir} is not empty: restore into a new (or empty) directory; it never writes "
                           "over a node's data")
    try:
        backup = read_backup(file)
    except OSError as error:
        raise RestoreError(f"cannot read {file}: {error.strerror or error}") from None
    except BackupFileError as error:
        raise RestoreError(f"{file}: {error}") from None
    header = backup.header
    if header.command_level > dispatch.COMMAND_LEVEL:
        raise RestoreError(
            f"{file} was written by runstate {header.release} at command level {header.command_level}; this release "
            f"applies level {dispatch.COMMAND_LEVEL} at most: restore it with runstate {header.release} or later"
        )
    dump, digest = _restored_dump(backup, file)
    cluster_id = (new_cluster_id or _new_cluster_id)()
    epoch = header.epoch + 1 if node is not None else header.epoch
    state = {**dump.state, "cluster_id": cluster_id}
    state.pop("learners", None)  # the old cluster's: the new one has its own members
    members = [node] if node is not None else []
    restored = dataclasses.replace(
        dump, state=state, cluster=[member.address for member in members], members=names_by_address(members),
    )
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.restoring-", dir=data_dir.parent))
    try:
        make_private_dir(building)
        write_restored(building, restored, max(header.term, int(state.get("epoch", 0))), fsync=fsync)
        if node is not None:
            assert node.node_id is not None and node.api_url is not None
            write_membership(building, Membership(VOTER, (Peer(node.node_id, node.address, node.api_url),), epoch))
        if data_dir.exists():
            data_dir.rmdir()  # empty (checked above)
        os.rename(building, data_dir)
        if fsync:
            fsync_directory(str(data_dir.parent))
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return Restored(header, cluster_id, epoch, digest, time.monotonic() - started)


def _restored_dump(backup: Backup, file: Path) -> tuple[Any, str]:
    try:
        dump = decode_body(backup)
        from_snapshot(dump.state)  # what the node will load: refuse here what it would halt on
    except BackupFileError as error:
        raise RestoreError(f"{file}: {error}") from None
    except (KeyError, TypeError, ValueError) as error:
        raise RestoreError(f"{file}: the backup's state cannot be loaded by this release: {error!r}") from None
    return dump, data_digest(dump.state)


def _new_cluster_id() -> str:
    return dispatch.CLUSTER_ID_PREFIX + secrets.token_hex(dispatch.CLUSTER_ID_HEX_CHARS // 2)
