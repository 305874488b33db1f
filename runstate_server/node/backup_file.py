"""The backup file (`runstate backup`, scheduled backups; README "Backups and restore").

    MAGIC (16 bytes) | header length (4, big-endian) | header (JSON) | body length (8) | body | SHA-256 (32)

The header says what the backup is (`Header`: format, the cluster's id and epoch, the index and
term it was taken at, the release and command level that wrote it, the time, the spaces and their
counts); the body is the state as the Raft dump holds it (cluster/snapshot.py `encode_dump`, the
same bytes a node writes to raft.dump, with whatever checks that format carries), its entries a
no-op at the backup's index and the one before. The last 32 bytes are the SHA-256 of everything
before them: `read_backup` refuses a file whose checksum fails, that is truncated or too long, or
that is not a backup at all, with a message that says which.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from runstate_server.actors.state import State, to_snapshot
from runstate_server.cluster.snapshot import Dump, DumpFormatError, decode_dump, encode_dump

MAGIC = b"RUNSTATE-BACKUP\n"
FORMAT_VERSION = 1
_HEADER_LENGTH = struct.Struct(">I")
_BODY_LENGTH = struct.Struct(">Q")
CHECKSUM_BYTES = 32
HEADER_BYTES_MAX = 16 * 1024 * 1024  # a header lists every space: 1,000 spaces take ~100 KB
READ_CHUNK_BYTES = 1024 * 1024
# The spaces a header lists by name and counts; past it the rest are summed into `spacesLeftOut`.
HEADER_SPACES_MAX = 10_000
# The entries a restored log starts from (pysyncobj's no-op: a command type byte of 0).
NO_OP_COMMAND = b"\x00"


class BackupFileError(Exception):
    """Not a backup this release can read: the message says why (truncated, checksum, format)."""


@dataclass(frozen=True)
class Header:
    cluster_id: str | None
    epoch: int  # the cluster's (membership) epoch
    index: int  # the applied log index the state is at
    term: int  # the Raft term of the node that took it, then
    release: str  # the runstate version that wrote it
    command_level: int  # the writer's COMMAND_LEVEL: a release below it does not restore it
    proven_level: int  # the level the state's log proved (dispatch.proven_level)
    created_ms: int
    node_id: str  # the node it was taken from
    spaces: list[dict[str, Any]] = field(default_factory=list)  # {"id", "name", "tasks", "runs"}
    spaces_left_out: int = 0
    tasks: int = 0
    runs: int = 0
    format: int = FORMAT_VERSION

    def to_json(self) -> dict[str, Any]:
        names = {"cluster_id": "clusterId", "command_level": "commandLevel", "proven_level": "provenLevel",
                 "created_ms": "createdMs", "node_id": "nodeId", "spaces_left_out": "spacesLeftOut"}
        return {names.get(key, key): value for key, value in asdict(self).items()}

    @classmethod
    def from_json(cls, document: Any) -> Header:
        try:
            return cls(
                cluster_id=document["clusterId"], epoch=int(document["epoch"]), index=int(document["index"]),
                term=int(document["term"]), release=str(document["release"]),
                command_level=int(document["commandLevel"]), proven_level=int(document["provenLevel"]),
                created_ms=int(document["createdMs"]), node_id=str(document["nodeId"]),
                spaces=list(document["spaces"]), spaces_left_out=int(document["spacesLeftOut"]),
                tasks=int(document["tasks"]), runs=int(document["runs"]), format=int(document["format"]),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise BackupFileError(f"the backup's header is malformed: {error!r}") from None


def space_counts(state: State) -> tuple[list[dict[str, Any]], int]:
    """Each space's id, name, tasks and runs (the first HEADER_SPACES_MAX), and how many were left out."""
    tasks: dict[str, int] = {}
    for task in state.tasks.values():
        tasks[task.space] = tasks.get(task.space, 0) + 1
    runs: dict[str, int] = {}
    for run in state.runs.values():
        runs[run.space] = runs.get(run.space, 0) + 1
    spaces = [
        {"id": space.id, "name": space.name, "tasks": tasks.get(space.id, 0), "runs": runs.get(space.id, 0)}
        for space in list(state.spaces.values())[:HEADER_SPACES_MAX]
    ]
    return spaces, max(0, len(state.spaces) - HEADER_SPACES_MAX)


def encode_backup(header: Header, state: State) -> bytes:
    """The whole file for `state` (the caller holds it still, or it is a forked copy)."""
    index, term = header.index, header.term
    dump = Dump(
        state=to_snapshot(state),
        last=(NO_OP_COMMAND, index, term),
        previous=(NO_OP_COMMAND, max(index - 1, 1), term),
        cluster=[],
    )
    body = encode_dump(dump)
    header_bytes = json.dumps(header.to_json(), separators=(",", ":")).encode()
    parts = [MAGIC, _HEADER_LENGTH.pack(len(header_bytes)), header_bytes, _BODY_LENGTH.pack(len(body)), body]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return b"".join([*parts, digest.digest()])


def _read_exactly(file: BinaryIO, size: int, what: str, digest: Any) -> bytes:
    data = file.read(size)
    if len(data) != size:
        raise BackupFileError(f"the file is truncated: it ends inside the {what}")
    digest.update(data)
    return data


@dataclass(frozen=True)
class Backup:
    header: Header
    body: bytes | None  # None when read with body=False (inspect)
    size: int
    sha256: str


def read_backup(path: Path, *, body: bool = True) -> Backup:
    """Read and verify the backup at `path`; with body=False the body is hashed, not kept.
    OSError when it cannot be read; BackupFileError when it is not an intact backup."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        magic = file.read(len(MAGIC))
        if magic != MAGIC:
            raise BackupFileError(f"{path} is not a runstate backup (it does not start with {MAGIC!r})")
        digest.update(magic)
        (header_length,) = _HEADER_LENGTH.unpack(_read_exactly(file, _HEADER_LENGTH.size, "header's length", digest))
        if header_length > HEADER_BYTES_MAX:
            raise BackupFileError(f"the header claims {header_length} bytes, more than {HEADER_BYTES_MAX}: not a backup")
        header_bytes = _read_exactly(file, header_length, "header", digest)
        (body_length,) = _BODY_LENGTH.unpack(_read_exactly(file, _BODY_LENGTH.size, "body's length", digest))
        chunks: list[bytes] = []
        left = body_length
        while left > 0:
            chunk = _read_exactly(file, min(left, READ_CHUNK_BYTES), "body", digest)
            if body:
                chunks.append(chunk)
            left -= len(chunk)
        stored = file.read(CHECKSUM_BYTES)
        if len(stored) != CHECKSUM_BYTES:
            raise BackupFileError("the file is truncated: it ends before its SHA-256")
        if file.read(1):
            raise BackupFileError("the file has bytes after its SHA-256: not a backup as written")
        size = file.tell()
    if stored != digest.digest():
        raise BackupFileError("the SHA-256 does not match the content: the file is damaged")
    try:
        document = json.loads(header_bytes)
    except ValueError as error:
        raise BackupFileError(f"the backup's header is not JSON: {error}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT_VERSION:
        raise BackupFileError(f"backup format {document.get('format') if isinstance(document, dict) else None!r}: "
                              f"this release reads format {FORMAT_VERSION}")
    return Backup(Header.from_json(document), b"".join(chunks) if body else None, size, stored.hex())


def decode_body(backup: Backup) -> Dump:
    assert backup.body is not None, "read with body=True"
    try:
        return decode_dump(backup.body)
    except DumpFormatError as error:
        raise BackupFileError(f"the backup's state cannot be read: {error}") from None
