"""GET /metrics on real nodes: the text format parses, and the figures move as the queue does
(depth, in flight, a lapsed lease taken over, task histograms, requests by route template); in a
cluster every node answers with its own role."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from tests._cluster import Cluster
from tests._http import Api, recv, settle_ok, submit_task
from tests._nodes import DevNode

WAIT_S = 30.0  # how long a figure may take to move (a lapsed lease needs a tick); not asserted on
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> tuple[Samples, dict[str, str]]:
    """Prometheus' text format: samples by (name, labels), and each family's TYPE."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match is not None, line
        name, _, label_text, value = match.groups()
        labels = frozenset(
            (key, raw.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"))
            for key, raw, _ in LABEL.findall(label_text or "")
        )
        assert (name, labels) not in samples, line
        samples[(name, labels)] = float(value)
    return samples, types


def scrape(url: str, key: str | None = None) -> tuple[Samples, dict[str, str]]:
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {key}"} if key else {})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return parse(answer.read().decode())


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def queue(samples: Samples, name: str) -> float:
    return value(samples, name, space="default", mailbox="work")


def wait_for(url: str, check: Callable[[Samples], bool]) -> Samples:
    deadline = time.monotonic() + WAIT_S
    while True:
        samples, _ = scrape(url)
        if check(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def test_the_figures_follow_the_queue(node_factory: Any) -> None:
    node: DevNode = node_factory().start()
    api = Api(node.url)
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    for number in range(3):
        submit_task(api, run_id, {"n": number}, key=f"k{number}")
    samples, types = scrape(node.url)
    assert types["runstate_queue_depth"] == "gauge" and types["runstate_task_latency_seconds"] == "histogram"
    assert (queue(samples, "runstate_queue_depth"), queue(samples, "runstate_queue_in_flight")) == (3, 0)
    assert queue(samples, "runstate_queue_oldest_age_seconds") >= 0
    assert value(samples, "runstate_raft_role", role="leader") == 1
    assert value(samples, "runstate_raft_role", role="follower") == 0
    assert value(samples, "runstate_raft_applied_index") > 0
    assert value(samples, "runstate_raft_fsync_seconds_count") > 0  # a data dir, fsync always
    assert value(samples, "runstate_raft_fsync_seconds_bucket", le="+Inf") == value(samples, "runstate_raft_fsync_seconds_count")

    first, second = recv(api, run_id, leaseMs=60_000)[0], recv(api, run_id, leaseMs=100)[0]
    samples, _ = scrape(node.url)
    assert (queue(samples, "runstate_queue_depth"), queue(samples, "runstate_queue_in_flight")) == (1, 2)
    settle_ok(api, first, "complete", {"result": {"ok": True}})
    # The second delivery's lease lapses: the task is queued again for another worker.
    samples = wait_for(node.url, lambda s: value(s, "runstate_takeovers_total") >= 1)
    assert value(samples, "runstate_lease_expiries_total") == value(samples, "runstate_takeovers_total") == 1
    assert (queue(samples, "runstate_queue_depth"), queue(samples, "runstate_queue_in_flight")) == (2, 0)
    assert second["taskId"] != first["taskId"]
    assert value(samples, "runstate_task_latency_seconds_count", state="SUCCEEDED") == 1
    assert value(samples, "runstate_task_attempts_bucket", state="SUCCEEDED", le="1") == 1
    assert value(samples, "runstate_task_attempts_bucket", state="SUCCEEDED", le="0") == 0
    assert value(samples, "runstate_task_latency_seconds_count", state="FAILED") == 0

    # Requests by route template (never a raw path with ids), and status.
    assert value(samples, "runstate_http_requests_total", method="POST", route="/v1/spaces/{spaceId}/tasks", status="201") == 3
    routes = {dict(labels).get("route", "") for name, labels in samples if name == "runstate_http_requests_total"}
    assert any(route.endswith("/complete") and "{" in route for route in routes), routes
    assert not any(run_id in route or first["taskId"] in route for route in routes)
    api.error("GET", "/v1/no-such-route")
    samples, _ = scrape(node.url)
    assert value(samples, "runstate_http_requests_total", method="GET", route="unmatched", status="404") >= 1

    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    samples = wait_for(node.url, lambda s: value(s, "runstate_task_latency_seconds_count", state="CANCELLED") == 2)
    assert value(samples, "runstate_task_latency_seconds_count", state="CANCELLED") == 2
    assert ("runstate_queue_depth", frozenset({("space", "default"), ("mailbox", "work")})) not in samples


def test_every_cluster_node_answers_with_its_own_role(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    for index in range(cluster.size):
        samples, _ = scrape(cluster.urls[index], cluster.admin_key)
        role = "leader" if index == leader else "follower"
        assert value(samples, "runstate_raft_role", role=role) == 1, (index, role)
        assert value(samples, "runstate_raft_term") >= 1
        assert value(samples, "runstate_raft_applied_index") <= value(samples, "runstate_raft_commit_index")
