"""Slots, rate limits and spend budgets through the SDK against a real dev node: configuring them,
holding a slot (renewed, released, handed to the next waiter, a bounded wait), taking rate-limit
units, reserving and settling budget amounts, the spec's queue sample with two workers (its needs
recorded and honoured), `context().spend`, and a cancelled run (refused acquisitions, held leases
marked lost). Each test works in a space of its own, so resources never collide."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import runstate
from runstate import AsyncRunstate, Runstate
from runstate.sdk import queue as queue_module
from runstate.sdk.errors import (
    ConfigError,
    LeaseLostError,
    NotFoundError,
    ScopeCancelledError,
    ValidationError,
    WaitTimeoutError,
)
from runstate.sdk.resources import Spending, needs_body

from tests._http import new_space
from tests._nodes import DevNode, free_port
from tests.test_sdk_queue import Worker

WAIT_S = 30.0
# A lease held past its length, renewed in the background meanwhile: long enough that a loaded
# machine's late renewal still comes in time (a third of it, the SDK's renewal period).
RENEWED_LEASE_MS = 1_500
RENEWED_HOLD_S = 2.0
# Leases that must still be held when their run's cancel refuses their next renewal.
CANCELLED_LEASE_MS = 3_000
# The window of the limits whose takes must all be made within one window (sequential writes on a
# loaded machine take their time).
TAKES_WINDOW_S = 4


def space(node: DevNode) -> str:
    return new_space(node.url, "resources")


async def eventually(what: str, probe: Any, timeout_s: float = WAIT_S) -> Any:
    """`await probe()` until it is truthy; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = await probe()
        if value:
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def settled(rs: Runstate, name: str, spent: float, timeout_s: float = WAIT_S) -> dict[str, Any]:
    """The budget's view once `spent` is charged and nothing is reserved: a worker settles a job's
    reservation just after its complete, so a producer holding the result may look first."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = rs.budgets.status(name)
        if (view["spent"], view["reserved"]) == (spent, 0) or time.monotonic() >= deadline:
            return view
        time.sleep(0.02)


# -- without a server ----------------------------------------------------------------------------


def test_needs_are_checked_before_sending() -> None:
    assert needs_body(None, None, None) == {}
    assert needs_body("browser", "search-api", {"name": "model-usd", "amount": 0.4}) == {
        "slots": "browser",
        "limit": {"name": "search-api"},
        "budget": {"name": "model-usd", "reserve": 0.4},
    }
    assert needs_body(["browser", "gpu"], {"name": "search-api", "units": 2}, None) == {
        "slots": ["browser", "gpu"],
        "limit": {"name": "search-api", "units": 2},
    }
    for slots, limit, budget in [
        ([], None, None),
        ([""], None, None),
        (None, {"name": "search-api", "units": 0}, None),
        (None, {"units": 1}, None),
        (None, {"name": "x", "unit": 1}, None),
        (None, None, {"name": "model-usd"}),
        (None, None, {"name": "model-usd", "amount": -1}),
        (None, None, {"name": "model-usd", "amount": float("nan")}),
    ]:
        with pytest.raises(ConfigError):
            needs_body(slots, limit, budget)
    with pytest.raises(ConfigError, match="budget"):
        runstate.queue("bad", budget={"name": "model-usd"})(lambda input: input)


def test_a_budget_amount_has_one_name_and_the_old_one_is_deprecated() -> None:
    """`amount` everywhere (issue 43); `reserve`, its name in runstate-sdk 0.3.0's budget(name,
    reserve=) and submit budget, still works with a DeprecationWarning; both at once is an error."""
    with pytest.warns(DeprecationWarning, match="'reserve' is deprecated"):
        assert needs_body(None, None, {"name": "model-usd", "reserve": 0.4}) == {"budget": {"name": "model-usd", "reserve": 0.4}}
    with pytest.raises(ConfigError, match="budget"):
        needs_body(None, None, {"name": "model-usd", "amount": 0.4, "reserve": 0.4})
    with Runstate(base_url=f"http://127.0.0.1:{free_port()}", space_id="default") as rs:
        run = rs.scope("run_unused")
        with pytest.raises(ConfigError, match="give the amount once"):
            run.budget("model-usd", 0.4, reserve=0.4)
        with pytest.raises(ConfigError, match="needs the amount"):
            run.budget("model-usd")
        with pytest.warns(DeprecationWarning, match="'reserve' is deprecated") as warned:
            run.budget("model-usd", reserve=0.4)  # nothing is sent until the block is entered
        assert warned[0].filename == __file__


def test_spend_sums_exactly_and_needs_a_queue_handler() -> None:
    spending = Spending()
    assert spending.total is None
    for _ in range(25):
        spending.add(0.40)
    assert spending.total == 10.00
    with pytest.raises(ConfigError):
        spending.add(-0.01)
    context = runstate.Context(threading.Event(), 1, "once:key", "run_1")
    with pytest.raises(ConfigError, match="queue handler"):
        context.spend(0.1)


class FakeTransport:
    """Answers the permit (a pool's look-up, its grants) and reservation routes; renewals are
    refused from the `refuse_after`-th on."""

    holder = "fake-holder"
    holder_session = "fake-session"

    def __init__(self, refuse_after: int | None = None) -> None:
        self.refuse_after = refuse_after
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def request(self, method: str, path: str, *, body: Any = None, safe: bool, **_: Any) -> dict[str, Any]:
        action = "look-up" if "/by-name/" in path else path.rsplit("/", 1)[-1]
        self.calls.append((action, dict(body or {})))
        if action == "look-up":
            return {"id": "bdg_1", "scale": 6, "limitMinor": "1000000"} if "/budgets/" in path else {"id": "prm_1"}
        if action == "acquire":
            return {"grantId": "slt_1", "token": "slt_1.t", "units": 1, "leaseExpiresAt": "2030-01-01T00:00:00.000Z"}
        if action == "reserve":
            return {"reservationId": "rsv_1", "reservedMinor": body["amountMinor"], "state": "ACTIVE",
                    "settleBy": "2030-01-01T00:00:00.000Z"}
        if method == "GET" and path.startswith("/scopes/"):  # a reservation's renewal looks at its run
            self.calls.append(("renew", {}))
            return {"effective": "ACTIVE"}
        if action == "void":
            return {"reservationId": body["reservationId"], "state": "VOIDED", "chargedMinor": "0"}
        if action == "renew":
            renewals = sum(1 for name, _ in self.calls if name == "renew")
            if self.refuse_after is not None and renewals >= self.refuse_after:
                raise ScopeCancelledError("the run was cancelled", status=409)
            return {"leaseExpiresAt": "2030-01-01T00:00:01.000Z"}
        if action == "release":
            return {"released": True}
        if action == "settle":
            return {"reservationId": body["reservationId"], "state": "ACTIVE", "chargedMinor": body["amountMinor"]}
        raise AssertionError(f"unexpected {method} {path}")

    def actions(self) -> list[str]:
        return [name for name, _ in self.calls if name != "renew"]


def test_holding_renews_and_cancels_the_block_when_a_renewal_is_refused() -> None:
    async def main() -> None:
        transport = FakeTransport(refuse_after=3)
        run = runstate.AsyncRunstate().scope("run_1")
        run.pools._transport = transport  # type: ignore[assignment]
        started = time.monotonic()
        with pytest.raises(LeaseLostError) as caught:
            async with run.slot("browser", lease_ms=150) as lease:
                await asyncio.sleep(WAIT_S)
        assert time.monotonic() - started < WAIT_S  # the block was cancelled, not slept out
        assert isinstance(caught.value.__cause__, ScopeCancelledError)
        assert lease.lost and lease.signal.is_set()
        assert transport.actions() == ["look-up", "acquire", "release"]  # released on exit all the same
        # The cancellation the lease's loss made is taken back (Python 3.11 counts them).
        assert getattr(asyncio.current_task(), "cancelling", lambda: 0)() == 0

        # The block's own error comes out as it is; a reservation without spend() is released.
        transport = FakeTransport()
        run.budgets._transport = transport  # type: ignore[assignment]
        with pytest.raises(KeyError):
            async with run.budget("model-usd", amount=0.4):
                raise KeyError("own error")
        assert transport.actions() == ["look-up", "reserve", "void"]
        async with run.budget("model-usd", amount=0.4, lease_ms=150) as reservation:
            await asyncio.sleep(0.2)
        settle = {"reservationId": "rsv_1", "amountMinor": "400000", "workKey": "settle:rsv_1", "allowOverrun": True}
        assert transport.calls[-2:] == [("settle", settle), ("void", {"reservationId": "rsv_1", "workKey": "void:rsv_1"})]
        assert "renew" in [name for name, _ in transport.calls]
        async with run.budget("model-usd", amount=0.4) as reservation:
            reservation.spend(0.07)
            reservation.spend(0.05)
        assert transport.calls[-2] == ("settle", {**settle, "amountMinor": "120000"})

        # Cancelled from outside while held: the cancellation goes on, the slot is released.
        transport = FakeTransport()
        run.pools._transport = transport  # type: ignore[assignment]
        entered = asyncio.Event()

        async def hold() -> None:
            async with run.slot("browser"):
                entered.set()
                await asyncio.sleep(WAIT_S)

        holder = asyncio.create_task(hold())
        await entered.wait()
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        assert transport.actions() == ["look-up", "acquire", "release"]

    asyncio.run(main())


# -- configuration -------------------------------------------------------------------------------


def test_ensure_and_status_of_each_kind(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            pool = await rs.pools.ensure("browser", size=2)
            assert (pool["name"], pool["size"], pool["inUse"], pool["holders"], pool["created"]) == (
                "browser", 2, 0, [], True
            )
            resized = await rs.pools.ensure("browser", size=3)
            assert (resized["size"], resized["created"]) == (3, False)
            assert (await rs.pools.status("browser"))["size"] == 3

            limit = await rs.limits.ensure("search-api", units=10, per="500ms")
            assert (limit["units"], limit["intervalMs"], limit["available"], limit["created"]) == (10, 500, 10, True)
            assert (await rs.limits.ensure("search-api", units=5))["intervalMs"] == 1000  # per="1s"
            assert (await rs.limits.status("search-api"))["units"] == 5

            budget = await rs.budgets.ensure("model-usd", total=25.00)
            assert (budget["total"], budget["spent"], budget["reserved"], budget["remaining"]) == (25.0, 0, 0, 25.0)
            assert (await rs.budgets.status("model-usd"))["reservations"] == []
            changed = await rs.budgets.ensure("model-usd", total=30.5)  # PATCH /budgets/{id}
            assert (changed["total"], changed["remaining"], changed["created"]) == (30.5, 30.5, False)
            assert (await rs.budgets.status("model-usd"))["total"] == 30.5

            for status in (rs.pools.status, rs.limits.status, rs.budgets.status):
                with pytest.raises(NotFoundError):
                    await status("nothing")
            with pytest.raises(ConfigError):
                await rs.pools.ensure("browser", size=0)
            with pytest.raises(ConfigError):
                await rs.limits.ensure("search-api", units=1, per="soon")
            with pytest.raises(ConfigError):
                await rs.budgets.ensure("model-usd", total=-1)

    asyncio.run(main())


# -- direct use under a run ----------------------------------------------------------------------


def test_a_slot_is_held_renewed_released_and_handed_on(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node), holder="holder-a") as rs:
            await rs.pools.ensure("browser", size=1)
            run = await rs.scopes.create()
            events: list[tuple[str, float]] = []
            holding = asyncio.Event()

            async def first() -> None:
                # A lease of 1 s held for 3 s: only the background renewals keep it.
                async with run.slot("browser", lease_ms=1_000, timeout_ms=1_000) as lease:
                    holding.set()
                    view = await rs.pools.status("browser")
                    assert view["inUse"] == 1
                    assert [(h["leaseId"], h["holder"], h["scopeId"]) for h in view["holders"]] == [
                        (lease.id, "holder-a", run.id)
                    ]
                    await asyncio.sleep(3.0)
                    assert not lease.lost and not lease.signal.is_set()
                    events.append(("first released", time.monotonic()))

            async def second() -> None:
                await holding.wait()
                async with run.slot("browser", timeout_ms=10_000):
                    events.append(("second acquired", time.monotonic()))

            async def impatient() -> None:
                await holding.wait()
                started = time.monotonic()
                with pytest.raises(WaitTimeoutError):
                    async with run.slot("browser", timeout_ms=300):
                        raise AssertionError("the slot is held")
                events.append(("timed out", time.monotonic() - started))

            await asyncio.gather(first(), second(), impatient())
            names = [name for name, _ in events]
            assert names == ["timed out", "first released", "second acquired"]
            assert events[0][1] >= 0.25  # it waited out its timeout (how much longer is the machine's business)
            assert (await rs.pools.status("browser"))["inUse"] == 0

            # The explicit form: acquire, renew, release.
            lease = await run.pools.acquire("browser", lease_ms=5_000, timeout_ms=1_000)
            before = lease.lease_expires_at
            assert before is not None
            await lease.renew(lease_ms=20_000)
            assert lease.lease_expires_at is not None and lease.lease_expires_at > before
            assert await lease.release() == {"released": True}
            with pytest.raises(LeaseLostError):
                await lease.renew()
            assert lease.lost
            with pytest.raises(NotFoundError):
                await run.pools.acquire("no-such-pool", timeout_ms=0)

    asyncio.run(main())


def test_a_slot_waits_in_the_permits_fifo_line(dev_node: DevNode) -> None:
    """A full pool: the acquire joins the permit's line of waiters (`rs.pools.status` shows them);
    a wait that times out leaves the line, and the slot goes to the waiter ahead when it returns."""

    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            await rs.pools.ensure("browser", size=1)
            run = await rs.scopes.create()
            first = await run.pools.acquire("browser", lease_ms=5_000)
            second = asyncio.create_task(run.pools.acquire("browser", lease_ms=5_000, timeout_ms=20_000))
            await eventually("the second in line", lambda: _waiters(rs, ["WAITING"]))
            with pytest.raises(WaitTimeoutError):
                await run.pools.acquire("browser", timeout_ms=300)  # joins behind it, then leaves
            assert await _waiters(rs, ["WAITING"])
            await first.release()
            lease = await asyncio.wait_for(second, WAIT_S)
            view = await rs.pools.status("browser")
            assert ([h["leaseId"] for h in view["holders"]], view["waiters"]) == ([lease.id], [])
            await lease.release()

    asyncio.run(main())


async def _waiters(rs: AsyncRunstate, states: list[str]) -> bool:
    return [waiter["state"] for waiter in (await rs.pools.status("browser"))["waiters"]] == states


def test_limit_takes_wait_for_the_window(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            await rs.limits.ensure("search-api", units=2, per=f"{TAKES_WINDOW_S}s")
            run = await rs.scopes.create()
            started = time.monotonic()
            first = await run.limits.take("search-api", timeout_ms=0)
            assert first["taken"] is True
            assert (await run.limits.take("search-api", units=1, timeout_ms=0))["taken"] is True
            with pytest.raises(WaitTimeoutError):
                await run.limits.take("search-api", timeout_ms=200)
            third = await run.limits.take("search-api", timeout_ms=int(WAIT_S * 1000))
            waited_s = time.monotonic() - started
            # Not before the window opened (its 0.2 s of grace: the clocks' ms rounding, not load).
            assert third["taken"] is True and waited_s >= TAKES_WINDOW_S - 0.2, waited_s
            view = await rs.limits.status("search-api")
            assert view["takenInWindow"] <= 2
            with pytest.raises(ValidationError):
                await run.limits.take("search-api", units=3, timeout_ms=0)
            with pytest.raises(NotFoundError):
                await run.limits.take("no-such-limit", timeout_ms=0)

    asyncio.run(main())


def test_limit_takes_are_allowance_consumptions_in_a_fifo_line(dev_node: DevNode) -> None:
    """A take is a consumption of the allowance; a full window puts takes in its FIFO line, granted
    in order as it opens; a take that times out leaves the line; a settle gives unused units back."""
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            limit = await rs.limits.ensure("tokens", units=10, per=f"{TAKES_WINDOW_S}s")
            assert (limit["unitsLimit"], limit["windowSeconds"], limit["intervalMs"]) == (10, TAKES_WINDOW_S, TAKES_WINDOW_S * 1000)
            run = await rs.scopes.create()
            estimate = await run.limits.take("tokens", units=8, timeout_ms=0)
            assert estimate["consumptionId"].startswith("acn_") and estimate["units"] == 8
            with pytest.raises(WaitTimeoutError):
                await run.limits.take("tokens", units=5, timeout_ms=300)
            view = await rs.limits.status("tokens")
            assert view["waiters"] == [] and view["available"] == 2  # the timed-out take left the line
            settled = await run.limits.settle(estimate["consumptionId"], 3)  # used 3 of the 8
            assert (settled["returnedUnits"], settled["overrunUnits"]) == (5, 0)
            assert (await rs.limits.status("tokens"))["takenInWindow"] == 3
            order: list[int] = []

            async def take(n: int, units: int) -> None:
                await run.limits.take("tokens", units=units, timeout_ms=int(WAIT_S * 1000))
                order.append(n)

            first = asyncio.create_task(take(1, 8))  # 3 + 8 > 10: it waits for the window, first in line
            deadline = time.monotonic() + WAIT_S
            while not (await rs.limits.status("tokens"))["waiters"]:
                assert time.monotonic() < deadline, "the first take never joined the line"
                await asyncio.sleep(0.01)
            # It would fit now (3 + 3 <= 10), but waits behind the first; and when the window opens
            # the first's 8 leave no room for it (8 + 3 > 10), so it is granted a window later: the
            # order seen is the server's line, not which of two pollers looked first (both granted
            # at once, they could finish in either order on a loaded machine).
            second = asyncio.create_task(take(2, 3))
            await asyncio.gather(first, second)
            assert order == [1, 2]
            with pytest.raises(ConfigError):
                await run.limits.settle(estimate["consumptionId"], -1)

    asyncio.run(main())


def test_budget_reserve_settle_spend_and_release(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            await rs.budgets.ensure("model-usd", total=1.00)
            run = await rs.scopes.create()

            async def spent() -> float:
                view = await rs.budgets.status("model-usd")
                assert view["reserved"] == 0 and view["reservations"] == []
                return float(view["spent"])

            async with run.budget("model-usd", amount=0.40) as reservation:
                assert reservation.amount == 0.40
                view = await rs.budgets.status("model-usd")
                assert (view["reserved"], view["remaining"]) == (0.40, 0.60)
                for _ in range(3):
                    reservation.spend(0.1)  # summed exactly: 0.3, not 0.30000000000000004
                assert reservation.spent == 0.3
            assert await spent() == 0.3

            async with run.budget("model-usd", amount=0.40):
                pass  # spend() never called: the whole reservation counts
            assert await spent() == 0.7

            with pytest.raises(RuntimeError):
                async with run.budget("model-usd", amount=0.20):
                    raise RuntimeError("before any spend: released")
            assert await spent() == 0.7

            with pytest.raises(RuntimeError):
                async with run.budget("model-usd", amount=0.20) as reservation:
                    reservation.spend(0.05)
                    raise RuntimeError("after a spend: settled")
            assert await spent() == 0.75

            explicit = await run.budgets.reserve("model-usd", 0.20, timeout_ms=1_000)
            assert await explicit.settle(0.1) == {"charged": 0.1, "returned": 0.1}
            again = await run.budgets.reserve("model-usd", 0.10, timeout_ms=1_000)
            assert await again.release() == {"released": True}
            assert await spent() == 0.85

            with pytest.raises(WaitTimeoutError):
                await run.budgets.reserve("model-usd", 0.40, timeout_ms=200)  # 0.15 remains
            with pytest.raises(ValidationError):
                await run.budgets.reserve("model-usd", 2.00, timeout_ms=0)  # over the total

            # A reservation waits for an amount to return.
            held = await run.budgets.reserve("model-usd", 0.15, timeout_ms=1_000)

            async def settle_later() -> None:
                await asyncio.sleep(0.3)
                await held.settle(0.05)

            settling = asyncio.create_task(settle_later())
            async with run.budget("model-usd", amount=0.10, timeout_ms=5_000) as waited:
                assert waited.amount == 0.10
            await settling
            assert await spent() == 1.00

    asyncio.run(main())


def test_the_blocking_client(dev_node: DevNode) -> None:
    with Runstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
        assert rs.pools.ensure("browser", size=1)["size"] == 1
        assert rs.limits.ensure("search-api", units=3, per=1)["intervalMs"] == 1000
        assert rs.budgets.ensure("model-usd", total=1)["total"] == 1.0
        run = rs.scopes.create()
        with run.slot("browser", lease_ms=RENEWED_LEASE_MS) as lease:
            time.sleep(RENEWED_HOLD_S)  # renewed in the background while this thread works
            assert rs.pools.status("browser")["holders"][0]["leaseId"] == lease.id
            with pytest.raises(WaitTimeoutError):
                run.pools.acquire("browser", timeout_ms=100)
        assert not lease.lost and rs.pools.status("browser")["inUse"] == 0
        assert run.limits.take("search-api", units=3)["taken"] is True
        with run.budget("model-usd", amount=0.5) as reservation:
            reservation.spend(0.25)
        explicit = run.budgets.reserve("model-usd", 0.5)
        assert explicit.settle() == {"charged": 0.5, "returned": 0}
        assert rs.budgets.status("model-usd")["spent"] == 0.75
        with pytest.warns(DeprecationWarning), run.budget("model-usd", reserve=0.25):  # the old name works
            pass
        assert rs.budgets.status("model-usd")["spent"] == 1.0

        with pytest.raises(LeaseLostError):
            with run.slot("browser", lease_ms=300) as lease:
                run.cancel()
                assert lease.signal.wait(WAIT_S)  # the block runs on; signal tells it to stop
        assert isinstance(lease.lost_error, ScopeCancelledError)
        assert rs.pools.status("browser")["inUse"] == 0


# -- jobs that need resources --------------------------------------------------------------------


@pytest.fixture
def module_api(dev_node: DevNode, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Runstate, Any]]:
    """The module-level API on a fresh space and run (queues defined here are forgotten after)."""
    monkeypatch.setattr(queue_module, "_queues", {})
    space_id = space(dev_node)
    with Runstate(base_url=dev_node.url, space_id=space_id) as rs:
        run = rs.scopes.create()
        runstate.configure(base_url=dev_node.url, space_id=space_id, scope_id=run.id)
        try:
            yield rs, run
        finally:
            runstate.close()


def test_the_spec_queue_sample_with_two_workers(module_api: tuple[Runstate, Any]) -> None:
    rs, run = module_api
    rs.pools.ensure("browser", size=1)
    rs.limits.ensure("search-api", units=2, per="1s")
    rs.budgets.ensure("model-usd", total=2.00)  # five reservations of 0.40
    lock = threading.Lock()
    spans: list[tuple[float, float]] = []

    # -- the spec's sample, as written --
    @runstate.queue(
        "render",
        slots="browser",
        limit={"name": "search-api", "units": 1},
        budget={"name": "model-usd", "amount": 0.40},
    )
    def render(input: dict) -> dict:
        started = time.monotonic()
        time.sleep(0.1)
        with lock:
            spans.append((started, time.monotonic()))
        return {"rendered": input["url"]}

    jobs = [render.send({"url": f"https://example.com/{n}"}) for n in range(6)]
    task = run.task(jobs[0].id).status()
    assert task["needs"] == {  # the protocol's requirements: the budget in minor units (scale 6)
        "pools": [{"name": "browser", "units": 1}],
        "quotas": [{"name": "search-api", "units": 1}],
        "budgets": [{"name": "model-usd", "reserveMinor": "400000"}],
    }
    workers = [Worker(render), Worker(render)]
    try:
        results = [job.result(timeout=WAIT_S) for job in jobs[:5]]
        assert results == [{"rendered": f"https://example.com/{n}"} for n in range(5)]
        time.sleep(1.5)  # the budget is spent: the sixth job may not start
        assert run.task(jobs[5].id).status()["state"] == "QUEUED"
        budget = settled(rs, "model-usd", 2.0)
        assert (budget["spent"], budget["reserved"], budget["remaining"], budget["waiting"]) == (2.0, 0, 0, 1)
        # One browser: no two jobs overlapped. Two units a second: five jobs span two windows.
        ordered = sorted(spans)
        assert all(earlier[1] <= later[0] for earlier, later in zip(ordered, ordered[1:], strict=False))
        assert ordered[-1][0] - ordered[0][0] >= 1.8
        rs.budgets.ensure("model-usd", total=2.40)  # room for the sixth
        assert render({"url": "https://example.com/5"}) == {"rendered": "https://example.com/5"}
        assert rs.pools.status("browser")["inUse"] == 0
    finally:
        run.cancel()
        for worker in workers:
            worker.join()


def test_context_spend_is_reported_with_the_job(module_api: tuple[Runstate, Any]) -> None:
    rs, run = module_api
    rs.budgets.ensure("model-usd", total=10.00)
    budget = {"name": "model-usd", "amount": 0.40}

    @runstate.queue("spends", budget=budget)
    def spends(input: float) -> float:
        runstate.context().spend(input)
        runstate.context().spend(input)
        return input

    @runstate.queue("spends-all", budget=budget)
    def spends_all(input: int) -> int:
        return input

    @runstate.queue("fails", budget=budget, attempts=1)
    def fails(input: float) -> None:
        runstate.context().spend(input)
        raise RuntimeError("spent, then failed")

    worker = Worker(spends, spends_all, fails)
    try:
        assert spends(0.1) == 0.1
        assert settled(rs, "model-usd", 0.2)["spent"] == 0.2
        assert spends_all(1) == 1
        assert settled(rs, "model-usd", 0.6)["spent"] == 0.6
        with pytest.raises(runstate.TaskFailedError):
            fails(0.05)
        view = settled(rs, "model-usd", 0.65)
        assert (view["spent"], view["reserved"]) == (0.65, 0)
    finally:
        run.cancel()
        worker.join()


def test_queue_requirements_come_from_the_worker(module_api: tuple[Runstate, Any]) -> None:
    """The worker declares the queue with its requirements; a producer that names none (here a
    raw submit) still gets them; the worker settles the reservation with the spend and voids the
    rest; a failed job charges what it reported, and nothing stays reserved."""
    rs, run = module_api
    rs.pools.ensure("browser", size=1)
    rs.budgets.ensure("model-usd", total=1.00)

    @runstate.queue("declared", slots="browser", budget={"name": "model-usd", "amount": 0.25}, attempts=1)
    def declared(input: dict) -> dict:
        runstate.context().spend(0.1)
        if input.get("fail"):
            raise RuntimeError("spent, then failed")
        return input

    worker = Worker(declared)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                if rs.mailboxes.get("declared").get("requirements") is not None:
                    break
            except NotFoundError:
                pass
            assert time.monotonic() < deadline, "the worker never declared the queue"
            time.sleep(0.05)
        assert rs.mailboxes.get("declared")["requirements"] == {
            "pools": [{"name": "browser", "units": 1}],
            "budgets": [{"name": "model-usd", "reserveMinor": "250000"}],
        }
        assert rs.mailboxes.get("declared")["maxAttempts"] == 1
        mailbox = run.mailbox("declared")
        ok, failing = mailbox.submit({"n": 1}), mailbox.submit({"n": 2, "fail": True})  # no needs named
        assert ok.status()["needs"]["budgets"] == [{"name": "model-usd", "reserveMinor": "250000"}]
        assert ok.result(timeout_ms=int(WAIT_S * 1000))["state"] == "SUCCEEDED"
        assert failing.result(timeout_ms=int(WAIT_S * 1000))["state"] == "FAILED"
        view = settled(rs, "model-usd", 0.2)
        assert (view["spent"], view["reserved"], view["remaining"]) == (0.2, 0, 0.8)
        assert sorted(row["state"] for row in rs.budgets.status("model-usd")["reservations"]) == []
        assert rs.pools.status("browser")["inUse"] == 0
    finally:
        run.cancel()
        worker.join()


def test_submits_name_existing_resources(dev_node: DevNode) -> None:
    async def main() -> None:
        async with AsyncRunstate(base_url=dev_node.url, space_id=space(dev_node)) as rs:
            await rs.mailboxes.ensure("render")
            await rs.limits.ensure("search-api", units=2)
            await rs.pools.ensure("browser", size=1)
            mailbox = (await rs.scopes.create()).mailbox("render")
            with pytest.raises(NotFoundError):
                await mailbox.submit({"n": 1}, slots="no-such-pool")
            with pytest.raises(ValidationError):
                await mailbox.submit({"n": 1}, limit={"name": "search-api", "units": 3})
            tickets = await mailbox.submit_many([{"n": 1}, {"n": 2}], slots=["browser"], limit="search-api")
            for ticket in tickets:
                assert (await ticket.status())["needs"]["pools"] == [{"name": "browser", "units": 1}]
            delivery = (await mailbox.receive(max=2))[0]
            assert delivery.needs is not None and delivery.holds is not None
            assert len(delivery.holds["slots"]) == 1
            assert (await mailbox.receive(max=1)) == []  # the one browser is held
            await delivery.complete({"payload": None})
            assert len(await mailbox.receive(max=1, wait_ms=5_000)) == 1

    asyncio.run(main())


# -- a cancelled run -----------------------------------------------------------------------------


def test_a_cancelled_run_refuses_and_held_leases_are_lost(dev_node: DevNode) -> None:
    async def main() -> None:
        space_id = space(dev_node)
        async with AsyncRunstate(base_url=dev_node.url, space_id=space_id) as rs:
            await rs.pools.ensure("browser", size=1)
            await rs.limits.ensure("search-api", units=5)
            await rs.budgets.ensure("model-usd", total=1.00)
            run = await rs.scopes.create()
            held = asyncio.Event()
            seen: dict[str, Any] = {}

            async def hold_slot() -> None:
                async with run.slot("browser", lease_ms=CANCELLED_LEASE_MS) as lease:
                    seen["lease"] = lease
                    held.set()
                    await asyncio.sleep(WAIT_S)  # cancelled when a renewal is refused
                raise AssertionError("the block ran to its end")

            async def hold_budget() -> None:
                async with run.budget("model-usd", amount=0.40, lease_ms=CANCELLED_LEASE_MS) as reservation:
                    seen["reservation"] = reservation
                    reservation.spend(0.1)
                    await asyncio.sleep(WAIT_S)
                raise AssertionError("the block ran to its end")

            tasks = [asyncio.create_task(hold_slot()), asyncio.create_task(hold_budget())]
            await held.wait()
            while "reservation" not in seen:
                await asyncio.sleep(0.01)
            await rs.scope(run.id).cancel(reason="stop the swarm")
            outcomes = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
            assert all(isinstance(outcome, LeaseLostError) for outcome in outcomes), outcomes
            for lease in (seen["lease"], seen["reservation"]):
                assert lease.lost and lease.signal.is_set()
                assert isinstance(lease.lost_error, ScopeCancelledError)
            # Handed back: the slot released on exit; the reservation was voided by the run's
            # stop (the protocol's rule), so its settle on exit charged nothing.
            assert (await rs.pools.status("browser"))["inUse"] == 0
            budget = await rs.budgets.status("model-usd")
            assert (budget["spent"], budget["reserved"]) == (0, 0)

            with pytest.raises(ScopeCancelledError):
                async with run.slot("browser", timeout_ms=1_000):
                    raise AssertionError("granted under a cancelled run")
            with pytest.raises(ScopeCancelledError):
                await run.limits.take("search-api", timeout_ms=1_000)
            with pytest.raises(ScopeCancelledError):
                await run.budgets.reserve("model-usd", 0.1, timeout_ms=1_000)

    asyncio.run(main())
