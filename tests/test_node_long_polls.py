"""Long polls under pressure and after a revoke, and the ids tokens derive from.

- Past the per-key bound a long poll answers at once with what it has (it used to spin on a
  done future until its waitMs ran out, a whole core for each).
- A long poll parked under an API key that is revoked meanwhile ends UNAUTHENTICATED; it never
  shows what was written after the revoke.
- A long poll whose client went away ends then, not at its waitMs: else clients that send a poll
  and leave, holding no connection, fill the bounds (10,000 such polls on one task stayed parked,
  138 MB, for their 30 s).
- Command ids (and the tokens derived from them) come from the OS's CSPRNG.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from runstate_server.node import server
from runstate_server.node.waiters import Waiters
from tests._http import Api, call
from tests._nodes import DevNode

PARKED_WAIT_S = 20.0  # how long the test waits for polls to be parked (they park in milliseconds)
POLL_WAIT_MS = 30_000  # a long poll's waitMs: far longer than an answer "at once" takes
ANSWER_TIMEOUT_S = 15.0  # a poll that should answer at once must answer within this (it spun 30 s)


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = PARKED_WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def long_polls(node: DevNode) -> int:
    return int(call(node.url, "GET", "/v1/health")[1]["longPolls"])


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    return thread, out


def queued_task(api: Api) -> tuple[str, str]:
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    mailbox = api.ok("PUT", "/v1/mailboxes/by-name/work", {})["id"]
    task = api.ok("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": mailbox, "taskKey": "k", "input": 1})
    return run_id, task["id"]


def test_a_long_poll_past_the_per_key_bound_answers_at_once(node_factory: type[DevNode]) -> None:
    node = node_factory("--long-polls-per-key", "2", in_memory=True).start()
    api = Api(node.url)
    run_id, task_id = queued_task(api)
    path = f"/v1/tasks/{task_id}?waitMs={POLL_WAIT_MS}"
    parked = [in_thread(lambda: api("GET", path)) for _ in range(2)]
    wait_until(lambda: long_polls(node) == 2, "two polls parked on the task")

    started = time.monotonic()
    status, view = call(node.url, "GET", api.space_path(path))
    assert (status, view["state"]) == (200, "QUEUED")
    assert time.monotonic() - started < ANSWER_TIMEOUT_S, "the poll past the bound waited instead of answering"
    assert long_polls(node) == 2  # the two parked ones still wait
    # A results wait on the task (parked on the same key) answers at once too, with what is known.
    started = time.monotonic()
    body = {"ids": [task_id, "tsk_nope"], "waitMs": POLL_WAIT_MS}
    status, answer = call(node.url, "POST", api.space_path("/v1/tasks/results"), body)
    assert status == 200 and [view.get("state") for view in answer["results"]] == ["QUEUED", None]
    assert answer["results"][1]["error"]["code"] == "NOT_FOUND"
    assert time.monotonic() - started < ANSWER_TIMEOUT_S, "the results wait past the bound waited"

    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    for thread, out in parked:
        thread.join(ANSWER_TIMEOUT_S)
        assert out and out[0][0] == 200 and out[0][1]["state"] == "CANCELLED"


@pytest.mark.parametrize("then_finish", [False, True], ids=["revoke", "revoke-then-finish"])
def test_polls_parked_under_a_revoked_key_end_unauthenticated(
    auth_node: tuple[DevNode, str], then_finish: bool
) -> None:
    """A revoke ends the polls parked under the key; the wake that may follow it (the task
    finishing) must not hand them what was written after the revoke."""
    node, admin_secret = auth_node
    admin = Api(node.url, key=admin_secret)
    created = admin.ok("POST", "/v1/keys", {"name": "reader", "permissions": ["coordination_read"]})
    reader = Api(node.url, key=created["key"])
    run_id, task_id = queued_task(admin)
    polls = [in_thread(lambda: reader("GET", f"/v1/tasks/{task_id}?waitMs={POLL_WAIT_MS}")) for _ in range(3)]
    wait_until(lambda: long_polls(node) == 3, "the reader's polls parked")

    admin.ok("POST", f"/v1/keys/{created['id']}/revoke")
    if then_finish:
        admin.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    for thread, out in polls:
        thread.join(ANSWER_TIMEOUT_S)
        assert out, "a poll of the revoked key still waits"
        status, answer = out[0]
        assert (status, answer["error"]["code"]) == (401, "UNAUTHENTICATED"), answer
    if not then_finish:
        admin.ok("POST", f"/v1/scopes/{run_id}/cancel", {})


@pytest.mark.parametrize("kind", ["task", "receive", "watch"])
def test_a_long_poll_whose_client_went_away_stops_waiting(node_factory: type[DevNode], kind: str) -> None:
    node = node_factory(in_memory=True).start()
    api = Api(node.url)
    run_id, task_id = queued_task(api)
    mailbox = api.ok("PUT", "/v1/mailboxes/by-name/empty", {})["id"]
    if kind == "task":
        head, body = f"GET {api.space_path(f'/v1/tasks/{task_id}?waitMs={POLL_WAIT_MS}')}", b""
    elif kind == "receive":
        head = f"POST {api.space_path(f'/v1/mailboxes/{mailbox}/recv')}"
        body = f'{{"scopeId": "{run_id}", "waitMs": {POLL_WAIT_MS}}}'.encode()
    else:
        head, body = f"GET {api.space_path(f'/v1/watch?types=task.completed&waitSeconds={POLL_WAIT_MS // 1000}')}", b""
    request = (
        f"{head} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    clients = [socket.create_connection(("127.0.0.1", node.port)) for _ in range(5)]
    try:
        for client in clients:
            client.sendall(request)
        wait_until(lambda: long_polls(node) == len(clients), "the polls parked")
    finally:
        for client in clients:
            client.close()
    # Well before their waitMs (30 s) runs out.
    wait_until(lambda: long_polls(node) == 0, "the polls of the clients that left ended", ANSWER_TIMEOUT_S)
    # Clients that leave before their poll is parked: it is not (a poll that stays parked is seen
    # beside the one parked after them).
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", node.port)) as client:
            client.sendall(request)
    with socket.create_connection(("127.0.0.1", node.port)) as staying:
        staying.sendall(request)
        wait_until(lambda: long_polls(node) >= 1, "the staying client's poll parked")
        wait_until(lambda: long_polls(node) == 1, "only the staying client's poll parked", ANSWER_TIMEOUT_S)
    log = node.log_path.read_text(errors="replace")
    assert " ERROR " not in log and "Traceback" not in log, log[-3000:]
    assert api.ok("GET", f"/v1/tasks/{task_id}")["state"] == "QUEUED"  # nothing was handed to them


def test_waiters_past_a_bound_are_not_parked_and_do_not_wait() -> None:
    async def scenario() -> None:
        waiters = Waiters(per_key_max=1, total_max=2)
        first = waiters.register("a")
        over_key = waiters.register("a")
        second = waiters.register("b")
        over_total = waiters.register("c")
        assert (first.parked, over_key.parked, second.parked, over_total.parked) == (True, False, True, False)
        assert len(waiters) == 2
        started = time.monotonic()
        assert await over_key.wait(30.0) is False  # at once: it was never parked
        assert time.monotonic() - started < ANSWER_TIMEOUT_S
        waiters.wake("a")
        assert await first.wait(1.0) is True
        second.close()
        assert len(waiters) == 0

    asyncio.run(scenario())


def test_a_wake_of_the_owner_wakes_every_waiter_it_owns() -> None:
    async def scenario() -> None:
        waiters = Waiters()
        owned = [waiters.register(("task", str(index)), ("api_key", "k1")) for index in range(3)]
        other = waiters.register(("task", "0"), ("api_key", "k2"))
        waiters.wake(("api_key", "k1"))
        assert [waiter.future.done() for waiter in owned] == [True, True, True]
        assert not other.future.done() and len(waiters) == 1
        waiters.wake(("task", "0"))
        assert other.future.done() and len(waiters) == 0

    asyncio.run(scenario())


def test_command_ids_come_from_the_os_csprng(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lease tokens derive from command ids: they must not be predictable from earlier ids (a
    Mersenne Twister's outputs are, from 624 of them). Every id is drawn from os.urandom."""
    drawn: list[bytes] = []

    def urandom(size: int) -> bytes:
        drawn.append(bytes(range(size)))
        return drawn[-1]

    monkeypatch.setattr(os, "urandom", urandom)
    assert server.new_command_id() == bytes(range(10)).hex()
    assert len(drawn) == 1
    assert server.new_command_ids(3) == [bytes(range(30))[start : start + 10].hex() for start in (0, 10, 20)]
    assert len(drawn) == 2  # one draw for the three
