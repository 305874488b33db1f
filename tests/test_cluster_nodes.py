"""Three real cluster nodes on 127.0.0.1: the leader killed with kill -9 under load, the leader
frozen with SIGSTOP and resumed, and a lease outliving an election."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runstate import AsyncRunstate
from runstate.sdk.errors import LeaseLostError, UnavailableError

from tests._cluster import Cluster
from tests._http import recv, settle, settle_ok, task_ok

PRODUCERS = 4
WORKERS = 3
WORKER_CONCURRENCY = 8
WORKER_LEASE_MS = 3_000  # short, so a delivery whose answer died with the leader comes back soon
COMPLETES_BEFORE_KILL = 120
COMPLETES_AFTER_KILL = 120
LATE_TASKS = 3
LATE_LEASE_MS = 1_500
WAIT_S = 60.0  # bound of every wait for progress (a failure, not a timing assertion)


async def wait_for(what: str, condition: Callable[[], bool], cluster: Cluster) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {WAIT_S} s\n{cluster.logs()}")
        await asyncio.sleep(0.02)


@dataclass
class Ledger:
    """What the clients were told: every acknowledged submit and complete."""

    submitted: dict[str, str] = field(default_factory=dict)  # key -> task id
    delivered: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # task id -> deliveries
    completed: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # task id -> acked deliveries
    completes: int = 0
    refused: list[str] = field(default_factory=list)  # deliveries whose complete was refused STALE_CLAIM


async def producer(cluster: Cluster, index: int, run_id: str, ledger: Ledger, stop: asyncio.Event) -> None:
    """Submits keyed tasks through its own order of the nodes until told to stop; a submit that no
    node answered is repeated with the same key (the server deduplicates)."""
    async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.urls_from(index % cluster.size), holder=f"producer-{index}") as rs:
        queue = rs.scope(run_id).mailbox("work")
        n = 0
        while not stop.is_set():
            key = f"p{index}-{n}"
            while True:
                try:
                    ticket = await queue.submit({"key": key}, key=key)
                    break
                except UnavailableError:
                    continue
            assert ledger.submitted.setdefault(key, ticket.id) == ticket.id, f"{key} got two task ids"
            n += 1


async def worker(cluster: Cluster, index: int, run_id: str, ledger: Ledger, stop: asyncio.Event) -> None:
    """`consume` through its own order of the nodes; the handler completes itself and records it."""
    async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.urls_from(index % cluster.size), holder=f"worker-{index}") as rs:

        async def handle(data: dict[str, Any], delivery: Any) -> None:
            ledger.delivered[delivery.task_id].add(delivery.id)
            await asyncio.sleep(random.uniform(0, 0.02))
            try:
                await delivery.complete(result={"payload": {"key": data["key"], "delivery": delivery.id}})
            except LeaseLostError:
                ledger.refused.append(delivery.id)
                raise
            ledger.completed[delivery.task_id].append(delivery.id)
            ledger.completes += 1

        await rs.scope(run_id).mailbox("work").consume(
            handle, concurrency=WORKER_CONCURRENCY, lease_ms=WORKER_LEASE_MS, stop=stop
        )


async def through_failover(cluster: Cluster, ledger: Ledger) -> dict[str, Any]:
    async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.base_url, holder="test") as rs:
        await rs.mailboxes.ensure("work")
        await rs.mailboxes.ensure("late")
        run = await rs.scopes.create(name="failover")
        # Late completions: deliveries taken before the kill and never renewed.
        late_queue = run.mailbox("late")
        late_tickets = [await late_queue.submit({"late": n}, key=f"late-{n}") for n in range(LATE_TASKS)]
        stale = await late_queue.receive(max=LATE_TASKS, lease_ms=LATE_LEASE_MS)
        assert len(stale) == LATE_TASKS

        stop_producers, stop_workers = asyncio.Event(), asyncio.Event()
        producers = [asyncio.create_task(producer(cluster, i, run.id, ledger, stop_producers)) for i in range(PRODUCERS)]
        workers = [asyncio.create_task(worker(cluster, i, run.id, ledger, stop_workers)) for i in range(WORKERS)]
        everyone = producers + workers
        try:
            await wait_for("completes before the kill", lambda: ledger.completes >= COMPLETES_BEFORE_KILL
                           or any(t.done() for t in everyone), cluster)
            old_leader = cluster.leader_index()
            await asyncio.to_thread(cluster.kill, old_leader)
            killed_at = ledger.completes
            new_leader = await asyncio.to_thread(cluster.leader_index)
            await wait_for("completes after the kill", lambda: ledger.completes >= killed_at + COMPLETES_AFTER_KILL
                           or any(t.done() for t in everyone), cluster)
            for task in everyone:
                assert not task.done(), task.exception()

            # The stale deliveries' leases lapse (extended once by the new leader); the tasks are
            # taken over with attempt 2 and completed; the late completes must be refused.
            takeovers: list[Any] = []
            while len(takeovers) < LATE_TASKS:
                takeovers += await late_queue.receive(max=LATE_TASKS, lease_ms=30_000, wait_ms=10_000)
            assert sorted(d.attempt for d in takeovers) == [2] * LATE_TASKS
            for delivery in takeovers:
                await delivery.complete(result={"payload": "taken over"})
            late_answers: list[Any] = []
            for delivery in stale:
                try:
                    late_answers.append(await delivery.complete(result={"payload": "late"}))
                except LeaseLostError as error:
                    late_answers.append(error.code)
            assert late_answers == ["STALE_CLAIM"] * LATE_TASKS

            stop_producers.set()
            await asyncio.gather(*producers)
            tickets = list(ledger.submitted.values())
            results = await rs.results(tickets, timeout_ms=int(WAIT_S * 1000))
            late_results = await rs.results(late_tickets, timeout_ms=int(WAIT_S * 1000))
            # Every key again: the same task each time, none created.
            keys = sorted(ledger.submitted)
            again = await run.mailbox("work").submit_many([{"key": k} for k in keys], keys=keys)
            assert [(t.id, t.created) for t in again] == [(ledger.submitted[k], False) for k in keys]
            stop_workers.set()
            await rs.scopes.complete(run.id)  # the consumers' receives end with SCOPE_CANCELLED
            await asyncio.gather(*workers)
        finally:
            stop_producers.set()
            stop_workers.set()
            for task in everyone:
                task.cancel()
            await asyncio.gather(*everyone, return_exceptions=True)
    return {
        "old_leader": old_leader, "new_leader": new_leader, "killed_at": killed_at,
        "results": dict(zip(tickets, results, strict=True)), "late_results": late_results,
    }


def test_leader_killed_under_load_loses_nothing_and_records_one_result_per_task(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster().start()
    ledger = Ledger()
    outcome = asyncio.run(through_failover(cluster, ledger))
    results: dict[str, dict[str, Any]] = outcome["results"]
    retried = sum(1 for deliveries in ledger.delivered.values() if len(deliveries) > 1)
    print(f"submitted {len(ledger.submitted)}, acknowledged completes {ledger.completes} ({outcome['killed_at']} "
          f"before the kill), tasks delivered more than once {retried}, refused completes {len(ledger.refused)}")

    assert ledger.completes >= outcome["killed_at"] + COMPLETES_AFTER_KILL
    assert len(results) == len(ledger.submitted) == len(set(ledger.submitted.values()))
    for key, task_id in ledger.submitted.items():
        result = results[task_id]
        assert result["state"] == "SUCCEEDED", (key, result)
        payload = result["outcome"]
        assert payload["key"] == key, (key, result)
        acknowledged = set(ledger.completed.get(task_id, []))
        # At most one delivery's complete was acknowledged, and that one is the recorded result;
        # if none was (its answer died with the leader), the result is one of the task's deliveries.
        assert len(acknowledged) <= 1, (task_id, acknowledged)
        if acknowledged:
            assert payload["delivery"] == acknowledged.pop(), (task_id, result)
        else:
            assert payload["delivery"] in ledger.delivered[task_id], (task_id, result)
    # A refused complete was never the recorded one.
    recorded = {result["outcome"]["delivery"] for result in results.values()}
    assert not recorded & set(ledger.refused)
    assert [(r["state"], r["outcome"]) for r in outcome["late_results"]] == [("SUCCEEDED", "taken over")] * LATE_TASKS

    # The killed node restarts on its data and catches up: all three hold the same state.
    cluster.start(outcome["old_leader"])
    cluster.wait_same_digest()
    # A resubmit of every acknowledged key through the restarted node finds the same task.
    api = cluster.api(outcome["old_leader"])
    for key in random.sample(sorted(ledger.submitted), 20):
        task_id = ledger.submitted[key]
        assert api.ok("GET", f"/v1/tasks/{task_id}")["taskKey"] == key


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def test_a_paused_old_leader_neither_serves_stale_reads_nor_expires_leases(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster().start()
    old = cluster.leader_index()
    api_old = cluster.api(old)
    setup = api_old.resending()  # an election right after the start answers 503 UNAVAILABLE
    run_id = setup.ok("POST", "/v1/scopes", {})["id"]
    read_task = task_ok(setup, run_id, {"input": "read", "key": "read"})["id"]
    (read_delivery,) = recv(setup, run_id, leaseMs=60_000)
    held_task = task_ok(setup, run_id, {"input": "held", "key": "held"})["id"]
    received_at = time.monotonic()
    (held,) = recv(setup, run_id, leaseMs=2_000)
    assert (read_delivery["taskId"], held["taskId"]) == (read_task, held_task)

    cluster.pause(old)
    new = cluster.leader_index(exclude=[old])
    api_new = cluster.api(new)
    # The worker holding `held` renews it on the new leader; every renewal must be accepted. (Sent
    # again while it answers 503: with one node frozen, a loaded machine's pause of the other
    # follower makes the new leader step down for an election; a new leader extends live leases.)
    renewals: list[tuple[int, Any]] = []
    stop_renewing = threading.Event()
    renewing = api_new.resending()

    def renew() -> None:
        while not stop_renewing.wait(0.3):
            renewals.append(settle(renewing, held, "renew", {"leaseMs": 2_000}))

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        # The read task is completed on the new leader while the old one is frozen.
        done = settle_ok(api_new, read_delivery, "complete", {"result": {"payload": "new"}})
        assert done["state"] == "SUCCEEDED"
        # Stay frozen until the lease of `held`, as the old leader's state has it, is long overdue.
        sleep_until(received_at + 3.0)
        # Reads sent to the frozen node wait in its socket; they are served once it runs again.
        reads: list[tuple[int, Any]] = []

        def read(path: str) -> None:
            reads.append(api_old("GET", path))

        readers = [threading.Thread(target=read, args=(path,)) for path in
                   [f"/v1/tasks/{read_task}", f"/v1/tasks/{read_task}?waitMs=0"] * 3]
        for thread in readers:
            thread.start()
        time.sleep(0.2)
        cluster.resume(old)
        for thread in readers:
            thread.join()
        for _ in range(20):  # and right after it runs again
            reads.append(api_old("GET", f"/v1/tasks/{read_task}"))
        print("reads through the resumed old leader:", sorted(str(status) for status, _ in reads))
        for status, body in reads:
            # Never the stale RUNNING: either the confirmed state, or UNAVAILABLE (retry).
            assert (status == 200 and body["state"] == "SUCCEEDED" and body["outcome"] == "new") or (
                status == 503 and body["error"]["code"] == "UNAVAILABLE"
            ), (status, body)
        assert cluster.leader_index() == new  # the old leader follows
        sleep_until(time.monotonic() + 1.0)  # give a stray tick of the old epoch time to land
    finally:
        stop_renewing.set()
        renewer.join()
    assert renewals and all(status == 200 for status, _ in renewals), renewals
    view = api_old.ok("GET", f"/v1/tasks/{held_task}")
    assert (view["state"], view["attempt"]) == ("RUNNING", 1), view
    settle_ok(api_old, held, "complete", {"result": {"payload": "held"}})
    assert api_new.ok("GET", f"/v1/tasks/{held_task}")["outcome"] == "held"
    cluster.wait_same_digest()


def test_a_new_leader_extends_live_leases(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    old = cluster.leader_index()
    lease_ms = 3_000

    async def worker() -> tuple[str, dict[str, Any]]:
        # The worker lists every node, the old leader first: it receives from the old leader.
        async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.urls_from(old), holder="worker") as rs:
            await rs.mailboxes.ensure("work")
            run = await rs.scopes.create()
            ticket = await run.mailbox("work").submit({"n": 1})
            received_at = time.monotonic()
            (delivery,) = await run.mailbox("work").receive(lease_ms=lease_ms)
            # Mid-lease, the leader dies; the worker cannot renew until a new leader is elected.
            await asyncio.sleep(max(0.0, received_at + 1.5 - time.monotonic()))
            await asyncio.to_thread(cluster.kill, old)
            await asyncio.to_thread(cluster.leader_index)
            # Past the lease as it was granted: without the extension the task would be taken back.
            await asyncio.sleep(max(0.0, received_at + lease_ms / 1000 + 0.5 - time.monotonic()))
            view = await ticket.status()
            assert (view["state"], view["attempt"]) == ("RUNNING", 1), view
            answer = await delivery.complete(result={"payload": "kept"})
            return ticket.id, answer

    task_id, answer = asyncio.run(worker())
    assert answer["state"] == "SUCCEEDED"
    view = cluster.api(cluster.leader_index()).ok("GET", f"/v1/tasks/{task_id}")
    assert (view["state"], view["attempt"], view["outcome"]) == ("SUCCEEDED", 1, "kept")
