"""Whole processes: Ctrl-C, kill -9 and restart, the quickstart's files, a worker killed mid-task."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._http import Api, mailbox_id, recv, recv_path, settle_ok, task_ok
from tests._long_polls import LONG_POLL_WAIT_MS, STOP_WITH_LONG_POLLS_S, parked_long_polls, start_long_polls
from tests._nodes import DevNode

HERE = Path(__file__).parent
PROCESS_TIMEOUT_S = 60.0


def run_with_work_queue(api: Api) -> str:
    mailbox_id(api)  # created if missing
    return str(api.ok("POST", "/v1/scopes", {})["id"])


def client_env(node: DevNode, **extra: str) -> dict[str, str]:
    env = {**os.environ, "RUNSTATE_BASE_URL": node.url, "PYTHONUNBUFFERED": "1", **extra}
    env.pop("RUNSTATE_SPACE_ID", None)
    env.pop("RUNSTATE_API_KEY", None)
    return env


@contextlib.contextmanager
def spawn(script: str, *args: str, env: dict[str, str], cwd: Path | None = None) -> Iterator[subprocess.Popen[str]]:
    """A Python child with its stdout piped; killed and closed whatever happens."""
    process = subprocess.Popen(
        [sys.executable, str(HERE / script), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(PROCESS_TIMEOUT_S)
        assert process.stdout is not None
        process.stdout.close()


def read_line(process: subprocess.Popen[str], prefix: str) -> str:
    """The first line of the child's stdout starting with prefix (bounded by the test timeout)."""
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"the child exited ({process.wait()}) without printing {prefix!r}")


def test_dev_prints_where_it_listens_and_stops_cleanly_on_ctrl_c(node_factory: Any) -> None:
    node: DevNode = node_factory().start()
    assert node.interrupt() == 0
    log = node.log()
    assert f"RUNSTATE_BASE_URL={node.url}" in log
    assert "RUNSTATE_SPACE_ID=default" in log
    assert "Traceback" not in log


def test_sigterm_answers_the_parked_long_polls_at_once_and_stops(node_factory: Any) -> None:
    """A long poll answers what it has when the node stops (its client polls again), instead of
    holding the stop for the rest of its wait (30 s: a container's stop would end in SIGKILL)."""
    node: DevNode = node_factory().start()
    api = Api(node.url)
    run_id = run_with_work_queue(api)
    task_id = task_ok(api, run_id, {"input": 1})["id"]
    (delivery,) = recv(api, run_id)  # the queue is empty now: a receive waits
    api.ok("POST", "/v1/once/acquire", {"scopeId": run_id, "key": "k", "holder": "h", "leaseSeconds": 60})
    polls = {
        "task": ("GET", f"/v1/tasks/{task_id}?waitMs={LONG_POLL_WAIT_MS}", None),
        "receive": ("POST", recv_path(api), {"scopeId": run_id, "waitMs": LONG_POLL_WAIT_MS, "max": 1}),
        "once": ("GET", f"/v1/once?scopeId={run_id}&key=k&waitMs={LONG_POLL_WAIT_MS}", None),
    }
    threads, answers = start_long_polls(api, polls)
    parked_long_polls(node.url, len(polls))
    assert node.process is not None
    node.process.send_signal(signal.SIGTERM)
    assert node.process.wait(STOP_WITH_LONG_POLLS_S) == 0
    for thread in threads:
        thread.join(PROCESS_TIMEOUT_S)
    assert answers["task"][0] == 200 and answers["task"][1]["state"] == "RUNNING"
    assert answers["receive"][0] == 204
    assert answers["once"][0] == 200 and answers["once"][1]["state"] == "HELD"
    assert delivery["taskId"] == task_id


def test_dev_refuses_a_non_loopback_address(tmp_path: Path) -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", "dev", "--host", "0.0.0.0", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S,
    )
    assert finished.returncode == 2
    assert "loopback" in finished.stderr


@pytest.mark.parametrize(
    "flags",
    [("--fsync", "always"), ("--fsync", "never"), ("--fsync", "always", "--compact-after", "40")],
    ids=["fsync-always", "fsync-never", "after-compactions"],
)
def test_kill_9_loses_no_acknowledged_write(node_factory: Any, flags: tuple[str, ...]) -> None:
    node: DevNode = node_factory(*flags).start()
    api = Api(node.url)
    run_id = run_with_work_queue(api)
    submitted: list[tuple[str, int]] = []  # (task id, input) of every acknowledged submit
    completed: list[tuple[str, int]] = []  # (task id, result) of every acknowledged complete
    stop = threading.Event()

    def writer(offset: int) -> None:
        n = offset
        while not stop.is_set():
            try:
                task_id = task_ok(api, run_id, {"input": n, "key": f"k{n}"})["id"]
                submitted.append((task_id, n))
                # Four writers share the queue: the delivery may be another writer's task.
                (delivery,) = recv(api, run_id)
                settle_ok(api, delivery, "complete", {"result": {"payload": delivery["input"]}})
            except (OSError, AssertionError, ValueError):
                return  # the node died under us: whatever was not acknowledged may be lost
            completed.append((delivery["taskId"], delivery["input"]))
            n += 4

    writers = [threading.Thread(target=writer, args=(offset,)) for offset in range(4)]
    for thread in writers:
        thread.start()
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while len(completed) < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    node.kill()
    stop.set()
    for thread in writers:
        thread.join(PROCESS_TIMEOUT_S)
    assert len(completed) >= 200

    node.start()
    for task_id, n in submitted:
        assert api.ok("GET", f"/v1/tasks/{task_id}")["input"] == n
    for task_id, n in completed:
        view = api.ok("GET", f"/v1/tasks/{task_id}")
        assert (view["state"], view["outcome"]) == ("SUCCEEDED", n)
    # The restarted node goes on working in the same run.
    assert task_ok(api, run_id, {"input": "after"})["created"] is True


def test_restart_keeps_state_after_ctrl_c(node_factory: Any) -> None:
    node: DevNode = node_factory().start()
    api = Api(node.url)
    run_id = run_with_work_queue(api)
    task_id = task_ok(api, run_id, {"input": 1})["id"]
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    assert node.interrupt() == 0
    node.start()
    assert api.ok("GET", f"/v1/tasks/{task_id}")["state"] == "CANCELLED"
    assert api.ok("GET", f"/v1/scopes/{run_id}")["storedState"] == "CANCELLED"


def test_in_memory_node_starts_empty(node_factory: Any) -> None:
    node: DevNode = node_factory(in_memory=True).start()
    api = Api(node.url)
    run_id = run_with_work_queue(api)
    node.kill()
    node.start()
    assert api.error("GET", f"/v1/scopes/{run_id}") == (404, "NOT_FOUND")


def test_quickstart_producer_and_worker_run_unchanged(dev_node: DevNode, tmp_path: Path) -> None:
    with spawn("quickstart/producer.py", env=client_env(dev_node), cwd=tmp_path) as producer:
        run_id = read_line(producer, "RUNSTATE_SCOPE_ID=").split("=", 1)[1]
        worker_env = client_env(dev_node, RUNSTATE_SCOPE_ID=run_id)
        with spawn("quickstart/worker.py", env=worker_env, cwd=tmp_path) as worker:
            assert read_line(producer, "SUCCEEDED") == "SUCCEEDED {'doubled': 42}"
            assert producer.wait(PROCESS_TIMEOUT_S) == 0
            assert read_line(worker, "completed").endswith("(attempt 1)")


def test_worker_killed_mid_task_is_taken_over_with_attempt_2(dev_node: DevNode) -> None:
    api = Api(dev_node.url)
    run_id = run_with_work_queue(api)
    task_id = task_ok(api, run_id, {"input": {"n": 1}})["id"]
    with spawn("_blocked_worker.py", run_id, "1000", env=client_env(dev_node)) as doomed:
        assert read_line(doomed, "started") == f"started {task_id} 1"
        doomed.send_signal(signal.SIGKILL)
    answer = {"deliveries": recv(api, run_id, waitMs=20_000)}
    (delivery,) = answer["deliveries"]
    assert (delivery["taskId"], delivery["attempt"]) == (task_id, 2)
    settle_ok(api, delivery, "complete", {"result": {"payload": "second"}})
    assert api.ok("GET", f"/v1/tasks/{task_id}")["outcome"] == "second"


def test_a_stalled_workers_late_completion_is_refused(dev_node: DevNode) -> None:
    api = Api(dev_node.url)
    run_id = run_with_work_queue(api)
    task_id = task_ok(api, run_id, {"input": {"n": 1}})["id"]
    with spawn("_stalled_worker.py", run_id, "500", "3", env=client_env(dev_node)) as stalled:
        assert read_line(stalled, "received").endswith(" 1")
        answer = {"deliveries": recv(api, run_id, waitMs=20_000)}
        (delivery,) = answer["deliveries"]
        assert (delivery["taskId"], delivery["attempt"]) == (task_id, 2)
        settle_ok(api, delivery, "complete", {"result": {"payload": "taken over"}})
        assert read_line(stalled, "refused") == "refused STALE_CLAIM"
        assert stalled.wait(PROCESS_TIMEOUT_S) == 0
    assert api.ok("GET", f"/v1/tasks/{task_id}")["outcome"] == "taken over"


def test_finished_runs_are_removed_after_retention(node_factory: Any) -> None:
    node: DevNode = node_factory("--retention", "1s").start()
    api = Api(node.url)
    run_id = run_with_work_queue(api)
    child = api.ok("POST", "/v1/scopes", {"parentId": run_id})["id"]
    task_id = task_ok(api, child, {"input": 1})["id"]
    survivor = run_with_work_queue(api)
    api.ok("POST", f"/v1/scopes/{run_id}/cancel")
    assert api.ok("GET", f"/v1/tasks/{task_id}")["state"] == "CANCELLED"  # readable until retention ends
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while api("GET", f"/v1/scopes/{run_id}")[0] != 404:
        assert time.monotonic() < deadline, "the finished run was never removed"
        time.sleep(0.1)
    assert api.error("GET", f"/v1/scopes/{child}") == (404, "NOT_FOUND")
    assert api.error("GET", f"/v1/tasks/{task_id}") == (404, "NOT_FOUND")
    assert api.ok("GET", f"/v1/scopes/{survivor}")["storedState"] == "ACTIVE"


def test_a_second_node_on_the_same_data_dir_or_port_is_refused(node_factory: Any, tmp_path: Path) -> None:
    node: DevNode = node_factory().start()
    assert node.data_dir is not None
    same_dir = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", "dev", "--port", "0", "--data-dir", str(node.data_dir)],
        capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S,
    )
    assert same_dir.returncode == 1
    assert "another runstate node is using the data dir" in same_dir.stderr
    same_port = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", "dev", "--port", str(node.port), "--data-dir", str(tmp_path / "x")],
        capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S,
    )
    assert same_port.returncode == 1
    assert f"cannot listen on 127.0.0.1:{node.port}" in same_port.stderr
    assert "Traceback" not in same_dir.stderr + same_port.stderr
    assert Api(node.url).ok("GET", "/v1/health")["status"] == "ok"  # the first one is unharmed
