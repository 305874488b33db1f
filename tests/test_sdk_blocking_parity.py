"""The blocking SDK cannot drift from the async one: every public method and property of an async
class has its blocking twin, with the same parameters (names, kinds and defaults) and the same
return shape (a coroutine in one is a plain call in the other). Two hand-written copies of a
client drift; this test is what keeps ours one API."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
from runstate.sdk import (
    admin,
    barriers,
    claims,
    client,
    diagnostics,
    events,
    groups,
    once_calls,
    resources,
    sync,
    timers,
)

# (async class, its blocking twin)
PAIRS = [
    (client.AsyncRunstate, sync.Runstate),
    (client.Mailboxes, sync.Mailboxes),
    (client.Scopes, sync.Scopes),
    (client.Scope, sync.Scope),
    (client.Mailbox, sync.Mailbox),
    (client.Ticket, sync.Ticket),
    (client.Delivery, sync.Delivery),
    (claims.Claims, claims.BlockingClaims),
    (once_calls.OnceCalls, once_calls.BlockingOnceCalls),
    (admin.Spaces, admin.BlockingSpaces),
    (admin.Keys, admin.BlockingKeys),
    (diagnostics.Diagnostics, diagnostics.BlockingDiagnostics),
    (barriers.Barriers, barriers.BlockingBarriers),
    (barriers.Barrier, barriers.BlockingBarrier),
    (groups.Groups, groups.BlockingGroups),
    (groups.Group, groups.BlockingGroup),
    (events.Events, events.BlockingEvents),
    (timers.Timers, timers.BlockingTimers),
    (timers.Timer, timers.BlockingTimer),
    (resources.Pools, resources.BlockingPools),
    (resources.Limits, resources.BlockingLimits),
    (resources.Budgets, resources.BlockingBudgets),
    (resources.SlotLease, resources.BlockingSlotLease),
    (resources.Reservation, resources.BlockingReservation),
    (resources.ScopePools, resources.BlockingScopePools),
    (resources.ScopeLimits, resources.BlockingScopeLimits),
    (resources.ScopeBudgets, resources.BlockingScopeBudgets),
]

# Members that exist on one side only, by design: the async client's context manager and close.
ASYNC_ONLY = {"__aenter__", "__aexit__", "aclose"}
BLOCKING_ONLY = {"__enter__", "__exit__", "close"}


_ASSIGNED = re.compile(r"^\s+self\.([a-z]\w*)\s*(?::[^=\n]+)?=(?!=)", re.M)


def public_attributes(cls: type) -> set[str]:
    """Public attributes an instance gets in the __init__ of its class or a base (`self.id = ...`)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is not None and klass.__module__.startswith("runstate"):
            names |= set(_ASSIGNED.findall(inspect.getsource(init)))
    return names


def public_members(cls: type) -> dict[str, Any]:
    members: dict[str, Any] = {name: property() for name in public_attributes(cls)}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_") and name not in ("__aenter__", "__aexit__", "__enter__", "__exit__"):
            continue
        if name in ASYNC_ONLY | BLOCKING_ONLY:
            continue
        static = inspect.getattr_static(cls, name)
        if isinstance(static, property):
            members[name] = static
        elif isinstance(static, (staticmethod, classmethod)) or callable(member):
            members[name] = member
    return members


def parameters(member: Any) -> list[tuple[str, Any, Any]]:
    if isinstance(member, property):
        return []
    signature = inspect.signature(member)
    return [(p.name, p.kind, p.default) for p in signature.parameters.values()]


@pytest.mark.parametrize(("async_cls", "blocking_cls"), PAIRS, ids=lambda cls: cls.__name__)
def test_the_blocking_class_mirrors_the_async_one(async_cls: type, blocking_cls: type) -> None:
    async_members, blocking_members = public_members(async_cls), public_members(blocking_cls)
    assert sorted(async_members) == sorted(blocking_members), "the two classes offer other members"
    for name, async_member in async_members.items():
        blocking_member = blocking_members[name]
        if isinstance(async_member, property) or isinstance(blocking_member, property):
            # An attribute or a property on both sides (either may be a plain attribute).
            assert isinstance(async_member, property) and isinstance(blocking_member, property), name
            continue
        assert parameters(async_member) == parameters(blocking_member), f"{async_cls.__name__}.{name}"
        assert not inspect.iscoroutinefunction(blocking_member), f"{blocking_cls.__name__}.{name} is async"
