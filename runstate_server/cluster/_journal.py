"""Durability for pysyncobj's file journal, which never fsyncs on its own.

`DurableJournal` stands in for the FileJournal that SyncObj created (installed before the first
tick) and adds three things:
- every appended entry is synced to disk before `add` returns, so an entry is on disk before its
  index can be counted towards a commit (leader) or acknowledged to the leader (follower); inside
  `deferred_flush()` (the leader appending its new entries, RaftNode._checkCommandsToApply) the
  sync waits until the block ends, once for every entry appended in it: the leader sends each
  entry to the followers first and writes its own copy while they write theirs (Raft allows it:
  the leader counts itself towards a commit only in a later tick, after the block);
- compaction (`deleteEntriesTo`) writes the kept entries to a new file and renames it over the
  journal, instead of pysyncobj's in-place rewrite, where a crash halfway loses the tail; before
  it, the directory is fsynced so the dump's rename is durable before the journal forgets entries;
- the `.meta` file (term, vote, commit index) is fsynced before its rename;
- appends go to the file with `pwrite` (`JournalFile`) instead of through pysyncobj's memory map:
  the same bytes in the same places, and the sync after an append takes about two thirds of the
  time (0.13 against 0.20 ms on the test machine's disk).
With `fsync=False` only the crash-safe compaction and the writes through `pwrite` remain.

The file is pysyncobj's layout with a checksum in each record (`RecordJournal`, format 2; DESIGN.md
"Checksums"); a journal of the release before (format 1, pysyncobj's own) is read as before and
rewritten in format 2 when it opens. Opening checks every record (`scan`): a torn last record is cut
off, a damaged one before the end raises `JournalDamaged` (file and byte offset).
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pysyncobj.syncobj

from runstate_server.cluster._pysyncobj import Journal, MemoryJournal, MetaStorer
from runstate_server.cluster._pysyncobj import pysyncobj_pickle as _pickle
from runstate_server.cluster.private_files import make_private, open_private
from runstate_server.cluster.snapshot import fsync_directory
from runstate_server.histogram import Histogram

# Bucket bounds (seconds) of the journal's fsync time, as the node's metrics show it.
FSYNC_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

logger = logging.getLogger(__name__)

COMPACTION_SUFFIX = ".compact"
_TRUNCATION_WARNING = "truncating already-applied log entries"


class _AppliedTruncationFilter(logging.Filter):
    """pysyncobj logs CRITICAL "truncating already-applied log entries ... state machine may have
    diverged" before every overlapping append it handles by delete-and-re-append. With
    DurableJournal nothing applied is deleted (applied entries are committed, and committed ones
    are never hidden), so the line is noise: it is dropped and counted."""

    dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and record.msg.startswith(_TRUNCATION_WARNING):
            _AppliedTruncationFilter.dropped += 1
            return False
        return True


logging.getLogger("pysyncobj.syncobj").addFilter(_AppliedTruncationFilter())


def _get_meta_closing_the_file(self: MetaStorer) -> dict[str, Any]:
    """pysyncobj 0.3.17's MetaStorer.getMeta with its file closed (the original leaks the handle,
    a ResourceWarning on every restart). Same behaviour otherwise: no file or a bad one reads as {}."""
    try:
        with open(self.getPath(), "rb") as file:
            meta = _pickle.loads(file.read())
    except Exception:
        return {}
    return meta if isinstance(meta, dict) else {}


# Patched on the class because FileJournal.__init__ builds its MetaStorer itself; pinned version.
MetaStorer.getMeta = _get_meta_closing_the_file


class _PrivateMetaStorer(MetaStorer):  # type: ignore[misc]
    """pysyncobj's storer, writing its file 0600 (private_files.py), and fsyncing it with `fsync`."""

    def __init__(self, path: str, *, fsync: bool) -> None:
        super().__init__(path)
        self.fsync = fsync

    def storeMeta(self, meta: dict[str, Any]) -> None:
        path = self.getPath()
        with open_private(path + ".tmp") as file:
            # pysyncobj's own fields (term, voted-for address, commit index), in its own format.
            file.write(_pickle.dumps(meta))
            file.flush()
            if self.fsync:
                os.fsync(file.fileno())
        os.replace(path + ".tmp", path)
        if self.fsync:
            fsync_directory(os.path.dirname(path) or ".")


class JournalFile:
    """The journal's file (what pysyncobj's ResizableFile was: write, read, flush, _destroy), written
    with `pwrite` instead of through a shared memory map, and grown ahead by doubling its size as
    ResizableFile did. On the test machine's disk (ext4 on a virtual disk) an fdatasync after an
    append through the map took 0.20 ms at the median, against 0.13 ms after the same two writes
    (the record, then the header's end offset) made with pwrite; the kernel writes a mapping's dirty
    pages back through its page-fault tracking, which costs more than writing the page cache."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        self._size = os.fstat(self._fd).st_size

    def fileno(self) -> int:
        return self._fd

    def write(self, offset: int, values: bytes) -> None:
        end = offset + len(values)
        if end > self._size:
            # Grown ahead, not by each write: a write past the end changes the file's size, and
            # then each sync writes that metadata too.
            size = max(self._size, JOURNAL_FILE_BYTES_MIN)
            while size < end:
                size *= JOURNAL_FILE_GROWTH
            os.ftruncate(self._fd, size)
            self._size = size
        written = 0
        while written < len(values):  # a regular file takes it all at once; a full disk raises OSError
            taken = os.pwrite(self._fd, values[written:], offset + written)
            if taken <= 0:
                raise OSError(f"the journal took no bytes at offset {offset + written}")
            written += taken

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self._fd, size, offset)

    def flush(self) -> None:
        _sync_file(self._fd)

    def _destroy(self) -> None:
        if self._fd < 0:
            return
        try:
            _sync_file(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1


# JournalFile grows the file to at least this many bytes, then by doubling (ResizableFile's way).
JOURNAL_FILE_BYTES_MIN = 1024
JOURNAL_FILE_GROWTH = 2


def _sync_file(fd: int) -> None:
    """The file's data to disk (and the size: fdatasync writes the metadata a read needs), without
    the interpreter lock: the node's other thread runs meanwhile. macOS has no fdatasync."""
    if _HAS_FDATASYNC:
        os.fdatasync(fd)
    else:
        os.fsync(fd)


_HAS_FDATASYNC = hasattr(os, "fdatasync")


def sync_without_the_gil(journal: RecordJournal) -> None:
    """Write the journal's file to disk with fdatasync, which releases the interpreter lock (the
    node's other thread runs meanwhile; pysyncobj's own flush was an msync made holding it)."""
    journal.flush()


# The file (pysyncobj's layout, DESIGN.md "Checksums"): a header, then the records in order.
#   header: name (24 bytes), pysyncobj's version (8), format (u32), the end of the last record (u32)
#   format 1, pysyncobj's (the release before): length | index u64 | term u64 | command | length
#   format 2, this one's:         length | index u64 | term u64 | command | crc32 | length
# `length` (u32) counts the index, term and command; the crc32 (zlib's, of every byte of the record
# before it) makes a flipped bit or a torn write anywhere in the record visible. All little-endian.
_HEADER = struct.Struct("<24s8sII")
HEADER_BYTES = _HEADER.size  # = pysyncobj.journal.FIRST_RECORD_OFFSET, where the first record starts
_END_FIELD_OFFSET = 36  # the header's "end of the last record" field
_NAME = b"PYSYNCOBJ"
_PYSYNCOBJ_VERSION = b"0.3.17"  # the header's version field, as pysyncobj fills it (nothing reads it)
FORMAT_PLAIN = 1
FORMAT_CHECKSUMMED = 2
_U32 = struct.Struct("<I")
_INDEX_TERM = struct.Struct("<QQ")
_CRC_AND_LENGTH = struct.Struct("<II")
_INDEX_TERM_BYTES = 16
# Bytes of a record besides its `length`: the leading length and what follows the command.
_FRAME_BYTES = {FORMAT_PLAIN: 8, FORMAT_CHECKSUMMED: 12}

Entry = tuple[bytes, int, int]


class JournalDamaged(Exception):
    """A record of the journal file before its last one is unsound (or the header is): its bytes
    are not what was written, so nothing after it can be trusted either."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"the Raft journal {path} is damaged at byte {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


@dataclass(frozen=True)
class Scan:
    """What a journal file holds, checked: its sound records, and where the next one goes."""

    format: int
    entries: list[Entry]
    offsets: list[int]  # where each entry's record starts
    end: int  # where the next record goes: the header's end, or the start of a torn last record
    torn_at: int | None = None  # the offset of a torn last record that was cut off
    torn_reason: str = ""


class _Unsound(Exception):
    pass


def encode_record(command: bytes, index: int, term: int) -> bytes:
    """One format-2 record."""
    head = _U32.pack(_INDEX_TERM_BYTES + len(command)) + _INDEX_TERM.pack(index, term)
    checksum = zlib.crc32(command, zlib.crc32(head))
    return b"".join((head, command, _CRC_AND_LENGTH.pack(checksum, _INDEX_TERM_BYTES + len(command))))


def _header(end: int) -> bytes:
    return _HEADER.pack(_NAME, _PYSYNCOBJ_VERSION, FORMAT_CHECKSUMMED, end)


def _record_at(data: bytes, offset: int, limit: int, version: int) -> tuple[Entry, int]:
    """The entry of the record at `offset` and its length in bytes; _Unsound if it is not sound.
    `limit`: where the journal's records end (the header says)."""
    if offset + 4 > len(data):
        raise _Unsound(f"the file ends at byte {len(data)}, inside the record's length")
    (length,) = _U32.unpack_from(data, offset)
    if length < _INDEX_TERM_BYTES:
        raise _Unsound(f"its length field says {length} bytes, fewer than an index and a term")
    record_bytes = length + _FRAME_BYTES[version]
    if offset + record_bytes > limit:
        raise _Unsound(f"its length field ({length}) runs past the journal's end at byte {limit}")
    if offset + record_bytes > len(data):
        raise _Unsound(f"the file ends at byte {len(data)}, inside the record")
    (trailing,) = _U32.unpack_from(data, offset + record_bytes - 4)
    if trailing != length:
        raise _Unsound(f"its two length fields differ ({length} and {trailing})")
    if version == FORMAT_CHECKSUMMED:
        (stored,) = _U32.unpack_from(data, offset + 4 + length)
        if zlib.crc32(memoryview(data)[offset:offset + 4 + length]) != stored:
            raise _Unsound("its checksum does not match its bytes")
    index, term = _INDEX_TERM.unpack_from(data, offset + 4)
    return (bytes(data[offset + 4 + _INDEX_TERM_BYTES:offset + 4 + length]), index, term), record_bytes


def _record_ending_at(data: bytes, end: int, version: int) -> int | None:
    """The start of a sound record that ends exactly at `end` (found by its trailing length), or None."""
    if end > len(data) or end - 4 < HEADER_BYTES:
        return None
    (length,) = _U32.unpack_from(data, end - 4)
    start = end - length - _FRAME_BYTES[version]
    if start < HEADER_BYTES:
        return None
    try:
        _record_at(data, start, end, version)
    except _Unsound:
        return None
    return start


def _is_torn_tail(data: bytes, offset: int, end: int, version: int) -> bool:
    """Whether the unsound record at `offset` is the journal's last one, torn by a crash while it was
    written, rather than damage before the end: its own length (when it can be read) says it ends
    where the journal ends, or no sound record ends there after it. A file shorter than the journal's
    end (cut short from outside: the journal grows its file ahead of its records) lost more than
    its last record unless that record's length says it is the last."""
    if offset + 4 > len(data):
        return len(data) >= end
    (length,) = _U32.unpack_from(data, offset)
    if offset + length + _FRAME_BYTES[version] == end:
        return True
    if len(data) < end:
        return False
    last = _record_ending_at(data, end, version)
    return last is None or last <= offset


def scan(data: bytes, path: str) -> Scan:
    """Check every record of a journal file's bytes: the header, each record's framing and checksum
    (format 2), and that indexes follow one another and terms never go back. A torn last record is
    cut off (`Scan.torn_at`); anything else unsound raises JournalDamaged."""
    if len(data) < HEADER_BYTES:
        raise JournalDamaged(path, 0, f"the file has {len(data)} bytes, fewer than a journal's header ({HEADER_BYTES})")
    name, _, version, end = _HEADER.unpack_from(data)
    if name.rstrip(b"\0") != _NAME:
        raise JournalDamaged(path, 0, f"it does not start with {_NAME.decode()}: not a Raft journal")
    if version not in _FRAME_BYTES:
        raise JournalDamaged(path, 32, f"unknown format {version} (this release reads 1 and 2)")
    if end < HEADER_BYTES:
        raise JournalDamaged(path, _END_FIELD_OFFSET, f"the records' end ({end}) is inside the header")
    entries: list[Entry] = []
    offsets: list[int] = []
    offset = HEADER_BYTES
    while offset < end:
        try:
            entry, record_bytes = _record_at(data, offset, end, version)
            if entries and entry[1] != entries[-1][1] + 1:
                raise _Unsound(f"its index {entry[1]} does not follow {entries[-1][1]}")
            if entries and entry[2] < entries[-1][2]:
                raise _Unsound(f"its term {entry[2]} is below the term before it ({entries[-1][2]})")
        except _Unsound as unsound:
            if _is_torn_tail(data, offset, end, version):
                return Scan(version, entries, offsets, offset, torn_at=offset, torn_reason=str(unsound))
            raise JournalDamaged(path, offset, f"the record there is unsound ({unsound}), and it is not the last "
                                               "one (not a torn last write)") from None
        entries.append(entry)
        offsets.append(offset)
        offset += record_bytes
    return Scan(version, entries, offsets, end)


def scan_file(path: str) -> Scan:
    with open(path, "rb") as file:
        return scan(file.read(), path)


def write_journal(path: str, entries: Sequence[Entry], *, fsync: bool) -> None:
    """A format-2 journal of `entries` at `path`, whole or not at all: written to a new file, synced,
    renamed over `path` (a compaction, a conversion from format 1, a new journal)."""
    new_path = path + COMPACTION_SUFFIX
    records = [encode_record(*entry) for entry in entries]
    with open_private(new_path) as file:
        file.write(_header(HEADER_BYTES + sum(map(len, records))))
        file.writelines(records)
        file.flush()
        if fsync:
            os.fsync(file.fileno())
    os.replace(new_path, path)
    if fsync:
        fsync_directory(os.path.dirname(path) or ".")


class RecordJournal(Journal):  # type: ignore[misc]
    """pysyncobj's FileJournal in format 2 (a checksum per record), written with pwrite: the same
    interface, the entries in memory as pysyncobj keeps them, the term, vote and commit index in the
    `.meta` file beside it (pysyncobj's format). Opening checks the file (`scan`): JournalDamaged
    for a damaged record before the end; a torn last record is cut off (logged); a format-1 file is
    rewritten in format 2 first."""

    def __init__(self, path: str, *, fsync: bool = True) -> None:
        self.path = path
        self.fsync = fsync
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            write_journal(path, [], fsync=fsync)
        found = scan_file(path)
        if found.torn_at is not None:
            logger.warning("the Raft journal %s ends with a torn record at byte %d (%s): cut off, as a write that "
                           "never completed", path, found.torn_at, found.torn_reason)
        if found.format != FORMAT_CHECKSUMMED:
            write_journal(path, found.entries, fsync=fsync)
            logger.info("the Raft journal %s (format %d, %d records) was rewritten in format %d (checksummed)",
                        path, found.format, len(found.entries), FORMAT_CHECKSUMMED)
            found = scan_file(path)
        make_private(path)
        self._entries = found.entries
        self._offsets = found.offsets
        self._file = JournalFile(path)
        self._end = found.end
        if found.torn_at is not None:
            self._set_end(self._end)
            self._file.flush()
        self.meta_storer = _PrivateMetaStorer(path + ".meta", fsync=fsync)
        self._meta: dict[str, Any] = self.meta_storer.getMeta()
        self._meta_saved = True

    def _set_end(self, end: int) -> None:
        self._end = end
        self._file.write(_END_FIELD_OFFSET, _U32.pack(end))

    def add(self, command: bytes, idx: int, term: int) -> None:
        record = encode_record(bytes(command), idx, term)
        self._file.write(self._end, record)
        self._entries.append((command, idx, term))
        self._offsets.append(self._end)
        self._set_end(self._end + len(record))

    def clear(self) -> None:
        self._entries = []
        self._offsets = []
        self._set_end(HEADER_BYTES)

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        if entryFrom >= len(self._entries):
            return
        end = self._offsets[entryFrom]
        del self._entries[entryFrom:]
        del self._offsets[entryFrom:]
        self._set_end(end)

    def deleteEntriesTo(self, entryTo: int) -> None:
        self.replace(self._entries[entryTo:])

    def replace(self, entries: Sequence[Entry]) -> None:
        """Hold exactly `entries`, through a new file renamed over this one (write_journal)."""
        self._file._destroy()
        write_journal(self.path, entries, fsync=self.fsync)
        self._file = JournalFile(self.path)
        self._entries = list(entries)
        self._offsets = []
        offset = HEADER_BYTES
        for command, _, _ in self._entries:
            self._offsets.append(offset)
            offset += len(command) + _INDEX_TERM_BYTES + _FRAME_BYTES[FORMAT_CHECKSUMMED]
        self._end = offset

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        self._file._destroy()

    def flush(self) -> None:
        self._file.flush()

    # The meta file: pysyncobj's FileJournal's, unchanged.

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._meta["raftCommitIndex"] = raftCommitIndex
        self._meta_saved = False

    def getRaftCommitIndex(self) -> int:
        return int(self._meta.get("raftCommitIndex", 1))

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        # Raft: the term and the vote are durable before any message that shows them is sent.
        self.meta_storer.storeMeta(self._meta)
        self._meta_saved = True

    def getCurrentTerm(self) -> int:
        return int(self._meta.get("currentTerm", 0))

    def getVotedForNodeId(self) -> Any:
        return self._meta.get("votedForNodeId", None)

    def onOneSecondTimer(self) -> None:
        if not self._meta_saved:
            self.meta_storer.storeMeta(self._meta)
            self._meta_saved = True


def _create_journal(journal_file: str | None) -> Journal:
    """pysyncobj's createJournal (SyncObj.__init__ calls it by this module-level name): ours for a
    file, pysyncobj's MemoryJournal without one. JournalDamaged goes out of SyncObj's constructor."""
    return MemoryJournal() if journal_file is None else RecordJournal(journal_file)


# The one journal pysyncobj builds for any SyncObj of this process (a seam: _pysyncobj.py).
pysyncobj.syncobj.createJournal = _create_journal


def _open(path: str, *, fsync: bool) -> RecordJournal:
    return RecordJournal(path, fsync=fsync)


def keep_term_and_vote(meta_path: str, *, fsync: bool) -> None:
    """Rewrite a journal's .meta file with its term and vote only (Raft's persistent state), without
    the commit index: for a journal discarded, whose entries are gone. An unreadable one keeps nothing."""
    meta = _PrivateMetaStorer(meta_path, fsync=fsync).getMeta()
    _PrivateMetaStorer(meta_path, fsync=fsync).storeMeta(
        {key: meta[key] for key in ("currentTerm", "votedForNodeId") if key in meta}
    )


def remove_leftovers(path: str) -> None:
    """A compaction killed before its rename leaves its new file behind; the old journal is intact."""
    for leftover in (path + COMPACTION_SUFFIX, path + COMPACTION_SUFFIX + ".meta"):
        if os.path.exists(leftover):
            os.remove(leftover)


class DurableJournal(Journal):  # type: ignore[misc]
    def __init__(self, inner: RecordJournal, path: str, *, fsync: bool) -> None:
        self._path = path
        self._directory = os.path.dirname(path) or "."
        self._fsync = fsync
        inner.fsync = fsync
        inner.meta_storer.fsync = fsync
        if fsync:
            sync_without_the_gil(inner)  # the no-op entry SyncObj may have just added
        self._inner = inner
        self.compactions = 0
        self.fsync_seconds = Histogram(FSYNC_SECONDS_BUCKETS)  # each flush of an append or a clear
        # Positions at and after this one are deleted for pysyncobj but still on disk (None: none
        # are). pysyncobj deletes a follower's whole suffix on every append that overlaps it and
        # re-appends what the leader resends, even when the entries match; Raft truncates only on
        # a conflict. Dropping acknowledged, maybe committed entries that way would lose them if
        # this follower and the leader then failed. So a delete only hides the suffix; an add at
        # a hidden position that equals what is there re-shows it without a write, and the first
        # add that differs (a real conflict) truncates the disk there.
        self._visible: int | None = None
        self.skipped_rewrites = 0
        # Inside deferred_flush(): appends are written, and synced to disk once when the block ends.
        self._deferring = False
        self._unflushed = False
        # With `sync_later` set (a single node, which ticks on its event loop), the end of a
        # deferred_flush block only sets `sync_due`: the log calls `sync()` (on its loop or in a
        # thread) before its next tick, which is the one that counts the entries towards a commit.
        self.sync_later = False
        self.sync_due = False
        self.last_sync_s = 0.0  # how long the last sync took
        # The first sync that failed: the log halts (its entries may or may not be on disk: the
        # kernel may drop the dirty pages it could not write, and a retried sync can then succeed
        # without them; committing them would acknowledge writes a crash can lose).
        self.sync_error: BaseException | None = None
        # The bytes of the commands it holds (in memory, and in its memory-mapped file).
        self.command_bytes = self._count_bytes()

    def _count_bytes(self) -> int:
        return sum(len(self._inner[position][0]) for position in range(len(self._inner)))

    # Writes.

    def add(self, command: bytes, idx: int, term: int) -> None:
        position = idx - self._inner[0][1] if len(self._inner) else 0
        if position < len(self):
            # A committed entry pysyncobj meant to delete and re-append (deleteEntriesFrom kept
            # it): the leader's copy must be the same, as Raft guarantees for committed entries.
            assert tuple(self[position]) == (command, idx, term), f"committed entry {idx} conflicts with {term}"
            self.skipped_rewrites += 1
            return
        if self._visible is not None:
            assert position == self._visible, f"entry {idx} is not next ({position} != {self._visible})"
            if tuple(self._inner[position]) == (command, idx, term):
                self._visible = position + 1 if position + 1 < len(self._inner) else None
                self.skipped_rewrites += 1
                return
            self._inner.deleteEntriesFrom(position)  # a conflict: the disk is truncated here
            self._visible = None
            self.command_bytes = self._count_bytes()
        assert position == len(self._inner), f"entry {idx} leaves a gap after {len(self._inner)} entries"
        self._inner.add(command, idx, term)
        self.command_bytes += len(command)
        if self._fsync:
            if self._deferring:
                self._unflushed = True
            else:
                self._flush()

    @contextlib.contextmanager
    def deferred_flush(self) -> Iterator[None]:
        """Appends inside the block are synced to disk once, when it ends (also when it raises). Only
        for a leader's own new entries: nothing in the block may count them towards a commit or
        acknowledge them."""
        assert not self._deferring, "deferred_flush() does not nest"
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            if self._unflushed:
                self._unflushed = False
                if self.sync_later:
                    self.sync_due = True
                else:
                    self._flush()

    def clear(self) -> None:
        self._visible = None
        self._inner.clear()
        self.command_bytes = 0
        if self._fsync:
            self._flush()

    def _flush(self) -> None:
        started = time.perf_counter()
        try:
            sync_without_the_gil(self._inner)
        except BaseException as error:
            self.sync_error = self.sync_error or error
            raise
        self.last_sync_s = time.perf_counter() - started
        self.fsync_seconds.observe(self.last_sync_s)

    def sync(self) -> None:
        """The sync a deferred_flush block left due (`sync_later`): from any one thread at a time,
        while nothing ticks."""
        self.sync_due = False
        self._flush()

    def deleteEntriesFrom(self, entryFrom: int) -> None:
        """pysyncobj's follower calls this on every append that overlaps its log, before re-adding
        the leader's entries, and also when they match (Raft truncates only on a conflict). Hide
        the suffix instead of deleting it (see the class notes), and never hide a committed entry:
        a committed entry cannot conflict, and a node whose log, as pysyncobj sees it, ended below
        its commit index could win an election without entries a majority committed."""
        if not 0 <= entryFrom < len(self):
            return
        keep = max(entryFrom, self._committed_count())
        if keep < len(self):
            self._visible = keep

    def _committed_count(self) -> int:
        """How many entries, from the first, this node knows to be committed."""
        if not len(self._inner):
            return 0
        return max(0, min(len(self), self.getRaftCommitIndex() - self._inner[0][1] + 1))

    def deleteEntriesTo(self, entryTo: int) -> None:
        """Keep the entries from position `entryTo` on, through a new file and a rename (hidden
        ones included: they stay hidden at their shifted position)."""
        assert self._visible is None or entryTo <= self._visible
        kept = [self._inner[position] for position in range(entryTo, len(self._inner))]
        if self._fsync:
            # pysyncobj renamed the new dump over the old one in the previous tick: make that
            # durable before the journal stops holding the entries the dump replaces.
            fsync_directory(self._directory)
        self._inner.onOneSecondTimer()  # store pending meta changes (the file is not rewritten)
        remove_leftovers(self._path)
        self._inner.replace(kept)  # a new file, synced, renamed over the journal, the directory synced
        assert len(self._inner) == len(kept)
        self.command_bytes = sum(len(entry[0]) for entry in kept)
        if self._visible is not None:
            self._visible -= entryTo
        self.compactions += 1

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:
        self._inner.setRaftCommitIndex(raftCommitIndex)

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:
        self._inner.setCurrentTerm(term, votedForNodeId)

    def onOneSecondTimer(self) -> None:
        self._inner.onOneSecondTimer()

    def flush(self) -> None:
        sync_without_the_gil(self._inner)

    def _destroy(self) -> None:
        self._inner.onOneSecondTimer()  # store a pending commit index before closing
        self._inner._destroy()

    # Reads.

    def __getitem__(self, item: Any) -> Any:
        visible = self._visible
        if visible is None:
            return self._inner[item]
        if isinstance(item, slice):
            start, stop, step = item.indices(visible)
            return [self._inner[position] for position in range(start, stop, step)]
        position = item + visible if item < 0 else item
        if not 0 <= position < visible:
            raise IndexError("journal index out of range")
        return self._inner[position]

    def __len__(self) -> int:
        return len(self._inner) if self._visible is None else self._visible

    def getRaftCommitIndex(self) -> int:
        return int(self._inner.getRaftCommitIndex())

    def getCurrentTerm(self) -> int:
        return int(self._inner.getCurrentTerm())

    def getVotedForNodeId(self) -> Any:
        return self._inner.getVotedForNodeId()

    def position_of(self, entry: tuple[bytes, int, int]) -> int | None:
        """Where `entry` sits in the journal, by its index; None if absent or different."""
        if len(self) == 0:
            return None
        position = entry[1] - self[0][1]
        if 0 <= position < len(self) and tuple(self[position]) == tuple(entry):
            return position
        return None
