"""The chaos harness's cluster, proxies and faults on real processes: every Raft pair crosses a
proxy that knows who dialed, and every node names each other one alike; a partition of the leader
elects another one and heals to one state, the schedule is a function of the seed (a kind added to
the registry leaves the schedules without it alone), the injector records each fault (a leadership
transfer with its answer, a replaced node's successor, the nodes a grow added and removed), and
close() leaves nothing running."""

from __future__ import annotations

import os
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from runstate import Runstate, UnavailableError

from chaos.cluster import CERT_IDS, NODES, ChaosCluster, cert_name
from chaos.faults import (
    LEADER_TO_FOLLOWER,
    NEW_NODES,
    REGISTRY,
    FaultResult,
    Injector,
    PlannedFault,
    Schedule,
    membership_outcome,
    parse_kinds,
    transfer_outcome,
)
from chaos.proxy import dialer_of
from chaos.workload import HttpClient

pytestmark = pytest.mark.slow

# The isolated node holds a write while it waits for a leader (the node's LEADER_WAIT_S, 3 s) and
# then answers 503; the client gives up sooner. Either way: UnavailableError, nothing committed.
ISOLATED_WRITE_TIMEOUT_S = 1.5
ALL_KINDS = list(REGISTRY)
KINDS_BEFORE_TRANSFER = ["kill", "pause", "partition", "restart"]
KINDS_BEFORE_MEMBERSHIP = [*KINDS_BEFORE_TRANSFER, "transfer"]
# Schedule(7, 60.0, KINDS_BEFORE_TRANSFER) as drawn before the kind `transfer` existed: `--faults
# kill,pause,partition,restart --seed 7` (the short form's fixed seed) replays what it did.
SEED_7_FIRST_FAULTS = (
    PlannedFault(at_s=1.648, kind="pause", role="follower", hold_s=2.953, pick=0),
    PlannedFault(at_s=10.243, kind="kill", role="follower", hold_s=2.748, pick=2),
    PlannedFault(at_s=17.421, kind="kill", role="follower", hold_s=2.255, pick=0),
    PlannedFault(at_s=23.857, kind="restart", role="leader", hold_s=0.827, pick=0),
)
# Schedule(11, 90.0, KINDS_BEFORE_MEMBERSHIP) as drawn before the kinds `replace` and `grow` existed.
SEED_11_FIRST_FAULTS = (
    PlannedFault(at_s=1.905, kind="transfer", role=LEADER_TO_FOLLOWER, hold_s=0.452, pick=2),
    PlannedFault(at_s=6.737, kind="transfer", role=LEADER_TO_FOLLOWER, hold_s=0.63, pick=0),
    PlannedFault(at_s=11.555, kind="partition", role="leader", hold_s=2.272, pick=2),
    PlannedFault(at_s=19.096, kind="transfer", role=LEADER_TO_FOLLOWER, hold_s=0.965, pick=2),
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ChaosCluster]:
    made = ChaosCluster(tmp_path / "cluster")
    try:
        yield made
    finally:
        made.close()
        print(made.logs_tail())


def create_run(url: str, key: str, name: str, timeout_s: float | None = None) -> str:
    """A write through the SDK, given one node only; the new run's id."""
    options: dict[str, Any] = {} if timeout_s is None else {"timeout_s": timeout_s}
    with Runstate(base_url=url, api_key=key, **options) as rs:
        return rs.scopes.create(name=name).id


def run_state(url: str, key: str, run_id: str) -> str:
    with Runstate(base_url=url, api_key=key) as rs:
        return str(rs.scopes.status(run_id)["storedState"])


def test_the_proxies_carry_every_raft_pair(cluster: ChaosCluster) -> None:
    cluster.up()
    # Writes through every node (followers forward to the leader) are read back through another.
    run_ids = [create_run(cluster.urls[index], cluster.admin_key, f"via-{cluster.ids[index]}") for index in range(NODES)]
    for index, run_id in enumerate(run_ids):
        assert run_state(cluster.urls[(index + 1) % NODES], cluster.admin_key, run_id) == "ACTIVE"
    cluster.wait_converged()
    assert cluster.pairs_connected(range(NODES))
    # Of each pair, the node with the greater Raft address dialed the other's proxy, which knows it.
    stats = {proxy["name"]: proxy for proxy in cluster.proxy_stats()}
    for a in range(NODES):
        for b in range(a + 1, NODES):
            dialer, dialed = sorted([a, b], key=lambda index: cluster.rafts[index], reverse=True)
            proxy = stats[cluster.ids[dialed]]
            assert proxy["live_from"].get(cluster.ids[dialer]) == 1, stats
            assert proxy["bytes_to_target"] > 0 and proxy["bytes_from_target"] > 0, stats
    assert all(proxy["unidentified"] == 0 for proxy in stats.values()), stats
    # Every node names the leader by one Raft address: its proxy's.
    leader = cluster.wait_healthy()
    views = cluster.health()
    for viewer in range(NODES):
        view = views[cluster.ids[viewer]]
        assert view["leader"] == cluster.ids[leader], views
        assert view["leaderAddress"] == cluster.rafts[leader], views


def test_a_partitioned_leader_is_replaced_and_heals_to_one_state(cluster: ChaosCluster) -> None:
    old = cluster.up()
    cluster.partition(old)
    new = cluster.leader()
    assert new != old
    # The majority commits; the isolated node cannot (no leader, or no majority behind it).
    run_id = create_run(cluster.urls[new], cluster.admin_key, "majority")
    with pytest.raises(UnavailableError):
        create_run(cluster.urls[old], cluster.admin_key, "minority", timeout_s=ISOLATED_WRITE_TIMEOUT_S)
    views = cluster.health()
    isolated, leading = views[cluster.ids[old]], views[cluster.ids[new]]
    assert isolated["role"] != "leader" and isolated["commitIndex"] < leading["commitIndex"], views
    for stats in cluster.proxy_stats():
        assert cluster.ids[old] not in stats["live_from"], stats
        assert stats["live"] == 0 or stats["name"] != cluster.ids[old], stats

    cluster.heal()
    cluster.wait_healthy()
    digest = cluster.wait_converged()
    digests = cluster.digests()
    assert {view["digest"] for view in digests.values() if view is not None} == {digest}
    assert None not in digests.values()
    assert run_state(cluster.urls[old], cluster.admin_key, run_id) == "ACTIVE"


def test_the_schedule_is_a_function_of_the_seed() -> None:
    first = Schedule(7, 180.0, ALL_KINDS)  # long enough for seed 7 to draw every kind
    assert first.faults == Schedule(7, 180.0, list(reversed(ALL_KINDS))).faults
    assert first.faults != Schedule(8, 180.0, ALL_KINDS).faults
    assert len(first) > 5
    assert {fault.kind for fault in first.faults} == set(ALL_KINDS)
    for fault in first.faults:
        assert fault.role in REGISTRY[fault.kind].roles
        assert REGISTRY[fault.kind].hold_s_min <= fault.hold_s <= REGISTRY[fault.kind].hold_s_max
        assert 0 < fault.at_s and fault.at_s + fault.hold_s <= first.duration_s
    offsets = [fault.at_s for fault in first.faults]
    assert offsets == sorted(offsets)
    # A shorter run is a prefix of a longer one with the same seed.
    shorter = Schedule(7, 60.0, ALL_KINDS).faults
    assert shorter == first.faults[: len(shorter)]
    assert {fault.kind for fault in Schedule(7, 120.0, ["pause"]).faults} == {"pause"}
    assert parse_kinds("restart, kill") == ["kill", "restart"]
    assert parse_kinds("transfer,kill,pause") == ["kill", "pause", "transfer"]
    assert parse_kinds("grow,replace,kill") == ["kill", "replace", "grow"]
    # A kind added to the registry goes last, and a schedule without it is drawn as before.
    assert ALL_KINDS[: len(KINDS_BEFORE_TRANSFER)] == KINDS_BEFORE_TRANSFER
    before = Schedule(7, 60.0, KINDS_BEFORE_TRANSFER)
    assert len(before) == 8 and before.faults[: len(SEED_7_FIRST_FAULTS)] == SEED_7_FIRST_FAULTS
    transfers = [fault for fault in Schedule(7, 90.0, ["transfer", "kill", "pause"]).faults if fault.kind == "transfer"]
    assert transfers and all(fault.role == LEADER_TO_FOLLOWER for fault in transfers)
    assert ALL_KINDS[: len(KINDS_BEFORE_MEMBERSHIP)] == KINDS_BEFORE_MEMBERSHIP
    assert Schedule(11, 90.0, KINDS_BEFORE_MEMBERSHIP).faults[: len(SEED_11_FIRST_FAULTS)] == SEED_11_FIRST_FAULTS
    membership = Schedule(11, 150.0, ["replace", "grow", "kill"]).faults
    assert {fault.role for fault in membership if fault.kind == "replace"} == {"follower"}
    assert {fault.role for fault in membership if fault.kind == "grow"} == {NEW_NODES}
    with pytest.raises(ValueError):
        parse_kinds("kill,fire")
    with pytest.raises(ValueError):
        Schedule(7, 60.0, [])


def test_the_injector_records_each_fault_and_its_recovery(cluster: ChaosCluster) -> None:
    cluster.up()
    schedule = Schedule(1, 60.0, ALL_KINDS)
    schedule.faults = (
        PlannedFault(0.0, "kill", "leader", 0.5, 0),
        PlannedFault(0.0, "partition", "follower", 1.0, 1),
        PlannedFault(0.0, "restart", "all", 0.0, 0),
        PlannedFault(0.0, "transfer", LEADER_TO_FOLLOWER, 0.0, 1),
    )
    events: list[dict[str, Any]] = []
    injector = Injector(cluster, schedule, events.append)
    injector.start().join()

    assert injector.error is None
    for seq in range(len(schedule.faults)):
        mine = [event for event in events if event["detail"]["fault"] == seq]
        assert [event["event"] for event in mine] == ["health", "fault", "heal", "health"], mine
        before, fault, heal, after = mine
        assert before["detail"]["ok"] and after["detail"]["ok"], mine
        assert before["at"] <= fault["at"] <= heal["at"] <= after["at"]
        assert after["detail"]["unavailableS"] == pytest.approx(after["at"] - fault["at"], abs=0.01)
    kill = events[1]["detail"]
    assert kill["kind"] == "kill" and kill["role"] == "leader" and kill["node"] == events[0]["detail"]["leader"]
    assert [event["detail"]["nodes"] for event in events if event["event"] == "fault"][2] == cluster.ids
    # The transfer: from the leader to its second follower, asked through the third node.
    transfer = injector.results[3]
    leader, to = transfer.nodes
    assert leader == transfer.leader_before and to != leader
    assert transfer.detail is not None and transfer.detail["askedThrough"] not in (leader, to), transfer
    assert transfer.detail["status"] == 200, transfer
    assert transfer.detail["answer"] == {"leader": to, "previousLeader": leader, "transferred": True}
    assert transfer.leader_after == to
    heal = [event for event in events if event["event"] == "heal"][3]["detail"]
    assert heal["to"] == to and heal["answer"]["transferred"] is True

    summary = injector.summary()
    assert summary["injected"] == {
        "kill": 1, "pause": 0, "partition": 1, "restart": 1, "transfer": 1, "replace": 0, "grow": 0,
    }
    assert summary["survived"] == summary["injected"]
    assert summary["transfers"] == {"transferred": 1}
    assert summary["longestUnavailableS"] >= 1.0  # the partition's hold at least
    assert all(cluster.running(index) for index in range(NODES))


def test_a_transfer_outcome_is_read_from_its_answer() -> None:
    def outcome(detail: dict[str, Any] | None) -> str:
        return transfer_outcome(FaultResult(0, "transfer", LEADER_TO_FOLLOWER, 0.0, 0.0, at=1.0, detail=detail))

    assert outcome({"status": 200, "answer": {"transferred": True}}) == "transferred"
    assert outcome({"status": 200, "answer": {"transferred": False}}) == "stayed"
    assert outcome({"status": 409, "answer": {"error": {"code": "CONFLICT", "message": "..."}}}) == "CONFLICT"
    assert outcome({"status": 502, "answer": None}) == "502"
    assert outcome(None) == "error"  # nothing answered


def test_a_replace_and_a_grow_change_the_members_and_the_workload_follows(cluster: ChaosCluster) -> None:
    cluster.up()
    seen_urls: list[list[str]] = []
    cluster.watch(seen_urls.append)
    schedule = Schedule(1, 60.0, ["replace", "grow"])
    schedule.faults = (
        PlannedFault(0.0, "replace", "follower", 0.0, 0),
        PlannedFault(0.0, "grow", NEW_NODES, 0.5, 0),
    )
    events: list[dict[str, Any]] = []
    injector = Injector(cluster, schedule, events.append)
    injector.start().join()

    assert injector.error is None
    for seq in range(len(schedule.faults)):
        mine = [event for event in events if event["detail"]["fault"] == seq]
        assert [event["event"] for event in mine] == ["health", "fault", "heal", "health"], mine
        assert mine[0]["detail"]["ok"] and mine[3]["detail"]["ok"], mine
    # The replace: the first follower out (removed through another member), n4 in its slot, a voter.
    replace, grow = injector.results
    assert replace.detail is not None, replace
    old = replace.nodes[0]
    assert replace.detail["removed"] == old and replace.detail["removal"]["status"] == 200, replace
    assert replace.detail["added"] == "n4" and replace.detail["outcome"] == "voter", replace
    assert old not in cluster.ids and "n4" in cluster.ids
    # The grow: n5 and n6 voters one after the other, then removed and dropped, the last first.
    assert grow.detail is not None, grow
    assert grow.detail["added"] == ["n5", "n6"] and grow.detail["outcome"] == "voters", grow
    assert grow.detail["dropped"] == ["n6", "n5"] and grow.detail["shrink"] == "removed", grow
    assert cluster.size == NODES and [slot.id for slot in cluster.departed] == [old, "n6", "n5"]
    assert seen_urls[0] == seen_urls[-1] == cluster.urls and len(seen_urls[1]) == NODES + 1 and len(seen_urls[2]) == 5
    assert cluster.members_agree()[0]
    summary = injector.summary()
    assert summary["replaces"] == {"voter": 1} and summary["grows"] == {"voters, then removed": 1}

    # The newcomer serves, and restarts on its data dir (started with no --join: its data dir names
    # its role and the voters); so do all of them at once, when no member runs to join through (a
    # chaos run of seed 4040 lost n5 there: it was started with an empty --join and refused it).
    newcomer = cluster.ids.index("n4")
    run_id = create_run(cluster.urls[newcomer], cluster.admin_key, "via-n4")
    cluster.kill(newcomer)
    assert "--join" not in cluster.command(newcomer)
    cluster.start(newcomer)
    cluster.wait_healthy()
    assert run_state(cluster.urls[newcomer], cluster.admin_key, run_id) == "ACTIVE"
    assert set(cluster.stop_all()) == {0}
    cluster.start()
    cluster.wait_healthy()
    assert run_state(cluster.urls[newcomer], cluster.admin_key, run_id) == "ACTIVE"
    cluster.wait_members(30.0)
    cluster.wait_converged()


def test_membership_outcomes_are_read_from_the_details() -> None:
    def outcome(kind: str, detail: dict[str, Any] | None) -> str:
        return membership_outcome(FaultResult(0, kind, "follower", 0.0, 0.0, at=1.0, detail=detail))

    assert outcome("replace", {"outcome": "voter"}) == "voter"
    assert outcome("replace", {"outcome": "not-removed"}) == "not-removed"
    assert outcome("replace", None) == "error"
    assert outcome("grow", {"outcome": "voters", "shrink": "removed"}) == "voters, then removed"
    assert outcome("grow", {"outcome": "not-voter"}) == "not-voter, then error"


def test_a_proxy_finds_which_process_dialed() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        listen_port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", listen_port)) as client:
            accepted, (_, peer_port) = server.accept()
            with accepted:
                assert peer_port == client.getsockname()[1]
                assert dialer_of(peer_port, listen_port, {"other": 1, "me": os.getpid()}) == "me"
                assert dialer_of(peer_port, listen_port, {"other": 1}) is None
                assert dialer_of(listen_port, peer_port, {"me": os.getpid()}) == "me"  # the accepted side
                assert dialer_of(peer_port, listen_port + 1, {"me": os.getpid()}) is None


def test_close_leaves_no_process(cluster: ChaosCluster) -> None:
    cluster.up()
    cluster.kill(0)
    cluster.start(0)
    cluster.restart(1)
    cluster.wait_healthy()
    cluster.pause(2)  # a stopped process must die too
    started = list(cluster.pids_started)
    assert len(started) == NODES + 2
    cluster.close()
    cluster.close()  # idempotent
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert cluster.pids() == {}
    assert all(not stats["live"] for stats in cluster.proxy_stats())


CALL_TIMEOUT_S = 10.0  # one call of the TLS test's clients


def test_a_tls_cluster_serves_https_forwards_and_heals_after_a_kill(tmp_path: Path) -> None:
    """`chaos run --tls`'s cluster: certificates of a private CA made for it, HTTPS APIs its
    clients trust (a follower forwards to its leader over HTTPS), a client without the CA refused."""
    made = ChaosCluster(tmp_path / "cluster", tls=True)
    try:
        leader = made.up()
        assert made.ca_file is not None and all(url.startswith("https://") for url in made.urls)
        follower = next(index for index in range(made.size) if index != leader)
        client = HttpClient(made.urls, made.admin_key, context=made.context)
        assert client.call(follower, "POST", "/v1/scopes", {}, holder="tls", timeout_s=CALL_TIMEOUT_S).ok
        untrusting = HttpClient(made.urls, made.admin_key)  # the system's CAs only
        refused = untrusting.call(follower, "GET", "/v1/cluster", holder="tls", timeout_s=CALL_TIMEOUT_S)
        assert not refused.ok and "CERTIFICATE_VERIFY_FAILED" in refused.message, refused
        # Mutual TLS on the Raft port (through the proxies) with the same certificates.
        request = urllib.request.Request(f"{made.urls[follower]}/metrics", headers={"Authorization": f"Bearer {made.admin_key}"})
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT_S, context=made.context) as answer:
            metrics = answer.read().decode()
        assert 'runstate_tls_certificate_expiry_seconds{certificate="peer"}' in metrics
        made.kill(leader)
        made.wait_healthy()
        made.start(leader)
        made.wait_healthy()
        made.wait_converged()
    finally:
        made.close()
        print(made.logs_tail())


def test_a_node_past_the_certificates_made_serves_one_of_the_same_ca() -> None:
    assert [cert_name(f"n{number}") for number in (1, 7, CERT_IDS, CERT_IDS + 1, 2 * CERT_IDS + 7)] == [
        "n1", "n7", f"n{CERT_IDS}", "n1", "n7",
    ]
