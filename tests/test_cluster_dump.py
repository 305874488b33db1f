"""The Raft dump is written by a forked child: however long the state takes to copy and write, the
log keeps committing (the tick thread, which sends the leader's heartbeats, never waits for it)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from runstate_server.cluster import LogConfig
from runstate_server.cluster.log import DUMP_FILE_NAME
from runstate_server.cluster.snapshot import decode_dump
from tests._cluster_log_child import RecordingMachine
from tests.test_cluster_log import applied_ids, eventually, running_log

COMPACT_AFTER = 10
HOLD_TIMEOUT_S = 30.0  # the longest a held snapshot waits for the test to let it go
PROPOSE_TIMEOUT_S = 5.0


class HeldSnapshotMachine(RecordingMachine):
    """snapshot() writes its process id to `started`, then waits until `release` exists."""

    def __init__(self, started: Path, release: Path) -> None:
        super().__init__()
        self.started = started
        self.release = release

    def snapshot(self) -> dict[str, Any]:
        partial = self.started.with_suffix(".partial")
        partial.write_text(str(os.getpid()))
        partial.replace(self.started)  # the test sees the whole pid or nothing
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while not self.release.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test never released the snapshot")
            time.sleep(0.01)
        return super().snapshot()


async def propose_until_a_dump_starts(log: Any, started: Path) -> int:
    """Propose commands until a compaction's child runs its (held) snapshot; how many were proposed.
    Past the compaction threshold it only waits: the child runs at nice 10 and may be scheduled
    late on a busy machine."""
    command_id = 0
    while not started.exists():
        if command_id > 2 * COMPACT_AFTER:
            await eventually(started.exists)
            break
        await log.propose({"type": "add", "id": command_id}, timeout_s=PROPOSE_TIMEOUT_S)
        command_id += 1
    return command_id


def test_the_log_commits_while_a_dump_is_being_written(tmp_path: Path) -> None:
    data_dir, started, release = tmp_path / "data", tmp_path / "started", tmp_path / "release"
    config = LogConfig(log_compaction_entries_min=COMPACT_AFTER)

    async def scenario() -> None:
        machine = HeldSnapshotMachine(started, release)
        async with running_log(data_dir, config=config, state_machine=machine) as (log, _):
            command_id = await propose_until_a_dump_starts(log, started)
            assert int(started.read_text()) != os.getpid(), "the snapshot was taken in the node's own process"
            # The dump is held open: the log must go on committing meanwhile.
            for _ in range(5 * COMPACT_AFTER):
                await log.propose({"type": "add", "id": command_id}, timeout_s=PROPOSE_TIMEOUT_S)
                command_id += 1
            assert not (data_dir / DUMP_FILE_NAME).exists()
            release.touch()
            await eventually(lambda: (data_dir / DUMP_FILE_NAME).exists())
            dump = decode_dump((data_dir / DUMP_FILE_NAME).read_bytes())
            # The dump holds the state as it was at the fork, not what was applied after it.
            dumped = [entry["id"] for entry in dump.state["applied"]]
            assert 0 < len(dumped) < command_id and dumped == list(range(len(dumped)))
            assert list(data_dir.glob("*.writing")) == []
            # Then the journal drops the entries the dump holds: compaction keeps it bounded.
            journal = log._journal
            assert journal is not None
            await eventually(lambda: len(journal) < command_id)
        # A restart reads the dump and replays the journal after it.
        async with running_log(data_dir, config=config) as (log, machine):
            assert applied_ids(log, machine) == list(range(command_id))

    asyncio.run(scenario())


def test_stopping_during_a_dump_kills_the_child_and_keeps_the_old_files(tmp_path: Path) -> None:
    data_dir, started, release = tmp_path / "data", tmp_path / "started", tmp_path / "release"
    config = LogConfig(log_compaction_entries_min=COMPACT_AFTER)

    async def scenario() -> int:
        machine = HeldSnapshotMachine(started, release)
        async with running_log(data_dir, config=config, state_machine=machine) as (log, _):
            command_id = await propose_until_a_dump_starts(log, started)
        return command_id

    proposed = asyncio.run(scenario())
    child = int(started.read_text())
    assert not Path(f"/proc/{child}").exists(), "the dump child outlived the log"
    assert not (data_dir / DUMP_FILE_NAME).exists() and list(data_dir.glob("*.writing")) == []

    async def restart() -> None:
        async with running_log(data_dir, config=config) as (log, machine):
            assert applied_ids(log, machine) == list(range(proposed))

    asyncio.run(restart())
