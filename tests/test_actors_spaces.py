"""Spaces are tenants: every command of dispatch.HANDLERS that names an entity of another space
is refused as if the entity did not exist (NOT_FOUND), and changes nothing.

Two spaces get the same entities (mailbox, run, child run, queued task, held and completed
deliveries, held and completed once entries, a held claim, a group with a member, barriers, timers, an admin key,
a pool, a rate limit and a budget with a slot lease, a reservation and a job holding both, and a
pool of its own name).
Each case names entities of space A in a command of space B, with no key (a node without auth)
and with B's admin key; and from a space that does not exist yet. The same case in space A must
not be NOT_FOUND, so each case really names something that exists. A new handler without a case
fails `test_every_handler_has_a_case`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from runstate_server.actors import access, dispatch, errors
from tests.test_actors_access import ALL, KeyedHarness
from tests.test_actors_harness import MAILBOX, RETENTION_MS, snapshot_bytes, unpack

A, B, NEW = "space-a", "space-b", "space-new"
LEASE_MS = 10_000


@dataclass
class Entities:
    space: str
    admin_key: str  # an admin key of the space (not of the operator space)
    run: str
    child: str
    queued_task: str
    held_delivery: str
    done_delivery: str  # the delivery that completed its task
    held_lease: dict[str, Any]  # the lease of the once entry "held" (run_id, key, token)
    done_lease: dict[str, Any]  # the lease that completed the once entry "done"
    claim_lease: dict[str, Any]  # the live lease of the claim "lock" (key, token)
    group: str
    group_run: str
    member: str  # a SUCCEEDED member of the group, without a verdict
    waiting_barrier: str  # key "a" arrived, target 2
    released_barrier: str
    armed_timer: str
    fired_timer: str
    slot_lease: str  # a direct lease of pool "p"
    reservation: str  # a direct reservation of budget "b"
    own_pool: str  # a pool only this space has
    permit: str  # the public id of pool "q" (size 1)
    grant: dict[str, Any]  # the live grant of "q" (grant_id, token)
    waiter: str  # a WAITING waiter of "q"
    budget: str  # the public id of budget "m" (budgets.py)
    budget_reservation: str  # an ACTIVE reservation of "m"
    allowance: str  # the public id of limit "l" (10 per second, all taken)
    consumption: str  # a consumption of "l"
    allowance_waiter: str  # a WAITING waiter of "l"


def build(h: KeyedHarness, space: str) -> Entities:
    """Every kind of entity in `space`, made through the commands (a node without auth)."""
    h.space = space
    admin_key = h.mint(space, ALL)
    h.ensure()
    run = h.create_run()
    child = h.create_run(parent_id=run)
    h.submit(run, "done")
    (done_delivery,) = h.receive(run)
    h.delivery("complete", done_delivery, payload=1)
    h.submit(run, "held")
    (held_delivery,) = h.receive(run)
    queued_task = h.submit(run, "queued")

    def acquire(key: str) -> dict[str, Any]:
        token = h.ok("once.acquire", run_id=run, key=key, lease_ms=LEASE_MS, holder="w")["token"]
        return {"run_id": run, "key": key, "token": token}

    held_lease = acquire("held")
    done_lease = acquire("done")
    h.ok("once.complete", **done_lease, result=1)
    claim_lease = {"key": "lock", "token": h.ok("claim.acquire", run_id=run, key="lock", lease_ms=LEASE_MS)["token"]}

    group = h.ok("group.create", run_id=run, mailbox=MAILBOX, condition="ALL_TERMINAL", retention_ms=RETENTION_MS)
    member = h.ok("group.submit", group_id=group["group_id"], key="m1", input=1, input_hash="h1")["task_id"]
    (member_delivery,) = h.receive(group["run_id"])
    h.delivery("complete", member_delivery, payload=1)

    waiting_barrier = h.ok("barrier.create", run_id=run, target=2)["barrier_id"]
    h.ok("barrier.arrive", barrier_id=waiting_barrier, key="a")
    released_barrier = h.ok("barrier.create", run_id=run, target=1)["barrier_id"]
    h.ok("barrier.arrive", barrier_id=released_barrier, key="a")

    armed_timer = h.ok("timer.create", run_id=run, after_ms=3_600_000)["timer_id"]
    fired_timer = h.ok("timer.create", run_id=run, after_ms=0)["timer_id"]
    h.tick()
    assert h.state.timers[fired_timer].state == "FIRED"

    own_pool = f"only-{space}"
    h.ok("pool.ensure", name="p", size=5)
    h.ok("pool.ensure", name=own_pool, size=1)
    h.ok("limit.ensure", name="l", units=10, interval_ms=1_000)
    h.ok("budget.ensure", name="b", total_micros=10_000_000)
    slot_lease = h.ok("pool.acquire", name="p", run_id=run, lease_ms=LEASE_MS, holder="w")["lease_id"]
    reservation = h.ok(
        "budget.reserve", name="b", run_id=run, amount_micros=1_000, lease_ms=LEASE_MS, holder="w"
    )["reservation_id"]
    needs = {"slots": ["p"], "limit": ["l", 1], "budget": ["b", 1_000]}
    h.ok("mailbox.ensure", name="jobs")
    h.ok("task.submit", **{**submit(run, "job"), "mailbox": "jobs", "needs": needs})
    (job,) = h.ok("task.receive", run_id=run, mailbox="jobs", max=1, lease_ms=LEASE_MS, holder="w")["task_ids"]
    assert h.state.tasks[job].reservation_id is not None
    permit = h.ok("permit.create", name="q", units=1)["permit_id"]
    granted = h.ok("permit.acquire", permit_id=permit, run_id=run, units=1, lease_ms=LEASE_MS, nonce="n")
    grant = {"grant_id": granted["grant_id"], "token": granted["token"]}
    waiter = h.ok("permit.wait", permit_id=permit, run_id=run, units=1)["waiter_id"]
    budget = h.ok("budget.create", name="m", limit_minor=1_000, scale=2, currency="USD")["budget_id"]
    budget_reservation = h.ok(
        "budget_reservation.reserve", budget_id=budget, run_id=run, amount_minor=10, holder="w"
    )["reservation_id"]
    allowance = h.state.rate_limits[f"{space}/l"].public_id
    consumption = h.ok("allowance.consume", allowance_id=allowance, run_id=run, units=9)["consumption_id"]
    allowance_waiter = h.ok("allowance.wait", allowance_id=allowance, run_id=run, units=1)["waiter_id"]
    assert h.state.allowance_waiters[allowance_waiter].state == "WAITING"
    return Entities(
        space, admin_key, run, child, queued_task, held_delivery, done_delivery, held_lease, done_lease, claim_lease,
        group["group_id"], group["run_id"], member, waiting_barrier, released_barrier, armed_timer, fired_timer,
        slot_lease, reservation, own_pool, permit, grant, waiter, budget, budget_reservation, allowance, consumption,
        allowance_waiter,
    )


@pytest.fixture(scope="module")
def world() -> tuple[bytes, int, Entities, Entities]:
    """(the snapshot, the command count, A's entities, B's entities); each test restores its own
    harness from it."""
    h = KeyedHarness()
    h.bootstrap()  # "ops" is the operator space: neither A's nor B's admin key is an operator
    a, b = build(h, A), build(h, B)
    return snapshot_bytes(h.state), h.commands, a, b


def harness(world: tuple[bytes, int, Entities, Entities]) -> KeyedHarness:
    snapshot, commands, _, _ = world
    h = KeyedHarness()
    h.core.restore(unpack(snapshot))
    h.commands = commands
    return h


# -- the cases -----------------------------------------------------------------------------------

Args = Callable[[Entities, Entities], dict[str, Any]]  # (foreign, own) -> args


@dataclass
class Case:
    args: Args
    code: str = errors.NOT_FOUND
    keyed_only: bool = False  # a keyless caller is trusted like an operator admin: it may do this


def submit(run: str, key: str, input: Any = 1) -> dict[str, Any]:
    return {"run_id": run, "mailbox": MAILBOX, "key": key, "input": input, "input_hash": "h1"}


def new_key(target: str) -> dict[str, Any]:
    return {"space_id": target, "key_id": "key_foreign", "key_hash": "0" * 64, "name": None, "permissions": ["admin"]}


CASES: dict[str, list[Case]] = {
    "run.create": [Case(lambda f, o: {"parent_id": f.run}), Case(lambda f, o: {"parent_id": f.group_run})],
    "run.cancel": [
        Case(lambda f, o: {"run_id": f.run, "retention_ms": RETENTION_MS}),
        Case(lambda f, o: {"run_id": f.child, "retention_ms": RETENTION_MS}),
        Case(lambda f, o: {"run_id": f.group_run, "retention_ms": RETENTION_MS}),
    ],
    "run.complete": [Case(lambda f, o: {"run_id": f.run, "retention_ms": RETENTION_MS})],
    "task.submit": [
        Case(lambda f, o: submit(f.run, "queued", {"key": "queued"})),  # the existing task's key
        Case(lambda f, o: submit(f.run, "fresh")),
        Case(lambda f, o: submit(f.group_run, "m1")),
        # Resources are named in the command's space: a pool only the other space has is not found.
        Case(lambda f, o: {**submit(o.run, "needy"), "needs": {"slots": [f.own_pool]}}),
    ],
    "task.receive": [
        Case(lambda f, o: {"run_id": f.run, "mailbox": MAILBOX, "max": 10, "lease_ms": LEASE_MS, "holder": "x"})
    ],
    "delivery.renew": [Case(lambda f, o: {"delivery_id": f.held_delivery, "lease_ms": LEASE_MS})],
    "delivery.complete": [
        Case(lambda f, o: {"delivery_id": f.held_delivery, "payload": 2}),
        Case(lambda f, o: {"delivery_id": f.done_delivery, "payload": 1}),  # a repeated complete
    ],
    "delivery.retry": [Case(lambda f, o: {"delivery_id": f.held_delivery, "error": "e", "delay_ms": None})],
    "delivery.reject": [Case(lambda f, o: {"delivery_id": f.held_delivery, "error": "e"})],
    "delivery.release": [Case(lambda f, o: {"delivery_id": f.held_delivery})],
    "task.cancel": [Case(lambda f, o: {"task_id": f.queued_task})],
    "task.join": [
        Case(lambda f, o: {"task_id": f.queued_task, "run_id": o.run, "subscriber": "s"}),
        Case(lambda f, o: {"task_id": o.queued_task, "run_id": f.run, "subscriber": "s"}),
    ],
    "task.detach": [Case(lambda f, o: {"task_id": f.queued_task, "subscriber": "s"})],
    "once.acquire": [
        Case(lambda f, o, key=key: {"run_id": f.run, "key": key, "lease_ms": LEASE_MS, "holder": "x"})
        for key in ("held", "done", "fresh")
    ],
    "once.renew": [Case(lambda f, o: {**f.held_lease, "lease_ms": LEASE_MS})],
    "once.complete": [
        Case(lambda f, o: {**f.held_lease, "result": 2}),
        Case(lambda f, o: {**f.done_lease, "result": 1}),  # a repeated complete
    ],
    "once.fail": [Case(lambda f, o: {**f.held_lease, "error": "e"})],
    "once.release": [Case(lambda f, o: {**f.held_lease})],
    "claim.acquire": [
        Case(lambda f, o, key=key: {"run_id": f.run, "key": key, "lease_ms": LEASE_MS, "holder": "x"})
        for key in ("lock", "fresh")
    ],
    # A token names its claim, not the space: one of another space is stale here, never found.
    "claim.renew": [Case(lambda f, o: {**f.claim_lease, "lease_ms": LEASE_MS}, code=errors.STALE_CLAIM)],
    "claim.release": [Case(lambda f, o: {**f.claim_lease}, code=errors.STALE_CLAIM)],
    "group.create": [
        Case(lambda f, o: {"run_id": f.run, "mailbox": MAILBOX, "condition": "ALL_TERMINAL",
                           "retention_ms": RETENTION_MS}),
        Case(lambda f, o: {"run_id": o.run, "parent_id": f.run, "mailbox": MAILBOX, "condition": "ALL_TERMINAL",
                           "retention_ms": RETENTION_MS}),
    ],
    "group.submit": [
        Case(lambda f, o: {"group_id": f.group, "key": "m1", "input": 1, "input_hash": "h1"}),  # a member's key
        Case(lambda f, o: {"group_id": f.group, "key": "m2", "input": 2, "input_hash": "h2"}),
    ],
    "group.join": [
        Case(lambda f, o: {"group_id": f.group, "task_id": f.member}),
        Case(lambda f, o: {"group_id": o.group, "task_id": f.queued_task}),
    ],
    "group.close": [Case(lambda f, o: {"group_id": f.group})],
    "group.seal": [Case(lambda f, o: {"group_id": f.group})],
    **{
        verdict: [
            Case(lambda f, o: {"group_id": f.group, "task_id": f.member}),
            Case(lambda f, o: {"group_id": o.group, "task_id": f.member}),
        ]
        for verdict in ("group.accept", "group.reject")
    },
    "barrier.create": [Case(lambda f, o: {"run_id": f.run, "target": 2})],
    "barrier.arrive": [
        Case(lambda f, o: {"barrier_id": f.waiting_barrier, "key": "a"}),  # arrived already: idempotent
        Case(lambda f, o: {"barrier_id": f.waiting_barrier, "key": "z"}),
        Case(lambda f, o: {"barrier_id": f.released_barrier, "key": "a"}),
    ],
    "barrier.next_epoch": [Case(lambda f, o: {"barrier_id": f.released_barrier})],
    "barrier.declare": [Case(lambda f, o: {"run_id": f.run, "name": "n", "target": 2})],
    "timer.create": [Case(lambda f, o: {"run_id": f.run, "after_ms": 1_000})],
    "timer.declare": [Case(lambda f, o: {"run_id": f.run, "name": "n", "after_ms": 1_000})],
    "timer.acknowledge": [Case(lambda f, o: {"timer_id": f.fired_timer})],
    "timer.ack": [Case(lambda f, o: {"timer_id": f.fired_timer, "token": "t"})],
    "timer.cancel": [Case(lambda f, o: {"timer_id": f.armed_timer})],
    "pool.acquire": [Case(lambda f, o: {"name": "p", "run_id": f.run, "lease_ms": LEASE_MS, "holder": "x"})],
    "pool.renew": [Case(lambda f, o: {"lease_id": f.slot_lease, "lease_ms": LEASE_MS})],
    "pool.release": [Case(lambda f, o: {"lease_id": f.slot_lease})],
    "limit.take": [Case(lambda f, o: {"name": "l", "run_id": f.run, "units": 1})],
    "budget.reserve": [
        Case(lambda f, o: {"name": "b", "run_id": f.run, "amount_micros": 1, "lease_ms": LEASE_MS, "holder": "x"})
    ],
    "budget.renew": [Case(lambda f, o: {"reservation_id": f.reservation, "lease_ms": LEASE_MS})],
    "budget.release": [Case(lambda f, o: {"reservation_id": f.reservation})],
    "budget.settle": [Case(lambda f, o: {"reservation_id": f.reservation, "spent_micros": 1})],
    "resource.resize": [
        Case(lambda f, o: {"resource": "pool", "id": f.permit, "size": 2}),
        Case(lambda f, o: {"resource": "limit", "id": f.allowance, "units": 5, "interval_ms": 1_000}),
        Case(lambda f, o: {"resource": "budget", "id": f.budget, "limit_minor": 5}),
    ],
    "permit.acquire": [
        Case(lambda f, o: {"permit_id": f.permit, "run_id": o.run, "units": 1, "lease_ms": LEASE_MS}),
        Case(lambda f, o: {"permit_id": o.permit, "run_id": f.run, "units": 1, "lease_ms": LEASE_MS}),
    ],
    # A grant's token names its lease: one of another space holds nothing here.
    "permit.renew": [Case(lambda f, o: {**f.grant, "lease_ms": LEASE_MS}, code=errors.STALE_CLAIM)],
    "permit.release": [Case(lambda f, o: f.grant, code=errors.STALE_CLAIM)],
    "permit.wait": [
        Case(lambda f, o: {"permit_id": f.permit, "run_id": o.run, "units": 1}),
        Case(lambda f, o: {"permit_id": o.permit, "run_id": f.run, "units": 1}),
    ],
    "permit_waiter.cancel": [Case(lambda f, o: {"waiter_id": f.waiter})],
    "work_limit.create": [Case(lambda f, o: {"name": "wl", "run_id": f.run, "max_outstanding": 1})],
    "budget_reservation.reserve": [
        Case(lambda f, o: {"budget_id": f.budget, "run_id": o.run, "amount_minor": 1}),
        Case(lambda f, o: {"budget_id": o.budget, "run_id": f.run, "amount_minor": 1}),
    ],
    **{
        kind: [Case(lambda f, o, extra=extra: {"budget_id": f.budget, "reservation_id": f.budget_reservation,
                                               "work_key": "k", **extra})]
        for kind, extra in (("budget_reservation.settle", {"amount_minor": 1}), ("budget_reservation.void", {}))
    },
    "allowance.consume": [
        Case(lambda f, o: {"allowance_id": f.allowance, "run_id": o.run, "units": 1}),
        Case(lambda f, o: {"allowance_id": o.allowance, "run_id": f.run, "units": 1}),
    ],
    "allowance.wait": [
        Case(lambda f, o: {"allowance_id": f.allowance, "run_id": o.run, "units": 1}),
        Case(lambda f, o: {"allowance_id": o.allowance, "run_id": f.run, "units": 1}),
    ],
    "allowance.cooldown": [Case(lambda f, o: {"allowance_id": f.allowance, "cooldown_ms": 1_000})],
    "allowance_waiter.cancel": [Case(lambda f, o: {"waiter_id": f.allowance_waiter})],
    "allowance_consumption.settle": [Case(lambda f, o: {"consumption_id": f.consumption, "units": 1})],
    "key.revoke": [Case(lambda f, o: {"key_id": f.admin_key}, keyed_only=True)],
    # Naming another space as the target is refused before anything is looked up.
    "key.create": [Case(lambda f, o: new_key(f.space), code=errors.FORBIDDEN, keyed_only=True)],
}

# Handlers that name no entity of a space by id: they act on the command's own space only.
# (space.create names a new space; who may create one is tested in test_actors_access.)
# (pool.ensure, limit.ensure, budget.ensure name a resource of the command's own space; so do the
# mailbox commands and run.named.)
NO_FOREIGN_ID = {
    "mailbox.ensure", "mailbox.create", "mailbox.declare", "run.named", "space.create", "pool.ensure", "limit.ensure",
    "budget.ensure", "permit.create", "permit.declare", "budget.create", "budget.declare",
    "allowance.create", "allowance.declare",
}


# Batch commands answer each item on its own: each case of the single command, as an item.
PER_ITEM = {"delivery.complete_many": "delivery.complete", "task.submit_many": "task.submit"}


def batch_args(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    """A batch command's args: its items, and for task.submit_many a command id for each."""
    return {"items": items, **({"ids": [f"item-{n}" for n in range(len(items))]} if kind == "task.submit_many" else {})}


def test_every_handler_has_a_case() -> None:
    assert set(CASES) | NO_FOREIGN_ID | set(PER_ITEM) == set(dispatch.HANDLERS)
    assert not set(CASES) & NO_FOREIGN_ID
    assert not set(PER_ITEM) & (set(CASES) | NO_FOREIGN_ID)
    assert all(CASES.values())


PARAMS = [
    pytest.param(kind, index, mode, id=f"{kind}-{index}-{mode}")
    for kind, cases in CASES.items()
    for index, case in enumerate(cases)
    for mode in ("keyed", "keyless", "new-space")
    if not (case.keyed_only and mode != "keyed")
]


@pytest.mark.parametrize(("kind", "index", "mode"), PARAMS)
def test_an_id_of_another_space_is_not_found_and_changes_nothing(
    world: tuple[bytes, int, Entities, Entities], kind: str, index: int, mode: str
) -> None:
    _, _, a, b = world
    case = CASES[kind][index]
    h = harness(world)
    space = NEW if mode == "new-space" else B
    api_key = b.admin_key if mode == "keyed" else None
    assert h.err(kind, space=space, api_key=api_key, **case.args(a, b)) == case.code  # the snapshot is unchanged
    assert NEW not in h.state.spaces

    # The same case in space A names things that exist there: not NOT_FOUND.
    owner = harness(world)
    result = owner.apply(kind, space=A, api_key=a.admin_key if mode == "keyed" else None, **case.args(a, a))
    assert result.get("error", {}).get("code") != errors.NOT_FOUND, result


@pytest.mark.parametrize("mode", ["keyed", "keyless", "new-space"])
@pytest.mark.parametrize("kind", sorted(PER_ITEM))
def test_a_batch_item_naming_another_space_is_not_found_and_changes_nothing(
    world: tuple[bytes, int, Entities, Entities], kind: str, mode: str
) -> None:
    _, _, a, b = world
    cases = CASES[PER_ITEM[kind]]
    h = harness(world)
    before = snapshot_bytes(h.state, without_clock=True)
    api_key = b.admin_key if mode == "keyed" else None
    result = h.ok(kind, space=NEW if mode == "new-space" else B, api_key=api_key,
                  **batch_args(kind, [case.args(a, b) for case in cases]))
    assert [item.get("error", {}).get("code") for item in result["items"]] == [case.code for case in cases]
    assert snapshot_bytes(h.state, without_clock=True) == before
    assert NEW not in h.state.spaces


def test_the_audit_covers_every_kind_of_entity(world: tuple[bytes, int, Entities, Entities]) -> None:
    """Both spaces hold one of everything, and nothing of one space points into the other."""
    h = harness(world)
    state = h.state
    for table in (
        state.runs, state.tasks, state.once, state.claims, state.groups, state.barriers, state.timers, state.pools,
        state.rate_limits, state.budgets, state.slot_leases, state.reservations, state.permit_waiters,
        state.allowance_waiters, state.allowance_consumptions,
    ):
        assert {entity.space for entity in table.values()} == {A, B}
    for hold in [*state.slot_leases.values(), *state.reservations.values()]:
        assert state.runs[hold.run_id].space == hold.space
        assert hold.task_id is None or state.tasks[hold.task_id].space == hold.space
    for run in state.runs.values():
        assert all(state.runs[child].space == run.space for child in run.children)
        assert all(state.once[entry].space == run.space for entry in run.once.values())
        assert all(state.claims[claim].space == run.space for claim in run.claims.values())
    for task in state.tasks.values():
        assert state.runs[task.run_id].space == task.space
    assert [view["id"] for view in access.list_keys(state, B)] == [world[3].admin_key]
