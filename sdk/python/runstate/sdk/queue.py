"""`runstate.queue` and `runstate.serve`: hand work to worker processes.

    @runstate.queue("research", attempts=5, lease="60s", concurrency=4)
    def research(input: dict) -> dict: ...

    report = research({"company": "acme"})          # producer: submit and wait
    job = research.send({"company": "globex"})      # or submit now, collect later
    later = job.result()

    runstate.serve()                                # worker: run every queue of the process

A queue is a work queue (mailbox, mode WORK) named after it, in the current run (see
`runstate.configure`). A job's key is `<name>:<hash of the input>` (or of `key(input)`), so the same
input in a run is the same job. `serve()` runs `Mailbox.consume` for every queue: leases are
renewed while the handler runs, its return value is recorded, an exception puts the job back with
backoff, a result from a worker whose lease lapsed is dropped quietly (logged, never raised).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import logging
import signal as signals
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from runstate.sdk import context as _context
from runstate.sdk._runtime import LoopClients, Runtime, loop_runtime, runtime
from runstate.sdk._time import parse_duration_ms
from runstate.sdk.client import Delivery, Ticket
from runstate.sdk.errors import (
    ConfigError,
    ConflictError,
    DeadlineExceededError,
    NotFoundError,
    ResultTimeoutError,
    RunstateError,
    ScopeCancelledError,
    TaskFailedError,
)
from runstate.sdk.keys import custom_key, json_value, make_key
from runstate.sdk.once import DurationLike, check_attempts, result_value
from runstate.sdk.resources import BudgetLike, LimitLike, SlotsLike, needs_body, requirements_body

logger = logging.getLogger("runstate.sdk")

H = TypeVar("H", bound=Callable[..., Any])

QUEUE_ATTEMPTS_DEFAULT = 5
QUEUE_LEASE_DEFAULT = "30s"
CONCURRENCY_MAX = 1_000
# One wait for a job's result when no timeout is given (then waited again).
RESULT_SLICE_MS = 3_600_000

# Every queue defined in this process, by name (the last definition of a name wins).
_queues: dict[str, Queue] = {}


class Job:
    """A submitted job. `id` is the task id, `key` its key, `created` False when the same input
    (or key) had already been submitted in the run."""

    def __init__(self, ticket: Ticket) -> None:
        self.id = ticket.id
        self.key = ticket.key
        self.created = ticket.created

    def __repr__(self) -> str:
        return f"<Job {self.id} key={self.key!r}>"

    def result(self, timeout: float | None = None) -> Any:
        """Block until the job has an outcome and return the handler's result.

        Raises TaskFailedError (with the last error message) when its attempts are used,
        ScopeCancelledError / DeadlineExceededError when its run was cancelled or ran out of time
        before it finished, ResultTimeoutError after `timeout` seconds (the job goes on).
        """
        rt = runtime()
        return rt.run(self._result(rt, timeout))

    async def aresult(self, timeout: float | None = None) -> Any:
        """`result()` for async code."""
        return await self._result(await loop_runtime(), timeout)

    async def _result(self, rt: LoopClients, timeout: float | None) -> Any:
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            raise ConfigError(f"timeout must be None or a number of seconds, got {timeout!r}")
        # Waiting for the result is a long poll: on the runtime's pool for those.
        ticket = rt.waits.task(self.id)
        while True:
            try:
                view = await ticket.result(timeout_ms=RESULT_SLICE_MS if timeout is None else int(timeout * 1000))
                break
            except ResultTimeoutError:
                if timeout is not None:
                    raise
        return await self._outcome(ticket, view)

    async def _outcome(self, ticket: Ticket, view: dict[str, Any]) -> Any:
        state = view.get("state")
        if state == "SUCCEEDED":
            return view.get("outcome")
        if state == "FAILED":
            task = await ticket.status()
            attempts = int(task.get("attempt") or 0)
            # The message is the last error, as the docs and the published clients give it; which
            # job and how many attempts are the error's attributes.
            error = view.get("error")
            raise TaskFailedError(
                str(error) if error else f"job {self.key} ({self.id}) failed after {attempts} attempts",
                attempts=attempts,
                task_id=self.id,
            )
        if state == "CANCELLED":
            raise ScopeCancelledError(f"job {self.key} ({self.id}) was cancelled with its run", status=None)
        if state == "EXPIRED":
            raise DeadlineExceededError(f"job {self.key} ({self.id}) expired: its run is past its deadline", status=None)
        raise RunstateError(f"job {self.id} ended in an unknown state {state!r}", code="INVALID_RESPONSE", status=None)


class Queue:
    """A work queue and its handler. Call it to submit and wait; `send` to submit only; `serve()`
    runs the handler in workers. Made by `@runstate.queue(...)`."""

    def __init__(
        self,
        name: str,
        handler: Callable[[Any], Any],
        *,
        attempts: int = QUEUE_ATTEMPTS_DEFAULT,
        lease: DurationLike = QUEUE_LEASE_DEFAULT,
        concurrency: int = 1,
        key: Callable[[Any], Any] | None = None,
        slots: SlotsLike = None,
        limit: LimitLike = None,
        budget: BudgetLike = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a queue needs a non-empty name, got {name!r}")
        if not callable(handler):
            raise ConfigError(f"a queue's handler must be callable, got {handler!r}")
        if key is not None and not callable(key):
            raise ConfigError(f"key must be a function of the input, got {key!r}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or not 1 <= concurrency <= CONCURRENCY_MAX:
            raise ConfigError(f"concurrency must be an integer from 1 to {CONCURRENCY_MAX}, got {concurrency!r}")
        self.name = name
        self.handler = handler
        self.attempts = check_attempts(attempts)
        self.lease_ms = parse_duration_ms(lease, "lease")
        self.concurrency = concurrency
        self.key_function = key
        needs_body(slots, limit, budget)  # ConfigError now, not at the first submit
        self.slots, self.limit, self.budget = slots, limit, budget
        self.is_async = inspect.iscoroutinefunction(handler)
        self.__doc__ = getattr(handler, "__doc__", None)
        self.__wrapped__ = handler

    def __repr__(self) -> str:
        return f"<Queue {self.name} attempts={self.attempts} lease_ms={self.lease_ms} concurrency={self.concurrency}>"

    def key_of(self, input: Any) -> str:
        """The job key `input` gets: `<name>:<hash>` of `[input]` (as the published clients hash
        it), or what `key(input)` returns (see keys.custom_key)."""
        what = f"the key of {self.name}"
        if self.key_function is not None:
            return custom_key(self.name, self.key_function(input), what)
        return make_key(self.name, [json_value(input, what=what)])

    def __call__(self, input: Any) -> Any:
        """Submit `input` and wait for the handler's result (see `Job.result` for the errors).

        For an `async def` handler this returns an awaitable."""
        if self.is_async:
            return self._call_async(input)
        return self.send(input).result()

    async def _call_async(self, input: Any) -> Any:
        job = await self.asend(input)
        return await job.aresult()

    def send(self, input: Any) -> Job:
        """Submit `input`; returns the `Job` (the existing one if this input, or key, was already
        submitted in the run). ConfigError if the input is not a JSON value, KeyConflictError if
        the key is taken by another input, ScopeCancelledError / DeadlineExceededError if an
        explicitly chosen run stopped."""
        value, key = self._prepare(input)
        rt = runtime()
        return Job(rt.run(self._submit(rt, value, key)))

    async def asend(self, input: Any) -> Job:
        """`send()` for async code."""
        value, key = self._prepare(input)
        return Job(await self._submit(await loop_runtime(), value, key))

    def _prepare(self, input: Any) -> tuple[Any, str]:
        return json_value(input, what=f"the input of {self.name}"), self.key_of(input)

    async def _submit(self, rt: LoopClients, value: Any, key: str) -> Ticket:
        await rt.ensure_mailbox(self.name)

        async def in_run(scope_id: str) -> Ticket:
            return await rt.client.scope(scope_id).mailbox(self.name).submit(
                value, key=key, attempts=self.attempts, key_only=self.key_function is not None,
                slots=self.slots, limit=self.limit, budget=self.budget,
            )

        return await rt.in_run(in_run)

    # -- the worker side ------------------------------------------------------------------------

    async def _declare(self, rt: Runtime) -> None:
        """A worker declares the queue with its attempts and what its jobs need (the protocol's
        `requirements`), so that jobs a producer submits without them (a published client's, a
        producer that does not define the handler) still hold them. A queue declared with other
        settings keeps them (logged): this worker's own submits carry theirs."""
        try:
            requirements = await requirements_body(rt.client._transport, self.slots, self.limit, self.budget)
        except NotFoundError as exc:  # its budget does not exist yet: each submit names it again
            logger.warning("serve: queue %s not declared with its needs: %s", self.name, exc)
            requirements = None
        try:
            await rt.client.mailboxes.declare(self.name, max_attempts=self.attempts, requirements=requirements)
        except ConflictError as exc:
            if exc.code != "CONFLICT":
                raise
            logger.warning("serve: queue %s is declared with other settings, kept: %s", self.name, exc)

    def _consume_handler(self, scope_id: str, handler_loop: asyncio.AbstractEventLoop | None) -> Callable[..., Any]:
        """The handler given to `consume`: sets `context()`, runs the user's handler (async ones on
        `handler_loop` when given), checks the result."""
        what = f"the result of queue {self.name}"

        def make_context(delivery: Delivery) -> _context.Context:
            return _context.Context(delivery.signal, delivery.attempt, delivery.key or "", scope_id, delivery.spend)

        if not self.is_async:

            def handle_sync(data: Any, delivery: Delivery) -> Any:
                token = _context.enter(make_context(delivery))
                try:
                    value = self.handler(data)
                finally:
                    _context.leave(token)
                return result_value(value, what)

            return handle_sync

        async def run_handler(data: Any, delivery: Delivery) -> Any:
            token = _context.enter(make_context(delivery))
            try:
                value = await self.handler(data)
            finally:
                _context.leave(token)
            return result_value(value, what)

        async def handle_async(data: Any, delivery: Delivery) -> Any:
            if handler_loop is None or handler_loop is asyncio.get_running_loop():
                return await run_handler(data, delivery)
            future = asyncio.run_coroutine_threadsafe(run_handler(data, delivery), handler_loop)
            return await asyncio.wrap_future(future)

        return handle_async


def queue(
    name: str,
    *,
    attempts: int = QUEUE_ATTEMPTS_DEFAULT,
    lease: DurationLike = QUEUE_LEASE_DEFAULT,
    concurrency: int = 1,
    key: Callable[[Any], Any] | None = None,
    slots: SlotsLike = None,
    limit: LimitLike = None,
    budget: BudgetLike = None,
) -> Callable[[Callable[[Any], Any]], Queue]:
    """Define the queue `name` with the decorated handler (one argument, the input; returns the
    result, a JSON value of at most 64 KB).

    Arguments: `attempts` (1 to 100, default 5) before the job is FAILED; `lease` (seconds or
    "60s", "500ms", "2m"; default 30 s) after which a dead worker's job is taken over;
    `concurrency` (default 1) jobs at once per `serve()`; `key` a function of the input whose
    return value identifies the job instead of the whole input.

    `slots` (a pool name or a list of them), `limit` (`{"name", "units"}`, or a limit name for one
    unit) and `budget` (`{"name", "amount"}`) name what each job needs; they must exist (see
    `rs.pools`, `rs.limits`, `rs.budgets`). A worker takes a job and all of them in one step and
    they return when the job ends; `runstate.context().spend(amount)` in the handler reports the
    actual spend (else the whole reservation counts as spent).
    """

    def decorate(handler: Callable[[Any], Any]) -> Queue:
        defined = Queue(
            name, handler, attempts=attempts, lease=lease, concurrency=concurrency, key=key,
            slots=slots, limit=limit, budget=budget,
        )
        _queues[name] = defined
        return defined

    return decorate


def _chosen(queues: tuple[Queue, ...]) -> list[Queue]:
    chosen = list(queues) if queues else list(_queues.values())
    if not chosen:
        raise ConfigError("serve() found no queue: define one with @runstate.queue(...) (import its module) first")
    for item in chosen:
        if not isinstance(item, Queue):
            raise ConfigError(f"serve() takes queues made by @runstate.queue, got {item!r}")
    return chosen


async def _serve(rt: Runtime, queues: list[Queue], stop: asyncio.Event, handler_loop: asyncio.AbstractEventLoop | None) -> None:
    """Consume every queue until the run stops or `stop` is set. On the runtime's loop."""
    for item in queues:
        await rt.ensure_mailbox(item.name)
        await item._declare(rt)
    scope_id, is_default = await rt.scope_id()
    scope = rt.client.scope(scope_id)
    logger.info("serve: %s in run %s", ", ".join(item.name for item in queues), scope_id)
    consumers = [
        asyncio.create_task(
            scope.mailbox(item.name).consume(
                item._consume_handler(scope_id, handler_loop),
                concurrency=item.concurrency,
                lease_ms=item.lease_ms,
                stop=stop,
                include_descendants=True,
            ),
            name=f"runstate-serve-{item.name}",
        )
        for item in queues
    ]
    try:
        await asyncio.wait(consumers, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # One ended (the run stopped, or an error): the others stop too, draining their handlers.
        stopped_by_run = not stop.is_set()
        stop.set()
        outcomes = await asyncio.gather(*consumers, return_exceptions=True)
    if stopped_by_run and is_default:
        rt.forget_default(scope_id)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


@contextlib.contextmanager
def _stop_on_signals(on_signal: Callable[[], None]) -> Iterator[None]:
    """In the main thread: the first SIGTERM or SIGINT calls `on_signal` (then the signal's previous
    handler is back, so a second Ctrl-C interrupts as usual). Elsewhere: nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def handle(signum: int, frame: Any) -> None:
        logger.info("serve: signal %s, taking no new work and finishing running handlers", signum)
        signals.signal(signum, previous[signum])
        on_signal()

    for number in (signals.SIGTERM, signals.SIGINT):
        old = signals.signal(number, handle)
        previous[number] = old if old is not None else signals.SIG_DFL
    try:
        yield
    finally:
        for restored, handler in previous.items():
            signals.signal(restored, handler)


def serve(*queues: Queue) -> None:
    """Run the given queues (default: every queue defined in this process) in this process until
    the run stops or the process gets SIGTERM or SIGINT; blocks.

    Takes up to each queue's `concurrency` jobs at once (sync handlers run in threads, async ones
    on the SDK's loop), renews their leases, records the return values, puts a job back with
    backoff when its handler raises. On stopping it takes no new work and waits up to 30 s for
    running handlers. Raises ConfigError when no queue is defined, UnavailableError when no server
    answers for a long time.
    """
    chosen = _chosen(queues)
    rt = runtime()
    stop = asyncio.Event()
    def on_signal() -> None:
        rt.loop.call_soon_threadsafe(stop.set)

    with _stop_on_signals(on_signal):
        try:
            rt.run(_serve(rt, chosen, stop, None))
        except concurrent.futures.CancelledError:
            if not rt.closed:
                raise
            # runstate.close() (e.g. at exit) ended it.


async def serve_async(*queues: Queue) -> None:
    """`serve()` for async code: `await runstate.serve_async()`. Async handlers run on the caller's
    event loop; the rest as for `serve()` (SIGTERM/SIGINT handled when called in the main thread)."""
    chosen = _chosen(queues)
    rt = runtime()
    stop = asyncio.Event()
    def on_signal() -> None:
        rt.loop.call_soon_threadsafe(stop.set)

    with _stop_on_signals(on_signal):
        try:
            await rt.arun(_serve(rt, chosen, stop, asyncio.get_running_loop()))
        except asyncio.CancelledError:
            if not rt.closed or rt.in_loop_thread():
                raise
            # runstate.close() ended it (not this task being cancelled).
