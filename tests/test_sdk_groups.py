"""Task groups through the SDK against a real dev node: the spec's samples in Python with a worker
process on the group's run, re-attaching by id, and the blocking client's calls and errors."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
import runstate
from runstate import AsyncRunstate, Runstate

from tests._http import new_space
from tests._nodes import DevNode
from tests._once_procs import children, sdk_env

WORKER_EXIT_S = 30.0
RESULT_TIMEOUT_MS = 30_000  # the spec's samples wait 600_000; a test fails sooner


def space(node: DevNode) -> str:
    return new_space(node.url, "groups")


def is_good_draft(outcome: dict[str, Any]) -> bool:
    return bool(outcome["good"])


def test_the_spec_samples_with_a_worker_process(dev_node: DevNode) -> None:
    space_id = space(dev_node)

    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space_id) as rs:
            # -- Create a group and submit members --
            await rs.mailboxes.ensure("reviews", mode="WORK")
            run = await rs.scopes.create()

            # Done when five drafts have been accepted.
            group = await run.groups.create(
                mailbox="reviews",
                condition="N_ACCEPTED",
                threshold=5,
                parent_scope_id=run.id,  # cancelling the run also closes the group
            )

            tickets = []
            for i in range(12):
                tickets.append(await group.submit({"draft": i}, key=f"draft-{i}"))
            # -- Close the group: no more members; from now on it can also fail as unreachable. --
            closed = await group.close()
            assert closed == {"state": "SEALED", "outcome": None, "outcomeReason": None}

            # Workers must attach to the group's own run to receive its members.
            group_run_id = (await group.status())["scopeId"]
            assert group_run_id == group.scope_id and group_run_id != run.id

            with children() as procs:
                env = {**sdk_env(dev_node.url, group_run_id), "RUNSTATE_SPACE_ID": space_id}
                worker = procs.spawn("_group_worker.py", env=env)

                # -- Record verdicts and wait for the decision (a reviewer process) --
                verdicts = []
                for ticket in tickets:
                    result = await ticket.result(timeout_ms=RESULT_TIMEOUT_MS)
                    if result["state"] != "SUCCEEDED":
                        continue
                    if is_good_draft(result["outcome"]):
                        verdict = await group.accept(ticket.id)
                    else:
                        verdict = await group.reject(ticket.id)
                    verdicts.append(verdict)
                    if verdict["groupState"] == "FINALIZED":
                        break

                decision = await group.wait(timeout_ms=RESULT_TIMEOUT_MS)
                assert (decision["outcome"], decision["outcomeReason"]) == ("SUCCESS", "threshold_reached")
                # Drafts 0, 2, 4, 6 and 8 were accepted; the accept of draft 8 decided.
                assert [v["verdict"] for v in verdicts] == ["ACCEPTED", "REJECTED"] * 4 + ["ACCEPTED"]
                assert not any(v["late"] for v in verdicts)

                # Finalizing cancelled the group's run: the worker's consume() returns.
                output, _ = worker.communicate(timeout=WORKER_EXIT_S)
                assert worker.returncode == 0 and output.split() == ["consuming", "stopped"], output

            members = decision["members"]
            assert [m["key"] for m in members] == [f"draft-{i}" for i in range(12)]
            assert sum(m["verdict"] == "ACCEPTED" for m in members) == 5
            assert all(m["state"] in ("SUCCEEDED", "CANCELLED") for m in members)
            with pytest.raises(runstate.ScopeCancelledError):
                await rs.scope(group_run_id).mailbox("reviews").receive()
            assert (await run.status())["storedState"] == "ACTIVE"

            # A process that restarts re-attaches by id.
            again = rs.scope(run.id).groups.by_id(group.id)
            assert (await again.status())["outcomeReason"] == "threshold_reached"
            assert (await again.wait(timeout_ms=1_000))["finalizedAt"] == decision["finalizedAt"]
            assert (await again.close())["state"] == "FINALIZED"

    asyncio.run(main())


def test_blocking_client_verdicts_errors_and_late_answers(dev_node: DevNode) -> None:
    with Runstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
        rs.mailboxes.ensure("reviews")
        run = rs.scopes.create()
        with pytest.raises(runstate.NotFoundError):
            run.groups.create(mailbox="missing", condition="FIRST_ACCEPTED")
        with pytest.raises(runstate.ConfigError):
            run.groups.create(mailbox="reviews", condition="BEST")
        group = run.groups.create(mailbox="reviews", condition="FIRST_ACCEPTED", deadline=timedelta(hours=1))
        assert group.view is not None and group.view["deadline"] is not None
        first = group.submit({"n": 1}, key="a")
        second = group.submit({"n": 2}, key="b")
        assert group.submit({"n": 1}, key="a").id == first.id
        with pytest.raises(runstate.WaitTimeoutError):
            group.wait(timeout_ms=200)
        queue = rs.scope(group.status()["scopeId"]).mailbox("reviews")
        direct = queue.submit({"n": 3}, key="c")
        assert group.join_task(direct.id)["joined"] is True
        with pytest.raises(runstate.ConflictError):
            group.accept(first)  # not finished yet
        for delivery in queue.receive(max=2):
            delivery.complete({"payload": "draft"})
        decided = group.accept(first)  # a ticket works as well as its id
        assert (decided["groupState"], decided["outcome"], decided["outcomeReason"], decided["late"]) == (
            "FINALIZED", "SUCCESS", "first_accepted", False
        )
        late = group.reject(second.id)
        assert (late["verdict"], late["late"], late["outcome"]) == ("REJECTED", True, "SUCCESS")
        with pytest.raises(runstate.ConflictError) as closed:
            group.submit({"n": 4}, key="d")
        assert closed.value.code == "CONFLICT"
        with pytest.raises(runstate.ScopeCancelledError):
            queue.receive()
        assert rs.scope(run.id).groups.by_id(group.id).wait(timeout_ms=1_000)["members"][2]["state"] == "CANCELLED"
