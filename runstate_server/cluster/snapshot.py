"""The dump file: msgpack `{"v": 1, "state": <state machine snapshot>, "raft": {...}}`, never pickle.

pysyncobj calls our serializer with (last applied entry, the entry before it, cluster nodes) and
expects the deserializer to give the same 3-tuple back, entries as tuples (command bytes, index,
term); the nodes' names (membership.py) ride beside their addresses. The state inside is the one the state machine had after applying exactly `last`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from runstate_server.cluster.private_files import open_private

DUMP_VERSION = 1

Entry = tuple[bytes, int, int]


class DumpFormatError(ValueError):
    """A dump file that this code cannot read (corrupt, pickled, or from a newer version)."""


@dataclass(frozen=True)
class Dump:
    state: dict[str, Any]
    last: Entry
    previous: Entry
    cluster: list[str]
    # The node layer's names of the members (address -> {"id", "apiUrl"}: membership.py), beside
    # `cluster`; releases before membership changes neither write nor read them.
    members: dict[str, dict[str, str]] = field(default_factory=dict)


def encode_dump(dump: Dump) -> bytes:
    document = {
        "v": DUMP_VERSION,
        "state": dump.state,
        "raft": {
            "last": list(dump.last),
            "prev": list(dump.previous),
            "cluster": sorted(dump.cluster),
            **({"members": dump.members} if dump.members else {}),
        },
    }
    return msgpack.packb(document, use_bin_type=True)


def decode_dump(data: bytes) -> Dump:
    try:
        document = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as error:
        raise DumpFormatError(f"not a msgpack dump: {error}") from error
    if not isinstance(document, dict) or document.get("v") != DUMP_VERSION:
        version = document.get("v") if isinstance(document, dict) else None
        raise DumpFormatError(f"unsupported dump version {version!r}")
    try:
        raft = document["raft"]
        return Dump(
            state=document["state"],
            last=_entry(raft["last"]),
            previous=_entry(raft["prev"]),
            cluster=[str(address) for address in raft["cluster"]],
            members=_members(raft.get("members", {})),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise DumpFormatError(f"malformed dump: {error!r}") from error


def _members(members: Any) -> dict[str, dict[str, str]]:
    if not isinstance(members, dict):
        raise ValueError("members is a map")
    return {
        str(address): {str(key): str(value) for key, value in names.items() if key in ("id", "apiUrl")}
        for address, names in members.items() if isinstance(names, dict)
    }


def _entry(fields: Sequence[Any]) -> Entry:
    command, index, term = fields
    if not isinstance(command, bytes) or not isinstance(index, int) or not isinstance(term, int):
        raise ValueError("an entry is [bytes, int, int]")
    return (command, index, term)


def write_file(path: str, data: bytes, *, fsync: bool) -> None:
    """Write `data` to `path`, mode 0600 (the dump is renamed over afterwards)."""
    with open_private(path) as file:
        file.write(data)
        file.flush()
        if fsync:
            os.fsync(file.fileno())


def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_directory(path: str) -> None:
    """Make a rename or a new file inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
