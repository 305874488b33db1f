"""Membership changes on real cluster nodes (cluster/DESIGN.md "Membership"): `runstate cluster
remove` takes a dead node out of the configuration, which the log keeps (a restart of the others
with their old --peer flags keeps it), and the removed node, back with its data, disturbs nothing;
changes that would cost the quorum, or that name the leader or no member, are refused and change
nothing."""

from __future__ import annotations

import itertools
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import runstate

from runstate_server.actors.dispatch import COMMAND_LEVEL
from runstate_server.node.membership import MEMBERSHIP_FILE_NAME
from tests._cluster import Cluster, get_json
from tests._http import Api, mailbox_id, submit_task
from tests._prometheus import scrape, value
from tests.test_admin_cli import ok_json, refused
from tests.test_cluster_transfer import Load

LEVEL_TIMEOUT_S = 30.0
SDK_LOAD_PAUSE_S = 0.005  # between two submits of the SDK's load
CLI_TIMEOUT_S = 60.0  # a node that refuses its settings exits long before


def admin(cluster: Cluster, index: int) -> tuple[str, ...]:
    return ("--url", cluster.urls[index], "--api-key", cluster.admin_key or "")


def voters(cluster: Cluster, index: int) -> list[str]:
    view = cluster.api(index).resending().ok("GET", "/v1/cluster")
    return sorted(node["id"] for node in view["nodes"] if node["voter"])


def wait_level_proven(cluster: Cluster) -> None:
    def proven() -> bool:
        samples, _ = scrape(cluster.urls[cluster.leader_index()], cluster.admin_key)
        return value(samples, "runstate_command_level_proven") == COMMAND_LEVEL

    cluster.wait_until("membership changes allowed", proven, LEVEL_TIMEOUT_S)


def test_a_dead_node_is_removed_and_the_configuration_outlives_restarts(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    wait_level_proven(cluster)
    leader = cluster.leader_index()
    dead, other = [index for index in range(cluster.size) if index != leader]
    api = cluster.api(leader).resending()
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    mailbox_id(api)
    before = submit_task(api, run_id, {"n": 1}, "before")

    cluster.kill(dead)
    answer = ok_json("cluster", "remove", cluster.ids[dead], *admin(cluster, other))
    assert answer["removed"] == cluster.ids[dead]
    assert sorted(member["id"] for member in answer["members"]) == sorted(cluster.ids[i] for i in (leader, other))
    assert voters(cluster, other) == sorted(cluster.ids[i] for i in (leader, other))
    # Two voters commit with both: a write now needs the two that are left, not two of three.
    after = submit_task(api, run_id, {"n": 2}, "after")

    # Both restart with their old --peer flags, which still name the removed node: the log's
    # configuration wins, so the two elect a leader of their own.
    for index in (leader, other):
        cluster.kill(index)
    cluster.start(leader, other)
    now_leading = cluster.wait_healthy([leader, other])
    assert voters(cluster, other) == sorted(cluster.ids[i] for i in (leader, other))

    # The removed node comes back with its data: nobody answers it, it never leads, the others go
    # on; it learns from the leader's health that it is out, says so, and never starts again.
    cluster.spawn(dead)  # never healthy: no member answers it
    cluster.wait_until("the removed node up", lambda: cluster.health(dead), LEVEL_TIMEOUT_S)
    later = submit_task(cluster.api(now_leading).resending(), run_id, {"n": 3}, "later")
    assert cluster.leader_index(exclude=[dead]) in (leader, other)
    removed_health = cluster.wait_until(
        "the removed node to know", lambda: (view := cluster.health(dead)) and view["status"] == "removed" and view,
        LEVEL_TIMEOUT_S,
    )
    assert removed_health["role"] != "leader"
    assert Api(cluster.urls[dead], key=cluster.admin_key).error("GET", "/v1/cluster") == (503, "REMOVED")
    cluster.kill(dead)
    again = subprocess.run(cluster.command(dead), capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert again.returncode == 2 and "was removed from its cluster" in again.stderr, again.stderr
    reader = cluster.api(cluster.leader_index(exclude=[dead])).resending()
    for task in (before, after, later):
        assert reader.ok("GET", f"/v1/tasks/{task['id']}")["taskKey"] == task["taskKey"]
    cluster.wait_same_digest([leader, other])


def test_changes_that_would_cost_the_quorum_or_name_no_member_are_refused(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster().start()
    wait_level_proven(cluster)
    leader = cluster.leader_index()
    dead, alive = [index for index in range(cluster.size) if index != leader]
    everyone = sorted(cluster.ids)

    assert "no voter 'n9'" in refused("NOT_FOUND", "cluster", "remove", "n9", *admin(cluster, alive))
    assert "hand leadership to another voter first" in refused(
        "CONFLICT", "cluster", "remove", cluster.ids[leader], *admin(cluster, alive),
    )
    cluster.kill(dead)
    # With one of three down, removing a live one would leave one of two voters reachable.
    assert "fewer than a majority" in refused("CONFLICT", "cluster", "remove", cluster.ids[alive], *admin(cluster, leader))
    api = cluster.api(leader).resending()
    space = api.ok("POST", "/v1/spaces", {"id": "tenant"})["id"]
    secret = api.ok("POST", "/v1/keys", {"space": space, "permissions": ["admin"]})["key"]
    tenant = Api(cluster.urls[leader], key=secret)
    assert tenant.error("DELETE", f"/v1/cluster/members/{cluster.ids[dead]}") == (403, "FORBIDDEN")
    assert voters(cluster, leader) == everyone

    # A learner recorded from the shell: not promoted until it has caught up (it never started),
    # and a second one waits for the first; removing it forgets it.
    assert "no learner 'n9'" in refused("NOT_FOUND", "cluster", "promote", "n9", *admin(cluster, leader))
    added = ok_json("cluster", "add", "--node-id", "n9", "--raft", "127.0.0.1:1", "--api-url", "http://127.0.0.1:1",
                    *admin(cluster, leader))
    assert added["learner"] == {"id": "n9", "raftAddress": "127.0.0.1:1", "apiUrl": "http://127.0.0.1:1", "voter": False}
    assert "has not caught up yet" in refused("CONFLICT", "cluster", "promote", "n9", *admin(cluster, leader))
    assert "still catching up" in refused("CONFLICT", "cluster", "add", "--node-id", "n10", "--raft", "127.0.0.1:2",
                                          "--api-url", "http://127.0.0.1:2", *admin(cluster, leader))
    assert "voter n" in refused("CONFLICT", "cluster", "add", "--node-id", cluster.ids[alive], "--raft", "127.0.0.1:3",
                                "--api-url", "http://127.0.0.1:3", *admin(cluster, leader))
    view = cluster.api(leader).resending().ok("GET", "/v1/cluster")
    assert [node["voter"] for node in view["nodes"] if node["id"] == "n9"] == [False]
    assert ok_json("cluster", "remove", "n9", *admin(cluster, leader))["removed"] == "n9"
    assert "n9" not in [node["id"] for node in cluster.api(leader).resending().ok("GET", "/v1/cluster")["nodes"]]
    assert voters(cluster, leader) == everyone


class SdkLoad:
    """Keyed submits through the Python SDK (the published client's retries and failover), one
    after another, until stopped: the task ids it acknowledged by key, and every error it raised
    (an error it did not retry by itself)."""

    def __init__(self, cluster: Cluster, nodes: list[int]) -> None:
        self.acknowledged: dict[str, str] = {}
        self.raised: list[BaseException] = []
        self._stop = threading.Event()
        urls = [cluster.urls[index] for index in nodes]
        self._thread = threading.Thread(target=self._run, args=(urls, cluster.admin_key), daemon=True)

    def __enter__(self) -> SdkLoad:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self, urls: list[str], key: str) -> None:
        with runstate.Runstate(base_url=urls, api_key=key) as client:
            mailbox = client.scopes.create().mailbox("work")
            for number in itertools.count():
                if self._stop.wait(SDK_LOAD_PAUSE_S):
                    return
                try:
                    ticket = mailbox.submit({"n": number}, key=f"sdk-{number}")
                except Exception as error:  # noqa: BLE001 - recorded: the test fails on any
                    self.raised.append(error)
                    continue
                self.acknowledged[f"sdk-{number}"] = ticket.id


def test_a_dead_node_is_replaced_under_load_by_one_that_joins(make_cluster: Callable[..., Cluster]) -> None:
    """The documented replacement: remove the dead node, start the new machine with --join. Under a
    steady keyed-submit load: the new node is a learner first, a voter once it caught up; every
    acknowledged task is there; the replicas agree; the load saw no error it did not retry."""
    cluster = make_cluster().start()
    wait_level_proven(cluster)
    api = cluster.api(cluster.leader_index()).resending()
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    mailbox = mailbox_id(api)
    leader = cluster.leader_index()
    dead = next(index for index in range(cluster.size) if index != leader)
    survivors = [index for index in range(cluster.size) if index != dead]

    with Load(cluster, run_id, mailbox, nodes=survivors) as load, SdkLoad(cluster, survivors) as sdk:
        cluster.wait_until("a few acknowledged writes", lambda: len(load.acknowledged) >= 20 or None, LEVEL_TIMEOUT_S)
        cluster.kill(dead)
        ok_json("cluster", "remove", cluster.ids[dead], *admin(cluster, survivors[0]))
        new = cluster.add_node(join=survivors)
        cluster.spawn(new)

        def promoted() -> bool:
            # The new node's own view, a learner's or a voter's, names every member once.
            answer = get_json(f"{cluster.urls[new]}/v1/cluster", key=cluster.admin_key)
            if answer is not None and answer[0] == 200:
                own_view = answer[1]
                ids = [node["id"] for node in own_view["nodes"]]
                assert sorted(ids) == sorted({*ids, *(cluster.ids[index] for index in survivors)}), own_view
            view = cluster.api(survivors[0]).resending().ok("GET", "/v1/cluster")
            nodes = {node["id"]: node for node in view["nodes"]}
            return cluster.ids[new] in nodes and nodes[cluster.ids[new]]["voter"] is True

        cluster.wait_until(f"{cluster.ids[new]} a voter", promoted, LEVEL_TIMEOUT_S)
        before = len(load.acknowledged)
        cluster.wait_until("writes after the promotion", lambda: len(load.acknowledged) > before + 20 or None,
                           LEVEL_TIMEOUT_S)

    assert load.failures == []
    assert sdk.raised == [] and len(sdk.acknowledged) > 20, (sdk.raised, len(sdk.acknowledged))
    members = [*survivors, new]
    assert voters(cluster, survivors[0]) == sorted(cluster.ids[index] for index in members)
    reader = cluster.api(new).resending()
    for key, task_id in [*load.acknowledged.items(), *sdk.acknowledged.items()]:
        assert reader.ok("GET", f"/v1/tasks/{task_id}")["taskKey"] == key
    cluster.wait_same_digest(members)
    # The new node restarts from its data dir (it names its role and the voters), a voter still.
    cluster.kill(new)
    cluster.start(new)
    assert voters(cluster, new) == sorted(cluster.ids[index] for index in members)
    cluster.wait_same_digest(members)


def test_a_join_with_the_wrong_secret_or_contradicting_flags_is_refused(
    make_cluster: Callable[..., Cluster], tmp_path: Path,
) -> None:
    cluster = make_cluster().start()
    wait_level_proven(cluster)
    wrong_secret = tmp_path / "other.secret"
    wrong_secret.write_text("another-clusters-secret-" + "x" * 16)
    new = cluster.add_node(join=[0, 1])
    command = cluster.command(new)
    command[command.index("--secret-file") + 1] = str(wrong_secret)
    refused_join = subprocess.run(command, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert refused_join.returncode == 2, refused_join.stderr
    assert "cannot join the cluster" in refused_join.stderr and "UNAUTHENTICATED" in refused_join.stderr
    assert not (cluster.data_dir(new) / MEMBERSHIP_FILE_NAME).exists()
    both = subprocess.run([*cluster.command(new), "--peer", f"n1,{cluster.rafts[0]},{cluster.urls[0]}"],
                          capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert both.returncode == 2 and "--join and --peer exclude each other" in both.stderr
    # A voter's data dir cannot join anew.
    voter = cluster.command(0)
    at_peer = voter.index("--peer")
    again = subprocess.run([*voter[:at_peer], "--join", cluster.urls[1]], capture_output=True, text=True,
                           timeout=CLI_TIMEOUT_S)
    assert again.returncode == 2 and "needs an empty data dir" in again.stderr, again.stderr
    assert voters(cluster, 1) == sorted(cluster.ids[:3])


def test_a_survivor_of_a_lost_majority_is_forced_into_a_new_cluster_and_grows_again(
    make_cluster: Callable[..., Cluster],
) -> None:
    """Two of three machines lost for good: the survivor's data dir starts as a one-voter cluster
    of a new epoch with every task it had, serves, refuses a node of the old epoch, and takes a new
    member by --join."""
    cluster = make_cluster().start()
    wait_level_proven(cluster)
    api = cluster.api(cluster.leader_index()).resending()
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    mailbox_id(api)
    tasks = [submit_task(api, run_id, {"n": n}, f"before-{n}") for n in range(10)]
    cluster.wait_same_digest()
    survivor, lost, old = 0, 1, 2
    cluster.kill_all()

    empty = subprocess.run([*cluster.command(survivor)[:-4], "--force-new-cluster", "--data-dir", str(cluster.root / "nothing")],
                           capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert empty.returncode == 2 and "needs the data dir of a survivor" in empty.stderr, empty.stderr
    cluster.alone.add(survivor)
    cluster.node_args[survivor] = ("--force-new-cluster",)
    cluster.start(survivor)
    health = cluster.health(survivor)
    assert health is not None and health["epoch"] == 2 and health["role"] == "leader"
    reader = cluster.api(survivor).resending()
    for task in tasks:
        assert reader.ok("GET", f"/v1/tasks/{task['id']}")["taskKey"] == task["taskKey"]
    assert voters(cluster, survivor) == [cluster.ids[survivor]]
    after = submit_task(reader, run_id, {"n": 99}, "after")

    # A node of the old cluster back with its data: it is not a member, nothing changes here.
    cluster.spawn(old)
    cluster.wait_until("the old node up", lambda: cluster.health(old), LEVEL_TIMEOUT_S)
    assert voters(cluster, survivor) == [cluster.ids[survivor]]
    assert reader.ok("GET", f"/v1/tasks/{after['id']}")["taskKey"] == "after"

    # Restarted without the flag: the same one-voter cluster of epoch 2. Then a new node joins it.
    cluster.kill(old)
    cluster.node_args[survivor] = ()
    cluster.kill(survivor)
    cluster.start(survivor)
    new = cluster.add_node(join=[survivor])
    cluster.spawn(new)

    def promoted() -> bool:
        return cluster.ids[new] in voters(cluster, survivor)

    cluster.wait_until(f"{cluster.ids[new]} a voter", promoted, LEVEL_TIMEOUT_S)
    new_health = cluster.wait_until("the new node's health", lambda: cluster.health(new), LEVEL_TIMEOUT_S)
    assert new_health["epoch"] == 2
    cluster.wait_same_digest([survivor, new])
    assert lost not in cluster.live()


COMPACT_AFTER = 100  # entries: the first writes compact every node's log, the rest of the test does not


def test_a_learner_catches_up_from_a_leader_that_joined_after_its_dump(make_cluster: Callable[..., Cluster]) -> None:
    """A leader that joined as a replacement holds the dump it installed then, whose configuration
    does not name it. A learner that installs that dump still follows the leader that sent it,
    takes the membership entries after the dump, and becomes a voter (chaos seed 4042: it dropped
    its connection to that leader and stayed at the dump's index)."""
    cluster = make_cluster("--compact-after", str(COMPACT_AFTER)).start()
    wait_level_proven(cluster)
    first = cluster.leader_index()
    api = cluster.api(first).resending()
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    mailbox_id(api)
    tasks = [submit_task(api, run_id, {"n": n}, f"before-{n}") for n in range(COMPACT_AFTER + 20)]
    cluster.wait_until("a dump on the leader", lambda: (cluster.data_dir(first) / "raft.dump").exists() or None,
                       LEVEL_TIMEOUT_S)
    replaced, later = (index for index in range(cluster.size) if index != first)

    def becomes_voter(new: int, asked: int) -> None:
        cluster.wait_until(f"{cluster.ids[new]} a voter", lambda: cluster.ids[new] in voters(cluster, asked),
                           LEVEL_TIMEOUT_S)

    # The replacement installs the first leader's dump (it names the three first nodes), then leads.
    cluster.kill(replaced)
    ok_json("cluster", "remove", cluster.ids[replaced], *admin(cluster, first))
    joined = cluster.add_node(join=[first])
    cluster.spawn(joined)
    becomes_voter(joined, first)
    assert (cluster.data_dir(joined) / "raft.dump").exists()
    ok_json("cluster", "transfer-leader", "--to", cluster.ids[joined], *admin(cluster, first))
    assert cluster.leader_index() == joined

    # The next replacement learns from it: it catches up and is promoted.
    cluster.kill(later)
    ok_json("cluster", "remove", cluster.ids[later], *admin(cluster, joined))
    last = cluster.add_node(join=[joined])
    cluster.spawn(last)
    becomes_voter(last, joined)
    members = [first, joined, last]
    assert voters(cluster, joined) == sorted(cluster.ids[index] for index in members)
    after = submit_task(cluster.api(joined).resending(), run_id, {"n": -1}, "after")
    cluster.wait_same_digest(members)
    reader = cluster.api(last).resending()
    for task in [*tasks, after]:
        assert reader.ok("GET", f"/v1/tasks/{task['id']}")["taskKey"] == task["taskKey"]
