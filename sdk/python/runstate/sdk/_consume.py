"""The consume loop behind `Mailbox.consume`: receive, run handlers, keep leases, settle.

One `Consumer` per call. The loop long-polls for as many deliveries as it has free handler slots;
each delivery gets a handler task and a renewer task. The renewer extends the lease every third of
it and cancels the handler when the lease is lost or the run stopped. Whatever the handler does
not settle itself is settled here: completed with its return value, retried with its exception.
The completes of the call's deliveries (the handler's own too) go out together while one is in
flight (_completes.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runstate.sdk._completes import Completes
from runstate.sdk._http import OutcomeUnknownError
from runstate.sdk.errors import (
    ConfigError,
    DeadlineExceededError,
    LeaseLostError,
    NotFoundError,
    RunstateError,
    ScopeCancelledError,
    UnavailableError,
)

if TYPE_CHECKING:
    from runstate.sdk.client import Delivery, Handler, Mailbox

logger = logging.getLogger("runstate.sdk")

CONCURRENCY_MAX = 1_000
# Long-poll wait of one receive.
CONSUME_RECEIVE_WAIT_MS = 10_000
RECEIVE_BATCH_MAX = 100
# Receive again once this fraction of the handler slots is free (at least one): under load a
# receive then brings a batch instead of one delivery per finished handler.
RECEIVE_FREE_FRACTION = 4
# How long a stopping consume() lets running handlers finish before it cancels them.
CONSUME_DRAIN_TIMEOUT_S = 30.0
# Backoff between receives while no server answers, and how long an outage is ridden out.
CONSUME_BACKOFF_S_INITIAL = 0.1
CONSUME_BACKOFF_S_MAX = 5.0
CONSUME_UNAVAILABLE_S_MAX = 60.0
# Renewing: a third of the lease, but not more often than this.
RENEW_INTERVAL_S_MIN = 0.05
# Handing a delivery back when a handler is cancelled on shutdown; waiting for a cancelled handler.
RELEASE_ON_EXIT_TIMEOUT_S = 2.0
HANDLER_CANCEL_WAIT_S = 5.0
# Sync handlers abandoned (lease lost, or cancelled at shutdown) run on in their threads; up to
# this many per handler slot are tolerated, beyond that each one takes a slot until it returns.
ABANDONED_HANDLERS_PER_SLOT = 1
# Error messages sent with a retry (the server's bound is 2 KiB).
ERROR_MESSAGE_CHARS_MAX = 2_000


def _is_async_callable(handler: Any) -> bool:
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


def _set_threadsafe(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(event.set)


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text[:ERROR_MESSAGE_CHARS_MAX]


class _DaemonThreads(concurrent.futures.Executor):
    """Runs each sync handler in a daemon thread of its own. ThreadPoolExecutor's threads are
    joined at interpreter exit, so one handler still stuck after the drain (or after its lease was
    lost) kept the process alive forever once serve() had returned; a daemon thread does not. At
    most `concurrency` handlers run at once (the consume loop's bound); one abandoned after a lost
    lease or the drain runs on until it returns or the process exits, and `live` counts it, so the
    loop can bound how many are left behind (ABANDONED_HANDLERS_PER_SLOT)."""

    def __init__(self, name: str, on_thread_end: Callable[[], None]) -> None:
        self._name = name
        self._on_thread_end = on_thread_end
        self._lock = threading.Lock()
        self.live = 0

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                if not future.set_running_or_notify_cancel():
                    return
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            finally:
                with self._lock:
                    self.live -= 1
                self._on_thread_end()

        with self._lock:
            self.live += 1
        threading.Thread(target=run, name=self._name, daemon=True).start()
        return future


class Consumer:
    def __init__(
        self,
        mailbox: Mailbox,
        handler: Handler,
        *,
        concurrency: int,
        lease_ms: int,
        stop: asyncio.Event | None,
        include_descendants: bool = False,
    ) -> None:
        if not callable(handler):
            raise ConfigError(f"handler must be callable, got {handler!r}")
        if (
            isinstance(concurrency, bool)
            or not isinstance(concurrency, int)
            or not 1 <= concurrency <= CONCURRENCY_MAX
        ):
            raise ConfigError(
                f"concurrency must be an integer between 1 and {CONCURRENCY_MAX}, got {concurrency!r}"
            )
        if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms < 1:
            raise ConfigError(f"lease_ms must be a positive integer, got {lease_ms!r}")
        self._mailbox = mailbox
        self._handler = handler
        self._handler_is_async = _is_async_callable(handler)
        self._concurrency = concurrency
        self._lease_ms = lease_ms
        self._stop = stop
        self._include_descendants = include_descendants
        self._executor: _DaemonThreads | None = None
        self._running: set[asyncio.Task[None]] = set()
        # Set when the user's stop is set or a renewal learns that the run stopped.
        self._stopping = asyncio.Event()
        # Set (from a handler thread) whenever a sync handler's thread ends.
        self._thread_ended = asyncio.Event()
        # The completes of this call's deliveries, sent together while one is in flight.
        self._completes = Completes(mailbox._transport)

    async def run(self) -> None:
        stop_waiter = asyncio.create_task(self._stopping.wait())
        watcher = asyncio.create_task(self._watch_stop(self._stop)) if self._stop is not None else None
        grace_s = CONSUME_DRAIN_TIMEOUT_S
        try:
            await self._loop(stop_waiter)
        except asyncio.CancelledError:
            grace_s = 0.0
            raise
        finally:
            helpers = {task for task in (stop_waiter, watcher) if task is not None}
            for task in helpers:
                task.cancel()
            await asyncio.wait(helpers)
            # Threads of sync handlers abandoned by the drain run on; nothing waits for them.
            await self._drain(grace_s)

    async def _watch_stop(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._stopping.set()

    async def _loop(self, stop_waiter: asyncio.Task[Any]) -> None:
        loop = asyncio.get_running_loop()
        contacted = False
        unavailable_since: float | None = None
        backoff_s = CONSUME_BACKOFF_S_INITIAL
        free_min = max(1, self._concurrency // RECEIVE_FREE_FRACTION)
        while not self._stopping.is_set():
            free = self._concurrency - len(self._running) - self._abandoned_over_bound()
            if free < free_min:
                self._thread_ended.clear()
                thread_ended = asyncio.ensure_future(self._thread_ended.wait())
                try:
                    await asyncio.wait(
                        {*self._running, stop_waiter, thread_ended}, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    thread_ended.cancel()
                continue
            try:
                deliveries = await self._receive_unless_stopped(free, stop_waiter)
                if deliveries is None:
                    return  # stopped while the receive waited
            except (ScopeCancelledError, DeadlineExceededError) as exc:
                logger.info("consume %s: the run stopped (%s)", self._mailbox, exc.code)
                return
            except UnavailableError as exc:
                now = loop.time()
                contacted = contacted or isinstance(exc, OutcomeUnknownError)
                if unavailable_since is None:
                    unavailable_since = now
                if not contacted or now - unavailable_since > CONSUME_UNAVAILABLE_S_MAX:
                    raise
                logger.warning("consume %s: %s; receiving again in %.1f s", self._mailbox, exc, backoff_s)
                await asyncio.wait({stop_waiter}, timeout=backoff_s)
                backoff_s = min(backoff_s * 2, CONSUME_BACKOFF_S_MAX)
                continue
            contacted = True
            unavailable_since = None
            backoff_s = CONSUME_BACKOFF_S_INITIAL
            if self._stopping.is_set():
                await asyncio.gather(*(self._release_quietly(delivery) for delivery in deliveries))
                return
            for delivery in deliveries:
                delivery._completes = self._completes
                task = asyncio.create_task(self._handle(delivery), name=f"runstate-handler-{delivery.id}")
                self._running.add(task)
                task.add_done_callback(self._running.discard)

    def _abandoned_over_bound(self) -> int:
        """Handler threads left running by handlers that are no longer ours (a thread per running
        sync handler is expected), beyond the tolerated ABANDONED_HANDLERS_PER_SLOT per slot."""
        if self._executor is None:
            return 0
        abandoned = self._executor.live - len(self._running)
        return max(0, abandoned - ABANDONED_HANDLERS_PER_SLOT * self._concurrency)

    async def _receive_unless_stopped(self, free: int, stop_waiter: asyncio.Task[Any]) -> list[Delivery] | None:
        """One long-poll receive, given up when consume() is stopped meanwhile (None). The node
        gives back what a receive whose client left had committed; what arrives here anyway in
        that race is released."""
        receiving = asyncio.ensure_future(
            self._mailbox._receive(
                max=min(free, RECEIVE_BATCH_MAX),
                lease_ms=self._lease_ms,
                wait_ms=CONSUME_RECEIVE_WAIT_MS,
                include_descendants=self._include_descendants,
            )
        )
        try:
            await asyncio.wait({receiving, stop_waiter}, return_when=asyncio.FIRST_COMPLETED)
            if receiving.done():
                return receiving.result()
            receiving.cancel()
            await asyncio.wait({receiving})
            if not receiving.cancelled() and receiving.exception() is None:
                await asyncio.gather(*(self._release_quietly(delivery) for delivery in receiving.result()))
            return None
        finally:
            if not receiving.done():
                receiving.cancel()

    async def _drain(self, grace_s: float) -> None:
        try:
            if self._running and grace_s > 0:
                await asyncio.wait(set(self._running), timeout=grace_s)
        finally:
            running = set(self._running)
            for task in running:
                task.cancel()
            if running:
                await asyncio.wait(running)

    async def _handle(self, delivery: Delivery) -> None:
        """Run one handler under a renewed lease and settle its delivery. Never raises (but cancels)."""
        lost: list[str] = []
        handler_task = asyncio.create_task(self._call_handler(delivery))
        renewer = asyncio.create_task(self._renew_until_done(delivery, handler_task, lost))
        try:
            try:
                await asyncio.wait({handler_task})
            except asyncio.CancelledError:
                # consume() is shutting down: stop the handler and hand the task back at once.
                delivery.signal.set()
                handler_task.cancel()
                await asyncio.wait({handler_task}, timeout=HANDLER_CANCEL_WAIT_S)
                if not delivery.settled and not lost:
                    await self._release_quietly(delivery)
                raise
        finally:
            renewer.cancel()
            await asyncio.wait({renewer})
        try:
            await self._settle_after(delivery, handler_task, lost)
        except Exception:
            logger.exception("consume %s: settling delivery %s failed", self._mailbox, delivery.id)

    async def _settle_after(
        self, delivery: Delivery, handler_task: asyncio.Task[Any], lost: list[str]
    ) -> None:
        if handler_task.cancelled():
            logger.warning(
                "consume %s: handler of delivery %s cancelled: %s",
                self._mailbox,
                delivery.id,
                lost[0] if lost else "cancelled",
            )
            return
        exc = handler_task.exception()
        if exc is None:
            if not delivery.settled:
                await self._complete(delivery, handler_task.result())
            return
        if isinstance(exc, LeaseLostError):
            logger.warning("consume %s: delivery %s: %s", self._mailbox, delivery.id, exc)
            return
        logger.warning(
            "consume %s: handler of delivery %s (attempt %s) raised %s",
            self._mailbox,
            delivery.id,
            delivery.attempt,
            _describe(exc),
            exc_info=exc,
        )
        if not delivery.settled:
            await self._retry_quietly(delivery, _describe(exc))

    async def _call_handler(self, delivery: Delivery) -> Any:
        if self._handler_is_async:
            return await self._handler(delivery.input, delivery)
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = _DaemonThreads(
                "runstate-handler", functools.partial(_set_threadsafe, loop, self._thread_ended)
            )
        value = await loop.run_in_executor(
            self._executor, functools.partial(self._handler, delivery.input, delivery)
        )
        if inspect.isawaitable(value):
            value = await value
        return value

    async def _renew_until_done(
        self, delivery: Delivery, handler_task: asyncio.Task[Any], lost: list[str]
    ) -> None:
        interval_s = max(self._lease_ms / 3 / 1000, RENEW_INTERVAL_S_MIN)
        while True:
            await asyncio.sleep(interval_s)
            if handler_task.done() or delivery.settled:
                return
            try:
                await delivery.renew(self._lease_ms)
            except (LeaseLostError, NotFoundError, ScopeCancelledError, DeadlineExceededError) as exc:
                if delivery.settled:
                    # The handler settled it meanwhile; its lease ended with that.
                    return
                if isinstance(exc, (ScopeCancelledError, DeadlineExceededError)):
                    lost.append(f"the run stopped ({exc})")
                    self._stopping.set()
                else:
                    lost.append(f"the lease is lost ({exc})")
                delivery.signal.set()
                handler_task.cancel()
                return
            except RunstateError as exc:
                # UNAVAILABLE and the like: try again at the next interval; the lease may still hold.
                logger.warning("consume %s: renewing delivery %s failed: %s", self._mailbox, delivery.id, exc)

    async def _complete(self, delivery: Delivery, value: Any) -> None:
        try:
            await delivery.complete(result={"payload": value})
        except (LeaseLostError, ScopeCancelledError, DeadlineExceededError) as exc:
            logger.warning("consume %s: completing delivery %s refused: %s", self._mailbox, delivery.id, exc)
        except RunstateError as exc:
            logger.warning("consume %s: completing delivery %s failed: %s", self._mailbox, delivery.id, exc)
            if not delivery.settled:
                await self._retry_quietly(delivery, f"completing failed: {_describe(exc)}")

    async def _retry_quietly(self, delivery: Delivery, error: str) -> None:
        try:
            await delivery.retry(error=error)
        except RunstateError as exc:
            logger.warning("consume %s: retrying delivery %s failed: %s", self._mailbox, delivery.id, exc)

    async def _release_quietly(self, delivery: Delivery) -> None:
        try:
            await asyncio.wait_for(delivery.release(), RELEASE_ON_EXIT_TIMEOUT_S)
        except (RunstateError, asyncio.TimeoutError) as exc:
            logger.info("consume %s: releasing delivery %s failed: %s", self._mailbox, delivery.id, exc)
