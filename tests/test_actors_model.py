"""The core against a small independent model, driven by random commands (hypothesis stateful).

The model keeps, per run: its own state, parent, children, deadline and retention; per task: its
state, failed attempts, current delivery and lease expiry, backoff; per (run, mailbox): the FIFO of
ready tasks. After every step the core's answer (success, or the error code) and the whole state
must agree with the model, and the state's invariants hold.

Times: every command happens at a multiple of 1000 ms, and every lease, delay and deadline the
test chooses ends at a distinct `ms % 1000`, so no two time-driven transitions the test arms fall
due at the same instant (their order would otherwise depend on the heap's tie-break). Only the
default retry backoff and retention are whole seconds; ties among those cannot interact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from runstate_server.actors import runs as core_runs
from runstate_server.actors.state import TaskState
from runstate_server.actors.storage import json_value
from tests.test_actors_harness import (
    Harness,
    assert_stored_bytes_recount,
    heap_is_valid,
    pack,
    round_trip,
    snapshot_bytes,
    unpack,
)

RETENTION_MS = 20_000
MAILBOXES = ("a", "b")
UNKNOWN_MAILBOX = "zz"
KEYS = ("k1", "k2", "k3")
GHOST_RUN = "run_ghost"
GHOST_DELIVERY = "tsk_ghost.1.00000000"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"}


@dataclass
class ModelRun:
    id: str
    parent: str | None
    depth: int
    deadline: int | None
    deadline_seq: int
    child_limit: int
    stored: str = "ACTIVE"
    children: list[str] = field(default_factory=list)
    finished_ms: int | None = None  # set on the run a stop started at, not on the runs below
    retention_due: int | None = None
    retention_seq: int = 0
    deadline_done: bool = False
    retention_done: bool = False


@dataclass
class ModelTask:
    id: str
    run: str
    mailbox: str
    key: str
    input_hash: str
    attempts: int
    state: str = "QUEUED"
    failures: int = 0
    attempt: int = 0
    delivery: str | None = None
    lease_expires: int = 0
    finished_by: str | None = None  # the delivery that finished the task
    lease_ms: int = 0  # the length last granted (receive or renew): what a new leader extends by
    lease_seq: int = 0
    first_lease_expires: int = 0  # of the current delivery, before any renewal
    ready_at: int = 0
    ready_seq: int = 0
    error: str | None = None  # "<lapse>" for a lease that expired
    outcome: Any = None


def backoff_ms(failures: int) -> int:
    return min(1000 * 2 ** (failures - 1), 60_000)


class Rejection(Exception):
    def __init__(self, code: str) -> None:
        self.code = code


class CoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness(now_ms=1_000_000, epoch=1)
        self.now = self.h.now_ms
        self.epoch = 1
        self.state_epoch = 0
        self.mailboxes: set[str] = set()
        self.runs: dict[str, ModelRun] = {}
        self.known_runs: list[str] = [GHOST_RUN]  # every run id ever seen, removed ones included
        self.tasks: dict[str, ModelTask] = {}
        self.by_key: dict[tuple[str, str, str], str] = {}
        self.ready: dict[tuple[str, str], list[str]] = {}
        self.deliveries: list[str] = [GHOST_DELIVERY]
        self.seq = 0
        self.unique = 0

    # -- helpers ---------------------------------------------------------------------------------

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def odd_ms(self, seconds: int) -> int:
        """A duration of about `seconds` s whose end falls at a `ms % 1000` used by nothing else."""
        self.unique += 1
        assert self.unique < 1000
        return seconds * 1000 + self.unique

    def inactive(self, run_id: str) -> str | None:
        current: str | None = run_id
        while current is not None:
            run = self.runs[current]
            if run.stored != "ACTIVE":
                return "SCOPE_CANCELLED"
            if run.deadline is not None and self.now >= run.deadline:
                return "DEADLINE_EXCEEDED"
            current = run.parent
        return None

    def require_run(self, run_id: str) -> ModelRun:
        if run_id not in self.runs:
            raise Rejection("NOT_FOUND")
        return self.runs[run_id]

    def require_active(self, run_id: str) -> None:
        code = self.inactive(run_id)
        if code is not None:
            raise Rejection(code)

    def subtree(self, run_id: str) -> list[str]:
        found = [run_id]
        for member in found:
            found.extend(self.runs[member].children)
        return found

    def make_ready(self, task: ModelTask) -> None:
        task.state, task.ready_at = "QUEUED", 0
        self.ready.setdefault((task.run, task.mailbox), []).append(task.id)

    def finish(self, task: ModelTask, state: str) -> None:
        task.state, task.delivery, task.finished_by = state, None, task.delivery

    def fail_attempt(self, task: ModelTask, error: str, delay_ms: int | None) -> None:
        task.failures += 1
        task.error = error
        if task.failures >= task.attempts:
            event("out of attempts")
            self.finish(task, "FAILED")
            return
        task.delivery = None
        delay_ms = backoff_ms(task.failures) if delay_ms is None else delay_ms
        if delay_ms <= 0:
            self.make_ready(task)
        else:
            task.state, task.ready_at, task.ready_seq = "QUEUED", self.now + delay_ms, self.next_seq()

    def stop(self, run_id: str, task_state: str) -> None:
        for member in self.subtree(run_id):
            for task in self.tasks.values():
                if task.run == member and task.state not in TERMINAL:
                    task.state = task_state
            for mailbox in MAILBOXES:
                self.ready.pop((member, mailbox), None)
        run = self.runs[run_id]
        if run.finished_ms is None:
            run.finished_ms = self.now
            run.retention_due, run.retention_seq = self.now + RETENTION_MS, self.next_seq()

    def remove(self, run_id: str) -> None:
        parent = self.runs[run_id].parent
        if parent is not None:
            self.runs[parent].children.remove(run_id)
        for member in self.subtree(run_id):
            for task_id in [t.id for t in self.tasks.values() if t.run == member]:
                task = self.tasks.pop(task_id)
                del self.by_key[(task.run, task.mailbox, task.key)]
            for mailbox in MAILBOXES:
                self.ready.pop((member, mailbox), None)
            del self.runs[member]

    def require_delivery(self, delivery_id: str) -> ModelTask:
        task = self.tasks.get(delivery_id.split(".", 1)[0])
        if task is None:
            raise Rejection("NOT_FOUND")
        if task.delivery != delivery_id:
            raise Rejection("STALE_CLAIM")
        return task

    def require_live_lease(self, task: ModelTask) -> None:
        if task.state != "RUNNING" or self.now >= task.lease_expires:
            raise Rejection("STALE_CLAIM")

    def handback(self, delivery_id: str) -> tuple[ModelTask, bool]:
        task = self.require_delivery(delivery_id)
        if task.state in ("CANCELLED", "EXPIRED"):
            event(f"handback of a {task.state} task")
            task.delivery = None
            return task, False
        self.require_live_lease(task)
        return task, True

    def execute(self, kind: str, args: dict[str, Any], model_step: Any) -> Any:
        """Apply `kind` to the core and `model_step` to the model; they must agree on success or
        the error code. Returns (the core's result, what model_step returned)."""
        self.h.now_ms = self.now
        before = snapshot_bytes(self.h.state, without_clock=True)
        before_tasks = {t.id: (t.state, t.ready_at_ms) for t in self.h.state.tasks.values()}
        before_queued = self.queued_now()
        earliest_before = self.h.state.next_due_ms()
        result = self.h.apply(kind, epoch=self.epoch, **args)
        try:
            expected = model_step()
        except Rejection as rejection:
            event(f"{kind} -> {rejection.code}")
            assert result.get("error", {}).get("code") == rejection.code, (kind, args, result)
            assert self.h.effects == []
            assert snapshot_bytes(self.h.state, without_clock=True) == before, f"refused {kind} changed the state"
            return result, None
        assert "error" not in result, (kind, args, result)
        event(f"{kind} -> ok")
        self.check_effects(before_tasks, before_queued, earliest_before)
        return result, expected

    def queued_now(self) -> set[str]:
        return {task_id for run in self.h.state.runs.values() for q in run.queues.values() for task_id in q.ready}

    def check_effects(self, before_tasks: dict[str, Any], before_queued: set[str], earliest_before: Any) -> None:
        woken = self.h.woken()
        for task in self.h.state.tasks.values():
            was = before_tasks.get(task.id, (None, 0))[0]
            if task.state in TaskState.TERMINAL and was not in TaskState.TERMINAL:
                assert ("task", task.id) in woken, (task.id, task.state, woken)
        for task_id in self.queued_now() - before_queued:
            task = self.h.state.tasks[task_id]
            assert ("queue", task.run_id, task.mailbox) in woken
        earliest_after = self.h.state.next_due_ms()
        moved_earlier = earliest_after is not None and (earliest_before is None or earliest_after < earliest_before)
        assert self.h.armed() == ([earliest_after] if moved_earlier else [])

    # -- rules: mailboxes and runs ---------------------------------------------------------------

    @initialize(deadline_s=st.none() | st.integers(30, 120))
    def start(self, deadline_s: int | None) -> None:
        """Most examples start with a mailbox and a run, so the steps do more than NOT_FOUND."""
        self.ensure("a", "WORK")
        self.do_create_run(None, deadline_s, 1000)

    @rule(name=st.sampled_from(MAILBOXES), mode=st.sampled_from(["WORK", "WORK", "FANOUT"]))
    def ensure(self, name: str, mode: str) -> None:
        def model() -> bool:
            if mode != "WORK":
                raise Rejection("VALIDATION_FAILED")
            created = name not in self.mailboxes
            self.mailboxes.add(name)
            return created

        result, created = self.execute("mailbox.ensure", {"name": name, "mode": mode}, model)
        if created is not None:
            assert result["created"] is created

    @rule(
        data=st.data(),
        root=st.booleans(),
        deadline_s=st.none() | st.integers(5, 60),
        child_limit=st.sampled_from([0, 1, 2, 1000]),
    )
    def create_run(self, data: st.DataObject, root: bool, deadline_s: int | None, child_limit: int) -> None:
        self.do_create_run(None if root else self.draw_run(data, "parent"), deadline_s, child_limit)

    def do_create_run(self, parent_id: str | None, deadline_s: int | None, child_limit: int) -> None:
        deadline = None if deadline_s is None else self.now + self.odd_ms(deadline_s)
        args: dict[str, Any] = {"child_limit": child_limit, "deadline_ms": deadline, "parent_id": parent_id}

        def model() -> ModelRun:
            depth = 0
            if parent_id is not None:
                parent = self.require_run(parent_id)
                self.require_active(parent_id)
                if len(parent.children) >= parent.child_limit:
                    raise Rejection("LIMIT_EXCEEDED")
                depth = parent.depth + 1
                if depth > 32:
                    raise Rejection("LIMIT_EXCEEDED")
            return ModelRun("", parent_id, depth, deadline, self.next_seq() if deadline else 0, child_limit)

        result, run = self.execute("run.create", args, model)
        if run is not None:
            run.id = result["run_id"]
            assert run.id not in self.known_runs
            self.runs[run.id] = run
            self.known_runs.append(run.id)
            if parent_id is not None:
                self.runs[parent_id].children.append(run.id)

    @rule(data=st.data(), complete=st.booleans(), now=st.integers(0, 2))
    def stop_run(self, data: st.DataObject, complete: bool, now: int, run_id: str | None = None) -> None:
        if now:
            return  # a stop ends most of what can happen in a run: make it rarer than other steps
        if run_id is None:
            run_id = self.draw_run(data)

        def model() -> None:
            run = self.require_run(run_id)
            if run.stored == ("CANCELLED" if complete else "COMPLETED"):
                raise Rejection("CONFLICT")
            if run.stored == "ACTIVE":
                run.stored = "COMPLETED" if complete else "CANCELLED"
                self.stop(run_id, "CANCELLED")

        kind = "run.complete" if complete else "run.cancel"
        self.execute(kind, {"run_id": run_id, "retention_ms": RETENTION_MS}, model)

    # -- rules: tasks ----------------------------------------------------------------------------

    @rule(
        data=st.data(),
        mailbox=st.sampled_from(["a", "a", "a", "b", UNKNOWN_MAILBOX]),
        key=st.sampled_from(KEYS),
        input=st.integers(0, 1),
        attempts=st.integers(1, 3),
    )
    def submit(self, data: st.DataObject, mailbox: str, key: str, input: int, attempts: int) -> None:
        self.submit_to(self.draw_run(data), mailbox, key, input, attempts)

    def submit_to(self, run_id: str, mailbox: str, key: str, input: int, attempts: int) -> None:
        input_hash = f"h{input}"
        args = {"run_id": run_id, "mailbox": mailbox, "key": key, "input": input, "input_hash": input_hash,
                "attempts": attempts}

        def model() -> ModelTask | str:
            self.require_run(run_id)
            if mailbox not in self.mailboxes:
                raise Rejection("NOT_FOUND")
            existing = self.by_key.get((run_id, mailbox, key))
            if existing is not None:
                if self.tasks[existing].input_hash != input_hash:
                    raise Rejection("KEY_CONFLICT")
                return existing
            self.require_active(run_id)
            return ModelTask("", run_id, mailbox, key, input_hash, attempts)

        result, outcome = self.execute("task.submit", args, model)
        if isinstance(outcome, str):
            assert {"task_id": outcome, "created": False}.items() <= result.items()
        elif outcome is not None:
            assert result["created"] is True
            outcome.id = result["task_id"]
            assert outcome.id not in self.tasks
            self.tasks[outcome.id] = outcome
            self.by_key[(run_id, mailbox, key)] = outcome.id
            self.make_ready(outcome)

    @rule(
        data=st.data(),
        mailbox=st.sampled_from(["a", "a", "a", "b", UNKNOWN_MAILBOX]),
        count_max=st.integers(1, 3),
        lease_s=st.integers(2, 30),
    )
    def receive(self, data: st.DataObject, mailbox: str, count_max: int, lease_s: int) -> None:
        self.receive_from(self.draw_run(data), mailbox, count_max, lease_s)

    def receive_from(self, run_id: str, mailbox: str, count_max: int, lease_s: int) -> None:
        lease_ms = self.odd_ms(lease_s)
        args = {"run_id": run_id, "mailbox": mailbox, "max": count_max, "lease_ms": lease_ms, "holder": "w"}

        def model() -> list[str]:
            self.require_run(run_id)
            if mailbox not in self.mailboxes:
                raise Rejection("NOT_FOUND")
            self.require_active(run_id)
            queue = self.ready.get((run_id, mailbox), [])
            taken, queue[:] = queue[:count_max], queue[count_max:]
            for task_id in taken:
                task = self.tasks[task_id]
                task.state, task.attempt = "RUNNING", task.failures + 1
                task.lease_expires, task.lease_seq = self.now + lease_ms, self.next_seq()
                task.lease_ms = lease_ms
                task.first_lease_expires = task.lease_expires
            return taken

        result, taken = self.execute("task.receive", args, model)
        if taken is not None:
            assert result["task_ids"] == taken and [given["task_id"] for given in result["deliveries"]] == taken
            for task_id in taken:
                delivery_id = self.h.state.tasks[task_id].delivery_id
                assert delivery_id is not None and delivery_id not in self.deliveries
                self.tasks[task_id].delivery = delivery_id
                self.deliveries.append(delivery_id)

    @precondition(lambda self: any(t.state == "RUNNING" for t in self.tasks.values()))
    @rule(data=st.data(), complete=st.booleans(), above=st.booleans())
    def stop_a_run_with_work_in_flight(self, data: st.DataObject, complete: bool, above: bool) -> None:
        running = sorted({t.run for t in self.tasks.values() if t.state == "RUNNING"})
        run_id = data.draw(st.sampled_from(running), label="run")
        parent = self.runs[run_id].parent
        self.stop_run(data, complete, 0, parent if above and parent is not None else run_id)

    # Two more rules for the common path, so that tasks get far enough to lapse, retry and fail.

    @precondition(lambda self: any(self.inactive(run_id) is None for run_id in self.runs))
    @rule(data=st.data(), key=st.sampled_from(KEYS), input=st.integers(0, 1), attempts=st.integers(1, 3))
    def submit_to_an_active_run(self, data: st.DataObject, key: str, input: int, attempts: int) -> None:
        active = [run_id for run_id in self.runs if self.inactive(run_id) is None]
        self.submit_to(data.draw(st.sampled_from(active), label="run"), "a", key, input, attempts)

    @precondition(lambda self: any(self.ready.values()))
    @rule(data=st.data(), lease_s=st.integers(2, 30))
    def receive_where_there_is_work(self, data: st.DataObject, lease_s: int) -> None:
        (run_id, mailbox) = data.draw(st.sampled_from([key for key, ready in self.ready.items() if ready]))
        self.receive_from(run_id, mailbox, 2, lease_s)

    def draw_delivery(self, data: st.DataObject) -> str:
        # Mostly deliveries still held; sometimes a stale one, one of a removed task, or a bogus one.
        held = [t.delivery for t in self.tasks.values() if t.delivery is not None]
        return data.draw(st.sampled_from(held * 4 + self.deliveries[-3:] + self.deliveries), label="delivery")

    def draw_run(self, data: st.DataObject, label: str = "run") -> str:
        # Mostly runs that exist; sometimes a removed one or one that never existed.
        return data.draw(st.sampled_from(list(self.runs) * 4 + self.known_runs), label=label)

    @precondition(lambda self: len(self.deliveries) > 1)
    @rule(data=st.data(), lease_s=st.integers(2, 30))
    def renew(self, data: st.DataObject, lease_s: int) -> None:
        self.renew_delivery(self.draw_delivery(data), lease_s)

    @precondition(lambda self: any(t.delivery is not None for t in self.tasks.values()))
    @rule(data=st.data(), lease_s=st.integers(20, 60))
    def renew_a_held_delivery_for_longer(self, data: st.DataObject, lease_s: int) -> None:
        held = sorted(t.delivery for t in self.tasks.values() if t.delivery is not None)
        self.renew_delivery(data.draw(st.sampled_from(held), label="delivery"), lease_s)

    def renew_delivery(self, delivery_id: str, lease_s: int) -> None:
        lease_ms = self.odd_ms(lease_s)

        def model() -> int:
            task = self.require_delivery(delivery_id)
            self.require_active(task.run)
            self.require_live_lease(task)
            task.lease_ms = lease_ms
            if self.now + lease_ms > task.lease_expires:
                event("renew extends the lease")
                task.lease_expires = self.now + lease_ms
            return task.lease_expires

        result, expires = self.execute("delivery.renew", {"delivery_id": delivery_id, "lease_ms": lease_ms}, model)
        if expires is not None:
            assert result["lease_expires_ms"] == expires

    @precondition(lambda self: len(self.deliveries) > 1)
    @rule(data=st.data(), payload=st.integers(0, 9))
    def complete(self, data: st.DataObject, payload: int) -> None:
        delivery_id = self.draw_delivery(data)
        result, task = self.execute(
            "delivery.complete", {"delivery_id": delivery_id, "payload": payload},
            lambda: self.complete_model(delivery_id, payload),
        )
        if task is not None:
            assert {"task_id": task.id, "state": "SUCCEEDED"}.items() <= result.items()

    def complete_model(self, delivery_id: str, payload: int) -> ModelTask:
        done = self.tasks.get(delivery_id.split(".", 1)[0])
        if done is not None and done.state == "SUCCEEDED" and done.finished_by == delivery_id:
            event("a repeated complete is answered again")
            return done
        task = self.require_delivery(delivery_id)
        self.require_active(task.run)
        self.require_live_lease(task)
        self.finish(task, "SUCCEEDED")
        task.outcome = payload
        return task

    @precondition(lambda self: len(self.deliveries) > 1)
    @rule(data=st.data(), payload=st.integers(0, 9))
    def complete_many(self, data: st.DataObject, payload: int) -> None:
        """Each item as its own complete, in order; a refused one is its own error."""
        count = data.draw(st.integers(1, 4), label="items")
        delivery_ids = [self.draw_delivery(data) for _ in range(count)]
        expected: list[ModelTask | str] = []

        def model() -> None:
            for delivery_id in delivery_ids:
                try:
                    expected.append(self.complete_model(delivery_id, payload))
                except Rejection as rejection:
                    expected.append(rejection.code)

        items = [{"delivery_id": delivery_id, "payload": payload} for delivery_id in delivery_ids]
        result, _ = self.execute("delivery.complete_many", {"items": items}, model)
        for answer, want in zip(result["items"], expected, strict=True):
            if isinstance(want, str):
                assert answer["error"]["code"] == want, (answer, want)
            else:
                assert {"task_id": want.id, "state": "SUCCEEDED"}.items() <= answer.items()

    @precondition(lambda self: len(self.deliveries) > 1)
    @rule(data=st.data(), delay=st.sampled_from(["default", "zero", "later"]))
    def retry(self, data: st.DataObject, delay: str) -> None:
        delivery_id = self.draw_delivery(data)
        delay_ms = {"default": None, "zero": 0, "later": self.odd_ms(2)}[delay]
        error = f"error-{self.seq}-{self.unique}"

        def model() -> ModelTask:
            task, live = self.handback(delivery_id)
            if live:
                self.fail_attempt(task, error, delay_ms)
            return task

        args = {"delivery_id": delivery_id, "error": error, "delay_ms": delay_ms}
        result, task = self.execute("delivery.retry", args, model)
        if task is not None:
            assert {"task_id": task.id, "state": task.state}.items() <= result.items()

    @precondition(lambda self: len(self.deliveries) > 1)
    @rule(data=st.data())
    def reject(self, data: st.DataObject) -> None:
        delivery_id = self.draw_delivery(data)
        error = f"rejected-{self.seq}"

        def model() -> ModelTask:
            task, live = self.handback(delivery_id)
            if live:
                task.failures += 1
                task.error = error
                self.finish(task, "FAILED")
            return task

        result, task = self.execute("delivery.reject", {"delivery_id": delivery_id, "error": error}, model)
        if task is not None:
            assert {"task_id": task.id, "state": task.state}.items() <= result.items()

    @precondition(lambda self: len(self.deliveries) > 1)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        delivery_id = self.draw_delivery(data)

        def model() -> ModelTask:
            task, live = self.handback(delivery_id)
            if live:
                task.delivery = None
                self.make_ready(task)
            return task

        result, task = self.execute("delivery.release", {"delivery_id": delivery_id}, model)
        if task is not None:
            assert {"task_id": task.id, "state": task.state}.items() <= result.items()

    # -- rules: time, leaders, restarts ----------------------------------------------------------

    @rule(seconds=st.integers(1, 5))
    def advance(self, seconds: int) -> None:
        self.now += seconds * 1000

    @rule(seconds=st.sampled_from([0, 0, 1, 2, 5]))
    def tick(self, seconds: int) -> None:
        self.now += seconds * 1000
        self.execute("tick", {"retention_ms": RETENTION_MS}, self.model_tick)

    @rule()
    def tick_when_something_falls_due(self) -> None:
        """Jump to the next second at which something the model knows of falls due, and tick."""
        dues = [t.first_lease_expires for t in self.tasks.values() if t.state == "RUNNING"]
        dues += [t.lease_expires for t in self.tasks.values() if t.state == "RUNNING"]
        dues += [t.ready_at for t in self.tasks.values() if t.state == "QUEUED" and t.ready_at]
        dues += [r.deadline for r in self.runs.values() if r.deadline is not None and not r.deadline_done]
        dues += [r.retention_due for r in self.runs.values() if r.retention_due is not None and not r.retention_done]
        upcoming = [due for due in dues if due > self.now]
        if upcoming:
            self.now = -(-min(upcoming) // 1000) * 1000
        self.tick(0)

    def model_tick(self) -> None:
        if self.epoch < self.state_epoch:
            raise Rejection("STALE_EPOCH")
        events: list[tuple[int, int, str, str]] = []
        for candidate in self.tasks.values():
            if candidate.state == "RUNNING" and candidate.first_lease_expires <= self.now < candidate.lease_expires:
                event("tick: a renewed lease outlives its first expiry")
            if candidate.state == "RUNNING" and candidate.lease_expires <= self.now:
                events.append((candidate.lease_expires, candidate.lease_seq, "lease", candidate.id))
            if candidate.state == "QUEUED" and 0 < candidate.ready_at <= self.now:
                events.append((candidate.ready_at, candidate.ready_seq, "ready", candidate.id))
        for run in self.runs.values():
            if run.deadline is not None and not run.deadline_done and run.deadline <= self.now:
                events.append((run.deadline, run.deadline_seq, "deadline", run.id))
            if run.retention_due is not None and not run.retention_done and run.retention_due <= self.now:
                events.append((run.retention_due, run.retention_seq, "retention", run.id))
        # Nothing a tick does arms anything due by now, so the list is complete.
        for due, _seq, kind, entity in sorted(events):
            event(f"tick: {kind} due")
            task = self.tasks.get(entity)
            if kind == "lease":
                if task is not None and task.state == "RUNNING" and task.lease_expires == due:
                    self.fail_attempt(task, "<lapse>", 0)
            elif kind == "ready":
                if task is not None and task.state == "QUEUED" and task.ready_at == due:
                    self.make_ready(task)
            elif kind == "deadline":
                if entity in self.runs:
                    self.runs[entity].deadline_done = True
                    if self.runs[entity].stored == "ACTIVE":
                        self.stop(entity, "EXPIRED")
            elif entity in self.runs:
                self.runs[entity].retention_done = True
                self.remove(entity)

    @rule()
    def new_leader(self) -> None:
        self.epoch += 1

        def model() -> int:
            if self.epoch > self.state_epoch:
                self.state_epoch = self.epoch
                for task in self.tasks.values():  # every live lease runs its full length from now
                    if task.state == "RUNNING" and self.now + task.lease_ms > task.lease_expires:
                        event("a new leader extends a lease")
                        task.lease_expires = self.now + task.lease_ms
            return self.state_epoch

        result, epoch = self.execute("leader.start", {}, model)
        assert result == {"epoch": epoch}

    @precondition(lambda self: self.state_epoch >= 2)
    @rule()
    def tick_from_a_deposed_leader(self) -> None:
        current = self.epoch
        self.epoch = self.state_epoch - 1
        try:
            self.execute("tick", {"retention_ms": RETENTION_MS}, self.model_tick)
        finally:
            self.epoch = current

    @rule()
    def restart_from_snapshot(self) -> None:
        self.h.core.restore(unpack(pack(self.h.core.snapshot())))

    # -- checks ----------------------------------------------------------------------------------

    @invariant()
    def stored_bytes_are_what_the_state_holds(self) -> None:
        assert_stored_bytes_recount(self.h.state)

    @invariant()
    def queue_figures_are_what_the_state_holds(self) -> None:
        """The metrics' per-mailbox counts kept step by step equal a count of the tasks (the times
        a task became QUEUED are not recountable: only which tasks are counted)."""
        kept = {key: (set(figures.queued), figures.running) for key, figures in self.h.state.queue_figures.items()}
        expected: dict[tuple[str, str], tuple[set[str], int]] = {}
        for task in self.h.state.tasks.values():
            if task.state in (TaskState.QUEUED, TaskState.RUNNING):
                queued, running = expected.setdefault((task.space, task.mailbox), (set(), 0))
                if task.state == TaskState.QUEUED:
                    queued.add(task.id)
                else:
                    expected[(task.space, task.mailbox)] = (queued, running + 1)
        assert kept == expected

    @invariant()
    def ended_figures_are_what_the_state_holds(self) -> None:
        """The mailbox stats' counts of ended tasks kept step by step equal a count of the tasks."""
        kept = {key: (dict(figures.by_state), figures.attempts) for key, figures in self.h.state.ended_figures.items()}
        expected: dict[tuple[str, str], tuple[dict[str, int], int]] = {}
        for task in self.h.state.tasks.values():
            if task.state in TaskState.TERMINAL:
                by_state, attempts = expected.get((task.space, task.mailbox), ({}, 0))
                by_state[task.state] = by_state.get(task.state, 0) + 1
                expected[(task.space, task.mailbox)] = (by_state, attempts + task.attempt)
        assert kept == expected

    @invariant()
    def mailbox_task_index_is_what_the_state_holds(self) -> None:
        """The per-mailbox task index kept step by step holds each task once, in creation order."""
        expected: dict[tuple[str, str], list[str]] = {}
        for task in self.h.state.tasks.values():
            expected.setdefault((task.space, task.mailbox), []).append(task.id)
        assert {key: list(ids) for key, ids in self.h.state.mailbox_tasks.items()} == expected

    @invariant()
    def core_agrees_with_the_model(self) -> None:
        state = self.h.state
        assert set(state.runs) == set(self.runs)
        for run_id, expected in self.runs.items():
            run = state.runs[run_id]
            assert (run.stored_state, run.parent_id, run.children, run.deadline_ms) == (
                expected.stored,
                expected.parent,
                expected.children,
                expected.deadline,
            ), run_id
            assert run.finished_ms == expected.finished_ms, run_id
            effective = "ACTIVE" if self.inactive(run_id) is None else "INACTIVE"
            assert core_runs.effective(state, run, self.now) == effective
            for mailbox in MAILBOXES:
                queue = run.queues.get(mailbox)
                assert list(queue.ready if queue else []) == self.ready.get((run_id, mailbox), [])
        assert set(state.tasks) == set(self.tasks)
        for task_id, expected_task in self.tasks.items():
            task = state.tasks[task_id]
            assert (task.run_id, task.mailbox, task.key, task.attempts) == (
                expected_task.run,
                expected_task.mailbox,
                expected_task.key,
                expected_task.attempts,
            )
            assert (task.state, task.failures, task.attempt, task.delivery_id) == (
                expected_task.state,
                expected_task.failures,
                expected_task.attempt,
                expected_task.delivery,
            ), task_id
            if task.state == "RUNNING":
                assert task.lease_expires_ms == expected_task.lease_expires
            if task.state == "QUEUED":
                assert task.ready_at_ms == expected_task.ready_at
            if task.state == "SUCCEEDED":
                assert json_value(task.outcome) == expected_task.outcome
            if task.state == "FAILED":
                if expected_task.error == "<lapse>":
                    assert task.error is not None and task.error.startswith("lease expired")
                else:
                    assert task.error == expected_task.error

    @invariant()
    def state_invariants(self) -> None:
        state = self.h.state
        deliveries = [t.delivery_id for t in state.tasks.values() if t.delivery_id is not None]
        assert len(deliveries) == len(set(deliveries))
        in_queues: dict[str, int] = {}
        for task in state.tasks.values():
            if task.state == TaskState.RUNNING:
                assert task.delivery_id is not None and task.delivery_id.startswith(task.id + ".")
                assert task.lease_expires_ms > 0 and task.attempt >= 1
            if task.state in (TaskState.QUEUED, TaskState.SUCCEEDED, TaskState.FAILED):
                assert task.delivery_id is None
            assert task.failures <= task.attempts
        for space in state.spaces.values():
            members = [run for run in state.runs.values() if run.space == space.id]
            assert space.run_count == len(members)
            assert space.task_count == sum(run.task_count for run in members)
        owners: dict[str, str] = {}
        for run in state.runs.values():
            keyed = 0
            for mailbox, queue in run.queues.items():
                for key, task_id in queue.by_key.items():
                    assert task_id not in owners, f"task {task_id} in two runs"
                    owners[task_id] = run.id
                    task = state.tasks[task_id]
                    assert (task.run_id, task.mailbox, task.key) == (run.id, mailbox, key)
                    keyed += 1
                for task_id in queue.ready:
                    in_queues[task_id] = in_queues.get(task_id, 0) + 1
            assert run.task_count == keyed
            for child in run.children:
                assert state.runs[child].parent_id == run.id
        assert set(owners) == set(state.tasks)
        for task in state.tasks.values():
            ready = task.state == TaskState.QUEUED and task.ready_at_ms == 0
            assert in_queues.get(task.id, 0) == (1 if ready else 0), task.id
        assert heap_is_valid(state.due)
        assert state.clock_ms <= self.now

    @invariant()
    def snapshot_round_trip(self) -> None:
        data = snapshot_bytes(self.h.state)
        assert snapshot_bytes(round_trip(self.h.state)) == data


CoreMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_core_against_the_model = CoreMachine.TestCase
