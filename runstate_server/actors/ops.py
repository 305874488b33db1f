"""Diagnostics: who holds what, and what waits for what (the published protocol's `ops` routes).

Read-only views of the state, for the node to render under its read lock; nothing here changes
anything. They answer the question every queue system's users ask: why is my task not starting?
Each waiting entry names what it waits for and, where something holds it, who:

- a task QUEUED whose needs fall short: each short resource (a permit and the grants and jobs
  holding it, a rate limit and when its window opens for it, a budget and what is left);
- a task QUEUED after a failed attempt: its retry backoff and when it ends;
- a task QUEUED with nothing in its way: no worker has taken it (`worker`, its mailbox);
- a permit waiter: the permit, its place in line, and the holders of the permit's units;
- an allowance waiter: the allowance, its place in line, when its window opens, its cooldown;
- a barrier still short of its target, and an armed timer.

`workers` groups every live lease of the runs by holder: deliveries, claims, once leases,
permit grants and budget reservations, with the earliest lease expiry among them.

Every list is bounded (`ops_runs_max` runs of the subtree, `ops_entries_max` entries per list);
past a bound the answer says `truncated`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import Any

from runstate_server.actors import limits, resources, runs
from runstate_server.actors.resources import BUDGET, LIMIT, POOL
from runstate_server.actors.state import Run, State, Task, TaskState

_OPEN_BARRIER = "WAITING"
_ARMED_TIMER = "ARMED"


class _Page:
    """A list that stops growing at ops_entries_max, remembering that it did."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.truncated = False

    def add(self, item: dict[str, Any]) -> bool:
        if len(self.items) >= limits.ops_entries_max:
            self.truncated = True
            return False
        self.items.append(item)
        return True

    @property
    def full(self) -> bool:
        return len(self.items) >= limits.ops_entries_max


def subtree(state: State, root: Run) -> tuple[list[Run], bool]:
    """The run and its descendants, breadth first, at most ops_runs_max; and whether it stopped
    short."""
    found, frontier = [root], [root]
    while frontier:
        children = [state.runs[child_id] for run in frontier for child_id in run.children if child_id in state.runs]
        room = limits.ops_runs_max - len(found)
        if len(children) > room:
            found.extend(children[:room])
            return found, True
        found.extend(children)
        frontier = children
    return found, False


def _holder_of(holds: dict[str, dict[str, Any]], holder: str | None) -> dict[str, Any]:
    name = holder or "(no holder)"
    entry = holds.get(name)
    if entry is None:
        entry = holds[name] = {
            "holder": name, "sessions": [], "keys": [], "tasks": [], "grants": [], "reservations": [],
            "earliestLeaseExpiry": None,
        }
    return entry


def _lease(entry: dict[str, Any], session: str | None, expires_ms: int | None) -> None:
    if session is not None and session not in entry["sessions"]:
        entry["sessions"].append(session)
    if expires_ms is not None and (entry["earliestLeaseExpiry"] is None or expires_ms < entry["earliestLeaseExpiry"]):
        entry["earliestLeaseExpiry"] = expires_ms


def _tasks(state: State, run: Run) -> list[Task]:
    return [state.tasks[task_id] for queue in run.queues.values() for task_id in queue.by_key.values()
            if task_id in state.tasks]


def _pool_holders(state: State, pool: Any) -> list[dict[str, Any]]:
    """Who holds the permit's units: grants (with their holder) and jobs' slots (with the task)."""
    holders = []
    for hold_id in pool.holds[: limits.ops_entries_max]:
        hold = state.slot_leases[hold_id]
        holders.append({"holder": hold.holder, "units": hold.amount, "scopeId": hold.run_id, "taskId": hold.task_id,
                        "leaseExpiresAt": resources.hold_expires_ms(state, hold)})
    return holders


def _resource_wait(state: State, kind: str, resource: Any, available_ms: int | None) -> dict[str, Any]:
    if kind == POOL:
        in_use = resources.units_in_use(state, resource)
        return {
            "kind": "permit", "name": resource.name, "permitId": resource.public_id, "unitsTotal": resource.size,
            "unitsInUse": in_use, "unitsSetAside": resources.units_set_aside(state, resource),
            "waitersInLine": len(resource.waiters), "heldBy": _pool_holders(state, resource),
        }
    if kind == LIMIT:
        return {
            "kind": "allowance", "name": resource.name, "allowanceId": resource.public_id, "units": resource.units,
            "windowMs": resource.interval_ms, "availableAt": available_ms, "waitersInLine": len(resource.waiters),
            "cooldownUntil": resource.cooldown_until_ms or None, "cooldownReason": resource.cooldown_reason,
        }
    assert kind == BUDGET
    return {"kind": "budget", "name": resource.name, "remainingMinor": str(resources.remaining_minor(resource)),
            "scale": resource.scale, "currency": resource.currency}


def _task_wait(
    state: State, task: Task, space_id: str, now_ms: int, short_needs: dict[Any, list[dict[str, Any]]]
) -> dict[str, Any]:
    """Why a QUEUED task has not started. `short_needs` remembers, for the one view being built,
    what each distinct set of needs falls short of (the same for every job that names it)."""
    base = {"kind": "task", "taskId": task.id, "scopeId": task.run_id, "mailbox": task.mailbox, "attempt": task.attempt}
    if task.ready_at_ms > now_ms:
        return {**base, "waitsFor": [{"kind": "retry", "until": task.ready_at_ms}]}
    if task.needs is not None:
        key = _frozen(task.needs)
        waits_for = short_needs.get(key)
        if waits_for is None:
            short = resources.shortfalls(state, space_id, now_ms, task.needs)
            waits_for = short_needs[key] = [_resource_wait(state, kind, resource, at) for kind, resource, at in short]
        if waits_for:
            return {**base, "waitsFor": waits_for}
    return {**base, "waitsFor": [{"kind": "worker", "mailbox": task.mailbox}]}


def _frozen(value: Any) -> Any:
    """A JSON value as a hashable one (needs as a key of `short_needs`)."""
    if isinstance(value, dict):
        return tuple(sorted((key, _frozen(item)) for key, item in value.items()))
    if isinstance(value, list):
        return tuple(_frozen(item) for item in value)
    return value


def _queued_oldest_first(state: State, space_id: str) -> Iterator[str]:
    """The ids of the space's QUEUED tasks, oldest first (by when each became QUEUED) across its
    mailboxes, from the index of QUEUED tasks each mailbox keeps (state.queue_figures)."""
    mailboxes = sorted(key for key in state.queue_figures if key[0] == space_id)
    streams = [((since_ms, task_id) for task_id, since_ms in state.queue_figures[key].queued.items()) for key in mailboxes]
    for _since_ms, task_id in heapq.merge(*streams):
        yield task_id


def _permit_waiter_wait(state: State, waiter: Any) -> dict[str, Any]:
    pool = state.pools[waiter.pool_id]
    return {
        "kind": "permitWaiter", "waiterId": waiter.id, "scopeId": waiter.run_id, "holder": waiter.holder,
        "units": waiter.units, "state": waiter.state, "position": pool.waiters.index(waiter.id),
        "permit": pool.name, "waitsFor": [_resource_wait(state, POOL, pool, None)],
    }


def _allowance_waiter_wait(state: State, waiter: Any, now_ms: int) -> dict[str, Any]:
    limit = state.rate_limits[waiter.limit_id]
    return {
        "kind": "allowanceWaiter", "waiterId": waiter.id, "scopeId": waiter.run_id, "holder": waiter.holder,
        "units": waiter.units, "state": waiter.state, "position": limit.waiters.index(waiter.id),
        "allowance": limit.name,
        "waitsFor": [_resource_wait(state, LIMIT, limit, resources.ready_ms(limit, waiter.units, now_ms))],
    }


def run_view(state: State, root: Run, now_ms: int) -> dict[str, Any]:
    """The run and its descendants: their holders and what they hold, and everything that waits
    (times in ms)."""
    tree, truncated = subtree(state, root)
    holds: dict[str, dict[str, Any]] = {}
    waiting = _Page()
    short_needs: dict[Any, list[dict[str, Any]]] = {}
    in_tree = {run.id for run in tree}
    for run in tree:
        for task in _tasks(state, run):
            if task.state == TaskState.RUNNING:
                entry = _holder_of(holds, task.holder)
                entry["tasks"].append(task.id)
                entry["keys"].append(task.key)
                _lease(entry, task.holder_session, task.lease_expires_ms)
            elif task.state == TaskState.QUEUED and not waiting.full:
                waiting.add(_task_wait(state, task, root.space, now_ms, short_needs))
        for key, claim_id in run.claims.items():
            claim = state.claims.get(claim_id)
            if claim is not None and claim.token is not None and now_ms < claim.lease_expires_ms:
                entry = _holder_of(holds, claim.holder)
                entry["keys"].append(key)
                _lease(entry, claim.holder_session, claim.lease_expires_ms)
        for key, once_id in run.once.items():
            entry_once = state.once.get(once_id)
            if entry_once is not None and entry_once.token is not None:
                entry = _holder_of(holds, entry_once.holder)
                entry["keys"].append(key)
                _lease(entry, entry_once.holder_session, entry_once.lease_expires_ms)
        for grant_id in run.permit_grants:
            hold = state.slot_leases.get(grant_id)
            if hold is not None:
                entry = _holder_of(holds, hold.holder)
                pool = state.pools[hold.resource_id]
                entry["grants"].append({"grantId": hold.id, "permit": pool.name, "permitId": pool.public_id,
                                        "units": hold.amount})
                _lease(entry, hold.holder_session, hold.lease_expires_ms)
        for waiter_id in run.permit_waiters:
            waiter = state.permit_waiters[waiter_id]
            if waiter.state in ("WAITING", "SIGNALED"):
                waiting.add(_permit_waiter_wait(state, waiter))
        for waiter_id in run.allowance_waiters:
            allowance_waiter = state.allowance_waiters[waiter_id]
            if allowance_waiter.state == "WAITING":
                waiting.add(_allowance_waiter_wait(state, allowance_waiter, now_ms))
        for barrier_id in run.barriers:
            barrier = state.barriers.get(barrier_id)
            if barrier is not None and barrier.state == _OPEN_BARRIER:
                waiting.add({"kind": "barrier", "barrierId": barrier.id, "name": barrier.name, "scopeId": run.id,
                             "arrivals": len(barrier.arrivals), "target": barrier.target, "epoch": barrier.epoch})
        for timer_id in run.timers:
            timer = state.timers.get(timer_id)
            if timer is not None and timer.state == _ARMED_TIMER:
                waiting.add({"kind": "timer", "timerId": timer.id, "scopeId": run.id, "fireAt": timer.fire_at_ms})
    for budget in state.budgets.values():
        if budget.space != root.space:
            continue
        for reservation_id in budget.reservations:  # its open ones
            reservation = state.budget_reservations[reservation_id]
            if reservation.run_id in in_tree:
                entry = _holder_of(holds, reservation.holder)
                entry["reservations"].append({"reservationId": reservation.id, "budget": budget.name,
                                              "heldMinor": str(reservation.held_minor), "state": reservation.state})
    workers = sorted(holds.values(), key=lambda entry: entry["holder"])
    return {
        "rootScopeId": root.id,
        "scopes": [
            {"id": run.id, "name": run.name, "parentId": run.parent_id, "storedState": run.stored_state,
             "effective": runs.effective(state, run, now_ms)}
            for run in tree
        ],
        "workers": workers[: limits.ops_entries_max],
        "waiting": waiting.items,
        "truncated": truncated or waiting.truncated or len(workers) > limits.ops_entries_max,
    }


def waits_view(state: State, space_id: str, now_ms: int) -> dict[str, Any]:
    """Everything of the space that waits on a resource held by someone, oldest first (times in
    ms): permit and allowance waiters in line, and QUEUED jobs whose needs fall short (or that
    wait out a retry backoff), found among the space's ops_queued_scan_max oldest QUEUED tasks. (A
    task that only waits for a worker, a barrier or a timer is in its run's view, not here.)"""
    waiting = _Page()
    for waiter in state.permit_waiters.values():
        if waiter.space == space_id and waiter.state in ("WAITING", "SIGNALED") and not waiting.add(
            _permit_waiter_wait(state, waiter)
        ):
            break
    for allowance_waiter in state.allowance_waiters.values():
        if allowance_waiter.space == space_id and allowance_waiter.state == "WAITING" and not waiting.add(
            _allowance_waiter_wait(state, allowance_waiter, now_ms)
        ):
            break
    # Jobs whose needs fall short now, whether or not a worker asked for them yet (a resource
    # remembers only the queues a receive found blocked on it).
    short_needs: dict[Any, list[dict[str, Any]]] = {}
    for examined, task_id in enumerate(_queued_oldest_first(state, space_id)):
        if examined >= limits.ops_queued_scan_max:
            waiting.truncated = True
            break
        task = state.tasks.get(task_id)
        if task is None or task.needs is None:
            continue
        wait = _task_wait(state, task, space_id, now_ms, short_needs)
        if wait["waitsFor"][0]["kind"] != "worker" and not waiting.add(wait):
            break
    return {"waiting": waiting.items, "truncated": waiting.truncated}
