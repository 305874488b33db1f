"""runstate: coordination for swarms of agents and workers. This is the SDK surface.

    import runstate

    @runstate.once                       # run once per run and arguments, every caller gets the result
    def research_company(name: str) -> dict: ...

    @runstate.queue("research")          # hand work to workers that run runstate.serve()
    def research(input: dict) -> dict: ...

    from runstate import AsyncRunstate, Runstate     # the HTTP clients

Importing this package imports only the SDK; the server lives in runstate_server.node, runstate_server.cluster
and runstate_server.actors and is imported only by the server itself.
"""

from __future__ import annotations

from runstate.sdk._runtime import close, configure
from runstate.sdk.client import AsyncRunstate
from runstate.sdk.context import Context, context, current_context
from runstate.sdk.errors import (
    BacklogFullError,
    ClaimHeldError,
    ConfigError,
    ConflictError,
    CursorExpiredError,
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
    TlsError,
    UnauthenticatedError,
    UnavailableError,
    ValidationError,
    WaitTimeoutError,
)
from runstate.sdk.once import once
from runstate.sdk.queue import Job, Queue, queue, serve, serve_async
from runstate.sdk.sync import Runstate

__version__ = "0.4.0.dev0"  # after the published 0.3.0: this SDK speaks the same protocol

__all__ = [
    "AsyncRunstate",
    "BacklogFullError",
    "ClaimHeldError",
    "ConfigError",
    "ConflictError",
    "Context",
    "CursorExpiredError",
    "DeadlineExceededError",
    "ForbiddenError",
    "KeyConflictError",
    "LeaseLostError",
    "Job",
    "LimitExceededError",
    "NotFoundError",
    "OnceFailedError",
    "Queue",
    "ResultTimeoutError",
    "ResultTooLargeError",
    "Runstate",
    "RunstateError",
    "ScopeCancelledError",
    "TaskFailedError",
    "TlsError",
    "UnauthenticatedError",
    "UnavailableError",
    "ValidationError",
    "WaitTimeoutError",
    "__version__",
    "close",
    "configure",
    "context",
    "current_context",
    "once",
    "queue",
    "serve",
    "serve_async",
]
