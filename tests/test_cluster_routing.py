"""Followers forward to the leader: a forwarded call is never forwarded again, and a forward to a
leader that stopped answering does not outlive the election of the next one. Also the failover
benchmark's short form."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runstate import AsyncRunstate

from runstate_server.node.config import PROPOSE_TIMEOUT_S
from tests import _raw_http as raw_http
from tests._cluster import Cluster
from tests._http import Api, call, mailbox_id, recv, recv_path, task_ok
from tests._long_polls import LONG_POLL_WAIT_MS, STOP_WITH_LONG_POLLS_S, parked_long_polls, start_long_polls
from tests._prometheus import scrape, value

REPOSITORY = Path(__file__).resolve().parents[1]
# The SDK's own bound on an ordinary request (runstate.sdk._http.REQUEST_TIMEOUT_S_DEFAULT) plus a
# margin: a follower that holds a call longer than this has already lost the client.
ANSWER_BOUND_S = 12.0
# How long a write sent to the leader takes at most to be read and proposed (it then waits).
WRITE_ARRIVES_S = 30.0  # for a write to be read and proposed by the leader (polled)
WRITE_ARRIVES_POLL_S = 0.02
BENCH_TIMEOUT_S = 180


def test_followers_forward_and_a_forwarded_call_is_not_forwarded_again(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    follower = (leader + 1) % cluster.size
    api = cluster.api(follower)
    setup = api.resending()  # an election right after the start answers 503 UNAVAILABLE
    setup.ok("POST", "/v1/mailboxes", {"name": "work"})
    run_id = setup.ok("POST", "/v1/scopes", {})["id"]
    assert cluster.api(leader).ok("GET", f"/v1/scopes/{run_id}")["storedState"] == "ACTIVE"
    hop = {"X-Runstate-Forwarded-By": cluster.ids[leader], "Authorization": f"Bearer {cluster.admin_key}"}
    run_path = api.space_path(f"/v1/scopes/{run_id}")
    status, body = call(cluster.urls[follower], "GET", run_path, headers=hop)
    assert (status, body["error"]["code"]) == (503, "UNAVAILABLE")
    assert body["error"]["requestId"].startswith("req_")
    # The leader serves a forwarded call itself.
    assert call(cluster.urls[leader], "GET", run_path, headers=hop)[0] == 200
    view = api.ok("GET", "/v1/cluster")
    assert view["leader"] == cluster.ids[leader]
    assert sorted(node["id"] for node in view["nodes"]) == cluster.ids
    assert all(node["reachable"] for node in view["nodes"])


def test_a_forwarded_call_reaches_the_leader_as_sent_and_its_answer_comes_back_as_given(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster().start()
    leader, follower, api, setup, run_id = run_through_a_follower(cluster)
    auth = {"Authorization": f"Bearer {cluster.admin_key}"}
    # A request target with percent-escapes and a query, and an Expect the follower answered
    # itself: the leader reads the same target, and the follower adds its own answer headers.
    path = api.space_path(f"/v1/scopes/{run_id}") + "?x=%C3%A9%20y"
    body = json.dumps({"name": "caf\u00e9 run"}).encode()
    through_follower = raw_http.send(
        cluster.urls[follower], "GET", path, headers={**auth, "X-Request-Id": "req_from_the_client"},
    )
    direct = raw_http.send(cluster.urls[leader], "GET", path, headers=auth)
    assert (through_follower.status, through_follower.json()) == (200, direct.json())
    relayed = {name.lower(): value for name, value in through_follower.headers.items()}
    assert relayed["content-type"] == {name.lower(): value for name, value in direct.headers.items()}["content-type"]
    assert relayed["x-runstate-leader"] == cluster.urls[leader]
    assert relayed["x-request-id"].startswith("req_") and relayed["x-request-id"] != "req_from_the_client"
    encoded = raw_http.send(cluster.urls[follower], "GET", api.space_path("/v1/scopes/run_%41%42"), headers=auth)
    assert (encoded.status, encoded.code) == (404, "NOT_FOUND")
    assert "run_AB" in encoded.json()["error"]["message"]
    expecting = raw_http.send(
        cluster.urls[follower], "POST", api.space_path("/v1/scopes"), body,
        headers={**auth, "Content-Type": "application/json", "Expect": "100-continue"},
    )
    assert expecting.status == 201, expecting.body
    assert setup.ok("GET", f"/v1/scopes/{expecting.json()['id']}")["name"] == "caf\u00e9 run"


def run_through_a_follower(cluster: Cluster) -> tuple[int, int, Api, Api, str]:
    """The leader's and a follower's index, the follower's client (and one that resends while an
    election right after the start answers 503 UNAVAILABLE), and a run with a queue "work" made
    through it."""
    leader = cluster.leader_index()
    follower = (leader + 1) % cluster.size
    api = cluster.api(follower)
    setup = api.resending()
    mailbox_id(setup)
    return leader, follower, api, setup, setup.ok("POST", "/v1/scopes", {})["id"]


# Receives held through one follower: past the 256 connections a follower used to forward at once.
FORWARDED_LONG_POLLS = 300


def test_forwarded_long_polls_never_hold_up_the_followers_other_calls(make_cluster: Callable[..., Cluster]) -> None:
    """300 receives of idle workers parked on the leader through one follower, then a create through
    the same follower: it is answered while every receive still waits (with the follower's
    forwarding capped at 256 connections, it waited until one of the receives ended)."""
    cluster = make_cluster().start()
    leader, follower, api, setup, run_id = run_through_a_follower(cluster)
    body = json.dumps({"scopeId": run_id, "waitMs": LONG_POLL_WAIT_MS, "max": 1}).encode()
    head = (
        f"POST {api.space_path(recv_path(setup))} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {cluster.admin_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    port = int(cluster.urls[follower].rsplit(":", 1)[1])

    async def main() -> None:
        writers: list[asyncio.StreamWriter] = []
        answers: list[asyncio.Task[bytes]] = []
        try:
            for _ in range(FORWARDED_LONG_POLLS):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(head + body)
                writers.append(writer)
                answers.append(asyncio.create_task(reader.read(1)))
            await asyncio.to_thread(parked_long_polls, cluster.urls[leader], FORWARDED_LONG_POLLS, cluster.admin_key)
            created = await asyncio.wait_for(asyncio.to_thread(api.ok, "POST", "/v1/scopes", {}), ANSWER_BOUND_S)
            assert created["id"].startswith("run_")
            assert not any(answer.done() for answer in answers)  # every receive still waits
        finally:
            for answer in answers:
                answer.cancel()
            for writer in writers:
                writer.close()

    asyncio.run(main())


def test_a_stopping_follower_gives_up_its_forwarded_long_polls(make_cluster: Callable[..., Cluster]) -> None:
    """SIGTERM of a follower with long polls forwarded to the leader: it answers them UNAVAILABLE
    (their clients poll again at another node) and stops, instead of waiting out their 30 s."""
    cluster = make_cluster().start()
    leader, follower, api, setup, run_id = run_through_a_follower(cluster)
    task_id = task_ok(setup, run_id, {"input": 1})["id"]
    assert recv(setup, run_id)  # the queue is empty now: a receive waits
    polls = {
        "task": ("GET", f"/v1/tasks/{task_id}?waitMs={LONG_POLL_WAIT_MS}", None),
        "receive": ("POST", recv_path(setup), {"scopeId": run_id, "waitMs": LONG_POLL_WAIT_MS, "max": 1}),
    }
    threads, answers = start_long_polls(api, polls)
    parked_long_polls(cluster.urls[leader], len(polls), cluster.admin_key)  # forwarded: parked on the leader
    process = cluster.processes[follower]
    assert process is not None
    process.send_signal(signal.SIGTERM)
    assert process.wait(STOP_WITH_LONG_POLLS_S) == 0
    cluster.stopped.add(follower)
    for thread in threads:
        thread.join(ANSWER_BOUND_S)
    assert {name: (status, answer["error"]["code"]) for name, (status, answer) in answers.items()} == {
        "task": (503, "UNAVAILABLE"), "receive": (503, "UNAVAILABLE"),
    }


def proposed(cluster: Cluster, index: int) -> float:
    """The commands node `index` proposed so far (GET /metrics)."""
    samples, _ = scrape(cluster.urls[index], cluster.admin_key)
    return value(samples, "runstate_raft_commands_proposed_total")


def test_a_stopping_leader_answers_a_write_no_majority_will_commit_and_stops(
    make_cluster: Callable[..., Cluster],
) -> None:
    """SIGTERM of the whole cluster at once (every container stopped together): the leader's
    writes wait for a commit the stopping followers will never make. Its stop waited out their
    PROPOSE_TIMEOUT_S (10 s, the SIGKILL grace of a container); after WRITE_STOP_GRACE_S they
    answer UNAVAILABLE, outcome unknown (a keyed retry is safe), and the node stops."""
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    api = cluster.api(leader)
    scopes = api.space_path("/v1/scopes")  # its whoami read while the followers answer
    for follower in range(cluster.size):
        if follower != leader:
            cluster.pause(follower)  # they will never acknowledge the write
    answers: list[tuple[int, Any]] = []
    proposed_before = proposed(cluster, leader)
    writer = threading.Thread(target=lambda: answers.append(api("POST", scopes, {})))
    writer.start()
    deadline = time.monotonic() + WRITE_ARRIVES_S
    while proposed(cluster, leader) == proposed_before:  # the write was read and proposed
        assert time.monotonic() < deadline, f"the leader proposed no write within {WRITE_ARRIVES_S} s"
        time.sleep(WRITE_ARRIVES_POLL_S)
    process = cluster.processes[leader]
    assert process is not None
    signalled_at = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(ANSWER_BOUND_S) == 0
    stop_s = time.monotonic() - signalled_at
    cluster.stopped.add(leader)
    writer.join(ANSWER_BOUND_S)
    assert len(answers) == 1
    status, body = answers[0]
    assert (status, body["error"]["code"]) == (503, "UNAVAILABLE"), body
    assert "the outcome is unknown" in body["error"]["message"]
    assert stop_s < PROPOSE_TIMEOUT_S / 2, f"the leader took {stop_s:.1f} s to stop"


def test_a_forward_to_a_frozen_leader_does_not_outlive_the_next_election(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster().start()
    old = cluster.leader_index()
    follower = (old + 1) % cluster.size
    api = cluster.api(follower)
    setup = api.resending()  # an election right after the start answers 503 UNAVAILABLE
    setup.ok("POST", "/v1/mailboxes", {"name": "work"})
    run_id = setup.ok("POST", "/v1/scopes", {})["id"]
    answers: list[tuple[int, Any]] = []
    cluster.pause(old)
    reader = threading.Thread(target=lambda: answers.append(api("GET", f"/v1/scopes/{run_id}")))
    reader.start()
    try:
        new = cluster.leader_index(exclude=[old])
        assert new != old
        reader.join(ANSWER_BOUND_S)  # the old leader stays frozen meanwhile
        assert answers, (
            f"GET /v1/scopes/{{id}} sent to follower {cluster.ids[follower]} is still unanswered "
            f"{ANSWER_BOUND_S} s after {cluster.ids[new]} was elected"
        )
        status, body = answers[0]
        assert status == 200 or body["error"]["code"] == "UNAVAILABLE", (status, body)
    finally:
        cluster.kill(old)  # drops the forward's connection: the follower answers, the thread ends
        reader.join()


def test_failover_bench_short_form() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "bench.failover", "--runs", "1"],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert report["benchmark"] == "failover"
    assert len(report["runs"]) == 1 and report["median_s"] > 0
    assert report["runs"][0]["killed"] != report["runs"][0]["new_leader"]


def test_a_client_learns_the_leader_from_a_forwarded_answer(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    follower = (leader + 1) % cluster.size
    with urllib.request.urlopen(f"{cluster.urls[follower]}/v1/openapi.json") as local:
        assert "X-Runstate-Leader" not in local.headers  # node-local: served where it arrives
    request = urllib.request.Request(
        cluster.urls[follower] + cluster.api(follower).space_path("/v1/mailboxes"), data=b'{"name": "work"}', method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {cluster.admin_key}"},
    )
    with urllib.request.urlopen(request) as forwarded:
        assert forwarded.headers["X-Runstate-Leader"] == cluster.urls[leader]
        assert forwarded.headers["X-Request-Id"].startswith("req_")  # the leader's answer, relayed

    async def main() -> None:
        urls = [cluster.urls[follower], *(url for url in cluster.urls if url != cluster.urls[follower])]
        async with AsyncRunstate(base_url=urls, api_key=cluster.admin_key) as rs:
            await rs.mailboxes.ensure("work")  # forwarded by the follower, which names the leader
            assert rs._transport.base_urls[rs._transport._url_index] == cluster.urls[leader]
            run = await rs.scopes.create()  # now sent to the leader directly
            assert (await run.status())["storedState"] == "ACTIVE"

    asyncio.run(main())


def test_a_call_forwarded_to_a_killed_leader_waits_for_the_next_one(make_cluster: Callable[..., Cluster]) -> None:
    """kill -9 of the leader: a follower that forwards a call finds the leader's API closed (the
    call never reached it), waits for the next leader and forwards it there, instead of answering
    503 at once and leaving the client to back off. The other follower is frozen meanwhile, so no
    leader can be elected before the call arrives; it resumes shortly after."""
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    follower, other = (leader + 1) % cluster.size, (leader + 2) % cluster.size
    # Set up through the leader: the follower holds no kept-alive connection to its API, so the
    # forward after the kill is refused at connect (a reused one may fail after sending instead).
    direct = cluster.api(leader)
    direct.resending().ok("POST", "/v1/mailboxes", {"name": "work"})
    path = direct.space_path("/v1/mailboxes")
    cluster.pause(other)
    cluster.kill(leader)
    resume = threading.Timer(0.3, cluster.resume, (other,))
    resume.start()
    try:
        status, body = call(cluster.urls[follower], "POST", path, {"name": "after-the-kill"}, headers=direct.headers)
    finally:
        resume.join()
    assert status == 201, (status, body)
    assert cluster.leader_index(exclude=[leader]) in (follower, other)
