"""The once and queue scenarios of the dev-node process tests, against one three-node cluster:
every SDK process lists all three nodes, starting at a different one, with an API key. Each test
works in a run of its own. (The kill -9 scenarios run against clusters of their own in
test_sdk_once_processes.py and test_sdk_queue_processes.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import runstate

from tests._cluster import Cluster, cluster_factory
from tests._http import Api
from tests._once_procs import sdk_env
from tests.test_sdk_once import run_the_spec_samples
from tests.test_sdk_once_processes import slow_runner_loses_its_lease, twenty_callers
from tests.test_sdk_queue_processes import sigterm_drains_a_worker, spec_samples_as_written
from tests.test_sdk_queue_serve import late_result_dropped_quietly

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    factory = cluster_factory(tmp_path_factory.mktemp("once-queue-cluster"))
    make = next(factory)
    yield make().start()
    factory.close()  # runs the factory's cleanup: every node is stopped


def new_run(cluster: Cluster) -> tuple[Api, str]:
    api = cluster.api(0)
    return api, str(api.resending().ok("POST", "/v1/scopes", {})["id"])


def env_of(cluster: Cluster, run_id: str) -> Any:
    return lambda index: sdk_env(cluster.urls_from(index % cluster.size), run_id, RUNSTATE_API_KEY=cluster.admin_key)


def test_twenty_callers_one_run(cluster: Cluster, tmp_path: Path) -> None:
    _, run_id = new_run(cluster)
    twenty_callers(env_of(cluster, run_id), tmp_path)


def test_slow_runner_loses_its_lease(cluster: Cluster, tmp_path: Path) -> None:
    _, run_id = new_run(cluster)
    slow_runner_loses_its_lease(env_of(cluster, run_id), tmp_path)


def test_sigterm_drains_a_worker(cluster: Cluster, tmp_path: Path) -> None:
    api, run_id = new_run(cluster)
    sigterm_drains_a_worker(api, run_id, cluster.urls_from(1), cluster.admin_key, tmp_path)


def test_a_late_result_from_a_lapsed_lease_is_dropped_quietly(cluster: Cluster, tmp_path: Path) -> None:
    api, run_id = new_run(cluster)
    late_result_dropped_quietly(api, run_id, env_of(cluster, run_id)(1), tmp_path / "effects")


def test_the_queue_spec_samples_as_written(cluster: Cluster, tmp_path: Path) -> None:
    api, run_id = new_run(cluster)
    spec_samples_as_written(api, run_id, sdk_env(cluster.urls_from(2), None, RUNSTATE_API_KEY=cluster.admin_key), tmp_path)


def test_the_once_spec_samples_as_written(cluster: Cluster) -> None:
    _, run_id = new_run(cluster)
    runstate.configure(base_url=cluster.base_url, api_key=cluster.admin_key, scope_id=run_id)
    try:
        run_the_spec_samples()
    finally:
        runstate.close()
