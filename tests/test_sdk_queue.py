"""`runstate.queue` and `serve` against a real dev node, in one process: submit and wait, the same
input is the same job, failures, async handlers, serve() ending with its run."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import runstate
from runstate.sdk import queue as queue_module
from runstate.sdk.errors import ConfigError, ScopeCancelledError, TaskFailedError

from tests._http import Api, configured_run
from tests._nodes import DevNode

JOIN_TIMEOUT_S = 60.0


@pytest.fixture
def run_id(dev_node: DevNode) -> Iterator[str]:
    yield from configured_run(dev_node.url)


class Worker:
    """`runstate.serve(*queues)` in a thread; it returns when the run stops."""

    def __init__(self, *queues: runstate.Queue) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, args=queues, daemon=True)
        self.thread.start()

    def _serve(self, *queues: runstate.Queue) -> None:
        try:
            runstate.serve(*queues)
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def join(self) -> None:
        self.thread.join(JOIN_TIMEOUT_S)
        assert not self.thread.is_alive(), "serve() did not return after its run stopped"
        assert self.error is None, self.error


def test_submit_wait_and_the_same_job(run_id: str, dev_node: DevNode) -> None:
    seen: list[tuple[Any, int, str]] = []

    @runstate.queue("sdk-squares", concurrency=4)
    def square(input: dict[str, int]) -> dict[str, int]:
        context = runstate.context()
        seen.append((input["n"], context.attempt, context.run_id))
        return {"square": input["n"] ** 2}

    worker = Worker(square)
    try:
        assert square({"n": 7}) == {"square": 49}
        job = square.send({"n": 3})
        again = square.send({"n": 3})
        assert job.id == again.id and job.created is True and again.created is False
        assert job.key == square.key_of({"n": 3}) == again.key
        assert job.result() == {"square": 9} == again.result(timeout=30)
        assert square({"n": 3}) == {"square": 9}
        assert sorted(seen) == [(3, 1, run_id), (7, 1, run_id)]
    finally:
        Api(dev_node.url).ok("POST", f"/v1/scopes/{run_id}/cancel", {})
        worker.join()


def test_key_decides_what_is_the_same_job(run_id: str, dev_node: DevNode) -> None:
    # The spec's example: the input carries a timestamp that must not make it new work.
    @runstate.queue("sdk-keyed", key=lambda input: input["company"])
    def research(input: dict[str, str]) -> str:
        return f"report on {input['company']}"

    first = research.send({"company": "acme", "requestedAt": "2026-11-29T10:00:00Z"})
    assert research.send({"company": "acme", "requestedAt": "2026-11-29T10:05:00Z"}).id == first.id
    assert research.send({"company": "globex", "requestedAt": "2026-11-29T10:00:00Z"}).id != first.id
    worker = Worker(research)
    try:
        assert first.result() == "report on acme"
    finally:
        Api(dev_node.url).ok("POST", f"/v1/scopes/{run_id}/cancel", {})
        worker.join()


def test_failures_retry_then_task_failed(run_id: str, dev_node: DevNode) -> None:
    attempts: list[int] = []

    @runstate.queue("sdk-failing", attempts=2)
    def failing(input: str) -> None:
        attempts.append(runstate.context().attempt)
        raise RuntimeError(f"cannot do {input}")

    @runstate.queue("sdk-too-big", attempts=1)
    def too_big(input: int) -> str:
        return "x" * input

    worker = Worker(failing, too_big)
    try:
        with pytest.raises(TaskFailedError) as caught:
            failing("this")
        assert caught.value.attempts == 2
        assert "cannot do this" in str(caught.value)
        assert attempts == [1, 2]
        with pytest.raises(TaskFailedError, match="ResultTooLargeError"):
            too_big(70_000)
    finally:
        Api(dev_node.url).ok("POST", f"/v1/scopes/{run_id}/cancel", {})
        worker.join()


def test_async_handler_and_serve_async(run_id: str, dev_node: DevNode) -> None:
    @runstate.queue("sdk-async", concurrency=8)
    async def shout(input: str) -> str:
        await asyncio.sleep(0.05)
        return input.upper() + f"@{runstate.context().attempt}"

    async def main() -> list[str]:
        server = asyncio.create_task(runstate.serve_async(shout))
        direct = await asyncio.gather(*(shout(word) for word in ["a", "b", "c"]))
        job = await shout.asend("d")
        later = await job.aresult(timeout=30)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: Api(dev_node.url).ok("POST", f"/v1/scopes/{run_id}/cancel", {}))
        await asyncio.wait_for(server, JOIN_TIMEOUT_S)  # serve_async returns once the run stopped
        return [*direct, later]

    assert asyncio.run(main()) == ["A@1", "B@1", "C@1", "D@1"]


def test_a_cancelled_run_cancels_waiting_callers(run_id: str, dev_node: DevNode) -> None:
    @runstate.queue("sdk-unserved")
    def never(input: int) -> int:
        raise AssertionError("no worker runs")

    job = never.send(1)
    Api(dev_node.url).ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    with pytest.raises(ScopeCancelledError, match="cancelled"):
        job.result(timeout=30)
    with pytest.raises(ScopeCancelledError):
        never.send(2)  # an explicitly chosen run is not replaced


def test_serve_needs_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queue_module, "_queues", {})
    with pytest.raises(ConfigError, match="no queue"):
        runstate.serve()
    with pytest.raises(ConfigError, match="concurrency"):
        runstate.queue("bad", concurrency=0)(lambda input: input)
    with pytest.raises(ConfigError, match="attempts"):
        runstate.queue("bad", attempts=101)(lambda input: input)
