"""The blocking client: `Runstate`, the same surface as `AsyncRunstate` without `await`.

Each client runs an event loop in a thread of its own (an anyio blocking portal) and forwards
every call to an `AsyncRunstate` there. Close it with `close()` or use `with Runstate() as rs:`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from runstate.sdk import client as aio
from runstate.sdk._http import REQUEST_TIMEOUT_S_DEFAULT
from runstate.sdk._interrupt import interrupted
from runstate.sdk.admin import BlockingKeys, BlockingSpaces, Identity
from runstate.sdk.barriers import BlockingBarriers
from runstate.sdk.claims import BlockingClaims
from runstate.sdk.client import LEASE_MS_DEFAULT, RESULT_TIMEOUT_MS_DEFAULT, DeadlineLike
from runstate.sdk.diagnostics import BlockingDiagnostics
from runstate.sdk.errors import ConfigError
from runstate.sdk.events import BlockingEvents
from runstate.sdk.groups import BlockingGroups
from runstate.sdk.once_calls import BlockingOnceCalls
from runstate.sdk.resources import (
    SLOT_LEASE_MS_DEFAULT,
    WAIT_TIMEOUT_MS_DEFAULT,
    BlockingBudgets,
    BlockingHolding,
    BlockingLimits,
    BlockingPools,
    BlockingReservation,
    BlockingScopeBudgets,
    BlockingScopeLimits,
    BlockingScopePools,
    BlockingSlotLease,
    BudgetLike,
    LimitLike,
    Reservation,
    SlotLease,
    SlotsLike,
    budget_amount,
)
from runstate.sdk.timers import BlockingTimers

T = TypeVar("T")

# How often a blocking consume() looks at its threading.Event `stop`.
STOP_POLL_INTERVAL_S = 0.1
# How long an interrupted consume() waits for its handlers to be cancelled and handed back.
CONSUME_INTERRUPT_WAIT_S = 10.0

SyncHandler = Callable[[Any, "Delivery"], Any]


def _close_client(portal: BlockingPortal, client: aio.AsyncRunstate, portal_context: Any) -> None:
    """Close `client`'s connections, then stop the portal's thread (Runstate.close, or its finalizer)."""
    try:
        portal.call(client.aclose)
    finally:
        try:
            # Cancel what still runs (e.g. a result() abandoned by Ctrl-C) instead of waiting.
            portal.call(portal.stop, True)
        except RuntimeError:
            pass
        portal_context.__exit__(None, None, None)


def _call(portal: BlockingPortal, function: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    return portal.call(functools.partial(function, *args, **kwargs))


class Mailboxes:
    """Work queues of the space: `rs.mailboxes` (see `AsyncRunstate.mailboxes`)."""

    def __init__(self, inner: aio.Mailboxes, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def ensure(self, name: str, mode: str = "WORK", backlog_limit: int | None = None) -> dict[str, Any]:
        """Create the queue if missing; returns `{"id", "name", "mode", "created", ...}`.
        ConflictError for another mode."""
        return _call(self._portal, self._inner.ensure, name, mode=mode, backlog_limit=backlog_limit)

    def declare(
        self, name: str, max_attempts: int | None = None, requirements: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Declare the queue with its attempts and requirements (see `client.Mailboxes.declare`)."""
        return _call(self._portal, self._inner.declare, name, max_attempts=max_attempts, requirements=requirements)

    def get(self, name: str) -> dict[str, Any]:
        """Returns `{"id", "name", "mode", ...}`; NotFoundError if missing."""
        return _call(self._portal, self._inner.get, name)


class Scopes:
    """Runs: `rs.scopes` (see `AsyncRunstate.scopes` for the errors)."""

    def __init__(self, inner: aio.Scopes, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def create(
        self,
        name: str | None = None,
        deadline: DeadlineLike = None,
        child_limit: int | None = None,
        parent_scope_id: str | None = None,
    ) -> Scope:
        """Open a new run; returns its `Scope` handle."""
        scope = _call(
            self._portal,
            self._inner.create,
            name=name,
            deadline=deadline,
            child_limit=child_limit,
            parent_scope_id=parent_scope_id,
        )
        return Scope(scope, self._portal)

    def child(
        self,
        parent_id: str,
        name: str | None = None,
        deadline: DeadlineLike = None,
        child_limit: int | None = None,
    ) -> Scope:
        """Open a child run under `parent_id`; returns its `Scope` handle."""
        scope = _call(
            self._portal, self._inner.child, parent_id, name=name, deadline=deadline, child_limit=child_limit
        )
        return Scope(scope, self._portal)

    def named(self, name: str, deadline: DeadlineLike = None) -> Scope:
        """The active root run called `name`, created when there is none; returns its `Scope`."""
        return Scope(_call(self._portal, self._inner.named, name, deadline=deadline), self._portal)

    def status(self, scope_id: str) -> dict[str, Any]:
        """The run's view (`storedState`, `effective`, ...)."""
        return _call(self._portal, self._inner.status, scope_id)

    def cancel(self, scope_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel the run and every run below it; returns its view."""
        return _call(self._portal, self._inner.cancel, scope_id, reason)

    def complete(self, scope_id: str) -> dict[str, Any]:
        """Close the run as finished normally; returns its view."""
        return _call(self._portal, self._inner.complete, scope_id)


class Scope:
    """A handle on one run (see `client.Scope`)."""

    def __init__(self, inner: aio.Scope, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal
        self.groups = BlockingGroups(inner.groups, portal)
        self.barriers = BlockingBarriers(inner.barriers, portal)
        self.timers = BlockingTimers(inner.timers, portal)
        self.pools = BlockingScopePools(inner.pools, portal)
        self.limits = BlockingScopeLimits(inner.limits, portal)
        self.budgets = BlockingScopeBudgets(inner.budgets, portal)

    def __repr__(self) -> str:
        return repr(self._inner)

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def view(self) -> dict[str, Any] | None:
        return self._inner.view

    def slot(
        self,
        name: str,
        lease_ms: int = SLOT_LEASE_MS_DEFAULT,
        timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT,
        holder: str | None = None,
    ) -> BlockingHolding[SlotLease, BlockingSlotLease]:
        """`with run.slot("browser") as lease:` (see `client.Scope.slot`). The block is not
        cancelled when the lease is lost: `lease.signal` is set and LeaseLostError is raised at
        its end."""
        return BlockingHolding(
            lambda: self._inner.pools.acquire(name, lease_ms=lease_ms, timeout_ms=timeout_ms, holder=holder),
            BlockingSlotLease,
            self._portal,
        )

    def budget(
        self,
        name: str,
        amount: float | None = None,
        lease_ms: int = SLOT_LEASE_MS_DEFAULT,
        timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT,
        holder: str | None = None,
        *,
        reserve: float | None = None,
    ) -> BlockingHolding[Reservation, BlockingReservation]:
        """`with run.budget("model-usd", amount=0.40) as reservation:` (see `client.Scope.budget`)."""
        amount = budget_amount(amount, reserve, "budget()")
        return BlockingHolding(
            lambda: self._inner.budgets.reserve(
                name, amount, lease_ms=lease_ms, timeout_ms=timeout_ms, holder=holder
            ),
            BlockingReservation,
            self._portal,
        )

    def status(self) -> dict[str, Any]:
        return _call(self._portal, self._inner.status)

    def cancel(self, reason: str | None = None) -> dict[str, Any]:
        return _call(self._portal, self._inner.cancel, reason)

    def complete(self) -> dict[str, Any]:
        return _call(self._portal, self._inner.complete)

    def child(
        self, name: str | None = None, deadline: DeadlineLike = None, child_limit: int | None = None
    ) -> Scope:
        scope = _call(self._portal, self._inner.child, name=name, deadline=deadline, child_limit=child_limit)
        return Scope(scope, self._portal)

    def mailbox(self, name: str) -> Mailbox:
        return Mailbox(self._inner.mailbox(name), self._portal)

    def task(self, task_id: str) -> Ticket:
        return Ticket(self._inner.task(task_id), self._portal)


class Ticket:
    """A submitted task (see `client.Ticket`)."""

    def __init__(self, inner: aio.Ticket, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def __repr__(self) -> str:
        return repr(self._inner)

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def key(self) -> str | None:
        return self._inner.key

    @property
    def created(self) -> bool | None:
        return self._inner.created

    @property
    def state(self) -> str | None:
        return self._inner.state

    def status(self) -> dict[str, Any]:
        return _call(self._portal, self._inner.status)

    def result(self, timeout_ms: int = RESULT_TIMEOUT_MS_DEFAULT) -> dict[str, Any]:
        """Block until the task has an outcome; ResultTimeoutError after `timeout_ms`."""
        return _call(self._portal, self._inner.result, timeout_ms)

    def cancel(self, reason: str | None = None) -> dict[str, Any]:
        """Cancel the task if it is unfinished; returns `{"taskId", "state", "outcomeReason"}`."""
        return _call(self._portal, self._inner.cancel, reason)

    def join(self, subscriber_id: str, scope_id: str) -> dict[str, Any]:
        """Subscribe `subscriber_id` to the task (idempotent)."""
        return _call(self._portal, self._inner.join, subscriber_id, scope_id)

    def detach(self, subscriber_id: str) -> dict[str, Any]:
        """Unsubscribe `subscriber_id` (idempotent); the task goes on."""
        return _call(self._portal, self._inner.detach, subscriber_id)


class Delivery:
    """A task held under a lease (see `client.Delivery`). Usable from any thread but the portal's."""

    def __init__(self, inner: aio.Delivery, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def __repr__(self) -> str:
        return repr(self._inner)

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def task_id(self) -> str:
        return self._inner.task_id

    @property
    def key(self) -> str | None:
        return self._inner.key

    @property
    def input(self) -> Any:
        return self._inner.input

    @property
    def attempt(self) -> int:
        return self._inner.attempt

    @property
    def attempts(self) -> int | None:
        return self._inner.attempts

    @property
    def lease_expires_at(self) -> datetime | None:
        return self._inner.lease_expires_at

    @property
    def settled(self) -> bool:
        return self._inner.settled

    @property
    def signal(self) -> threading.Event:
        """Set when the lease is lost, the run stopped or consume() is stopping this handler."""
        return self._inner.signal

    @property
    def needs(self) -> dict[str, Any] | None:
        return self._inner.needs

    @property
    def holds(self) -> dict[str, Any] | None:
        return self._inner.holds

    @property
    def reservations(self) -> list[str]:
        return self._inner.reservations

    @property
    def spent(self) -> float | None:
        return self._inner.spent

    def spend(self, amount: float) -> None:
        """Report `amount` more spent of the job's budget reservation (see `client.Delivery.spend`)."""
        self._inner.spend(amount)

    def complete(self, result: dict[str, Any] | None = None, spent: float | None = None) -> dict[str, Any]:
        return _call(self._portal, self._inner.complete, result, spent)

    def retry(self, error: str | None = None, delay_ms: int | None = None, spent: float | None = None) -> dict[str, Any]:
        return _call(self._portal, self._inner.retry, error, delay_ms, spent)

    def reject(self, error: str | None = None, spent: float | None = None) -> dict[str, Any]:
        return _call(self._portal, self._inner.reject, error, spent)

    def release(self) -> dict[str, Any]:
        return _call(self._portal, self._inner.release)

    def renew(self, lease_ms: int | None = None) -> dict[str, Any]:
        return _call(self._portal, self._inner.renew, lease_ms)


class Mailbox:
    """A work queue within one run (see `client.Mailbox`)."""

    def __init__(self, inner: aio.Mailbox, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def __repr__(self) -> str:
        return repr(self._inner)

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def scope_id(self) -> str:
        return self._inner.scope_id

    def submit(
        self,
        input: Any,
        key: str | None = None,
        attempts: int | None = None,
        key_only: bool = False,
        slots: SlotsLike = None,
        limit: LimitLike = None,
        budget: BudgetLike = None,
    ) -> Ticket:
        """Submit a task (see `client.Mailbox.submit`)."""
        ticket = _call(
            self._portal, self._inner.submit, input, key=key, attempts=attempts, key_only=key_only, slots=slots,
            limit=limit, budget=budget,
        )
        return Ticket(ticket, self._portal)

    def submit_many(
        self,
        inputs: Sequence[Any],
        keys: Sequence[str | None] | None = None,
        attempts: int | None = None,
        slots: SlotsLike = None,
        limit: LimitLike = None,
        budget: BudgetLike = None,
    ) -> list[Ticket]:
        """Blocking `AsyncRunstate`'s `Mailbox.submit_many`: many tasks, their tickets in order."""
        tickets = _call(
            self._portal, self._inner.submit_many, inputs, keys=keys, attempts=attempts, slots=slots, limit=limit,
            budget=budget,
        )
        return [Ticket(ticket, self._portal) for ticket in tickets]

    def receive(self, max: int = 1, lease_ms: int = LEASE_MS_DEFAULT, wait_ms: int = 0) -> list[Delivery]:
        deliveries = _call(self._portal, self._inner.receive, max=max, lease_ms=lease_ms, wait_ms=wait_ms)
        return [Delivery(delivery, self._portal) for delivery in deliveries]

    def consume(
        self,
        handler: SyncHandler,
        concurrency: int = 1,
        lease_ms: int = LEASE_MS_DEFAULT,
        stop: threading.Event | None = None,
        include_descendants: bool = False,
    ) -> None:
        """Blocking `consume`: `handler(data, delivery)` is a plain function, run in worker threads
        (up to `concurrency` at once), given a blocking `Delivery`. Returns when the run stops or
        `stop` (a threading.Event) is set; see `client.Mailbox.consume` for the rest.
        """
        if not callable(handler) or inspect.iscoroutinefunction(handler):
            raise ConfigError("the blocking client's consume() takes a plain (non-async) function")
        portal = self._portal

        def run_handler(data: Any, delivery: aio.Delivery) -> Any:
            return handler(data, Delivery(delivery, portal))

        async def run() -> None:
            stop_async = asyncio.Event() if stop is not None else None
            poller = asyncio.create_task(self._poll_stop(stop, stop_async)) if stop is not None else None
            try:
                await self._inner.consume(
                    run_handler, concurrency=concurrency, lease_ms=lease_ms, stop=stop_async,
                    include_descendants=include_descendants,
                )
            finally:
                if poller is not None:
                    poller.cancel()
                    await asyncio.wait({poller})

        future = portal.start_task_soon(run)
        try:
            future.result()
        except concurrent.futures.CancelledError:
            # The client was closed while consuming: that ends consume().
            return
        except BaseException as error:
            # KeyboardInterrupt and the like: stop consuming, hand running deliveries back.
            future.cancel()
            concurrent.futures.wait([future], timeout=CONSUME_INTERRUPT_WAIT_S)
            if type(error) is KeyboardInterrupt:  # Ctrl-C: one line and exit 130 (_interrupt.py)
                raise interrupted() from None
            raise

    @staticmethod
    async def _poll_stop(stop: threading.Event | None, stop_async: asyncio.Event | None) -> None:
        assert stop is not None and stop_async is not None
        while not stop.is_set():
            await asyncio.sleep(STOP_POLL_INTERVAL_S)
        stop_async.set()


class Runstate:
    """The blocking client: `with Runstate(holder="worker-1") as rs: ...`.

    Same arguments and environment variables as `AsyncRunstate`; same errors. Each client runs its
    own event-loop thread until `close()`.
    """

    def __init__(
        self,
        base_url: str | Sequence[str] | None = None,
        space_id: str | None = None,
        api_key: str | None = None,
        holder: str | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S_DEFAULT,
        coalesce: bool = True,
        ca_file: str | os.PathLike[str] | None = None,
        client_cert: str | os.PathLike[str] | None = None,
        client_key: str | os.PathLike[str] | None = None,
    ) -> None:
        # Validate the settings before starting a thread.
        self._async = aio.AsyncRunstate(
            base_url=base_url, space_id=space_id, api_key=api_key, holder=holder, timeout_s=timeout_s,
            coalesce=coalesce, ca_file=ca_file, client_cert=client_cert, client_key=client_key,
        )
        self._portal_context = start_blocking_portal(name="runstate-portal")
        self._portal = self._portal_context.__enter__()
        self._closed = False
        # A client never closed is closed when it is collected, or at the latest as the interpreter
        # exits (atexit, while the portal's daemon thread still runs): left to the portal's own
        # context manager, it was closed at the interpreter's end, after that thread stopped, and
        # the process hung there (a failed call's traceback kept the client alive until then).
        self._finalizer = weakref.finalize(self, _close_client, self._portal, self._async, self._portal_context)
        self.mailboxes = Mailboxes(self._async.mailboxes, self._portal)
        self.scopes = Scopes(self._async.scopes, self._portal)
        self.pools = BlockingPools(self._async.pools, self._portal)
        self.limits = BlockingLimits(self._async.limits, self._portal)
        self.budgets = BlockingBudgets(self._async.budgets, self._portal)
        self.spaces = BlockingSpaces(self._async.spaces, self._portal)
        self.keys = BlockingKeys(self._async.keys, self._portal)
        self.diagnostics = BlockingDiagnostics(self._async.diagnostics, self._portal)
        self.claims = BlockingClaims(self._async.claims, self._portal)
        self.once = BlockingOnceCalls(self._async.once, self._portal)
        self.events = BlockingEvents(self._async.events, self._portal)

    @property
    def holder(self) -> str:
        return self._async.holder

    @property
    def base_urls(self) -> list[str]:
        return self._async.base_urls

    @property
    def coalesce(self) -> bool:
        """Whether concurrent submits and result waits of this client (from any thread) ride together."""
        return self._async.coalesce

    @property
    def space_id(self) -> str | None:
        return self._async.space_id

    def __repr__(self) -> str:
        return f"<Runstate {','.join(self.base_urls)} holder={self.holder!r}>"

    def scope(self, scope_id: str) -> Scope:
        """A handle on the run `scope_id`, without a request."""
        return Scope(self._async.scope(scope_id), self._portal)

    def task(self, task_id: str) -> Ticket:
        """Re-attach to a task by id, e.g. to wait for its result (no request)."""
        return Ticket(self._async.task(task_id), self._portal)

    def whoami(self) -> Identity:
        """Who this client is to the server (see `AsyncRunstate.whoami`)."""
        return _call(self._portal, self._async.whoami)

    def default_scope(self) -> Scope:
        """The space's default run, created on first use and replaced once it stopped."""
        return Scope(_call(self._portal, self._async.default_scope), self._portal)

    def results(self, tasks: Sequence[Ticket | str], timeout_ms: int = RESULT_TIMEOUT_MS_DEFAULT) -> list[dict[str, Any]]:
        """Wait for every task's outcome; their result views in order (see AsyncRunstate.results)."""
        ids = [task.id if isinstance(task, Ticket) else task for task in tasks]
        return _call(self._portal, self._async.results, ids, timeout_ms=timeout_ms)

    def close(self) -> None:
        """Close the connections and stop the client's thread. Calls still running are cancelled."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()  # _close_client, once

    def __enter__(self) -> Runstate:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
