"""The dump file: msgpack `{"v": 1, "sum": <crc32>, "state": <state machine snapshot>, "raft": {...}}`,
never pickle.

`sum` (this release on) is zlib's crc32 of every byte after it: the map starts with a fixed
13-byte prefix (`v`, then `sum` as a msgpack uint32), so a reader finds it without decoding the
rest and checks the whole content before it trusts any of it. A dump of the release before has no
`sum` (a 3-entry map) and is read as before. The version stays 1 on purpose: a leader sends its dump
file as it is to a follower that lags (install snapshot), and during a rolling upgrade that follower
may run the release before, whose reader takes any map with `v` 1 and ignores a key it does not
know (DESIGN.md "Checksums").

pysyncobj calls our serializer with (last applied entry, the entry before it, cluster nodes) and
expects the deserializer to give the same 3-tuple back, entries as tuples (command bytes, index,
term); the nodes' names (membership.py) ride beside their addresses. The state inside is the one the state machine had after applying exactly `last`.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from runstate_server.cluster.private_files import open_private

DUMP_VERSION = 1
# The first bytes of a checksummed dump: a 4-entry map, "v": 1, "sum": then a msgpack uint32 (0xce)
# holding the crc32 of every byte after it (CHECKSUMMED_PREFIX_BYTES on).
_CHECKSUMMED_PREFIX = b"\x84\xa1v\x01\xa3sum\xce"
CHECKSUMMED_PREFIX_BYTES = len(_CHECKSUMMED_PREFIX) + 4
# The first bytes of a dump of the release before (a 3-entry map, "v": 1 first).
_PLAIN_PREFIX = b"\x83\xa1v\x01"
_PLAIN_KEYS = frozenset({"v", "state", "raft"})

Entry = tuple[bytes, int, int]


class DumpFormatError(ValueError):
    """A dump file that this code cannot read (corrupt, pickled, or from a newer version). `offset`:
    the byte where what is wrong starts, when known (the checksummed content starts at 13)."""

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.offset = offset


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
    """The dump's bytes, checksummed: `{"v": 1, "sum": crc32, "state", "raft"}`."""
    raft = {
        "last": list(dump.last),
        "prev": list(dump.previous),
        "cluster": sorted(dump.cluster),
        **({"members": dump.members} if dump.members else {}),
    }
    parts = [msgpack.packb(value, use_bin_type=True) for value in ("state", dump.state, "raft", raft)]
    checksum = 0
    for part in parts:
        checksum = zlib.crc32(part, checksum)
    return b"".join((_CHECKSUMMED_PREFIX, struct.pack(">I", checksum), *parts))


def check_dump(data: bytes) -> None:
    """DumpFormatError unless `data` starts as a dump does and, when it carries a checksum (this
    release on), the checksum matches every byte after it. Reads no further than that: cheap."""
    if data[:len(_CHECKSUMMED_PREFIX)] == _CHECKSUMMED_PREFIX:
        if len(data) < CHECKSUMMED_PREFIX_BYTES:
            raise DumpFormatError(f"the dump ends at byte {len(data)}, inside its checksum", len(data))
        (stored,) = struct.unpack_from(">I", data, len(_CHECKSUMMED_PREFIX))
        actual = zlib.crc32(memoryview(data)[CHECKSUMMED_PREFIX_BYTES:])
        if actual != stored:
            raise DumpFormatError(
                f"checksum mismatch over bytes {CHECKSUMMED_PREFIX_BYTES} to {len(data)} (stored {stored:08x}, "
                f"computed {actual:08x})", CHECKSUMMED_PREFIX_BYTES,
            )
        return
    if data[:len(_PLAIN_PREFIX)] != _PLAIN_PREFIX:
        if len(data) > 3 and 0x80 <= data[0] <= 0x8F and data[1:3] == b"\xa1v" and data[3] != DUMP_VERSION:
            raise DumpFormatError(f"unsupported dump version {data[3]!r} (a newer release's?)", 3)
        raise DumpFormatError(f"not a dump this release reads (it starts with {bytes(data[:8]).hex()})")


def decode_dump(data: bytes) -> Dump:
    """The dump in `data`, its checksum checked first (a dump of the release before has none).
    DumpFormatError for a checksum that does not match, or bytes that are not a dump."""
    check_dump(data)
    try:
        document = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as error:
        raise DumpFormatError(f"not a msgpack dump: {error}") from error
    if not isinstance(document, dict) or document.get("v") != DUMP_VERSION:
        version = document.get("v") if isinstance(document, dict) else None
        raise DumpFormatError(f"unsupported dump version {version!r}")
    if "sum" not in document and set(document) != _PLAIN_KEYS:
        # A byte flipped inside the prefix would otherwise skip the checksum.
        raise DumpFormatError(f"a dump without a checksum has keys {sorted(_PLAIN_KEYS)}, not {sorted(map(str, document))}")
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
