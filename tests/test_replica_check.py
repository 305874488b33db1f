"""Replica checks on a real three-node cluster (node/replicas.py; README, "Replica checks").

The nodes compare a digest of their state at one `replica.check` entry. A healthy cluster raises
nothing; a node whose data was changed behind the log's back (its raft.dump rewritten while it was
down, with nothing in the server to help) is found out at the next check: it alone raises the
alarm, refuses calls with 503 REPLICA_DIVERGED while the others serve, keeps refusing after a
restart on the same data, and hands leadership over when it is given it. When no majority agrees
(two nodes changed, each its own way) every node says so and serves on.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runstate_server.cluster.log import DUMP_FILE_NAME
from runstate_server.cluster.snapshot import decode_dump, encode_dump
from runstate_server.node import cli
from runstate_server.node.config import REPLICA_CHECK_EVERY_MS_DEFAULT, ConfigError, NodeConfig
from runstate_server.node.replicas import DIVERGED_FILE_NAME
from tests._cluster import Cluster
from tests._http import Api, call, mailbox_id, submit_task
from tests._prometheus import scrape, value

pytestmark = pytest.mark.slow

CHECK_EVERY = "1s"  # the leader asks for a check this often here (5 min by default)
COMPACT_AFTER = "20"  # so that every node writes a dump early (the test rewrites one)
WRITES = 30  # enough for every node to compact at least once
CHECK_TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 60.0  # a node that refuses its settings exits long before  # a check is proposed, computed by three forked children and compared


def space_created_ms_shifted(dump_path: Path, shift_ms: int) -> None:
    """Rewrite a stopped node's dump with one inert field of its state changed: the first space's
    creation time (no rule reads it again; the digest does)."""
    dump = decode_dump(dump_path.read_bytes())
    spaces = dump.state["spaces"]
    assert spaces, "the dump holds no space yet"
    spaces[0][6] += shift_ms
    dump_path.write_bytes(encode_dump(dump))


def check_view(cluster: Cluster, index: int) -> dict[str, Any] | None:
    health = cluster.health(index)
    return health.get("replicaCheck") if health is not None else None


def agreed_at_least(cluster: Cluster, indexes: list[int], log_index: int) -> bool:
    views = [check_view(cluster, index) for index in indexes]
    return all(view is not None and (view["agreedIndex"] or 0) > log_index for view in views)


def started_with_data(make_cluster: Callable[..., Cluster]) -> tuple[Cluster, Api, str, str]:
    cluster = make_cluster("--replica-check-every", CHECK_EVERY, "--compact-after", COMPACT_AFTER).start()
    api = cluster.api(cluster.leader_index()).resending()
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    mailbox_id(api)
    task_id = ""
    for number in range(WRITES):
        task_id = submit_task(api, run_id, {"n": number}, f"k{number}")["id"]
    for index in range(cluster.size):
        cluster.wait_until(f"{cluster.ids[index]}'s dump", (cluster.data_dir(index) / DUMP_FILE_NAME).exists,
                           CHECK_TIMEOUT_S)
    return cluster, api, run_id, task_id


def diverged(cluster: Cluster, index: int) -> dict[str, Any] | None:
    health = cluster.health(index)
    return health if health is not None and health["status"] == "diverged" else None


def test_a_node_whose_state_differs_alone_raises_the_alarm_and_refuses_calls(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster, api, _, task_id = started_with_data(make_cluster)
    leader = cluster.leader_index()
    changed = next(index for index in range(cluster.size) if index != leader)
    healthy = [index for index in range(cluster.size) if index != changed]

    # Healthy: every node agrees with a majority, nothing raised.
    cluster.wait_until("a first check agreed everywhere", lambda: agreed_at_least(cluster, list(range(3)), 0),
                       CHECK_TIMEOUT_S)
    for index in range(cluster.size):
        view = check_view(cluster, index)
        assert view is not None and view["status"] == "ok" and view["message"] is None, view
        samples, _ = scrape(cluster.urls[index], cluster.admin_key)
        assert value(samples, "runstate_replica_diverged") == 0
        assert value(samples, "runstate_replica_checks_total", outcome="agreed") >= 1
        assert value(samples, "runstate_replica_checks_total", outcome="diverged") == 0

    # One follower's data is changed while it is down; it comes back and follows the log.
    cluster.kill(changed)
    space_created_ms_shifted(cluster.data_dir(changed) / DUMP_FILE_NAME, 1)
    cluster.spawn(changed)
    health = cluster.wait_until("the changed node found out", lambda: diverged(cluster, changed), CHECK_TIMEOUT_S)
    assert health["replicaCheck"]["status"] == "diverged"
    assert "runstate cluster remove" in health["replicaCheck"]["message"]
    # Only it: the others agreed on a later check than the one it was found out at.
    found_at = max(entry["index"] for entry in health["replicaCheck"]["digests"])
    cluster.wait_until("the others agree past it", lambda: agreed_at_least(cluster, healthy, found_at - 1),
                       CHECK_TIMEOUT_S)
    for index in healthy:
        view = check_view(cluster, index)
        assert view is not None and view["status"] == "ok", view
        samples, _ = scrape(cluster.urls[index], cluster.admin_key)
        assert value(samples, "runstate_replica_diverged") == 0
    samples, _ = scrape(cluster.urls[changed], cluster.admin_key)  # /metrics still answers
    assert value(samples, "runstate_replica_diverged") == 1
    # At least the check it was found out at (on loaded cores, a later one may be counted before this scrape).
    assert value(samples, "runstate_replica_checks_total", outcome="diverged") >= 1
    assert "REPLICA DIVERGED" in cluster.log_path(changed).read_text()

    # Its calls are refused with the code; the others serve the same call.
    path = f"/v1/tasks/{task_id}"
    status, answer = Api(cluster.urls[changed], key=cluster.admin_key)("GET", path)
    assert (status, answer["error"]["code"]) == (503, "REPLICA_DIVERGED"), answer
    assert "wipe its data dir" in answer["error"]["message"]
    assert api.ok("GET", path)["id"] == task_id
    for index in healthy:
        assert Api(cluster.urls[index], key=cluster.admin_key).ok("GET", path)["id"] == task_id
    # The operator's cluster routes still answer it.
    status, _ = call(cluster.urls[changed], "GET", "/v1/cluster", headers={"Authorization": f"Bearer {cluster.admin_key}"})
    assert status == 200

    # Given leadership, it hands it over again: it has no answer a client may trust.
    transfer = Api(cluster.urls[leader], key=cluster.admin_key)
    transfer.ok("POST", "/v1/cluster/transfer-leader", {"to": cluster.ids[changed]})
    cluster.wait_until(
        "the diverged node to hand leadership over",
        lambda: (view := cluster.health(leader)) is not None and view["leader"] not in (None, cluster.rafts[changed]),
        CHECK_TIMEOUT_S,
    )
    assert "handing leadership to another voter" in cluster.log_path(changed).read_text()

    # A restart on the same data does not clear it: the data dir records it.
    assert (cluster.data_dir(changed) / DIVERGED_FILE_NAME).exists()
    cluster.kill(changed)
    cluster.spawn(changed)
    cluster.wait_until("the restarted node still refusing", lambda: diverged(cluster, changed), CHECK_TIMEOUT_S)
    status, answer = Api(cluster.urls[changed], key=cluster.admin_key)("GET", path)
    assert (status, answer["error"]["code"]) == (503, "REPLICA_DIVERGED"), answer


def test_no_majority_raises_the_alarm_everywhere_and_reads_go_on(make_cluster: Callable[..., Cluster]) -> None:
    cluster, _, _, task_id = started_with_data(make_cluster)
    leader = cluster.leader_index()
    changed = [index for index in range(cluster.size) if index != leader]
    for shift, index in enumerate(changed, start=1):  # each its own way: three digests
        cluster.kill(index)
        space_created_ms_shifted(cluster.data_dir(index) / DUMP_FILE_NAME, shift)
    for index in changed:
        cluster.spawn(index)

    def undecided_everywhere() -> bool:
        views = [check_view(cluster, index) for index in range(cluster.size)]
        return all(view is not None and view["status"] == "undecided" for view in views)

    cluster.wait_until("every node undecided", undecided_everywhere, CHECK_TIMEOUT_S)
    for index in range(cluster.size):
        health = cluster.health(index)
        assert health is not None and health["status"] == "ok", health  # nobody is singled out
        samples, _ = scrape(cluster.urls[index], cluster.admin_key)
        assert value(samples, "runstate_replica_check_undecided") == 1
        assert value(samples, "runstate_replica_diverged") == 0
        assert "REPLICA CHECK UNDECIDED" in cluster.log_path(index).read_text()
    assert cluster.api(leader).resending().ok("GET", f"/v1/tasks/{task_id}")["id"] == task_id


def test_the_check_period_comes_from_the_flag_over_the_file_and_a_bad_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNSTATE_CLUSTER_SECRET", "s" * 32)
    node = ["node", "--node-id", "n1", "--api", "127.0.0.1:8081", "--raft", "127.0.0.1:9081",
            "--peer", "n2,127.0.0.1:9082,http://127.0.0.1:8082", "--data-dir", str(tmp_path / "data")]

    def config(*argv: str) -> NodeConfig:
        return cli.node_config(cli.build_parser().parse_args([*node, *argv]))

    assert config().replica_check_every_ms == REPLICA_CHECK_EVERY_MS_DEFAULT == 300_000
    assert config("--replica-check-every", "0").replica_check_every_ms == 0
    (tmp_path / "node.toml").write_text('replica_check_every = "30s"\n')
    assert config("--config", str(tmp_path / "node.toml")).replica_check_every_ms == 30_000
    assert config("--config", str(tmp_path / "node.toml"), "--replica-check-every", "2m").replica_check_every_ms == 120_000
    (tmp_path / "node.toml").write_text('replica_check_every = "often"\n')
    with pytest.raises(ConfigError, match="replica_check_every"):
        config("--config", str(tmp_path / "node.toml"))
    (tmp_path / "node.toml").write_text("replica_check_every = -1\n")
    with pytest.raises(ConfigError, match="replica_check_every"):
        config("--config", str(tmp_path / "node.toml"))
    finished = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", *node, "--replica-check-every", "soon"],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
    )
    assert finished.returncode == 2 and "--replica-check-every" in finished.stderr, finished.stderr
    assert "Traceback" not in finished.stderr
