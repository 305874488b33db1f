"""Ctrl-C of a consuming worker: one line on stderr and exit status 130, not a traceback.

`asyncio.run(main())` takes Ctrl-C by cancelling its main task, then raises KeyboardInterrupt once
the task ended: a worker stopped that way printed a CancelledError and a KeyboardInterrupt
traceback, some 30 lines. While consume() runs in the main thread, a handler in front of the one
in place counts the SIGINTs (and passes each on: asyncio.run's handler still cancels the task, and
a second Ctrl-C still interrupts at once). A consume() cancelled after a SIGINT hands its running
deliveries back as on any cancel, then raises `Interrupted`: a KeyboardInterrupt for the caller's
`except KeyboardInterrupt`, and a SystemExit(130) for the interpreter, which ends the process
without a traceback with the status a shell gives a process that Ctrl-C stopped (the TypeScript
SDK's worker dies of the signal: no output, the same status).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

SIGINT_EXIT_STATUS = 128 + signal.SIGINT  # 130: how a shell reports a process that SIGINT ended
INTERRUPTED_MESSAGE = "runstate: stopped consuming on Ctrl-C (SIGINT); running deliveries were handed back"


class Interrupted(SystemExit, KeyboardInterrupt):
    """consume() stopped by Ctrl-C. Catch it as KeyboardInterrupt; uncaught, the process exits with
    status 130 and no traceback (SystemExit's `code`)."""

    def __init__(self) -> None:
        super().__init__(SIGINT_EXIT_STATUS)


def interrupted() -> Interrupted:
    """Says once, on stderr, that consuming stopped on Ctrl-C; the exception to raise."""
    print(INTERRUPTED_MESSAGE, file=sys.stderr, flush=True)
    return Interrupted()


class _SigintCounter:
    """One handler for the process, in front of the one that was in place, while any consume()
    of the main thread runs (several may run at once: the first installs it, the last removes it)."""

    def __init__(self) -> None:
        self.count = 0  # SIGINTs seen while installed
        self.users = 0
        self.previous: Any = None

    def handle(self, signum: int, frame: Any) -> None:
        self.count += 1
        self.previous(signum, frame)


_COUNTER = _SigintCounter()


@contextlib.contextmanager
def watching_sigint() -> Iterator[Callable[[], bool]]:
    """While the block runs: a function telling whether a SIGINT arrived since it began. Counts
    only in the main thread and when a Python handler is in place (asyncio.run's, or Python's
    default one): an ignored or default-action SIGINT is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    counter = _COUNTER
    if counter.users == 0:
        previous = signal.getsignal(signal.SIGINT)
        if not callable(previous):
            yield lambda: False
            return
        counter.previous = previous
        signal.signal(signal.SIGINT, counter.handle)
    counter.users += 1
    start = counter.count
    try:
        yield lambda: counter.count > start
    finally:
        counter.users -= 1
        if counter.users == 0 and signal.getsignal(signal.SIGINT) == counter.handle:
            signal.signal(signal.SIGINT, counter.previous)
