"""`runstate cluster transfer-leader` and `runstate cluster members` against three real nodes: the
leadership moves to the voter asked for (or the most caught-up one) under a steady keyed-submit
load, every acknowledged task is there afterwards, the load saw nothing but retryable 503s, and the
replicas agree; bad requests are refused and change nothing."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

from tests._cluster import Cluster
from tests._http import Api, keyed_call, mailbox_id, task_body
from tests.test_admin_cli import ok, ok_json, refused, runstate

LOAD_PAUSE_S = 0.005  # between two submits of the load
LEADER_TIMEOUT_S = 30.0


class Load:
    """Keyed submits, one after another, to each node in turn (followers forward), until stopped:
    the task ids acknowledged, and every answer that was not a success (503s are resent with the
    same Idempotency-Key by keyed_call, for up to 15 s)."""

    def __init__(self, cluster: Cluster, run_id: str, mailbox: str, nodes: list[int] | None = None) -> None:
        self.acknowledged: dict[str, str] = {}  # task key -> task id
        self.failures: list[tuple[int, Any]] = []
        self._nodes = list(range(cluster.size)) if nodes is None else nodes  # the nodes it sends to, in turn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(cluster, run_id, mailbox), daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self, cluster: Cluster, run_id: str, mailbox: str) -> None:
        for number in itertools.count():
            if self._stop.wait(LOAD_PAUSE_S):
                return
            api = cluster.api(self._nodes[number % len(self._nodes)])
            key = f"load-{number}"
            status, answer = keyed_call(api.base_url, "POST", api.space_path("/v1/tasks"),
                                        task_body(run_id, mailbox, {"n": number}, key), headers=api.headers)
            if status in (200, 201):
                self.acknowledged[key] = answer["taskId"]
            else:
                self.failures.append((status, answer))


def admin(cluster: Cluster, index: int) -> tuple[str, ...]:
    return ("--url", cluster.urls[index], "--api-key", cluster.admin_key or "")


def test_leadership_moves_to_the_voter_asked_for_under_load_and_nothing_is_lost(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster().start()
    setup = cluster.api(cluster.leader_index()).resending()
    run_id = setup.ok("POST", "/v1/scopes", {})["id"]
    mailbox = mailbox_id(setup)

    with Load(cluster, run_id, mailbox) as load:
        cluster.wait_until("a few acknowledged writes", lambda: len(load.acknowledged) >= 20 or None, LEADER_TIMEOUT_S)
        leader = cluster.leader_index()
        target, asked = [index for index in range(cluster.size) if index != leader]
        # Asked of a follower, which forwards the call to the leader.
        answer = ok_json("cluster", "transfer-leader", "--to", cluster.ids[target], *admin(cluster, asked))
        assert answer == {"leader": cluster.ids[target], "previousLeader": cluster.ids[leader], "transferred": True}
        assert cluster.leader_index() == target
        before = len(load.acknowledged)
        cluster.wait_until("writes under the new leader", lambda: len(load.acknowledged) > before + 20 or None,
                           LEADER_TIMEOUT_S)
        # Without --to: the most caught-up voter.
        text = ok("cluster", "transfer-leader", *admin(cluster, target))
        assert text.startswith(f"leadership handed from {cluster.ids[target]} to "), text
        assert cluster.leader_index() != target
        before = len(load.acknowledged)
        cluster.wait_until("writes under the third leader", lambda: len(load.acknowledged) > before + 20 or None,
                           LEADER_TIMEOUT_S)

    assert load.failures == []
    reader = cluster.api(cluster.leader_index()).resending()
    for key, task_id in load.acknowledged.items():
        task = reader.ok("GET", f"/v1/tasks/{task_id}")
        assert task["taskKey"] == key, task
    cluster.wait_same_digest()


def test_members_and_refused_transfers(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    follower = (leader + 1) % cluster.size

    def members() -> dict[str, Any] | None:
        view = ok_json("cluster", "members", *admin(cluster, follower))
        return view if all(node["reachable"] for node in view["nodes"]) else None

    view = cluster.wait_until("every member reachable", members, LEADER_TIMEOUT_S)
    assert view["leader"] == cluster.ids[leader]
    assert sorted(node["id"] for node in view["nodes"]) == cluster.ids
    for node in view["nodes"]:
        assert node["voter"] is True and isinstance(node["lag"], int) and node["lag"] >= 0, node
    text = ok("cluster", "members", *admin(cluster, follower))
    assert text.splitlines()[0].split() == ["ID", "ROLE", "VOTES", "LAG", "APPLIED", "REACHABLE", "API"]
    assert f"{cluster.ids[leader]} *" in text

    # The leader itself: nothing to do.
    answer = ok_json("cluster", "transfer-leader", "--to", cluster.ids[leader], *admin(cluster, follower))
    assert answer == {"leader": cluster.ids[leader], "previousLeader": cluster.ids[leader], "transferred": False}
    assert "no voter 'n9'" in refused("NOT_FOUND", "cluster", "transfer-leader", "--to", "n9", *admin(cluster, follower))
    # A key of a space, even an admin one of it, may not move the leader.
    api = cluster.api(leader).resending()
    space = api.ok("POST", "/v1/spaces", {"id": "tenant"})["id"]
    secret = api.ok("POST", "/v1/keys", {"space": space, "permissions": ["admin"]})["key"]
    tenant = Api(cluster.urls[follower], key=secret)
    assert tenant.error("POST", "/v1/cluster/transfer-leader", {"to": cluster.ids[follower]}) == (403, "FORBIDDEN")
    assert api.error("POST", "/v1/cluster/transfer-leader", {"to": 7}) == (400, "VALIDATION_FAILED")
    usage = runstate("cluster", "transfer-leader", "--to")
    assert usage.returncode == 2
    assert cluster.leader_index() == leader
