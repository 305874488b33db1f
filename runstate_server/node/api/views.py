"""How entities look in API answers: camelCase, ISO 8601 times."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from runstate_server.actors import resources, runs, tasks
from runstate_server.actors.state import Run, State, Task, TaskState
from runstate_server.node.errors import ApiError


def in_space(table: dict[str, Any], space: str, entity_id: str, what: str) -> Any:
    """The entity of `table` with this id in this space; NOT_FOUND otherwise (another space's id
    looks exactly like an unknown one). Call it with the state held (node.read())."""
    entity = table.get(entity_id)
    if entity is None or entity.space != space:
        raise ApiError("NOT_FOUND", f"{what} {entity_id!r} not found")
    return entity


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def run_view(state: State, run: Run, now_ms: int) -> dict[str, Any]:
    return {
        "id": run.id,
        "name": run.name,
        "parentId": run.parent_id,
        "storedState": run.stored_state,
        "effective": runs.effective(state, run, now_ms),
        "deadline": iso(run.deadline_ms),
        "childLimit": run.child_limit,
        "children": len(run.children),
        "createdAt": iso(run.created_ms),
        "finishedAt": iso(run.finished_ms),
        "reason": run.reason,
    }


def task_view(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "scopeId": task.run_id,
        "mailbox": task.mailbox,
        "key": task.key,
        "state": task.state,
        "attempt": task.attempt,
        "attempts": task.attempts,
        "input": task.input,
        "outcome": task.outcome,
        "error": task.error if task.state != TaskState.SUCCEEDED else None,
        "holder": task.holder if task.state == TaskState.RUNNING else None,
        "leaseExpiresAt": iso(task.lease_expires_ms) if task.state == TaskState.RUNNING else None,
        "createdAt": iso(task.created_ms),
        "finishedAt": iso(task.finished_ms),
        "finishedBy": tasks.finisher(task),
        "needs": resources.needs_view(task.needs),
    }


def result_view(task: Task) -> dict[str, Any]:
    done = task.state in TaskState.TERMINAL
    return {
        "id": task.id,
        "state": task.state,
        "done": done,
        "outcome": task.outcome,
        "error": task.error if task.state in (TaskState.FAILED, TaskState.CANCELLED, TaskState.EXPIRED) else None,
        "attempt": task.attempt,
    }


def delivery_view(task: Task) -> dict[str, Any]:
    return {
        "id": task.delivery_id,
        "taskId": task.id,
        "key": task.key,
        "input": task.input,
        "attempt": task.attempt,
        "attempts": task.attempts,
        "leaseExpiresAt": iso(task.lease_expires_ms),
        "needs": resources.needs_view(task.needs),
        # What this delivery took with its lease; it returns when the delivery ends.
        "holds": resources.holds_view(task),
    }
