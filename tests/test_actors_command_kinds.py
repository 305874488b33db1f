"""dispatch.unknown_kind: what a replica of this release cannot apply because a newer one wrote it
(the log halts on it rather than refuse it while newer replicas apply it), and nothing else."""

from __future__ import annotations

from runstate_server.actors import dispatch


def test_every_kind_this_release_applies_is_known() -> None:
    for kind in [*dispatch.HANDLERS, *dispatch.BUILT_IN_KINDS]:
        assert dispatch.unknown_kind({"type": kind, "v": dispatch.COMMAND_VERSION}) is None, kind


def test_a_newer_type_or_version_is_named() -> None:
    assert dispatch.unknown_kind({"type": "task.submit_all", "v": 1}) == "command type 'task.submit_all'"
    newer = dispatch.COMMAND_VERSION + 1
    assert dispatch.unknown_kind({"type": "task.submit", "v": newer}) == f"command version {newer}"


def test_a_malformed_command_is_left_to_apply_which_refuses_it() -> None:
    assert dispatch.unknown_kind(None) is None and dispatch.unknown_kind([]) is None
    for command in ({}, {"type": 7}, {"type": "task.submit", "v": "2"}, {"type": "task.submit", "v": 0}):
        assert dispatch.unknown_kind(command) is None, command
        result, _ = dispatch.Core().apply(command, 0, 1)
        assert result["error"]["code"] == "VALIDATION_FAILED", (command, result)
