"""`state.level`: the command level the log proves every node applies (dispatch.proven_level). A
leader writes it once every node told it that level; it only ever rises, survives a snapshot, and
a state that never had one snapshots (and so digests) as releases before it did."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from runstate_server.actors import dispatch
from runstate_server.actors.errors import is_error
from runstate_server.actors.state import from_snapshot, to_snapshot
from tests.test_actors_harness import Harness


def state_level(h: Harness, level: Any) -> Any:
    command = {"type": "state.level", "v": 1, "space": dispatch.SYSTEM_SPACE, "id": "", "args": {"level": level}}
    return h.core.apply(command, h.now_ms, h.epoch)[0]


def test_a_numbered_state_proves_level_3_and_state_level_proves_more() -> None:
    h = Harness(numbered=False)
    assert dispatch.proven_level(h.state) == 1
    h.number_creations()
    assert dispatch.proven_level(h.state) == dispatch.NUMBER_CREATIONS_LEVEL
    assert "level" not in to_snapshot(h.state)  # as a release before state.level snapshots it
    assert state_level(h, dispatch.COMMAND_LEVEL) == {"level": dispatch.COMMAND_LEVEL}
    assert dispatch.proven_level(h.state) == dispatch.COMMAND_LEVEL
    restored = from_snapshot(to_snapshot(h.state))
    assert dispatch.proven_level(restored) == dispatch.COMMAND_LEVEL


@given(st.lists(st.one_of(st.integers(-3, dispatch.COMMAND_LEVEL + 3), st.none(), st.text(max_size=2)), max_size=8))
def test_the_level_only_rises_and_a_malformed_one_changes_nothing(levels: list[Any]) -> None:
    h = Harness()
    highest = dispatch.proven_level(h.state)
    for level in levels:
        before = to_snapshot(h.state)
        result = state_level(h, level)
        valid = type(level) is int and dispatch.STATE_LEVEL_LEVEL <= level <= dispatch.COMMAND_LEVEL
        if valid:
            highest = max(highest, level)
            assert result == {"level": max(h.state.level, level)}
        else:
            assert is_error(result)
            assert {**to_snapshot(h.state), "clock_ms": 0} == {**before, "clock_ms": 0}
        assert dispatch.proven_level(h.state) == highest


def learner(h: Harness, kind: str, **args: Any) -> Any:
    command = {"type": kind, "v": 1, "space": dispatch.SYSTEM_SPACE, "id": "", "args": args}
    return h.core.apply(command, h.now_ms, h.epoch)[0]


def test_learners_are_recorded_once_conflicts_refused_and_they_survive_a_snapshot() -> None:
    h = Harness()
    assert "learners" not in to_snapshot(h.state)
    n4 = {"node_id": "n4", "raft_address": "10.0.0.4:9100", "api_url": "http://10.0.0.4:8080"}
    assert learner(h, "cluster.learner_add", **n4) == {"added": True}
    assert learner(h, "cluster.learner_add", **n4) == {"added": False}  # the same again: nothing changes
    before = to_snapshot(h.state)
    for clash in ({**n4, "api_url": "http://elsewhere"}, {**n4, "node_id": "n5"},
                  {"node_id": "n5", "raft_address": "10.0.0.5:9100", "api_url": n4["api_url"]}):
        assert is_error(learner(h, "cluster.learner_add", **clash)), clash
    assert is_error(learner(h, "cluster.learner_add", node_id="", raft_address="a:1", api_url="http://a"))
    assert {**to_snapshot(h.state), "clock_ms": 0} == {**before, "clock_ms": 0}
    restored = from_snapshot(to_snapshot(h.state))
    assert restored.learners == h.state.learners == {"n4": ["10.0.0.4:9100", "http://10.0.0.4:8080", h.now_ms]}
    # A space may not send them.
    command = {"type": "cluster.learner_drop", "v": 1, "space": "default", "id": "x", "args": {"node_id": "n4"}}
    assert is_error(h.core.apply(command, h.now_ms, h.epoch)[0])
    assert learner(h, "cluster.learner_drop", node_id="n4") == {"dropped": True}
    assert learner(h, "cluster.learner_drop", node_id="n4") == {"dropped": False}
    assert "learners" not in to_snapshot(h.state)
