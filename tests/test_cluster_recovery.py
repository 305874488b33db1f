"""Three real cluster nodes recover: all killed at once and restarted, and a node whose data dir
was wiped rejoins from a snapshot."""

from __future__ import annotations

import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from runstate import Runstate

from runstate_server.cluster.log import DUMP_FILE_NAME
from tests._cluster import Cluster
from tests._http import recv, settle_ok, task_ok

WRITERS = 3
ACKS_BEFORE_KILL = 150
WAIT_S = 60.0


def test_every_acknowledged_result_survives_killing_all_three_nodes(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    with Runstate(api_key=cluster.admin_key, base_url=cluster.base_url, holder="setup") as rs:
        rs.mailboxes.ensure("work")
        run_id = rs.scopes.create().id
    submitted: list[tuple[str, int]] = []  # (task id, n) of acknowledged submits
    completed: list[tuple[str, int]] = []  # (task id, n) of acknowledged completes
    held: list[tuple[str, dict[str, Any]]] = []  # (task id, delivery) received, never completed
    stop = threading.Event()

    def writer(index: int) -> None:
        """Submit, receive, complete through its own node (forwarded to the leader when a follower);
        every fourth delivery is held instead of completed. Writes are sent again while they answer
        503 UNAVAILABLE (an election under load would end every writer at once)."""
        api = cluster.api(index).resending()
        n = index
        while not stop.is_set():
            try:
                task_id = task_ok(api, run_id, {"input": n, "key": f"k{n}"})["id"]
                submitted.append((task_id, n))
                (delivery,) = recv(api, run_id, leaseMs=60_000)
                if n % 4 == 0:
                    held.append((delivery["taskId"], delivery))
                else:
                    settle_ok(api, delivery, "complete", {"result": {"payload": delivery["input"]}})
                    completed.append((delivery["taskId"], delivery["input"]))
            except (OSError, AssertionError, ValueError):
                return  # the nodes died under us: what was not acknowledged may be lost
            n += WRITERS

    writers = [threading.Thread(target=writer, args=(index,)) for index in range(WRITERS)]
    for thread in writers:
        thread.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while len(completed) < ACKS_BEFORE_KILL and time.monotonic() < deadline and any(t.is_alive() for t in writers):
            time.sleep(0.01)
        cluster.kill_all()
    finally:
        stop.set()
        for thread in writers:
            thread.join()
    assert len(completed) >= ACKS_BEFORE_KILL, f"only {len(completed)} completes before the kill\n{cluster.logs()}"

    cluster.start()
    api = cluster.api(cluster.leader_index())
    resending = api.resending()  # an election right after the restart answers 503 UNAVAILABLE
    for task_id, n in submitted:
        view = api.ok("GET", f"/v1/tasks/{task_id}")
        assert (view["taskKey"], view["input"]) == (f"k{n}", n)
    for task_id, n in completed:
        view = api.ok("GET", f"/v1/tasks/{task_id}")
        assert (view["state"], view["outcome"]) == ("SUCCEEDED", n), view
    # Held leases survived too (the new leader extended them): their holders can complete.
    for task_id, delivery in held:
        assert api.ok("GET", f"/v1/tasks/{task_id}")["state"] == "RUNNING"
        settle_ok(resending, delivery, "complete", {"result": {"payload": "after restart"}})
    cluster.wait_same_digest()


def test_a_wiped_node_rejoins_from_a_snapshot(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster("--compact-after", "20").start()
    leader = cluster.leader_index()
    wiped = (leader + 1) % cluster.size
    with Runstate(api_key=cluster.admin_key, base_url=cluster.base_url, holder="writer") as rs:
        rs.mailboxes.ensure("work")
        run = rs.scopes.create()
        queue = run.mailbox("work")
        before = [queue.submit({"n": n}, key=f"before-{n}") for n in range(60)]
        cluster.kill(wiped)
        after = [queue.submit({"n": n}, key=f"after-{n}") for n in range(60)]
        for delivery in queue.receive(max=30):
            delivery.complete(result={"payload": delivery.input})
    # The leader's journal was compacted: a node starting from nothing needs its snapshot.
    cluster.wait_until("the leader's snapshot", (cluster.data_dir(leader) / DUMP_FILE_NAME).exists, WAIT_S)
    cluster.wipe(wiped)
    cluster.start(wiped)
    cluster.wait_same_digest()
    assert (cluster.data_dir(wiped) / DUMP_FILE_NAME).exists()  # it stored the snapshot it received
    # pysyncobj wrote it with the umask's mode; the node made it private (cluster/private_files.py).
    assert stat.S_IMODE((cluster.data_dir(wiped) / DUMP_FILE_NAME).stat().st_mode) == 0o600
    api = cluster.api(wiped)
    for ticket in before + after:
        assert api.ok("GET", f"/v1/tasks/{ticket.id}")["taskKey"] == ticket.key
