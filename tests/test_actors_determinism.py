"""Every node applies the same commands and must reach the same state, byte for byte, events
included. What a process does not share with another, its hash seed (`PYTHONHASHSEED`: the order a
set of strings iterates in), must not matter. A scenario that touches every kind of entity (runs
at three levels and a stop's cascade, queues and leases, once, groups, barriers, timers, permits,
allowances, budgets and a job that needs two of them) runs in processes with different seeds; the
snapshots and the effects must be equal. (tests/test_lint.py forbids iterating a set the core
builds; this checks the whole.)

Run by hand: `python -m tests.test_actors_determinism` prints the scenario's digest."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.test_actors_harness import MAILBOX, RETENTION_MS, Harness, snapshot_bytes

ROOT = Path(__file__).resolve().parent.parent
HASH_SEEDS = ("0", "1", "2024")
CHILD_TIMEOUT_S = 120.0
LEASE_MS = 1_000


def scenario(*, removed: bool = True) -> tuple[Harness, bytes]:
    """The harness after the scenario, and its snapshot before the stopped runs are removed (all
    of it is there then); `removed=False` stops before their removal."""
    h = Harness()
    h.ensure()
    top = h.create_run(name="top")
    middle = h.create_run(parent_id=top)
    below = h.create_run(parent_id=middle)
    other = h.create_run()
    # Resources and a queue whose jobs need a permit unit, an allowance unit and two budgets.
    permit = h.ok("permit.create", name="gpu", units=2)["permit_id"]
    allowance = h.ok("allowance.create", name="api", units=5, interval_ms=1_000)["allowance_id"]
    h.ok("budget.create", name="usd", limit_minor=1_000, scale=2, currency="USD")
    h.ok("budget.create", name="eur", limit_minor=1_000, scale=2, currency="EUR")
    h.ok("mailbox.declare", name="jobs", requirements={
        "pools": [{"name": "gpu", "units": 1}], "quotas": [{"name": "api", "units": 1}],
        "budgets": [{"name": "usd", "reserveMinor": "10"}, {"name": "eur", "reserveMinor": "20"}],
    })
    for key in "abc":
        h.ok("task.submit", **{**h.submit_args(below, key), "mailbox": "jobs"})
        h.submit(middle, key, attempts=2)
    jobs = h.ok("task.receive", run_id=below, mailbox="jobs", max=3, lease_ms=LEASE_MS, holder="w")["deliveries"]
    for job in jobs:  # settled in part, the log tells of them: their ends are told too
        for reservation in job["budget_reservations"]:
            budget = h.state.budgets[h.state.budget_reservations[reservation].budget_id].public_id
            h.ok("budget_reservation.settle", budget_id=budget, reservation_id=reservation, amount_minor=0, work_key="k")
    plain = h.receive(middle, max=3, lease_ms=LEASE_MS)
    h.delivery("complete", plain[0], payload={"x": [1, 2.5, None]})
    h.delivery("retry", plain[1], error="flaky", delay_ms=10)
    grant = h.ok("permit.acquire", permit_id=permit, run_id=other, units=1, lease_ms=LEASE_MS, nonce="n")
    h.ok("permit.wait", permit_id=permit, run_id=other, units=2)
    h.apply("allowance.consume", allowance_id=allowance, run_id=other, units=3)
    h.ok("allowance.wait", allowance_id=allowance, run_id=other, units=4)
    # Once, a group with members and verdicts, a barrier and timers.
    once = h.apply("once.acquire", run_id=other, key="once:1", lease_ms=LEASE_MS, holder="w")
    if "token" in once:
        h.apply("once.complete", run_id=other, key="once:1", token=once["token"], result=b'"done"')
    group = h.ok("group.create", run_id=other, retention_ms=RETENTION_MS, mailbox=MAILBOX, condition="ALL_TERMINAL")
    for key in "xy":
        h.apply("group.submit", group_id=group["group_id"], key=key, input={"k": key}, input_hash=f"hash:{key}")
    barrier = h.ok("barrier.create", run_id=other, target=2)["barrier_id"]
    h.ok("barrier.arrive", barrier_id=barrier, key="a")
    h.ok("timer.create", run_id=other, after_ms=500)
    h.ok("timer.create", run_id=other, after_ms=5_000)
    # Time passes: leases lapse, a timer fires, windows open; then stops cascade.
    h.advance(2 * LEASE_MS)
    h.tick()
    h.ok("permit.acquire", permit_id=permit, run_id=other, units=1, lease_ms=LEASE_MS, nonce="m")
    del grant
    h.cancel(top, reason="operator")
    h.cancel(other)
    stopped = snapshot_bytes(h.state)
    if removed:
        h.advance(RETENTION_MS + 1)
        h.tick()
    return h, stopped


def digest() -> str:
    h, stopped = scenario()
    return hashlib.sha256(stopped + snapshot_bytes(h.state) + repr(h.effects).encode()).hexdigest()


def test_the_core_reaches_the_same_state_whatever_the_hash_seed() -> None:
    digests = set()
    for seed in HASH_SEEDS:
        done = subprocess.run(
            [sys.executable, "-m", "tests.test_actors_determinism"], cwd=ROOT, capture_output=True, text=True,
            timeout=CHILD_TIMEOUT_S, env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        digests.add(done.stdout.strip())
    assert len(digests) == 1, digests


def test_the_scenario_reaches_every_kind_of_entity() -> None:
    state = scenario(removed=False)[0].state
    assert state.budget_reservations and state.groups and state.barriers and state.timers
    assert any(space.events for space in state.spaces.values())


if __name__ == "__main__":
    print(digest())
