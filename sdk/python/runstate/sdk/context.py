"""`runstate.context()`: what a `once` function or a queue handler knows about its own call."""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from runstate.sdk.errors import ConfigError


@dataclass(frozen=True)
class Context:
    """The call being run.

    Attributes:
        signal: a threading.Event, set when this call's work will not be recorded any more: its
            lease was taken over or lapsed, the run stopped, or (in `serve`) the worker is stopping
            the handler. Check `signal.is_set()` in long work and stop early.
        attempt: 1 for the first attempt, n for the n-th (a failure or a lapsed lease counts).
        key: the once key or the job's key, `<name>:<hash>`.
        run_id: the run the call belongs to.

    In a queue handler, `spend(amount)` reports what the job spent of its budget reservation.
    """

    signal: threading.Event
    attempt: int
    key: str
    run_id: str
    # The job's delivery's `spend`, in a queue handler.
    spend_to: Callable[[float], None] | None = field(default=None, repr=False, compare=False)

    def spend(self, amount: float) -> None:
        """Report `amount` more spent of this job's budget reservation (a decimal, e.g. 0.12);
        the sum is sent when the job completes (or is retried) and charged, the rest of the
        reservation returns to the budget. Without it the whole reservation counts as spent.
        Raises ConfigError outside a queue handler, or for a negative amount."""
        if self.spend_to is None:
            raise ConfigError("context().spend() is only available inside a queue handler")
        self.spend_to(amount)


_CURRENT: contextvars.ContextVar[Context | None] = contextvars.ContextVar("runstate_context", default=None)


def context() -> Context:
    """The `Context` of the once function or queue handler running in this thread or task.

    Raises ConfigError when called anywhere else (use `current_context()` to get None instead).
    """
    current = _CURRENT.get()
    if current is None:
        raise ConfigError("runstate.context() is only available inside a once function or a queue handler")
    return current


def current_context() -> Context | None:
    """The running call's `Context`, or None outside a once function or queue handler."""
    return _CURRENT.get()


def enter(current: Context) -> contextvars.Token[Context | None]:
    return _CURRENT.set(current)


def leave(token: contextvars.Token[Context | None]) -> None:
    _CURRENT.reset(token)
