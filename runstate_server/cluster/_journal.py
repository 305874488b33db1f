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
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

from runstate_server.cluster._pysyncobj import FileJournal, Journal, MetaStorer
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
    """pysyncobj's ResizableFile (its FileJournal's file: write, read, flush, _destroy), written
    with `pwrite` instead of through a shared memory map. The bytes and their places are the same
    (the file grows by doubling its size, as ResizableFile's does), so pysyncobj reads the file as
    before, and a node of an earlier release reads this one's. What changes is the sync: on the
    test machine's disk (ext4 on a virtual disk) an fdatasync after an append through the map took
    0.20 ms at the median, against 0.13 ms after the same two writes (the entry, then the header's
    end offset) made with pwrite; the kernel writes a mapping's dirty pages back through its
    page-fault tracking, which costs more than writing the page cache directly."""

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
# pwrite and pread exist wherever the node runs (Linux, macOS); without them the map stays.
_HAS_PWRITE = hasattr(os, "pwrite") and hasattr(os, "pread")


def write_with_pwrite(journal: FileJournal) -> None:
    """Swap the journal's memory-mapped file for a JournalFile of the same path (pysyncobj has read
    the entries through the map by now); a journal already swapped is left as it is."""
    mapped = journal._FileJournal__journalFile
    if isinstance(mapped, JournalFile) or not _HAS_PWRITE:
        return
    path = mapped._ResizableFile__fileName
    mapped._destroy()  # msync what went through the map since it opened (SyncObj's no-op entry), close
    journal._FileJournal__journalFile = JournalFile(path)


def sync_without_the_gil(journal: FileJournal) -> None:
    """Write the journal's file to disk, as pysyncobj's flush() does, but letting the node's other
    thread run meanwhile (pysyncobj's flush is `mmap.flush()`, an msync that CPython makes while
    holding the interpreter lock: the event loop, every HTTP request of the node, stood still for
    each fsync of the log). A JournalFile syncs with fdatasync, which releases the lock; a file
    still mapped (no pwrite) syncs with pysyncobj's msync."""
    file = journal._FileJournal__journalFile
    if isinstance(file, JournalFile):
        file.flush()
    else:
        journal.flush()


def _open(path: str, *, fsync: bool) -> FileJournal:
    journal = FileJournal(path)  # creates the file if missing, with the umask's mode
    make_private(path)
    journal._FileJournal__metaStorer = _PrivateMetaStorer(path + ".meta", fsync=fsync)
    write_with_pwrite(journal)
    return journal


def remove_leftovers(path: str) -> None:
    """A compaction killed before its rename leaves its new file behind; the old journal is intact."""
    for leftover in (path + COMPACTION_SUFFIX, path + COMPACTION_SUFFIX + ".meta"):
        if os.path.exists(leftover):
            os.remove(leftover)


class DurableJournal(Journal):  # type: ignore[misc]
    def __init__(self, inner: FileJournal, path: str, *, fsync: bool) -> None:
        self._path = path
        self._directory = os.path.dirname(path) or "."
        self._fsync = fsync
        make_private(path)  # pysyncobj created it with the umask's mode
        inner._FileJournal__metaStorer = _PrivateMetaStorer(path + ".meta", fsync=fsync)
        write_with_pwrite(inner)
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
        self._inner.onOneSecondTimer()  # the new FileJournal re-reads .meta: store pending changes
        new_path = self._path + COMPACTION_SUFFIX
        remove_leftovers(self._path)
        new_journal = FileJournal(new_path)  # reads (absent) new_path.meta, never writes it
        make_private(new_path)
        for entry in kept:
            new_journal.add(*entry)
        new_journal._destroy()  # sync + close
        self._inner._destroy()
        os.replace(new_path, self._path)
        if self._fsync:
            fsync_directory(self._directory)
        self._inner = _open(self._path, fsync=self._fsync)
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
