"""ReplicatedLog in-process: results, coalescing, failing commands, time, effects, leadership."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pysyncobj.pickle import loads as pysyncobj_loads
from pysyncobj.transport import TCPTransport

from runstate_server.cluster import LogConfig, LogUnavailable, NotLeader, ReplicatedLog
from runstate_server.cluster._frame_cipher import FRAMES_FERNET
from runstate_server.cluster._journal import scan_file
from runstate_server.cluster._transport import LEVEL, BoundedTransport
from runstate_server.cluster.codec import decode_batch
from runstate_server.cluster.log import DUMP_FILE_NAME, FOLLOWER_EFFECTS_HANDOFF_S, JOURNAL_FILE_NAME
from runstate_server.cluster.snapshot import Dump, encode_dump
from tests._cluster_log_child import RecordingMachine
from tests._nodes import free_port

READY_TIMEOUT_S = 15.0
# Fernet frames a node of this release seals to peers of this release: those before the peer's level
# arrives on each of its two connections, reconnections included (a handful each).
FERNET_FRAMES_PER_NODE_MAX = 40


@contextlib.asynccontextmanager
async def running_log(
    data_dir: Path | None = None, *, ready: bool = True, state_machine: RecordingMachine | None = None, **options: Any
) -> AsyncIterator[tuple[ReplicatedLog, RecordingMachine]]:
    machine = state_machine or RecordingMachine()
    log = ReplicatedLog(
        machine,
        self_address=options.pop("self_address", None) or f"127.0.0.1:{free_port()}",
        data_dir=data_dir,
        password="test-password",
        **options,
    )
    await log.start()
    try:
        if ready:
            await log.wait_ready(READY_TIMEOUT_S)
        yield log, machine
    finally:
        await log.stop()


@contextlib.asynccontextmanager
async def three_logs(
    data_root: Path | None = None, sinks: list[list[Any]] | None = None,
) -> AsyncIterator[tuple[ReplicatedLog, list[ReplicatedLog]]]:
    """Three in-process logs of one cluster, once one leads and reads by index (it applied its
    no-op): (leader, followers). With `data_root` each journals in a directory of its own there;
    with `sinks` (three lists) each log's applied effects are added to one of them."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    logs = [
        ReplicatedLog(RecordingMachine(), self_address=address, peer_addresses=addresses,
                      data_dir=None if data_root is None else data_root / str(index), password="cluster-password",
                      on_applied=None if sinks is None else sinks[index].extend)
        for index, address in enumerate(addresses)
    ]
    try:
        for log in logs:
            await log.start()
        await asyncio.gather(*(log.wait_ready(READY_TIMEOUT_S) for log in logs))
        await eventually(lambda: sum(log.reads_by_index() for log in logs) == 1)
        leader = next(log for log in logs if log.is_leader)
        yield leader, [log for log in logs if log is not leader]
    finally:
        for log in logs:
            await log.stop()


def applied_ids(log: ReplicatedLog, machine: RecordingMachine) -> list[int]:
    with log.lock:
        return [entry["id"] for entry in machine.applied]


async def eventually(condition: Callable[[], bool], timeout_s: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def test_propose_returns_each_commands_result() -> None:
    role_changes: list[int] = []

    async def scenario() -> None:
        async with running_log(on_role_change=lambda: role_changes.append(threading.get_ident())) as (
            log,
            machine,
        ):
            assert log.is_leader and log.role == "leader" and log.leader_address == log.self_address
            await eventually(lambda: role_changes == [threading.get_ident()])  # became leader, on the loop
            for command_id in range(5):
                result = await log.propose({"type": "set", "id": command_id, "key": "k", "value": command_id})
                assert result == {"id": command_id, "position": command_id + 1}
            with log.lock:
                assert machine.values == {"k": 4}
            await eventually(lambda: log.applied_index == log.commit_index)

    asyncio.run(scenario())


def test_concurrent_proposes_are_coalesced_and_answered_in_order() -> None:
    async def scenario() -> None:
        async with running_log() as (log, machine):
            batches_before = log.counters.batches_proposed
            results = await asyncio.gather(*(log.propose({"type": "add", "id": i}) for i in range(500)))
            batches = log.counters.batches_proposed - batches_before
            assert batches <= 5, f"500 concurrent proposes took {batches} batches"
            assert [result["id"] for result in results] == list(range(500))
            assert applied_ids(log, machine) == list(range(500))
            positions = [result["position"] for result in results]
            assert positions == sorted(positions)

    asyncio.run(scenario())


def test_a_failing_command_answers_internal_and_the_log_goes_on() -> None:
    async def scenario() -> None:
        async with running_log() as (log, machine):
            before, failing, after = await asyncio.gather(
                log.propose({"type": "add", "id": 1}),
                log.propose({"type": "boom", "id": 2}),
                log.propose({"type": "add", "id": 3}),
            )
            assert before["id"] == 1 and after["id"] == 3
            assert failing["error"]["code"] == "INTERNAL"
            assert "boom" in failing["error"]["message"]
            assert (await log.propose({"type": "add", "id": 4}))["id"] == 4
            assert applied_ids(log, machine) == [1, 3, 4]
            assert log.counters.commands_failed_internal == 1

    asyncio.run(scenario())


def test_propose_many_answers_each_command_in_order_in_one_batch() -> None:
    async def scenario() -> None:
        async with running_log() as (log, machine):
            batches_before = log.counters.batches_proposed
            commands: list[dict[str, Any]] = [
                {"type": "add", "id": 1}, {"type": "boom", "id": 2}, {"type": "add", "id": object()},
                {"type": "add", "id": 1 << 70}, {"type": "add", "id": 5},
            ]
            first, failing, unencodable, too_big, last = await log.propose_many(commands)
            assert log.counters.batches_proposed - batches_before == 1
            assert first == {"id": 1, "position": 1} and last == {"id": 5, "position": 2}
            assert failing["error"]["code"] == "INTERNAL"
            assert isinstance(unencodable, TypeError) and isinstance(too_big, ValueError)
            assert applied_ids(log, machine) == [1, 5]
            [alone] = await log.propose_many([{"type": "add", "id": object()}])  # nothing to wait for
            assert isinstance(alone, TypeError)

    asyncio.run(scenario())


def test_now_ms_never_goes_backwards_and_epoch_is_the_term() -> None:
    async def scenario() -> None:
        async with running_log() as (log, machine):
            ahead_ms = int(time.time() * 1000) + 3_600_000
            with log.lock:
                machine.clock_ms = ahead_ms  # a replicated clock ahead of this host's clock
            for round_number in range(5):
                await asyncio.gather(
                    *(log.propose({"type": "add", "id": round_number * 10 + i}) for i in range(10))
                )
            with log.lock:
                stamps = [entry["now_ms"] for entry in machine.applied]
                epochs = {entry["epoch"] for entry in machine.applied}
            assert stamps == sorted(stamps)
            assert stamps[0] >= ahead_ms
            assert epochs == {log.term}

    asyncio.run(scenario())


def test_effects_reach_on_applied_on_the_event_loop() -> None:
    calls: list[tuple[int, list[Any]]] = []

    def on_applied(effects: list[Any]) -> None:
        calls.append((threading.get_ident(), effects))

    async def scenario() -> None:
        async with running_log(on_applied=on_applied) as (log, _):
            await asyncio.gather(*(log.propose({"type": "add", "id": i}) for i in range(3)))
            await eventually(lambda: sum(len(effects) for _, effects in calls) == 3)

    asyncio.run(scenario())
    assert {thread for thread, _ in calls} == {threading.get_ident()}
    assert [effect for _, effects in calls for effect in effects] == [("applied", i) for i in range(3)]


def test_a_node_without_quorum_is_not_leader_and_never_ready() -> None:
    async def scenario() -> None:
        silent_peer = f"127.0.0.1:{free_port()}"
        async with running_log(ready=False, peer_addresses=[silent_peer]) as (log, _):
            with pytest.raises(NotLeader) as raised:
                await log.propose({"type": "add", "id": 1})
            assert raised.value.leader_address is None
            with pytest.raises(LogUnavailable):
                await log.wait_ready(timeout_s=0.3)
            assert not log.reads_locally()

    asyncio.run(scenario())


def test_three_nodes_replicate_and_followers_refuse_proposals() -> None:
    async def scenario() -> None:
        addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        machines = [RecordingMachine() for _ in addresses]
        effects: list[list[Any]] = [[] for _ in addresses]
        logs = [
            ReplicatedLog(
                machine,
                self_address=address,
                peer_addresses=addresses,
                data_dir=None,
                password="cluster-password",
                on_applied=sink.extend,
            )
            for address, machine, sink in zip(addresses, machines, effects, strict=True)
        ]
        try:
            for log in logs:
                await log.start()
            await asyncio.gather(*(log.wait_ready(READY_TIMEOUT_S) for log in logs))
            await eventually(lambda: sum(log.is_leader for log in logs) == 1)
            leader = next(log for log in logs if log.is_leader)
            results = await asyncio.gather(*(leader.propose({"type": "add", "id": i}) for i in range(20)))
            assert [result["id"] for result in results] == list(range(20))
            await eventually(lambda: all(log.applied_index >= leader.commit_index for log in logs))
            for log, machine, sink in zip(logs, machines, effects, strict=True):
                assert applied_ids(log, machine) == list(range(20))
                await eventually(lambda sink=sink: len(sink) == 20)
            follower = next(log for log in logs if not log.is_leader)
            with pytest.raises(NotLeader) as raised:
                await follower.propose({"type": "add", "id": 99})
            assert raised.value.leader_address == leader.self_address
            assert not any(log.reads_locally() for log in logs)  # a cluster confirms a read index instead
            # Nodes of this release seal their frames as AES-GCM once the peer told it reads them:
            # only the first few frames of each connection (the key exchange, the level) are Fernet.
            before = leader.raft_frames_sealed()
            for index in range(20, 30):
                await leader.propose({"type": "add", "id": index})  # one append to each follower
            after = leader.raft_frames_sealed()
            assert after["aead"] - before["aead"] >= 2 * 10 and after["fernet"] <= FERNET_FRAMES_PER_NODE_MAX
        finally:
            for log in logs:
                await log.stop()

    asyncio.run(scenario())


def test_a_follower_hands_its_applied_effects_to_its_loop_in_bulk_and_in_order() -> None:
    """A follower's loop gets every applied batch's effects, in order, but is woken for them at most
    once per FOLLOWER_EFFECTS_HANDOFF_S (plus the hand-overs something else needs), not once per
    entry; the leader's loop gets each batch's at once (its callers wait on them)."""
    writes = 60

    async def scenario() -> None:
        sinks: list[list[Any]] = [[], [], []]
        async with three_logs(sinks=sinks) as (leader, followers):
            before = [(log.counters.loop_handoffs, log.counters.batches_applied) for log in followers]
            started = time.monotonic()
            for index in range(writes):
                await leader.propose({"type": "add", "id": index})
            await eventually(lambda: all(log.applied_index >= leader.commit_index for log in followers))
            elapsed_s = time.monotonic() - started
            expected = [("applied", index) for index in range(writes)]
            for sink in sinks:
                await eventually(lambda sink=sink: sink[-writes:] == expected)
            for log, (handoffs, applied) in zip(followers, before, strict=True):
                assert log.counters.batches_applied - applied >= writes
                assert log.counters.loop_handoffs - handoffs <= elapsed_s / FOLLOWER_EFFECTS_HANDOFF_S + 2

    asyncio.run(scenario())


def test_nodes_seal_frames_as_aes_gcm_and_for_a_node_of_an_earlier_release_as_fernet(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes that told each other they read format 2 send AES-GCM frames; a node of an earlier
    release (it tells no format and reads Fernet tokens only: the first node to connect plays it)
    gets Fernet tokens only, and replicates every write. Were it sent one AES-GCM frame, it would
    drop the connection and never catch up."""
    writes = 40
    older: dict[str, str] = {}
    connected = BoundedTransport._onNodeConnected

    def on_node_connected(transport: BoundedTransport, node: Any) -> None:
        address = str(transport._selfNode.address)
        if older.setdefault("address", address) != address:
            connected(transport, node)
            return
        ciphers = transport.frame_ciphers
        assert ciphers is not None
        ciphers.aead, ciphers.formats = None, FRAMES_FERNET  # reads and seals Fernet tokens only
        TCPTransport._onNodeConnected(transport, node)
        transport.send(node, {"type": LEVEL, "level": transport.command_level})  # as the release before

    monkeypatch.setattr(BoundedTransport, "_onNodeConnected", on_node_connected)

    async def scenario() -> None:
        async with three_logs() as (leader, followers):
            logs = [leader, *followers]
            old = next(log for log in logs if log.self_address == older["address"])
            new = [log for log in logs if log is not old]
            before = [log.raft_frames_sealed() for log in new]
            for index in range(writes):
                await leader.propose({"type": "add", "id": index})
            await eventually(lambda: all(log.applied_index >= leader.commit_index for log in logs))
            assert old.raft_frames_sealed()["aead"] == 0 and old.raft_frames_sealed()["fernet"] >= writes
            # Each write crosses between the old node and a new one (an append or its answer), in Fernet.
            assert sum(log.raft_frames_sealed()["fernet"] - then["fernet"] for log, then in zip(new, before, strict=True)) >= writes
            if old is not leader:  # the new leader's appends to the other new node are AES-GCM
                assert leader.raft_frames_sealed()["aead"] - before[new.index(leader)]["aead"] >= writes

    asyncio.run(scenario())


def test_a_single_voter_reads_locally_and_answers_a_write_only_after_applying_it() -> None:
    """What lets a single node answer reads with no log entry (Node.confirm_leadership)."""
    async def scenario() -> None:
        async with running_log() as (log, machine):
            assert log.reads_locally()
            for command_id in range(50):
                await log.propose({"type": "add", "id": command_id})
                assert applied_ids(log, machine)[-1] == command_id  # applied before it was answered
            assert log.reads_locally()
        assert not log.reads_locally()  # stopped

    asyncio.run(scenario())


def test_restart_recovers_from_the_journal_in_process(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with running_log(tmp_path) as (log, _):
            await asyncio.gather(*(log.propose({"type": "add", "id": i}) for i in range(50)))
        async with running_log(tmp_path) as (log, machine):
            assert applied_ids(log, machine) == list(range(50))
            assert (await log.propose({"type": "add", "id": 50}))["position"] == 51

    asyncio.run(scenario())


def test_a_crash_between_dump_and_journal_trim_keeps_the_journal_tail(tmp_path: Path) -> None:
    """The state on disk after a crash right after a dump was renamed into place, before the journal
    was trimmed: the dump covers entries up to k, the journal still holds 1..n with n > k."""
    no_compaction = LogConfig(log_compaction_entries_min=1_000_000)

    async def fill() -> None:
        async with running_log(tmp_path, config=no_compaction) as (log, _):
            for command_id in range(20):
                await log.propose({"type": "add", "id": command_id})

    asyncio.run(fill())
    write_dump_of_a_journal_prefix(tmp_path, prefix_commands=8)

    async def restart() -> None:
        async with running_log(tmp_path, config=no_compaction) as (log, machine):
            assert applied_ids(log, machine) == list(range(20))

    asyncio.run(restart())


def write_dump_of_a_journal_prefix(data_dir: Path, prefix_commands: int) -> None:
    """Replay the journal's first regular entries into a fresh machine and dump it at that entry."""
    entries = scan_file(str(data_dir / JOURNAL_FILE_NAME)).entries
    machine = RecordingMachine()
    for position, (command, _, _) in enumerate(entries):
        if command[:1] != b"\x00":  # pysyncobj's no-op entries
            continue
        _, (batch,) = pysyncobj_loads(command[1:])
        decoded = decode_batch(batch)
        for one in decoded.commands:
            machine.apply(one, decoded.now_ms, decoded.epoch)
        if len(machine.applied) >= prefix_commands:
            dump = Dump(machine.snapshot(), entries[position], entries[position - 1], [])
            (data_dir / DUMP_FILE_NAME).write_bytes(encode_dump(dump))
            assert position < len(entries) - 1
            return
    raise AssertionError("the journal holds fewer commands than the prefix")


class StallingMachine(RecordingMachine):
    """Blocks the tick thread that applies a "stall" command until `release` is set, if armed."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.stalled = threading.Event()
        self.release = threading.Event()

    def apply(self, command: dict[str, Any], now_ms: int, epoch: int) -> tuple[Any, list[Any]]:
        if command["type"] == "stall" and self.armed:
            self.stalled.set()
            self.release.wait(4 * READY_TIMEOUT_S)  # longer than any wait of the test: stuck
        return super().apply(command, now_ms, epoch)


def test_a_leader_whose_tick_thread_is_stuck_stops_calling_itself_leader() -> None:
    """pysyncobj checks the quorum in its tick thread; while that thread is stuck (a long apply,
    a long read) its fields say "leader" although the others elected a new one. The log's
    check-quorum (is_leader, role, leader_address) reads the followers' answer times instead."""

    async def scenario() -> None:
        addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
        machines = [StallingMachine() for _ in addresses]
        logs = [
            ReplicatedLog(machine, self_address=address, peer_addresses=addresses, data_dir=None, password="quorum")
            for address, machine in zip(addresses, machines, strict=True)
        ]
        try:
            for log in logs:
                await log.start()
            await asyncio.gather(*(log.wait_ready(READY_TIMEOUT_S) for log in logs))
            await eventually(lambda: sum(log.is_leader for log in logs) == 1)
            old = next(index for index, log in enumerate(logs) if log.is_leader)
            machines[old].armed = True
            stalled = asyncio.ensure_future(logs[old].propose({"type": "stall", "id": 1}, timeout_s=READY_TIMEOUT_S))
            await eventually(machines[old].stalled.is_set)
            others = [log for index, log in enumerate(logs) if index != old]
            await eventually(lambda: any(log.is_leader for log in others))  # a new leader, elected meanwhile
            await eventually(lambda: not logs[old].is_leader)
            assert logs[old].role != "leader" and logs[old].leader_address is None
            with pytest.raises(NotLeader):
                await logs[old].propose({"type": "add", "id": 2})
            machines[old].release.set()
            with contextlib.suppress(LogUnavailable, NotLeader):
                await stalled
            new_leader = next(log for log in others if log.is_leader)
            await eventually(lambda: logs[old].leader_address == new_leader.self_address)
        finally:
            for machine in machines:
                machine.release.set()
            for log in logs:
                await log.stop()

    asyncio.run(scenario())


def test_a_journal_past_its_bytes_bound_is_compacted_whatever_its_entry_count(tmp_path: Path) -> None:
    """The journal keeps its commands in memory: past log_compaction_bytes_min it is compacted
    although it holds far fewer entries than log_compaction_entries_min, and what it holds stays
    near the bound; a restart finds every value."""
    bound = 256 * 1024
    config = LogConfig(log_compaction_entries_min=1_000_000, log_compaction_bytes_min=bound)
    value = "v" * 16 * 1024

    async def scenario() -> None:
        async with running_log(tmp_path, config=config) as (log, machine):
            journal = log._journal
            assert journal is not None
            for command_id in range(100):  # about 1.6 MB of commands, one entry each
                await log.propose({"type": "set", "id": command_id, "key": f"k{command_id}", "value": value})
            await eventually(lambda: journal.compactions >= 1 and journal.command_bytes < 2 * bound)
            assert journal.command_bytes == sum(len(journal[position][0]) for position in range(len(journal)))
        async with running_log(tmp_path, config=config) as (log, machine):
            with log.lock:
                assert len(machine.values) == 100 and machine.values["k99"] == value

    asyncio.run(scenario())


def test_the_compaction_bound_grows_with_the_dump(tmp_path: Path) -> None:
    """Each compaction writes the whole state: the journal's bound is log_compaction_bytes_min or
    log_compaction_dump_fraction of the last dump, whichever is more, so a large state is not
    written again after every few commands."""
    bound = 64 * 1024
    config = LogConfig(log_compaction_entries_min=1_000_000, log_compaction_bytes_min=bound,
                       log_compaction_dump_fraction=2.0)
    value = "v" * 16 * 1024

    async def scenario() -> None:
        async with running_log(tmp_path, config=config) as (log, machine):
            journal = log._journal
            assert journal is not None
            assert log.compaction_bytes() == bound  # no dump yet
            for command_id in range(12):  # every value stays in the state: the dump grows
                await log.propose({"type": "set", "id": command_id, "key": f"k{command_id}", "value": value})
            await eventually(lambda: journal.compactions >= 1)
            dump_bytes = (tmp_path / "raft.dump").stat().st_size
            assert dump_bytes >= 4 * len(value)  # the state at the first compaction
            assert log.compaction_bytes() == int(2.0 * dump_bytes) > bound

    asyncio.run(scenario())


def test_a_follower_polls_no_longer_than_until_its_election_deadline() -> None:
    """pysyncobj looks at the election deadline once per tick: a follower's tick thread wakes for
    it instead of starting the election up to a poll period late; a leader, or a deadline already
    passed (held by pre-vote, or no peer connected), polls the whole period (never a spin)."""
    from pysyncobj.monotonic import monotonic as raft_clock

    class Raft:
        state = 0
        deadline = 0.0

        def raft_state(self) -> int:
            return self.state

        def election_deadline(self) -> float:
            return self.deadline

    log = ReplicatedLog(RecordingMachine(), self_address="127.0.0.1:1", data_dir=None, password="test-password",
                        config=LogConfig(tick_period_s=0.05))
    raft = Raft()
    raft.deadline = raft_clock() + 0.01
    assert 0 < log._poll_s(raft) <= 0.01  # type: ignore[arg-type]
    raft.deadline = raft_clock() + 10.0
    assert log._poll_s(raft) == 0.05  # type: ignore[arg-type]
    raft.deadline = raft_clock() - 1.0
    assert log._poll_s(raft) == 0.05  # type: ignore[arg-type]
    raft.state, raft.deadline = 2, raft_clock() + 0.01
    assert log._poll_s(raft) == 0.05  # type: ignore[arg-type]
