"""A single node ticks pysyncobj on its event loop (no tick thread); it syncs its journal there, or
in a sync thread of its own once a sync was slow, and never applies an entry before its sync; a
failed sync halts the log (a single node, and a cluster's leader)."""

from __future__ import annotations

import asyncio
import errno
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from runstate_server.cluster import LogConfig, LogUnavailable, ReplicatedLog, _journal
from tests._cluster_log_child import RecordingMachine
from tests._nodes import free_port
from tests.test_cluster_log import READY_TIMEOUT_S, applied_ids, eventually, running_log, three_logs

# How long a test holds a sync back (a slow disk); the propose it holds waits longer than that.
SYNC_HELD_S = 0.5
PROPOSE_WAIT_S = 10.0
ALWAYS_ON_THE_LOOP = LogConfig(loop_sync_s_max=float("inf"))
ALWAYS_IN_THE_SYNC_THREAD = LogConfig(loop_sync_s_max=0.0)


class ThreadRecordingMachine(RecordingMachine):
    """Records the thread each command is applied in."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def apply(self, command: dict[str, Any], now_ms: int, epoch: int) -> tuple[Any, list[Any]]:
        self.threads.add(threading.get_ident())
        return super().apply(command, now_ms, epoch)


def thread_names() -> list[str]:
    return [thread.name for thread in threading.enumerate()]


def held_sync(log: ReplicatedLog, monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[float]]:
    """Hold the log's journal syncs until the event is set (a slow disk); the list gets the time
    each one ended."""
    journal = log._journal
    assert journal is not None
    release = threading.Event()
    ended: list[float] = []
    sync = journal.sync

    def slow_sync() -> None:
        release.wait(READY_TIMEOUT_S)
        sync()
        ended.append(time.monotonic())

    monkeypatch.setattr(journal, "sync", slow_sync)
    return release, ended


def test_a_single_node_applies_on_its_event_loop_with_no_tick_thread(tmp_path: Path) -> None:
    async def scenario(data_dir: Path | None) -> None:
        machine = ThreadRecordingMachine()
        async with running_log(data_dir, state_machine=machine) as (log, _):
            assert log.ticks_on_loop
            results = await asyncio.gather(*(log.propose({"type": "add", "id": i}) for i in range(20)))
            assert [result["id"] for result in results] == list(range(20))
            assert machine.threads == {threading.get_ident()}
            assert not [name for name in thread_names() if name.startswith("raft-")]

    asyncio.run(scenario(None))
    asyncio.run(scenario(tmp_path))


def test_a_fast_sync_stays_on_the_loop_and_a_slow_one_goes_to_the_sync_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with running_log(tmp_path / "fast", config=ALWAYS_ON_THE_LOOP) as (log, machine):
            assert log._journal is not None
            syncs = log._journal.fsync_seconds.view().count
            await log.propose({"type": "add", "id": 1})
            assert log._journal.fsync_seconds.view().count > syncs  # synced, on the loop
            assert not [name for name in thread_names() if name.startswith("journal-sync-")]

        async with running_log(tmp_path / "slow", config=ALWAYS_IN_THE_SYNC_THREAD) as (log, machine):
            release, ended = held_sync(log, monkeypatch)
            proposed = asyncio.ensure_future(log.propose({"type": "add", "id": 1}, timeout_s=PROPOSE_WAIT_S))
            # The loop serves on while the sync is held: here it sleeps and wakes, many times.
            held_from = time.monotonic()
            while time.monotonic() - held_from < SYNC_HELD_S:
                await asyncio.sleep(0.01)
                assert applied_ids(log, machine) == []  # not before its sync
            assert not proposed.done()
            assert [name for name in thread_names() if name.startswith("journal-sync-")]
            release.set()
            assert (await proposed)["id"] == 1
            assert len(ended) == 1 and ended[0] >= held_from + SYNC_HELD_S

    asyncio.run(scenario())



def test_a_single_leader_commits_each_batch_as_it_is_proposed_with_no_tick(tmp_path: Path) -> None:
    """Sequential writes on a single node: each batch is appended, synced, committed and applied
    right after its flush (`_commit_alone`), in order, not by a tick; a sync that goes to the sync
    thread commits the ticks' way, the same."""

    async def scenario(data_dir: Path | None, config: LogConfig) -> tuple[int, int]:
        machine = ThreadRecordingMachine()
        async with running_log(data_dir, state_machine=machine, config=config) as (log, _):
            raft = log._raft
            assert raft is not None
            ticks = 0
            tick = raft.doTick

            def counted_tick(timeout_s: float = 0.0) -> None:
                nonlocal ticks
                ticks += 1
                tick(timeout_s)

            raft.doTick = counted_tick
            alone_before = log.counters.commits_alone
            for i in range(WRITES):
                result = await log.propose({"type": "add", "id": i})
                assert result["id"] == i
                assert applied_ids(log, machine)[-1] == i  # applied before its caller is answered
            assert applied_ids(log, machine)[-WRITES:] == list(range(WRITES))
            assert log.commit_index == log.applied_index
            return log.counters.commits_alone - alone_before, ticks

    WRITES = 30
    for data_dir in (None, tmp_path / "on-the-loop"):
        alone, _ = asyncio.run(scenario(data_dir, ALWAYS_ON_THE_LOOP))
        assert alone == WRITES
    alone, ticks = asyncio.run(scenario(tmp_path / "in-the-sync-thread", ALWAYS_IN_THE_SYNC_THREAD))
    assert alone == 0 and ticks >= WRITES  # each commit waited for the tick after its sync

def test_a_timed_out_propose_many_answers_each_unknown_and_frees_its_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every command of a call past its deadline is answered LogUnavailable (outcome unknown);
    its result, arriving late, is dropped, and the log goes on."""

    async def scenario() -> None:
        async with running_log(tmp_path, config=ALWAYS_IN_THE_SYNC_THREAD) as (log, machine):
            release, _ = held_sync(log, monkeypatch)
            outcomes = await log.propose_many([{"type": "add", "id": 1}, {"type": "add", "id": 2}], timeout_s=0.2)
            assert [type(outcome) for outcome in outcomes] == [LogUnavailable, LogUnavailable]
            assert "outcome is unknown" in str(outcomes[0])
            release.set()
            assert (await log.propose({"type": "add", "id": 3}))["id"] == 3
            assert applied_ids(log, machine) == [1, 2, 3]

    asyncio.run(scenario())


def failing_sync(monkeypatch: pytest.MonkeyPatch, journal: _journal.DurableJournal) -> None:
    """From now on the disk under `journal` fails every sync (EIO)."""
    inner = journal._inner
    sync = _journal.sync_without_the_gil

    def sync_or_fail(target: Any) -> None:
        if target is inner:
            raise OSError(errno.EIO, "Input/output error")
        sync(target)

    monkeypatch.setattr(_journal, "sync_without_the_gil", sync_or_fail)


async def fail_syncs_until_halted(log: ReplicatedLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk under `log` fails from now on: the next write is not acknowledged, the log halts
    (pysyncobj closed) and refuses every write after it."""
    assert log._journal is not None
    failing_sync(monkeypatch, log._journal)
    with pytest.raises(LogUnavailable, match="halted: cannot sync the Raft journal"):
        await log.propose({"type": "add", "id": 1_000}, timeout_s=PROPOSE_WAIT_S)  # answered at the halt
    await eventually(lambda: log._ticks_ended)
    with pytest.raises(LogUnavailable, match="halted: cannot sync the Raft journal"):
        await log.propose({"type": "add", "id": 1_001})


@pytest.mark.parametrize("config", [ALWAYS_ON_THE_LOOP, ALWAYS_IN_THE_SYNC_THREAD], ids=["on-the-loop", "sync-thread"])
def test_a_failed_sync_halts_a_single_node_and_nothing_after_it_is_applied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: LogConfig
) -> None:
    async def scenario() -> None:
        async with running_log(tmp_path, config=config) as (log, machine):
            await log.propose({"type": "add", "id": 1})
            await fail_syncs_until_halted(log, monkeypatch)
            assert applied_ids(log, machine) == [1]
            assert not log.is_leader and log.leader_address is None  # its node's health answers 503

    asyncio.run(scenario())


def test_a_cluster_leader_whose_sync_fails_halts_and_the_others_elect_a_leader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick thread's path: the leader's deferred sync fails inside a tick; without the halt
    its next tick would count the unsynced entry towards a commit."""

    async def scenario() -> None:
        async with three_logs(tmp_path) as (leader, followers):
            assert not leader.ticks_on_loop
            await fail_syncs_until_halted(leader, monkeypatch)
            await eventually(lambda: any(log.is_leader for log in followers))
            new_leader = next(log for log in followers if log.is_leader)
            assert (await new_leader.propose({"type": "add", "id": 3}))["id"] == 3

    asyncio.run(scenario())


def test_end_waits_answers_a_write_that_cannot_commit_at_once() -> None:
    """What a stopping node does after its grace (Node.stop): a write its followers will never
    acknowledge (they stopped) is answered now, outcome unknown, not at its timeout."""

    async def scenario() -> None:
        async with three_logs() as (leader, followers):
            for follower in followers:
                await follower.stop()
            proposed = asyncio.ensure_future(leader.propose({"type": "add", "id": 1}, timeout_s=PROPOSE_WAIT_S))
            await eventually(lambda: bool(leader._in_flight))
            ended_at = time.monotonic()
            leader.end_waits()
            with pytest.raises(LogUnavailable, match="the outcome is unknown"):
                await proposed
            assert time.monotonic() - ended_at < PROPOSE_WAIT_S / 2
            with pytest.raises(LogUnavailable, match="stopping"):
                await leader.propose({"type": "add", "id": 2})

    asyncio.run(scenario())


def test_a_leader_that_steps_down_answers_its_writes_in_flight_at_once() -> None:
    """Check-quorum deposes a leader whose followers stopped answering (a partition): its writes
    in flight answer then, outcome unknown (their entries may still be committed by a new
    leader), instead of at their timeout; pysyncobj would call them back only once this node
    applies their index again, after the partition heals."""

    async def scenario() -> None:
        async with three_logs() as (leader, followers):
            for follower in followers:
                await follower.stop()
            proposed_at = time.monotonic()
            with pytest.raises(LogUnavailable, match="stopped leading; the outcome is unknown"):
                await leader.propose({"type": "add", "id": 1}, timeout_s=PROPOSE_WAIT_S)
            assert time.monotonic() - proposed_at < PROPOSE_WAIT_S / 2
            assert not leader.is_leader

    asyncio.run(scenario())


class OlderMachine(RecordingMachine):
    """A state machine of an older release: it does not know the command type "future"."""

    def unknown_kind(self, command: Any) -> str | None:
        return "command type 'future'" if command.get("type") == "future" else None


def test_a_committed_command_this_release_does_not_know_halts_the_log_before_its_batch(tmp_path: Path) -> None:
    """Refusing it while the newer replicas apply it would part this replica's state from theirs
    (a node downgraded after the cluster wrote a newer kind: cluster/DESIGN.md, "Command levels")."""

    async def scenario() -> None:
        async with running_log(tmp_path, state_machine=OlderMachine()) as (log, machine):
            await log.propose({"type": "add", "id": 1})
            outcomes = await log.propose_many([{"type": "add", "id": 2}, {"type": "future", "id": 3}],
                                              timeout_s=PROPOSE_WAIT_S)
            assert all(isinstance(outcome, LogUnavailable) for outcome in outcomes), outcomes
            await eventually(lambda: log._ticks_ended)
            assert applied_ids(log, machine) == [1]  # nothing of the batch that holds it
            with pytest.raises(LogUnavailable, match="halted: a committed command has a command type 'future'"):
                await log.propose({"type": "add", "id": 4})

    asyncio.run(scenario())


def test_a_follower_of_an_older_release_halts_and_the_others_go_on() -> None:
    async def scenario() -> None:
        addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        machines = [RecordingMachine(), RecordingMachine(), OlderMachine()]
        logs = [ReplicatedLog(machine, self_address=address, peer_addresses=addresses, data_dir=None,
                              password="cluster-password")
                for machine, address in zip(machines, addresses, strict=True)]
        try:
            for log in logs[:2]:  # a leader of this release first; the older one joins it
                await log.start()
            await eventually(lambda: any(log.is_leader for log in logs[:2]))
            await logs[2].start()
            await logs[2].wait_ready(READY_TIMEOUT_S)
            leader = next(log for log in logs if log.is_leader)
            assert (await leader.propose({"type": "future", "id": 1}, timeout_s=PROPOSE_WAIT_S))["id"] == 1
            await eventually(lambda: logs[2]._ticks_ended)
            assert logs[2]._halt_reason is not None and "command type 'future'" in logs[2]._halt_reason
            assert (await leader.propose({"type": "add", "id": 2}, timeout_s=PROPOSE_WAIT_S))["id"] == 2
            assert [entry["id"] for entry in machines[2].applied if entry["id"] in (1, 2)] == []
        finally:
            for log in logs:
                await log.stop()

    asyncio.run(scenario())
