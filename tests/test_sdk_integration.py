"""The SDK against a real `runstate dev` process (the `dev_node` fixture of tests/conftest.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import pytest
import runstate
from runstate import AsyncRunstate, Runstate
from runstate.sdk import _consume
from runstate.sdk._interrupt import INTERRUPTED_MESSAGE

from tests._nodes import free_port

pytestmark = pytest.mark.slow

T = TypeVar("T")

# How long a consume() may take to notice that its run stopped (one long-poll receive and more).
CONSUME_STOP_WITHIN_S = 25.0


def run(main: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(main())  # type: ignore[arg-type]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- the quickstart, verbatim (the same files the docs show: tests/quickstart/) ---------------

QUICKSTART = Path(__file__).parent / "quickstart"


def test_quickstart_scripts_run_unchanged(dev_node: Any, tmp_path: Path) -> None:
    for name in ("producer.py", "worker.py"):
        (tmp_path / name).write_text((QUICKSTART / name).read_text())
    env = {**os.environ, "RUNSTATE_BASE_URL": dev_node.url}
    env.pop("RUNSTATE_SPACE_ID", None)
    env.pop("RUNSTATE_API_KEY", None)
    producer = subprocess.Popen(
        [sys.executable, "producer.py"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    worker: subprocess.Popen[str] | None = None
    try:
        assert producer.stdout is not None
        first = producer.stdout.readline().strip()
        assert first.startswith("RUNSTATE_SCOPE_ID="), first + (
            producer.stderr.read() if producer.stderr else ""
        )
        worker = subprocess.Popen(
            [sys.executable, "worker.py"],
            cwd=tmp_path,
            env={**env, "RUNSTATE_SCOPE_ID": first.split("=", 1)[1]},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Ctrl-C as in a terminal, whatever this test process does with SIGINT.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        # Not communicate(): it reads the pipe underneath the text buffer, and loses a line that
        # readline() above had already buffered (the submit line, when it came with the first).
        producer.wait(timeout=60)  # the output is a few lines: the pipe never fills
        assert producer.stdout is not None and producer.stderr is not None
        out, err = producer.stdout.read(), producer.stderr.read()
        assert producer.returncode == 0, err
        lines = out.strip().splitlines()
        assert lines[0].startswith("task ") and lines[0].endswith("submitted, waiting for a worker...")
        assert lines[-1] == "SUCCEEDED {'doubled': 42}"
    finally:
        producer.kill()
        producer.communicate()
        if worker is not None:
            worker.send_signal(signal.SIGINT)  # "Stop the worker with Ctrl-C."
            try:
                worker_out, worker_err = worker.communicate(timeout=15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker_out, worker_err = worker.communicate()
    assert "worker listening on run" in worker_out
    assert "completed " in worker_out and "(attempt 1)" in worker_out
    # Ctrl-C ends it with one line and the status a shell gives a process stopped by Ctrl-C, not a
    # CancelledError / KeyboardInterrupt traceback (issue 43).
    assert worker_err == INTERRUPTED_MESSAGE + "\n", worker_err
    assert worker.returncode == 128 + signal.SIGINT


# --- the same flow in-process -----------------------------------------------------------------


def test_quickstart_flow_in_process(dev_node: Any) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, holder="producer") as rs:
            ensured = await rs.mailboxes.ensure("work", mode="WORK")
            assert ensured["name"] == "work" and ensured["mode"] == "WORK"
            assert (await rs.mailboxes.get("work"))["mode"] == "WORK"
            scope = await rs.scopes.create(name="quickstart")
            assert scope.id and scope.view is not None and scope.view["storedState"] == "ACTIVE"
            ticket = await scope.mailbox("work").submit({"greeting": "runstate", "n": 21}, key=unique("qs"))
            assert ticket.created is True

            async def handle(data: Any, delivery: Any) -> None:
                await delivery.complete(result={"payload": {"doubled": data["n"] * 2}})

            async with AsyncRunstate(base_url=dev_node.url, holder="worker") as worker_rs:
                stop = asyncio.Event()
                consumer = asyncio.create_task(
                    worker_rs.scope(scope.id).mailbox("work").consume(handle, stop=stop)
                )
                outcome = await ticket.result(timeout_ms=30_000)
                stop.set()
                await asyncio.wait_for(consumer, CONSUME_STOP_WITHIN_S)
            assert (outcome["state"], outcome["outcome"]) == ("SUCCEEDED", {"doubled": 42})
            # Re-attach by id: the recorded result is read back.
            again = await rs.scope(scope.id).task(ticket.id).result(timeout_ms=0)
            assert again["outcome"] == {"doubled": 42}
            view = await rs.scope(scope.id).task(ticket.id).status()
            assert view["state"] == "SUCCEEDED" and view["attempt"] == 1

    run(main)


def test_handler_return_value_completes_and_exception_retries(dev_node: Any) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("work")
            scope = await rs.scopes.create()
            mailbox = scope.mailbox("work")
            tickets = [await mailbox.submit({"n": n}) for n in range(3)]
            seen: list[tuple[int, int]] = []

            async def handle(data: Any, delivery: Any) -> Any:
                seen.append((data["n"], delivery.attempt))
                if data["n"] == 1 and delivery.attempt == 1:
                    raise RuntimeError("flaky")
                return data["n"] * 10

            consumer = asyncio.create_task(mailbox.consume(handle, concurrency=3, lease_ms=5_000))
            outcomes = [await ticket.result(timeout_ms=30_000) for ticket in tickets]
            await scope.cancel()
            await asyncio.wait_for(consumer, CONSUME_STOP_WITHIN_S)
            assert [o["outcome"] for o in outcomes] == [0, 10, 20]
            assert (1, 1) in seen and (1, 2) in seen
            status = await tickets[1].status()
            assert status["attempt"] == 2

    run(main)


def test_sync_handler_in_async_consume(dev_node: Any) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("work")
            scope = await rs.scopes.create()
            ticket = await scope.mailbox("work").submit({"n": 4})
            threads: list[str] = []

            def handle(data: Any, delivery: Any) -> Any:
                threads.append(threading.current_thread().name)
                time.sleep(0.05)
                return {"squared": data["n"] ** 2}

            stop = asyncio.Event()
            consumer = asyncio.create_task(scope.mailbox("work").consume(handle, stop=stop))
            outcome = await ticket.result(timeout_ms=30_000)
            stop.set()
            await asyncio.wait_for(consumer, CONSUME_STOP_WITHIN_S)
            assert outcome["outcome"] == {"squared": 16}
            assert threads and threads[0] != threading.main_thread().name

    run(main)


# --- keys -------------------------------------------------------------------------------------


def test_same_key_same_task_and_key_conflict(dev_node: Any) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("work")
            scope = await rs.scopes.create()
            mailbox = scope.mailbox("work")
            key = unique("k")
            first = await mailbox.submit({"n": 1}, key=key)
            second = await mailbox.submit({"n": 1}, key=key)
            assert (first.id, first.created) == (second.id, True) and second.created is False
            assert first.key == key
            with pytest.raises(runstate.KeyConflictError) as caught:
                await mailbox.submit({"n": 2}, key=key)
            assert caught.value.status == 409 and caught.value.code == "KEY_CONFLICT"
            # Without a key, the input is the key.
            a = await mailbox.submit({"same": True})
            b = await mailbox.submit({"same": True})
            assert a.id == b.id

    run(main)


# --- cancel a run -----------------------------------------------------------------------------


def test_cancel_a_run(dev_node: Any) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("work")
            deadline = datetime.now(timezone.utc) + timedelta(hours=1)
            scope = await rs.scopes.create(deadline=deadline)
            shard = await scope.child()
            queued = await scope.mailbox("work").submit({"n": 1})
            started = asyncio.Event()
            cancelled = asyncio.Event()

            async def handle(data: Any, delivery: Any) -> None:
                started.set()
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled.set()
                    raise

            consumer = asyncio.create_task(shard.mailbox("work").consume(handle, lease_ms=600))
            await shard.mailbox("work").submit({"n": 2})
            await asyncio.wait_for(started.wait(), 10)

            view = await rs.scope(scope.id).cancel(reason="stop the swarm")
            assert view["storedState"] == "CANCELLED" and view["effective"] == "INACTIVE"

            # consume() returns on its own, and its handler was asked to stop.
            await asyncio.wait_for(consumer, CONSUME_STOP_WITHIN_S)
            assert cancelled.is_set()

            status = await shard.status()
            assert (status["storedState"], status["effective"]) == ("ACTIVE", "INACTIVE")
            with pytest.raises(runstate.ScopeCancelledError):
                await scope.mailbox("work").submit({"n": 3})
            with pytest.raises(runstate.ScopeCancelledError):
                await shard.mailbox("work").receive()
            with pytest.raises(runstate.ScopeCancelledError):
                await shard.child()
            outcome = await queued.result(timeout_ms=5_000)
            assert outcome["state"] == "CANCELLED"
            # Idempotent; completing a cancelled run is a conflict.
            assert (await rs.scopes.cancel(scope.id))["storedState"] == "CANCELLED"
            with pytest.raises(runstate.ConflictError) as caught:
                await rs.scopes.complete(scope.id)
            assert type(caught.value) is runstate.ConflictError

    run(main)


def test_complete_a_run_and_deadline(dev_node: Any) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("work")
            done = await rs.scopes.create(name="short", child_limit=1)
            assert (await done.child()).id
            with pytest.raises(runstate.LimitExceededError):
                await done.child()
            assert (await done.complete())["storedState"] == "COMPLETED"
            with pytest.raises(runstate.ConflictError):
                await done.cancel()
            soon = await rs.scopes.create(deadline=timedelta(milliseconds=300))
            await asyncio.sleep(0.6)
            with pytest.raises(runstate.DeadlineExceededError):
                await soon.mailbox("work").submit({"n": 1})
            assert (await soon.status())["effective"] == "INACTIVE"

    run(main)


# --- leases -----------------------------------------------------------------------------------


def test_complete_from_a_lost_lease(dev_node: Any) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("work")
            scope = await rs.scopes.create()
            mailbox = scope.mailbox("work")
            ticket = await mailbox.submit({"n": 1})
            [first] = await mailbox.receive(lease_ms=200, wait_ms=5_000)
            assert (first.task_id, first.attempt) == (ticket.id, 1)
            assert first.lease_expires_at is not None
            await asyncio.sleep(0.6)
            [second] = await mailbox.receive(lease_ms=10_000, wait_ms=5_000)
            assert (second.task_id, second.attempt) == (ticket.id, 2)
            with pytest.raises(runstate.LeaseLostError):
                await first.complete(result={"payload": "late"})
            with pytest.raises(runstate.LeaseLostError):
                await first.renew()
            await second.renew(lease_ms=10_000)
            await second.complete(result={"payload": "on time"})
            outcome = await ticket.result(timeout_ms=5_000)
            assert (outcome["state"], outcome["outcome"]) == ("SUCCEEDED", "on time")

    run(main)


def test_reject_release_and_not_found(dev_node: Any) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("work")
            scope = await rs.scopes.create()
            mailbox = scope.mailbox("work")
            ticket = await mailbox.submit({"n": 1}, attempts=2)
            [delivery] = await mailbox.receive(wait_ms=5_000)
            assert (await delivery.release())["taskId"] == ticket.id
            [again] = await mailbox.receive(wait_ms=5_000)
            assert again.attempt in (1, 2)  # a release counts no failed attempt
            assert (await again.reject(error="bad input"))["state"] == "FAILED"
            outcome = await ticket.result(timeout_ms=5_000)
            assert (outcome["state"], outcome["error"]) == ("FAILED", "bad input")
            with pytest.raises(runstate.NotFoundError):
                await rs.scopes.status("run_does_not_exist")
            with pytest.raises(runstate.NotFoundError):
                await rs.mailboxes.get(unique("missing"))
            with pytest.raises(runstate.NotFoundError):
                await scope.mailbox(unique("missing")).submit({"n": 1})

    run(main)


def test_result_timeout(dev_node: Any) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("work")
            scope = await rs.scopes.create()
            ticket = await scope.mailbox("work").submit({"n": 1})
            with pytest.raises(runstate.ResultTimeoutError) as caught:
                await ticket.result(timeout_ms=300)
            assert caught.value.task_id == ticket.id and ticket.id in str(caught.value)

    run(main)


def test_failover_past_a_dead_url(dev_node: Any) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=f"http://127.0.0.1:{free_port()},{dev_node.url}") as rs:
            assert (await rs.mailboxes.ensure("work"))["mode"] == "WORK"

    run(main)


# --- the blocking client ----------------------------------------------------------------------


def test_sync_client_quickstart(dev_node: Any) -> None:
    with Runstate(base_url=dev_node.url, holder="sync-producer") as rs:
        rs.mailboxes.ensure("work", mode="WORK")
        scope = rs.scopes.create()
        ticket = scope.mailbox("work").submit({"greeting": "runstate", "n": 21}, key=unique("sync"))
        assert ticket.created is True

        with Runstate(base_url=dev_node.url, holder="sync-worker") as worker_rs:
            stop = threading.Event()

            def handle(data: Any, delivery: Any) -> None:
                delivery.complete(result={"payload": {"doubled": data["n"] * 2}})

            worker = threading.Thread(
                target=worker_rs.scope(scope.id).mailbox("work").consume,
                args=(handle,),
                kwargs={"stop": stop},
            )
            worker.start()
            try:
                outcome = ticket.result(timeout_ms=30_000)
            finally:
                stop.set()
                worker.join(CONSUME_STOP_WITHIN_S)
            assert not worker.is_alive()
        assert (outcome["state"], outcome["outcome"]) == ("SUCCEEDED", {"doubled": 42})

        # Return values complete; the run stopping ends consume().
        second = scope.mailbox("work").submit({"n": 5})
        worker_thread = threading.Thread(
            target=rs.scope(scope.id).mailbox("work").consume, args=(lambda data, delivery: data["n"] + 1,)
        )
        worker_thread.start()
        assert second.result(timeout_ms=30_000)["outcome"] == 6
        scope.cancel()
        worker_thread.join(CONSUME_STOP_WITHIN_S)
        assert not worker_thread.is_alive()
        assert scope.status()["storedState"] == "CANCELLED"
        with pytest.raises(runstate.ScopeCancelledError):
            scope.mailbox("work").submit({"n": 6})
        with pytest.raises(runstate.ResultTimeoutError):
            rs.scopes.create().mailbox("work").submit({"n": 1}).result(timeout_ms=200)


def test_abandoned_receive_does_not_take_the_next_task(dev_node: Any) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("work")
            scope = await rs.scopes.create()
            mailbox = scope.mailbox("work")
            async with AsyncRunstate(base_url=dev_node.url, holder="gone") as gone:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(gone.scope(scope.id).mailbox("work").receive(wait_ms=10_000), 0.5)
            ticket = await mailbox.submit({"n": 1})
            deliveries = await mailbox.receive(lease_ms=30_000, wait_ms=3_000)
            assert [delivery.task_id for delivery in deliveries] == [ticket.id]

    run(main)


def test_calls_failing_together_do_not_keep_landing_on_a_dead_node(dev_node: Any) -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]

    async def main() -> None:
        async with AsyncRunstate(base_url=[*dead, dev_node.url]) as rs:
            answers = await asyncio.gather(*(rs.mailboxes.ensure("work") for _ in range(3)))
            assert all(answer["name"] == "work" for answer in answers)

    run(main)


def test_an_idle_consume_stops_without_waiting_out_its_long_poll(
    dev_node: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_consume, "CONSUME_RECEIVE_WAIT_MS", 30_000)  # the server's longest poll

    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url) as rs:
            await rs.mailboxes.ensure("work")
            scope = await rs.scopes.create()
            stop = asyncio.Event()

            async def handler(data: Any, delivery: Any) -> None:
                raise AssertionError("no task was submitted")

            consuming = asyncio.create_task(scope.mailbox("work").consume(handler, stop=stop))
            await asyncio.sleep(0.5)  # the receive is parked on the node by now (or soon)
            stop.set()
            # Well inside the 30 s the long poll would otherwise hold it.
            await asyncio.wait_for(consuming, 20)
            ticket = await scope.mailbox("work").submit({"n": 1})
            (delivery,) = await scope.mailbox("work").receive(wait_ms=5_000)
            assert delivery.task_id == ticket.id  # the abandoned receive took nothing

    run(main)
