"""Whole-cluster power loss: every node killed with kill -9 at once, mid-load, then restarted on its
data; every write acknowledged before the kill is there (its task, and SUCCEEDED where its complete
was acknowledged), and the replicas agree on one digest. Several rounds on the same data dirs.

The default run does POWER_LOSS_ROUNDS_DEFAULT rounds; the long form sets RUNSTATE_POWER_LOSS_ROUNDS
(docs/chaos.md, "Whole-cluster power loss": 50 rounds).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests._cluster import Cluster
from tests._http import call, mailbox_id, task_body

pytestmark = pytest.mark.slow

POWER_LOSS_ROUNDS_DEFAULT = 3
ROUNDS_ENV = "RUNSTATE_POWER_LOSS_ROUNDS"
SEED_ENV = "RUNSTATE_POWER_LOSS_SEED"
# The load runs this long (drawn per round) before the power goes; enough for dozens of writes.
LOAD_S_MIN, LOAD_S_MAX = 0.3, 1.2
LOAD_TIMEOUT_S = 30.0  # the load's first acknowledged writes after a (re)start
ACKS_MIN = 5  # the writes acknowledged before the kill, at least, for a round to count
LOAD_STOP_TIMEOUT_S = 90.0  # the load thread's last call (the HTTP client's own timeout bounds it)
COMPACT_AFTER = "100"  # dumps and journals both: a restart loads a dump and replays the entries after it
ROUND_TIMEOUT_S = 60  # a round's share of the test's timeout (a round takes 3-8 s on a loaded 2-core machine)
ROUNDS = int(os.environ.get(ROUNDS_ENV, POWER_LOSS_ROUNDS_DEFAULT))
RECV_HOLDER = {"holder": "power-loss", "holderSession": "s1", "max": 1, "leaseSeconds": 60}


class Load:
    """Keyed submits and completes over HTTP to the nodes in turn, until stopped: what was acknowledged
    (a 2xx answer). A call that did not answer (the power went) is unknown, and not counted."""

    def __init__(self, cluster: Cluster, run_id: str, mailbox: str, round_number: int) -> None:
        self.submitted: dict[str, str] = {}  # task key -> task id, acknowledged
        self.completed: set[str] = set()  # task ids whose complete was acknowledged
        self._cluster, self._run_id, self._mailbox, self._round = cluster, run_id, mailbox, round_number
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(LOAD_STOP_TIMEOUT_S)
        assert not self._thread.is_alive(), "the load did not stop"

    def _call(self, index: int, path: str, body: dict[str, Any], key: str) -> tuple[int, Any] | None:
        api = self._cluster.api(index)
        headers = {**api.headers, "Idempotency-Key": key}
        try:
            return call(api.base_url, "POST", api.space_path(path), body, headers=headers)
        except (OSError, ValueError):  # the node is gone (or answered half)
            return None

    def _run(self) -> None:
        number = 0
        while not self._stop.is_set():
            number += 1
            index = number % self._cluster.size
            key = f"r{self._round}-{number}"
            answer = self._call(index, "/v1/tasks", task_body(self._run_id, self._mailbox, {"n": number}, key), key)
            if answer is not None and answer[0] in (200, 201):
                self.submitted[key] = answer[1]["taskId"]
            answer = self._call(index, f"/v1/mailboxes/{self._mailbox}/recv",
                                {"scopeId": self._run_id, **RECV_HOLDER}, f"{key}-recv")
            if answer is None or answer[0] != 200:
                continue
            for given in answer[1]["messages"]:
                task_id = given["message"]["id"]
                done = self._call(index, f"/v1/messages/{task_id}/complete",
                                  {"token": given["token"], "result": {"payload": {"done": True}}}, f"{key}-done")
                if done is not None and 200 <= done[0] < 300:
                    self.completed.add(task_id)


def power_loss(cluster: Cluster) -> None:
    """SIGKILL to every node before waiting for any: all at once, as when the power goes."""
    for process in cluster.processes:
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
    cluster.kill_all()  # reaps them


@pytest.mark.timeout(max(300, ROUNDS * ROUND_TIMEOUT_S))  # the long form runs past the suite's 300 s
def test_every_acknowledged_write_outlives_whole_cluster_power_losses(make_cluster: Callable[..., Cluster]) -> None:
    rounds = ROUNDS
    seed = int(os.environ.get(SEED_ENV, random.randrange(2**32)))
    print(f"power loss: {rounds} rounds, seed {seed} ({SEED_ENV})")
    draw = random.Random(seed)
    cluster = make_cluster("--compact-after", COMPACT_AFTER).start()
    setup = cluster.api(cluster.leader_index()).resending()
    run_id = setup.ok("POST", "/v1/scopes", {})["id"]
    mailbox = mailbox_id(setup)
    submitted: dict[str, str] = {}
    completed: set[str] = set()
    for round_number in range(rounds):
        load = Load(cluster, run_id, mailbox, round_number).start()
        cluster.wait_until("writes acknowledged", lambda load=load: len(load.submitted) >= ACKS_MIN, LOAD_TIMEOUT_S)
        time.sleep(draw.uniform(LOAD_S_MIN, LOAD_S_MAX))
        power_loss(cluster)
        load.stop()
        submitted.update(load.submitted)
        completed |= load.completed
        cluster.start()

        reader = cluster.api(cluster.leader_index()).resending()
        for key, task_id in submitted.items():
            view = reader.ok("GET", f"/v1/tasks/{task_id}")
            assert view["taskKey"] == key, (round_number, view)
            if task_id in completed:
                assert view["state"] == "SUCCEEDED", (round_number, view)
        cluster.wait_same_digest()
        print(f"round {round_number + 1}: {len(load.submitted)} submits and {len(load.completed)} completes "
              f"acknowledged, all there after the restart")
    assert len(completed) >= 1  # the completes ran too (a round's load is a second or so)
