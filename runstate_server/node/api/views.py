"""How entities look in API answers: camelCase, ISO 8601 times."""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from typing import Any

from runstate_server.actors import tasks
from runstate_server.actors.resources import needs_view
from runstate_server.actors.state import Task, TaskState
from runstate_server.node._json import raw_value
from runstate_server.node.errors import ApiError


def in_space(table: dict[str, Any], space: str, entity_id: str, what: str) -> Any:
    """The entity of `table` with this id in this space; NOT_FOUND otherwise (another space's id
    looks exactly like an unknown one). Call it with the state held (node.read())."""
    entity = table.get(entity_id)
    if entity is None or entity.space != space:
        raise ApiError("NOT_FOUND", f"{what} {entity_id!r} not found")
    return entity


# Seconds whose text iso() remembers: the times of one answer, and of answers made close together,
# mostly fall in a few seconds, and formatting a second costs ten times the lookup.
ISO_SECONDS_CACHED = 4_096


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return f"{_iso_second(ms // 1000)}{ms % 1000:03d}Z"


@functools.lru_cache(maxsize=ISO_SECONDS_CACHED)
def _iso_second(second: int) -> str:
    moment = datetime.fromtimestamp(second, tz=timezone.utc)
    # The year padded to four digits: strftime's %Y writes year 999 as "999", not RFC 3339.
    return f"{moment.year:04d}-" + moment.strftime("%m-%dT%H:%M:%S.")


def run_view(run: dict[str, Any]) -> dict[str, Any]:
    """A run as runs.describe gives it."""
    return {
        "id": run["id"],
        "name": run["name"],
        "parentId": run["parent_id"],
        "storedState": run["stored_state"],
        "effective": run["effective"],
        "deadline": iso(run["deadline_ms"]),
        "childLimit": run["child_limit"],
        "children": run["children"],
        "createdAt": iso(run["created_ms"]),
        "finishedAt": iso(run["finished_ms"]),
        "reason": run["reason"],
    }


def task_view(task: Task, mailbox_id: str | None) -> dict[str, Any]:
    """A task (or message) as GET /tasks/{id} shows it; `done` once it is terminal."""
    return {
        "id": task.id,
        "scopeId": task.run_id,
        "mailboxId": mailbox_id,
        "mailbox": task.mailbox,
        "taskKey": task.key,
        "state": task.state,
        "done": task.state in TaskState.TERMINAL,
        "attempt": task.attempt,
        "attempts": task.attempts,
        "input": raw_value(task.input),
        "outcome": raw_value(task.outcome),
        "outcomeReason": task.outcome_reason,
        "error": task.error if task.state != TaskState.SUCCEEDED else None,
        "holder": task.holder if task.state == TaskState.RUNNING else None,
        "holderSession": task.holder_session if task.state == TaskState.RUNNING else None,
        "leaseExpiresAt": iso(task.lease_expires_ms) if task.state == TaskState.RUNNING else None,
        "deadline": iso(task.deadline_ms),
        "subscribers": list(task.subscribers),
        "createdAt": iso(task.created_ms),
        "finishedAt": iso(task.finished_ms),
        "finishedBy": tasks.finisher(task),
        "needs": needs_view(task.needs),
    }


def mailbox_view(mailbox: dict[str, Any]) -> dict[str, Any]:
    """A mailbox as tasks.describe_mailbox gives it."""
    return {
        "id": mailbox["id"],
        "name": mailbox["name"],
        "mode": mailbox["mode"],
        "backlogLimit": mailbox["backlog_limit"],
        "maxAttempts": mailbox["max_attempts"],
        "requirements": mailbox["requirements"],
    }
