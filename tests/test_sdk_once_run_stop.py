"""`once` when its run stops: callers waiting on an entry that is still HELD learn it at once (not
when the holder's lease lapses), and after the space's default run is stopped the next call of
every long-lived process lands in the same fresh run and runs the function there once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
import runstate
from runstate.sdk import once_calls as once_module
from runstate.sdk.errors import ScopeCancelledError

from tests._http import Api, new_space
from tests._nodes import DevNode
from tests._once_procs import HERE, WAIT_S, children, lines, read_line, sdk_env

# Long enough that the holder's lease cannot lapse before the checks below; short enough that, were
# the stop not noticed, the waiter's answer would come from the lapse (the entry then OPEN).
LEASE_MS = 9_000
WAIT_TIMEOUT_S = 60.0
# A run's deadline from its creation: after four writes made before it (a loaded machine's fsyncs).
DEADLINE_AHEAD_S = 5


def once_path(run_id: str, key: str, wait_ms: int = 0) -> str:
    return "/v1/once?" + urlencode({"scopeId": run_id, "key": key, "waitMs": wait_ms})


def acquire(api: Api, run_id: str, key: str, lease_ms: int = 30_000) -> Any:
    return api.ok("POST", "/v1/once/acquire", {"scopeId": run_id, "key": key, "leaseSeconds": lease_ms // 1000})


def test_a_once_wait_answers_when_its_run_stops(dev_node: DevNode) -> None:
    api = Api(dev_node.url)
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    key = f"stop-probe:{uuid.uuid4().hex}"
    granted = acquire(api, run_id, key, LEASE_MS * 2)
    assert granted["state"] == "GRANTED"
    active = api.ok("GET", once_path(run_id, key))
    assert (active["state"], active["scopeEffective"]) == ("HELD", "ACTIVE")
    answers: list[Any] = []
    waiter = threading.Thread(target=lambda: answers.append(api.ok("GET", once_path(run_id, key, 30_000))))
    waiter.start()
    api.ok("POST", f"/v1/scopes/{run_id}/cancel", {})
    waiter.join(WAIT_TIMEOUT_S)
    # Still HELD (the lease has not lapsed): the wait answered because the run stopped.
    assert (answers[0]["state"], answers[0]["scopeEffective"]) == ("HELD", "INACTIVE"), answers
    status, code = api.error("POST", "/v1/once/acquire", {"scopeId": run_id, "key": key})
    assert (status, code) == (409, "SCOPE_CANCELLED")


def test_a_finished_run_and_a_run_past_its_deadline_refuse_once_and_keep_results(dev_node: DevNode) -> None:
    """Completing a run, or its deadline passing, stops it as cancelling does: new entries are
    refused, recorded results stay readable, and a wait on an entry still HELD answers."""
    api = Api(dev_node.url)
    for stop, code in (("complete", "SCOPE_CANCELLED"), ("deadline", "DEADLINE_EXCEEDED")):
        deadline = datetime.now(timezone.utc) + timedelta(seconds=DEADLINE_AHEAD_S)
        run_id = api.ok("POST", "/v1/scopes", {"deadline": deadline.isoformat()} if stop == "deadline" else {})["id"]
        token = acquire(api, run_id, "done")["token"]
        api.ok("POST", "/v1/once/complete", {"scopeId": run_id, "key": "done", "token": token, "result": {"kept": stop}})
        acquire(api, run_id, "held", LEASE_MS * 2)
        if stop == "complete":
            api.ok("POST", f"/v1/scopes/{run_id}/complete")
        # Answers at once after a complete; past the deadline, once the server stops the run.
        woken = api.ok("GET", once_path(run_id, "held", 30_000))
        assert (woken["state"], woken["scopeEffective"]) == ("HELD", "INACTIVE"), (stop, woken)
        assert api.error("POST", "/v1/once/acquire", {"scopeId": run_id, "key": "new"}) == (409, code)
        assert api.error("POST", "/v1/once/acquire", {"scopeId": run_id, "key": "held"}) == (409, code)
        done = acquire(api, run_id, "done")
        assert (done["state"], done["result"], done["scopeEffective"]) == ("DONE", {"kept": stop}, "INACTIVE")


@pytest.fixture
def explicit_run(dev_node: DevNode) -> Any:
    run_id = str(Api(dev_node.url).ok("POST", "/v1/scopes", {})["id"])
    runstate.configure(base_url=dev_node.url, scope_id=run_id)
    try:
        yield run_id
    finally:
        runstate.close()


def test_waiting_callers_learn_at_once_that_the_run_stopped(
    explicit_run: str, dev_node: DevNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = Api(dev_node.url)
    started, waiting = threading.Event(), threading.Event()
    real_wait = once_module.OnceCalls.wait

    async def wait(self: once_module.OnceCalls, scope_id: str, key: str, wait_ms: int = 30_000) -> dict[str, Any]:
        waiting.set()  # the waiter's acquire answered HELD: it waits on the entry now
        return await real_wait(self, scope_id, key, wait_ms)

    monkeypatch.setattr(once_module.OnceCalls, "wait", wait)
    signals: list[bool] = []

    @runstate.once(name="stop-probe", lease=f"{LEASE_MS}ms")
    def work(name: str) -> str:
        signal = runstate.context().signal
        started.set()
        signals.append(signal.wait(WAIT_TIMEOUT_S))  # set once a renewal is refused (run stopped)
        return name

    outcomes: dict[str, Any] = {}

    def call(who: str) -> None:
        try:
            outcomes[who] = work("acme")
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcomes[who] = exc

    holder = threading.Thread(target=call, args=("holder",))
    holder.start()
    assert started.wait(WAIT_TIMEOUT_S)
    waiter = threading.Thread(target=call, args=("waiter",))
    waiter.start()
    assert waiting.wait(WAIT_TIMEOUT_S)
    api.ok("POST", f"/v1/scopes/{explicit_run}/cancel", {})
    waiter.join(WAIT_TIMEOUT_S)
    assert isinstance(outcomes.get("waiter"), ScopeCancelledError), outcomes
    # It learned while the holder still held the entry, not from the lease lapsing.
    assert api.ok("GET", once_path(explicit_run, work.once_key("acme")))["state"] == "HELD"
    holder.join(WAIT_TIMEOUT_S)
    assert signals == [True]
    assert isinstance(outcomes.get("holder"), ScopeCancelledError), outcomes


@pytest.mark.slow
def test_after_a_stop_every_process_moves_to_the_same_fresh_default_run(dev_node: DevNode, tmp_path: Path) -> None:
    """Two long-lived processes (each caching the default run) in a space of their own."""
    space = new_space(dev_node.url, "default-run")
    api = Api(dev_node.url, space=space)
    effects = tmp_path / "effects"
    env = sdk_env(dev_node.url, None, RUNSTATE_SPACE_ID=space, RS_TEST_EFFECTS=str(effects))
    with children() as procs:
        callers = []
        for _ in range(2):
            process = subprocess.Popen(
                [sys.executable, str(HERE / "_once_repl.py")],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            )
            procs.processes.append(process)
            read_line(process, "ready")
            callers.append(process)

        def call_all() -> list[dict[str, Any]]:
            for process in callers:
                assert process.stdin is not None
                process.stdin.write("call\n")
                process.stdin.flush()
            printed = [read_line(process, "result") for process in callers]
            return [json.loads(line.removeprefix("result ")) for line in printed]

        first = call_all()
        old_run = api.ok("PUT", "/v1/runs/default")["id"]
        assert first[0] == first[1] and first[0]["run"] == old_run
        api.ok("POST", f"/v1/scopes/{old_run}/cancel", {"reason": "start over"})
        second = call_all()
        fresh_run = api.ok("PUT", "/v1/runs/default")["id"]
        assert fresh_run != old_run
        assert second[0] == second[1] and second[0]["run"] == fresh_run
        for process in callers:
            assert process.stdin is not None
            process.stdin.close()
            assert process.wait(WAIT_S) == 0
    assert [line[2] for line in lines(effects)] == [old_run, fresh_run]  # once per run


def test_in_the_default_run_a_waiter_moves_to_the_fresh_run_when_it_stops(
    dev_node: DevNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder is still at work when the default run is stopped: the waiting caller does not
    wait for it, it runs the function itself in the fresh default run."""
    monkeypatch.delenv("RUNSTATE_SCOPE_ID", raising=False)
    space = new_space(dev_node.url, "default-stop")
    api = Api(dev_node.url, space=space)
    runstate.configure(base_url=dev_node.url, space_id=space)
    started, waiting = threading.Event(), threading.Event()
    real_wait = once_module.OnceCalls.wait

    async def wait(self: once_module.OnceCalls, scope_id: str, key: str, wait_ms: int = 30_000) -> dict[str, Any]:
        waiting.set()
        return await real_wait(self, scope_id, key, wait_ms)

    monkeypatch.setattr(once_module.OnceCalls, "wait", wait)

    @runstate.once(name="default-stop-probe", lease=f"{LEASE_MS}ms")
    def work(name: str) -> dict[str, Any]:
        context = runstate.context()
        if not started.is_set():
            started.set()
            context.signal.wait(WAIT_TIMEOUT_S)  # the first caller holds on until its renewal is refused
        return {"name": name, "run": context.run_id, "attempt": context.attempt}

    outcomes: dict[str, Any] = {}

    def call(who: str) -> None:
        try:
            outcomes[who] = work("acme")
        except Exception as exc:  # noqa: BLE001 - handed to the test
            outcomes[who] = exc

    try:
        holder = threading.Thread(target=call, args=("holder",))
        holder.start()
        assert started.wait(WAIT_TIMEOUT_S)
        old_run = api.ok("PUT", "/v1/runs/default")["id"]
        waiter = threading.Thread(target=call, args=("waiter",))
        waiter.start()
        assert waiting.wait(WAIT_TIMEOUT_S)
        api.ok("POST", f"/v1/scopes/{old_run}/cancel", {})
        waiter.join(WAIT_TIMEOUT_S)
        fresh_run = api.ok("PUT", "/v1/runs/default")["id"]
        assert fresh_run != old_run
        assert outcomes.get("waiter") == {"name": "acme", "run": fresh_run, "attempt": 1}, outcomes
        # The old run's entry was still held when the waiter moved on.
        assert api.ok("GET", once_path(old_run, work.once_key("acme")))["state"] == "HELD"
        holder.join(WAIT_TIMEOUT_S)
        assert isinstance(outcomes.get("holder"), ScopeCancelledError), outcomes
    finally:
        runstate.close()
