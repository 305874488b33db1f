"""GET /metrics on real nodes: the text format parses, and the figures move as the queue does
(depth, in flight, a lapsed lease taken over, task histograms, requests by route template); in a
cluster every node answers with its own role, and counts its Raft messages."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runstate_server.cluster.config import LogConfig
from runstate_server.histogram import Histogram
from runstate_server.node.api.metrics import Exposition
from tests._cluster import Cluster
from tests._http import Api, call, recv, settle_ok, submit_task
from tests._nodes import DevNode
from tests._prometheus import Samples, parse, scrape, value

WAIT_S = 30.0  # how long a figure may take to move (a lapsed lease needs a tick); not asserted on
SEQUENTIAL_WRITES = 40
APPENDS_PER_WRITE = 1  # to each follower: the entry (the commit index rides on the next one)
# Fernet frames a node sends on a connection before its peer tells it reads AES-GCM (the key
# exchange, its level, a heartbeat): a few, were a connection made again during a measure.
FERNET_FRAMES_OF_A_RECONNECTION_MAX = 10
KEEPALIVE_WAIT_TIMEOUTS = 3  # connection timeouts of quiet: nine keepalive periods
MEASURE_ATTEMPTS = 3  # an election under a loaded machine's pauses spoils a measure: take it again
ANSWERS_WAIT_S = 5.0  # for the slower follower's last answers: a write waits only for the faster one
ANSWERS_POLL_S = 0.05
# The lease of a delivery the test lets lapse: long enough to still be held at the scrape right
# after it (a loaded machine's round trips), short enough for the lapse to be waited for.
LAPSING_LEASE_MS = 2_000


def test_the_text_format_escapes_label_values_and_renders_histograms() -> None:
    out = Exposition()
    odd = 'a "quoted" back\\slash\nnew line'
    out.metric("m", "gauge", "help with \\ and\nnewline", [((("label", odd),), 2.5)])
    histogram = Histogram((1.0, 2.0))
    for observed in (0.5, 1.0, 1.5, 9.0):
        histogram.observe(observed)
    out.histogram("h", "a histogram", [((), histogram.view())])
    text = out.text()
    assert "# HELP m help with \\\\ and\\nnewline\n" in text
    samples, types = parse(text)
    assert value(samples, "m", label=odd) == 2.5 and types == {"m": "gauge", "h": "histogram"}
    buckets = [value(samples, "h_bucket", le=bound) for bound in ("1", "2", "+Inf")]
    assert buckets == [2, 3, 4] and value(samples, "h_count") == 4 and value(samples, "h_sum") == 12


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

    first, second = recv(api, run_id, leaseMs=60_000)[0], recv(api, run_id, leaseMs=LAPSING_LEASE_MS)[0]
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
    brewed, _ = call(node.url, "PROPFIND", "/v1/files")  # a client's own method: counted as "other"
    samples, _ = scrape(node.url)
    assert value(samples, "runstate_http_requests_total", method="GET", route="unmatched", status="404") >= 1
    assert value(samples, "runstate_http_requests_total", method="other", route="unmatched", status=str(brewed)) == 1

    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    samples = wait_for(node.url, lambda s: value(s, "runstate_task_latency_seconds_count", state="CANCELLED") == 2)
    assert value(samples, "runstate_task_latency_seconds_count", state="CANCELLED") == 2
    assert ("runstate_queue_depth", frozenset({("space", "default"), ("mailbox", "work")})) not in samples


def test_a_restarted_node_counts_its_queues_again(node_factory: Any) -> None:
    node: DevNode = node_factory().start()
    api = Api(node.url)
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    for number in range(3):
        submit_task(api, run_id, {"n": number}, key=f"k{number}")
    recv(api, run_id, leaseMs=600_000)
    node.stop()
    node.start()
    samples, _ = scrape(node.url)
    assert (queue(samples, "runstate_queue_depth"), queue(samples, "runstate_queue_in_flight")) == (2, 1)
    assert value(samples, "runstate_lease_expiries_total") == 0


def test_waiters_of_a_permit_are_counted(node_factory: Any) -> None:
    node: DevNode = node_factory(in_memory=True).start()
    api = Api(node.url)
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    permit = api.ok("POST", "/v1/permits", {"name": "gpu", "units": 1})["id"]
    api.ok("POST", f"/v1/permits/{permit}/acquire", {"scopeId": run_id, "units": 1})
    for _ in range(2):
        api.ok("POST", f"/v1/permits/{permit}/wait", {"scopeId": run_id, "units": 1})
    samples, _ = scrape(node.url)
    labels = {"space": "default", "kind": "permit", "name": "gpu"}
    assert value(samples, "runstate_resource_waiters", **labels, waiter="line") == 2
    assert value(samples, "runstate_raft_fsync_seconds_count") == 0  # in memory: no journal


def test_every_cluster_node_answers_with_its_own_role(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()

    def agreed() -> list[Samples] | None:
        """Every node's figures once they show the leader the nodes agree on (an election under a
        loaded machine's pause may fall between the reads: read again)."""
        leader = cluster.leader_index()
        scraped = [scrape(url, cluster.admin_key)[0] for url in cluster.urls]
        roles = ["leader" if index == leader else "follower" for index in range(cluster.size)]
        agree = all(value(samples, "runstate_raft_role", role=role) == 1 for samples, role in zip(scraped, roles, strict=True))
        return scraped if agree and cluster.leader_index() == leader else None

    for samples in cluster.wait_until("every node to show the agreed leader's role", agreed, WAIT_S):
        assert value(samples, "runstate_raft_term") >= 1
        assert value(samples, "runstate_raft_applied_index") <= value(samples, "runstate_raft_commit_index")


def raft_messages(samples: Samples, direction: str, kind: str) -> float:
    return value(samples, "runstate_raft_messages_total", direction=direction, type=kind)


def test_the_leader_counts_its_raft_messages_and_a_write_costs_one_append_per_follower(
    make_cluster: Callable[..., Cluster],
) -> None:
    """runstate_raft_messages_total: a sequential write is one append_entries to each follower, and
    its answer; the new commit index rides on the next append or heartbeat (pysyncobj sent a second
    append for it: cluster/DESIGN.md, "One append per write")."""
    cluster = make_cluster().start()
    followers = cluster.size - 1
    heartbeat_s = LogConfig().append_entries_period_s
    for _ in range(MEASURE_ATTEMPTS):
        leader = cluster.leader_index()
        api = Api(cluster.urls[leader], key=cluster.admin_key)
        before, _ = scrape(cluster.urls[leader], cluster.admin_key)
        started = time.monotonic()
        statuses = [api("POST", "/v1/scopes", {})[0] for _ in range(SEQUENTIAL_WRITES)]
        if statuses != [201] * SEQUENTIAL_WRITES:
            continue  # another leader meanwhile
        # A write is acknowledged once one follower has it: the other's answers may still be on their way.
        deadline = time.monotonic() + ANSWERS_WAIT_S
        while True:
            after, _ = scrape(cluster.urls[leader], cluster.admin_key)
            sent = raft_messages(after, "sent", "append_entries") - raft_messages(before, "sent", "append_entries")
            answers = raft_messages(after, "received", "next_node_idx") - raft_messages(before, "received", "next_node_idx")
            if min(sent, answers) >= followers * SEQUENTIAL_WRITES or time.monotonic() >= deadline:
                break
            time.sleep(ANSWERS_POLL_S)
        elapsed_s = time.monotonic() - started
        if value(after, "runstate_raft_term") != value(before, "runstate_raft_term"):
            continue  # another leader meanwhile
        # Heartbeats go out only when no append went for a period: at most one per period elapsed
        # (each answered), so waiting for the last answers only widens the upper bound by what it let in.
        heartbeats = followers * (elapsed_s / heartbeat_s + 1)
        most = APPENDS_PER_WRITE * followers * SEQUENTIAL_WRITES + heartbeats
        assert followers * SEQUENTIAL_WRITES <= sent <= most, (sent, elapsed_s)
        assert followers * SEQUENTIAL_WRITES <= answers <= most, (answers, elapsed_s)
        # Its peers, of its release, told it they read AES-GCM frames: each append went as one.
        sealed = {
            name: value(after, "runstate_raft_frames_sealed_total", format=name)
            - value(before, "runstate_raft_frames_sealed_total", format=name)
            for name in ("aead", "fernet")
        }
        assert sealed["aead"] >= sent and sealed["fernet"] <= FERNET_FRAMES_OF_A_RECONNECTION_MAX, sealed
        return
    raise AssertionError(f"no {SEQUENTIAL_WRITES} writes in a row under one leader in {MEASURE_ATTEMPTS} attempts")


def test_followers_keep_their_idle_connection_alive(make_cluster: Callable[..., Cluster]) -> None:
    """Two followers never talk in a steady cluster; pysyncobj closes a connection that read nothing
    for its timeout when it next sends on it, so the first pre-vote after the leader died closed
    theirs instead of reaching the other. Each sends a keepalive on a connection idle for a third
    of that timeout, and so each reads one well within it."""
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    time.sleep(KEEPALIVE_WAIT_TIMEOUTS * LogConfig().connection_timeout_s)
    for index in range(cluster.size):
        if index == leader:
            continue
        samples, _ = scrape(cluster.urls[index], cluster.admin_key)
        assert raft_messages(samples, "received", "runstate_keepalive") >= 1
        assert raft_messages(samples, "sent", "runstate_keepalive") >= 1
