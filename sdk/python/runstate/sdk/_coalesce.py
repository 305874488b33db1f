"""Coalescing: concurrent calls of one client ride together in one batch call.

Group commit, never a timer. A call that finds nothing of its kind in flight goes out at the end
of the current event-loop turn (with whatever else arrived in that same turn); calls made while
one is in flight wait for it to return and then go out together in the next call. A batch of one
is sent as the single call, unchanged.

Submits (`Mailbox.submit`) become `POST /tasks/batch`. Each task of a batch is validated and
committed exactly as a single submit, under the idempotency key `<batch key>#<index>`, and answers
on its own; so each caller gets exactly what its own `POST /tasks` would have given. What could
differ is kept out of batches or handled here:
- a batch body is bounded in bytes and JSON depth by the node as a whole, so only tasks small and
  shallow enough that any batch of them stays within both go in one (the others go alone);
- a task answered UNAVAILABLE (the leader changed under the batch) is retried as the single call
  would be: the same batch is sent again under the same idempotency key, so each task replays its
  first answer or is tried again under its own key; until no task of it is UNAVAILABLE, or after
  UNAVAILABLE_AFTER_S, as the transport does. A task refused in an earlier round is tried again
  with the others (a refusal changes nothing), so its caller gets the answer of the last round: a
  task is never created behind the back of a caller told it was refused. A task accepted in one
  round keeps that answer (a later round only replays it);
- a batch the node refuses as a whole for its shape (an older node without the route, a bound)
  is sent again as single calls.

Result waits (`Ticket.result`) that arrive together become one `POST /tasks/results` (`waitMs` 0,
`view: task`: each task's view exactly as `GET /tasks/{id}` shows it). A task already finished
is answered from it; an unfinished one then waits alone (`GET /tasks/{id}?waitMs=`, the long poll
and the caller's timeout as without coalescing). A lone wait goes out alone, as before. If the
batch call fails as a whole, each caller waits alone.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from runstate.sdk._http import (
    IDEMPOTENCY_KEY_BYTES,
    RETRY_BACKOFF_S_INITIAL,
    RETRY_BACKOFF_S_MAX,
    UNAVAILABLE_AFTER_S,
    encode_body,
)
from runstate.sdk.errors import (
    NotFoundError,
    RunstateError,
    UnavailableError,
    ValidationError,
    error_from_item,
)

if TYPE_CHECKING:
    from runstate.sdk._http import Transport

logger = logging.getLogger("runstate.sdk")
_Item = TypeVar("_Item")

# The node's bounds a batch must fit (runstate_server/actors/limits.py): tasks per
# POST /tasks/batch, ids per POST /tasks/results, bytes of a request body (256 KiB) and JSON nesting
# of a body (64 levels; a batch nests each task two levels deeper than a single submit does).
SUBMIT_BATCH_MAX = 100
RESULTS_BATCH_MAX = 100
# A task coalesces only if its submit body is at most this many bytes, and a batch body stays
# under BATCH_BODY_BYTES_MAX (well inside the node's 256 KiB): a batch then never fails as a whole
# for its size where the single calls would have passed.
COALESCED_TASK_BYTES_MAX = 16 * 1024
BATCH_BODY_BYTES_MAX = 128 * 1024
# A submit body with more opening brackets than this may nest too deep to go into a batch.
COALESCED_TASK_BRACKETS_MAX = 60
# Submit calls (single or batch) of one client in flight at once.
SUBMITS_IN_FLIGHT_MAX = 1
# Item codes that mean "not applied, or not known": the single call retries them.
RETRIED_CODES = frozenset({"UNAVAILABLE", "REQUEST_TIMEOUT"})

SUBMIT_PATH = "/tasks"
SUBMIT_BATCH_PATH = "/tasks/batch"
RESULTS_PATH = "/tasks/results"


def take_batch(
    queue: collections.deque[_Item], items_max: int, bytes_max: int, *,
    encoded: Callable[[_Item], bytes], wanted: Callable[[_Item], bool],
) -> list[_Item]:
    """The oldest items of `queue` still `wanted` (a cancelled caller's are dropped), at most
    `items_max` of them and `bytes_max` of their encodings joined by commas (a first item goes
    whatever its size)."""
    batch: list[_Item] = []
    size = 0
    while queue and len(batch) < items_max:
        item = queue[0]
        if not wanted(item):
            queue.popleft()
            continue
        if batch and size + len(encoded(item)) + 1 > bytes_max:
            break
        queue.popleft()
        batch.append(item)
        size += len(encoded(item)) + 1
    return batch


@dataclass
class _Submit:
    body: dict[str, Any]
    encoded: bytes
    future: asyncio.Future[dict[str, Any]]


@dataclass
class _Round:
    """What each task of a batch answered so far: accepted ones are final, the others are the
    answer of the last round."""

    items: list[_Submit]
    accepted: list[dict[str, Any] | None] = field(default_factory=list)
    refused: list[RunstateError | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted = [None] * len(self.items)
        self.refused = [None] * len(self.items)


def nests_shallowly(encoded: bytes) -> bool:
    """A submit body nested shallowly enough for any batch to carry it (each bracket opens at most
    one level, so their count bounds the depth)."""
    return encoded.count(b"{") + encoded.count(b"[") <= COALESCED_TASK_BRACKETS_MAX


def _coalescible(encoded: bytes) -> bool:
    """A submit body that any batch of such bodies can carry: small, and nested shallowly enough."""
    return len(encoded) <= COALESCED_TASK_BYTES_MAX and nests_shallowly(encoded)


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], error: BaseException) -> None:
    """Each caller raises its own copy (one exception object raised in many tasks would collect
    all their tracebacks)."""
    if not future.done():
        future.set_exception(copy.copy(error))


class _Batcher:
    """The group-commit skeleton: a queue, calls in flight, and one flush per loop turn."""

    in_flight_max = 1

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        # One entry per caller awaiting its answer: bounded by the callers, who each wait on one.
        self._queue: collections.deque[Any] = collections.deque()
        self._in_flight = 0
        self._flush_scheduled = False
        self._senders: set[asyncio.Task[None]] = set()

    def _enqueue(self, item: Any) -> None:
        self._queue.append(item)
        self._kick()

    def _kick(self) -> None:
        if self._queue and not self._flush_scheduled and self._in_flight < self.in_flight_max:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        while self._in_flight < self.in_flight_max:
            batch = self._take()
            if not batch:
                return
            self._in_flight += 1
            sender = asyncio.get_running_loop().create_task(self._send(batch), name="runstate-coalesced")
            self._senders.add(sender)
            sender.add_done_callback(self._sent)

    def _sent(self, sender: asyncio.Task[None]) -> None:
        self._senders.discard(sender)
        self._in_flight -= 1
        self._kick()

    def _take(self) -> list[Any]:
        raise NotImplementedError

    async def _send(self, batch: list[Any]) -> None:
        raise NotImplementedError


class SubmitBatcher(_Batcher):
    """Coalesces `POST /tasks` calls of one client into `POST /tasks/batch` (module docstring)."""

    in_flight_max = SUBMITS_IN_FLIGHT_MAX

    async def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        """The answer `POST /tasks` would give for `body`, or the error it would raise."""
        encoded = encode_body(body)
        if not _coalescible(encoded):
            return await self._single(encoded)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._enqueue(_Submit(body, encoded, future))
        return await future

    async def _single(self, encoded: bytes) -> dict[str, Any]:
        # Safe to repeat: the server deduplicates by key.
        return await self._transport.request("POST", SUBMIT_PATH, encoded_body=encoded, safe=True)

    def _take(self) -> list[_Submit]:
        return take_batch(
            self._queue, SUBMIT_BATCH_MAX, BATCH_BODY_BYTES_MAX - len(b'{"tasks":[]}'),
            encoded=lambda item: item.encoded, wanted=lambda item: not item.future.done(),
        )

    async def _send(self, batch: list[_Submit]) -> None:
        try:
            if len(batch) == 1:
                await self._send_alone(batch[0])
            else:
                await self._send_batch(batch)
        except BaseException as error:  # noqa: BLE001 - every caller must hear of it
            for item in batch:
                _fail(item.future, error if isinstance(error, Exception) else RunstateError(
                    f"the batch call was interrupted: {error!r}", code="INTERNAL", status=None))
            if not isinstance(error, Exception):
                raise

    async def _send_alone(self, item: _Submit) -> None:
        try:
            answer = await self._single(item.encoded)
        except RunstateError as error:
            _fail(item.future, error)
        else:
            _resolve(item.future, answer)

    async def _send_batch(self, batch: list[_Submit]) -> None:
        raw = b'{"tasks":[' + b",".join(item.encoded for item in batch) + b"]}"
        # One key for the batch and all its rounds: task i is committed under `<key>#i`, so a
        # round sent again replays each task's first answer, as a single call's retry does.
        key = secrets.token_hex(IDEMPOTENCY_KEY_BYTES)
        loop = asyncio.get_running_loop()
        state = _Round(batch)
        give_up_at: float | None = None
        backoff_s = RETRY_BACKOFF_S_INITIAL
        while True:
            try:
                answer = await self._transport.request(
                    "POST", SUBMIT_BATCH_PATH, encoded_body=raw, safe=True, idempotency_key=key
                )
            except UnavailableError as error:
                # No answer for UNAVAILABLE_AFTER_S (or a lost answer): what the single calls get.
                self._finish(state, error)
                return
            except RunstateError as error:
                first_round = not any(state.accepted) and not any(state.refused)
                if first_round and (isinstance(error, (ValidationError, NotFoundError)) or error.status == 405):
                    # Refused as a whole, before any task was tried, for its shape (a bound, or a
                    # node without the route: 404 or 405): each task goes alone.
                    await asyncio.gather(*(self._send_alone(item) for item in batch))
                else:  # UNAUTHENTICATED, FORBIDDEN, ...: what the single calls meet too
                    self._finish(state, error)
                return
            views = answer.get("tasks")
            if not isinstance(views, list) or len(views) != len(batch):
                self._finish(state, RunstateError(
                    f"POST /tasks/batch answered {len(views) if isinstance(views, list) else 'no'} tasks "
                    f"for {len(batch)}", code="INVALID_RESPONSE", status=None))
                return
            retried: list[int] = []
            for index, view in enumerate(views):
                if state.accepted[index] is not None:
                    continue  # final: this round only replayed it
                error_view = view.get("error") if isinstance(view, dict) else None
                if error_view is not None:
                    refusal = error_from_item(error_view)
                    state.refused[index] = refusal
                    if refusal.code in RETRIED_CODES:
                        retried.append(index)
                elif isinstance(view, dict) and "taskId" in view:
                    state.accepted[index] = view
                    state.refused[index] = None
                    _resolve(batch[index].future, view)
                else:
                    state.refused[index] = RunstateError(
                        f"POST /tasks/batch answered {view!r} for a task", code="INVALID_RESPONSE", status=None
                    )
            now = loop.time()
            if not retried:
                self._finish(state, None)
                return
            if give_up_at is None:
                give_up_at = now + UNAVAILABLE_AFTER_S
            if now >= give_up_at:
                for index in retried:
                    last = state.refused[index]
                    state.refused[index] = UnavailableError(
                        f"POST {SUBMIT_PATH}: no server answered within {UNAVAILABLE_AFTER_S} s "
                        f"(tried {', '.join(self._transport.base_urls)}); last: {last}",
                        status=last.status if last is not None else None,
                    )
                self._finish(state, None)
                return
            logger.debug("sending a batch of %d tasks again: %d were answered UNAVAILABLE", len(batch), len(retried))
            await asyncio.sleep(min(backoff_s, give_up_at - now))
            backoff_s = min(backoff_s * 2, RETRY_BACKOFF_S_MAX)

    @staticmethod
    def _finish(state: _Round, error: RunstateError | None) -> None:
        """Hand every caller not yet answered its task's last refusal, or `error` when the last
        round failed as a whole (then even a task refused before may have been applied in it)."""
        for index, item in enumerate(state.items):
            if state.accepted[index] is not None:
                continue
            refusal = error if error is not None else state.refused[index]
            _fail(item.future, refusal or RunstateError(
                "the batch call ended without an answer for this task", code="INVALID_RESPONSE", status=None))


@dataclass
class _Look:
    task_id: str
    future: asyncio.Future[dict[str, Any] | None]


class ResultBatcher(_Batcher):
    """Coalesces the first look of `Ticket.result()` waits that arrive together (module docstring)."""

    def __init__(self, transport: Transport) -> None:
        super().__init__(transport)
        # False once a node refused the batch call's shape: every wait goes alone from then on.
        self.supported = True

    async def look(self, task_id: str) -> dict[str, Any] | None:
        """The task's view (as `GET /tasks/{id}` shows it) from a batch call shared with other
        waits, or None: this wait goes alone (nothing else waits with it, or the batch call
        failed). Raises NotFoundError for an unknown task, as the single call does."""
        if not self.supported:
            return None
        future: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        self._enqueue(_Look(task_id, future))
        return await future

    def _take(self) -> list[_Look]:
        batch: list[_Look] = []
        ids: set[str] = set()
        while self._queue:
            item: _Look = self._queue[0]
            if item.future.done():
                self._queue.popleft()
                continue
            if item.task_id not in ids and len(ids) >= RESULTS_BATCH_MAX:
                break
            self._queue.popleft()
            batch.append(item)
            ids.add(item.task_id)
        return batch

    async def _send(self, batch: list[_Look]) -> None:
        ids = list(dict.fromkeys(item.task_id for item in batch))
        if len(batch) == 1 or not self.supported:
            for item in batch:
                _resolve(item.future, None)  # alone: the single call, as without coalescing
            return
        try:
            answer = await self._transport.request(
                "POST", RESULTS_PATH, body={"ids": ids, "waitMs": 0, "view": "task"}, safe=True
            )
            views = answer.get("results")
            if not isinstance(views, list) or len(views) != len(ids):
                raise RunstateError("POST /tasks/results answered another count", code="INVALID_RESPONSE", status=None)
        except ValidationError:
            self.supported = False  # a node that does not take `view`
            views = None
        except BaseException as error:
            for item in batch:
                _resolve(item.future, None)  # each waits alone, and meets the trouble itself
            if not isinstance(error, Exception):
                raise
            return
        by_id: dict[str, dict[str, Any]] = {}
        for task_id, view in zip(ids, views or [], strict=False):
            if isinstance(view, dict) and view.get("id") == task_id:
                by_id[task_id] = view
        handed: set[str] = set()
        for item in batch:
            view = by_id.get(item.task_id)
            if view is not None and item.task_id in handed:
                view = copy.deepcopy(view)  # a second wait of the same task gets a view of its own
            handed.add(item.task_id)
            error_view = view.get("error") if view is not None and set(view) == {"id", "error"} else None
            if isinstance(error_view, dict):
                if error_view.get("code") == "NOT_FOUND":
                    _fail(item.future, error_from_item(error_view))
                else:
                    _resolve(item.future, None)
            else:
                _resolve(item.future, view)
