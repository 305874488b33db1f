"""Answer schemas of the runs, mailboxes, messages and tasks routes (schemas.py has the pieces)."""

from __future__ import annotations

from typing import Any

from runstate_server.node.api.schemas import (
    ANY_JSON,
    BOOLEAN,
    INTEGER,
    INTEGER_OR_NULL,
    STRING,
    STRING_OR_NULL,
    TIME,
    TIME_OR_NULL,
    array,
    enum,
    nullable,
    obj,
)

RUN = obj({
    "id": STRING, "name": STRING_OR_NULL, "parentId": STRING_OR_NULL,
    "storedState": enum("ACTIVE", "CANCELLED", "COMPLETED", "EXPIRED"), "effective": STRING, "deadline": TIME_OR_NULL,
    "childLimit": INTEGER, "children": INTEGER, "createdAt": TIME, "finishedAt": TIME_OR_NULL, "reason": STRING_OR_NULL,
})
MAILBOX = obj({
    "id": STRING, "name": STRING, "mode": enum("WORK", "INBOX"), "backlogLimit": INTEGER_OR_NULL,
    "maxAttempts": INTEGER_OR_NULL, "requirements": nullable({"type": "object"}),
})
MAILBOXES = obj({"mailboxes": array(MAILBOX)})
# Extension: what a mailbox holds now (as the queue metrics count it) and its ended tasks still held.
MAILBOX_STATS = obj({
    "queued": INTEGER, "inFlight": INTEGER, "oldestQueuedAgeSeconds": nullable({"type": "number"}),
    "succeeded": INTEGER, "failed": INTEGER, "cancelled": INTEGER, "expired": INTEGER, "attemptsTotal": INTEGER,
})
MAILBOX_WITH_STATS = obj({**MAILBOX["properties"], "stats": MAILBOX_STATS})
MAILBOXES_WITH_STATS = obj({"mailboxes": array(MAILBOX_WITH_STATS)})
TASK_STATE = enum("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED")
SUBMITTED = obj({"taskId": STRING, "id": STRING, "taskKey": STRING, "created": BOOLEAN, "state": TASK_STATE})
SENT = obj({"id": STRING, "taskId": STRING, "state": TASK_STATE, "created": BOOLEAN})
_ERROR_ITEM = obj({"error": obj({"code": STRING, "message": STRING})})
SUBMITTED_MANY = obj({"tasks": array({"anyOf": [SUBMITTED, _ERROR_ITEM]})})
TASK = obj({
    "id": STRING, "scopeId": STRING, "mailboxId": STRING_OR_NULL, "mailbox": STRING, "taskKey": STRING,
    "state": TASK_STATE, "done": BOOLEAN, "attempt": INTEGER, "attempts": INTEGER, "input": ANY_JSON, "outcome": ANY_JSON,
    "outcomeReason": STRING_OR_NULL, "error": STRING_OR_NULL, "holder": STRING_OR_NULL, "holderSession": STRING_OR_NULL,
    "leaseExpiresAt": TIME_OR_NULL, "deadline": TIME_OR_NULL, "subscribers": array(STRING), "createdAt": TIME,
    "finishedAt": TIME_OR_NULL, "finishedBy": STRING_OR_NULL, "needs": ANY_JSON,
})
TASK_CHANGED = obj({"taskId": STRING, "state": TASK_STATE}, optional={"outcomeReason": STRING_OR_NULL,
                                                                       "subscribers": array(STRING)})
RESULT = obj({
    "id": STRING, "state": TASK_STATE, "done": BOOLEAN, "outcome": ANY_JSON, "outcomeReason": STRING_OR_NULL,
    "error": STRING_OR_NULL, "attempt": INTEGER,
})
RESULTS = obj({"results": array({"anyOf": [RESULT, TASK, obj({"id": STRING, **_ERROR_ITEM["properties"]})]})})
_HOLDS = obj({"slots": array(STRING), "reservationId": STRING_OR_NULL})
ADMITTED = obj({
    "taskId": STRING, "messageId": STRING, "token": STRING, "payload": ANY_JSON, "attempt": INTEGER,
    "attempts": INTEGER, "taskKey": STRING, "scopeId": STRING, "leaseExpiresAt": TIME, "grants": array(STRING),
    "consumptions": array(ANY_JSON), "reservations": array(STRING), "needs": ANY_JSON, "holds": _HOLDS,
})
ADMITTED_ONE_OR_MANY: dict[str, Any] = {"anyOf": [ADMITTED, obj({"tasks": array(ADMITTED)})]}
RECEIVED = obj({
    "message": obj({
        "id": STRING, "payload": ANY_JSON, "attempt": INTEGER, "attempts": INTEGER, "scopeId": STRING,
        "workKey": STRING, "needs": ANY_JSON, "holds": _HOLDS, "reservations": array(STRING),
    }),
    "token": STRING, "leaseExpiresAt": TIME,
})
RECEIVED_ONE_OR_MANY: dict[str, Any] = {"anyOf": [RECEIVED, obj({"messages": array(RECEIVED)})]}
MESSAGES = obj({"messages": array(obj({
    "id": STRING, "scopeId": STRING, "state": STRING, "attempt": INTEGER, "workKey": STRING, "payload": ANY_JSON,
    "createdAt": TIME,
}))})
RENEWED = obj({"taskId": STRING, "leaseExpiresAt": TIME})
SETTLED = obj({"taskId": STRING, "state": TASK_STATE, "attempt": INTEGER, "outcomeReason": STRING_OR_NULL})
SETTLED_MANY = obj({"items": array({"anyOf": [SETTLED, _ERROR_ITEM]})})
