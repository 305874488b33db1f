"""The durable journal keeps what a follower acknowledged: pysyncobj's delete-and-re-append of
matching entries only hides the suffix; a real conflict truncates it."""

from __future__ import annotations

from pathlib import Path

import pytest

from runstate_server.cluster._journal import DurableJournal, JournalFile, RecordJournal, scan_file


def entries(count: int, term: int = 1) -> list[tuple[bytes, int, int]]:
    return [(f"cmd-{index}".encode(), index, term) for index in range(1, count + 1)]


def open_journal(path: Path) -> DurableJournal:
    return DurableJournal(RecordJournal(str(path)), str(path), fsync=True)


def on_disk(path: Path) -> list[tuple[bytes, int, int]]:
    return scan_file(str(path)).entries  # every record checked (checksums, sequence)


def test_re_appending_matching_entries_writes_nothing_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    journal = open_journal(path)
    for entry in entries(5):
        journal.add(*entry)
    journal.deleteEntriesFrom(2)  # what pysyncobj does on an overlapping append
    assert (len(journal), journal[-1][1]) == (2, 2)
    assert on_disk(path) == entries(5)  # a crash now loses nothing that was acknowledged
    journal.add(*entries(5)[2])  # the leader resends the same entry
    assert (len(journal), journal.skipped_rewrites) == (3, 1)
    assert journal[1:3] == entries(5)[1:3]
    for entry in entries(5)[3:]:
        journal.add(*entry)
    assert len(journal) == 5 and journal[-1] == entries(5)[-1]
    journal.add(b"cmd-6", 6, 1)  # past the end: an ordinary append
    assert on_disk(path)[-1] == (b"cmd-6", 6, 1)
    journal._destroy()


def test_a_conflicting_entry_truncates_the_disk_there(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    journal = open_journal(path)
    for entry in entries(5):
        journal.add(*entry)
    journal.deleteEntriesFrom(3)
    journal.add(b"other", 4, 2)  # a new leader's entry at index 4: a conflict
    assert len(journal) == 4
    assert on_disk(path) == [*entries(5)[:3], (b"other", 4, 2)]
    journal._destroy()


def test_compaction_keeps_hidden_entries_hidden(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    journal = open_journal(path)
    for entry in entries(6):
        journal.add(*entry)
    journal.deleteEntriesFrom(4)
    journal.deleteEntriesTo(2)  # compaction drops the first two
    assert [entry[1] for entry in journal[0:len(journal)]] == [3, 4]
    journal.add(*entries(6)[4])  # resent: shown again without a write
    assert [entry[1] for entry in journal[0:len(journal)]] == [3, 4, 5]
    assert [entry[1] for entry in on_disk(path)] == [3, 4, 5, 6]
    journal.clear()
    assert len(journal) == 0
    journal._destroy()


def test_committed_entries_stay_visible_when_pysyncobj_truncates_an_overlap(tmp_path: Path) -> None:
    """pysyncobj's follower deletes everything after prevLogIdx on an overlapping append, even
    entries it has applied (it logs "truncating already-applied log entries"). Hiding committed
    ones would let this node's log, as pysyncobj sees it, end below its commit index: two such
    followers could then elect one of themselves without entries a majority committed."""
    path = tmp_path / "raft.journal"
    journal = open_journal(path)
    for entry in entries(10):
        journal.add(*entry)
    journal.setRaftCommitIndex(8)
    journal.deleteEntriesFrom(5)  # an append with prevLogIdx 5 carrying entries 6 and 7
    assert len(journal) == 8  # 9 and 10 (not known committed) hidden; 1..8 stay
    for entry in entries(10)[5:7]:
        journal.add(*entry)  # re-appended committed entries: checked equal, nothing written
    assert (len(journal), journal.skipped_rewrites) == (8, 2)
    journal.add(*entries(10)[7])  # entry 8 again (the next append), then the hidden 9 re-shown
    journal.add(*entries(10)[8])
    assert len(journal) == 9 and journal[-1] == entries(10)[8]
    journal.deleteEntriesFrom(6)
    with pytest.raises(AssertionError, match="committed entry 7 conflicts"):
        journal.add(b"other", 7, 2)  # Raft never lets a committed entry change: a bug, loudly
    assert on_disk(path) == entries(10)
    journal._destroy()


def test_a_leaders_deferred_appends_are_synced_once_when_the_block_ends(tmp_path: Path) -> None:
    """The leader sends its new entries before it syncs its own copy (RaftNode._checkCommandsToApply):
    inside deferred_flush() appends are written but synced once, at the end, even when it raises;
    outside it every append is synced before it returns."""
    path = tmp_path / "raft.journal"
    journal = open_journal(path)
    syncs = journal.fsync_seconds.view().count
    journal.add(*entries(1)[0])
    assert journal.fsync_seconds.view().count == syncs + 1
    with journal.deferred_flush():
        for entry in entries(3)[1:]:
            journal.add(*entry)
        assert journal.fsync_seconds.view().count == syncs + 1  # written, not synced yet
    assert journal.fsync_seconds.view().count == syncs + 2  # one sync for both
    with pytest.raises(RuntimeError), journal.deferred_flush():
        journal.add(b"cmd-4", 4, 1)
        raise RuntimeError("the tick failed halfway")
    assert journal.fsync_seconds.view().count == syncs + 3
    with journal.deferred_flush():
        pass  # nothing appended: nothing to sync
    assert journal.fsync_seconds.view().count == syncs + 3
    assert on_disk(path) == [*entries(3), (b"cmd-4", 4, 1)]
    journal._destroy()


def test_appends_go_through_pwrite_and_the_file_reads_back_after_growing_and_truncating(tmp_path: Path) -> None:
    """The journal writes its file with pwrite (JournalFile), growing it ahead of the records,
    several times; a conflict's truncation moves the end back; a reopened journal reads exactly
    the records kept, each checked (tests/test_journal_integrity.py checks the format itself)."""
    path = tmp_path / "raft.journal"
    journal = open_journal(path)
    assert isinstance(journal._inner._file, JournalFile)
    written = [(f"cmd-{index}-".encode() + bytes(index % 251 for _ in range(index)), index, 1) for index in range(1, 301)]
    for entry in written:
        journal.add(*entry)
    journal._inner.deleteEntriesFrom(250)
    journal.add(b"other", 251, 2)
    journal._destroy()
    assert path.stat().st_size > 16 * 1024  # grown from 1 KiB, several times
    assert on_disk(path) == [*written[:250], (b"other", 251, 2)]
    reopened = RecordJournal(str(path))
    assert [tuple(reopened[position]) for position in range(len(reopened))] == on_disk(path)
    reopened._destroy()
