"""Command levels (cluster/DESIGN.md): each node tells its peers the commands it applies, and a
leader proposes a batch submit as one `task.submit_many` command (level 2) only while every node
told it level 2, or the log proves it; otherwise as one `task.submit` per task, which a node of an
older release applies too. On a real three-node cluster: a node started with `--command-level 1`
(as a node of the older release counts) keeps the leader at one command per task, until it is
restarted at this release's level; the answers are the same either way and the replicas agree."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

from runstate_server.actors.dispatch import COMMAND_LEVEL, NUMBER_CREATIONS_LEVEL, SUBMIT_MANY_LEVEL
from runstate_server.node.api._paging import decode_cursor
from tests._cluster import Cluster
from tests._http import Api, mailbox_id, task_body
from tests._prometheus import scrape, value

BATCH = 50
LEVEL_TIMEOUT_S = 30.0  # until a restarted node is connected and has told its level
MEASURE_ATTEMPTS = 3  # an election meanwhile (a loaded machine) spoils a measure: take it again
START_TIMEOUT_S = 60.0  # a node that refuses its settings exits long before


def level(cluster: Cluster, index: int) -> float:
    samples, _ = scrape(cluster.urls[index], cluster.admin_key)
    return value(samples, "runstate_command_level")


def wait_level(cluster: Cluster, expected: int) -> int:
    """The leader, once it proposes at `expected`."""
    return int(cluster.wait_until(
        f"command level {expected}",
        lambda: next((index + 1 for index in [cluster.leader_index()] if level(cluster, index) == expected), None),
        LEVEL_TIMEOUT_S,
    )) - 1


def submit_batch(cluster: Cluster, run_id: str, mailbox: str, prefix: str) -> tuple[list[dict[str, Any]], float]:
    """POST /tasks/batch of BATCH new tasks to the leader: the answers, and the commands the leader
    proposed meanwhile (it proposes nothing else here: nothing is due, every read is a read index)."""
    for _ in range(MEASURE_ATTEMPTS):
        leader = cluster.leader_index()
        before, _ = scrape(cluster.urls[leader], cluster.admin_key)
        tasks = [task_body(run_id, mailbox, {"n": n}, f"{prefix}-{n}") for n in range(BATCH)]
        status, answer = cluster.api(leader)("POST", "/v1/tasks/batch", {"tasks": tasks})
        after, _ = scrape(cluster.urls[leader], cluster.admin_key)
        if status == 200 and value(after, "runstate_raft_term") == value(before, "runstate_raft_term"):
            proposed = (value(after, "runstate_raft_commands_proposed_total")
                        - value(before, "runstate_raft_commands_proposed_total"))
            return answer["tasks"], proposed
    raise AssertionError(f"no batch under one leader in {MEASURE_ATTEMPTS} attempts")


def test_a_batch_submit_is_one_command_only_while_every_node_applies_it(
    make_cluster: Callable[..., Cluster],
) -> None:
    """A rolling upgrade's last step: one node still at level 1 keeps the leader at one command
    per task; restarted at this release's level, the leader proposes a batch as one command, and
    from then on for good (the log proves the level: a node restarted at level 1 no longer brings
    it down, as a paused follower's closed connection does not: tests/test_cluster_idempotency.py)."""
    cluster = make_cluster()
    older = cluster.size - 1
    cluster.node_args[older] = ("--command-level", "1")
    cluster.start()
    leader = wait_level(cluster, 1)
    assert COMMAND_LEVEL >= SUBMIT_MANY_LEVEL
    api = cluster.api(leader).resending()
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    mailbox = mailbox_id(api)

    answers, proposed = submit_batch(cluster, run_id, mailbox, "one-old")
    assert [answer.get("created") for answer in answers] == [True] * BATCH, answers
    assert proposed >= BATCH, proposed  # one command per task

    cluster.node_args[older] = ()
    cluster.kill(older)
    cluster.start(older)
    wait_level(cluster, COMMAND_LEVEL)
    answers, proposed = submit_batch(cluster, run_id, mailbox, "upgraded")
    assert [answer.get("created") for answer in answers] == [True] * BATCH, answers
    assert proposed < BATCH / 10, proposed  # one command for the batch
    # Tasks submitted either way are the same tasks when submitted again either way.
    resubmitted, proposed = submit_batch(cluster, run_id, mailbox, "one-old")
    assert [answer["created"] for answer in resubmitted] == [False] * BATCH
    assert proposed < BATCH / 10, proposed

    # Once the leader started the creation numbers (a level-3 entry, within a tick of every node
    # telling level 3), the level is proven: a node that tells level 1 again does not lower it.
    cluster.wait_until("creation numbers", lambda: numbered(api, run_id) or None, LEVEL_TIMEOUT_S)
    cluster.wait_until(
        "the level proven", lambda: proven(cluster, cluster.leader_index()) == COMMAND_LEVEL or None, LEVEL_TIMEOUT_S,
    )
    cluster.node_args[older] = ("--command-level", "1")
    cluster.kill(older)
    cluster.start(older)
    cluster.wait_until("the older node connected", lambda: level(cluster, older) == 1 or None, LEVEL_TIMEOUT_S)
    resubmitted, proposed = submit_batch(cluster, run_id, mailbox, "upgraded")
    assert [answer["taskId"] for answer in resubmitted] == [answer["taskId"] for answer in answers]
    assert proposed < BATCH / 10, proposed
    assert level(cluster, cluster.leader_index()) == COMMAND_LEVEL
    cluster.wait_same_digest()


def proven(cluster: Cluster, index: int) -> float:
    samples, _ = scrape(cluster.urls[index], cluster.admin_key)
    return value(samples, "runstate_command_level_proven")


def numbered(api: Api, run_id: str) -> bool:
    """The state's creation numbers started: a page's cursor names a number above 0."""
    page = api.ok("GET", f"/v1/tasks?scopeId={run_id}&limit=1")
    return bool(decode_cursor(page["nextCursor"])[1])


def paged_task_ids(cluster: Cluster, run_id: str, page: int) -> list[str]:
    """Every task of the run, newest first, `page` at a time through the leader's list route."""
    api = cluster.api(cluster.leader_index()).resending()
    seen: list[str] = []
    cursor = ""
    while True:
        answer = api.ok("GET", f"/v1/tasks?scopeId={run_id}&limit={page}&cursor={cursor}")
        seen.extend(task["id"] for task in answer["tasks"])
        if answer["nextCursor"] is None:
            return seen
        cursor = answer["nextCursor"]


def test_creation_numbers_start_once_every_node_applies_them(make_cluster: Callable[..., Cluster]) -> None:
    """A cluster with a node of an earlier level (a rolling upgrade under way): the leader does not
    start the state's creation numbers, by which lists page (`state.number_creations`, level 3).
    Once that node runs this release's level, it does, at one index of the log: the tasks made
    before and after list in creation order on every page, and the replicas agree."""
    cluster = make_cluster()
    older = cluster.size - 1
    cluster.node_args[older] = ("--command-level", str(NUMBER_CREATIONS_LEVEL - 1))
    cluster.start()
    wait_level(cluster, NUMBER_CREATIONS_LEVEL - 1)
    api = cluster.api(cluster.leader_index()).resending()
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    mailbox = mailbox_id(api)
    before, _ = submit_batch(cluster, run_id, mailbox, "before")
    # Not numbered yet: a page's cursor (creation ms, creation number) names number 0.
    first_page = api.ok("GET", f"/v1/tasks?scopeId={run_id}&limit=7")
    assert decode_cursor(first_page["nextCursor"])[1] == 0

    cluster.node_args[older] = ()
    cluster.kill(older)
    cluster.start(older)
    wait_level(cluster, COMMAND_LEVEL)
    after, _ = submit_batch(cluster, run_id, mailbox, "after")
    made = [answer["taskId"] for answer in [*before, *after]]
    # A batch shares one millisecond: only creation numbers page it in its order, 7 at a time.
    cluster.wait_until(
        "every task paged in creation order", lambda: paged_task_ids(cluster, run_id, 7) == made[::-1] or None,
        LEVEL_TIMEOUT_S,
    )
    first_page = cluster.api(cluster.leader_index()).resending().ok("GET", f"/v1/tasks?scopeId={run_id}&limit=7")
    assert decode_cursor(first_page["nextCursor"])[1] == len(made) + 1 - 6  # the run is number 1
    cluster.wait_same_digest()


def test_a_node_refuses_a_command_level_it_does_not_have(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster()
    for level_text in (str(COMMAND_LEVEL + 1), "0"):
        cluster.node_args[0] = ("--command-level", level_text)
        finished = subprocess.run(cluster.command(0), capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False)
        assert finished.returncode == 2, (finished.returncode, finished.stderr)
        assert f"command_level must be an integer from 1 to {COMMAND_LEVEL}" in finished.stderr, finished.stderr
