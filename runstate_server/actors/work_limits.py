"""Every rule of a work limit: a bound on how many tasks naming it are outstanding at once.

A work limit belongs to its space and is found by name ("<space>/<name>" in state.work_limits;
its public id is "wlm_<command id>"). It is created under a run (the wire's scopeId, kept and
shown as the row's scopeId: who created it), but it is not the run's: it outlives the run, and a
task of any run of the space may name it. Creating it again with the same maxOutstanding answers
the row; another maxOutstanding is CONFLICT (a limit is never resized).

A task that names one (`work_limit`) is outstanding from its submit until it is terminal: the
limit's `outstanding` is +1 when the task is created and -1 once when it ends, whichever way it
ends (complete, failure, cancel, its deadline, its run's stop: tasks._count_unfinished, the one
place every end of a task passes). A submit that would take it past maxOutstanding is refused
with CONCURRENCY_LIMITED and changes nothing; a replay of an existing task key is answered as
before (it adds no task).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runstate_server.actors import errors, idempotency, limits, runs
from runstate_server.actors.context import Context
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import State, Task, register_table

PREFIX = "wlm_"
_KIND = "work_limit"  # its count in Space.resource_counts


@dataclass(slots=True)
class WorkLimit:
    id: str  # "<space>/<name>"
    space: str
    name: str
    public_id: str  # "wlm_<command id>"
    run_id: str  # the run it was created under (the wire's scopeId)
    max_outstanding: int
    created_ms: int
    outstanding: int = 0  # tasks naming it that are not terminal


register_table("work_limits", WorkLimit)


def find(state: State, space_id: str, name: Any) -> WorkLimit | None:
    limit = state.work_limits.get(f"{space_id}/{name}") if isinstance(name, str) else None
    assert limit is None or isinstance(limit, WorkLimit)
    return limit


def require(ctx: Context, name: Any) -> WorkLimit:
    """The work limit `name` of the space; NOT_FOUND when it has none of that name."""
    limit = find(ctx.state, ctx.space.id, name)
    if limit is None:
        raise Rejected(errors.NOT_FOUND, f"work limit {name!r} not found")
    return limit


def create(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """The work limit `name` of `max_outstanding` tasks, created under run `run_id`; the existing
    one when it has that maxOutstanding, else CONFLICT."""
    name, max_outstanding = args.get("name"), args.get("max_outstanding")
    if not (isinstance(name, str) and 0 < len(name) <= limits.name_chars_max):
        raise Rejected(errors.VALIDATION_FAILED, f"name must be 1 to {limits.name_chars_max} characters")
    if type(max_outstanding) is not int or not 1 <= max_outstanding <= limits.work_limit_outstanding_max:
        raise Rejected(
            errors.VALIDATION_FAILED, f"maxOutstanding must be an integer from 1 to {limits.work_limit_outstanding_max}"
        )
    run = runs.require_run(ctx, args.get("run_id"))
    existing = find(ctx.state, ctx.space.id, name)
    if existing is not None:
        if existing.max_outstanding != max_outstanding:
            raise Rejected(
                errors.CONFLICT, f"work limit {name!r} exists with maxOutstanding {existing.max_outstanding}, not {max_outstanding}"
            )
        return {"name": name, "created": False, idempotency.UNCHANGED: True}
    runs.require_active(ctx, run)
    count = ctx.space.resource_counts.get(_KIND, 0)
    if count >= limits.work_limits_per_space_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a space holds at most {limits.work_limits_per_space_max} work limits")
    limit = WorkLimit(
        f"{ctx.space.id}/{name}", ctx.space.id, name, PREFIX + ctx.command_id, run.id, max_outstanding, ctx.now_ms
    )
    ctx.state.work_limits[limit.id] = limit
    ctx.space.resource_counts[_KIND] = count + 1
    return {"name": name, "created": True}


def require_room(ctx: Context, name: str) -> None:
    """A new task may name the work limit `name`: CONCURRENCY_LIMITED when it holds its
    maxOutstanding tasks already."""
    limit = require(ctx, name)
    if limit.outstanding >= limit.max_outstanding:
        raise Rejected(
            errors.CONCURRENCY_LIMITED,
            f"work limit {name!r} has its maxOutstanding of {limit.max_outstanding} unfinished tasks",
        )


def count(state: State, task: Task, delta: int) -> None:
    """A task naming a work limit is created (+1) or ends (-1)."""
    if task.work_limit is None:
        return
    limit = find(state, task.space, task.work_limit)
    assert limit is not None, "a work limit is never removed while a task names it"
    limit.outstanding += delta
    assert 0 <= limit.outstanding <= limit.max_outstanding, (limit.name, limit.outstanding)


# -- views (for the node, under its read lock) ---------------------------------------------------


def row(limit: WorkLimit) -> dict[str, Any]:
    return {
        "id": limit.public_id,
        "name": limit.name,
        "scopeId": limit.run_id,
        "maxOutstanding": limit.max_outstanding,
        "outstanding": limit.outstanding,
    }


def rows(state: State, space_id: str) -> list[dict[str, Any]]:
    """The space's work limits, oldest first."""
    return [row(limit) for limit in state.work_limits.values() if limit.space == space_id]


HANDLERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {"work_limit.create": create}
