"""task.submit_many (actors/tasks.py): a batch of submits in one command must leave exactly the
state, answers and effects that the same submits leave as one command each, with the same ids,
whatever mix of new tasks, resubmits, key conflicts and refusals the batch holds; it is replayed
whole under one idempotency key; a malformed batch changes nothing."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runstate_server.actors import limits
from tests.test_actors_harness import MAILBOX, Harness, snapshot_bytes

INBOX = "inbox"
# One item of a batch: (run, key, input, attempts, subscriber, mailbox).
RUNS = ("run", "other-run", "missing-run")
KEYS = ("a", "b", "c")
INPUTS = ({"n": 1}, {"n": 2})
ATTEMPTS = (None, 2, 0)  # 0 is refused
SUBSCRIBERS = (None, "sub-1")
MAILBOXES = (MAILBOX, INBOX)

items_strategy = st.lists(
    st.tuples(
        st.sampled_from(RUNS), st.sampled_from(KEYS), st.sampled_from(INPUTS), st.sampled_from(ATTEMPTS),
        st.sampled_from(SUBSCRIBERS), st.sampled_from(MAILBOXES),
    ),
    min_size=1,
    max_size=12,
)


def set_up() -> tuple[Harness, dict[str, str]]:
    """A space with a mailbox, an INBOX, two runs and a task already under key "a"."""
    h = Harness()
    h.ensure()
    h.ok("mailbox.declare", name=INBOX, mode="INBOX")
    runs = {"run": h.create_run(), "other-run": h.create_run(), "missing-run": "run_missing"}
    h.submit(runs["run"], "a", {"n": 1})
    return h, runs


def submit_args(runs: dict[str, str], item: tuple[Any, ...]) -> dict[str, Any]:
    run, key, value, attempts, subscriber, mailbox = item
    return {
        "run_id": runs[run], "mailbox": mailbox, "key": key, "input": value, "input_hash": f"hash:{value!r}",
        "attempts": attempts, "subscriber": subscriber,
    }


def command(h: Harness, kind: str, args: dict[str, Any], command_id: str, idem: list[str] | None = None) -> Any:
    body: dict[str, Any] = {"type": kind, "v": 1, "space": h.space, "id": command_id, "args": args}
    if idem is not None:
        body["idem"] = idem
    return h.core.apply(body, h.now_ms, h.epoch)


def without_arms(effects: list[Any]) -> list[Any]:
    return [effect for effect in effects if effect[0] != "arm"]


@settings(max_examples=150, deadline=None)
@given(items_strategy)
def test_a_batch_leaves_what_its_submits_leave_one_by_one(items: list[tuple[Any, ...]]) -> None:
    one_by_one, runs = set_up()
    batched, _ = set_up()
    ids = [f"{index:04d}batch" for index in range(len(items))]
    args_list = [submit_args(runs, item) for item in items]
    answers, effects = [], []
    for args, command_id in zip(args_list, ids, strict=True):
        answer, effected = command(one_by_one, "task.submit", args, command_id)
        answers.append(answer)
        effects.extend(effected)
    result, batch_effects = command(batched, "task.submit_many", {"items": args_list, "ids": ids}, "whole")
    assert result == {"items": answers}
    assert without_arms(batch_effects) == without_arms(effects)
    assert snapshot_bytes(batched.state) == snapshot_bytes(one_by_one.state)
    assert batched.state.stored_bytes == one_by_one.state.stored_bytes


def test_a_batch_is_replayed_whole_under_its_idempotency_key() -> None:
    h, runs = set_up()
    args = {"items": [submit_args(runs, ("run", "b", {"n": 2}, None, None, MAILBOX)),
                      submit_args(runs, ("missing-run", "c", {"n": 1}, None, None, MAILBOX))],
            "ids": ["id-1", "id-2"]}
    first, _ = command(h, "task.submit_many", args, "batch-1", idem=["key-1", "print-1"])
    assert first["items"][0]["created"] is True and first["items"][1]["error"]["code"] == "NOT_FOUND"
    before = snapshot_bytes(h.state, without_clock=True)
    again, _ = command(h, "task.submit_many", {**args, "ids": ["id-3", "id-4"]}, "batch-2", idem=["key-1", "print-1"])
    assert again == first
    assert snapshot_bytes(h.state, without_clock=True) == before
    conflict, _ = command(h, "task.submit_many", args, "batch-3", idem=["key-1", "print-2"])
    assert conflict["error"]["code"] == "IDEMPOTENCY_CONFLICT"


def test_a_malformed_batch_is_refused_whole() -> None:
    h, runs = set_up()
    one = submit_args(runs, ("run", "b", {"n": 2}, None, None, MAILBOX))
    too_many = limits.submit_batch_max + 1
    for args in (
        {"items": [one], "ids": []},
        {"items": [], "ids": []},
        {"items": [one, one], "ids": ["same", "same"]},
        {"items": [one], "ids": [""]},
        {"items": ["not an object"], "ids": ["id-1"]},
        {"items": one, "ids": ["id-1"]},
        {"items": [one] * too_many, "ids": [f"id-{index}" for index in range(too_many)]},
    ):
        assert h.err("task.submit_many", **args) == "VALIDATION_FAILED", args
