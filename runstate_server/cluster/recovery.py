"""Recovery after losing a majority: a survivor's data dir made the only voter of a new cluster
(`runstate node --force-new-cluster`; DESIGN.md "Membership").

`force_alone` rewrites the data dir before its node starts, while nothing else has it open:

- the dump's configuration becomes this node alone (its names kept), and
- every membership entry of the journal becomes a no-op entry at the same index and term, so that
  neither the load nor the commit of the journal's tail brings the old members back.

Every other entry stays: the node, the only voter, commits its whole log once it leads (etcd's
`--force-new-cluster` keeps the survivor's log the same way). What the lost majority acknowledged
and this node never received is gone; what it received and the others had not committed is kept.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from runstate_server.cluster import _journal
from runstate_server.cluster._pysyncobj import COMMAND_TYPE
from runstate_server.cluster.membership import Member, names_by_address
from runstate_server.cluster.snapshot import decode_dump, encode_dump, fsync_directory, write_file

MEMBERSHIP_ENTRY = bytes([COMMAND_TYPE.MEMBERSHIP])
NO_OP_ENTRY = bytes([COMMAND_TYPE.NO_OP])


class NoData(Exception):
    """The data dir holds no node's data: there is nothing to recover."""


@dataclass(frozen=True, slots=True)
class Kept:
    """What the forced node keeps: its log up to `last_index` (of `last_term`), from a snapshot at
    `dump_index` (0: none); `membership_entries` membership entries made no-ops."""

    last_index: int
    last_term: int
    dump_index: int
    membership_entries: int


def force_alone(journal_path: Path, dump_path: Path, member: Member, *, fsync: bool) -> Kept:
    """Make the data dir of `journal_path` and `dump_path` that of a one-voter cluster, `member`."""
    has_journal, has_dump = journal_path.exists(), dump_path.exists()
    if not has_journal and not has_dump:
        raise NoData(f"{journal_path.parent} holds no node's data (no {journal_path.name}, no {dump_path.name})")
    dump_index = 0
    last: tuple[int, int] = (0, 0)
    if has_dump:
        dump = decode_dump(dump_path.read_bytes())
        dump_index = dump.last[1]
        last = (dump.last[1], dump.last[2])
        alone = replace(dump, cluster=[member.address], members=names_by_address([member]))
        writing = str(dump_path) + ".forcing"
        write_file(writing, encode_dump(alone), fsync=fsync)
        os.replace(writing, dump_path)
        if fsync:
            fsync_directory(str(dump_path.parent))
    made_no_ops = 0
    if has_journal:
        journal = _journal._open(str(journal_path), fsync=fsync)
        try:
            entries = [journal[position] for position in range(len(journal))]
            first = next((position for position, entry in enumerate(entries) if entry[0][:1] == MEMBERSHIP_ENTRY), None)
            if first is not None:
                journal.deleteEntriesFrom(first)
                for command, index, term in entries[first:]:
                    if command[:1] == MEMBERSHIP_ENTRY:
                        command = NO_OP_ENTRY
                        made_no_ops += 1
                    journal.add(command, index, term)
            if entries:
                last = max(last, (entries[-1][1], entries[-1][2]))
        finally:
            journal._destroy()  # syncs the file (JournalFile) and closes it
    return Kept(last[0], last[1], dump_index, made_no_ops)
