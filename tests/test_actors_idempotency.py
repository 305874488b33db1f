"""Idempotency keys in the core (runstate_server.actors.idempotency): a retried mutation is applied
once, its first result is the answer to every retry, and the table stays bounded."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runstate_server.actors import errors, limits
from runstate_server.actors.state import result_bytes
from tests.test_actors_harness import Harness, assert_stored_bytes_recount, round_trip, snapshot_bytes


@pytest.fixture
def h() -> Harness:
    return Harness()


def create_barrier(h: Harness, run_id: str, idem: list[str], target: int = 2) -> Any:
    return h.apply("barrier.create", run_id=run_id, target=target, idem=idem)


def test_a_retry_is_answered_with_the_first_result_and_applies_nothing(h: Harness) -> None:
    run_id = h.create_run()
    first = create_barrier(h, run_id, ["k1", "fp1"])
    before = snapshot_bytes(h.state, without_clock=True)
    assert create_barrier(h, run_id, ["k1", "fp1"]) == first
    assert h.effects == []
    assert snapshot_bytes(h.state, without_clock=True) == before
    assert len(h.state.barriers) == 1
    # Another key is another request.
    assert create_barrier(h, run_id, ["k2", "fp1"])["barrier_id"] != first["barrier_id"]


def test_a_key_reused_with_another_request_is_a_conflict_that_changes_nothing(h: Harness) -> None:
    run_id = h.create_run()
    create_barrier(h, run_id, ["k1", "fp1"])
    assert h.err("barrier.create", run_id=run_id, target=3, idem=["k1", "fp2"]) == errors.IDEMPOTENCY_CONFLICT


def test_keys_are_per_space(h: Harness) -> None:
    run_id = h.create_run()
    other_run = h.apply("run.create", space="other", name=None, parent_id=None, deadline_ms=None, child_limit=10)["run_id"]
    first = create_barrier(h, run_id, ["k1", "fp1"])
    other = h.apply("barrier.create", space="other", run_id=other_run, target=2, idem=["k1", "fp-other"])
    assert "error" not in other and other["barrier_id"] != first["barrier_id"]


def test_a_rejected_command_is_not_remembered(h: Harness) -> None:
    run_id = h.create_run()
    assert h.err("barrier.create", run_id=run_id, target=0, idem=["k1", "fp1"]) == errors.VALIDATION_FAILED
    # The retry is tried again (here with a fixed request: another fingerprint is no conflict).
    assert "barrier_id" in create_barrier(h, run_id, ["k1", "fp2"])


def test_an_unchanged_result_is_not_remembered(h: Harness) -> None:
    run_id = h.create_run()
    h.ok("pool.ensure", name="gpu", size=1)
    args = {"run_id": run_id, "name": "gpu", "lease_ms": 30_000, "holder": "a"}
    granted = h.apply("pool.acquire", idem=["k1", "fp1"], **args)
    assert granted["granted"] is True
    assert h.apply("pool.acquire", idem=["k2", "fp2"], **args) == {"granted": False, "unchanged": True}
    h.ok("pool.release", lease_id=granted["lease_id"])
    # k2 found nothing the first time; its retry looks again and gets the slot.
    assert h.apply("pool.acquire", idem=["k2", "fp2"], **args)["granted"] is True


def test_a_key_is_forgotten_after_its_time_to_live(h: Harness) -> None:
    run_id = h.create_run()
    first = create_barrier(h, run_id, ["k1", "fp1"])
    h.advance(limits.idempotency_key_ttl_ms)
    again = create_barrier(h, run_id, ["k1", "fp2"])  # a new request: neither a replay nor a conflict
    assert again["barrier_id"] != first["barrier_id"]


def test_the_table_keeps_the_newest_keys_of_a_space(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "idempotency_keys_per_space_max", 3)
    run_id = h.create_run()
    results = [create_barrier(h, run_id, [f"k{n}", "fp"]) for n in range(5)]
    assert list(h.state.idempotency[h.space]) == ["k2", "k3", "k4"]
    assert create_barrier(h, run_id, ["k4", "fp"]) == results[4]
    assert create_barrier(h, run_id, ["k0", "fp"]) != results[0]  # forgotten: applied again


def test_the_table_keeps_the_newest_results_within_its_bytes_bound(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A once result can be 64 KiB: the table forgets its oldest results once they weigh more than
    idempotency_bytes_per_space_max, and the weight it keeps is what it holds."""
    run_id = h.create_run()
    big = "r" * 10_000
    results = []
    for n in range(5):
        granted = h.ok("once.acquire", run_id=run_id, key=f"work{n}", holder="w", lease_ms=1000)
        results.append(h.apply("once.complete", run_id=run_id, key=f"work{n}", token=granted["token"], result=big,
                               idem=[f"k{n}", "fp"]))
    weight = result_bytes(results[0])
    assert weight > len(big)
    assert h.state.idempotency_bytes[h.space] == sum(result_bytes(entry[2]) for entry in h.state.idempotency[h.space].values())

    monkeypatch.setattr(limits, "idempotency_bytes_per_space_max", 3 * weight)
    granted = h.ok("once.acquire", run_id=run_id, key="work5", holder="w", lease_ms=1000)
    h.apply("once.complete", run_id=run_id, key="work5", token=granted["token"], result=big, idem=["k5", "fp"])
    assert [key for key in h.state.idempotency[h.space] if key.startswith("k")] == ["k3", "k4", "k5"]
    assert h.state.idempotency_bytes[h.space] <= limits.idempotency_bytes_per_space_max
    assert_stored_bytes_recount(h.state)


def test_the_table_survives_a_snapshot(h: Harness) -> None:
    run_id = h.create_run()
    first = create_barrier(h, run_id, ["k1", "fp1"])
    restored = Harness()
    restored.core.state = round_trip(h.state)
    restored.now_ms = h.now_ms
    assert restored.apply("barrier.create", run_id=run_id, target=2, idem=["k1", "fp1"]) == first
    assert restored.err("barrier.create", run_id=run_id, target=2, idem=["k1", "fp9"]) == errors.IDEMPOTENCY_CONFLICT


def test_a_malformed_idem_is_refused(h: Harness) -> None:
    run_id = h.create_run()
    for idem in (["k1"], ["", "fp"], ["k" * (limits.idempotency_key_chars_max + 1), "fp"], "k1"):
        assert h.err("barrier.create", run_id=run_id, target=2, idem=idem) == errors.VALIDATION_FAILED


# A history of requests: (key, fingerprint, target of the barrier it asks for, ms to wait after).
requests = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(["f1", "f2"]), st.integers(0, 3),
              st.sampled_from([0, 1_000, limits.idempotency_key_ttl_ms // 2])),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(history=requests)
def test_every_history_applies_each_live_key_once(history: list[tuple[str, str, int, int]]) -> None:
    """Against a model: a key applies its first accepted request once and answers it to every
    retry until it expires; another request under a live key is a conflict; a rejected one (target
    0) is not remembered."""
    h = Harness()
    run_id = h.create_run()
    model: dict[str, tuple[int, str, Any]] = {}  # key -> (first use ms, fingerprint, result)
    for key, fingerprint, target, wait_ms in history:
        live = model.get(key)
        if live is not None and live[0] + limits.idempotency_key_ttl_ms <= h.now_ms:
            live = None
        barriers_before = len(h.state.barriers)
        result = h.apply("barrier.create", run_id=run_id, target=target, idem=[key, fingerprint])
        if live is not None and live[1] != fingerprint:
            assert result["error"]["code"] == errors.IDEMPOTENCY_CONFLICT
        elif live is not None:
            assert result == live[2]
            assert len(h.state.barriers) == barriers_before
        elif target == 0:
            assert result["error"]["code"] == errors.VALIDATION_FAILED
        else:
            assert len(h.state.barriers) == barriers_before + 1
            model[key] = (h.now_ms, fingerprint, result)
        assert_stored_bytes_recount(h.state)
        h.advance(wait_ms)


def _result_bytes_as_first_written(value: Any) -> int:
    """result_bytes as it was first written (one generic stack walk): replicas of either version
    must weigh a result alike, or they would evict different entries."""
    weight = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            weight += len(item)
        elif isinstance(item, dict):
            weight += 8
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            weight += 8
            stack.extend(item)
        else:
            weight += 8
    return weight


class _Text(str):
    pass


class _Number(int):
    pass


_LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8), st.binary(max_size=8),
    st.text(max_size=8).map(_Text), st.integers().map(_Number),
)
_KEYS = st.one_of(st.text(max_size=8), st.integers(), st.text(max_size=8).map(_Text))
_RESULTS = st.recursive(
    _LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(_KEYS, children, max_size=4),
    ),
    max_leaves=24,
)


@settings(max_examples=300, deadline=None)
@given(_RESULTS)
def test_result_bytes_weighs_as_the_first_version_did(value: Any) -> None:
    assert result_bytes(value) == _result_bytes_as_first_written(value)
