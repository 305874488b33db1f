"""Pools, rate limits and budgets of the core, and the jobs that need them, against a small
independent model, driven by random commands (hypothesis stateful).

The model keeps runs (with deadlines and cancellation), jobs of two mailboxes with their needs,
two pools, a rate limit and a budget with their holds, and every take. It predicts every answer,
the ids included, and after every step the core's state must agree with it. Independently of the
model, the properties the issue asks for are checked on the core's state and on the history of
its answers:
- never more than `size` slots held: a step after which more slots are in use leaves at most
  `size` in use (a resize below the slots in use grants nothing new until enough return);
- never more spent plus reserved than a budget's total, in the same sense;
- never more than `units` taken in any window of a limit's interval, over every take ever made,
  by limit.take and by receives, each under the config of its time;
- a job never holds one resource while it waits for another: a RUNNING job holds all it needs,
  any other job nothing, and every hold of a job belongs to its current delivery;
- in-order service: a receive never hands out a job while an earlier job of the same queue that
  needs one of its resources stays queued;
- a snapshot taken in the middle of a history round-trips, and a core restored from it goes on.

Times, as in test_actors_model: commands happen at whole seconds and every lease, delay and
deadline the test chooses ends at a distinct `ms % 1000`, so no two time-driven transitions fall
due at the same instant.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from runstate_server.actors import resources
from runstate_server.actors.state import TaskState
from tests.test_actors_harness import Harness, heap_is_valid, pack, round_trip, snapshot_bytes, unpack

RETENTION_MS = 10**9  # runs are never removed here (test_actors_model covers retention)
MAILBOXES = ("a", "b")
KEYS = ("k1", "k2", "k3", "k4", "k5")
POOLS = ("p1", "p2")
LIMIT, BUDGET = "l1", "b1"
UNKNOWN = "zz"
GHOST_RUN = "run_ghost"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"}
POOL_SIZES = (1, 2, 3)
LIMIT_CONFIGS = ((2, 1_500), (3, 2_500), (5, 4_000), (1, 1_000))
BUDGET_TOTALS = (500_000, 1_000_000, 2_000_000)
AMOUNTS = (100_000, 300_000, 700_000, 1_200_000)
SPENDS = (None, None, 0, 50_000, 250_000, 900_000, 3_000_000, -1)

NEEDS = st.fixed_dictionaries(
    {},
    optional={
        "slots": st.lists(st.sampled_from([*POOLS, *POOLS, UNKNOWN]), max_size=3),
        "limit": st.tuples(st.sampled_from([LIMIT, LIMIT, LIMIT, UNKNOWN]), st.integers(1, 6)),
        "budget": st.tuples(st.sampled_from([BUDGET, BUDGET, BUDGET, UNKNOWN]), st.sampled_from(AMOUNTS)),
    },
)

# Needs that exist and fit the usual configs: jobs that get far (waiting, running, ending).
FITTING_NEEDS = st.fixed_dictionaries(
    {},
    optional={
        "slots": st.lists(st.sampled_from(POOLS), min_size=1, max_size=2),
        "limit": st.tuples(st.just(LIMIT), st.integers(1, 2)),
        "budget": st.tuples(st.just(BUDGET), st.sampled_from(AMOUNTS[:3])),
    },
)

COMPETING_NEEDS = (
    {"slots": ["p2"]},
    {"slots": ["p1", "p2"]},
    {"slots": ["p1"]},
    {"slots": ["p1", "p1"]},
    {"limit": ("l1", 1)},
    {"limit": ("l1", 2), "slots": ["p1"]},
    {"budget": ("b1", 300_000)},
    {"budget": ("b1", 700_000), "slots": ["p2"]},
    {},
)


@dataclass
class MRun:
    id: str
    deadline: int | None
    stored: str = "ACTIVE"
    deadline_done: bool = False


@dataclass
class MTask:
    id: str
    run: str
    mailbox: str
    key: str
    needs: dict[str, Any] | None
    attempts: int
    state: str = "QUEUED"
    failures: int = 0
    delivery: str | None = None
    delivery_count: int = 0
    lease_ms: int = 0
    lease_expires: int = 0
    lease_seq: int = 0  # the order of its receive's arming: jobs of one receive lapse together
    ready_at: int = 0
    slots: list[str] = field(default_factory=list)
    reservation: str | None = None
    finished_by: str | None = None


@dataclass
class MHold:
    id: str
    kind: str  # "pool" or "budget"
    resource: str
    run: str
    task: str | None
    amount: int
    lease_ms: int = 0
    expires: int = 0


class Rejection(Exception):
    def __init__(self, code: str) -> None:
        self.code = code


def needed(needs: dict[str, Any] | None) -> set[tuple[str, str]]:
    if needs is None:
        return set()
    found = {("pool", name) for name in needs["slots"]}
    if needs["limit"] is not None:
        found.add(("limit", needs["limit"][0]))
    if needs["budget"] is not None:
        found.add(("budget", needs["budget"][0]))
    return found


class ResourcesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(now_ms=1_000_000, epoch=1)
        self.now = self.h.now_ms
        self.epoch = 1
        self.state_epoch = 0
        self.unique = 0
        self.unique_seq = 0
        self.runs: dict[str, MRun] = {}
        self.tasks: dict[str, MTask] = {}
        self.by_key: dict[tuple[str, str, str], str] = {}
        self.ready: dict[tuple[str, str], list[str]] = {}
        self.deliveries: list[str] = ["tsk_ghost.1.00000000"]
        self.sizes: dict[str, int] = {}
        self.limit: tuple[int, int] | None = None  # (units, interval_ms)
        self.total: int | None = None
        self.spent = 0
        self.holds: dict[str, MHold] = {}  # live holds, in grant order
        self.hold_ids: list[str] = ["slt_ghost", "rsv_ghost"]  # every hold id ever granted
        # Every take the core granted, by limit.take or by a receive, in order: (ms, units, the
        # limit's units and interval then).
        self.takes: list[tuple[int, int, int, int]] = []

    # -- helpers ---------------------------------------------------------------------------------

    def odd_ms(self, seconds: int) -> int:
        self.unique += 1
        assert self.unique < 1000
        return seconds * 1000 + self.unique

    def command_id(self) -> str:
        """The id of the command the harness applied last."""
        count = self.h.commands
        return f"{count:08x}{count * 2654435761 % 2**32:08x}"

    def inactive(self, run_id: str) -> str | None:
        run = self.runs[run_id]
        if run.stored != "ACTIVE":
            return "SCOPE_CANCELLED"
        if run.deadline is not None and self.now >= run.deadline:
            return "DEADLINE_EXCEEDED"
        return None

    def require_run(self, run_id: str) -> MRun:
        if run_id not in self.runs:
            raise Rejection("NOT_FOUND")
        return self.runs[run_id]

    def require_active(self, run_id: str) -> None:
        code = self.inactive(run_id)
        if code is not None:
            raise Rejection(code)

    def in_use(self, pool: str) -> int:
        return sum(1 for hold in self.holds.values() if hold.kind == "pool" and hold.resource == pool)

    def reserved(self) -> int:
        return sum(hold.amount for hold in self.holds.values() if hold.kind == "budget")

    def remaining(self) -> int:
        assert self.total is not None
        return self.total - self.spent - self.reserved()

    def taken_in(self, start_exclusive: int, end: int) -> int:
        return sum(units for at, units, _, _ in self.takes if start_exclusive < at <= end)

    def available_at(self, units: int) -> int | None:
        """The first time from now at which `units` can be taken if nobody else takes, searched
        over the times at which a take leaves the window."""
        assert self.limit is not None
        limit_units, interval = self.limit
        if units > limit_units:
            return None
        candidates = sorted({self.now} | {at + interval for at, _, _, _ in self.takes if at + interval > self.now})
        for candidate in candidates:
            if self.taken_in(candidate - interval, self.now) + units <= limit_units:
                return candidate
        raise AssertionError("the window empties")

    def record_take(self, units: int) -> None:
        assert self.limit is not None
        self.takes.append((self.now, units, *self.limit))

    def charge(self, hold: MHold, spent: int) -> tuple[int, int]:
        charged = min(spent, hold.amount + max(self.remaining(), 0))
        del self.holds[hold.id]
        self.spent += charged
        return charged, hold.amount - min(charged, hold.amount)

    def end_hold(self, hold: MHold, spent: int) -> None:
        if hold.kind == "budget":
            self.charge(hold, spent)
        else:
            del self.holds[hold.id]

    def end_holds(self, task: MTask, spent: int | None) -> None:
        for lease_id in task.slots:
            del self.holds[lease_id]
        if task.reservation is not None:
            hold = self.holds[task.reservation]
            self.charge(hold, hold.amount if spent is None else spent)
        task.slots, task.reservation = [], None

    def short(self, needs: dict[str, Any]) -> bool:
        """Whether something the job needs cannot be taken now."""
        for pool, count in Counter(needs["slots"]).items():
            if self.in_use(pool) + count > self.sizes[pool]:
                return True
        if needs["limit"] is not None and self.available_at(needs["limit"][1]) != self.now:
            return True
        return needs["budget"] is not None and needs["budget"][1] > self.remaining()

    def take_needs(self, task: MTask, delivery_id: str) -> None:
        assert task.needs is not None
        delivery = ".".join(delivery_id.split(".", 2)[:2])  # its number, not its token
        for index, pool in enumerate(task.needs["slots"]):
            hold = MHold(f"slt_{delivery}.{index}", "pool", pool, task.run, task.id, 1)
            self.holds[hold.id] = hold
            task.slots.append(hold.id)
        if task.needs["limit"] is not None:
            self.record_take(task.needs["limit"][1])
        if task.needs["budget"] is not None:
            hold = MHold(f"rsv_{delivery}", "budget", BUDGET, task.run, task.id, task.needs["budget"][1])
            self.holds[hold.id] = hold
            task.reservation = hold.id
        self.hold_ids.extend([*task.slots, *([task.reservation] if task.reservation else [])])

    def make_ready(self, task: MTask) -> None:
        task.state, task.ready_at = "QUEUED", 0
        self.ready.setdefault((task.run, task.mailbox), []).append(task.id)

    def finish(self, task: MTask, state: str) -> None:
        task.state, task.finished_by, task.delivery = state, task.delivery, None

    def fail_attempt(self, task: MTask, delay_ms: int) -> None:
        task.failures += 1
        if task.failures >= task.attempts:
            event("out of attempts")
            self.finish(task, "FAILED")
            return
        task.delivery = None
        if delay_ms <= 0:
            self.make_ready(task)
        else:
            task.state, task.ready_at = "QUEUED", self.now + delay_ms

    def stop(self, run_id: str, task_state: str) -> None:
        for task in self.tasks.values():
            if task.run == run_id and task.state not in TERMINAL:
                if task.state == "RUNNING":
                    event("a stop returns a running job's holds")
                    self.end_holds(task, 0)
                task.state = task_state
        for mailbox in MAILBOXES:
            self.ready.pop((run_id, mailbox), None)

    def require_delivery(self, delivery: str) -> MTask:
        task = self.tasks.get(delivery.split(".", 1)[0])
        if task is None:
            raise Rejection("NOT_FOUND")
        if task.delivery != delivery:
            raise Rejection("STALE_CLAIM")
        return task

    def require_live_lease(self, task: MTask) -> None:
        if task.state != "RUNNING" or self.now >= task.lease_expires:
            raise Rejection("STALE_CLAIM")

    def handback(self, delivery: str) -> tuple[MTask, bool]:
        task = self.require_delivery(delivery)
        if task.state in ("CANCELLED", "EXPIRED"):
            event("handback after a stop")
            task.delivery = None
            return task, False
        self.require_live_lease(task)
        return task, True

    def require_spent(self, spent: int | None) -> None:
        if spent is not None and spent < 0:
            raise Rejection("VALIDATION_FAILED")

    def require_direct(self, hold_id: str) -> MHold | None:
        hold = self.holds.get(hold_id)
        if hold is not None and hold.task is not None:
            raise Rejection("CONFLICT")
        return hold

    def require_held(self, hold_id: str) -> MHold:
        hold = self.require_direct(hold_id)
        if hold is None:
            raise Rejection("STALE_CLAIM")
        return hold

    # -- running a command against both ----------------------------------------------------------

    def execute(self, kind: str, args: dict[str, Any], model_step: Any) -> tuple[Any, Any]:
        self.h.now_ms = self.now
        state = self.h.state
        before = snapshot_bytes(state, without_clock=True)
        in_use_before = {name: len(pool.holds) for name, pool in self.core_pools().items()}
        budget = self.core_budget()
        used_before = (budget.settled_minor, budget.reserved_minor) if budget else (0, 0)
        result = self.h.apply(kind, epoch=self.epoch, **args)
        try:
            expected = model_step()
        except Rejection as rejection:
            event(f"{kind} -> {rejection.code}")
            assert result.get("error", {}).get("code") == rejection.code, (kind, args, result)
            assert self.h.effects == []
            assert snapshot_bytes(state, without_clock=True) == before, f"refused {kind} changed the state"
            return result, None
        assert "error" not in result, (kind, args, result)
        event(f"{kind} -> ok")
        self.check_capacity(in_use_before, used_before)
        return result, expected

    def core_pools(self) -> dict[str, Any]:
        return {name: self.h.state.pools[f"space-1/{name}"] for name in self.sizes}

    def core_budget(self) -> Any:
        return self.h.state.budgets.get(f"space-1/{BUDGET}")

    def check_capacity(self, in_use_before: dict[str, int], used_before: tuple[int, int]) -> None:
        """Never more slots held than a pool's size, never more spent plus reserved than a
        budget's total: a step that grows either stays within the bound; a step that lowers the
        bound below what is used grants nothing new. What returns wakes the resource."""
        woken = self.h.woken()
        for name, pool in self.core_pools().items():
            in_use = len(pool.holds)
            if in_use > in_use_before.get(name, 0):
                assert in_use <= pool.size, (name, in_use, pool.size)
            if in_use < in_use_before.get(name, 0):
                assert ("resource", "space-1", "pool", name) in woken
        budget = self.core_budget()
        if budget is not None:
            spent_before, reserved_before = used_before
            used = budget.settled_minor + budget.reserved_minor
            if used > spent_before + reserved_before:
                assert used <= budget.limit_minor, (used, budget.limit_minor)
            if budget.reserved_minor < reserved_before:
                assert ("resource", "space-1", "budget", BUDGET) in woken

    # -- rules: config ---------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        for mailbox in MAILBOXES:
            self.h.ok("mailbox.ensure", name=mailbox)
        for name, size in zip(POOLS, (2, 1), strict=True):
            self.ensure_pool(name, size)
        self.ensure_limit(*LIMIT_CONFIGS[1])
        self.ensure_budget(1_000_000)
        self.create_run(None)
        self.create_run(None)

    @rule(name=st.sampled_from(POOLS), size=st.sampled_from(POOL_SIZES))
    def ensure_pool(self, name: str, size: int) -> None:
        def model() -> bool:
            created = name not in self.sizes
            self.sizes[name] = size
            return created

        result, created = self.execute("pool.ensure", {"name": name, "size": size}, model)
        assert result == {"name": name, "size": size, "created": created}

    @rule(config=st.sampled_from(LIMIT_CONFIGS))
    def ensure_limit_config(self, config: tuple[int, int]) -> None:
        self.ensure_limit(*config)

    def ensure_limit(self, units: int, interval_ms: int) -> None:
        def model() -> bool:
            created = self.limit is None
            self.limit = (units, interval_ms)
            return created

        result, created = self.execute("limit.ensure", {"name": LIMIT, "units": units, "interval_ms": interval_ms}, model)
        assert result == {"name": LIMIT, "units": units, "interval_ms": interval_ms, "created": created}

    @rule(total=st.sampled_from(BUDGET_TOTALS))
    def ensure_budget(self, total: int) -> None:
        def model() -> bool:
            created = self.total is None
            self.total = total
            return created

        result, created = self.execute("budget.ensure", {"name": BUDGET, "total_micros": total}, model)
        assert result == {"name": BUDGET, "total_micros": total, "created": created}

    # -- rules: runs -----------------------------------------------------------------------------

    @rule(deadline_s=st.none() | st.integers(5, 60))
    def create_run(self, deadline_s: int | None) -> None:
        deadline = None if deadline_s is None else self.now + self.odd_ms(deadline_s)
        result, _ = self.execute("run.create", {"deadline_ms": deadline}, lambda: None)
        self.runs[result["run_id"]] = MRun(result["run_id"], deadline)

    def draw_run(self, data: st.DataObject) -> str:
        return data.draw(st.sampled_from(list(self.runs) * 4 + [GHOST_RUN]), label="run")

    def active_runs(self) -> list[str]:
        return [run_id for run_id in self.runs if self.inactive(run_id) is None]

    @rule(data=st.data(), rare=st.integers(0, 3))
    def cancel_run(self, data: st.DataObject, rare: int, run_id: str | None = None) -> None:
        if rare:
            return  # a stop ends most of what can happen in a run: make it rarer
        if run_id is None:
            run_id = self.draw_run(data)

        def model() -> None:
            run = self.require_run(run_id)
            if run.stored == "ACTIVE":
                run.stored = "CANCELLED"
                self.stop(run_id, "CANCELLED")

        self.execute("run.cancel", {"run_id": run_id, "retention_ms": RETENTION_MS}, model)

    # -- rules: jobs -----------------------------------------------------------------------------

    @rule(
        data=st.data(),
        mailbox=st.sampled_from(MAILBOXES),
        key=st.sampled_from(KEYS),
        needs=NEEDS,
        attempts=st.integers(1, 3),
    )
    def submit(self, data: st.DataObject, mailbox: str, key: str, needs: dict[str, Any], attempts: int) -> None:
        self.submit_to(self.draw_run(data), mailbox, key, needs, attempts)

    # More rules for the common path, so that jobs get far enough to wait, run, lapse and end.

    @precondition(lambda self: bool(self.active_runs()))
    @rule(
        data=st.data(),
        mailbox=st.sampled_from(("a", "a", "b")),
        key=st.sampled_from(KEYS),
        needs=FITTING_NEEDS,
        attempts=st.integers(1, 3),
    )
    def submit_a_job_to_an_active_run(
        self, data: st.DataObject, mailbox: str, key: str, needs: dict[str, Any], attempts: int
    ) -> None:
        run_id = data.draw(st.sampled_from(self.active_runs()), label="run")
        self.submit_to(run_id, mailbox, key, needs, attempts)

    @precondition(lambda self: bool(self.active_runs()))
    @rule(data=st.data(), needs=st.lists(st.sampled_from(COMPETING_NEEDS), min_size=2, max_size=4))
    def submit_jobs_that_compete(self, data: st.DataObject, needs: list[dict[str, Any]]) -> None:
        """Jobs of one queue that need the same scarce resources: some wait, some are not passed."""
        run_id = data.draw(st.sampled_from(self.active_runs()), label="run")
        for index, job_needs in enumerate(needs):
            self.submit_to(run_id, "a", f"c{len(self.tasks)}-{index}", job_needs, 2)

    @precondition(lambda self: any(t.state == "RUNNING" for t in self.tasks.values()))
    @rule(data=st.data(), spent=st.sampled_from(SPENDS), how=st.sampled_from(["complete", "retry", "release"]))
    def end_a_held_delivery(self, data: st.DataObject, spent: int | None, how: str) -> None:
        held = sorted(t.delivery for t in self.tasks.values() if t.delivery is not None and t.state == "RUNNING")
        delivery = data.draw(st.sampled_from(held), label="delivery")
        if how == "complete":
            self.complete_delivery(delivery, spent)
        elif how == "retry":
            self.retry_delivery(delivery, spent, False)
        else:
            self.release_delivery(delivery)

    @precondition(lambda self: any(t.state == "RUNNING" for t in self.tasks.values()))
    @rule(data=st.data(), rare=st.integers(0, 2))
    def cancel_a_run_with_jobs_running(self, data: st.DataObject, rare: int) -> None:
        if rare:
            return
        running = sorted({t.run for t in self.tasks.values() if t.state == "RUNNING"})
        self.cancel_run(data, 0, data.draw(st.sampled_from(running), label="run"))

    def submit_to(self, run_id: str, mailbox: str, key: str, needs: dict[str, Any], attempts: int) -> None:
        args = {"run_id": run_id, "mailbox": mailbox, "key": key, "input": key, "input_hash": key,
                "attempts": attempts, "needs": needs}

        def model() -> MTask | str:
            self.require_run(run_id)
            normalized = self.require_needs(needs)
            existing = self.by_key.get((run_id, mailbox, key))
            if existing is not None:
                return existing
            self.require_active(run_id)
            return MTask("tsk_" + self.command_id(), run_id, mailbox, key, normalized, attempts)

        result, outcome = self.execute("task.submit", args, model)
        if isinstance(outcome, str):
            assert {"task_id": outcome, "created": False}.items() <= result.items()
        elif outcome is not None:
            assert {"task_id": outcome.id, "created": True}.items() <= result.items()
            self.tasks[outcome.id] = outcome
            self.by_key[(run_id, mailbox, key)] = outcome.id
            self.make_ready(outcome)

    def require_needs(self, needs: dict[str, Any]) -> dict[str, Any] | None:
        slots = list(needs.get("slots", []))
        for pool, count in Counter(slots).items():
            if pool not in self.sizes:
                raise Rejection("NOT_FOUND")
            if count > self.sizes[pool]:
                raise Rejection("VALIDATION_FAILED")
        limit, budget = needs.get("limit"), needs.get("budget")
        if limit is not None:
            if limit[0] != LIMIT:
                raise Rejection("NOT_FOUND")
            assert self.limit is not None
            if limit[1] > self.limit[0]:
                raise Rejection("VALIDATION_FAILED")
        if budget is not None:
            if budget[0] != BUDGET:
                raise Rejection("NOT_FOUND")
            assert self.total is not None
            if budget[1] > self.total:
                raise Rejection("VALIDATION_FAILED")
        if not slots and limit is None and budget is None:
            return None
        return {"slots": slots, "limit": None if limit is None else list(limit),
                "budget": None if budget is None else list(budget)}

    @rule(data=st.data(), mailbox=st.sampled_from(MAILBOXES), count_max=st.integers(1, 3), lease_s=st.integers(2, 20))
    def receive(self, data: st.DataObject, mailbox: str, count_max: int, lease_s: int) -> None:
        self.receive_from(self.draw_run(data), mailbox, count_max, lease_s)

    @precondition(lambda self: any(self.ready.values()))
    @rule(data=st.data(), count_max=st.integers(1, 3), lease_s=st.integers(2, 20))
    def receive_where_there_is_work(self, data: st.DataObject, count_max: int, lease_s: int) -> None:
        run_id, mailbox = data.draw(st.sampled_from(sorted(key for key, ready in self.ready.items() if ready)))
        self.receive_from(run_id, mailbox, count_max, lease_s)

    def receive_from(self, run_id: str, mailbox: str, count_max: int, lease_s: int) -> None:
        lease_ms = self.odd_ms(lease_s)
        args = {"run_id": run_id, "mailbox": mailbox, "max": count_max, "lease_ms": lease_ms, "holder": "w"}
        run = self.h.state.runs.get(run_id)
        queue = run.queues.get(mailbox) if run is not None else None
        order = list(queue.ready) if queue is not None else []

        def model() -> list[str]:
            self.require_run(run_id)
            self.require_active(run_id)
            queued = self.ready.get((run_id, mailbox), [])
            delivered: list[str] = []
            passed: set[tuple[str, str]] = set()
            for task_id in list(queued):
                if len(delivered) == count_max:
                    break
                task = self.tasks[task_id]
                wants = needed(task.needs)
                if task.needs is not None and (wants & passed or self.short(task.needs)):
                    event("receive: a job waits" if not wants & passed else "receive: a job is not passed")
                    passed |= wants
                    continue
                task.delivery_count += 1
                task.delivery = f"{task.id}.{task.delivery_count}.{self.command_id()}"
                if task.needs is not None:
                    self.take_needs(task, task.delivery)
                task.state, task.lease_ms, task.lease_expires = "RUNNING", lease_ms, self.now + lease_ms
                self.unique_seq += 1
                task.lease_seq = self.unique_seq
                queued.remove(task_id)
                delivered.append(task_id)
            return delivered

        result, delivered = self.execute("task.receive", args, model)
        if delivered is None:
            return
        assert result["task_ids"] == delivered and [given["task_id"] for given in result["deliveries"]] == delivered
        for task_id in delivered:
            task = self.tasks[task_id]
            assert task.delivery is not None
            self.deliveries.append(task.delivery)
            if task.needs is not None and task.needs["limit"] is not None:
                event("receive takes from the limit")
        # In-order service, on the core's own queue: no job handed out while an earlier one that
        # needs one of its resources stays queued.
        for position, task_id in enumerate(order):
            if task_id in delivered:
                wants = needed(self.tasks[task_id].needs)
                for earlier in order[:position]:
                    if earlier not in delivered:
                        assert not needed(self.tasks[earlier].needs) & wants, (earlier, task_id)

    def draw_delivery(self, data: st.DataObject) -> str:
        held = [t.delivery for t in self.tasks.values() if t.delivery is not None]
        return data.draw(st.sampled_from(held * 4 + self.deliveries[-3:] + self.deliveries), label="delivery")

    @precondition(lambda self: len(self.deliveries) > 1)
    @rule(data=st.data(), lease_s=st.integers(2, 30))
    def renew_delivery(self, data: st.DataObject, lease_s: int) -> None:
        delivery = self.draw_delivery(data)
        lease_ms = self.odd_ms(lease_s)

        def model() -> int:
            task = self.require_delivery(delivery)
            self.require_active(task.run)
            self.require_live_lease(task)
            task.lease_ms = lease_ms
            task.lease_expires = max(task.lease_expires, self.now + lease_ms)
            return task.lease_expires

        result, expires = self.execute("delivery.renew", {"delivery_id": delivery, "lease_ms": lease_ms}, model)
        if expires is not None:
            assert result["lease_expires_ms"] == expires

    @precondition(lambda self: len(self.deliveries) > 1)
    @rule(data=st.data(), spent=st.sampled_from(SPENDS))
    def complete(self, data: st.DataObject, spent: int | None) -> None:
        self.complete_delivery(self.draw_delivery(data), spent)

    def complete_delivery(self, delivery: str, spent: int | None) -> None:
        def model() -> MTask:
            self.require_spent(spent)
            done = self.tasks.get(delivery.split(".", 1)[0])
            if done is not None and done.state == "SUCCEEDED" and done.finished_by == delivery:
                return done
            task = self.require_delivery(delivery)
            self.require_active(task.run)
            self.require_live_lease(task)
            self.end_holds(task, spent)
            self.finish(task, "SUCCEEDED")
            return task

        self.execute("delivery.complete", {"delivery_id": delivery, "payload": 1, "spent_micros": spent}, model)

    @precondition(lambda self: len(self.deliveries) > 1)
    @rule(data=st.data(), spent=st.sampled_from(SPENDS), later=st.booleans())
    def retry(self, data: st.DataObject, spent: int | None, later: bool) -> None:
        self.retry_delivery(self.draw_delivery(data), spent, later)

    def retry_delivery(self, delivery: str, spent: int | None, later: bool) -> None:
        delay_ms = self.odd_ms(2) if later else 0

        def model() -> None:
            self.require_spent(spent)
            task, live = self.handback(delivery)
            if live:
                self.end_holds(task, spent)
                self.fail_attempt(task, delay_ms)

        args = {"delivery_id": delivery, "error": "e", "delay_ms": delay_ms, "spent_micros": spent}
        self.execute("delivery.retry", args, model)

    @precondition(lambda self: len(self.deliveries) > 1)
    @rule(data=st.data(), spent=st.sampled_from(SPENDS))
    def reject(self, data: st.DataObject, spent: int | None) -> None:
        delivery = self.draw_delivery(data)

        def model() -> None:
            self.require_spent(spent)
            task, live = self.handback(delivery)
            if live:
                self.end_holds(task, spent)
                task.failures += 1
                self.finish(task, "FAILED")

        self.execute("delivery.reject", {"delivery_id": delivery, "error": "e", "spent_micros": spent}, model)

    @precondition(lambda self: len(self.deliveries) > 1)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        self.release_delivery(self.draw_delivery(data))

    def release_delivery(self, delivery: str) -> None:
        def model() -> None:
            task, live = self.handback(delivery)
            if live:
                self.end_holds(task, 0)
                task.delivery = None
                self.make_ready(task)

        self.execute("delivery.release", {"delivery_id": delivery}, model)

    # -- rules: direct holds and takes -----------------------------------------------------------

    @rule(data=st.data(), pool=st.sampled_from([*POOLS, UNKNOWN]), lease_s=st.integers(2, 20))
    def acquire(self, data: st.DataObject, pool: str, lease_s: int) -> None:
        run_id = self.draw_run(data)
        lease_ms = self.odd_ms(lease_s)

        def model() -> MHold | None:
            if pool not in self.sizes:
                raise Rejection("NOT_FOUND")
            self.require_run(run_id)
            self.require_active(run_id)
            if self.in_use(pool) >= self.sizes[pool]:
                return None
            return MHold("slt_" + self.command_id(), "pool", pool, run_id, None, 1, lease_ms, self.now + lease_ms)

        args = {"name": pool, "run_id": run_id, "lease_ms": lease_ms, "holder": "d"}
        self.grant("pool.acquire", args, model, "lease_id")

    @rule(data=st.data(), amount=st.sampled_from(AMOUNTS), lease_s=st.integers(2, 20))
    def reserve(self, data: st.DataObject, amount: int, lease_s: int) -> None:
        run_id = self.draw_run(data)
        lease_ms = self.odd_ms(lease_s)

        def model() -> MHold | None:
            self.require_run(run_id)
            assert self.total is not None
            if amount > self.total:
                raise Rejection("VALIDATION_FAILED")
            self.require_active(run_id)
            if amount > self.remaining():
                return None
            return MHold("rsv_" + self.command_id(), "budget", BUDGET, run_id, None, amount, lease_ms, self.now + lease_ms)

        args = {"name": BUDGET, "run_id": run_id, "amount_micros": amount, "lease_ms": lease_ms, "holder": "d"}
        self.grant("budget.reserve", args, model, "reservation_id")

    def grant(self, kind: str, args: dict[str, Any], model: Any, id_field: str) -> None:
        result, granted = self.execute(kind, args, model)
        if "error" in result:
            return
        if granted is None:
            assert result == {"granted": False, "unchanged": True}  # nothing taken: not kept for a retry
            return
        assert result == {"granted": True, id_field: granted.id, "lease_expires_ms": granted.expires}
        self.holds[granted.id] = granted
        self.hold_ids.append(granted.id)

    def draw_hold(self, data: st.DataObject, prefix: str) -> str:
        live = [hold_id for hold_id, hold in self.holds.items() if hold.task is None and hold_id.startswith(prefix)]
        known = [hold_id for hold_id in self.hold_ids if hold_id.startswith(prefix)]
        return data.draw(st.sampled_from(live * 4 + known), label="hold")

    @rule(data=st.data(), slot=st.booleans(), lease_s=st.integers(2, 30))
    def renew_hold(self, data: st.DataObject, slot: bool, lease_s: int) -> None:
        hold_id = self.draw_hold(data, "slt_" if slot else "rsv_")
        lease_ms = self.odd_ms(lease_s)

        def model() -> int:
            hold = self.require_held(hold_id)
            self.require_active(hold.run)
            if self.now >= hold.expires:
                raise Rejection("STALE_CLAIM")
            hold.lease_ms, hold.expires = lease_ms, max(hold.expires, self.now + lease_ms)
            return hold.expires

        field_name = "lease_id" if slot else "reservation_id"
        kind = "pool.renew" if slot else "budget.renew"
        result, expires = self.execute(kind, {field_name: hold_id, "lease_ms": lease_ms}, model)
        if expires is not None:
            assert result == {"lease_expires_ms": expires}

    @rule(data=st.data(), slot=st.booleans())
    def release_hold(self, data: st.DataObject, slot: bool) -> None:
        hold_id = self.draw_hold(data, "slt_" if slot else "rsv_")

        def model() -> bool:
            hold = self.require_direct(hold_id)
            if hold is None:
                return False
            self.end_hold(hold, 0)
            return self.now < hold.expires

        field_name = "lease_id" if slot else "reservation_id"
        result, released = self.execute("pool.release" if slot else "budget.release", {field_name: hold_id}, model)
        if released is not None:
            assert result == {"released": released}

    @rule(data=st.data(), spent=st.sampled_from(SPENDS))
    def settle(self, data: st.DataObject, spent: int | None) -> None:
        hold_id = self.draw_hold(data, "rsv_")

        def model() -> tuple[int, int]:
            if spent is None or spent < 0:
                raise Rejection("VALIDATION_FAILED")
            hold = self.require_held(hold_id)
            if self.now >= hold.expires:
                raise Rejection("STALE_CLAIM")
            return self.charge(hold, spent)

        result, settled = self.execute("budget.settle", {"reservation_id": hold_id, "spent_micros": spent}, model)
        if settled is not None:
            event("settle charges beyond the reservation" if settled[0] > settled[1] else "settle")
            assert result == {"charged_micros": settled[0], "returned_micros": settled[1]}

    @rule(data=st.data(), units=st.integers(1, 6))
    def take(self, data: st.DataObject, units: int) -> None:
        run_id = self.draw_run(data)

        def model() -> tuple[bool, int]:
            self.require_run(run_id)
            assert self.limit is not None
            if units > self.limit[0]:
                raise Rejection("VALIDATION_FAILED")
            self.require_active(run_id)
            available = self.available_at(units)
            assert available is not None
            if available == self.now:
                self.record_take(units)
                return True, self.now
            return False, available

        result, expected = self.execute("limit.take", {"name": LIMIT, "run_id": run_id, "units": units}, model)
        if expected is not None:
            event(f"take -> taken {expected[0]}")
            unchanged = {} if expected[0] else {"unchanged": True}
            assert result == {"taken": expected[0], "available_ms": expected[1], **unchanged}

    # -- rules: time, leaders, restarts ----------------------------------------------------------

    @rule(seconds=st.integers(1, 5))
    def advance(self, seconds: int) -> None:
        self.now += seconds * 1000

    @rule(seconds=st.sampled_from([0, 1, 2, 5]))
    def tick(self, seconds: int) -> None:
        self.now += seconds * 1000
        self.execute("tick", {"retention_ms": RETENTION_MS}, self.model_tick)

    @rule()
    def tick_when_something_falls_due(self) -> None:
        dues = [t.lease_expires for t in self.tasks.values() if t.state == "RUNNING"]
        dues += [t.ready_at for t in self.tasks.values() if t.state == "QUEUED" and t.ready_at]
        dues += [hold.expires for hold in self.holds.values() if hold.task is None]
        dues += [r.deadline for r in self.runs.values() if r.deadline is not None and not r.deadline_done]
        upcoming = [due for due in dues if due > self.now]
        if upcoming:
            self.now = -(-min(upcoming) // 1000) * 1000
        self.tick(0)

    def model_tick(self) -> None:
        if self.epoch < self.state_epoch:
            raise Rejection("STALE_EPOCH")
        # (due, seq, kind, entity): only the leases of one receive fall due together, in its order.
        events: list[tuple[int, int, str, str]] = []
        for task in self.tasks.values():
            if task.state == "RUNNING" and task.lease_expires <= self.now:
                events.append((task.lease_expires, task.lease_seq, "lease", task.id))
            if task.state == "QUEUED" and 0 < task.ready_at <= self.now:
                events.append((task.ready_at, 0, "ready", task.id))
        for hold in self.holds.values():
            if hold.task is None and hold.expires <= self.now:
                events.append((hold.expires, 0, "hold", hold.id))
        for run in self.runs.values():
            if run.deadline is not None and not run.deadline_done and run.deadline <= self.now:
                events.append((run.deadline, 0, "deadline", run.id))
        for due, _seq, kind, entity in sorted(events):
            event(f"tick: {kind} due")
            if kind == "lease":
                task = self.tasks[entity]
                if task.state == "RUNNING" and task.lease_expires == due:
                    self.end_holds(task, 0)
                    self.fail_attempt(task, 0)
            elif kind == "ready":
                task = self.tasks[entity]
                if task.state == "QUEUED" and task.ready_at == due:
                    self.make_ready(task)
            elif kind == "hold":
                if entity in self.holds:
                    self.end_hold(self.holds[entity], 0)
            else:
                run = self.runs[entity]
                run.deadline_done = True
                if run.stored == "ACTIVE":
                    self.stop(entity, "EXPIRED")

    @rule()
    def new_leader(self) -> None:
        self.epoch += 1

        def model() -> None:
            if self.epoch > self.state_epoch:
                self.state_epoch = self.epoch
                for task in self.tasks.values():
                    if task.state == "RUNNING":
                        task.lease_expires = max(task.lease_expires, self.now + task.lease_ms)
                for hold in self.holds.values():
                    if hold.task is None:
                        hold.expires = max(hold.expires, self.now + hold.lease_ms)

        self.execute("leader.start", {}, model)

    @rule()
    def restart_from_snapshot(self) -> None:
        self.h.core.restore(unpack(pack(self.h.core.snapshot())))

    # -- checks ----------------------------------------------------------------------------------

    @invariant()
    def core_agrees_with_the_model(self) -> None:
        state = self.h.state
        for (run_id, mailbox), ready in self.ready.items():
            assert list(state.runs[run_id].queues[mailbox].ready) == ready, (run_id, mailbox)
        assert set(state.tasks) == set(self.tasks)
        for task_id, expected in self.tasks.items():
            task = state.tasks[task_id]
            assert (task.state, task.failures, task.delivery_id, task.needs) == (
                expected.state, expected.failures, expected.delivery, expected.needs,
            ), task_id
            assert (list(task.slot_leases), task.reservation_id) == (expected.slots, expected.reservation), task_id
            if task.state == "RUNNING":
                assert task.lease_expires_ms == expected.lease_expires
        holds = {**state.slot_leases, **state.reservations}
        assert list(holds) == [hold_id for hold_id in self.holds if hold_id.startswith("slt_")] + [
            hold_id for hold_id in self.holds if hold_id.startswith("rsv_")
        ]
        for hold_id, expected_hold in self.holds.items():
            hold = holds[hold_id]
            assert (hold.run_id, hold.task_id, hold.amount) == (expected_hold.run, expected_hold.task, expected_hold.amount)
            if hold.task_id is None:
                assert hold.lease_expires_ms == expected_hold.expires
        for name, pool in self.core_pools().items():
            assert (pool.size, pool.holds) == (
                self.sizes[name], [h for h, hold in self.holds.items() if hold.kind == "pool" and hold.resource == name]
            )
        budget = self.core_budget()
        assert (budget.limit_minor, budget.settled_minor, budget.reserved_minor) == (
            self.total, self.spent, self.reserved()
        )
        assert budget.holds == [h for h, hold in self.holds.items() if hold.kind == "budget"]
        limit = state.rate_limits[f"space-1/{LIMIT}"]
        assert (limit.units, limit.interval_ms) == self.limit
        view = resources.limit_view(state, "space-1", LIMIT, self.now)
        assert view is not None and view["takenInWindow"] == self.taken_in(self.now - limit.interval_ms, self.now)

    @invariant()
    def never_more_than_units_in_any_window(self) -> None:
        # A window with the most units ends at a take: each take, with those before it, stays
        # within the units of the config it was made under.
        for index, (at, _, units, interval) in enumerate(self.takes):
            window = sum(taken for when, taken, _, _ in self.takes[: index + 1] if when > at - interval)
            assert window <= units, (at, units, interval, self.takes)

    @invariant()
    def a_job_holds_all_it_needs_or_nothing(self) -> None:
        state = self.h.state
        held_by_tasks: set[str] = set()
        for task in state.tasks.values():
            if task.state == TaskState.RUNNING and task.needs is not None:
                pools = [state.slot_leases[lease_id].resource_id for lease_id in task.slot_leases]
                assert Counter(pools) == Counter(f"space-1/{name}" for name in task.needs["slots"])
                assert (task.reservation_id is not None) == (task.needs["budget"] is not None)
                if task.reservation_id is not None:
                    assert state.reservations[task.reservation_id].amount == task.needs["budget"][1]
                for hold_id in [*task.slot_leases, *([task.reservation_id] if task.reservation_id else [])]:
                    # Named by the delivery's number, never by its token (readers see hold ids).
                    assert hold_id.startswith(f"{hold_id[:4]}{task.id}.{task.delivery_count}")
                    assert task.delivery_id not in hold_id
                    held_by_tasks.add(hold_id)
            else:
                assert not task.slot_leases and task.reservation_id is None, task.id
        job_holds = {h.id for h in [*state.slot_leases.values(), *state.reservations.values()] if h.task_id}
        assert job_holds == held_by_tasks

    @invariant()
    def waiting_counts_queued_jobs(self) -> None:
        state = self.h.state
        counts: Counter[tuple[str, str]] = Counter()
        for task in state.tasks.values():
            if task.state == TaskState.QUEUED:
                counts.update(needed(task.needs))
        for name in self.sizes:
            assert state.pools[f"space-1/{name}"].waiting == counts[("pool", name)]
        assert state.rate_limits[f"space-1/{LIMIT}"].waiting == counts[("limit", LIMIT)]
        assert state.budgets[f"space-1/{BUDGET}"].waiting == counts[("budget", BUDGET)]

    @invariant()
    def snapshot_round_trip(self) -> None:
        data = snapshot_bytes(self.h.state)
        assert snapshot_bytes(round_trip(self.h.state)) == data
        assert heap_is_valid(self.h.state.due)


ResourcesMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_resources_against_the_model = ResourcesMachine.TestCase
