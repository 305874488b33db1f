"""A node process runs with the garbage collector's thresholds tuned for a large, long-lived state
(runstate_server/node/cli.py); the admin commands, short-lived clients, keep Python's own."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

from runstate_server.node import cli

TUNED = (cli.GC_YOUNG_ALLOCATIONS, cli.GC_YOUNG_COLLECTIONS_PER_MIDDLE, cli.GC_MIDDLE_COLLECTIONS_PER_OLD)


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_a_dev_node_serves_with_the_tuned_thresholds(thresholds: None, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int, int]] = []

    def serve(args: Any) -> int:  # stands in for the server: what the process runs with
        seen.append(gc.get_threshold())
        return 0

    monkeypatch.setattr(cli, "_dev", serve)
    assert cli.main(["dev"]) == 0
    assert seen == [TUNED]


def test_an_admin_command_keeps_pythons_thresholds(thresholds: None, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, int, int]] = []

    def run(args: Any) -> int:  # stands in for the call to a node
        seen.append(gc.get_threshold())
        return 0

    monkeypatch.setattr(cli, "run_admin_command", run)
    assert cli.main(["whoami"]) == 0
    assert seen == [(700, 10, 10)]
