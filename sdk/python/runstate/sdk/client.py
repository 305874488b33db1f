"""The asyncio client: `AsyncRunstate` and its handles (runs, work queues, tasks, deliveries).

Each handle is a thin layer over one route group of the HTTP API (docs/http-api.md). Views come
back as the server's JSON objects (dicts with camelCase keys, e.g. `storedState`).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from runstate.sdk._coalesce import (
    BATCH_BODY_BYTES_MAX,
    RESULTS_BATCH_MAX,
    SUBMIT_BATCH_MAX,
    SUBMIT_BATCH_PATH,
    SUBMIT_PATH,
    ResultBatcher,
    SubmitBatcher,
    nests_shallowly,
)
from runstate.sdk._completes import Completes
from runstate.sdk._consume import Consumer
from runstate.sdk._http import (
    API_KEY_ENV,
    REQUEST_TIMEOUT_S_DEFAULT,
    SPACE_ID_ENV,
    OutcomeUnknownError,
    Transport,
    default_holder,
    encode_body,
    parse_base_urls,
    path_segment,
    resolve_optional,
    tls_context,
)
from runstate.sdk._time import format_deadline, parse_time
from runstate.sdk.admin import Identity, Keys, Spaces, fetch_identity
from runstate.sdk.barriers import Barriers
from runstate.sdk.claims import Claims
from runstate.sdk.diagnostics import Diagnostics
from runstate.sdk.errors import (
    ConfigError,
    ConflictError,
    NotFoundError,
    ResultTimeoutError,
    RunstateError,
    ValidationError,
    error_from_item,
)
from runstate.sdk.events import Events
from runstate.sdk.groups import Groups
from runstate.sdk.once_calls import OnceCalls
from runstate.sdk.resources import (
    SLOT_LEASE_MS_DEFAULT,
    WAIT_TIMEOUT_MS_DEFAULT,
    BudgetLike,
    Budgets,
    Holding,
    LimitLike,
    Limits,
    Pools,
    Reservation,
    ScopeBudgets,
    ScopeLimits,
    ScopePools,
    SlotLease,
    SlotsLike,
    Spending,
    budget_amount,
    requirements_body,
    settle_job_reservations,
    spent_value,
)
from runstate.sdk.timers import Timers

# The run once and queue use when none is configured.
DEFAULT_RUN_NAME = "default"

# Task results.
RESULT_TIMEOUT_MS_DEFAULT = 60_000
# One long poll of GET /v1/tasks/{id}/result; the server's own bound.
RESULT_POLL_SLICE_MS = 30_000
# Shortest time between two result polls, in case a server answers a long poll early.
RESULT_POLL_PAUSE_S_MIN = 0.1
TASK_STATES_DONE = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"})

# Per-task refusals: a task sent alone by submit_many answers with one of these where a batch's
# item answers with its error; submit_many goes on with the next task either way.
TASK_REFUSALS = (ValidationError, ConflictError, NotFoundError)

# Deliveries.
LEASE_MS_DEFAULT = 30_000
RECEIVE_BATCH_MAX = 100
RECEIVE_WAIT_MS_MAX = 30_000

Handler = Callable[[Any, "Delivery"], Any]
DeadlineLike = datetime | timedelta | str | None


def _require_int(value: int, what: str, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{what} must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        raise ConfigError(f"{what} must be {bound}, got {value}")
    return value


def lease_seconds(lease_ms: int) -> float:
    """A lease of `lease_ms` as the wire's `leaseSeconds` (fractions allowed; the server takes
    0.1 to 3600 s). ConfigError for a lease that is not a positive integer."""
    return _require_int(lease_ms, "lease_ms", 1) / 1000


def _field(answer: dict[str, Any], name: str) -> Any:
    if name not in answer:
        raise RunstateError(
            f"the server's answer lacks {name!r}: {answer!r}", code="INVALID_RESPONSE", status=None
        )
    return answer[name]


def _run_body(name: str | None, deadline: DeadlineLike, child_limit: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if name is not None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name must be a non-empty string, got {name!r}")
        body["name"] = name
    formatted = format_deadline(deadline)
    if formatted is not None:
        body["deadline"] = formatted
    if child_limit is not None:
        body["childLimit"] = _require_int(child_limit, "child_limit", 0)
    return body


async def _find_mailbox(transport: Transport, name: str) -> dict[str, Any] | None:
    """The mailbox `name` of the space (`GET /mailboxes?name=`), or None."""
    answer = await transport.request("GET", "/mailboxes", params={"name": name}, safe=True)
    for view in _field(answer, "mailboxes"):
        if view.get("name") == name:
            transport.mailbox_ids[name] = view["id"]
            return dict(view)
    return None


async def mailbox_id(transport: Transport, name: str) -> str:
    """The id of the mailbox `name`, asked once per client; NotFoundError if there is none."""
    found = transport.mailbox_ids.get(name)
    if found is None:
        view = await _find_mailbox(transport, name)
        if view is None:
            raise NotFoundError(f"mailbox {name!r} not found; create it with mailboxes.ensure", code="NOT_FOUND", status=404)
        found = view["id"]
    return found


class Mailboxes:
    """Work queues of the space: `rs.mailboxes`."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def ensure(self, name: str, mode: str = "WORK", backlog_limit: int | None = None) -> dict[str, Any]:
        """Create the mailbox `name` if it does not exist; safe to call every time.

        `mode` is WORK (tasks and messages) or INBOX (messages only); `backlog_limit` bounds its
        unfinished tasks (a submit beyond it raises BacklogFullError), set when it is created.
        Returns `{"id", "name", "mode", "created": bool, ...}`. Raises ConflictError if it exists
        with another mode, ValidationError for an unknown mode.
        """
        path_segment(name, "mailbox name")
        body: dict[str, Any] = {"name": name, "mode": mode}
        if backlog_limit is not None:
            body["backlogLimit"] = _require_int(backlog_limit, "backlog_limit", 1)
        try:
            view = await self._transport.request("POST", "/mailboxes", body=body, safe=True)
        except ConflictError:
            existing = await _find_mailbox(self._transport, name)
            if existing is None:
                raise
            if str(existing.get("mode", "")).upper() != mode.upper():
                raise ConflictError(
                    f"mailbox {name!r} exists with mode {existing.get('mode')}, not {mode}", code="CONFLICT", status=409
                ) from None
            return {**existing, "created": False}
        self._transport.mailbox_ids[name] = _field(view, "id")
        return {**view, "created": True}

    async def declare(
        self, name: str, max_attempts: int | None = None, requirements: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Declare the work queue `name` (`PUT /mailboxes/by-name/{name}`): created (mode WORK)
        when missing; `max_attempts` and `requirements` (the protocol's, see `Mailbox.submit`) are
        stored with it when first declared, and apply to tasks submitted without their own (a
        producer that names none, such as a published client's). Returns its view. ConflictError
        when it was declared with other settings."""
        body: dict[str, Any] = {}
        if max_attempts is not None:
            body["maxAttempts"] = _require_int(max_attempts, "max_attempts", 1)
        if requirements is not None:
            body["requirements"] = requirements
        path = f"/mailboxes/by-name/{path_segment(name, 'mailbox name')}"
        view = await self._transport.request("PUT", path, body=body, safe=True)
        self._transport.mailbox_ids[name] = _field(view, "id")
        return view

    async def get(self, name: str) -> dict[str, Any]:
        """Returns `{"id", "name", "mode", ...}`; raises NotFoundError if there is no such queue."""
        path_segment(name, "mailbox name")
        view = await _find_mailbox(self._transport, name)
        if view is None:
            raise NotFoundError(f"mailbox {name!r} not found", code="NOT_FOUND", status=404)
        return view


class Scopes:
    """Runs (the API calls them scopes): `rs.scopes`."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def create(
        self,
        name: str | None = None,
        deadline: DeadlineLike = None,
        child_limit: int | None = None,
        parent_scope_id: str | None = None,
    ) -> Scope:
        """Open a new run; every call creates a new one. Returns its `Scope` handle.

        `deadline` is a datetime (naive is UTC), a timedelta from now, or an ISO 8601 string.
        Raises ScopeCancelledError / DeadlineExceededError if the parent is inactive,
        LimitExceededError if the parent is at its child limit, NotFoundError for an unknown parent.
        Not retried once sent (a repeat would open a second run): a lost answer raises
        UnavailableError.
        """
        body = _run_body(name, deadline, child_limit)
        if parent_scope_id is not None:
            path_segment(parent_scope_id, "parent_scope_id")
            body["parentId"] = parent_scope_id
        view = await self._transport.request("POST", "/scopes", body=body, safe=False)
        return Scope(self._transport, _field(view, "id"), view)

    async def child(
        self,
        parent_id: str,
        name: str | None = None,
        deadline: DeadlineLike = None,
        child_limit: int | None = None,
    ) -> Scope:
        """Open a child run under `parent_id`, cancelled along with it. Errors as for `create`."""
        return await self.create(name=name, deadline=deadline, child_limit=child_limit, parent_scope_id=parent_id)

    async def named(self, name: str, deadline: DeadlineLike = None) -> Scope:
        """The active root run called `name` (`PUT /runs/{name}`), created when there is none: once
        it stopped, the next call of any process gets the same fresh run. `deadline` applies only
        to a run this call creates. Safe to repeat."""
        body: dict[str, Any] = {}
        formatted = format_deadline(deadline)
        if formatted is not None:
            body["deadline"] = formatted
        view = await self._transport.request("PUT", f"/runs/{path_segment(name, 'run name')}", body=body, safe=True)
        return Scope(self._transport, _field(view, "id"), view)

    async def status(self, scope_id: str) -> dict[str, Any]:
        """The run's view: `storedState` (ACTIVE, CANCELLED, COMPLETED), `effective` (ACTIVE or
        INACTIVE, counting ancestors and deadlines), `name`, `deadline`, ... NotFoundError if unknown.
        """
        return await self._transport.request("GET", f"/scopes/{path_segment(scope_id, 'scope id')}", safe=True)

    async def cancel(self, scope_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel the run and every run below it; returns the run's view.

        Idempotent on a cancelled run; ConflictError on a completed one.
        """
        body: dict[str, Any] = {} if reason is None else {"reason": reason}
        path = f"/scopes/{path_segment(scope_id, 'scope id')}/cancel"
        return await self._transport.request("POST", path, body=body, safe=True)

    async def complete(self, scope_id: str) -> dict[str, Any]:
        """Close the run as finished normally; returns its view.

        Idempotent on a completed run; ConflictError on a cancelled one.
        """
        path = f"/scopes/{path_segment(scope_id, 'scope id')}/complete"
        return await self._transport.request("POST", path, body={}, safe=True)


class Scope:
    """A handle on one run. `view` is the last view the SDK saw (None if it has not fetched one)."""

    def __init__(self, transport: Transport, scope_id: str, view: dict[str, Any] | None = None) -> None:
        path_segment(scope_id, "scope id")
        self._transport = transport
        self._scopes = Scopes(transport)
        self.id = scope_id
        self.view = view
        self.groups = Groups(transport, scope_id)
        self.barriers = Barriers(transport, scope_id)
        self.timers = Timers(transport, scope_id)
        self.pools = ScopePools(transport, scope_id)
        self.limits = ScopeLimits(transport, scope_id)
        self.budgets = ScopeBudgets(transport, scope_id)

    def __repr__(self) -> str:
        state = f" {self.view.get('storedState')}" if self.view else ""
        return f"<Scope {self.id}{state}>"

    async def status(self) -> dict[str, Any]:
        """The run's current view (see `Scopes.status`); NotFoundError if unknown."""
        self.view = await self._scopes.status(self.id)
        return self.view

    async def cancel(self, reason: str | None = None) -> dict[str, Any]:
        """Cancel this run and everything below it (see `Scopes.cancel`)."""
        self.view = await self._scopes.cancel(self.id, reason)
        return self.view

    async def complete(self) -> dict[str, Any]:
        """Close this run as finished normally (see `Scopes.complete`)."""
        self.view = await self._scopes.complete(self.id)
        return self.view

    async def child(
        self, name: str | None = None, deadline: DeadlineLike = None, child_limit: int | None = None
    ) -> Scope:
        """Open a sub-run, cancelled along with this one (see `Scopes.child`)."""
        return await self._scopes.child(self.id, name=name, deadline=deadline, child_limit=child_limit)

    def slot(
        self,
        name: str,
        lease_ms: int = SLOT_LEASE_MS_DEFAULT,
        timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT,
        holder: str | None = None,
    ) -> Holding[SlotLease]:
        """`async with run.slot("browser") as lease:` holds a slot of the pool for the block.

        Waits up to `timeout_ms` for a free slot (WaitTimeoutError), renews the lease every third
        of `lease_ms` while the block runs and releases it on exit. If a renewal is refused (the
        lease lapsed, or the run stopped), `lease.signal` is set, the block is cancelled and
        LeaseLostError is raised. ScopeCancelledError / DeadlineExceededError if the run stopped,
        NotFoundError for an unknown pool.
        """
        return Holding(lambda: self.pools.acquire(name, lease_ms=lease_ms, timeout_ms=timeout_ms, holder=holder))

    def budget(
        self,
        name: str,
        amount: float | None = None,
        lease_ms: int = SLOT_LEASE_MS_DEFAULT,
        timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT,
        holder: str | None = None,
        *,
        reserve: float | None = None,
    ) -> Holding[Reservation]:
        """`async with run.budget("model-usd", amount=0.40) as reservation:` reserves `amount` of
        the budget for the block (as `run.budgets.reserve(name, amount)`); report spend with
        `reservation.spend(amount)`. `reserve=` is the amount's deprecated name (DeprecationWarning;
        ConfigError with both).

        On exit the reservation is settled with what was spent (the whole reservation if
        `spend()` was never called), or released if the block raised before any `spend()`.
        Waiting, renewal and errors as for `slot` (ValidationError for more than the budget's total).
        """
        amount = budget_amount(amount, reserve, "budget()")
        return Holding(
            lambda: self.budgets.reserve(name, amount, lease_ms=lease_ms, timeout_ms=timeout_ms, holder=holder)
        )

    def mailbox(self, name: str) -> Mailbox:
        """The work queue `name` as seen from this run (no request)."""
        return Mailbox(self._transport, self.id, name)

    def task(self, task_id: str) -> Ticket:
        """Re-attach to a task by id, e.g. after a restart (no request)."""
        return Ticket(self._transport, task_id)


def _task_body(
    task_input: Any, key: str | None, attempts: int | None, key_only: bool = False, needs: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One task of a submit request (with `needs`, `{"requirements"}`); ConfigError for a malformed
    key or attempts."""
    body: dict[str, Any] = {"input": task_input, **(needs or {})}
    if key_only:
        if key is None:
            raise ConfigError("key_only needs a key")
        body["keyOnly"] = True
    if key is not None:
        if not isinstance(key, str) or not key:
            raise ConfigError(f"key must be a non-empty string, got {key!r}")
        body["taskKey"] = key
    if attempts is not None:
        body["attempts"] = _require_int(attempts, "attempts", 1)
    return body


def _submit_requests(items: Sequence[bytes]) -> Iterator[tuple[str, bytes]]:
    """The requests that submit the encoded tasks, in order: POST /tasks/batch bodies of up to
    SUBMIT_BATCH_MAX tasks, under BATCH_BODY_BYTES_MAX but for a task alone (a task's input is at
    most 64 KiB: it fits); a task nested too deeply for a batch (which nests each task two levels
    deeper) goes alone to POST /tasks, where it passes or is refused on its own."""
    envelope = len(b'{"tasks":[]}')
    chunk: list[bytes] = []
    size = envelope
    for item in items:
        alone = not nests_shallowly(item)
        if chunk and (alone or len(chunk) == SUBMIT_BATCH_MAX or size + len(item) + 1 > BATCH_BODY_BYTES_MAX):
            yield SUBMIT_BATCH_PATH, b'{"tasks":[' + b",".join(chunk) + b"]}"
            chunk, size = [], envelope
        if alone:
            yield SUBMIT_PATH, item
            continue
        chunk.append(item)
        size += len(item) + 1
    if chunk:
        yield SUBMIT_BATCH_PATH, b'{"tasks":[' + b",".join(chunk) + b"]}"


class Mailbox:
    """A work queue within one run: submit tasks, receive or consume deliveries."""

    def __init__(self, transport: Transport, scope_id: str, name: str) -> None:
        path_segment(scope_id, "scope id")
        path_segment(name, "mailbox name")
        self._transport = transport
        self.scope_id = scope_id
        self.name = name

    async def _where(self) -> dict[str, str]:
        """The run and mailbox fields of a task submit, a batch item, a receive."""
        return {"scopeId": self.scope_id, "mailboxId": await mailbox_id(self._transport, self.name)}

    def __repr__(self) -> str:
        return f"<Mailbox {self.name} in {self.scope_id}>"

    async def submit(
        self,
        input: Any,
        key: str | None = None,
        attempts: int | None = None,
        key_only: bool = False,
        slots: SlotsLike = None,
        limit: LimitLike = None,
        budget: BudgetLike = None,
    ) -> Ticket:
        """Submit a task; returns its `Ticket` (`.created` is False if the key already existed).

        `slots` (a pool name or a list of them), `limit` (a limit name, or `{"name", "units"}`) and
        `budget` (`{"name", "amount"}`) name what the job needs, sent as the protocol's
        `requirements`: a worker receives it only when all of them can be taken, and takes them
        with it; slots return when its delivery ends, the reservation is settled by the worker.

        The same key with the same input returns the existing task (without a key, the server keys
        the task by a hash of its input). Raises KeyConflictError for the same key with another
        input (unless `key_only`: then the key alone names the task and the existing one comes back
        whatever its input), ScopeCancelledError / DeadlineExceededError if the run stopped, NotFoundError if
        the queue or a named resource does not exist, ValidationError for an input over 64 KB or a
        need no job could ever get (more units than the limit, more than the budget's total).
        """
        requirements = await requirements_body(self._transport, slots, limit, budget)
        task = _task_body(input, key, attempts, key_only, None if requirements is None else {"requirements": requirements})
        encode_body(task)  # ConfigError for an input JSON cannot carry, before any request
        body = {**await self._where(), **task}
        if self._transport.submits is not None:  # concurrent submits of this client ride together
            answer = await self._transport.submits.submit(body)
        else:
            # Safe to repeat: the server deduplicates by key.
            answer = await self._transport.request("POST", "/tasks", body=body, safe=True)
        return Ticket(
            self._transport,
            _field(answer, "taskId"),
            key=answer.get("taskKey", key),
            created=answer.get("created"),
            state=answer.get("state"),
        )

    async def submit_many(
        self,
        inputs: Sequence[Any],
        keys: Sequence[str | None] | None = None,
        attempts: int | None = None,
        slots: SlotsLike = None,
        limit: LimitLike = None,
        budget: BudgetLike = None,
    ) -> list[Ticket]:
        """Submit many tasks, SUBMIT_BATCH_MAX per request at most (fewer when their bodies would
        pass BATCH_BODY_BYTES_MAX, well inside the node's bound on a request body; a task nested
        too deeply to go into a batch goes alone); returns their tickets in order.

        Each task behaves exactly as `submit(input, key=keys[i], slots=, limit=, budget=)`. Every
        task is tried; if any was refused, the first refusal is raised after the others were
        submitted (resubmitting the same keys and inputs is safe: the existing tasks come back).
        """
        if keys is not None and len(keys) != len(inputs):
            raise ConfigError(f"keys has {len(keys)} entries for {len(inputs)} inputs")
        requirements = await requirements_body(self._transport, slots, limit, budget)
        needs = None if requirements is None else {"requirements": requirements}
        bodies = [
            _task_body(task_input, keys[index] if keys is not None else None, attempts, needs=needs)
            for index, task_input in enumerate(inputs)
        ]
        encoded = [encode_body(body) for body in bodies]  # ConfigError before any request
        # Each item is {**where, **body}, spliced from the encoded parts: every body is an object
        # that starts with its input, so each task is encoded once.
        where = encode_body(await self._where())[:-1] + b"," if inputs else b""
        items = [where + body[1:] for body in encoded]
        tickets: list[Ticket] = []
        first_error: RunstateError | None = None
        for path, body in _submit_requests(items):
            if path == SUBMIT_PATH:
                try:
                    views = [await self._transport.request("POST", path, encoded_body=body, safe=True)]
                except TASK_REFUSALS as refused:  # this task's own answer, as a batch item's would be
                    first_error = first_error or refused
                    continue
            else:
                views = _field(await self._transport.request("POST", path, encoded_body=body, safe=True), "tasks")
            for view in views:
                error = view.get("error")
                if error is not None:
                    first_error = first_error or error_from_item(error)
                    continue
                tickets.append(
                    Ticket(self._transport, _field(view, "taskId"), key=view.get("taskKey"), created=view.get("created"),
                           state=view.get("state"))
                )
        if first_error is not None:
            raise first_error
        return tickets

    async def receive(
        self, max: int = 1, lease_ms: int = LEASE_MS_DEFAULT, wait_ms: int = 0
    ) -> list[Delivery]:
        """Take up to `max` tasks under a lease of `lease_ms`, waiting up to `wait_ms` for one.

        Returns the deliveries, possibly none. Raises ScopeCancelledError / DeadlineExceededError
        once the run stopped. A receive is never repeated blindly: if its answer is lost, this
        returns an empty list (a delivery handed out meanwhile comes back when its lease lapses).
        """
        try:
            return await self._receive(max=max, lease_ms=lease_ms, wait_ms=wait_ms)
        except OutcomeUnknownError:
            return []

    async def _receive(
        self, *, max: int, lease_ms: int, wait_ms: int, include_descendants: bool = False
    ) -> list[Delivery]:
        """One recv (or, with `include_descendants`, one admit: tasks of the runs below this one
        too) of up to `max` deliveries."""
        lease = {
            "holder": self._transport.holder,
            "holderSession": self._transport.holder_session,
            "max": _require_int(max, "max", 1, RECEIVE_BATCH_MAX),
            "leaseSeconds": lease_seconds(lease_ms),
            "waitMs": _require_int(wait_ms, "wait_ms", 0, RECEIVE_WAIT_MS_MAX),
        }
        where = await self._where()
        if include_descendants:
            body = {**where, **lease, "includeDescendants": True}
            answer = await self._transport.request("POST", "/tasks/admit", body=body, safe=False, long_poll_ms=wait_ms)
            return [Delivery(self._transport, _as_message(admitted)) for admitted in answer.get("tasks", [])]
        body = {"scopeId": where["scopeId"], **lease}
        answer = await self._transport.request(
            "POST", f"/mailboxes/{where['mailboxId']}/recv", body=body, safe=False, long_poll_ms=wait_ms
        )
        # 204 (nothing to hand out) arrives as {}.
        return [Delivery(self._transport, given) for given in answer.get("messages", [])]

    async def consume(
        self,
        handler: Handler,
        concurrency: int = 1,
        lease_ms: int = LEASE_MS_DEFAULT,
        stop: asyncio.Event | None = None,
        include_descendants: bool = False,
    ) -> None:
        """Run `handler(data, delivery)` for each task of this queue, up to `concurrency` at once;
        with `include_descendants`, also the tasks of this queue in the runs below this one (a
        task group's run, say), taken by `POST /tasks/admit`.

        The handler may be async or a plain function (run in a thread). While it runs, its lease is
        renewed every `lease_ms / 3`. When it returns without settling the delivery itself, the
        delivery is completed with `{"payload": <return value>}`; when it raises, the delivery is
        retried (attempt + 1, after a backoff); either sends what `delivery.spend()` reported. If
        the lease is lost or the run stops, the handler is cancelled.

        Returns when the run is cancelled, completed or past its deadline, or when `stop` is set
        (the receive in flight is given up at once; what it brought is released;
        running handlers get a grace period of 30 s, then are cancelled). If cancelled itself, it cancels
        the running handlers at once and hands their deliveries back. Rides out short outages;
        raises UnavailableError if no server answers at the start or for a long time, and any
        other error of a receive (NotFoundError for an unknown run or queue, ...).
        """
        await Consumer(
            self, handler, concurrency=concurrency, lease_ms=lease_ms, stop=stop, include_descendants=include_descendants
        ).run()


def _as_message(admitted: dict[str, Any]) -> dict[str, Any]:
    """An admitted task as a recv's delivery (`{message, token, leaseExpiresAt}`)."""
    message = {
        "id": _field(admitted, "taskId"),
        "payload": admitted.get("payload"),
        "attempt": admitted.get("attempt"),
        "attempts": admitted.get("attempts"),
        "workKey": admitted.get("taskKey"),
        "needs": admitted.get("needs"),
        "holds": admitted.get("holds"),
        "reservations": [
            rid for rid in admitted.get("reservations") or [] if rid != (admitted.get("holds") or {}).get("reservationId")
        ],
    }
    return {"message": message, "token": _field(admitted, "token"), "leaseExpiresAt": admitted.get("leaseExpiresAt")}


class Ticket:
    """A submitted task. `.created` and `.state` are from the submit (None when re-attached)."""

    def __init__(
        self,
        transport: Transport,
        task_id: str,
        *,
        key: str | None = None,
        created: bool | None = None,
        state: str | None = None,
    ) -> None:
        self._transport = transport
        self._path = f"/tasks/{path_segment(task_id, 'task id')}"
        self.id = task_id
        self.key = key
        self.created = created
        self.state = state

    def __repr__(self) -> str:
        return f"<Ticket {self.id} key={self.key!r} created={self.created!r}>"

    async def status(self) -> dict[str, Any]:
        """The task's view: `state`, `attempt`, `attempts`, `input`, `outcome`, `outcomeReason`,
        `error`, ...

        NotFoundError if unknown.
        """
        view = await self._transport.request("GET", self._path, safe=True)
        self.state = view.get("state", self.state)
        return view

    async def result(self, timeout_ms: int = RESULT_TIMEOUT_MS_DEFAULT) -> dict[str, Any]:
        """Wait until the task has a recorded outcome and return its view (`{"id", "state", "done",
        "outcome", "outcomeReason", "error", ...}`).

        `state` is SUCCEEDED (`outcome` holds the payload), FAILED (`error` holds the last error),
        CANCELLED or EXPIRED: all are returned, not raised. Raises ResultTimeoutError if the task is
        still unfinished after `timeout_ms` (the task goes on), NotFoundError for an unknown task.
        """
        _require_int(timeout_ms, "timeout_ms", 0)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        if self._transport.results is not None:
            # Waits that arrive together take their first look in one call (_coalesce.py); one
            # still unfinished then waits alone, as below.
            view = await self._transport.results.look(self.id)
            if view is not None:
                self.state = view.get("state", self.state)
                if view.get("done") or self.state in TASK_STATES_DONE:
                    return view
                if loop.time() >= deadline:
                    raise ResultTimeoutError(self.id, timeout_ms, self.state)
        while True:
            started = loop.time()
            wait_ms = min(max(0, int((deadline - started) * 1000)), RESULT_POLL_SLICE_MS)
            answer = await self._transport.request(
                "GET", self._path, params={"waitMs": str(wait_ms)}, safe=True, long_poll_ms=wait_ms
            )
            self.state = answer.get("state", self.state)
            if answer.get("done") or self.state in TASK_STATES_DONE:
                return answer
            now = loop.time()
            if now >= deadline:
                raise ResultTimeoutError(self.id, timeout_ms, self.state)
            if now - started < RESULT_POLL_PAUSE_S_MIN:
                await asyncio.sleep(min(RESULT_POLL_PAUSE_S_MIN, deadline - now))


    async def cancel(self, reason: str | None = None) -> dict[str, Any]:
        """Cancel the task if it is unfinished (a running delivery's token turns stale); a finished
        task stays as it is. Returns `{"taskId", "state", "outcomeReason"}`; NotFoundError if unknown."""
        body = {} if reason is None else {"reason": reason}
        answer = await self._transport.request("POST", f"{self._path}/cancel", body=body, safe=True)
        self.state = answer.get("state", self.state)
        return answer

    async def join(self, subscriber_id: str, scope_id: str) -> dict[str, Any]:
        """Subscribe `subscriber_id` (from the run `scope_id`) to the task; idempotent. Returns
        `{"taskId", "state", "subscribers"}`; LimitExceededError beyond 100 subscribers."""
        body = {"subscriberId": subscriber_id, "scopeId": scope_id}
        return await self._transport.request("POST", f"{self._path}/join", body=body, safe=True)

    async def detach(self, subscriber_id: str) -> dict[str, Any]:
        """Unsubscribe `subscriber_id`; idempotent. The task goes on without subscribers."""
        body = {"subscriberId": subscriber_id}
        return await self._transport.request("POST", f"{self._path}/detach", body=body, safe=True)


# Guards making a Delivery's `signal` on first use (rare, and brief: one lock for all of them).
_SIGNAL_MAKING = threading.Lock()


class Delivery:
    """One task handed to this worker under a lease.

    `id` is the delivery's fencing token (another delivery of the same task has another one; a
    call with a token that is no longer the task's current delivery raises LeaseLostError),
    `task_id` the task (the wire's message id), `key` its key.
    `input` is the task's input, `attempt` counts deliveries of the task (1 for the first),
    `lease_expires_at` is an aware UTC datetime (None if the server sent none). `settled` turns
    True once complete/retry/reject/release was accepted, or the server said the lease is gone.
    `needs` is what each delivery of the task takes, in the shape of its `requirements`
    (`{"pools": [{"name", "units"}], "quotas": [...], "budgets": [{"name", "reserveMinor"}]}`, or
    None) and `holds` what this delivery took for it (`{"slots": [grant ids], "reservationId",
    "reservations": [ids]}`, or None); `reservations` are the budget reservations of its
    `requirements.budgets`, which complete settles (see `complete`).
    """

    def __init__(self, transport: Transport, given: dict[str, Any]) -> None:
        self._transport = transport
        message = _field(given, "message")
        # The delivery's token: it fences every call on this delivery (a later delivery of the
        # same task has another one), and names the delivery.
        self.id: str = _field(given, "token")
        self.task_id: str = _field(message, "id")
        self._path = f"/messages/{path_segment(self.task_id, 'message id')}"
        self.key: str | None = message.get("workKey")
        self.input: Any = message.get("payload")
        self.attempt: int = message.get("attempt", 0)
        self.attempts: int | None = message.get("attempts")
        self.lease_expires_at: datetime | None = self._parse_lease(given.get("leaseExpiresAt"))
        self.needs: dict[str, Any] | None = message.get("needs")
        self.reservations: list[str] = list(message.get("reservations") or [])
        holds = message.get("holds")
        if holds is not None or self.reservations:
            holds = dict(holds or {"slots": [], "reservationId": None})
            holds["reservationId"] = holds.get("reservationId") or (self.reservations[0] if self.reservations else None)
            holds["reservations"] = self.reservations
        self.holds: dict[str, Any] | None = holds
        self._spending = Spending()
        self._settled = False
        # Set by consume(): its completes go out together with the other handlers' (_completes.py).
        self._completes: Completes | None = None
        # `signal`, made on first use: a threading.Event costs a Condition and its lock, which
        # most deliveries (a handler that never looks, and is never cancelled) do not need.
        self._signal: threading.Event | None = None

    def __repr__(self) -> str:
        return f"<Delivery {self.id} task={self.task_id} attempt={self.attempt} settled={self._settled}>"

    @property
    def settled(self) -> bool:
        return self._settled

    @property
    def signal(self) -> threading.Event:
        """Set by consume() when the lease is lost, the run stopped, or the handler is being
        cancelled: a sync handler, which cannot be cancelled, checks it to stop early."""
        signal = self._signal
        if signal is None:
            # The event loop (setting it) and a handler's thread (checking it) may both be first:
            # both must get the same event.
            with _SIGNAL_MAKING:
                if self._signal is None:
                    self._signal = threading.Event()
                signal = self._signal
        return signal

    def spend(self, amount: float) -> None:
        """Report `amount` more spent of the job's budget reservation (no request; safe from any
        thread). complete/retry/reject send the sum. ConfigError for a negative amount."""
        self._spending.add(amount)

    @property
    def spent(self) -> float | None:
        """The sum reported with `spend()`, or None if it was never called."""
        return self._spending.total

    @staticmethod
    def _parse_lease(value: Any) -> datetime | None:
        if not isinstance(value, str):
            return None
        try:
            return parse_time(value)
        except ValueError:
            return None

    async def _settle(self, action: str, body: dict[str, Any]) -> dict[str, Any]:
        body = {"token": self.id, **body}

        def single() -> Awaitable[dict[str, Any]]:
            return self._transport.request("POST", f"{self._path}/{action}", body=body, safe=True)

        try:
            if action == "complete" and self._completes is not None:
                answer = await self._completes.complete(self.task_id, body, single)
            else:
                answer = await single()
        except (ConflictError, NotFoundError):
            # STALE_CLAIM, SCOPE_CANCELLED, ...: this delivery is no longer ours to settle.
            self._settled = True
            raise
        self._settled = True
        return answer

    async def complete(self, result: dict[str, Any] | None = None, spent: float | None = None) -> dict[str, Any]:
        """Record the task's result, e.g. `complete(result={"payload": {...}})`. Then each budget
        reservation of the job is settled with `spent` (default: the sum reported with `spend()`,
        else the whole reservation; over it, up to what the budget still has) and the rest
        voided. retry and reject charge `spent` only when given or reported (else nothing), and
        the delivery's end voids the rest.

        Returns `{"taskId", "state": "SUCCEEDED"}`. Raises LeaseLostError if the lease lapsed or
        was taken over (nothing is recorded), ScopeCancelledError / DeadlineExceededError if the run
        stopped, ResultTooLargeError over 64 KB, ConfigError for a result that is not JSON.
        """
        if result is None:
            result = {"payload": None}
        if not isinstance(result, dict):
            raise ConfigError(
                f"result must be a dict such as {{'payload': ...}}, got {type(result).__name__}"
            )
        answer = await self._settle("complete", {"result": result})
        if self.reservations:
            # Completed: the reservations stay open for the worker, which settles what was spent
            # (else the whole reserve) and voids the rest, as the published worker does.
            await settle_job_reservations(self._transport, self.reservations, self.needs, self._spent_or(spent))
        return answer

    def _spent_or(self, spent: float | None) -> float | None:
        if spent is not None:
            return spent_value(spent)
        return self.spent

    async def _charge_failure(self, spent: float | None) -> None:
        """Before a nack: charge what was reported spent (the rest is voided by the delivery's
        end); with nothing reported nothing is charged."""
        spent = self._spent_or(spent)
        if self.reservations and spent is not None:
            await settle_job_reservations(self._transport, self.reservations, self.needs, spent)

    async def retry(
        self, error: str | None = None, delay_ms: int | None = None, spent: float | None = None
    ) -> dict[str, Any]:
        """Put the task back for another attempt after `delay_ms` (default: the server's backoff);
        `spent` as for `complete`. Sent as `nack {retry: true}`.

        Returns `{"taskId", "state"}` (FAILED when the attempts are used up). Allowed after the run
        stopped. Raises LeaseLostError if the lease is gone.
        """
        body: dict[str, Any] = {"retry": True}
        if error is not None:
            body["error"] = str(error)
        if delay_ms is not None:
            body["delayMs"] = _require_int(delay_ms, "delay_ms", 0)
        await self._charge_failure(spent)
        return await self._settle("nack", body)

    async def reject(self, error: str | None = None, spent: float | None = None) -> dict[str, Any]:
        """Fail the task now, without further attempts. Returns `{"taskId", "state": "FAILED"}`.

        Raises LeaseLostError if the lease is gone.
        """
        body: dict[str, Any] = {"retry": False} if error is None else {"retry": False, "error": str(error)}
        await self._charge_failure(spent)
        return await self._settle("nack", body)

    async def release(self) -> dict[str, Any]:
        """Hand the task back at once, no attempt counted (`nack {retry: true, countAttempt: false}`).
        Returns `{"taskId", "state"}`.

        Raises LeaseLostError if the lease is gone.
        """
        return await self._settle("nack", {"retry": True, "countAttempt": False})

    async def renew(self, lease_ms: int | None = None) -> dict[str, Any]:
        """Extend the lease by `lease_ms` (default: the server's) from now; returns
        `{"leaseExpiresAt"}` and updates `lease_expires_at`.

        Raises LeaseLostError if the lease lapsed or was taken over, ScopeCancelledError /
        DeadlineExceededError if the run stopped.
        """
        body: dict[str, Any] = {"token": self.id}
        if lease_ms is not None:
            body["leaseSeconds"] = lease_seconds(lease_ms)
        answer = await self._transport.request("POST", f"{self._path}/renew", body=body, safe=True)
        expires = self._parse_lease(answer.get("leaseExpiresAt"))
        if expires is not None:
            self.lease_expires_at = expires
        return answer


def _path(value: str | os.PathLike[str] | None) -> str | None:
    return None if value is None else os.fspath(value)


class AsyncRunstate:
    """The asyncio client. Use as `async with AsyncRunstate(holder="worker-1") as rs: ...`.

    Arguments fall back to the environment: `base_url` to RUNSTATE_BASE_URL (a comma-separated list
    of servers; default http://localhost:8080), `space_id` to RUNSTATE_SPACE_ID, `api_key` to
    RUNSTATE_API_KEY. For https:// servers, `ca_file` (RUNSTATE_CA_FILE) is the PEM file of the CA
    to trust instead of the system's, and `client_cert` with `client_key` (RUNSTATE_CLIENT_CERT,
    RUNSTATE_CLIENT_KEY) the certificate and key presented to a node that requires one (mutual
    TLS); a file that cannot be read is a ConfigError here. `holder` names this client on leases
    (default `<hostname>:<pid>`).
    `timeout_s` bounds each ordinary request (long polls get their wait on top). `coalesce`
    (default True): concurrent `submit()` calls of this client ride together in one batch request,
    and so do the first looks of concurrent `Ticket.result()` waits; each caller still gets
    exactly its own answer or error (docs/python-sdk.md, "The client": coalescing). Raises ConfigError for a malformed
    setting. Calls raise UnavailableError when no server answers for a few seconds, and TlsError
    at once, without retrying, when TLS with a server fails (its certificate does not verify, or it
    refused the client's).
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
        if holder is not None and (not isinstance(holder, str) or not holder.strip()):
            raise ConfigError(f"holder must be a non-empty string, got {holder!r}")
        if not isinstance(coalesce, bool):
            raise ConfigError(f"coalesce must be True or False, got {coalesce!r}")
        self._transport = Transport(
            parse_base_urls(base_url),
            space_id=resolve_optional(space_id, SPACE_ID_ENV),
            api_key=resolve_optional(api_key, API_KEY_ENV),
            holder=holder.strip() if holder else default_holder(),
            timeout_s=timeout_s,
            ssl_context=tls_context(_path(ca_file), _path(client_cert), _path(client_key)),
        )
        if coalesce:
            self._transport.submits = SubmitBatcher(self._transport)
            self._transport.results = ResultBatcher(self._transport)
        self.mailboxes = Mailboxes(self._transport)
        self.scopes = Scopes(self._transport)
        self.claims = Claims(self._transport)
        self.once = OnceCalls(self._transport)
        self.pools = Pools(self._transport)
        self.limits = Limits(self._transport)
        self.budgets = Budgets(self._transport)
        self.spaces = Spaces(self._transport)
        self.keys = Keys(self._transport)
        self.diagnostics = Diagnostics(self._transport)
        self.events = Events(self._transport)

    @property
    def holder(self) -> str:
        return self._transport.holder

    @property
    def base_urls(self) -> list[str]:
        return list(self._transport.base_urls)

    @property
    def coalesce(self) -> bool:
        """Whether concurrent submits and result waits of this client ride together."""
        return self._transport.submits is not None

    @property
    def space_id(self) -> str | None:
        return self._transport.space_id

    def __repr__(self) -> str:
        return f"<AsyncRunstate {','.join(self._transport.base_urls)} holder={self.holder!r}>"

    def scope(self, scope_id: str) -> Scope:
        """A handle on the run `scope_id`, without a request."""
        return Scope(self._transport, scope_id)

    def task(self, task_id: str) -> Ticket:
        """Re-attach to a task by id, e.g. to wait for its result (no request)."""
        return Ticket(self._transport, task_id)

    async def whoami(self) -> Identity:
        """Who this client is to the server: its key id, space, permissions and whether it is an
        operator admin (`Identity.auth` is False on a node without auth). UnauthenticatedError
        for a missing, unknown or revoked key."""
        return await fetch_identity(self._transport)

    async def default_scope(self) -> Scope:
        """The space's default run, the run named `default` (see `Scopes.named`): created on first
        use, replaced by a fresh one in the same step once it is no longer active. Safe to repeat."""
        return await self.scopes.named(DEFAULT_RUN_NAME)

    async def results(
        self, tasks: Sequence[Ticket | str], timeout_ms: int = RESULT_TIMEOUT_MS_DEFAULT
    ) -> list[dict[str, Any]]:
        """Wait until every task (tickets or task ids) has a recorded outcome; return their result
        views in order, as `Ticket.result()` does, asking for RESULTS_BATCH_MAX tasks per request.

        Raises ResultTimeoutError naming the first unfinished task after `timeout_ms`,
        NotFoundError for an unknown task id.
        """
        _require_int(timeout_ms, "timeout_ms", 0)
        ids = [task.id if isinstance(task, Ticket) else task for task in tasks]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        found: dict[str, dict[str, Any]] = {}
        while True:
            pending = [task_id for task_id in ids if task_id not in found]
            if not pending:
                return [found[task_id] for task_id in ids]
            chunk = pending[:RESULTS_BATCH_MAX]
            wait_ms = min(max(0, int((deadline - loop.time()) * 1000)), RESULT_POLL_SLICE_MS)
            answer = await self._transport.request(
                "POST", "/tasks/results", body={"ids": chunk, "waitMs": wait_ms}, safe=True, long_poll_ms=wait_ms
            )
            for view in _field(answer, "results"):
                error = view.get("error")
                if error is not None:
                    raise error_from_item(error)
                if view.get("done") or view.get("state") in TASK_STATES_DONE:
                    found[view["id"]] = view
            if loop.time() >= deadline and any(task_id not in found for task_id in chunk):
                first = next(task_id for task_id in chunk if task_id not in found)
                raise ResultTimeoutError(first, timeout_ms, None)

    async def aclose(self) -> None:
        """Close the connections. The client cannot be used afterwards."""
        await self._transport.aclose()

    async def __aenter__(self) -> AsyncRunstate:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


__all__ = [
    "AsyncRunstate",
    "Claims",
    "Delivery",
    "Handler",
    "Mailbox",
    "Mailboxes",
    "OnceCalls",
    "Reservation",
    "Scope",
    "Scopes",
    "SlotLease",
    "Ticket",
]
