"""The process-wide clients behind `runstate.once`, `runstate.queue` and `runstate.serve`.

Created on first use from `runstate.configure(...)` or the environment (RUNSTATE_BASE_URL,
RUNSTATE_SPACE_ID, RUNSTATE_API_KEY, RUNSTATE_SCOPE_ID). Two kinds:

- `runtime()`: one per process, on an event loop in a daemon thread of its own. A sync caller
  blocks on its answer; `serve()` runs there; so do the renewals of a once function's lease, so an
  async function that blocks its own loop (a sync HTTP call inside `async def`) keeps its lease.
- `loop_runtime()`: one per event loop, for async calls (an async once function, `queue.asend`,
  `job.aresult`): their requests run on the caller's own loop, with no crossing to the thread and
  back (two wake-ups of an idle thread, ~0.3-0.5 ms each on a small virtual machine). Its
  connections close when that loop shuts down its async generators (`asyncio.run` does, and so do
  asyncio.Runner, anyio and pytest-asyncio): the runtime holds one, parked until then.

The user's function always runs in the caller's thread or task. The thread never keeps the
interpreter alive, and an atexit hook closes the clients. A forked child builds its own.

Which run: `configure(scope_id=...)`, else RUNSTATE_SCOPE_ID, else the active run named
`configure(run=...)`, RUNSTATE_RUN or `default` (the space's default run; `PUT /runs/{name}`),
asked once and cached for every runtime of the process. When a call answers SCOPE_CANCELLED,
DEADLINE_EXCEEDED or NOT_FOUND for the cached default run, the SDK asks for the default run again
(the server has replaced it by then) and retries the call once, so after a stop the next call of
every process lands in the same fresh run.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import os
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
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


@dataclass(frozen=True)
class Settings:
    base_url: str | Sequence[str] | None = None
    space_id: str | None = None
    api_key: str | None = None
    scope_id: str | None = None
    holder: str | None = None
    run: str | None = None
    ca_file: str | os.PathLike[str] | None = None
    client_cert: str | os.PathLike[str] | None = None
    client_key: str | os.PathLike[str] | None = None

    def client_arguments(self, space_id: str | None) -> dict[str, Any]:
        """What each AsyncRunstate of the module-level API is made with."""
        return {
            "base_url": self.base_url, "space_id": space_id, "api_key": self.api_key, "holder": self.holder,
            "ca_file": self.ca_file, "client_cert": self.client_cert, "client_key": self.client_key,
        }


class RunChoice:
    """Which run the module-level API uses, shared by every runtime of the process (the default
    run is asked once, not once per event loop), and the queues created so far."""

    def __init__(self, settings: Settings) -> None:
        explicit = settings.scope_id if settings.scope_id is not None else os.environ.get(SCOPE_ID_ENV)
        self.explicit_scope_id = explicit.strip() if explicit and explicit.strip() else None
        named = settings.run if settings.run is not None else os.environ.get(RUN_ENV)
        # The named run used when no run id is given: RUNSTATE_RUN, else the space's default run.
        self.run_name = named.strip() if named and named.strip() else DEFAULT_RUN_NAME
        self.default_scope_id: str | None = None
        self.ensured_mailboxes: set[str] = set()
        # The space, once a client learned it (from `GET /v1/whoami` when not configured): the
        # clients of later loops start with it instead of asking again.
        self.space_id: str | None = None


class LoopClients:
    """The clients of one event loop, and the module-level API's steps that run on it."""

    loop: asyncio.AbstractEventLoop

    def __init__(self, settings: Settings, choice: RunChoice) -> None:
        space_id = settings.space_id if settings.space_id is not None else choice.space_id
        # Validates the settings (ConfigError) before anything starts.
        self.client = AsyncRunstate(**settings.client_arguments(space_id))
        # Long polls (waiting for a once entry or a job) get a connection pool of their own, so however
        # many callers wait, renewals and results of running work always find a connection.
        self.waits = AsyncRunstate(**settings.client_arguments(space_id))
        self.choice = choice
        self.pid = os.getpid()
        self._once_waits: dict[tuple[str, str], asyncio.Task[dict[str, Any]]] = {}
        self._default_lock: asyncio.Lock | None = None
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the run --------------------------------------------------------------------------------

    async def scope_id(self) -> tuple[str, bool]:
        """The run to use and whether it is the default run. On the loop."""
        choice = self.choice
        if choice.explicit_scope_id is not None:
            return choice.explicit_scope_id, False
        if choice.default_scope_id is None:
            if self._default_lock is None:
                self._default_lock = asyncio.Lock()
            async with self._default_lock:
                if choice.default_scope_id is None:
                    choice.default_scope_id = (await self.client.scopes.named(choice.run_name)).id
        return choice.default_scope_id, True

    async def in_run(self, operation: Callable[[str], Awaitable[T]]) -> T:
        """`operation(run id)`, asking for a fresh default run and retrying once if the cached
        default run stopped (or is unknown). On the loop."""
        scope_id, is_default = await self.scope_id()
        try:
            done = await operation(scope_id)
        except (ScopeCancelledError, DeadlineExceededError, NotFoundError):
            if not is_default:
                raise
            self.forget_default(scope_id)
            fresh_id, _ = await self.scope_id()
            done = await operation(fresh_id)
        if self.choice.space_id is None:
            self.choice.space_id = self.client.space_id
        return done

    async def check_default_active(self, scope_id: str, effective: str | None = None) -> None:
        """If `scope_id` is the cached default run and it is no longer active, raise
        ScopeCancelledError (so `in_run` moves to the fresh default run). For answers that are
        given whether or not the run is active: an acquire of a once entry already DONE or FAILED, which
        says `effective` (asked with a read when it is not given). On the loop."""
        if self.choice.explicit_scope_id is not None or self.choice.default_scope_id != scope_id:
            return
        if effective is None:
            effective = (await self.client.scopes.status(scope_id)).get("effective", "ACTIVE")
        if effective != "ACTIVE":
            raise ScopeCancelledError(f"the default run {scope_id} is no longer active", status=None)

    def forget_default(self, scope_id: str) -> None:
        """The default run `scope_id` stopped: the next call asks for the current one."""
        if self.choice.default_scope_id == scope_id:
            self.choice.default_scope_id = None

    async def wait_once(self, scope_id: str, key: str) -> dict[str, Any]:
        """The once entry's view once it is not HELD (or after one long poll). Callers on this loop
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
        if name not in self.choice.ensured_mailboxes:
            await self.client.mailboxes.ensure(name, mode="WORK")
            self.choice.ensured_mailboxes.add(name)

    async def _close_clients(self) -> None:
        await self.client.aclose()
        await self.waits.aclose()


class Runtime(LoopClients):
    """The process's clients on an event loop in a daemon thread of their own: for sync callers,
    `serve()`, and the renewals of once leases."""

    def __init__(self, settings: Settings, choice: RunChoice) -> None:
        super().__init__(settings, choice)
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
        return await asyncio.wrap_future(self.submit(coroutine))

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
        await self._close_clients()


class LoopRuntime(LoopClients):
    """The clients of one caller's event loop, for its async calls (`loop_runtime()`)."""

    def __init__(self, settings: Settings, choice: RunChoice, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(settings, choice)
        self.loop = loop
        # Parked until the loop shuts down its async generators, then closes the clients.
        self._until_loop_ends: AsyncIterator[None] | None = None

    async def hold_until_loop_ends(self) -> None:
        """Start the async generator whose end closes the clients. The loop tracks it from its
        first step (its first-iteration hook) and closes it in `shutdown_asyncgens`. Its finalizer,
        should it be collected unfinished, skips a loop already closed (the loop's own would raise
        there, printed as an ignored exception): its clients were never closed then, and asyncio
        warns of their transports."""
        loop = self.loop
        hooks = sys.get_asyncgen_hooks()
        loop_finalizer = hooks.finalizer

        def finalize(generator: Any) -> None:
            if loop_finalizer is not None and not loop.is_closed():
                loop_finalizer(generator)

        self._until_loop_ends = self._close_at_loop_end()
        sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=finalize)
        try:
            step = self._until_loop_ends.__anext__()
        finally:
            sys.set_asyncgen_hooks(*hooks)
        await step

    async def _close_at_loop_end(self) -> AsyncIterator[None]:
        try:
            yield
        finally:
            _forget_loop_runtime(self)
            await self.aclose()

    async def aclose(self) -> None:
        """Close the clients (idempotent). Calls still using them end with ConfigError."""
        if not self._closed:
            self._closed = True
            await self._close_clients()

    def close_soon(self) -> None:
        """Close the clients from any thread: on the loop, soon (their close must run there)."""
        if self._closed or os.getpid() != self.pid or self.loop.is_closed():
            self._closed = True
            return  # a closed loop cannot close them any more; a forked child's are not ours
        try:
            self.loop.call_soon_threadsafe(_start_closing, self)
        except RuntimeError:
            self._closed = True  # closed meanwhile


def _start_closing(runtime: LoopRuntime) -> None:
    task = runtime.loop.create_task(runtime.aclose())
    _closing.add(task)
    task.add_done_callback(_closing.discard)


_lock = threading.Lock()
_settings = Settings()
_choice: RunChoice | None = None
_runtime: Runtime | None = None
# Loop runtimes by their loop; one leaves when its loop shuts down or at close().
_loop_runtimes: dict[asyncio.AbstractEventLoop, LoopRuntime] = {}
_closing: set[asyncio.Task[None]] = set()  # loop runtimes closing (close_soon): kept until done
_atexit_registered = False


def _run_choice() -> RunChoice:
    """Under `_lock`: the process's run choice, made for the current settings on first use."""
    global _choice
    if _choice is None:
        _choice = RunChoice(_settings)
    return _choice


def _on_first_runtime() -> None:
    """Under `_lock`."""
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(close)
        _atexit_registered = True


def runtime() -> Runtime:
    """The process-wide runtime on its own thread, created on first use (and again in a forked child)."""
    global _runtime
    current = _runtime
    if current is not None and current.pid == os.getpid():
        return current
    with _lock:
        if _runtime is None or _runtime.pid != os.getpid():
            _runtime = Runtime(_settings, _run_choice())
            _on_first_runtime()
        return _runtime


async def loop_runtime() -> LoopClients:
    """The runtime for an async call: the caller's loop's own (created on its first call there),
    or the thread's runtime when the caller runs on its loop (an async handler of `serve()`)."""
    loop = asyncio.get_running_loop()
    found = _loop_runtimes.get(loop)
    if found is not None and found.pid == os.getpid():
        return found
    current = _runtime
    if current is not None and current.loop is loop:
        return current
    with _lock:
        if any(made.pid != os.getpid() for made in _loop_runtimes.values()):
            _loop_runtimes.clear()  # a forked child: its parent's loops are not its own
        for closed in [other for other in _loop_runtimes if other.is_closed()]:
            del _loop_runtimes[closed]  # closed without shutting down its async generators
        made = _loop_runtimes[loop] = LoopRuntime(_settings, _run_choice(), loop)
        _on_first_runtime()
    await made.hold_until_loop_ends()
    return made


def _forget_loop_runtime(runtime: LoopRuntime) -> None:
    with _lock:
        if _loop_runtimes.get(runtime.loop) is runtime:
            del _loop_runtimes[runtime.loop]


def configure(
    base_url: str | Sequence[str] | None = None,
    space_id: str | None = None,
    api_key: str | None = None,
    scope_id: str | None = None,
    holder: str | None = None,
    run: str | None = None,
    ca_file: str | os.PathLike[str] | None = None,
    client_cert: str | os.PathLike[str] | None = None,
    client_key: str | os.PathLike[str] | None = None,
) -> None:
    """Set what `once`, `queue` and `serve` connect to, instead of (or over) the environment.

    `base_url` (a comma-separated list or a list of nodes), `space_id` and `api_key` fall back to
    RUNSTATE_BASE_URL, RUNSTATE_SPACE_ID and RUNSTATE_API_KEY; `scope_id` selects the run (else
    RUNSTATE_SCOPE_ID, else the active run named `run`, RUNSTATE_RUN or `default`: the space's
    default run, replaced by a fresh one of the same name once it stopped); `holder` names this process on leases
    (default `<hostname>:<pid>`); `ca_file`, `client_cert` and `client_key` (else RUNSTATE_CA_FILE,
    RUNSTATE_CLIENT_CERT, RUNSTATE_CLIENT_KEY) are the TLS files, as `AsyncRunstate` takes them.
    Closes the current process-wide client; the next call opens a new
    one. Raises ConfigError for a malformed setting.
    """
    global _settings
    if run is not None and (not isinstance(run, str) or not 0 < len(run.strip()) <= RUN_NAME_CHARS_MAX):
        raise ConfigError(f"run must be a name of 1 to {RUN_NAME_CHARS_MAX} characters, got {run!r}")
    settings = Settings(
        base_url=base_url, space_id=space_id, api_key=api_key, scope_id=scope_id, holder=holder, run=run,
        ca_file=ca_file, client_cert=client_cert, client_key=client_key,
    )
    # Validate now, not at the first call.
    AsyncRunstate(**settings.client_arguments(space_id))
    with _lock:
        _settings = settings
    close()


def close() -> None:
    """Close the process's clients (their connections and the SDK's thread); the next call opens
    new ones. Called at interpreter exit. Calls still waiting on the thread are cancelled; async
    calls still waiting on another loop end with ConfigError (its clients close on that loop)."""
    global _runtime, _choice
    with _lock:
        current, _runtime, _choice = _runtime, None, None
        on_loops = list(_loop_runtimes.values())
        _loop_runtimes.clear()
    for made in on_loops:
        made.close_soon()
    if current is not None:
        current.close()
