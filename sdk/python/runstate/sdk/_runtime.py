"""The process-wide client behind `runstate.once`, `runstate.queue` and `runstate.serve`.

One `AsyncRunstate` per process, created on first use from `runstate.configure(...)` or the
environment (RUNSTATE_BASE_URL, RUNSTATE_SPACE_ID, RUNSTATE_API_KEY, RUNSTATE_SCOPE_ID). Its
requests run on an event loop in a daemon thread of its own, whatever the caller is: a sync caller
blocks on the answer, an async caller awaits it from its own loop (`Runtime.arun`), and the
user's function always runs in the caller's thread or task. One session that outlives any caller's
event loop means nothing is bound to a loop that `asyncio.run` closes; the daemon thread never
keeps the interpreter alive, and an atexit hook closes the session. A forked child builds its own.

Which run: `configure(scope_id=...)`, else RUNSTATE_SCOPE_ID, else the active run named
`configure(run=...)`, RUNSTATE_RUN or `default` (the space's default run; `PUT /runs/{name}`),
asked once and cached. When a call answers SCOPE_CANCELLED,
DEADLINE_EXCEEDED or NOT_FOUND for the cached default run, the SDK asks for the default run again
(the server has replaced it by then) and retries the call once, so after a stop the next call of
every process lands in the same fresh run.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import os
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from runstate.sdk.client import DEFAULT_RUN_NAME, AsyncRunstate
from runstate.sdk.errors import ConfigError, DeadlineExceededError, NotFoundError, ScopeCancelledError

T = TypeVar("T")

SCOPE_ID_ENV = "RUNSTATE_SCOPE_ID"
RUN_ENV = "RUNSTATE_RUN"
RUN_NAME_CHARS_MAX = 256  # the server's bound of a run name
# Closing: how long the session gets to close, and the loop thread to end.
CLOSE_TIMEOUT_S = 5.0

_Outcome = concurrent.futures.Future[Any]  # a coroutine run on the runtime's loop (`Runtime.submit`)
_HandBack = tuple[asyncio.Future[Any], _Outcome]  # a caller's future on its own loop, and what it awaits


@dataclass(frozen=True)
class Settings:
    base_url: str | Sequence[str] | None = None
    space_id: str | None = None
    api_key: str | None = None
    scope_id: str | None = None
    holder: str | None = None
    run: str | None = None


class Runtime:
    """The client, its loop thread, and the run the module-level API uses."""

    def __init__(self, settings: Settings) -> None:
        # Validates the settings (ConfigError) before a thread starts.
        self.client = AsyncRunstate(
            base_url=settings.base_url, space_id=settings.space_id, api_key=settings.api_key, holder=settings.holder
        )
        # Long polls (waiting for a once entry or a job) get a connection pool of their own, so however
        # many callers wait, renewals and results of running work always find a connection.
        self.waits = AsyncRunstate(
            base_url=settings.base_url, space_id=settings.space_id, api_key=settings.api_key, holder=settings.holder
        )
        self._once_waits: dict[tuple[str, str], asyncio.Task[dict[str, Any]]] = {}
        # Answers for callers' loops, sent at the end of this turn of our loop (`_hand_back`).
        self._hand_backs: dict[asyncio.AbstractEventLoop, list[_HandBack]] = {}
        explicit = settings.scope_id if settings.scope_id is not None else os.environ.get(SCOPE_ID_ENV)
        self.explicit_scope_id = explicit.strip() if explicit and explicit.strip() else None
        named = settings.run if settings.run is not None else os.environ.get(RUN_ENV)
        # The named run used when no run id is given: RUNSTATE_RUN, else the space's default run.
        self.run_name = named.strip() if named and named.strip() else DEFAULT_RUN_NAME
        self.pid = os.getpid()
        self._default_scope_id: str | None = None
        self._default_lock: asyncio.Lock | None = None
        self._ensured_mailboxes: set[str] = set()
        self._closed = False
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="runstate-sdk", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    # -- running coroutines on the loop ---------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def in_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def submit(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coroutine` on the loop; its concurrent future (cancelling it cancels the task)."""
        if self._closed:
            coroutine.close()
            raise ConfigError("the runstate client is closed (runstate.close() was called)")
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run `coroutine` on the loop and block until it is done (from any thread but the loop's)."""
        if self.in_loop_thread():
            coroutine.close()
            raise ConfigError(
                "a blocking runstate call was made inside an async handler of serve(); use the async "
                "form (an async once function, await queue.asend(...))"
            )
        future = self.submit(coroutine)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # KeyboardInterrupt and the like: stop the request too
            raise

    async def arun(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Await `coroutine` run on the loop, from any event loop. Cancelling the await cancels it."""
        if self.in_loop_thread():
            return await coroutine
        caller_loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = caller_loop.create_future()
        future = self.submit(coroutine)
        future.add_done_callback(functools.partial(self._hand_back, caller_loop, answer))
        try:
            return await answer
        except asyncio.CancelledError:
            future.cancel()
            raise

    def _hand_back(self, caller_loop: asyncio.AbstractEventLoop, answer: asyncio.Future[Any], future: _Outcome) -> None:
        """`future` is done: settle `answer` on the caller's loop. The answers for one caller's loop
        that are done in the same turn of our loop (the callers of a process waiting on one once
        entry, woken by one long poll) cross to it in one `call_soon_threadsafe`, so its thread
        wakes once for all of them instead of once each, taking the GIL back and forth."""
        if not self.in_loop_thread():
            # Cancelled by the caller (or done before the callback was added): no batch to join.
            _call_on(caller_loop, _settle_answers, [(answer, future)])
            return
        batch = self._hand_backs.get(caller_loop)
        if batch is None:
            try:
                self.loop.call_soon(self._send_hand_backs, caller_loop)
            except RuntimeError:  # our loop is closed (shutting down): no later turn to wait for
                _call_on(caller_loop, _settle_answers, [(answer, future)])
                return
            batch = self._hand_backs[caller_loop] = []
        batch.append((answer, future))

    def _send_hand_backs(self, caller_loop: asyncio.AbstractEventLoop) -> None:
        _call_on(caller_loop, _settle_answers, self._hand_backs.pop(caller_loop, []))

    # -- the run --------------------------------------------------------------------------------

    async def scope_id(self) -> tuple[str, bool]:
        """The run to use and whether it is the default run. On the loop."""
        if self.explicit_scope_id is not None:
            return self.explicit_scope_id, False
        if self._default_scope_id is None:
            if self._default_lock is None:
                self._default_lock = asyncio.Lock()
            async with self._default_lock:
                if self._default_scope_id is None:
                    self._default_scope_id = (await self.client.scopes.named(self.run_name)).id
        return self._default_scope_id, True

    async def in_run(self, operation: Callable[[str], Awaitable[T]]) -> T:
        """`operation(run id)`, asking for a fresh default run and retrying once if the cached
        default run stopped (or is unknown). On the loop."""
        scope_id, is_default = await self.scope_id()
        try:
            return await operation(scope_id)
        except (ScopeCancelledError, DeadlineExceededError, NotFoundError):
            if not is_default:
                raise
            self.forget_default(scope_id)
            fresh_id, _ = await self.scope_id()
            return await operation(fresh_id)

    async def check_default_active(self, scope_id: str, effective: str | None = None) -> None:
        """If `scope_id` is the cached default run and it is no longer active, raise
        ScopeCancelledError (so `in_run` moves to the fresh default run). For answers that are
        given whether or not the run is active: an acquire of a once entry already DONE or FAILED, which
        says `effective` (asked with a read when it is not given). On the loop."""
        if self.explicit_scope_id is not None or self._default_scope_id != scope_id:
            return
        if effective is None:
            effective = (await self.client.scopes.status(scope_id)).get("effective", "ACTIVE")
        if effective != "ACTIVE":
            raise ScopeCancelledError(f"the default run {scope_id} is no longer active", status=None)

    def forget_default(self, scope_id: str) -> None:
        """The default run `scope_id` stopped: the next call asks for the current one."""
        if self._default_scope_id == scope_id:
            self._default_scope_id = None

    async def wait_once(self, scope_id: str, key: str) -> dict[str, Any]:
        """The once entry's view once it is not HELD (or after one long poll). Callers of this process
        waiting for the same entry share one long poll. On the loop."""
        shared_key = (scope_id, key)
        task = self._once_waits.get(shared_key)
        if task is None:
            task = asyncio.create_task(self.waits.once.wait(scope_id, key))
            self._once_waits[shared_key] = task
            task.add_done_callback(lambda done: self._once_waits.pop(shared_key, None))
        # Shielded: one caller giving up does not cancel the others' wait.
        return await asyncio.shield(task)

    async def ensure_mailbox(self, name: str) -> None:
        """Create the work queue `name` once per process. On the loop."""
        if name not in self._ensured_mailboxes:
            await self.client.mailboxes.ensure(name, mode="WORK")
            self._ensured_mailboxes.add(name)

    # -- closing --------------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel what still runs on the loop, close the session, stop the thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self.pid or not self._thread.is_alive():
            return  # an inherited copy after fork: the thread is not ours to stop
        if self.in_loop_thread():
            raise ConfigError("runstate.close() cannot be called from inside serve()'s async handlers")
        future = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        try:
            future.result(CLOSE_TIMEOUT_S)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(CLOSE_TIMEOUT_S)

    async def _shutdown(self) -> None:
        current = asyncio.current_task()
        others = [task for task in asyncio.all_tasks() if task is not current]
        for task in others:
            task.cancel()
        if others:
            await asyncio.wait(others, timeout=CLOSE_TIMEOUT_S)
        await self.client.aclose()
        await self.waits.aclose()


def _call_on(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:
        pass  # the caller's loop is closed: nobody awaits the answer any more


def _settle_answers(batch: list[_HandBack]) -> None:
    """On the caller's loop: each `answer` takes the outcome of its `future` (as asyncio.wrap_future)."""
    for answer, future in batch:
        if answer.done():
            continue
        if future.cancelled():
            answer.cancel()
            continue
        error = future.exception()
        if error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(future.result())


_lock = threading.Lock()
_settings = Settings()
_runtime: Runtime | None = None
_atexit_registered = False


def runtime() -> Runtime:
    """The process-wide runtime, created on first use (and again in a forked child)."""
    global _runtime, _atexit_registered
    current = _runtime
    if current is not None and current.pid == os.getpid():
        return current
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = Runtime(_settings)
            if not _atexit_registered:
                atexit.register(close)
                _atexit_registered = True
        return _runtime


def configure(
    base_url: str | Sequence[str] | None = None,
    space_id: str | None = None,
    api_key: str | None = None,
    scope_id: str | None = None,
    holder: str | None = None,
    run: str | None = None,
) -> None:
    """Set what `once`, `queue` and `serve` connect to, instead of (or over) the environment.

    `base_url` (a comma-separated list or a list of nodes), `space_id` and `api_key` fall back to
    RUNSTATE_BASE_URL, RUNSTATE_SPACE_ID and RUNSTATE_API_KEY; `scope_id` selects the run (else
    RUNSTATE_SCOPE_ID, else the active run named `run`, RUNSTATE_RUN or `default`: the space's
    default run, replaced by a fresh one of the same name once it stopped); `holder` names this process on leases
    (default `<hostname>:<pid>`). Closes the current process-wide client; the next call opens a new
    one. Raises ConfigError for a malformed setting.
    """
    global _settings
    if run is not None and (not isinstance(run, str) or not 0 < len(run.strip()) <= RUN_NAME_CHARS_MAX):
        raise ConfigError(f"run must be a name of 1 to {RUN_NAME_CHARS_MAX} characters, got {run!r}")
    settings = Settings(
        base_url=base_url, space_id=space_id, api_key=api_key, scope_id=scope_id, holder=holder, run=run
    )
    # Validate now, not at the first call.
    AsyncRunstate(base_url=base_url, space_id=space_id, api_key=api_key, holder=holder)
    with _lock:
        _settings = settings
    close()


def close() -> None:
    """Close the process-wide client (its connections and thread); the next call opens a new one.
    Called at interpreter exit; calls still waiting are cancelled."""
    global _runtime
    with _lock:
        current, _runtime = _runtime, None
    if current is not None:
        current.close()
