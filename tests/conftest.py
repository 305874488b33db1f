from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests._cluster import Cluster, cluster_factory
from tests._nodes import DevNode, start_auth_node
from tests._typescript import build_package
from tests.test_actors_harness import Harness

# The console's browser fixtures (`browser`, `console`): tests/_browser.py.
pytest_plugins = ["tests._browser"]


@pytest.fixture(scope="session")
def run_temp(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A folder of this test run that all its workers share: the parent of a worker's temporary
    root under xdist, the root itself without it."""
    root = tmp_path_factory.getbasetemp()
    return root if worker_id == "master" else root.parent


# Tests that take a minute or more of one worker and are not `serial`, run first: a `serial` test
# (below) waits for every running test to end, and one of these ending while it waits holds the other
# worker idle for most of its length (the Raft port's serial tests waited 53-57 s in set-up beside the
# chaos short forms, the prevote's 42-55 s beside the compiled core's test). First, they run beside
# the suite's many short tests, and no serial test comes before them.
RUN_FIRST = ("tests/test_compiled_core.py", "tests/test_chaos.py::test_chaos_short_form")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not item.nodeid.startswith(RUN_FIRST))  # stable: the rest keep their order


@pytest.fixture(autouse=True)
def _serial_tests_run_alone(request: pytest.FixtureRequest, run_temp: Path) -> Iterator[None]:
    """The suite runs on two workers (pyproject's addopts). Every test holds a lock shared by all
    workers' tests; a test marked `serial` (timing-sensitive: no election may happen while a node
    is paused, a flood must not depose the leader) holds it alone, so nothing else runs meanwhile.
    The lock is a file in the run's shared temporary folder."""
    exclusive = request.node.get_closest_marker("serial") is not None
    with open(run_temp / "serial-tests.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield


@pytest.fixture(scope="session")
def dev_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevNode]:
    """One real `runstate dev` process shared by the session's tests (each test makes its own runs)."""
    node = DevNode(tmp_path_factory.mktemp("dev-node") / "data")
    try:
        yield node.start()
    finally:
        node.stop()


@pytest.fixture
def node_factory(tmp_path: Path) -> Iterator[type[DevNode]]:
    """Start nodes of one's own (to kill and restart them); every one is stopped afterwards."""
    started: list[DevNode] = []

    class Factory(DevNode):
        def __init__(self, *extra_args: str, in_memory: bool = False) -> None:
            super().__init__(None if in_memory else tmp_path / f"data-{len(started)}", *extra_args)
            started.append(self)

    try:
        yield Factory
    finally:
        for node in started:
            node.stop()


@pytest.fixture(scope="module")
def auth_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DevNode, str]]:
    """A `runstate dev --auth` node of the module's tests, with its bootstrap admin key's secret."""
    node, secret = start_auth_node(tmp_path_factory.mktemp("auth-node") / "data")
    try:
        yield node, secret
    finally:
        node.stop()


@pytest.fixture
def h() -> Harness:
    """The core on its own, with the default mailbox (tests/test_actors_harness.py)."""
    harness = Harness()
    harness.ensure()
    return harness


@pytest.fixture
def run_id(h: Harness) -> str:
    return h.create_run()


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """`make_cluster(*extra_args)` builds a three-node Cluster (tests/_cluster.py), not started;
    every process is killed at the end."""
    yield from cluster_factory(tmp_path)



@pytest.fixture(scope="session")
def typescript_package(run_temp: Path) -> Path:
    """sdk/typescript, built (tests/_typescript.py) once per run, by whichever worker's test needs it
    first (the others wait for it and use that build)."""
    return build_package(run_temp)
