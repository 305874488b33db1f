"""`replica.check` (actors/integrity.py): the leader's request that every replica hash its state at
this entry. It changes nothing but the clock, names the check by the command's id, and is refused
(changing nothing) when malformed or sent by a space."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from runstate_server.actors import dispatch, integrity
from runstate_server.actors.errors import is_error
from tests.test_actors_harness import Harness, snapshot_bytes


def check(h: Harness, args: Any, *, command_id: str = "c0ffee", space: str = dispatch.SYSTEM_SPACE) -> Any:
    command = {"type": integrity.CHECK_KIND, "v": 1, "space": space, "id": command_id, "args": args}
    return h.core.apply(command, h.now_ms, h.epoch)


def test_a_check_names_itself_and_changes_nothing_but_the_clock() -> None:
    h = Harness()
    h.ensure()
    h.submit(h.create_run(), "k1")
    before = snapshot_bytes(h.state, without_clock=True)
    h.advance(5)
    for reason in integrity.CHECK_REASONS:
        result, effects = check(h, {"reason": reason}, command_id=f"id-{reason}")
        assert result == {"check": f"id-{reason}", "reason": reason}
        assert effects == []
    assert snapshot_bytes(h.state, without_clock=True) == before
    assert h.state.clock_ms == h.now_ms


def test_a_space_may_not_ask_for_a_check() -> None:
    h = Harness()
    before = snapshot_bytes(h.state, without_clock=True)
    result, _ = check(h, {"reason": "period"}, space="default")
    assert result["error"]["code"] == "VALIDATION_FAILED"
    assert snapshot_bytes(h.state, without_clock=True) == before


@given(
    args=st.one_of(
        st.none(), st.integers(), st.text(max_size=3),
        st.dictionaries(st.sampled_from(["reason", "other"]), st.one_of(st.text(max_size=12), st.integers(), st.none()),
                        max_size=2),
    ),
    command_id=st.sampled_from(["", "abc"]),
)
def test_a_malformed_check_is_refused_and_changes_nothing(args: Any, command_id: str) -> None:
    h = Harness()
    before = snapshot_bytes(h.state, without_clock=True)
    result, effects = check(h, args, command_id=command_id)
    valid = isinstance(args, dict) and args.get("reason") in integrity.CHECK_REASONS and command_id != ""
    if valid:
        assert result == {"check": command_id, "reason": args["reason"]}
    else:
        assert is_error(result) and result["error"]["code"] == "VALIDATION_FAILED", result
        assert effects == []
    assert snapshot_bytes(h.state, without_clock=True) == before


def test_the_check_is_a_kind_of_level_5() -> None:
    assert dispatch.INTEGRITY_LEVEL == 5 <= dispatch.COMMAND_LEVEL
    assert dispatch.unknown_kind({"type": integrity.CHECK_KIND, "v": 1}) is None
