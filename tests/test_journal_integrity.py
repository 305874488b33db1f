"""Checksums on what a node writes (cluster/DESIGN.md "Checksums and damaged data"): each journal
record and the dump carry one, files of the release before still load, and a dev node cuts off a
torn last record but refuses to start on a record damaged before the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
from pysyncobj.journal import FileJournal

from runstate_server.cluster._catch_up import CatchUp
from runstate_server.cluster._journal import (
    HEADER_BYTES,
    JournalDamaged,
    RecordJournal,
    scan,
    scan_file,
)
from runstate_server.cluster.log import JOURNAL_FILE_NAME
from runstate_server.cluster.snapshot import (
    CHECKSUMMED_PREFIX_BYTES,
    Dump,
    DumpFormatError,
    decode_dump,
    encode_dump,
)
from tests._http import Api, mailbox_id, task_ok
from tests._nodes import DevNode

ENTRIES = [(f"command {index} ".encode() * 5, index, 1 + index // 4) for index in range(1, 9)]


def written(path: Path, entries: list[tuple[bytes, int, int]] = ENTRIES) -> bytes:
    journal = RecordJournal(str(path))
    for entry in entries:
        journal.add(*entry)
    journal._destroy()
    return path.read_bytes()


def flipped(data: bytes, offset: int) -> bytes:
    damaged = bytearray(data)
    damaged[offset] ^= 0x10
    return bytes(damaged)


def test_every_byte_of_every_record_but_the_last_is_checked(tmp_path: Path) -> None:
    """A flipped bit anywhere in a record before the last (its lengths, index, term, command or
    checksum) stops the read at that record's offset; anywhere in the last record it is a torn
    write, cut off. The file's own end is where the header says."""
    path = tmp_path / "raft.journal"
    data = written(path)
    found = scan(data, str(path))
    assert (found.format, found.entries, found.torn_at) == (2, ENTRIES, None)
    last = found.offsets[-1]
    for offset in range(HEADER_BYTES, found.end):
        record = max(start for start in found.offsets if start <= offset)
        if record == last:
            cut = scan(flipped(data, offset), str(path))
            assert (cut.entries, cut.end, cut.torn_at) == (ENTRIES[:-1], last, last), offset
            continue
        with pytest.raises(JournalDamaged) as damaged:
            scan(flipped(data, offset), str(path))
        assert damaged.value.offset == record, offset
        assert f"{path} is damaged at byte {record}" in str(damaged.value)


def test_a_journal_cut_short_inside_its_last_record_loses_that_record_only(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    data = written(path)
    whole = scan(data, str(path))
    last = whole.offsets[-1]
    for cut_at in (last + 4, last + 5, last + 30, whole.end - 1):  # its length field whole
        found = scan(data[:cut_at], str(path))
        assert (found.entries, found.torn_at) == (ENTRIES[:-1], last)
    # Cut inside an earlier record: more than a torn write lost (a record whose length says more follow).
    with pytest.raises(JournalDamaged, match="file ends"):
        scan(data[:scan(data, str(path)).offsets[3] + 30], str(path))


def test_a_reopened_journal_with_a_torn_tail_appends_where_it_was_cut(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    data = written(path)
    last = scan(data, str(path)).offsets[-1]
    path.write_bytes(data[:last + 7])
    journal = RecordJournal(str(path))
    assert len(journal) == len(ENTRIES) - 1
    journal.add(b"after the crash", ENTRIES[-1][1], ENTRIES[-1][2])
    journal._destroy()
    assert scan_file(str(path)).entries == [*ENTRIES[:-1], (b"after the crash", ENTRIES[-1][1], ENTRIES[-1][2])]


def test_indexes_that_skip_or_terms_that_go_back_are_damage(tmp_path: Path) -> None:
    path = tmp_path / "raft.journal"
    data = written(path, [(b"a", 1, 1), (b"b", 3, 1), (b"c", 4, 1)])
    with pytest.raises(JournalDamaged, match="index 3 does not follow 1"):
        scan(data, str(path))
    data = written(tmp_path / "terms.journal", [(b"a", 1, 2), (b"b", 2, 1), (b"c", 3, 2)])
    with pytest.raises(JournalDamaged, match="term 1 is below"):
        scan(data, str(path))


def test_a_journal_of_the_release_before_loads_and_is_rewritten_with_checksums(tmp_path: Path) -> None:
    """pysyncobj's own FileJournal wrote the release before's journals (format 1, no checksum): read
    as before (its torn last record cut off too), then rewritten in format 2."""
    path = tmp_path / "raft.journal"
    old = FileJournal(str(path))
    for entry in ENTRIES:
        old.add(*entry)
    old._destroy()
    assert scan_file(str(path)).format == 1
    journal = RecordJournal(str(path))
    assert [tuple(journal[position]) for position in range(len(journal))] == ENTRIES
    journal._destroy()
    assert (scan_file(str(path)).format, scan_file(str(path)).entries) == (2, ENTRIES)


def test_a_dump_carries_a_checksum_of_its_whole_content() -> None:
    dump = Dump({"tasks": {"t1": {"input": "x" * 100}}}, (b"last", 9, 2), (b"prev", 8, 2), ["127.0.0.1:1"],
                {"127.0.0.1:1": {"id": "n1", "apiUrl": "http://127.0.0.1:2"}})
    data = encode_dump(dump)
    assert decode_dump(data) == dump
    for offset in range(len(data)):  # every flipped byte is refused
        with pytest.raises(DumpFormatError) as refused:
            decode_dump(flipped(data, offset))
        if offset >= CHECKSUMMED_PREFIX_BYTES:
            assert refused.value.offset == CHECKSUMMED_PREFIX_BYTES and "checksum mismatch" in str(refused.value)
    with pytest.raises(DumpFormatError, match="inside its checksum"):
        decode_dump(data[:11])
    # The release before reads it: a map with "v" 1, "state" and "raft" (it ignores "sum").
    document = msgpack.unpackb(data, raw=False, strict_map_key=False)
    assert (document["v"], document["state"], document["raft"]["last"]) == (1, dump.state, [b"last", 9, 2])


def test_a_dump_of_the_release_before_still_loads() -> None:
    raft = {"last": [b"last", 9, 2], "prev": [b"prev", 8, 2], "cluster": ["127.0.0.1:1"]}
    old = msgpack.packb({"v": 1, "state": {"a": 1}, "raft": raft}, use_bin_type=True)
    assert decode_dump(old) == Dump({"a": 1}, (b"last", 9, 2), (b"prev", 8, 2), ["127.0.0.1:1"])
    with pytest.raises(DumpFormatError, match="unsupported dump version 2"):
        decode_dump(msgpack.packb({"v": 2, "state": {}}))
    with pytest.raises(DumpFormatError, match="without a checksum"):
        decode_dump(msgpack.packb({"v": 1, "state": {}, "other": raft}, use_bin_type=True))
    with pytest.raises(DumpFormatError, match="not a dump this release reads"):
        decode_dump(msgpack.packb({"v": 1, "state": {}, "raft": raft, "other": 1}, use_bin_type=True))


class _Raft:
    def __init__(self) -> None:
        self.term, self.commit, self.applied, self.leader_node = 3, 0, 0, "leader"

    def current_term(self) -> int:
        return self.term

    def commit_index(self) -> int:
        return self.commit

    def applied_index(self) -> int:
        return self.applied

    def leader(self) -> str | None:
        return self.leader_node


def test_a_node_catching_up_drops_votes_until_it_holds_what_the_leader_may_count_it_for(tmp_path: Path) -> None:
    marker = tmp_path / "raft.catching-up"
    CatchUp.mark(str(marker), fsync=True)
    catch_up, raft = CatchUp(str(marker), fsync=True), _Raft()
    for kind in ("request_vote", "timeout_now", "runstate_pre_vote"):
        assert catch_up.on_message(raft, {"type": kind, "term": 9})
    assert not catch_up.caught_up(raft)  # no leader heard from yet
    # The leader's first append after the restart: its next index for this node was 40, commit 30.
    assert not catch_up.on_message(raft, {"type": "append_entries", "term": 3, "commit_index": 30, "prevLogIdx": 40})
    assert not catch_up.on_message(raft, {"type": "append_entries", "term": 3, "commit_index": 31, "prevLogIdx": 1})
    raft.commit = raft.applied = 39
    assert not catch_up.caught_up(raft) and marker.exists()
    raft.commit = raft.applied = 40
    assert catch_up.caught_up(raft) and not marker.exists()


def test_a_new_leaders_term_sets_a_new_target(tmp_path: Path) -> None:
    catch_up, raft = CatchUp(str(tmp_path / "marker"), fsync=False), _Raft()
    catch_up.on_message(raft, {"type": "append_entries", "term": 3, "commit_index": 5, "serialized": b"..."})
    raft.term = 4
    raft.commit = raft.applied = 5
    assert not catch_up.caught_up(raft)  # the target was for term 3
    catch_up.on_message(raft, {"type": "append_entries", "term": 4, "commit_index": 7, "prevLogIdx": 12})
    raft.commit = raft.applied = 12
    assert catch_up.caught_up(raft)


# A dev node on a real data dir, killed with -9 and its journal changed on disk.


def _submit(node: DevNode, count: int) -> list[str]:
    """`count` tasks, one acknowledged write each (one journal record each, or more)."""
    api = Api(node.url)
    run_id = str(api.ok("POST", "/v1/scopes", {})["id"])
    mailbox_id(api)
    return [str(task_ok(api, run_id, {"input": {"n": n}, "key": f"k{n}"})["id"]) for n in range(count)]


def test_a_dev_node_whose_journal_is_cut_inside_its_last_record_serves_everything_before_it(tmp_path: Path) -> None:
    node = DevNode(tmp_path / "data").start()
    try:
        tasks = _submit(node, 12)
        node.kill()
        journal = tmp_path / "data" / JOURNAL_FILE_NAME
        found = scan_file(str(journal))
        last = found.offsets[-1]
        # The last record is the entry of the last acknowledged submit's batch or after it: cut in
        # its middle, the node loses at most that entry (which was never acknowledged if the
        # write was torn by a crash; here it was, so the last task may be gone).
        os.truncate(journal, last + (found.end - last) // 2)
        node.start()
        api = Api(node.url)
        survivors = [task for task in tasks if api("GET", f"/v1/tasks/{task}")[0] == 200]
        assert survivors == tasks[:len(survivors)] and len(survivors) >= len(tasks) - 1
        assert "ends with a torn record at byte" in node.log()
    finally:
        node.kill()


def test_a_dev_node_refuses_to_start_on_a_record_damaged_before_the_end(tmp_path: Path) -> None:
    node = DevNode(tmp_path / "data", "--compact-after", "1000").start()
    try:
        _submit(node, 6)
    finally:
        node.kill()
    journal = tmp_path / "data" / JOURNAL_FILE_NAME
    offset = scan_file(str(journal)).offsets[2]
    journal.write_bytes(flipped(journal.read_bytes(), offset + 30))
    command = [sys.executable, "-m", "runstate_server.node.cli", "dev", "--port", str(node.port),
               "--data-dir", str(tmp_path / "data")]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert finished.returncode == 1
    lines = finished.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in finished.stderr, finished.stderr
    assert f"the Raft journal {journal} is damaged at byte {offset}" in lines[0]
    assert "restore the data dir from a backup" in lines[0]
