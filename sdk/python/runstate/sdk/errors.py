"""The SDK's exceptions: one class per error code of the HTTP API, plus the SDK's own.

Every exception is a `RunstateError` carrying `.code` (the API's error code, e.g. `STALE_CLAIM`),
`.status` (the HTTP status, or None when the SDK raised it without an answer from the server) and
`.message`. Every 409 is a `ConflictError`, so `except ConflictError` catches them all; the
specific codes have their own subclasses. `error_from_response` is the one place that maps an
answer of the server to a class.
"""

from __future__ import annotations

import enum
import re


class _Unset(enum.Enum):
    UNSET = "UNSET"


_UNSET = _Unset.UNSET


class RunstateError(Exception):
    """Base class of every error the SDK raises.

    Attributes:
        code: the API's error code (`NOT_FOUND`, `SCOPE_CANCELLED`, ...), or the SDK's own code for
            errors raised without a server answer (`UNAVAILABLE`, `RESULT_TIMEOUT`, ...).
        status: the HTTP status of the answer, or None when no answer was involved.
        message: a human-readable explanation.
    """

    default_code: str = "INTERNAL"
    default_status: int | None = None

    def __init__(
        self, message: str, *, code: str | None = None, status: int | None | _Unset = _UNSET
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code: str = code if code is not None else self.default_code
        self.status: int | None = self.default_status if status is _UNSET else status

    def __str__(self) -> str:
        where = f" (HTTP {self.status})" if self.status is not None else ""
        return f"{self.code}{where}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, status={self.status!r}, message={self.message!r})"

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields survive pickling (errors cross process and thread boundaries).
        return (_rebuild, (type(self), self.message, self.code, self.status, dict(self.__dict__)))


def _rebuild(
    cls: type[RunstateError], message: str, code: str, status: int | None, state: dict[str, object]
) -> RunstateError:
    error = cls.__new__(cls)
    RunstateError.__init__(error, message, code=code, status=status)
    error.__dict__.update(state)
    return error


class ValidationError(RunstateError):
    """The server refused a request as malformed or over a bound (400 VALIDATION_FAILED)."""

    default_code = "VALIDATION_FAILED"
    default_status: int | None = 400


class ConfigError(ValidationError):
    """The SDK was misused locally (a bad argument or setting); raised before any request is sent.

    A subclass of ValidationError, so `except ValidationError` catches bad input whether the SDK or
    the server noticed it. `.status` is None.
    """

    default_status = None


class UnauthenticatedError(RunstateError):
    """The API key is missing or wrong (401 UNAUTHENTICATED)."""

    default_code = "UNAUTHENTICATED"
    default_status = 401


class ForbiddenError(RunstateError):
    """The API key lacks the permission for this call (403 FORBIDDEN)."""

    default_code = "FORBIDDEN"
    default_status = 403


class NotFoundError(RunstateError):
    """The id or name is unknown, or belongs to another space (404 NOT_FOUND)."""

    default_code = "NOT_FOUND"
    default_status = 404


class ConflictError(RunstateError):
    """The call conflicts with the current state (409). Base class of every 409.

    Codes without a class of their own (CONFLICT, BARRIER_CANCELLED,
    BARRIER_RELEASED, ...) are raised as ConflictError with `.code` set.
    """

    default_code = "CONFLICT"
    default_status = 409


class ScopeCancelledError(ConflictError):
    """The run, or a run above it, is cancelled or completed (409 SCOPE_CANCELLED)."""

    default_code = "SCOPE_CANCELLED"


class DeadlineExceededError(ConflictError):
    """The run, or a run above it, is past its deadline (409 DEADLINE_EXCEEDED)."""

    default_code = "DEADLINE_EXCEEDED"


class LeaseLostError(ConflictError):
    """The delivery's lease lapsed or was taken over by another worker (409 STALE_CLAIM)."""

    default_code = "STALE_CLAIM"


class ClaimHeldError(ConflictError):
    """Another holder's lease on the claim is live (409 CLAIM_HELD); try again later."""

    default_code = "CLAIM_HELD"


class KeyConflictError(ConflictError):
    """The task key is already used with a different input (409 KEY_CONFLICT)."""

    default_code = "KEY_CONFLICT"


class BacklogFullError(ConflictError):
    """The mailbox holds its backlogLimit of unfinished tasks (409 BACKLOG_FULL); retry later."""

    default_code = "BACKLOG_FULL"


class LimitExceededError(ConflictError):
    """A count bound of the state (children, tasks, runs) is reached (409 LIMIT_EXCEEDED)."""

    default_code = "LIMIT_EXCEEDED"


class ResultTooLargeError(RunstateError):
    """A result is over the server's bound of 64 KB (400 VALIDATION_FAILED "... exceeds 65536
    bytes"; `.code` is RESULT_TOO_LARGE when the SDK refused it before sending)."""

    default_code = "RESULT_TOO_LARGE"
    default_status = 413


class UnavailableError(RunstateError):
    """No server could answer (503 UNAVAILABLE).

    Raised for a 503 answer, and by the SDK itself when no listed server answered after a few
    seconds of retrying (`.status` is then None).
    """

    default_code = "UNAVAILABLE"
    default_status = 503


class TlsError(RunstateError):
    """TLS with a server failed for a reason a retry would meet again, so the call is not retried:
    the server's certificate does not verify against the client's CAs (`ca_file`, else the
    system's: an unknown CA, expired, issued for another host), or the server refused the
    handshake (it requires a client certificate and the client has none it accepts), or it does
    not speak TLS. The server read no request. `.url` is the server's base URL, `.reason` what
    failed; `.status` is None."""

    default_code = "TLS_FAILED"

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


class CursorExpiredError(RunstateError):
    """An events cursor is older than what the server keeps (410 CURSOR_EXPIRED): read again
    without a cursor (events.watch(restart_on_expired=True) does)."""

    default_code = "CURSOR_EXPIRED"
    default_status = 410


class ResultTimeoutError(RunstateError):
    """`ticket.result(timeout_ms=...)` found no recorded result in time. The task may still finish.

    Attributes: `task_id`, `timeout_ms`, and `state` (the task's last seen state, or None).
    """

    default_code = "RESULT_TIMEOUT"

    def __init__(self, task_id: str, timeout_ms: int, state: str | None = None) -> None:
        last = f" (last state {state})" if state is not None else ""
        super().__init__(f"task {task_id} has no recorded result after {timeout_ms} ms{last}")
        self.task_id = task_id
        self.timeout_ms = timeout_ms
        self.state = state


class TaskFailedError(RunstateError):
    """A task ended without a result: FAILED after its attempts, or CANCELLED or EXPIRED.

    Attributes: `attempts` (how many attempts were made), `task_id` (or None).
    """

    default_code = "TASK_FAILED"

    def __init__(
        self, message: str, *, attempts: int = 0, task_id: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.attempts = attempts
        self.task_id = task_id


class OnceFailedError(RunstateError):
    """A `once` call failed after its attempts. Attributes: `attempts`, `key` (or None)."""

    default_code = "ONCE_FAILED"

    def __init__(
        self, message: str, *, attempts: int = 0, key: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.attempts = attempts
        self.key = key


_CLASS_BY_CODE: dict[str, type[RunstateError]] = {
    "VALIDATION_FAILED": ValidationError,
    "UNAUTHENTICATED": UnauthenticatedError,
    "FORBIDDEN": ForbiddenError,
    "NOT_FOUND": NotFoundError,
    "CONFLICT": ConflictError,
    "SCOPE_CANCELLED": ScopeCancelledError,
    "DEADLINE_EXCEEDED": DeadlineExceededError,
    "STALE_CLAIM": LeaseLostError,
    "CLAIM_HELD": ClaimHeldError,
    "KEY_CONFLICT": KeyConflictError,
    "LIMIT_EXCEEDED": LimitExceededError,
    "BACKLOG_FULL": BacklogFullError,
    "BARRIER_CANCELLED": ConflictError,
    "BARRIER_RELEASED": ConflictError,
    "RESULT_TOO_LARGE": ResultTooLargeError,
    "IDEMPOTENCY_CONFLICT": ConflictError,
    "UNAVAILABLE": UnavailableError,
    "CURSOR_EXPIRED": CursorExpiredError,
}

# The server's VALIDATION_FAILED for a value over a size bound says "... exceeds N bytes".
_TOO_LARGE = re.compile(r"exceeds \d+ bytes")

_CLASS_BY_STATUS: dict[int, type[RunstateError]] = {
    400: ValidationError,
    401: UnauthenticatedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    502: UnavailableError,
    503: UnavailableError,
    504: UnavailableError,
}

_CODE_BY_STATUS: dict[int, str] = {
    400: "VALIDATION_FAILED",
    401: "UNAUTHENTICATED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    409: "CONFLICT",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "UNAVAILABLE",
}


def error_from_response(status: int, code: str | None, message: str | None) -> RunstateError:
    """The exception for a non-2xx answer: by its code, else (an unknown or missing code) by status.

    The returned error keeps the server's code and status as they were, even when the class is
    chosen by status.
    """
    cls = _CLASS_BY_CODE.get(code) if code else None
    if code == "VALIDATION_FAILED" and message and _TOO_LARGE.search(message):
        cls = ResultTooLargeError
    if cls is None:
        cls = _CLASS_BY_STATUS.get(status, RunstateError)
    if not code:
        code = _CODE_BY_STATUS.get(status, "INTERNAL")
    text = message if message else f"HTTP {status}"
    return cls(text, code=code, status=status)


# The status each code comes with, for errors reported inside a 200 answer (batch calls): the
# server's own (runstate_server/node/errors.py STATUS_BY_CODE), so that a task's error from a batch
# is the error its single call raises. A code not listed is a 409 if the SDK knows it, else a 500.
_STATUS_BY_CODE: dict[str, int] = {
    "VALIDATION_FAILED": 400,
    "UNAUTHENTICATED": 401,
    "FORBIDDEN": 403,
    "FORBIDDEN_ORIGIN": 403,
    "NOT_FOUND": 404,
    "METHOD_NOT_ALLOWED": 405,
    "REQUEST_TIMEOUT": 408,
    "AUTH_DISABLED": 409,
    "CAPACITY_UNAVAILABLE": 409,
    "INSUFFICIENT_BUDGET": 409,
    "STALE_EPOCH": 409,
    "CURSOR_EXPIRED": 410,
    "UNSUPPORTED_MEDIA_TYPE": 415,
    "CONCURRENCY_LIMITED": 429,
    "ALLOWANCE_EXHAUSTED": 429,
    "ALLOWANCE_COOLDOWN": 429,
    "UNAVAILABLE": 503,
    "INTERNAL": 500,
}


def error_from_item(error: dict[str, str]) -> RunstateError:
    """The exception for one item's `{"code", "message"}` in a batch answer."""
    code = error.get("code") or "INTERNAL"
    status = _STATUS_BY_CODE.get(code, 409 if code in _CLASS_BY_CODE else 500)
    return error_from_response(status, code, error.get("message"))


class WaitTimeoutError(RunstateError):
    """A `wait(timeout_ms=...)` on a barrier, timer or group ended before what it waits for
    happened. Nothing changed: wait again, or give up. Attributes: `what` (e.g. "barrier bar_1"),
    `timeout_ms`."""

    default_code = "WAIT_TIMEOUT"

    def __init__(self, what: str, timeout_ms: int) -> None:
        super().__init__(f"{what} did not happen within {timeout_ms} ms")
        self.what = what
        self.timeout_ms = timeout_ms
