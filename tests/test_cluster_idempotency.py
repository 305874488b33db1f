"""Idempotency keys across a follower's pause, on a real three-node cluster (issue 47).

A follower stopped with SIGSTOP for longer than the Raft connection timeout loses its connection
to the leader, and a peer not connected counts as command level 1. The leader used to propose a
batch submit then as one command per task (keyed `KEY#i`) and, the follower back, as one
`task.submit_many` (keyed `KEY`): a retry of the batch under the same Idempotency-Key found no
record of the first and was applied again (`created: false`, where the first answer said true).
Now one request takes one form for good once the log proves the cluster's level
(dispatch.proven_level), and a retry gets the first answer, whichever way the follower stood."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runstate_server.actors.dispatch import COMMAND_LEVEL
from tests._cluster import Cluster
from tests._http import IDEMPOTENCY_HEADER, call, mailbox_id, task_body
from tests._prometheus import scrape, value

BATCH = 5
CONNECTION_TIMEOUT_S = 30.0  # until the leader closed a paused peer's connection, or took it back
LEVEL_TIMEOUT_S = 30.0  # until every peer connected and told its level


def leader_metric(cluster: Cluster, name: str) -> tuple[int, float]:
    leader = cluster.leader_index()
    samples, _ = scrape(cluster.urls[leader], cluster.admin_key)
    return leader, value(samples, name)


def wait_connected(cluster: Cluster, peers: int) -> int:
    """The leader, once it is connected to `peers` peers."""
    return int(cluster.wait_until(
        f"the leader connected to {peers} peers",
        lambda: next((leader + 1 for leader, connected in [leader_metric(cluster, "runstate_raft_peers_connected")]
                      if connected == peers), None),
        CONNECTION_TIMEOUT_S,
    )) - 1


def send(cluster: Cluster, index: int, path: str, body: Any, key: str) -> tuple[int, Any]:
    api = cluster.api(index)
    return call(api.base_url, "POST", api.space_path(path), body, headers={**api.headers, IDEMPOTENCY_HEADER: key})


def test_a_retry_across_a_paused_follower_gets_the_first_answer(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    cluster.wait_until(
        f"command level {COMMAND_LEVEL}",
        lambda: leader_metric(cluster, "runstate_command_level")[1] == COMMAND_LEVEL or None,
        LEVEL_TIMEOUT_S,
    )
    setup = cluster.api(cluster.leader_index()).resending()
    run_id = setup.ok("POST", "/v1/scopes", {})["id"]
    mailbox = mailbox_id(setup)
    follower = next(index for index in range(cluster.size) if index != cluster.leader_index())

    def batch(name: str) -> dict[str, Any]:
        return {"tasks": [task_body(run_id, mailbox, {"n": n}, f"{name}-{n}") for n in range(BATCH)]}

    def single(name: str) -> dict[str, Any]:
        return task_body(run_id, mailbox, {"single": name}, name)

    requests = {  # (path, body) by idempotency key: a batch and a single submit each way
        "paused-first-batch": ("/v1/tasks/batch", batch("paused-first")),
        "paused-first-single": ("/v1/tasks", single("paused-first-single")),
        "connected-first-batch": ("/v1/tasks/batch", batch("connected-first")),
        "connected-first-single": ("/v1/tasks", single("connected-first-single")),
    }
    first: dict[str, tuple[int, Any]] = {}

    def send_all(keys: list[str], answers: dict[str, tuple[int, Any]]) -> None:
        for key in keys:
            path, body = requests[key]
            answers[key] = send(cluster, cluster.leader_index(), path, body, key)

    connected_first = ["connected-first-batch", "connected-first-single"]
    paused_first = ["paused-first-batch", "paused-first-single"]
    send_all(connected_first, first)
    cluster.pause(follower)
    wait_connected(cluster, cluster.size - 2)
    send_all(paused_first, first)
    retried: dict[str, tuple[int, Any]] = {}
    send_all(connected_first, retried)  # sent first with every peer connected, now with one paused
    cluster.resume(follower)
    wait_connected(cluster, cluster.size - 1)
    send_all(paused_first, retried)  # sent first with one paused, now with every peer connected

    for key, (status, answer) in first.items():
        assert status in (200, 201), (key, status, answer)
        created = [task["created"] for task in answer["tasks"]] if "tasks" in answer else [answer["created"]]
        assert created == [True] * len(created), (key, answer)
    assert retried == first
    cluster.wait_same_digest()
