from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._nodes import DevNode


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
