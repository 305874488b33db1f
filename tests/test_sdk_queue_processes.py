"""`runstate.queue` and `serve()` across processes: a producer and two workers run 500 jobs with
shared inputs while one worker is killed with kill -9 (against a dev node and a three-node cluster);
SIGTERM drains a worker without losing a job."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import runstate

from tests._cluster import Cluster
from tests._http import Api
from tests._nodes import DevNode
from tests._once_procs import WAIT_S, children, lines, output, read_line, sdk_env, wait_until

pytestmark = pytest.mark.slow

JOBS = 500
DISTINCT = 350  # inputs repeat: 150 submits share a job with another


def kill_a_worker(env_of: Callable[[int], dict[str, str]], api: Api, stop_run: Callable[[], None]) -> None:
    with children() as procs:
        workers = [procs.spawn("_queue_worker.py", env=env_of(index)) for index in range(2)]
        for worker in workers:
            read_line(worker, "serving")
        producer = procs.spawn("_queue_producer.py", str(JOBS), str(DISTINCT), env=env_of(2))
        effects = Path(env_of(0)["RS_TEST_EFFECTS"])
        wait_until("100 jobs done", lambda: sum(line[0] == "done" for line in lines(effects)) >= 100)
        victim, survivor = workers
        victim.kill()
        victim.wait()
        report = json.loads(read_line(producer, "{"))
        stop_run()
        assert read_line(survivor, "stopped") == "stopped"
        assert survivor.wait(WAIT_S) == 0

    inputs = [index % DISTINCT for index in range(JOBS)]
    assert report["results"] == [{"n": n, "square": n * n} for n in inputs]
    id_of: dict[int, str] = {}
    for n, job_id in zip(inputs, report["ids"], strict=True):
        assert id_of.setdefault(n, job_id) == job_id, f"input {n} got two jobs"
    assert len(set(report["ids"])) == DISTINCT
    ids = sorted(set(report["ids"]))
    for start in range(0, len(ids), 100):
        answer = api.ok("POST", "/v1/tasks/results", {"ids": ids[start : start + 100]})
        assert {view["state"] for view in answer["results"]} == {"SUCCEEDED"}
    # Jobs the killed worker had started but not finished were taken over by the survivor.
    events = lines(effects)
    finished_by_victim = {int(line[2]) for line in events if line[0] == "done" and int(line[1]) == victim.pid}
    started_by_victim = {int(line[2]) for line in events if line[0] == "start" and int(line[1]) == victim.pid}
    print(f"taken over from the killed worker: {sorted(started_by_victim - finished_by_victim)}")
    for n in started_by_victim - finished_by_victim:
        assert any(
            line[0] == "done" and int(line[1]) == survivor.pid and int(line[2]) == n and int(line[3]) >= 2
            for line in events
        ), f"job {n}, held by the killed worker, was not taken over"


def test_producer_and_two_workers_one_killed(dev_node: DevNode, tmp_path: Path) -> None:
    api = Api(dev_node.url)
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    effects = tmp_path / "effects"
    kill_a_worker(
        lambda index: sdk_env(dev_node.url, run_id, RS_TEST_EFFECTS=str(effects)),
        api,
        lambda: api.ok("POST", f"/v1/scopes/{run_id}/cancel", {}),
    )


def test_cluster_producer_and_two_workers_one_killed(make_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    """All three URLs for every process, each starting at another node; the default run."""
    cluster = make_cluster().start()
    api = cluster.api(0)
    effects = tmp_path / "effects"

    def stop_run() -> None:
        run_id = api.ok("PUT", "/v1/runs/default")["id"]
        api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})

    kill_a_worker(
        lambda index: sdk_env(
            cluster.urls_from(index % cluster.size), None, RS_TEST_EFFECTS=str(effects), RUNSTATE_API_KEY=cluster.admin_key
        ),
        api,
        stop_run,
    )


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_drains_a_worker(dev_node: DevNode, tmp_path: Path, signal_number: int) -> None:
    api = Api(dev_node.url)
    sigterm_drains_a_worker(api, api.ok("POST", "/v1/scopes", {})["id"], dev_node.url, None, tmp_path, signal_number)


def sigterm_drains_a_worker(
    api: Api, run_id: str, base_url: str, api_key: str | None, tmp_path: Path, signal_number: int = signal.SIGTERM
) -> None:
    """Two slow jobs running when SIGTERM (or SIGINT) arrives finish and are recorded; the two not
    yet taken stay queued and a later worker does them."""
    effects = tmp_path / "effects"
    keyed = {} if api_key is None else {"RUNSTATE_API_KEY": api_key}
    env = sdk_env(
        base_url, run_id, RS_TEST_EFFECTS=str(effects), RS_TEST_SLOW_S="1.5", RS_TEST_CONCURRENCY="2", **keyed
    )
    runstate.configure(base_url=base_url, scope_id=run_id, api_key=api_key)
    try:
        with children() as procs:
            worker = procs.spawn("_queue_worker.py", env=env)
            read_line(worker, "serving")
            square = runstate.Queue("proc-squares", lambda input: None, lease="2s")
            jobs = [square.send({"n": n}) for n in range(4)]
            wait_until("two jobs to start", lambda: sum(line[0] == "start" for line in lines(effects)) == 2)
            worker.send_signal(signal_number)
            assert "stopped" in output(worker)
            assert worker.returncode == 0
            started = {int(line[2]) for line in lines(effects) if line[0] == "start"}
            assert {int(line[2]) for line in lines(effects) if line[0] == "done"} == started
            states = {job.id: api.ok("GET", f"/v1/tasks/{job.id}")["state"] for job in jobs}
            assert sorted(states.values()) == ["QUEUED", "QUEUED", "SUCCEEDED", "SUCCEEDED"]
            for n in started:
                assert jobs[n].result(timeout=0) == {"n": n, "square": n * n}
            later = procs.spawn("_queue_worker.py", env=env)
            assert [job.result() for job in jobs] == [{"n": n, "square": n * n} for n in range(4)]
            api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
            assert "stopped" in output(later)
        attempts = {(int(line[2]), int(line[3])) for line in lines(effects) if line[0] == "done"}
        assert attempts == {(n, 1) for n in range(4)}  # nothing was redone
    finally:
        runstate.close()


SPEC_RESEARCH = '''import runstate


@runstate.queue("research", attempts=5, lease="60s", concurrency=4)
def research(input: dict) -> dict:
    return research_company(input["company"])


def research_company(name: str) -> dict:  # added: the spec leaves it to the reader
    return {"company": name, "summary": f"{name} makes anvils"}
'''

SPEC_WORKER = '''import runstate

import research  # noqa: F401  (defines the queue)

runstate.serve()  # until the run stops or the process gets SIGTERM
'''

SPEC_PRODUCER = '''from research import research

# Submit and wait for the result.
report = research({"company": "acme"})

# Or submit now and collect later.
job = research.send({"company": "globex"})
print(f"submitted {job.id}")
later = job.result()
print("got", report, later)  # added
'''


def test_the_spec_samples_as_written(dev_node: DevNode, tmp_path: Path) -> None:
    api = Api(dev_node.url)
    spec_samples_as_written(api, api.ok("POST", "/v1/scopes", {})["id"], sdk_env(dev_node.url, None), tmp_path)


def spec_samples_as_written(api: Api, run_id: str, env: dict[str, str], tmp_path: Path) -> None:
    """research.py, worker.py and the producer of docs "Once and queues", as written, in `run_id`."""
    for name, text in (("research.py", SPEC_RESEARCH), ("worker.py", SPEC_WORKER), ("producer.py", SPEC_PRODUCER)):
        (tmp_path / name).write_text(text)
    env = {**env, "RUNSTATE_SCOPE_ID": run_id}
    with children() as procs:
        worker = subprocess.Popen(
            [sys.executable, "worker.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        procs.processes.append(worker)
        producer = subprocess.run(
            [sys.executable, "producer.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=WAIT_S
        )
        assert producer.returncode == 0, producer.stdout + producer.stderr
        assert producer.stdout.startswith("submitted tsk_")
        assert producer.stdout.splitlines()[-1] == (
            "got {'company': 'acme', 'summary': 'acme makes anvils'} "
            "{'company': 'globex', 'summary': 'globex makes anvils'}"
        )
        api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})  # serve() returns when its run stops
        output(worker)
        assert worker.returncode == 0
