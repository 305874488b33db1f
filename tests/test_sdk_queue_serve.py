"""What `serve()` promises beyond submit-and-wait: each queue runs with its own concurrency (and
`serve()` with no argument runs every queue of the process), leases of long handlers are renewed,
the default attempts, and a worker whose lease lapsed has its late result dropped quietly: it keeps
serving, and the job keeps the result of the worker that took it over."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import runstate
from runstate.sdk import queue as queue_module

from tests._http import Api, configured_run
from tests._nodes import DevNode
from tests._once_procs import WAIT_S, children, lines, output, read_line, sdk_env, wait_until
from tests.test_sdk_queue import Worker

BARRIER_TIMEOUT_S = 30.0


@pytest.fixture
def run_id(dev_node: DevNode) -> Iterator[str]:
    yield from configured_run(dev_node.url)


class Running:
    """How many handlers of one queue run at once, and the most seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


def test_serve_runs_every_queue_with_its_concurrency(
    run_id: str, dev_node: DevNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queue_module, "_queues", {})  # only the queues below are "in the process"
    wide, narrow = Running(), Running()
    together = threading.Barrier(3)  # broken (a failed job) unless three handlers run at once

    @runstate.queue("serve-wide", concurrency=3, attempts=1)
    def fan_out(input: int) -> int:
        with wide:
            together.wait(BARRIER_TIMEOUT_S)
            return input * 10

    @runstate.queue("serve-narrow")
    def one_at_a_time(input: int) -> int:
        with narrow:
            threading.Event().wait(0.1)  # long enough for a second handler to overlap, were it allowed
            return input + 1

    assert one_at_a_time.attempts == 5 and one_at_a_time.concurrency == 1  # the defaults
    wide_jobs = [fan_out.send(n) for n in range(6)]
    narrow_jobs = [one_at_a_time.send(n) for n in range(4)]
    assert Api(dev_node.url).ok("GET", f"/v1/tasks/{narrow_jobs[0].id}")["attempts"] == 5
    worker = Worker()  # runstate.serve() with no argument
    try:
        assert [job.result(timeout=WAIT_S) for job in wide_jobs] == [n * 10 for n in range(6)]
        assert [job.result(timeout=WAIT_S) for job in narrow_jobs] == [n + 1 for n in range(4)]
    finally:
        Api(dev_node.url).ok("POST", f"/v1/scopes/{run_id}/cancel", {})
        worker.join()
    assert (wide.most, narrow.most) == (3, 1)


def test_serve_renews_the_lease_of_a_long_handler(run_id: str, dev_node: DevNode) -> None:
    attempts: list[int] = []

    @runstate.queue("serve-long", lease="600ms")
    def long_job(input: str) -> str:
        attempts.append(runstate.context().attempt)
        threading.Event().wait(2.5)  # several leases long: only renewals keep the job
        return f"{input} after attempt {runstate.context().attempt}"

    worker = Worker(long_job)
    try:
        assert long_job("report") == "report after attempt 1"
    finally:
        Api(dev_node.url).ok("POST", f"/v1/scopes/{run_id}/cancel", {})
        worker.join()
    assert attempts == [1]


def late_result_dropped_quietly(api: Api, run_id: str, env: dict[str, str], effects: Path) -> None:
    """Worker A is frozen (SIGSTOP) while it runs the job, past its lease; worker B takes the job
    over (attempt 2) and records its result. A, resumed, finishes late: its result is refused
    without reaching the handler's code as an error, A keeps serving, the job keeps B's result."""
    env = {**env, "RS_TEST_EFFECTS": str(effects), "RS_TEST_SLOW_S": "2", "RS_TEST_LEASE": "1s",
           "RS_TEST_CONCURRENCY": "1"}
    runstate.configure(base_url=env["RUNSTATE_BASE_URL"], api_key=env.get("RUNSTATE_API_KEY"), scope_id=run_id)
    try:
        with children() as procs:
            first = procs.spawn("_queue_worker.py", env=env)
            read_line(first, "serving")
            squares = runstate.Queue("proc-squares", lambda input: None, lease="1s")
            job = squares.send({"n": 7})
            wait_until("worker A to start the job", lambda: bool(lines(effects)))
            assert lines(effects)[0][:4] == ["start", str(first.pid), "7", "1"]
            first.send_signal(signal.SIGSTOP)
            second = procs.spawn("_queue_worker.py", env=env)
            assert job.result(timeout=WAIT_S) == {"n": 7, "square": 49}
            task = api.ok("GET", f"/v1/tasks/{job.id}")
            assert task["attempt"] == 2 and task["finishedBy"].endswith(f":{second.pid}"), task
            first.send_signal(signal.SIGCONT)
            wait_until(
                "worker A to finish its late attempt",
                lambda: ["done", str(first.pid), "7", "1"] in lines(effects),
                lambda: str(lines(effects)),
            )
            # A still serves: it takes the next job once B stops.
            second.send_signal(signal.SIGTERM)
            assert "stopped" in output(second) and second.returncode == 0
            assert squares.send({"n": 8}).result(timeout=WAIT_S) == {"n": 8, "square": 64}
            assert api.ok("GET", f"/v1/tasks/{job.id}")["finishedBy"].endswith(f":{second.pid}")
            api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
            late = output(first)
            assert first.returncode == 0, late
            assert "stopped" in late and "Traceback" not in late, late
        done = [line for line in lines(effects) if line[0] == "done"]
        assert ["done", str(first.pid), "8", "1"] in done
    finally:
        runstate.close()


@pytest.mark.slow
def test_a_late_result_from_a_lapsed_lease_is_dropped_quietly(dev_node: DevNode, tmp_path: Path) -> None:
    api = Api(dev_node.url)
    run_id = str(api.ok("POST", "/v1/scopes", {})["id"])
    late_result_dropped_quietly(api, run_id, sdk_env(dev_node.url, run_id), tmp_path / "effects")


def test_serve_async_with_no_queue_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_module, "_queues", {})
    with pytest.raises(runstate.ConfigError, match="no queue"):
        asyncio.run(runstate.serve_async())


@pytest.mark.slow
def test_a_stuck_handler_does_not_keep_a_stopped_worker_alive(dev_node: DevNode, tmp_path: Path) -> None:
    """SIGTERM while a sync handler never returns: serve() waits its drain (30 s; 2 s here) for
    it, hands the job back and returns, and the process exits (the handler's thread does not
    hold it)."""
    api = Api(dev_node.url)
    run_id = str(api.ok("POST", "/v1/scopes", {})["id"])
    effects = tmp_path / "effects"
    env = sdk_env(dev_node.url, run_id, RS_TEST_EFFECTS=str(effects), RS_TEST_SLOW_S="3600", RS_TEST_DRAIN_S="2")
    runstate.configure(base_url=dev_node.url, scope_id=run_id)
    try:
        with children() as procs:
            worker = procs.spawn("_queue_worker.py", env=env)
            read_line(worker, "serving")
            job = runstate.Queue("proc-squares", lambda input: None).send({"n": 1})
            wait_until("the handler to start", lambda: bool(lines(effects)))
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(WAIT_S) == 0  # a TimeoutExpired here: the stuck thread held the process
            assert read_line(worker, "stopped") == "stopped"
            assert api.ok("GET", f"/v1/tasks/{job.id}")["state"] == "QUEUED"  # handed back, not lost
    finally:
        runstate.close()
