"""`runstate.once` against a real dev node, in one process: decorator forms, sync and async,
waiting callers, failures and attempts, results too large, a lease taken over, the default run."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import runstate
from runstate.sdk import once_calls as once_module
from runstate.sdk.errors import ConfigError, LeaseLostError, OnceFailedError, ResultTooLargeError

from tests._http import Api, configured_run
from tests._nodes import DevNode
from tests._prometheus import scrape, value

BARRIER_TIMEOUT_S = 30.0
# An async function blocking its loop for over two of its leases (renewed every third of one).
BLOCKING_LEASE_S = 2
BLOCKING_S = 4.5


@pytest.fixture
def run_id(dev_node: DevNode) -> Iterator[str]:
    """A fresh run, used by the module-level API of this process for the test."""
    yield from configured_run(dev_node.url)


def in_threads(count: int, call: Any) -> list[Any]:
    """Run `call()` in `count` threads at once; their results (or exceptions) in order."""
    results: list[Any] = [None] * count
    start = threading.Barrier(count)

    def target(index: int) -> None:
        start.wait(BARRIER_TIMEOUT_S)
        try:
            results[index] = call()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            results[index] = exc

    threads = [threading.Thread(target=target, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_decorator_forms(run_id: str) -> None:
    def plain(x: int) -> int:
        return x + 1

    @runstate.once
    def bare(x: int) -> int:
        return x + 2

    @runstate.once()
    def called(x: int) -> int:
        return x + 3

    @runstate.once(name="named", attempts=1, lease="500ms")
    def named(x: int) -> int:
        return x + 4

    wrapped = runstate.once(plain)
    renamed = runstate.once(lambda x: x * 10, name="times-ten")
    assert (wrapped(1), bare(1), called(1), named(1), renamed(1)) == (2, 3, 4, 5, 10)
    assert wrapped.__name__ == "plain" and wrapped.once_name == "plain"
    assert named.once_name == "named" and named.once_attempts == 1 and named.once_lease_ms == 500
    assert called.once_attempts == 3 and called.once_lease_ms == 30_000
    with pytest.raises(ConfigError, match="name"):
        runstate.once(lambda x: x)
    with pytest.raises(ConfigError, match="attempts"):
        runstate.once(attempts=0)(plain)
    with pytest.raises(ConfigError, match="lease"):
        runstate.once(lease="forever")(plain)


def test_same_key_runs_once_and_every_caller_gets_the_result(run_id: str) -> None:
    runs: list[str] = []
    release = threading.Event()

    @runstate.once
    def research_company(name: str) -> dict[str, Any]:
        runs.append(name)
        release.wait(BARRIER_TIMEOUT_S)
        context = runstate.context()
        return {"name": name, "attempt": context.attempt, "sources": ("web", "news")}

    threading.Timer(0.3, release.set).start()
    results = in_threads(8, lambda: research_company("acme"))
    assert runs == ["acme"]
    assert results == [{"name": "acme", "attempt": 1, "sources": ["web", "news"]}] * 8
    # A later call gets the recorded result straight away.
    assert research_company(name="acme") == results[0]
    assert runs == ["acme"]


def test_different_keys_run_in_parallel(run_id: str) -> None:
    both_running = threading.Barrier(2)

    @runstate.once
    def research(name: str) -> str:
        both_running.wait(BARRIER_TIMEOUT_S)  # breaks (an error) if the two calls were serialized
        return name.upper()

    names = iter(["acme", "globex"])
    lock = threading.Lock()

    def call() -> str:
        with lock:
            name = next(names)
        return research(name)

    assert sorted(in_threads(2, call)) == ["ACME", "GLOBEX"]


def test_async_functions(run_id: str) -> None:
    runs: list[str] = []

    @runstate.once(name="summarize")
    async def summarize(topic: str) -> str:
        runs.append(topic)
        await asyncio.sleep(0.2)
        assert runstate.context().attempt == 1
        return f"summary of {topic}"

    async def main() -> list[str]:
        return list(await asyncio.gather(*(summarize("raft") for _ in range(10))))

    assert asyncio.run(main()) == ["summary of raft"] * 10
    # Another event loop (asyncio.run closes its loop): the process-wide client still works.
    assert asyncio.run(summarize("raft")) == "summary of raft"
    assert runs == ["raft"]


def test_async_callers_on_several_loops_one_cancelled(run_id: str) -> None:
    """Callers on several loops (each with its own clients) get the result; a cancelled caller gets
    CancelledError and the others of its loop still get it; an exception reaches its caller."""
    started = threading.Event()
    release = threading.Event()

    @runstate.once(name="fan-out")
    async def slow(topic: str) -> str:
        started.set()
        await asyncio.get_running_loop().run_in_executor(None, release.wait, BARRIER_TIMEOUT_S)
        return f"report on {topic}"

    @runstate.once(name="broken", attempts=1)
    async def broken() -> str:
        raise KeyError("nothing here")

    runner: list[Any] = []
    runner_thread = threading.Thread(target=lambda: runner.append(asyncio.run(slow("raft"))))
    runner_thread.start()
    assert started.wait(BARRIER_TIMEOUT_S)

    async def callers(count: int, cancel_one: bool) -> list[Any]:
        tasks = [asyncio.create_task(slow("raft")) for _ in range(count)]
        if cancel_one:
            await asyncio.sleep(0)
            tasks[0].cancel()
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    outcomes: dict[str, list[Any]] = {}

    def in_own_loop(name: str, cancel_one: bool) -> None:
        outcomes[name] = asyncio.run(callers(8, cancel_one))

    loops = [threading.Thread(target=in_own_loop, args=(name, name == "a")) for name in ("a", "b")]
    for thread in loops:
        thread.start()
    threading.Timer(0.3, release.set).start()
    for thread in [*loops, runner_thread]:
        thread.join()
    assert runner == ["report on raft"]
    assert isinstance(outcomes["a"][0], asyncio.CancelledError)
    assert outcomes["a"][1:] == ["report on raft"] * 7
    assert outcomes["b"] == ["report on raft"] * 8
    with pytest.raises(KeyError, match="nothing here"):
        asyncio.run(broken())
    with pytest.raises(OnceFailedError):
        asyncio.run(broken())


def _sdk_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "runstate-sdk"]


def _open_sockets() -> int:
    """The process's open sockets (Linux)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except FileNotFoundError:  # the directory's own descriptor, closed once listed
            continue
    return count


def _whoami_asked(node: DevNode) -> float:
    samples, _ = scrape(node.url)
    return value(samples, "runstate_http_requests_total", method="GET", route="/v1/whoami", status="200")


def test_async_calls_run_on_their_own_loop_and_its_end_closes_their_connections(
    run_id: str, dev_node: DevNode
) -> None:
    """An async call's requests run on the caller's loop, not on the SDK's thread, and the clients
    made for that loop close when `asyncio.run` ends it; the clients of later loops start with the
    space the first ones learned."""

    @runstate.once(name="on-the-loop")
    async def report(topic: str) -> str:
        return f"report on {topic}"

    assert asyncio.run(report("raft")) == "report on raft"  # ran it: its renewals started the thread
    runstate.close()  # ends the thread; the configured run stays
    assert _sdk_threads() == []
    assert asyncio.run(report("raft")) == "report on raft"
    sockets_before, whoami_before = _open_sockets(), _whoami_asked(dev_node)
    for _ in range(3):  # three loops one after the other: clients of their own, closed at their end
        assert asyncio.run(report("raft")) == "report on raft"
    assert _sdk_threads() == []  # the recorded result came without the SDK's thread
    gc.collect()
    assert _open_sockets() == sockets_before
    assert _whoami_asked(dev_node) == whoami_before


def test_an_async_function_that_blocks_its_loop_keeps_its_lease(run_id: str) -> None:
    """The lease of an async function is renewed from the SDK's thread: a blocking call inside it
    (a sync client in `async def`), longer than the lease, does not let a waiter take the work over."""
    started = threading.Event()

    @runstate.once(name="blocking", lease=f"{BLOCKING_LEASE_S}s", attempts=5)
    async def blocking(topic: str) -> str:
        started.set()
        time.sleep(BLOCKING_S)  # noqa: ASYNC251 - the loop does not turn: the point of the test
        return f"{topic} on attempt {runstate.context().attempt}"

    waiter: list[Any] = []

    def wait_on_own_loop() -> None:
        assert started.wait(BARRIER_TIMEOUT_S)
        waiter.append(_outcome(lambda: asyncio.run(blocking("raft"))))

    thread = threading.Thread(target=wait_on_own_loop)
    thread.start()
    assert asyncio.run(blocking("raft")) == "raft on attempt 1"
    thread.join()
    assert waiter == ["raft on attempt 1"]


def test_async_callers_of_one_loop_share_one_acquire_and_retry_after_a_failure(
    run_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Callers of one loop waiting for a key held elsewhere send one acquire between them; after a
    failed attempt of their own loop, the next of them tries and the rest get its result."""
    acquires: list[str] = []
    real_acquire = once_module.OnceCalls.acquire

    async def counting_acquire(
        self: once_module.OnceCalls, scope_id: str, key: str, *args: Any, **kwargs: Any
    ) -> Any:
        acquires.append(key)
        return await real_acquire(self, scope_id, key, *args, **kwargs)

    monkeypatch.setattr(once_module.OnceCalls, "acquire", counting_acquire)
    started = threading.Event()
    release = threading.Event()
    attempts_seen: list[int] = []

    @runstate.once(name="shared-wait")
    async def report(topic: str) -> str:
        attempt = runstate.context().attempt
        attempts_seen.append(attempt)
        if attempt == 1:
            started.set()
            await asyncio.get_running_loop().run_in_executor(None, release.wait, BARRIER_TIMEOUT_S)
            raise RuntimeError("first attempt breaks")
        if attempt == 2:
            return f"{topic} on attempt 2"
        raise AssertionError("a third attempt")

    async def failing_runner_and_callers() -> list[Any]:
        runner = asyncio.create_task(report("raft"))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, BARRIER_TIMEOUT_S)
        callers = [asyncio.create_task(report("raft")) for _ in range(6)]
        threading.Timer(0.3, release.set).start()
        return list(await asyncio.gather(runner, *callers, return_exceptions=True))

    outcomes = asyncio.run(failing_runner_and_callers())
    assert isinstance(outcomes[0], RuntimeError)
    assert outcomes[1:] == ["raft on attempt 2"] * 6
    assert attempts_seen == [1, 2]

    acquires.clear()
    first: list[Any] = []
    runner_thread = threading.Thread(
        target=lambda: first.append(_outcome(lambda: asyncio.run(report("paxos"))))
    )
    started.clear()
    release.clear()
    runner_thread.start()  # attempt 1 of "paxos" in another thread (its own loop) ...
    assert started.wait(BARRIER_TIMEOUT_S)
    acquires.clear()

    async def waiting_callers() -> list[Any]:
        callers = [asyncio.create_task(report("paxos")) for _ in range(6)]
        threading.Timer(0.3, release.set).start()
        return list(await asyncio.gather(*callers, return_exceptions=True))

    # ... fails; one of these six gets attempt 2 and the other five its result.
    assert sorted(map(str, asyncio.run(waiting_callers()))) == ["paxos on attempt 2"] * 6
    runner_thread.join()
    assert isinstance(first[0], RuntimeError)
    # First one acquire for all six (HELD), then after the failure the next tries (GRANTED) and
    # the other five acquire once more between them (HELD, then DONE through one long poll).
    assert len(acquires) == 3


def test_failures_go_to_their_caller_then_once_failed(run_id: str) -> None:
    attempts_seen: list[int] = []

    @runstate.once(attempts=2)
    def flaky(name: str) -> str:
        attempts_seen.append(runstate.context().attempt)
        raise ValueError(f"no luck with {name} (attempt {attempts_seen[-1]})")

    with pytest.raises(ValueError, match="attempt 1"):
        flaky("acme")
    with pytest.raises(ValueError, match="attempt 2"):
        flaky("acme")
    for _ in range(2):
        with pytest.raises(OnceFailedError) as caught:
            flaky("acme")
        assert caught.value.attempts == 2
        assert "no luck with acme (attempt 2)" in str(caught.value)
        assert caught.value.key == flaky.once_key("acme")
    assert attempts_seen == [1, 2]


def test_a_failure_lets_the_next_waiting_caller_try(run_id: str) -> None:
    started = threading.Event()
    release = threading.Event()
    attempts_seen: list[int] = []

    @runstate.once
    def fragile(name: str) -> str:
        attempt = runstate.context().attempt
        attempts_seen.append(attempt)
        if attempt == 1:
            started.set()
            release.wait(BARRIER_TIMEOUT_S)
            raise RuntimeError("first attempt breaks")
        return f"{name} on attempt {attempt}"

    first: list[Any] = []
    runner = threading.Thread(target=lambda: first.append(_outcome(lambda: fragile("x"))))
    runner.start()
    assert started.wait(BARRIER_TIMEOUT_S)
    threading.Timer(0.3, release.set).start()
    waiter_result = fragile("x")  # waits for the first, then tries itself
    runner.join()
    assert isinstance(first[0], RuntimeError)
    assert waiter_result == "x on attempt 2"
    assert attempts_seen == [1, 2]


def _outcome(call: Any) -> Any:
    try:
        return call()
    except Exception as exc:  # noqa: BLE001
        return exc


def test_result_too_large_and_not_json(run_id: str) -> None:
    @runstate.once(attempts=1)
    def big(n: int) -> str:
        return "x" * n

    with pytest.raises(ResultTooLargeError, match="65536"):
        big(70_000)
    # Its attempt was recorded as failed: the next caller learns it.
    with pytest.raises(OnceFailedError, match="ResultTooLargeError"):
        big(70_000)
    assert len(big(60_000)) == 60_000

    @runstate.once
    def odd() -> object:
        return object()

    with pytest.raises(ConfigError, match="result"):
        odd()


def test_context_outside_a_call() -> None:
    with pytest.raises(ConfigError, match="only available inside"):
        runstate.context()
    assert runstate.current_context() is None


@pytest.fixture
def stop_renewing(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Once set, this process's once renewals never answer (as if the runner were frozen)."""
    stop = threading.Event()
    real_renew = once_module.OnceCalls.renew

    async def renew(self: once_module.OnceCalls, scope_id: str, key: str, token: str, lease_seconds: int) -> dict[str, Any]:
        if stop.is_set():
            await asyncio.Event().wait()  # never answers; cancelled when the call ends
        return await real_renew(self, scope_id, key, token, lease_seconds)

    monkeypatch.setattr(once_module.OnceCalls, "renew", renew)
    return stop


def test_a_lease_taken_over_is_lost(run_id: str, stop_renewing: threading.Event) -> None:
    """The runner's renewals stop (as if it were frozen): a waiting caller takes over at attempt 2,
    and the runner's late result is refused with LeaseLostError, its signal set."""
    taken_over = threading.Event()
    signals: list[threading.Event] = []

    @runstate.once(lease="1s", attempts=5)
    def slow(name: str) -> str:
        context = runstate.context()
        if context.attempt == 1:
            signals.append(context.signal)
            stop_renewing.set()
            taken_over.wait(BARRIER_TIMEOUT_S)
            return "late result"
        stop_renewing.clear()
        taken_over.set()
        return f"taken over at attempt {context.attempt}"

    first: list[Any] = []
    runner = threading.Thread(target=lambda: first.append(_outcome(lambda: slow("acme"))))
    runner.start()
    while not signals:
        taken_over.wait(0.01)
    assert slow("acme") == "taken over at attempt 2"
    runner.join()
    assert isinstance(first[0], LeaseLostError), first
    assert signals[0].is_set()
    assert slow("acme") == "taken over at attempt 2"


def test_an_async_once_whose_lease_is_taken_over_gets_lease_lost(run_id: str, stop_renewing: threading.Event) -> None:
    """The same takeover with an `async def` function, runner and taker in one event loop."""
    signals: list[Any] = []

    async def scenario() -> None:
        taken_over = asyncio.Event()

        @runstate.once(lease="1s", attempts=5)
        async def slow(name: str) -> str:
            context = runstate.context()
            if context.attempt == 1:
                signals.append(context.signal)
                stop_renewing.set()
                await asyncio.wait_for(taken_over.wait(), BARRIER_TIMEOUT_S)
                return "late result"
            stop_renewing.clear()
            taken_over.set()
            return f"taken over at attempt {context.attempt}"

        runner = asyncio.create_task(slow("acme-async"))
        while not signals:
            await asyncio.sleep(0.01)
        assert await slow("acme-async") == "taken over at attempt 2"
        with pytest.raises(LeaseLostError):
            await runner
        assert signals[0].is_set()
        assert await slow("acme-async") == "taken over at attempt 2"

    asyncio.run(scenario())


def test_default_run_is_replaced_after_a_stop(dev_node: DevNode, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNSTATE_SCOPE_ID", raising=False)
    api = Api(dev_node.url)
    runstate.configure(base_url=dev_node.url)
    runs: list[int] = []
    try:

        @runstate.once(name="default-run-probe")
        def probe() -> int:
            runs.append(1)
            return len(runs)

        first = probe()
        assert probe() == first
        default_id = api.ok("PUT", "/v1/runs/default")["id"]
        api.ok("POST", f"/v1/scopes/{default_id}/cancel", {"reason": "test"})
        # The cached default run is stopped: the next call starts a fresh run and runs again.
        assert probe() == first + 1
        assert api.ok("PUT", "/v1/runs/default")["id"] != default_id
    finally:
        runstate.close()


SPEC_ONCE_SAMPLES = '''
import runstate


@runstate.once
def research_company(name: str) -> dict: ...


# Any number of agents can call this. The function runs once; they all get its result.
report = research_company("acme")


@runstate.once(name="research", key=lambda company, http: company.domain)
def research(company: Company, http: HttpClient) -> dict: ...


@runstate.once(attempts=5)
def research_company(name: str) -> dict: ...


try:
    research_company("acme")
except runstate.OnceFailedError as err:
    print(f"gave up after {err.attempts} attempts: {err}")


@runstate.once
def write_report(name: str) -> list:
    signal = runstate.context().signal
    sections = []
    for part in PARTS:
        if signal.is_set():
            raise RuntimeError("stopping")
        sections.append(write_section(name, part))
    return sections
'''


def run_the_spec_samples() -> None:
    """The spec's once samples, verbatim, against the configured module-level API."""
    namespace: dict[str, Any] = {
        "Company": object, "HttpClient": object, "PARTS": ["intro", "body"],
        "write_section": lambda name, part: f"{part} of {name}",
    }
    exec(SPEC_ONCE_SAMPLES, namespace)  # noqa: S102 - the documentation's code, verbatim
    assert namespace["report"] is None
    assert namespace["write_report"]("acme") == ["intro of acme", "body of acme"]


def test_the_spec_samples_as_written(run_id: str) -> None:
    run_the_spec_samples()
