"""A data dir made from a backup (`runstate restore`, node/backup.py; README "Backups and restore").

`write_restored` writes, into a directory nothing else has open, the two files a node starts from:

- `raft.dump`: the backup's state, as any dump (snapshot.py), its log entries the backup's two
  no-ops, its configuration the new cluster's first voter (or none, for `runstate dev`); and
- the journal, empty, with the backup's term as the current term. pysyncobj takes its term from
  the journal, not the dump: a node starting at term 0 would lead at term 1, below the term of the
  dump's entries and of the state's epoch, so the state would refuse its ticks (STALE_EPOCH) and
  keep every lease as it was. From the backup's term its first election leads at a higher one, and
  its `leader.start` re-arms every live lease from then (dispatch._leader_start).
"""

from __future__ import annotations

from pathlib import Path

from runstate_server.cluster import _journal
from runstate_server.cluster.log import DUMP_FILE_NAME, JOURNAL_FILE_NAME
from runstate_server.cluster.snapshot import Dump, encode_dump, fsync_directory, write_file


def write_restored(data_dir: Path, dump: Dump, term: int, *, fsync: bool) -> None:
    """Write `dump` and an empty journal at `term` into `data_dir` (which exists and is empty)."""
    write_file(str(data_dir / DUMP_FILE_NAME), encode_dump(dump), fsync=fsync)
    journal = _journal._open(str(data_dir / JOURNAL_FILE_NAME), fsync=fsync)
    try:
        journal.setCurrentTerm(term, None)  # stored (and synced) at once
    finally:
        journal._destroy()
    if fsync:
        fsync_directory(str(data_dir))
