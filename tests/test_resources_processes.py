"""The issue's end-to-end case, with worker processes: 40 jobs that each need a browser slot (a
pool of 3), one unit of a 5-per-second limit and 0.40 of a 10.00 budget, all of it spent. At most
3 run at once, at most 5 are handed out in any second, exactly 25 get their budget while the other
15 wait, and cancelling the run refuses those clearly."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runstate import Runstate, ScopeCancelledError

from tests._http import new_space
from tests._nodes import DevNode
from tests._once_procs import children, sdk_env

JOBS = 40
POOL_SIZE = 3
LIMIT_UNITS, LIMIT_INTERVAL_MS = 5, 1_000
BUDGET_TOTAL, RESERVE = 10.00, 0.40
FUNDED = 25  # 10.00 / 0.40
WORKERS, CONCURRENCY = 3, 4  # 12 handlers compete for 3 slots
SETTLE_S = 1.5  # how long the unfunded jobs are watched not starting
WAIT_S = 60.0


def wait_for(what: str, probe: Callable[[], Any], timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def test_forty_jobs_share_a_pool_a_limit_and_a_budget(dev_node: DevNode, tmp_path: Path) -> None:
    space = new_space(dev_node.url, "render")
    effects = tmp_path / "effects.jsonl"
    effects.touch()
    with Runstate(base_url=dev_node.url, space_id=space) as rs:
        rs.mailboxes.ensure("render")
        rs.pools.ensure("browser", size=POOL_SIZE)
        rs.limits.ensure("search-api", units=LIMIT_UNITS, per="1s")
        rs.budgets.ensure("model-usd", total=BUDGET_TOTAL)
        run = rs.scopes.create(name="render")
        mailbox = run.mailbox("render")
        tickets = [
            mailbox.submit(
                {"n": n}, key=f"page-{n}", slots="browser", limit={"name": "search-api", "units": 1},
                budget={"name": "model-usd", "amount": RESERVE},
            )
            for n in range(JOBS)
        ]
        env = sdk_env(dev_node.url, run.id, RS_TEST_EFFECTS=str(effects), RUNSTATE_SPACE_ID=space)
        with children() as procs:
            workers = [procs.spawn("_resources_worker.py", str(CONCURRENCY), env=env) for _ in range(WORKERS)]

            def states() -> dict[str, int]:
                counts: dict[str, int] = {}
                for ticket in tickets:
                    state = ticket.status()["state"]
                    counts[state] = counts.get(state, 0) + 1
                return counts

            def budget_figures() -> tuple[Any, Any, Any]:
                budget = rs.budgets.status("model-usd")
                return budget["spent"], budget["reserved"], budget["remaining"]

            wait_for(f"{FUNDED} jobs to succeed", lambda: states().get("SUCCEEDED") == FUNDED)
            # A worker settles a job's reservation after its complete: a moment after it succeeded.
            wait_for("the budget to be spent", lambda: budget_figures() == (BUDGET_TOTAL, 0, 0))
            time.sleep(SETTLE_S)  # the budget is spent: nothing else may start
            assert states() == {"SUCCEEDED": FUNDED, "QUEUED": JOBS - FUNDED}
            budget = rs.budgets.status("model-usd")
            assert (budget["spent"], budget["reserved"], budget["remaining"]) == (BUDGET_TOTAL, 0, 0)
            assert budget["waiting"] == JOBS - FUNDED
            assert rs.pools.status("browser")["inUse"] == 0

            run.cancel(reason="out of budget")
            for process in workers:  # consume returns once the run stops
                assert process.wait(WAIT_S) == 0
            assert states() == {"SUCCEEDED": FUNDED, "CANCELLED": JOBS - FUNDED}
            try:
                mailbox.submit({"n": JOBS}, slots="browser")
                raise AssertionError("a submit to a cancelled run was accepted")
            except ScopeCancelledError as error:
                assert "cancel" in error.message.lower()

    lines = [json.loads(line) for line in effects.read_text().splitlines()]
    assert sorted(line["n"] for line in lines) == sorted({line["n"] for line in lines})  # each ran once
    assert len(lines) == FUNDED
    # At most POOL_SIZE handlers ran at once (each ran inside its slot's lease).
    events = sorted([(line["start"], 1) for line in lines] + [(line["end"], -1) for line in lines])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert 1 < peak <= POOL_SIZE
    # At most LIMIT_UNITS receives in any window of the interval, by the server's own clock.
    received = sorted(line["received_ms"] for line in lines)
    for index, at in enumerate(received):
        in_window = [other for other in received[: index + 1] if other > at - LIMIT_INTERVAL_MS]
        assert len(in_window) <= LIMIT_UNITS, (at, in_window)
