"""`cluster.identify`: the cluster's id (dispatch.identify_cluster), written once by a leader at
INTEGRITY_LEVEL; a second one changes nothing, a malformed one is refused and changes nothing, a
space may not send it, it survives a snapshot, and a state without one snapshots (and so digests)
as releases before it did."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from runstate_server.actors import dispatch
from runstate_server.actors.errors import is_error
from runstate_server.actors.state import from_snapshot, to_snapshot
from runstate_server.node.backup import data_digest
from tests.test_actors_harness import Harness

GOOD = dispatch.CLUSTER_ID_PREFIX + "0123456789abcdef01234567"
OTHER = dispatch.CLUSTER_ID_PREFIX + "fedcba9876543210fedcba98"


def identify(h: Harness, cluster_id: Any, space: str = dispatch.SYSTEM_SPACE) -> Any:
    command = {"type": "cluster.identify", "v": 1, "space": space, "id": "", "args": {"cluster_id": cluster_id}}
    return h.core.apply(command, h.now_ms, h.epoch)[0]


def test_the_first_id_names_the_cluster_for_good_and_survives_a_snapshot() -> None:
    h = Harness()
    unnamed = to_snapshot(h.state)
    assert "cluster_id" not in unnamed  # as a release before cluster ids snapshots it
    assert identify(h, GOOD) == {"cluster_id": GOOD, "identified": True}
    assert identify(h, OTHER) == {"cluster_id": GOOD, "identified": False}
    assert h.state.cluster_id == GOOD
    assert from_snapshot(to_snapshot(h.state)).cluster_id == GOOD
    # The data digest leaves the id out: a restore names its state anew, the data stays equal.
    assert data_digest(to_snapshot(h.state)) == data_digest({**to_snapshot(h.state), "cluster_id": OTHER})


def test_a_space_may_not_name_the_cluster() -> None:
    h = Harness()
    result = identify(h, GOOD, space="space-1")
    assert is_error(result) and h.state.cluster_id is None


def test_the_kind_is_of_the_integrity_level() -> None:
    assert dispatch.COMMAND_LEVEL >= dispatch.INTEGRITY_LEVEL == 5
    assert dispatch.unknown_kind({"type": "cluster.identify", "v": 1}) is None


@given(st.one_of(st.none(), st.integers(), st.text(max_size=40),
                 st.text("0123456789abcdefABCDEF", min_size=20, max_size=28).map(lambda digits: "rsc_" + digits)))
def test_a_malformed_id_is_refused_and_changes_nothing(cluster_id: Any) -> None:
    h = Harness()
    before = to_snapshot(h.state)
    result = identify(h, cluster_id)
    if dispatch.is_cluster_id(cluster_id):
        assert result == {"cluster_id": cluster_id, "identified": True}
    else:
        assert is_error(result)
        assert {**to_snapshot(h.state), "clock_ms": 0} == {**before, "clock_ms": 0}
