"""`runstate.once` across processes: twenty callers start at one moment (they wait for a start
file) against a dev node and a three-node cluster; the runner killed with kill -9; a frozen runner
whose lease is taken over gets LeaseLostError. Side effects are counted in a file."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests._cluster import Cluster
from tests._http import Api
from tests._nodes import DevNode
from tests._once_procs import Children, children, lines, output, read_line, sdk_env, wait_until

pytestmark = pytest.mark.slow

CALLERS = 20


def start_callers(
    procs: Children, count: int, tmp_path: Path, mode: str, lease: str, env_of: Callable[[int], dict[str, str]]
) -> tuple[list[subprocess.Popen[str]], Path]:
    """`count` callers, all importing the SDK first, then released at one moment."""
    start_file, effects = tmp_path / "start", tmp_path / "effects"
    callers = [
        procs.spawn("_once_child.py", str(start_file), str(effects), mode, lease, env=env_of(index))
        for index in range(count)
    ]
    for caller in callers:
        read_line(caller, "ready")
    start_file.touch()
    return callers, effects


def outcomes(callers: list[subprocess.Popen[str]]) -> list[str]:
    return [output(caller).strip().splitlines()[-1] for caller in callers]


def result_of(line: str) -> dict[str, Any]:
    assert line.startswith("result "), line
    return dict(json.loads(line.removeprefix("result ")))


def test_twenty_callers_one_run(dev_node: DevNode, tmp_path: Path) -> None:
    run_id = Api(dev_node.url).ok("POST", "/v1/scopes", {})["id"]
    twenty_callers(lambda index: sdk_env(dev_node.url, run_id), tmp_path)


def twenty_callers(env_of: Callable[[int], dict[str, str]], tmp_path: Path) -> None:
    """Twenty callers released at one moment: the function runs once, all print its result."""
    with children() as procs:
        callers, effects = start_callers(procs, CALLERS, tmp_path, "plain", "30s", env_of)
        printed = outcomes(callers)
    assert len(set(printed)) == 1, printed
    result = result_of(printed[0])
    assert result["attempt"] == 1 and result["company"] == "acme"
    assert [line[0] for line in lines(effects)] == ["start", "done"]  # ran exactly once


def kill_the_runner(env_of: Callable[[int], dict[str, str]], tmp_path: Path, count: int) -> None:
    """The first runner hangs and is killed with kill -9; a waiting caller takes over at attempt 2
    (after the 1 s lease) and every remaining caller prints the taker's result."""
    with children() as procs:
        callers, effects = start_callers(procs, count, tmp_path, "hang-first", "1s", env_of)
        wait_until("a runner to start", lambda: bool(lines(effects)))
        first = lines(effects)[0]
        assert first[0] == "start" and first[2] == "1", first
        runner = next(caller for caller in callers if caller.pid == int(first[1]))
        runner.kill()
        runner.wait()
        survivors = [caller for caller in callers if caller is not runner]
        printed = outcomes(survivors)
    assert len(set(printed)) == 1, printed
    result = result_of(printed[0])
    assert result["attempt"] >= 2 and result["pid"] != runner.pid
    done = [line for line in lines(effects) if line[0] == "done"]
    assert len(done) == 1 and int(done[0][1]) == result["pid"], lines(effects)


def test_runner_killed_another_takes_over(dev_node: DevNode, tmp_path: Path) -> None:
    run_id = Api(dev_node.url).ok("POST", "/v1/scopes", {})["id"]
    kill_the_runner(lambda index: sdk_env(dev_node.url, run_id), tmp_path, CALLERS)


def test_slow_runner_loses_its_lease(dev_node: DevNode, tmp_path: Path) -> None:
    run_id = Api(dev_node.url).ok("POST", "/v1/scopes", {})["id"]
    slow_runner_loses_its_lease(lambda index: sdk_env(dev_node.url, run_id), tmp_path)


def slow_runner_loses_its_lease(env_of: Callable[[int], dict[str, str]], tmp_path: Path) -> None:
    """The runner is frozen (SIGSTOP) past its lease: another caller takes over at attempt 2; the
    runner, resumed, gets LeaseLostError and its context().signal is set."""
    with children() as procs:
        callers, effects = start_callers(procs, 3, tmp_path, "slow-first", "1s", env_of)
        wait_until("a runner to start", lambda: bool(lines(effects)))
        runner = next(caller for caller in callers if caller.pid == int(lines(effects)[0][1]))
        runner.send_signal(signal.SIGSTOP)  # frozen past its lease
        wait_until(
            "another caller to take over and finish",
            lambda: any(line[0] == "done" for line in lines(effects)),
            lambda: str(lines(effects)),
        )
        runner.send_signal(signal.SIGCONT)
        late = output(runner).strip().splitlines()[-1]
        printed = outcomes([caller for caller in callers if caller is not runner])
    assert late.startswith("error LeaseLostError"), late
    assert len(set(printed)) == 1 and result_of(printed[0])["attempt"] == 2, printed
    kinds = [(line[0], int(line[1])) for line in lines(effects)]
    assert ("signal", runner.pid) in kinds  # its context().signal was set when a renewal was refused


def test_cluster_runner_killed_another_takes_over(make_cluster: Callable[..., Cluster], tmp_path: Path) -> None:
    """Against three nodes (each caller lists all three, starting at a different one), in the
    space's default run (no RUNSTATE_SCOPE_ID): every process finds the same run."""
    cluster = make_cluster().start()
    kill_the_runner(
        lambda index: sdk_env(cluster.urls_from(index % cluster.size), None, RUNSTATE_API_KEY=cluster.admin_key), tmp_path, CALLERS
    )
