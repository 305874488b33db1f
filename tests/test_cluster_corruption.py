"""A cluster node whose journal or dump is damaged in the middle discards its Raft data at restart,
catches up from the leader by snapshot, says so in its log and metrics, and nothing acknowledged is
lost (cluster/DESIGN.md "Checksums and damaged data")."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from runstate import Runstate

from runstate_server.cluster._catch_up import MARKER_FILE_NAME
from runstate_server.cluster._journal import scan_file
from runstate_server.cluster.log import DISCARDED_SUFFIX, DUMP_FILE_NAME, JOURNAL_FILE_NAME
from tests._cluster import Cluster
from tests._prometheus import scrape, value

WAIT_S = 60.0


def flip_byte_in_the_middle(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x20
    path.write_bytes(bytes(data))


def damage_the_journal(data_dir: Path) -> int:
    """Flip a byte inside a record before the last one; its offset."""
    found = scan_file(str(data_dir / JOURNAL_FILE_NAME))
    assert len(found.offsets) >= 3, found.offsets
    record = found.offsets[len(found.offsets) // 2 - 1]
    flip_byte_in_the_middle(data_dir / JOURNAL_FILE_NAME, record + 30)
    return record


def damage_the_dump(data_dir: Path) -> int:
    dump = data_dir / DUMP_FILE_NAME
    middle = dump.stat().st_size // 2
    flip_byte_in_the_middle(dump, middle)
    return 13  # where the checksummed content starts: the message names it


@pytest.mark.parametrize("damage", [damage_the_journal, damage_the_dump], ids=["journal", "dump"])
def test_a_node_with_damaged_data_discards_it_and_catches_up(
    make_cluster: Callable[..., Cluster], damage: Callable[[Path], int]
) -> None:
    cluster = make_cluster("--compact-after", "30").start()
    leader = cluster.leader_index()
    damaged = (leader + 1) % cluster.size
    with Runstate(api_key=cluster.admin_key, base_url=cluster.base_url, holder="writer") as rs:
        rs.mailboxes.ensure("work")
        queue = rs.scopes.create().mailbox("work")
        before = [queue.submit({"n": n}, key=f"before-{n}") for n in range(80)]
        cluster.wait_until("a dump on the node to damage", (cluster.data_dir(damaged) / DUMP_FILE_NAME).exists, WAIT_S)
        before += [queue.submit({"n": n}, key=f"more-{n}") for n in range(12)]  # journal records past the dump
        cluster.kill(damaged)
        offset = damage(cluster.data_dir(damaged))
        after = [queue.submit({"n": n}, key=f"after-{n}") for n in range(40)]
        for delivery in queue.receive(max=20):
            delivery.complete(result={"payload": delivery.input})
    cluster.start(damaged)
    cluster.wait_same_digest()
    data_dir = cluster.data_dir(damaged)
    log = cluster.log_path(damaged).read_text(errors="replace")
    assert f"is damaged at byte {offset}" in log and "this node discarded its Raft journal and dump" in log, log[-3000:]
    assert "ERROR" in next(line for line in log.splitlines() if "discarded its Raft journal" in line)
    assert (data_dir / (JOURNAL_FILE_NAME + DISCARDED_SUFFIX)).exists()
    cluster.wait_until("the catch-up's end", lambda: not (data_dir / MARKER_FILE_NAME).exists(), WAIT_S)
    samples, _ = scrape(cluster.urls[damaged], cluster.admin_key)
    assert value(samples, "runstate_local_data_discarded_total") == 1
    assert value(samples, "runstate_raft_catching_up") == 0
    api = cluster.api(damaged)
    for ticket in before + after:
        assert api.ok("GET", f"/v1/tasks/{ticket.id}")["taskKey"] == ticket.key
    # Restarted again, it finds sound data and discards nothing.
    cluster.kill(damaged)
    cluster.start(damaged)
    cluster.wait_same_digest()
    samples, _ = scrape(cluster.urls[damaged], cluster.admin_key)
    assert value(samples, "runstate_local_data_discarded_total") == 0


def test_a_node_catching_up_grants_no_vote(make_cluster: Callable[..., Cluster]) -> None:
    """Raft's disk-loss problem: a voter that lost what it acknowledged must not help elect a
    leader. A node that discarded its data, with the leader killed before it caught up, leaves the
    last node without a majority: no leader is elected until the old leader comes back."""
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    damaged, other = ((leader + offset) % cluster.size for offset in (1, 2))
    with Runstate(api_key=cluster.admin_key, base_url=cluster.base_url, holder="writer") as rs:
        rs.mailboxes.ensure("work")
        queue = rs.scopes.create().mailbox("work")
        tickets = [queue.submit({"n": n}, key=f"k{n}") for n in range(20)]
    cluster.kill(damaged)
    damage_the_journal(cluster.data_dir(damaged))
    cluster.kill(leader)
    # Marked as catching up with no leader to catch up from: it must stay so, and `other` (whose
    # log may lack nothing, but Raft cannot know) must not win an election with its vote.
    cluster.spawn(damaged)
    cluster.wait_until("the damaged node's discard", lambda: "discarded its Raft journal" in
                       cluster.log_path(damaged).read_text(errors="replace"), WAIT_S)
    for _ in range(3):  # several election timeouts (0.3-0.6 s) of the survivor
        time.sleep(1.0)
        assert all((cluster.health(index) or {}).get("role") != "leader" for index in (damaged, other))
    assert (cluster.data_dir(damaged) / MARKER_FILE_NAME).exists()
    cluster.start(leader)
    cluster.wait_same_digest()
    cluster.wait_until("the catch-up's end", lambda: not (cluster.data_dir(damaged) / MARKER_FILE_NAME).exists(), WAIT_S)
    api = cluster.api(damaged)
    for ticket in tickets:
        assert api.ok("GET", f"/v1/tasks/{ticket.id}")["taskKey"] == ticket.key
