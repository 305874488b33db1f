"""`runstate.once`: run a function once per run and key; every caller gets the one result.

    @runstate.once
    def research_company(name: str) -> dict: ...

    @runstate.once(name="research", key=lambda company, http: company.domain, attempts=5, lease="60s")
    async def research(company, http): ...

A call computes its key (see `runstate.sdk.keys`: the bound arguments, or `key(...)`, hashed) and
acquires the once entry of that key in the run (docs/http-api.md, "Once"):

- DONE: the recorded result comes back at once.
- HELD by another caller: wait (long poll) until it is not, then look again.
- GRANTED: this caller runs the function under a lease renewed every third of it. The return value
  is recorded and returned; an exception is recorded as a failed attempt and raised to this caller
  only (the next waiting caller tries); a renewal refused sets `context().signal`, and a result
  the server refuses because the lease was taken over raises LeaseLostError.
- FAILED (out of attempts): OnceFailedError, until the run ends.

Every caller gets the result as JSON carried it (a tuple comes back as a list).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar, overload

from runstate.sdk import context as _context
from runstate.sdk._runtime import LoopClients, loop_runtime, runtime
from runstate.sdk._time import parse_duration_ms
from runstate.sdk.errors import (
    ConfigError,
    DeadlineExceededError,
    LeaseLostError,
    NotFoundError,
    OnceFailedError,
    ResultTooLargeError,
    RunstateError,
    ScopeCancelledError,
)
from runstate.sdk.keys import call_key, json_value

logger = logging.getLogger("runstate.sdk")

F = TypeVar("F", bound=Callable[..., Any])

ONCE_ATTEMPTS_DEFAULT = 3
ATTEMPTS_MAX = 100
LEASE_DEFAULT = "30s"
# The server's bound on a result: compact JSON, UTF-8.
RESULT_BYTES_MAX = 64 * 1024
# Error messages recorded with a failure (the server's bound is 2 KiB).
ERROR_MESSAGE_CHARS_MAX = 2_000
# Renewing: a third of the lease, but not more often than this.
RENEW_INTERVAL_S_MIN = 0.05

DurationLike = float | int | str | timedelta


def describe(exc: BaseException) -> str:
    """An exception as recorded with a failure: `TypeName: message`, bounded."""
    return f"{type(exc).__name__}: {exc}"[:ERROR_MESSAGE_CHARS_MAX]


def result_value(value: Any, what: str) -> Any:
    """`value` as the JSON value to record; ConfigError if it is not one, ResultTooLargeError over
    64 KB (measured as the server does: compact JSON in UTF-8)."""
    converted = json_value(value, what=what)
    size = len(json.dumps(converted, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))
    if size > RESULT_BYTES_MAX:
        raise ResultTooLargeError(
            f"{what} is {size} bytes of JSON, over the {RESULT_BYTES_MAX}-byte limit; store it elsewhere "
            f"(e.g. object storage) and return a reference",
            status=None,
        )
    return converted


def check_attempts(attempts: int) -> int:
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= ATTEMPTS_MAX:
        raise ConfigError(f"attempts must be an integer from 1 to {ATTEMPTS_MAX}, got {attempts!r}")
    return attempts


@dataclass(frozen=True)
class _Done:
    result: Any


@dataclass(frozen=True)
class _Grant:
    scope_id: str
    key: str
    token: str
    attempt: int


_Slot = tuple[LoopClients, str]  # who acquires: the runtime of the caller's loop, and the key


def _failed(key: str, view: dict[str, Any]) -> OnceFailedError:
    attempts = int(view.get("attempts") or 0)
    error = view.get("lastError") or "no error message recorded"
    return OnceFailedError(f"{key} failed after {attempts} attempts: {error}", attempts=attempts, key=key)


class _OnceSpec:
    """One once-wrapped function: its settings and the steps of a call that talk to the server."""

    def __init__(
        self, fn: Callable[..., Any], name: str, key: Callable[..., Any] | None, attempts: int, lease_ms: int
    ) -> None:
        self.fn = fn
        self.name = name
        self.key_function = key
        self.attempts = attempts
        self.lease_ms = lease_ms
        # Sent in whole seconds, as the published clients do: the lease is rounded up, to at least one.
        self.lease_seconds = max(1, math.ceil(lease_ms / 1000))
        self.signature = inspect.signature(fn)
        # Async calls of one event loop acquiring the same key at once: (runtime, key) -> the
        # futures of the calls waiting for the first one's outcome, a _Done they take too (None: it
        # was not one). See acquire_async.
        self.acquiring: dict[_Slot, list[asyncio.Future[_Done | None]]] = {}

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        return call_key(self.name, self.signature, self.key_function, args, kwargs)

    # The steps below run on the loop of `rt`.

    async def acquire(self, rt: LoopClients, key: str) -> _Grant | _Done:
        """Until this caller holds the entry or it has a result; OnceFailedError when out of attempts."""

        async def in_run(scope_id: str) -> _Grant | _Done:
            calls = rt.client.once
            while True:
                view = await calls.acquire(scope_id, key, lease_seconds=self.lease_seconds, max_attempts=self.attempts)
                state = view.get("state")
                if state == "GRANTED":
                    return _Grant(scope_id, key, str(view["token"]), int(view.get("attempts") or 0) + 1)
                if state in ("DONE", "FAILED"):
                    # A stopped run still answers its recorded outcomes; the default run's are
                    # not this call's once the run stopped: then it is the fresh run's turn.
                    await rt.check_default_active(scope_id, view.get("scopeEffective"))
                while True:
                    state = view.get("state")
                    if state == "DONE":
                        return _Done(view.get("result"))
                    if state == "FAILED":
                        raise _failed(key, view)
                    if state != "HELD" or view.get("scopeEffective", "ACTIVE") != "ACTIVE":
                        break  # OPEN: acquire again; the run stopped: acquire says how
                    view = await rt.wait_once(scope_id, key)

        return await rt.in_run(in_run)

    async def acquire_async(self, rt: LoopClients, key: str) -> _Grant | _Done:
        """`acquire` for an async caller, on its loop. While a call of the same loop acquires the
        key, others of that loop wait for it instead of acquiring too: if it gets the result (DONE),
        so do they, from its one long poll; if it gets anything else (the grant, a failure, an
        error, cancelled), each acquires for itself. Each waits on a future of its own, which the
        first call settles directly (a hundred callers resume in one turn; with a shared future
        behind `asyncio.shield` each took three)."""
        slot = (rt, key)
        loop = asyncio.get_running_loop()
        while True:
            waiting = self.acquiring.get(slot)
            if waiting is None:
                break
            mine: asyncio.Future[_Done | None] = loop.create_future()
            waiting.append(mine)
            done = await mine
            if done is not None:
                return done
        waiting = self.acquiring[slot] = []
        outcome: _Grant | _Done | None = None
        try:
            outcome = await self.acquire(rt, key)
            return outcome
        finally:
            del self.acquiring[slot]
            shared = outcome if isinstance(outcome, _Done) else None
            for waiter in waiting:
                if not waiter.done():  # not cancelled
                    waiter.set_result(shared)

    async def renew(
        self, rt: LoopClients, grant: _Grant, signal: threading.Event, returned: threading.Event | None = None
    ) -> None:
        """Renew the lease every third of it until cancelled; set `signal` once a renewal is refused.
        Once `returned` is set (the function returned; its result is on its way), a refused renewal
        only ends the renewing: the result's own answer says whether the lease still held."""
        interval_s = max(self.lease_seconds / 3, RENEW_INTERVAL_S_MIN)
        while True:
            await asyncio.sleep(interval_s)
            try:
                await rt.client.once.renew(grant.scope_id, grant.key, grant.token, self.lease_seconds)
            except (LeaseLostError, NotFoundError, ScopeCancelledError, DeadlineExceededError) as exc:
                if returned is not None and returned.is_set():
                    return
                logger.warning("once %s: renewing the lease was refused: %s", self.name, exc)
                signal.set()
                return
            except RunstateError as exc:
                # UNAVAILABLE and the like: the lease may still hold; try at the next interval.
                logger.warning("once %s: renewing the lease failed: %s", self.name, exc)

    async def complete(self, rt: LoopClients, grant: _Grant, key: str, value: Any, signal: threading.Event) -> Any:
        try:
            result = result_value(value, f"the result of {self.name}")
        except (ConfigError, ResultTooLargeError) as exc:
            await self.fail(rt, grant, exc)
            raise
        try:
            await rt.client.once.complete(grant.scope_id, grant.key, grant.token, result)
        except LeaseLostError as exc:
            signal.set()
            raise LeaseLostError(
                f"{key}: the lease was taken over before the result was recorded; it is rejected ({exc.message})",
                status=exc.status,
            ) from None
        return result

    async def fail(self, rt: LoopClients, grant: _Grant, exc: BaseException) -> None:
        try:
            await rt.client.once.fail(grant.scope_id, grant.key, grant.token, describe(exc), self.attempts)
        except RunstateError as error:
            logger.warning("once %s: recording the failure was refused: %s", self.name, error)

    async def release(self, rt: LoopClients, grant: _Grant) -> None:
        try:
            await rt.client.once.release(grant.scope_id, grant.key, grant.token)
        except RunstateError as error:
            logger.info("once %s: releasing the entry failed: %s", self.name, error)


def _call_sync(spec: _OnceSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    key = spec.key(args, kwargs)
    rt = runtime()
    grant = rt.run(spec.acquire(rt, key))
    if isinstance(grant, _Done):
        return grant.result
    signal = threading.Event()
    renewer = rt.submit(spec.renew(rt, grant, signal))
    token = _context.enter(_context.Context(signal, grant.attempt, key, grant.scope_id))
    try:
        value = spec.fn(*args, **kwargs)
    except Exception as exc:
        renewer.cancel()
        rt.run(spec.fail(rt, grant, exc))
        raise
    except BaseException:
        renewer.cancel()
        rt.run(spec.release(rt, grant))
        raise
    finally:
        _context.leave(token)
    renewer.cancel()
    return rt.run(spec.complete(rt, grant, key, value, signal))


async def _call_async(spec: _OnceSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    key = spec.key(args, kwargs)
    rt = await loop_runtime()
    grant = await spec.acquire_async(rt, key)
    if isinstance(grant, _Done):
        return grant.result
    signal = threading.Event()
    returned = threading.Event()
    # Renewed from the SDK's thread: a function that blocks its own loop keeps its lease.
    renewing = runtime()
    renewer = renewing.submit(spec.renew(renewing, grant, signal, returned))
    token = _context.enter(_context.Context(signal, grant.attempt, key, grant.scope_id))
    try:
        value = await spec.fn(*args, **kwargs)
    except Exception as exc:
        renewer.cancel()
        await spec.fail(rt, grant, exc)
        raise
    except BaseException:
        # Cancelled: hand the entry back without counting an attempt, from the SDK's thread (not
        # awaited: we are cancelled, and this loop may be ending).
        renewer.cancel()
        renewing.submit(spec.release(renewing, grant))
        raise
    finally:
        _context.leave(token)
    # The renewer stops once the result is sent: stopping it first would wake the SDK's thread
    # right then, and the two threads would trade the interpreter lock on the result's way out.
    returned.set()
    try:
        return await spec.complete(rt, grant, key, value, signal)
    finally:
        renewer.cancel()


def _wrap(fn: Callable[..., Any], name: str | None, key: Callable[..., Any] | None, attempts: int, lease: DurationLike) -> Any:
    if not callable(fn):
        raise ConfigError(f"once() wraps a function, got {fn!r}")
    if key is not None and not callable(key):
        raise ConfigError(f"key must be a function of the same arguments, got {key!r}")
    resolved_name = name if name is not None else getattr(fn, "__name__", None)
    if not isinstance(resolved_name, str) or not resolved_name or resolved_name == "<lambda>":
        raise ConfigError(f"give once() a name= for {fn!r} (it has no usable __name__)")
    spec = _OnceSpec(fn, resolved_name, key, check_attempts(attempts), parse_duration_ms(lease, "lease"))

    wrapper: Any
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            return await _call_async(spec, args, kwargs)

        wrapper = async_wrapper
    else:

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            return _call_sync(spec, args, kwargs)

        wrapper = sync_wrapper

    def key_of(*args: Any, **kwargs: Any) -> str:
        return spec.key(args, kwargs)

    wrapper.once_key = key_of
    wrapper.once_name = spec.name
    wrapper.once_attempts = spec.attempts
    wrapper.once_lease_ms = spec.lease_ms
    return wrapper


@overload
def once(
    fn: F,
    /,
    *,
    name: str | None = None,
    key: Callable[..., Any] | None = None,
    attempts: int = ONCE_ATTEMPTS_DEFAULT,
    lease: DurationLike = LEASE_DEFAULT,
) -> F: ...


@overload
def once(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    key: Callable[..., Any] | None = None,
    attempts: int = ONCE_ATTEMPTS_DEFAULT,
    lease: DurationLike = LEASE_DEFAULT,
) -> Callable[[F], F]: ...


def once(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    key: Callable[..., Any] | None = None,
    attempts: int = ONCE_ATTEMPTS_DEFAULT,
    lease: DurationLike = LEASE_DEFAULT,
) -> Any:
    """Make `fn` run once per run for the same arguments; every caller, in any process, gets the
    one result. Use as `@once`, `@once(name=..., ...)`, `once(fn)` or `once(fn, name=...)`.

    Arguments:
        name: the key's prefix; default the function's `__name__`. Equal names and arguments give
            equal keys in every SDK.
        key: a function of the same arguments whose return value is hashed instead of all the
            arguments (e.g. to leave out a client object).
        attempts: how many failed attempts (exceptions or lapsed leases) before every caller gets
            OnceFailedError; 1 to 100, default 3.
        lease: how long a crashed caller holds the work before another takes it over; a number of
            seconds or a string such as "500ms", "30s", "2m"; default 30 s. Renewed every third.

    The wrapped function keeps its sync or async nature. A call returns the recorded result (as
    JSON carried it) or raises: the function's own exception (to the caller whose attempt it was),
    OnceFailedError (`.attempts`, the last error in its message) once the attempts are used,
    LeaseLostError when this caller's lease was taken over before its result was recorded,
    ResultTooLargeError for a result over 64 KB, ConfigError for arguments or a result that are not
    JSON values, ScopeCancelledError / DeadlineExceededError when the run stopped meanwhile.
    `wrapper.once_key(*args, **kwargs)` gives the key a call would use.
    """
    if fn is not None:
        return _wrap(fn, name, key, attempts, lease)

    def decorate(function: F) -> F:
        wrapped: F = _wrap(function, name, key, attempts, lease)
        return wrapped

    return decorate
