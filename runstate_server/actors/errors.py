"""Failed preconditions as results.

A command whose precondition fails returns `Rejected(code, message)` and leaves the state as it
was; every replica computes the same rejection. An exception escaping `apply` is a bug.
"""

from __future__ import annotations

from typing import Final

NOT_FOUND: Final = "NOT_FOUND"
VALIDATION_FAILED: Final = "VALIDATION_FAILED"
UNAUTHENTICATED: Final = "UNAUTHENTICATED"  # the command's API key is unknown or revoked
FORBIDDEN: Final = "FORBIDDEN"  # the key belongs to another space, or lacks a permission
CONFLICT: Final = "CONFLICT"
IDEMPOTENCY_CONFLICT: Final = "IDEMPOTENCY_CONFLICT"  # an idempotency key reused with another request
SCOPE_CANCELLED: Final = "SCOPE_CANCELLED"
DEADLINE_EXCEEDED: Final = "DEADLINE_EXCEEDED"
STALE_CLAIM: Final = "STALE_CLAIM"
CLAIM_HELD: Final = "CLAIM_HELD"  # a claim's lease is live: retryable (retryAfterMs: until it runs out)
KEY_CONFLICT: Final = "KEY_CONFLICT"
BACKLOG_FULL: Final = "BACKLOG_FULL"  # a mailbox holds its backlogLimit of unfinished tasks
LIMIT_EXCEEDED: Final = "LIMIT_EXCEEDED"
CONCURRENCY_LIMITED: Final = "CONCURRENCY_LIMITED"  # a work limit holds its maxOutstanding tasks: retryable
STALE_EPOCH: Final = "STALE_EPOCH"
BARRIER_CANCELLED: Final = "BARRIER_CANCELLED"
BARRIER_RELEASED: Final = "BARRIER_RELEASED"
INSUFFICIENT_BUDGET: Final = "INSUFFICIENT_BUDGET"  # a budget has less left than a reservation or settle asks (budgets.py)
# An allowance has not the units now (or waiters are in line), or is under a cooldown: retryable
# (retryAfterMs: when to try again); allowances.py.
ALLOWANCE_EXHAUSTED: Final = "ALLOWANCE_EXHAUSTED"
ALLOWANCE_COOLDOWN: Final = "ALLOWANCE_COOLDOWN"


class Rejected(Exception):
    """Raised inside a handler to reject its command; `apply` turns it into an error result.

    Handlers check every precondition before they change anything, so raising leaves the state
    untouched.
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def as_result(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": self.message}}


def is_error(result: object) -> bool:
    return isinstance(result, dict) and "error" in result
