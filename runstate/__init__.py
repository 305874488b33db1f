"""runstate: coordination for swarms of agents and workers. This is the SDK surface.

    from runstate import AsyncRunstate, Runstate

Importing this package imports only the SDK; the server lives in runstate.node, runstate.cluster
and runstate.actors and is imported only by the server itself.
"""

from __future__ import annotations

from runstate.sdk.client import AsyncRunstate
from runstate.sdk.errors import (
    ConfigError,
    ConflictError,
    DeadlineExceededError,
    ForbiddenError,
    KeyConflictError,
    LeaseLostError,
    LimitExceededError,
    NotFoundError,
    OnceFailedError,
    ResultTimeoutError,
    ResultTooLargeError,
    RunstateError,
    ScopeCancelledError,
    TaskFailedError,
    UnauthenticatedError,
    UnavailableError,
    ValidationError,
)
from runstate.sdk.sync import Runstate

# Later: once, queue, serve, context (the higher-level SDK) are exported from here too.

__version__ = "0.1.0"

__all__ = [
    "AsyncRunstate",
    "ConfigError",
    "ConflictError",
    "DeadlineExceededError",
    "ForbiddenError",
    "KeyConflictError",
    "LeaseLostError",
    "LimitExceededError",
    "NotFoundError",
    "OnceFailedError",
    "ResultTimeoutError",
    "ResultTooLargeError",
    "Runstate",
    "RunstateError",
    "ScopeCancelledError",
    "TaskFailedError",
    "UnauthenticatedError",
    "UnavailableError",
    "ValidationError",
    "__version__",
]
