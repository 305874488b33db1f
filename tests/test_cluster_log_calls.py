"""The tick thread's calls for the loop, handed over together (ReplicatedLog._call_on_loop)."""

from __future__ import annotations

import logging

import pytest

from runstate_server.cluster.log import _run_calls


def test_gathered_calls_run_in_order_and_one_that_raises_stops_none_of_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[object] = []

    def boom(value: object) -> None:
        raise RuntimeError(f"boom {value}")

    with caplog.at_level(logging.ERROR, logger="runstate_server.cluster.log"):
        _run_calls([(ran.append, (1,)), (boom, (2,)), (ran.append, (3,))])
    assert ran == [1, 3]
    assert "boom 2" in caplog.text
