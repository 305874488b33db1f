"""The consume loop behind `Mailbox.consume`: receive, run handlers, keep leases, settle.

One `Consumer` per call. The loop long-polls for as many deliveries as it has free handler slots;
each delivery gets one task, which runs its handler and then settles it: completed with its return
value, retried with its exception, unless the handler settled it itself. The leases of one receive
started together, so one timer per receive starts their renewal: a delivery whose handler still
runs a third of its lease later gets a renewer task, which extends the lease every third of it and
cancels the handler when the lease is lost or the run stopped. A handler that returns before (the
usual case) costs no timer and no task of its own beyond its one task. The completes of the call's
deliveries (the handler's own too) go out together while one is in flight (_completes.py).

A handler slot is free again as soon as its handler returns: the delivery's settle goes on beside
the next receive and handlers (at most SETTLING_PER_SLOT settles per slot), so a slot's round is
a receive and a handler, not a receive, a handler and a complete one after the other.
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
from runstate.sdk._interrupt import interrupted, watching_sigint
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
# Deliveries whose handler returned and whose settle (complete or retry) is still on its way, per
# handler slot, beyond the slot's running handler: at most concurrency * (1 + this) deliveries held.
# One complete call is in flight at a time and the next carries what piled up meanwhile, so this is
# how deep a worker's pipeline is: with 1, a worker of quick handlers spent every other round trip
# waiting for its complete to free deliveries for the next receive.
SETTLING_PER_SLOT = 3
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


class _LeaseBatch:
    """The deliveries of one receive whose handler still runs: their leases began together, so
    one timer (`timer`) starts renewing all of them (a renewer task each) a third of a lease later."""

    __slots__ = ("handlings", "timer")

    def __init__(self) -> None:
        self.handlings: set[_Handling] = set()
        self.timer: asyncio.TimerHandle | None = None


class _Handling:
    """One delivery in the hands of this consumer: its task (handler, then settle), the receive it
    came with, its renewer once it has one, and why the handler was cancelled (`lost`)."""

    __slots__ = ("delivery", "batch", "task", "renewer", "lost", "abandoned", "settling")

    def __init__(self, delivery: Delivery, batch: _LeaseBatch) -> None:
        self.delivery = delivery
        self.batch = batch
        self.task: asyncio.Task[None] | None = None
        self.renewer: asyncio.Task[None] | None = None
        # Set (by its renewer) before the handler is cancelled for a lost lease or a stopped run.
        self.lost: str | None = None
        # Set by the drain when the task did not end in time after its cancel: the delivery was
        # handed back, so whatever the handler does later is not settled.
        self.abandoned = False
        # Its handler returned (or raised) and its settle is on its way: it holds no handler slot.
        self.settling = False


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
        # Every delivery's task, until it ended: its handler runs, or it settles (_settling of them).
        self._running: dict[asyncio.Task[None], _Handling] = {}
        self._settling = 0
        # Renewer tasks of handlers that outlived a third of their lease.
        self._renewers: set[asyncio.Task[None]] = set()
        self._renew_interval_s = max(lease_ms / 3 / 1000, RENEW_INTERVAL_S_MIN)
        # Set when the user's stop is set or a renewal learns that the run stopped.
        self._stopping = asyncio.Event()
        # Set whenever a handler slot may have come free: a delivery's task ended, a sync
        # handler's thread ended (from that thread), or consume() is stopping.
        self._changed = asyncio.Event()
        # Set once the drain cancels the running handlers (told apart from a handler's own
        # CancelledError where tasks cannot say whether they were cancelled, before Python 3.11).
        self._draining = False
        # The completes of this call's deliveries, sent together while one is in flight.
        self._completes = Completes(mailbox._transport)

    async def run(self) -> None:
        with watching_sigint() as sigint_seen:
            try:
                await self._run()
            except asyncio.CancelledError:
                if sigint_seen():  # Ctrl-C under asyncio.run(): one line and exit 130 (_interrupt.py)
                    raise interrupted() from None
                raise

    async def _run(self) -> None:
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
        self._stop_consuming()

    def _stop_consuming(self) -> None:
        self._stopping.set()
        self._changed.set()

    async def _loop(self, stop_waiter: asyncio.Task[Any]) -> None:
        loop = asyncio.get_running_loop()
        contacted = False
        unavailable_since: float | None = None
        backoff_s = CONSUME_BACKOFF_S_INITIAL
        free_min = max(1, self._concurrency // RECEIVE_FREE_FRACTION)
        while not self._stopping.is_set():
            held = len(self._running)
            free = min(
                self._concurrency - (held - self._settling),  # slots without a running handler
                self._concurrency * (1 + SETTLING_PER_SLOT) - held,  # the bound on deliveries held
            ) - self._abandoned_over_bound()
            if free < free_min:
                # One event for every way a slot comes free: waiting on each running task instead
                # cost a callback per task on every wake-up.
                self._changed.clear()
                await self._changed.wait()
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
            self._start(deliveries)

    def _start(self, deliveries: list[Delivery]) -> None:
        """A task for each delivery, and one timer for the renewal of all their leases."""
        if not deliveries:
            return
        loop = asyncio.get_running_loop()
        batch = _LeaseBatch()
        for delivery in deliveries:
            delivery._completes = self._completes
            handling = _Handling(delivery, batch)
            task = loop.create_task(self._handle(handling), name=f"runstate-handler-{delivery.id}")
            handling.task = task
            batch.handlings.add(handling)
            self._running[task] = handling
            task.add_done_callback(self._ended)
        batch.timer = loop.call_later(self._renew_interval_s, self._start_renewing, batch)

    def _ended(self, task: asyncio.Task[None]) -> None:
        handling = self._running.pop(task, None)
        if handling is not None and handling.settling:
            self._settling -= 1
        self._changed.set()

    def _handler_returned(self, handling: _Handling) -> None:
        """Its handler is done: the slot is free for the next delivery while this one settles."""
        if not handling.settling:
            handling.settling = True
            self._settling += 1
            self._changed.set()

    def _start_renewing(self, batch: _LeaseBatch) -> None:
        """A third of the lease after the receive: a renewer for each handler still running."""
        batch.timer = None
        handlings, batch.handlings = batch.handlings, set()
        for handling in handlings:
            if handling.delivery.settled:
                continue  # the handler settled it itself: its lease ended with that
            renewer = asyncio.get_running_loop().create_task(self._renew_until_done(handling))
            handling.renewer = renewer
            self._renewers.add(renewer)
            renewer.add_done_callback(self._renewers.discard)

    @staticmethod
    def _stop_renewing(handling: _Handling) -> None:
        batch = handling.batch
        batch.handlings.discard(handling)
        if not batch.handlings and batch.timer is not None:
            batch.timer.cancel()
            batch.timer = None
        if handling.renewer is not None:
            handling.renewer.cancel()

    def _abandoned_over_bound(self) -> int:
        """Handler threads left running by handlers that are no longer ours (a thread per running
        sync handler is expected), beyond the tolerated ABANDONED_HANDLERS_PER_SLOT per slot."""
        if self._executor is None:
            return 0
        abandoned = self._executor.live - (len(self._running) - self._settling)
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
            running = dict(self._running)
            self._draining = True
            for task in running:
                task.cancel()
            if running:
                # A cancelled handler gets HANDLER_CANCEL_WAIT_S to end, then its delivery is
                # handed back (RELEASE_ON_EXIT_TIMEOUT_S).
                _, stuck = await asyncio.wait(set(running), timeout=HANDLER_CANCEL_WAIT_S + RELEASE_ON_EXIT_TIMEOUT_S)
                await asyncio.gather(*(self._abandon(running[task]) for task in stuck))

    async def _abandon(self, handling: _Handling) -> None:
        """A handler that did not end after its cancel is left running; its delivery is handed back."""
        handling.abandoned = True
        if self._running.pop(handling.task, None) is not None and handling.settling:  # type: ignore[arg-type]
            self._settling -= 1
        self._stop_renewing(handling)
        if not handling.delivery.settled and handling.lost is None:
            await self._release_quietly(handling.delivery)

    async def _handle(self, handling: _Handling) -> None:
        """Run one handler under a renewed lease and settle its delivery. Never raises (but cancels)."""
        delivery = handling.delivery
        try:
            try:
                value = await self._call_handler(delivery)
            finally:
                self._stop_renewing(handling)
        except asyncio.CancelledError:
            if handling.lost is not None or not self._cancelled(handling):
                # Cancelled by its renewer, or the handler raised CancelledError itself: nothing
                # to settle (the lease lapses).
                logger.warning(
                    "consume %s: handler of delivery %s cancelled: %s",
                    self._mailbox,
                    delivery.id,
                    handling.lost or "cancelled",
                )
                return
            # consume() is shutting down: hand the task back at once.
            delivery.signal.set()
            if not delivery.settled and not handling.abandoned:
                await self._release_quietly(delivery)
            raise
        except Exception as exc:  # noqa: BLE001 - the handler's error retries its delivery
            self._forget_swallowed_cancel(handling)
            if handling.abandoned:
                return
            self._handler_returned(handling)
            try:
                await self._settle_failed(delivery, exc)
            except Exception:
                logger.exception("consume %s: settling delivery %s failed", self._mailbox, delivery.id)
            return
        self._forget_swallowed_cancel(handling)
        if handling.abandoned or delivery.settled:
            return
        self._handler_returned(handling)
        try:
            await self._complete(delivery, value)
        except Exception:
            logger.exception("consume %s: settling delivery %s failed", self._mailbox, delivery.id)

    def _cancelled(self, handling: _Handling) -> bool:
        """Whether the delivery's task itself was cancelled (consume() is stopping), rather than
        the handler raising CancelledError of its own."""
        cancelling = getattr(handling.task, "cancelling", None)  # Python 3.11+
        return cancelling() > 0 if cancelling is not None else self._draining

    @staticmethod
    def _forget_swallowed_cancel(handling: _Handling) -> None:
        """A handler cancelled for a lost lease that swallowed the cancel and ended anyway: its
        outcome is settled as it would be had it ended in time, in a task no longer marked as
        being cancelled (else asyncio.timeout inside the settle would take its timeout for one)."""
        if handling.lost is not None:
            uncancel = getattr(asyncio.current_task(), "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()

    async def _settle_failed(self, delivery: Delivery, exc: Exception) -> None:
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
                "runstate-handler", functools.partial(_set_threadsafe, loop, self._changed)
            )
        value = await loop.run_in_executor(
            self._executor, functools.partial(self._handler, delivery.input, delivery)
        )
        if inspect.isawaitable(value):
            value = await value
        return value

    async def _renew_until_done(self, handling: _Handling) -> None:
        """Renew now, then every third of the lease, until cancelled (the handler ended) or the
        delivery is settled; cancel the handler when the lease is lost or the run stopped."""
        delivery = handling.delivery
        while True:
            try:
                await delivery.renew(self._lease_ms)
            except (LeaseLostError, NotFoundError, ScopeCancelledError, DeadlineExceededError) as exc:
                if delivery.settled:
                    # The handler settled it meanwhile; its lease ended with that.
                    return
                if isinstance(exc, (ScopeCancelledError, DeadlineExceededError)):
                    handling.lost = f"the run stopped ({exc})"
                    self._stop_consuming()
                else:
                    handling.lost = f"the lease is lost ({exc})"
                delivery.signal.set()
                assert handling.task is not None
                handling.task.cancel()
                return
            except RunstateError as exc:
                # UNAVAILABLE and the like: try again at the next interval; the lease may still hold.
                logger.warning("consume %s: renewing delivery %s failed: %s", self._mailbox, delivery.id, exc)
            await asyncio.sleep(self._renew_interval_s)
            if delivery.settled:
                return

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
