"""The chaos workload: client threads that use every kind of entity of a three-node cluster while
faults are injected, recording each call in the history (chaos/history.py).

    workload = Workload(cluster_urls, admin_key, history, seed=7)
    workload.start()          # the client threads, spread over the nodes
    ...                       # faults come and go
    workload.stop()           # bounded: threads joined, calls still open written as unknown
    summary = workload.finalize()   # after healing: drain the queues, write every entity's final view

Clients talk HTTP through a small client of their own (urllib, one request per recorded call, no
retry hidden inside a call), so the history holds exactly what was sent and what came back: a 2xx
is `ok`, a 4xx with an error code `fail` (a definite refusal, STALE_CLAIM included), and a 503,
another 5xx, a timeout or a connection error `unknown`. A client retries an unknown call only as a
new recorded call (keyed submits, completes and cancels, which the server deduplicates), and moves
to the next node after one. The `runstate.once` callers use the SDK itself (its semantics are the
SDK's): each call's returned value is recorded.

Roles (threads), each with its own seeded `random.Random`, so the same seed makes the same choices
(not the same timing):

- producers: create runs, submit keyed tasks `{"n": n}` to the mailbox `work`; now and then cancel
  a run and submit to it twice more (those submits must be refused with SCOPE_CANCELLED).
- workers: receive with a short lease and complete with `{"by": worker, "delivery": id}`; some
  work long and renew, some crash (a `crash` line, the delivery abandoned), some stall past the
  lease and then complete (a complete with `"stalled": true`, to be refused with STALE_CLAIM,
  unless an election meanwhile let the new leader extend the live lease, as it does for every
  lease). Workers serve the producers' runs and the task groups' runs. Now and then a worker
  receives a few and completes them in one batch call (`POST /messages/complete`), as the drain
  does: each item is recorded as its own `complete` (`"batch": true`), ended by its own answer.
- readers: read_task of known tasks, several a second, each through the next node (a follower
  forwards it, the leader serves it): check 13 flags a read that misses an acknowledged change.
- once callers: several threads call the same few `runstate.once` keys; some through the sync
  function (the SDK's own thread), some through an `async def` one of the same name, each from an
  event loop of its thread (the SDK's clients of that loop).
- a grouper: N_ACCEPTED groups (threshold 2, four members), reviews finished members with accept
  or reject, reads the groups, and gives one late verdict after each decision.
- barrier clients: the first creates barriers (target 3); each arrives with its own key; the first
  also arrives with extra keys (counted, or refused with BARRIER_RELEASED); all read them.
- a timer client: timers one to five seconds ahead, read until they fired; some runs are cancelled
  before their timers fire.
- permit clients: one permit of PERMIT_UNITS units, declared by name; each client acquires 1 or 2
  units under a short lease, holds them for a while and releases them; when the permit is full it
  sometimes joins the waiters' line and acquires when signalled; some hold past the lease (their
  release is refused with STALE_CLAIM), some runs are cancelled while holding (the grant ends with
  the run); all read the permit's view.
- allowance clients: one allowance of ALLOWANCE_UNITS units per ALLOWANCE_WINDOW_S seconds,
  declared by name; each client consumes 1 or 2 units, and when it is exhausted sometimes joins
  the waiters' line and polls its waiter until it is granted.
- budget clients: one budget of BUDGET_LIMIT_MINOR minor units, declared by name; each client
  reserves an amount under a run, settles part of it in one or two keyed settles (some asking
  more than reserved, with allowOverrun), voids the rest or leaves it to its run's cancel, and
  reads the budget.
- watchers: long-poll the space's events (`GET /watch`, WATCH_WAIT_S, at most WATCH_LIMIT a page)
  from the last cursor they got; each page is one `watch` call whose result holds its events and
  `nextCursor`. After an unknown page a watcher moves to the next node and resumes from the same
  cursor. The second watcher now and then starts again without a cursor (`resume: restart`) or
  from an older cursor it remembered (`resume: older`); a CURSOR_EXPIRED refusal (the bounded
  log dropped what the cursor names) is recorded and the watcher starts again without one.
  Finalize reads the rest of the log (`GET /events` from the first watcher's last cursor until a
  page is empty: `events_read` calls).

Times in results and final views are epoch milliseconds of the server's clock (every ISO field
ending in `At`, and `deadline`; the clients' own values, `input`, `outcome` and `result`, are left
as they are); `call`/`ret` are the harness's monotonic clock. Every wait and
every request has a timeout, every list a bound (`*_MAX`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import http.client
import itertools
import json
import logging
import random
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote

import runstate
from runstate.sdk.errors import RunstateError, UnavailableError

from chaos.history import History

log = logging.getLogger("chaos.workload")

MAILBOX = "work"
LEASE_MS = 2_000
# A stalled worker completes this long after its lease ran out.
STALL_PAST_LEASE_S = 1.5
# Long work lasts this many leases, renewed every third of one.
LONG_WORK_LEASES = 1.5
RECEIVE_WAIT_MS = 2_000
REQUEST_TIMEOUT_S = 6.0
# Retrying a call whose answer was unknown (as a new recorded call), and the pause between.
RETRIES_MAX = 3
RETRY_PAUSE_S = 0.3
SETUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
FINALIZE_TIMEOUT_S = 180.0
DRAIN_TIMEOUT_S = 45.0
# The drain ends once no delivery came for this long (a crashed lease lapses within LEASE_MS).
DRAIN_QUIET_S = LEASE_MS / 1000 + 2.0
DRAIN_RECEIVE_MAX = 10
# How often a worker receives up to BATCH_RECEIVE_MAX and completes them in one call.
BATCH_PROBABILITY = 0.25
BATCH_RECEIVE_MAX = 3
DRAIN_POLL_S = 1.0
FINAL_RETRY_PAUSE_S = 0.5
# How long after the last timer's time finalize waits before reading the timers.
TIMER_SETTLE_S = 1.0

# Bounds of what the clients keep.
ENTITIES_TRACKED_MAX = 100_000
RECENT_TASKS_MAX = 50
TASKS_PER_RUN_MAX = 12
# A producer's batch submit (POST /tasks/batch: one log command for all its tasks) holds this many.
BATCH_SUBMIT_TASKS_MIN, BATCH_SUBMIT_TASKS_MAX = 2, 4
# A per-item error of a batch submit whose outcome is unknown (the log did not commit the batch).
ITEM_UNKNOWN_CODES = frozenset({"UNAVAILABLE", "INTERNAL", "TIMEOUT"})
SUBMITS_AFTER_CANCEL = 2
GROUPS_LIVE_MAX = 2
GROUP_MEMBERS = 4
GROUP_THRESHOLD = 2
GROUP_INTERVAL_S = 4.0
GROUP_AGE_MAX_S = 60.0
LATE_VERDICTS_MAX = 1
BARRIERS_LIVE_MAX = 3
BARRIER_TARGET = 3
BARRIERS_PER_RUN = 3
BARRIER_INTERVAL_S = 3.0
BARRIER_AGE_MAX_S = 30.0
TIMERS_PER_RUN = 3
TIMER_INTERVAL_S = 3.0
TIMER_AGE_MAX_S = 30.0
ONCE_NAME = "chaos_once"
ONCE_LEASE = "2s"
ONCE_ATTEMPTS = 3
ONCE_WORK_S = 0.3
# Every this many seconds a new set of once keys, ONCE_KEYS of them.
ONCE_GENERATION_S = 6.0
ONCE_KEYS = 2

READ_PAUSE_S = (0.1, 0.5)  # a reader's pause between two reads, drawn uniformly

PERMIT_NAME = "chaos-permit"
PERMIT_UNITS = 3
PERMIT_LEASE_MS = 2_000
PERMIT_HOLD_S = (0.1, 1.2)
PERMIT_GRANTS_PER_RUN = 8
PERMIT_LAPSE_PROBABILITY = 0.08  # hold past the lease, then release (refused)
PERMIT_LINE_PROBABILITY = 0.5  # join the line when the permit is full
PERMIT_WAITER_TTL_S = 5
PERMIT_WAITER_POLLS_MAX = 12
PERMIT_WAITER_POLL_S = 0.25
PERMIT_READ_PROBABILITY = 0.3

ALLOWANCE_NAME = "chaos-allowance"
ALLOWANCE_UNITS = 5
ALLOWANCE_WINDOW_S = 2
ALLOWANCE_LINE_PROBABILITY = 0.5
ALLOWANCE_WAITER_TTL_S = 5
ALLOWANCE_WAITER_POLLS_MAX = 12

BUDGET_NAME = "chaos-budget"
BUDGET_LIMIT_MINOR = 5_000_000
BUDGET_RESERVE_MINOR = (100, 20_000)
BUDGET_RESERVATIONS_PER_RUN = 6
BUDGET_OVERRUN_PROBABILITY = 0.1
BUDGET_ABANDON_PROBABILITY = 0.1  # leave the reservation to the run's cancel

# Watchers (events): the long poll's wait, a page's bound, the pause between pages (paced), how
# many older cursors the second watcher remembers, and how often it restarts or rewinds.
WATCH_WAIT_S = 2
WATCH_LIMIT = 200
WATCH_PAUSE_S = (0.8, 1.6)
WATCH_CURSORS_KEPT = 8
WATCH_RESTART_PROBABILITY = 0.04
WATCH_REWIND_PROBABILITY = 0.08
EVENTS_FINAL_LIMIT = 1_000
EVENTS_FINAL_PAGES_MAX = 100
CURSOR_EXPIRED = "CURSOR_EXPIRED"

RUN_STOPPED_CODES = ("SCOPE_CANCELLED", "DEADLINE_EXCEEDED", "NOT_FOUND")
FINISHED_TASK_STATES = ("SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED")


@dataclass(frozen=True)
class WorkloadConfig:
    """How many clients of each role, and how often they misbehave. `pace` multiplies every pause
    between calls (2.0 halves the rate; the default makes about 400 calls a minute, 1.0 about 540);
    lease, stall and work times are not paced."""

    producers: int = 2
    workers: int = 3
    readers: int = 1
    once_callers: int = 3  # sync callers
    async_once_callers: int = 2  # callers of the async function of the same name
    groupers: int = 1
    barrier_clients: int = 3
    timer_clients: int = 1
    permit_clients: int = 3
    budget_clients: int = 2
    allowance_clients: int = 2
    watchers: int = 2
    pace: float = 1.3
    lease_ms: int = LEASE_MS
    crash_probability: float = 0.06
    stall_probability: float = 0.06
    long_work_probability: float = 0.05
    run_cancel_probability: float = 0.25
    replay_probability: float = 0.2  # an acknowledged keyed create or submit is sent once more
    batch_submit_probability: float = 0.3  # a producer submits 2 to 4 tasks in one POST /tasks/batch
    accept_probability: float = 0.7


# -- times -------------------------------------------------------------------------------------


def epoch_ms(value: Any) -> int | None:
    """An ISO 8601 time of the server (`2026-11-29T09:00:00.000Z`) as epoch milliseconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    text = str(value)
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    return round(datetime.fromisoformat(text).timestamp() * 1000)


# Fields of a view that hold the clients' own JSON: left exactly as the server returned them.
USER_VALUE_FIELDS = ("input", "outcome", "result")


def normalize_times(value: Any) -> Any:
    """A copy of a server view with every ISO time field (`...At`, `deadline`) in epoch ms (a
    value that does not parse as a time is left as it is)."""
    if isinstance(value, list):
        return [normalize_times(item) for item in value]
    if not isinstance(value, dict):
        return value
    normalized: dict[str, Any] = {}
    for key, item in value.items():
        if key in USER_VALUE_FIELDS:
            normalized[key] = item
        elif (key.endswith("At") or key == "deadline") and isinstance(item, str):
            try:
                normalized[key] = epoch_ms(item)
            except ValueError:
                normalized[key] = item
        else:
            normalized[key] = normalize_times(item)
    return normalized


# -- HTTP --------------------------------------------------------------------------------------

OK = "ok"
FAIL = "fail"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Answer:
    """What one HTTP call came back with. `outcome` is ok, fail or unknown (the history's
    statuses); `result` is what the client recorded of an ok answer."""

    outcome: str
    status: int | None
    body: dict[str, Any]
    code: str | None = None
    message: str = ""
    result: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == OK


def classify(status: int, text: bytes) -> Answer:
    """An HTTP answer as the history sees it: 2xx ok (a JSON object, else unknown), 4xx fail with
    the answer's error code (`HTTP_<status>` without one), anything else unknown."""
    try:
        parsed = json.loads(text) if text else {}
    except ValueError:
        parsed = None
    body = parsed if isinstance(parsed, dict) else {}
    if 200 <= status < 300:
        if parsed is None or not isinstance(parsed, dict):
            return Answer(UNKNOWN, status, {}, "INVALID_RESPONSE", f"HTTP {status} with a body that is not a JSON object: {text[:200]!r}")
        return Answer(OK, status, body)
    error = body.get("error")
    fields: dict[str, Any] = error if isinstance(error, dict) else {}
    code = fields["code"] if isinstance(fields.get("code"), str) else None
    message = str(fields["message"]) if isinstance(fields.get("message"), str) else text[:200].decode("utf-8", "replace")
    if 400 <= status < 500:
        return Answer(FAIL, status, body, code or f"HTTP_{status}", message)
    return Answer(UNKNOWN, status, body, code or f"HTTP_{status}", message)


def _unknown_of(error: BaseException) -> Answer:
    reason = error.reason if isinstance(error, urllib.error.URLError) else error
    if isinstance(reason, TimeoutError):
        code = "TIMEOUT"
    elif isinstance(reason, ConnectionRefusedError):
        code = "CONNECTION_REFUSED"  # never reached a server; still recorded as unknown (the contract)
    else:
        code = "CONNECTION"
    return Answer(UNKNOWN, None, {}, code, f"{type(reason).__name__}: {reason}")


# The workload runs in the space of the cluster's bootstrap admin key (the operator space).
SPACE = "default"
OPERATOR_PATHS = ("/v1/health", "/v1/cluster", "/v1/whoami", "/v1/spaces", "/v1/keys")


class HttpClient:
    """One request per call, to the node the caller names, with the admin key; no retries. Paths
    are given as `/v1/<path>` and sent under the space (`/v1/spaces/{space}/<path>`), except the
    operator routes."""

    def __init__(
        self, base_urls: list[str], admin_key: str, space: str = SPACE, context: ssl.SSLContext | None = None,
    ) -> None:
        """`context` verifies https:// nodes (ChaosCluster.context with --tls)."""
        if not base_urls:
            raise ValueError("no base URL")
        self.base_urls = [url.rstrip("/") for url in base_urls]
        self.admin_key = admin_key
        self.space = space
        # No proxy from the environment: the nodes are on this machine.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))

    def call(
        self, node: int, method: str, path: str, body: dict[str, Any] | None = None, *, holder: str, timeout_s: float,
        idempotency_key: str | None = None,
    ) -> Answer:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {self.admin_key}", "X-Runstate-Holder": holder, "Accept": "application/json"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        if data is not None:
            headers["Content-Type"] = "application/json"
        if not path.startswith(OPERATOR_PATHS):
            path = f"/v1/spaces/{self.space}/" + path.removeprefix("/v1/")
        urls = self.base_urls  # one read: use_urls() may replace the list meanwhile
        url = urls[node % len(urls)] + path
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=timeout_s) as response:
                return classify(response.status, response.read())
        except urllib.error.HTTPError as error:
            try:
                text = error.read()
            except (OSError, http.client.HTTPException) as read_error:
                return _unknown_of(read_error)
            finally:
                error.close()
            return classify(error.code, text)
        except (OSError, http.client.HTTPException) as error:
            return _unknown_of(error)

    def use_urls(self, base_urls: list[str]) -> None:
        """Send the next calls to these nodes (the cluster's membership changed); a caller's node
        number now picks among them."""
        if not base_urls:
            raise ValueError("no base URL")
        self.base_urls = [url.rstrip("/") for url in base_urls]


# -- what the clients share ----------------------------------------------------------------------


@dataclass
class _Queue:
    run: str
    mailbox: str
    pending: int = 0  # tasks submitted and not known completed: where workers look first
    active: bool = True


@dataclass
class _Group:
    id: str
    run: str
    created_at: float
    late_verdicts: int = 0
    live: bool = True


@dataclass
class _Barrier:
    id: str
    run: str
    created_at: float
    arrived: set[str] = field(default_factory=set)
    state: str = "WAITING"
    live: bool = True


@dataclass
class _Timer:
    id: str
    run: str
    fire_at_ms: int
    created_at: float
    state: str = "ARMED"
    live: bool = True


class _Tracked(collections.OrderedDict[str, Any]):
    """An insertion-ordered map of at most ENTITIES_TRACKED_MAX entities (more are not tracked)."""

    dropped = 0

    def track(self, key: str, value: Any = None) -> None:
        if key in self:
            return
        if len(self) >= ENTITIES_TRACKED_MAX:
            self.dropped += 1
            return
        self[key] = value


class _Shared:
    """What every client thread sees: the history, the HTTP client, and the entities created."""

    def __init__(self, http: HttpClient, history: History, config: WorkloadConfig) -> None:
        self.http = http
        self.history = history
        self.config = config
        self.lock = threading.Lock()
        self.started_at = time.monotonic()
        self.runs = _Tracked()  # run id -> role
        self.tasks = _Tracked()
        self.recent_tasks: collections.deque[str] = collections.deque(maxlen=RECENT_TASKS_MAX)
        self.queues: dict[tuple[str, str], _Queue] = {}
        self.mailbox_id = ""  # the id of MAILBOX, set up before any client starts
        self.groups = _Tracked()  # id -> _Group
        self.barriers = _Tracked()  # id -> _Barrier
        self.timers = _Tracked()  # id -> _Timer
        self.once_keys = _Tracked()
        self.once_run: str | None = None
        self.permit_ids = _Tracked()  # the permits declared (one id, however many clients declare it)
        self.budget_ids = _Tracked()  # the budgets declared, likewise

    def add_run(self, run_id: str, role: str) -> None:
        with self.lock:
            self.runs.track(run_id, role)

    def add_task(self, task_id: str) -> None:
        with self.lock:
            if task_id not in self.tasks:
                self.tasks.track(task_id)
                self.recent_tasks.append(task_id)

    def add_queue(self, run_id: str, mailbox: str) -> None:
        with self.lock:
            if len(self.queues) < ENTITIES_TRACKED_MAX:
                self.queues.setdefault((run_id, mailbox), _Queue(run_id, mailbox))

    def queue(self, run_id: str, mailbox: str) -> _Queue | None:
        with self.lock:
            return self.queues.get((run_id, mailbox))

    def deactivate_queue(self, run_id: str, mailbox: str) -> None:
        with self.lock:
            queue = self.queues.get((run_id, mailbox))
            if queue is not None:
                queue.active = False

    def count_pending(self, queue: _Queue | None, change: int) -> None:
        if queue is not None:
            with self.lock:
                queue.pending = max(0, queue.pending + change)

    def active_queues(self) -> list[_Queue]:
        with self.lock:
            return [queue for queue in self.queues.values() if queue.active]

    def pick_queue(self, rng: random.Random) -> _Queue | None:
        """An active queue, likelier the more tasks it has pending."""
        queues = self.active_queues()
        if not queues:
            return None
        return rng.choices(queues, weights=[queue.pending + 0.25 for queue in queues])[0]

    def pick_task(self, rng: random.Random) -> str | None:
        with self.lock:
            if not self.tasks:
                return None
            if self.recent_tasks and rng.random() < 0.5:
                return rng.choice(self.recent_tasks)
            return rng.choice(list(self.tasks))

    def live(self, tracked: _Tracked) -> list[Any]:
        with self.lock:
            return [entity for entity in tracked.values() if entity.live]


# -- clients -----------------------------------------------------------------------------------


class _Client:
    """One client thread: its name (the holder it declares), its node, its random choices."""

    def __init__(self, name: str, node: int, shared: _Shared, seed: int, stopping: threading.Event) -> None:
        self.name = name
        self.node = node
        self.shared = shared
        self.rng = random.Random(f"{seed}:{name}")
        self.stopping = stopping
        self.session = f"{self.rng.getrandbits(64):016x}"  # its holderSession on the leases it takes

    def loop(self) -> None:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        return not self.stopping.is_set()

    def pause(self, seconds: float, *, paced: bool = True) -> bool:
        """Wait (bounded); False once the workload is stopping."""
        scale = self.shared.config.pace if paced else 1.0
        return not self.stopping.wait(max(0.0, seconds * scale))

    def call(
        self,
        op: str,
        args: dict[str, Any],
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        shape: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        wait_ms: int = 0,
    ) -> Answer:
        """One recorded call: the history's line ends ok (with `shape(body)`), fail or unknown. With
        `idem` in `args` the call carries that Idempotency-Key (every retry of the call the same)."""
        handle = self.shared.history.record(self.name, op, args)
        answer = self.shared.http.call(
            self.node, method, path, body, holder=self.name, timeout_s=REQUEST_TIMEOUT_S + wait_ms / 1000,
            idempotency_key=args.get("idem"),
        )
        if answer.outcome == OK:
            try:
                result = shape(answer.body) if shape is not None else {}
            except (KeyError, TypeError, ValueError) as error:
                message = f"unexpected answer ({type(error).__name__}: {error}): {json.dumps(answer.body)[:300]}"
                handle.unknown(message, "INVALID_RESPONSE")
                return dataclasses.replace(answer, outcome=UNKNOWN, code="INVALID_RESPONSE", message=message)
            handle.ok(result)
            return dataclasses.replace(answer, result=result)
        if answer.outcome == FAIL:
            handle.fail(answer.code or "UNKNOWN", answer.message)
        else:
            handle.unknown(answer.message, answer.code or "UNKNOWN")
            self.node = (self.node + 1) % len(self.shared.http.base_urls)
        return answer

    def call_until_known(self, *args: Any, **kwargs: Any) -> Answer:
        """`call`, repeated while the answer is unknown (for calls the server deduplicates)."""
        answer = self.call(*args, **kwargs)
        for _ in range(RETRIES_MAX - 1):
            if answer.outcome != UNKNOWN or not self.pause(RETRY_PAUSE_S, paced=False):
                break
            answer = self.call(*args, **kwargs)
        return answer

    def idempotency_key(self) -> str:
        """A fresh Idempotency-Key for one logical call (its retries reuse it)."""
        return f"{self.name}-{self.rng.getrandbits(64):016x}"

    def replayed(self, answer: Answer, *call: Any, **kwargs: Any) -> None:
        """Sometimes send an acknowledged keyed call once more, unchanged: the server must answer it
        with its first answer and apply nothing (checker: check_replays)."""
        if answer.ok and self.rng.random() < self.shared.config.replay_probability:
            self.call(*call, **kwargs)

    def create_run(self, role: str) -> str | None:
        # Keyed: a create whose answer was lost is retried and cannot make a second run.
        call = ("run_create", {"idem": self.idempotency_key()}, "POST", "/v1/scopes", {"name": f"chaos-{role}"})
        answer = self.call_until_known(*call, shape=_run_shape)
        self.replayed(answer, *call, shape=_run_shape)
        if not answer.ok or answer.result is None:
            return None
        run_id = str(answer.result["run"])
        self.shared.add_run(run_id, role)
        return run_id

    def cancel_run(self, run_id: str) -> Answer:
        return self.call_until_known(
            "cancel_run", {"run": run_id}, "POST", f"/v1/scopes/{_segment(run_id)}/cancel",
            {"reason": "chaos workload"}, shape=_run_stop_shape,
        )


def _segment(value: str) -> str:
    return quote(value, safe="")


def _run_shape(body: dict[str, Any]) -> dict[str, Any]:
    return {"run": body["id"]}


def _run_stop_shape(body: dict[str, Any]) -> dict[str, Any]:
    # finishedAt: the server's time of the stop, comparable with a timer's firedAt.
    return {"storedState": body["storedState"], "finishedAt": epoch_ms(body.get("finishedAt"))}


class _Producer(_Client):
    def __init__(self, *args: Any, index: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.index = index
        self.submitted = 0
        self.batches = 0  # batch submits sent

    def loop(self) -> None:
        config = self.shared.config
        run_id: str | None = None
        in_run = 0
        cancel_after: int | None = None
        runs_made = 0
        delay = 0.0
        while self.pause(delay):
            delay = self.rng.uniform(1.5, 3.0)
            if run_id is None:
                run_id = self.create_run("producer")
                if run_id is None:
                    continue
                self.shared.add_queue(run_id, MAILBOX)
                # The first run of the first producer is always cancelled, so a short run has one.
                forced = self.index == 0 and runs_made == 0
                cancel_after = None
                if forced:
                    cancel_after = self.rng.randint(2, 3)
                elif self.rng.random() < config.run_cancel_probability:
                    cancel_after = self.rng.randint(2, TASKS_PER_RUN_MAX)
                runs_made += 1
                in_run = 0
                continue
            # The first producer's first submit is always a batch, so a short run has one.
            first_batch = self.index == 0 and self.batches == 0
            if in_run + BATCH_SUBMIT_TASKS_MAX <= TASKS_PER_RUN_MAX and (
                first_batch or self.rng.random() < config.batch_submit_probability
            ):
                count = self.rng.randint(BATCH_SUBMIT_TASKS_MIN, BATCH_SUBMIT_TASKS_MAX)
                answer = self.submit_batch(run_id, count)
                self.batches += 1
                in_run += count
            else:
                answer = self.submit(run_id)
                in_run += 1
            if answer.code in RUN_STOPPED_CODES:
                self.shared.deactivate_queue(run_id, MAILBOX)
                run_id = None
            elif cancel_after is not None and in_run >= cancel_after:
                self.cancel_and_submit(run_id)
                run_id = None
            elif in_run >= TASKS_PER_RUN_MAX:
                run_id = None  # left active: its tasks are still worked on

    def submit(self, run_id: str) -> Answer:
        self.submitted += 1
        key, task_input = f"{self.name}-{self.submitted}", {"n": self.submitted}
        body = {"scopeId": run_id, "mailboxId": self.shared.mailbox_id, "input": task_input, "taskKey": key}
        call = (
            "submit", {"run": run_id, "mailbox": MAILBOX, "key": key, "input": task_input, "idem": self.idempotency_key()},
            "POST", "/v1/tasks", body,
        )
        answer = self.call_until_known(*call, shape=_submit_shape)
        self.replayed(answer, *call, shape=_submit_shape)
        if answer.ok and answer.result is not None:
            self.shared.add_task(str(answer.result["taskId"]))
            if answer.result["created"]:
                self.shared.count_pending(self.shared.queue(run_id, MAILBOX), +1)
        return answer

    def submit_batch(self, run_id: str, count: int) -> Answer:
        """`count` tasks in one POST /tasks/batch (keyed; resent while an item's outcome is unknown,
        and sometimes once more after: checker.check_replays). Each task is its own `submit` line
        of the history, keyed `IDEM#i` (the batch's key and the item's place), so the checks of
        single submits cover them; the answer returned is the first item's."""
        keys, inputs = [], []
        for _ in range(count):
            self.submitted += 1
            keys.append(f"{self.name}-{self.submitted}")
            inputs.append({"n": self.submitted})
        idem = self.idempotency_key()
        body = {"tasks": [{"scopeId": run_id, "mailboxId": self.shared.mailbox_id, "input": task_input, "taskKey": key}
                          for key, task_input in zip(keys, inputs, strict=True)]}
        items = [{"run": run_id, "mailbox": MAILBOX, "key": key, "input": task_input, "idem": f"{idem}#{index}"}
                 for index, (key, task_input) in enumerate(zip(keys, inputs, strict=True))]
        answers = self._submit_batch_once(items, body, idem)
        for _ in range(RETRIES_MAX - 1):
            if all(answer.outcome != UNKNOWN for answer in answers) or not self.pause(RETRY_PAUSE_S, paced=False):
                break
            answers = self._submit_batch_once(items, body, idem)
        if all(answer.ok for answer in answers) and self.rng.random() < self.shared.config.replay_probability:
            self._submit_batch_once(items, body, idem)
        for answer in answers:
            if answer.ok and answer.result is not None:
                self.shared.add_task(str(answer.result["taskId"]))
                if answer.result["created"]:
                    self.shared.count_pending(self.shared.queue(run_id, MAILBOX), +1)
        return answers[0]

    def _submit_batch_once(self, items: list[dict[str, Any]], body: dict[str, Any], idem: str) -> list[Answer]:
        handles = [self.shared.history.record(self.name, "submit", item) for item in items]
        answer = self.shared.http.call(
            self.node, "POST", "/v1/tasks/batch", body, holder=self.name, timeout_s=REQUEST_TIMEOUT_S, idempotency_key=idem,
        )
        answered = answer.body.get("tasks") if answer.outcome == OK else None
        if answer.outcome == OK and not (isinstance(answered, list) and len(answered) == len(items)):
            answer = dataclasses.replace(answer, outcome=UNKNOWN, code="INVALID_RESPONSE",
                                         message=f"unexpected answer: {json.dumps(answer.body)[:300]}")
        outcomes: list[Answer] = []
        for index, handle in enumerate(handles):
            if answer.outcome == FAIL:
                handle.fail(answer.code or "UNKNOWN", answer.message)
                outcomes.append(answer)
                continue
            if answer.outcome != OK:
                handle.unknown(answer.message, answer.code or "UNKNOWN")
                outcomes.append(answer)
                continue
            found = answered[index] if isinstance(answered, list) else None
            item: dict[str, Any] = found if isinstance(found, dict) else {}
            error = item.get("error")
            if isinstance(error, dict):
                code, message = str(error.get("code")), str(error.get("message", ""))
                if code in ITEM_UNKNOWN_CODES:
                    handle.unknown(message, code)
                    outcomes.append(Answer(UNKNOWN, answer.status, item, code, message))
                else:
                    handle.fail(code, message)
                    outcomes.append(Answer(FAIL, answer.status, item, code, message))
                continue
            try:
                result = _submit_shape(item)
            except (KeyError, TypeError, ValueError) as shape_error:
                message = f"unexpected item ({type(shape_error).__name__}: {shape_error}): {json.dumps(item)[:300]}"
                handle.unknown(message, "INVALID_RESPONSE")
                outcomes.append(Answer(UNKNOWN, answer.status, {}, "INVALID_RESPONSE", message))
                continue
            handle.ok(result)
            outcomes.append(Answer(OK, answer.status, item, result=result))
        return outcomes

    def cancel_and_submit(self, run_id: str) -> None:
        """Cancel the run, then submit to it a little longer: those submits must be refused."""
        if self.cancel_run(run_id).ok:
            # (Still unknown: the workers find out, or drain what it holds.)
            self.shared.deactivate_queue(run_id, MAILBOX)
        for _ in range(SUBMITS_AFTER_CANCEL):
            if not self.pause(self.rng.uniform(0.2, 0.5)):
                return
            self.submit(run_id)


def _submit_shape(body: dict[str, Any]) -> dict[str, Any]:
    return {"taskId": body["taskId"], "created": bool(body["created"])}


class _Worker(_Client):
    """Receives from the shared queues. `opening` is the first delivery's behaviour (so a short run
    sees each kind); then crash, stall and long work come at the configured probabilities."""

    def __init__(self, *args: Any, opening: str | None = None, careful: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opening = opening
        self.careful = careful  # the drain: never misbehaves, never waits to work

    def loop(self) -> None:
        while self.running:
            queue = self.shared.pick_queue(self.rng)
            if queue is None:
                self.pause(0.5)
                continue
            if self.rng.random() < BATCH_PROBABILITY:
                deliveries = self.receive(queue, RECEIVE_WAIT_MS, BATCH_RECEIVE_MAX)
                if deliveries and self.pause(self.rng.uniform(0.05, 0.3), paced=False):
                    self.complete_many(queue, deliveries)
                else:
                    for delivery in deliveries:
                        self.crash(delivery, "stopped")
            else:
                for delivery in self.receive(queue, RECEIVE_WAIT_MS, 1):
                    self.work(queue, delivery)
            self.pause(self.rng.uniform(0.5, 1.2))

    def receive(self, queue: _Queue, wait_ms: int, count: int) -> list[dict[str, Any]]:
        lease_ms = self.shared.config.lease_ms
        body = {
            "scopeId": queue.run, "holder": self.name, "holderSession": self.session, "max": count,
            "leaseSeconds": lease_ms / 1000, "waitMs": wait_ms,
        }
        answer = self.call(
            "receive", {"run": queue.run, "mailbox": queue.mailbox, "worker": self.name, "leaseMs": lease_ms},
            "POST", f"/v1/mailboxes/{_segment(self.shared.mailbox_id)}/recv", body,
            shape=lambda body: _receive_shape(body, lease_ms), wait_ms=wait_ms,
        )
        if answer.outcome == FAIL and answer.code in RUN_STOPPED_CODES:
            self.shared.deactivate_queue(queue.run, queue.mailbox)
        if not answer.ok or answer.result is None:
            return []
        deliveries: list[dict[str, Any]] = answer.result["deliveries"]
        for delivery in deliveries:
            self.shared.add_task(str(delivery["taskId"]))
        return deliveries

    def behaviour(self) -> str:
        if self.careful:
            return "quick"
        if self.opening is not None:
            opening, self.opening = self.opening, None
            return opening
        config, roll = self.shared.config, self.rng.random()
        for kind, probability in (
            ("crash", config.crash_probability),
            ("stall", config.stall_probability),
            ("long", config.long_work_probability),
        ):
            if roll < probability:
                return kind
            roll -= probability
        return "normal"

    def work(self, queue: _Queue, delivery: dict[str, Any]) -> None:
        kind = self.behaviour()
        lease_s = self.shared.config.lease_ms / 1000
        if kind == "crash":
            self.crash(delivery, "crash")
        elif kind == "stall":
            if self.pause(lease_s + STALL_PAST_LEASE_S, paced=False):
                self.complete(queue, delivery, stalled=True)
            else:
                self.crash(delivery, "stopped")
        elif kind == "long":
            if self.work_long(delivery, lease_s):
                self.complete(queue, delivery)
        elif kind == "quick" or self.pause(self.rng.uniform(0.05, 0.3), paced=False):
            self.complete(queue, delivery)
        else:
            self.crash(delivery, "stopped")

    def work_long(self, delivery: dict[str, Any], lease_s: float) -> bool:
        """Work LONG_WORK_LEASES leases, renewing every third; False if the delivery was given up."""
        ends_at = time.monotonic() + lease_s * LONG_WORK_LEASES
        while time.monotonic() < ends_at:
            if not self.pause(lease_s / 3, paced=False):
                self.crash(delivery, "stopped")
                return False
            answer = self.call(
                "renew", {"delivery": delivery["id"], "taskId": delivery["taskId"]},
                "POST", f"/v1/messages/{_segment(delivery['taskId'])}/renew",
                {"token": delivery["id"], "leaseSeconds": self.shared.config.lease_ms / 1000},
                shape=lambda body: {"leaseExpiresAt": epoch_ms(body["leaseExpiresAt"])},
            )
            if answer.outcome == FAIL:
                return False  # the lease is gone (or the run stopped): nothing more to do
        return True

    def crash(self, delivery: dict[str, Any], reason: str) -> None:
        self.shared.history.record(
            self.name, "crash", {"delivery": delivery["id"], "taskId": delivery["taskId"], "reason": reason}
        ).ok({})

    def complete(self, queue: _Queue, delivery: dict[str, Any], *, stalled: bool = False) -> None:
        payload = {"by": self.name, "delivery": delivery["id"]}
        args: dict[str, Any] = {"delivery": delivery["id"], "taskId": delivery["taskId"], "result": payload}
        if stalled:
            args["stalled"] = True
        answer = self.call_until_known(
            "complete", args, "POST", f"/v1/messages/{_segment(delivery['taskId'])}/complete",
            {"token": delivery["id"], "result": {"payload": payload}}, shape=lambda body: {"state": body.get("state")},
        )
        if answer.ok:
            self.shared.count_pending(queue, -1)

    def complete_many(self, queue: _Queue, deliveries: list[dict[str, Any]]) -> None:
        """Complete `deliveries` in one batch call: one recorded complete per item, each ended by
        its own answer (all unknown when the call's answer is). An unknown call is sent again
        whole, as new recorded completes (the server deduplicates completes)."""
        left = list(deliveries)
        for attempt in range(RETRIES_MAX):
            if attempt and not self.pause(RETRY_PAUSE_S, paced=False):
                return
            payloads = [{"by": self.name, "delivery": delivery["id"]} for delivery in left]
            operations = [
                self.shared.history.record(
                    self.name, "complete",
                    {"delivery": delivery["id"], "taskId": delivery["taskId"], "result": payload, "batch": True},
                )
                for delivery, payload in zip(left, payloads, strict=True)
            ]
            items = [
                {"id": delivery["taskId"], "token": delivery["id"], "result": {"payload": payload}}
                for delivery, payload in zip(left, payloads, strict=True)
            ]
            answer = self.shared.http.call(
                self.node, "POST", "/v1/messages/complete", {"items": items}, holder=self.name, timeout_s=REQUEST_TIMEOUT_S,
            )
            answers = answer.body.get("items") if answer.outcome == OK else None
            if answer.outcome == OK and not (isinstance(answers, list) and len(answers) == len(left)):
                answer = dataclasses.replace(answer, outcome=UNKNOWN, code="INVALID_RESPONSE", message="items do not match")
            if answer.outcome == FAIL:
                for operation in operations:
                    operation.fail(answer.code or "UNKNOWN", answer.message)
                return
            if answer.outcome != OK:
                for operation in operations:
                    operation.unknown(answer.message, answer.code or "UNKNOWN")
                self.node = (self.node + 1) % len(self.shared.http.base_urls)
                continue
            assert isinstance(answers, list)
            for operation, item in zip(operations, answers, strict=True):
                error = item.get("error") if isinstance(item, dict) else None
                if isinstance(error, dict):
                    operation.fail(str(error.get("code") or "UNKNOWN"), str(error.get("message") or ""))
                elif isinstance(item, dict):
                    operation.ok({"state": item.get("state")})
                    self.shared.count_pending(queue, -1)
                else:
                    operation.unknown(f"an item that is not an object: {item!r}"[:200], "INVALID_RESPONSE")
            return

    def drain(self, deadline: float) -> int:
        """Receive and complete from every active queue until none has had a delivery for
        DRAIN_QUIET_S, or the deadline. Returns how many deliveries it completed."""
        completed = 0
        last_delivery = time.monotonic()
        while time.monotonic() < deadline and time.monotonic() - last_delivery < DRAIN_QUIET_S:
            queues = self.shared.active_queues()
            if not queues:
                break
            got = False
            for queue in queues:
                if time.monotonic() >= deadline:
                    break
                deliveries = self.receive(queue, 0, DRAIN_RECEIVE_MAX)
                if deliveries:
                    self.complete_many(queue, deliveries)
                    completed += len(deliveries)
                    got = True
            if got:
                last_delivery = time.monotonic()
            else:
                self.pause(DRAIN_POLL_S, paced=False)
        return completed


def _receive_shape(body: dict[str, Any], lease_ms: int) -> dict[str, Any]:
    """The deliveries of a recv (a 204 arrives as {}): each named by its token, the history's
    delivery id."""
    return {
        "deliveries": [
            {
                "id": given["token"],
                "taskId": given["message"]["id"],
                "input": given["message"]["payload"],
                "attempt": given["message"]["attempt"],
                "leaseExpiresAt": epoch_ms(given["leaseExpiresAt"]),
                "leaseMs": lease_ms,
            }
            for given in body.get("messages", [])
        ]
    }


class _Reader(_Client):
    def loop(self) -> None:
        delay = 1.0
        while self.pause(delay):
            delay = self.rng.uniform(*READ_PAUSE_S)
            task_id = self.shared.pick_task(self.rng)
            if task_id is not None:
                self.call("read_task", {"taskId": task_id}, "GET", f"/v1/tasks/{_segment(task_id)}", shape=_task_shape)
                # The next read through another node: a stale node or deposed leader would show
                # an older state than this one's (check 13, stale_reads).
                self.node = (self.node + 1) % len(self.shared.http.base_urls)


def _task_shape(body: dict[str, Any]) -> dict[str, Any]:
    return {"state": body["state"], "outcome": body["outcome"], "attempt": body["attempt"], "finishedBy": body["finishedBy"]}


def _once_body(generation: int, index: int) -> dict[str, Any]:
    """What a `once` key runs: a short piece of work whose value names the caller that ran it."""
    time.sleep(ONCE_WORK_S)
    return _once_value(generation, index)


async def _once_body_async(generation: int, index: int) -> dict[str, Any]:
    """`_once_body` for the async callers: the same keys, the same kind of value."""
    await asyncio.sleep(ONCE_WORK_S)
    return _once_value(generation, index)


def _once_value(generation: int, index: int) -> dict[str, Any]:
    return {"by": threading.current_thread().name, "token": uuid.uuid4().hex, "call": [generation, index]}


class _OnceCaller(_Client):
    """Calls `runstate.once` keys through the SDK (process-wide: `runstate.configure` names the
    nodes, the key and the run). Its thread is named after the client, so a value says who ran it."""

    def __init__(self, *args: Any, function: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.function = function

    def loop(self) -> None:
        delay = 0.0  # every caller starts at once, on the same key
        while self.pause(delay):
            delay = self.next_delay()
            call, handle = self.begin()
            try:
                value = self.function(*call)
            except Exception as error:  # noqa: BLE001 - recorded by what it says
                self.failed(handle, error)
            else:
                handle.ok({"value": value})

    def next_delay(self) -> float:
        return self.rng.uniform(3.0, 6.0)

    def begin(self) -> tuple[tuple[int, int], Any]:
        """The next call's arguments (a key of the current generation) and its history record."""
        generation = int((time.monotonic() - self.shared.started_at) / (ONCE_GENERATION_S * self.shared.config.pace))
        index = self.rng.randrange(ONCE_KEYS)
        key = str(self.function.once_key(generation, index))  # type: ignore[attr-defined]
        with self.shared.lock:
            self.shared.once_keys.track(key)
        handle = self.shared.history.record(self.name, "once", {"key": key, "name": ONCE_NAME, "call": [generation, index]})
        return (generation, index), handle

    @staticmethod
    def failed(handle: Any, error: Exception) -> None:
        if isinstance(error, UnavailableError):
            handle.unknown(error.message, error.code)
        elif isinstance(error, RunstateError):
            # A definite answer of the server (ONCE_FAILED, STALE_CLAIM, a 4xx), else unknown.
            if error.code == "ONCE_FAILED" or (error.status is not None and 400 <= error.status < 500):
                handle.fail(error.code, error.message)
            else:
                handle.unknown(error.message, error.code)
        else:  # whatever else the SDK raised, the outcome is unknown
            handle.unknown(f"{type(error).__name__}: {error}", "CLIENT_ERROR")


class _AsyncOnceCaller(_OnceCaller):
    """The same calls through the `async def` function of the same name, awaited on one event loop
    of this thread: the SDK sends them from that loop, with clients of its own."""

    def loop(self) -> None:
        asyncio.run(self._calls())

    async def _calls(self) -> None:
        delay = 0.0
        while await asyncio.to_thread(self.pause, delay):
            delay = self.next_delay()
            call, handle = self.begin()
            try:
                value = await self.function(*call)
            except Exception as error:  # noqa: BLE001 - recorded by what it says
                self.failed(handle, error)
            else:
                handle.ok({"value": value})


class _Grouper(_Client):
    """Creates N_ACCEPTED groups and reviews their finished members."""

    def loop(self) -> None:
        last_created = float("-inf")
        delay = 0.0
        while self.pause(delay):
            delay = self.rng.uniform(1.0, 2.0)
            live: list[_Group] = self.shared.live(self.shared.groups)
            now = time.monotonic()
            if len(live) < GROUPS_LIVE_MAX and now - last_created >= GROUP_INTERVAL_S * self.shared.config.pace:
                last_created = now
                self.create_group()
            elif live:
                self.review(self.rng.choice(live))

    def create_group(self) -> None:
        parent = self.create_run("group-parent")
        if parent is None:
            return
        body = {
            "mailboxId": self.shared.mailbox_id, "condition": "N_ACCEPTED", "threshold": GROUP_THRESHOLD,
            "expectedMembers": GROUP_MEMBERS, "parentScopeId": parent, "scopeId": parent,
        }
        answer = self.call("group_create", {"run": parent}, "POST", "/v1/task-groups", body, shape=_group_create_shape)
        if not answer.ok or answer.result is None:
            return
        group = _Group(str(answer.result["groupId"]), str(answer.result["scopeId"]), time.monotonic())
        with self.shared.lock:
            self.shared.groups.track(group.id, group)
        self.shared.add_run(group.run, "group")
        self.shared.add_queue(group.run, MAILBOX)
        for index in range(GROUP_MEMBERS):
            member_input = {"n": index}
            submitted = self.call_until_known(
                "group_submit", {"groupId": group.id, "key": f"m{index}", "input": member_input},
                "POST", f"/v1/task-groups/{_segment(group.id)}/tasks", {"input": member_input, "taskKey": f"m{index}"},
                shape=lambda body: {"taskId": body["id"], "created": bool(body["created"]), "groupState": body["groupState"]},
            )
            if submitted.ok and submitted.result is not None:
                self.shared.add_task(str(submitted.result["taskId"]))
                if submitted.result["created"]:
                    self.shared.count_pending(self.shared.queue(group.run, MAILBOX), +1)

    def review(self, group: _Group) -> None:
        """Read the group; give one verdict to a finished member without one (a late one, at most
        LATE_VERDICTS_MAX, once the group is decided); retire it when there is nothing left."""
        read = self.call(
            "group_read", {"groupId": group.id}, "GET", f"/v1/task-groups/{_segment(group.id)}", shape=_group_shape
        )
        if time.monotonic() - group.created_at > GROUP_AGE_MAX_S or read.code == "NOT_FOUND":
            group.live = False
            return
        if not read.ok or read.result is None:
            return
        finalized = read.result["state"] == "FINALIZED"
        candidates = [
            member for member in read.result["members"]
            if member["verdict"] is None and member["state"] in FINISHED_TASK_STATES
        ]
        if finalized and (not candidates or group.late_verdicts >= LATE_VERDICTS_MAX):
            group.live = False
            return
        if not candidates:
            return
        member = self.rng.choice(candidates)
        accept = member["state"] == "SUCCEEDED" and self.rng.random() < self.shared.config.accept_probability
        verdict = "accept" if accept else "reject"
        answer = self.call_until_known(
            "verdict", {"groupId": group.id, "taskId": member["taskId"], "verdict": verdict},
            "POST", f"/v1/task-groups/{_segment(group.id)}/tasks/{_segment(member['taskId'])}/{verdict}",
            {"holder": self.name},
            shape=lambda body: {
                "late": body["late"], "groupState": body["groupState"], "outcome": body["outcome"],
                "outcomeReason": body["outcomeReason"], "verdict": body["verdict"],
            },
        )
        if finalized and answer.ok:
            group.late_verdicts += 1


def _group_create_shape(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "groupId": body["id"], "scopeId": body["scopeId"], "threshold": body["threshold"],
        "condition": body["condition"], "expectedMembers": body["expectedMembers"],
    }


def _group_shape(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "state": body["state"], "outcome": body["outcome"], "outcomeReason": body["outcomeReason"],
        "members": [
            {"taskId": member["taskId"], "state": member["state"], "verdict": member["verdict"], "late": member["late"]}
            for member in body["members"]
        ],
    }


class _BarrierClient(_Client):
    """Arrives with its own key; the first client also creates barriers and arrives with extras."""

    def __init__(self, *args: Any, creator: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.creator = creator
        self.extras = 0
        self.arrivals = 0
        self.run: str | None = None
        self.in_run = 0

    def loop(self) -> None:
        last_created = float("-inf")
        delay = 0.0
        while self.pause(delay):
            delay = self.rng.uniform(2.5, 4.5)
            now = time.monotonic()
            live: list[_Barrier] = self.shared.live(self.shared.barriers)
            for barrier in live:
                if now - barrier.created_at > BARRIER_AGE_MAX_S:
                    barrier.live = False
            if self.creator and len(live) < BARRIERS_LIVE_MAX and now - last_created >= BARRIER_INTERVAL_S * self.shared.config.pace:
                last_created = now
                self.create()
                continue
            mine = [barrier for barrier in live if self.name not in barrier.arrived and barrier.state == "WAITING"]
            if mine:
                barrier = self.rng.choice(mine)
                self.arrive(barrier, self.name)
                # Then look, as a waiting shard would (always after a client's first arrival).
                if barrier.state == "WAITING" and (self.arrivals == 1 or self.rng.random() < 0.5):
                    self.read(barrier)
            elif live:
                barrier = self.rng.choice(live)
                roll = self.rng.random()
                if self.creator and roll < 0.3:
                    self.extras += 1
                    self.arrive(barrier, f"{self.name}-extra-{self.extras}")  # counted, or BARRIER_RELEASED
                elif roll < 0.45:
                    self.arrive(barrier, self.name)  # a repeat: arrived false
                else:
                    self.read(barrier)

    def create(self) -> None:
        if self.run is None:
            self.run = self.create_run("barriers")
            self.in_run = 0
            if self.run is None:
                return
        answer = self.call(
            "barrier_create", {"run": self.run, "target": BARRIER_TARGET},
            "POST", "/v1/barriers", {"scopeId": self.run, "target": BARRIER_TARGET},
            shape=lambda body: {"barrierId": body["id"], "target": body["target"], "epoch": body["epoch"]},
        )
        self.in_run += 1
        if answer.ok and answer.result is not None:
            barrier = _Barrier(str(answer.result["barrierId"]), self.run, time.monotonic())
            with self.shared.lock:
                self.shared.barriers.track(barrier.id, barrier)
        if self.in_run >= BARRIERS_PER_RUN:
            # Now and then the run stops under a barrier still waiting: BARRIER_CANCELLED.
            if self.rng.random() < self.shared.config.run_cancel_probability:
                self.cancel_run(self.run)
            self.run = None

    def arrive(self, barrier: _Barrier, key: str) -> None:
        answer = self.call(
            "arrive", {"barrierId": barrier.id, "key": key}, "POST", f"/v1/barriers/{_segment(barrier.id)}/arrive",
            {"arrivalKey": key}, shape=_arrive_shape,
        )
        if answer.ok and answer.result is not None:
            barrier.state = str(answer.result["state"])
        elif answer.code == "BARRIER_RELEASED":
            barrier.state = "RELEASED"
        elif answer.code in ("BARRIER_CANCELLED", "NOT_FOUND"):
            barrier.state = "CANCELLED"
        if answer.outcome != UNKNOWN and key == self.name:
            barrier.arrived.add(key)
            self.arrivals += 1

    def read(self, barrier: _Barrier) -> None:
        answer = self.call(
            "barrier_read", {"barrierId": barrier.id}, "GET", f"/v1/barriers/{_segment(barrier.id)}", shape=_barrier_shape
        )
        if answer.ok and answer.result is not None:
            barrier.state = str(answer.result["state"])
            if barrier.state != "WAITING" and self.rng.random() < 0.5:
                barrier.live = False


def _arrive_shape(body: dict[str, Any]) -> dict[str, Any]:
    return {"arrived": body["arrived"], "state": body["state"], "arrivals": body["arrivals"], "epoch": body["epoch"]}


def _barrier_shape(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "state": body["state"], "arrivals": body["arrivals"], "target": body["target"], "epoch": body["epoch"],
        "releasedAt": epoch_ms(body.get("releasedAt")),
    }


class _TimerClient(_Client):
    """Arms timers a few seconds ahead and reads them until they fired; cancels some runs first."""

    def loop(self) -> None:
        run: str | None = None
        in_run = 0
        cancel_planned = False
        runs_made = 0
        last_created = float("-inf")
        delay = 0.0
        while self.pause(delay):
            delay = self.rng.uniform(1.5, 2.5)
            now = time.monotonic()
            if now - last_created >= TIMER_INTERVAL_S * self.shared.config.pace:
                last_created = now
                if run is None:
                    run = self.create_run("timers")
                    if run is None:
                        continue
                    # The first run's timers are always cancelled, so a short run has some.
                    cancel_planned = runs_made == 0 or self.rng.random() < self.shared.config.run_cancel_probability
                    runs_made += 1
                    in_run = 0
                # Timers of a run about to be cancelled are far enough ahead to be cancelled first.
                after_ms = self.rng.randint(3_000, 5_000) if cancel_planned else self.rng.randint(1_000, 4_000)
                self.create(run, after_ms)
                in_run += 1
                if cancel_planned and in_run >= 2:
                    self.cancel_run(run)
                    run = None
                elif in_run >= TIMERS_PER_RUN:
                    run = None
                continue
            live: list[_Timer] = self.shared.live(self.shared.timers)
            if live:
                self.read(self.rng.choice(live))

    def create(self, run: str, after_ms: int) -> None:
        answer = self.call(
            "timer_create", {"run": run, "afterMs": after_ms}, "POST", "/v1/timers",
            {"scopeId": run, "afterSeconds": after_ms / 1000},
            shape=lambda body: {"timerId": body["id"], "fireAt": epoch_ms(body["fireAt"]), "state": body["state"]},
        )
        if answer.ok and answer.result is not None:
            timer = _Timer(str(answer.result["timerId"]), run, int(answer.result["fireAt"]), time.monotonic())
            with self.shared.lock:
                self.shared.timers.track(timer.id, timer)

    def read(self, timer: _Timer) -> None:
        answer = self.call(
            "timer_read", {"timerId": timer.id}, "GET", f"/v1/timers/{_segment(timer.id)}",
            shape=lambda body: {"state": body["state"], "firedAt": epoch_ms(body["firedAt"]), "fireAt": epoch_ms(body["fireAt"])},
        )
        if answer.ok and answer.result is not None:
            timer.state = str(answer.result["state"])
        if timer.state != "ARMED" or time.monotonic() - timer.created_at > TIMER_AGE_MAX_S:
            timer.live = False


class _PermitClient(_Client):
    """Grants of the shared permit (module docstring): acquire, hold, release; the line when full."""

    def loop(self) -> None:
        permit_id = self.declare()
        run: str | None = None
        in_run = 0
        while permit_id is not None and self.pause(self.rng.uniform(0.1, 0.4)):
            if run is None:
                run = self.create_run("permits")
                in_run = 0
                if run is None:
                    continue
            in_run += 1
            units = self.rng.choice((1, 1, 2))
            grant, code = self.acquire(permit_id, run, units)
            if grant is None and code == "CAPACITY_UNAVAILABLE" and self.rng.random() < PERMIT_LINE_PROBABILITY:
                grant = self.wait_in_line(permit_id, run, units)
            if grant is not None:
                run = self.hold(grant, run)
            if self.rng.random() < PERMIT_READ_PROBABILITY:
                self.read(permit_id)
            if run is not None and in_run >= PERMIT_GRANTS_PER_RUN:
                run = None

    def declare(self) -> str | None:
        while self.running:
            answer = self.call_until_known(
                "permit_declare", {"name": PERMIT_NAME, "units": PERMIT_UNITS}, "PUT",
                f"/v1/permits/by-name/{PERMIT_NAME}", {"units": PERMIT_UNITS},
                shape=lambda body: {"permitId": body["id"], "unitsTotal": body["unitsTotal"]},
            )
            if answer.ok and answer.result is not None:
                with self.shared.lock:
                    self.shared.permit_ids.track(str(answer.result["permitId"]))
                return str(answer.result["permitId"])
            if answer.outcome == FAIL:
                raise RuntimeError(f"cannot declare the permit: {answer.code}: {answer.message}")
            self.pause(RETRY_PAUSE_S, paced=False)
        return None

    def acquire(self, permit_id: str, run: str, units: int, waiter: str | None = None) -> tuple[dict[str, Any] | None, str | None]:
        """A grant (its id, token, units, lease expiry in server ms) or None, with the refusal's code.
        Not retried: an acquire whose answer was lost may hold units until its lease lapses."""
        body: dict[str, Any] = {
            "scopeId": run, "units": units, "holder": self.name, "holderSession": self.session,
            "leaseSeconds": PERMIT_LEASE_MS / 1000,
        }
        if waiter is not None:
            body["waiterId"] = waiter
        answer = self.call(
            "permit_acquire", {"permit": permit_id, "run": run, "units": units, "leaseMs": PERMIT_LEASE_MS, "waiter": waiter},
            "POST", f"/v1/permits/{_segment(permit_id)}/acquire", body,
            shape=lambda body: {"grantId": body["grantId"], "token": body["token"], "units": body["units"],
                                "leaseExpiresAt": epoch_ms(body["leaseExpiresAt"])},
        )
        return (answer.result if answer.ok else None), answer.code

    def wait_in_line(self, permit_id: str, run: str, units: int) -> dict[str, Any] | None:
        """Join the permit's line, poll the waiter, acquire for it once SIGNALED; cancel it if the
        turn does not come within the polls."""
        answer = self.call(
            "permit_wait", {"permit": permit_id, "run": run, "units": units}, "POST",
            f"/v1/permits/{_segment(permit_id)}/wait",
            {"scopeId": run, "units": units, "holder": self.name, "ttlSeconds": PERMIT_WAITER_TTL_S},
            shape=lambda body: {"waiterId": body["waiterId"], "state": body["state"]},
        )
        if not answer.ok or answer.result is None:
            return None
        waiter, state = str(answer.result["waiterId"]), str(answer.result["state"])
        for _ in range(PERMIT_WAITER_POLLS_MAX):
            if state == "SIGNALED":
                grant, _code = self.acquire(permit_id, run, units, waiter)
                return grant
            if state != "WAITING" or not self.pause(PERMIT_WAITER_POLL_S, paced=False):
                return None
            read = self.call(
                "permit_waiter_read", {"waiterId": waiter}, "GET", f"/v1/permit-waiters/{_segment(waiter)}",
                shape=lambda body: {"state": body["state"]},
            )
            if read.ok and read.result is not None:
                state = str(read.result["state"])
        self.call("permit_waiter_cancel", {"waiterId": waiter}, "POST", f"/v1/permit-waiters/{_segment(waiter)}/cancel", {})
        return None

    def hold(self, grant: dict[str, Any], run: str) -> str | None:
        """Hold the grant, then end it: a release (sometimes after its lease lapsed), or the run's
        cancel. The run to go on with (None after a cancel)."""
        if self.rng.random() < self.shared.config.run_cancel_probability / 4:
            self.pause(self.rng.uniform(*PERMIT_HOLD_S), paced=False)
            self.cancel_run(run)
            return None
        lapse = self.rng.random() < PERMIT_LAPSE_PROBABILITY
        held_s = PERMIT_LEASE_MS / 1000 + 0.5 if lapse else self.rng.uniform(*PERMIT_HOLD_S)
        self.pause(held_s, paced=False)
        self.call(
            "permit_release", {"grantId": grant["grantId"], "lapsed": lapse}, "POST",
            f"/v1/grants/{_segment(str(grant['grantId']))}/release", {"token": grant["token"]},
        )
        return run

    def read(self, permit_id: str) -> None:
        self.call(
            "permit_read", {"permit": permit_id}, "GET", f"/v1/permits/{_segment(permit_id)}",
            shape=lambda body: {
                "unitsTotal": body["unitsTotal"], "unitsInUse": body["unitsInUse"],
                "grants": [[grant["grantId"], grant["units"]] for grant in body["grants"]],
            },
        )


class _AllowanceClient(_Client):
    """Consumes units of the shared allowance; waits in its line when it is exhausted."""

    def loop(self) -> None:
        allowance_id = self.declare()
        run: str | None = None
        in_run = 0
        while allowance_id is not None and self.pause(self.rng.uniform(0.1, 0.4)):
            if run is None:
                run = self.create_run("allowances")
                in_run = 0
                if run is None:
                    continue
            in_run += 1
            units = self.rng.choice((1, 1, 2))
            answer = self.call(
                "allowance_consume", {"allowance": allowance_id, "run": run, "units": units}, "POST",
                f"/v1/allowances/{_segment(allowance_id)}/consume", {"scopeId": run, "units": units, "holder": self.name},
                shape=lambda body: {"consumptionId": body["consumptionId"], "units": body["units"]},
            )
            if answer.code == "ALLOWANCE_EXHAUSTED" and self.rng.random() < ALLOWANCE_LINE_PROBABILITY:
                self.wait_in_line(allowance_id, run, units)
            if run is not None and in_run >= PERMIT_GRANTS_PER_RUN:
                run = None

    def declare(self) -> str | None:
        while self.running:
            body = {"unitsLimit": ALLOWANCE_UNITS, "windowSeconds": ALLOWANCE_WINDOW_S}
            answer = self.call_until_known(
                "allowance_declare", {"name": ALLOWANCE_NAME, **body}, "PUT", f"/v1/allowances/by-name/{ALLOWANCE_NAME}",
                body, shape=lambda body: {"allowanceId": body["id"], "unitsLimit": body["unitsLimit"],
                                          "windowSeconds": body["windowSeconds"]},
            )
            if answer.ok and answer.result is not None:
                return str(answer.result["allowanceId"])
            if answer.outcome == FAIL:
                raise RuntimeError(f"cannot declare the allowance: {answer.code}: {answer.message}")
            self.pause(RETRY_PAUSE_S, paced=False)
        return None

    def wait_in_line(self, allowance_id: str, run: str, units: int) -> None:
        answer = self.call(
            "allowance_wait", {"allowance": allowance_id, "run": run, "units": units}, "POST",
            f"/v1/allowances/{_segment(allowance_id)}/wait",
            {"scopeId": run, "units": units, "holder": self.name, "ttlSeconds": ALLOWANCE_WAITER_TTL_S},
            shape=lambda body: {"waiterId": body["waiterId"], "state": body["state"]},
        )
        if not answer.ok or answer.result is None:
            return
        waiter, state = str(answer.result["waiterId"]), str(answer.result["state"])
        for _ in range(ALLOWANCE_WAITER_POLLS_MAX):
            if state != "WAITING" or not self.pause(PERMIT_WAITER_POLL_S, paced=False):
                return
            read = self.call(
                "allowance_waiter_read", {"waiterId": waiter, "allowance": allowance_id, "units": units}, "GET",
                f"/v1/allowance-waiters/{_segment(waiter)}", shape=lambda body: {"state": body["state"]},
            )
            if read.ok and read.result is not None:
                state = str(read.result["state"])
        self.call("allowance_waiter_cancel", {"waiterId": waiter}, "POST",
                  f"/v1/allowance-waiters/{_segment(waiter)}/cancel", {})


def _minor(value: Any) -> int:
    return int(value)


class _BudgetClient(_Client):
    """Reserves, settles in parts and voids money of the shared budget (module docstring)."""

    def loop(self) -> None:
        budget_id = self.declare()
        run: str | None = None
        in_run = 0
        while budget_id is not None and self.pause(self.rng.uniform(0.2, 0.5)):
            if run is None:
                run = self.create_run("budgets")
                in_run = 0
                if run is None:
                    continue
            in_run += 1
            reservation = self.reserve(budget_id, run)
            if reservation is not None:
                if self.rng.random() < BUDGET_ABANDON_PROBABILITY:
                    self.cancel_run(run)  # its stop voids the reservation
                    run = None
                    continue
                self.spend(budget_id, reservation)
            if self.rng.random() < PERMIT_READ_PROBABILITY:
                self.read(budget_id)
            if run is not None and in_run >= BUDGET_RESERVATIONS_PER_RUN:
                self.cancel_run(run)
                run = None

    def declare(self) -> str | None:
        while self.running:
            answer = self.call_until_known(
                "budget_declare", {"name": BUDGET_NAME, "limitMinor": BUDGET_LIMIT_MINOR}, "PUT",
                f"/v1/budgets/by-name/{BUDGET_NAME}", {"limitMinor": str(BUDGET_LIMIT_MINOR), "scale": 2},
                shape=lambda body: {"budgetId": body["id"], "limitMinor": _minor(body["limitMinor"])},
            )
            if answer.ok and answer.result is not None:
                with self.shared.lock:
                    self.shared.budget_ids.track(str(answer.result["budgetId"]))
                return str(answer.result["budgetId"])
            if answer.outcome == FAIL:
                raise RuntimeError(f"cannot declare the budget: {answer.code}: {answer.message}")
            self.pause(RETRY_PAUSE_S, paced=False)
        return None

    def reserve(self, budget_id: str, run: str) -> dict[str, Any] | None:
        amount = self.rng.randint(*BUDGET_RESERVE_MINOR)
        answer = self.call(
            "budget_reserve", {"budget": budget_id, "run": run, "amountMinor": amount}, "POST",
            f"/v1/budgets/{_segment(budget_id)}/reserve",
            {"scopeId": run, "holder": self.name, "amountMinor": str(amount)},
            shape=lambda body: {"reservationId": body["reservationId"], "reservedMinor": _minor(body["reservedMinor"])},
        )
        return answer.result if answer.ok else None

    def spend(self, budget_id: str, reservation: dict[str, Any]) -> None:
        """One or two settles keyed by workKey (each retried under its key while unknown), then a
        void of the rest."""
        reservation_id, reserved = str(reservation["reservationId"]), int(reservation["reservedMinor"])
        overrun = self.rng.random() < BUDGET_OVERRUN_PROBABILITY
        parts = [reserved * 2] if overrun else [self.rng.randint(0, reserved // 2) for _ in range(self.rng.randint(1, 2))]
        for index, amount in enumerate(parts):
            body = {"reservationId": reservation_id, "amountMinor": str(amount), "workKey": f"settle:{index}",
                    "allowOverrun": overrun}
            answer = self.call_until_known(
                "budget_settle", {"budget": budget_id, "reservationId": reservation_id, "amountMinor": amount,
                                  "workKey": body["workKey"], "allowOverrun": overrun},
                "POST", f"/v1/budgets/{_segment(budget_id)}/settle", body,
                shape=lambda body: {"chargedMinor": _minor(body["chargedMinor"]), "state": body["state"]},
            )
            if not answer.ok or (answer.result is not None and answer.result["state"] not in ("ACTIVE", "STALE")):
                return
        self.call_until_known(
            "budget_void", {"budget": budget_id, "reservationId": reservation_id}, "POST",
            f"/v1/budgets/{_segment(budget_id)}/void", {"reservationId": reservation_id, "workKey": "void"},
            shape=lambda body: {"state": body["state"]},
        )

    def read(self, budget_id: str) -> None:
        self.call(
            "budget_read", {"budget": budget_id}, "GET", f"/v1/budgets/{_segment(budget_id)}",
            shape=_budget_shape,
        )


def _budget_shape(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "limitMinor": _minor(body["limitMinor"]), "settledMinor": _minor(body["settledMinor"]),
        "reservedMinor": _minor(body["reservedMinor"]), "remainingMinor": _minor(body["remainingMinor"]),
        "held": sum(_minor(r["reservedMinor"]) for r in body["reservations"] if r["state"] in ("ACTIVE", "STALE")),
    }


class _Watcher(_Client):
    """Long-polls the space's events from its last cursor (module docstring); `rewinds`: now and
    then starts again without a cursor or from an older one it remembered."""

    def __init__(self, *args: Any, rewinds: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rewinds = rewinds
        self.cursor: int | None = None
        self.remembered: collections.deque[int] = collections.deque(maxlen=WATCH_CURSORS_KEPT)

    def loop(self) -> None:
        delay = 0.0
        while self.pause(delay):
            delay = self.rng.uniform(*WATCH_PAUSE_S)
            cursor, resume = self.cursor, "next"
            if self.rewinds:
                roll = self.rng.random()
                if roll < WATCH_RESTART_PROBABILITY:
                    cursor, resume = None, "restart"
                elif roll < WATCH_RESTART_PROBABILITY + WATCH_REWIND_PROBABILITY and self.remembered:
                    cursor, resume = self.rng.choice(self.remembered), "older"
            answer = self.page(cursor, resume)
            if answer.ok and answer.result is not None:
                self.cursor = int(answer.result["nextCursor"])
                self.remembered.append(self.cursor)
            elif answer.code == CURSOR_EXPIRED:
                self.cursor = None  # what the cursor names was dropped: start again without one

    def page(self, cursor: int | None, resume: str) -> Answer:
        query = {"limit": WATCH_LIMIT, "waitSeconds": WATCH_WAIT_S}
        if cursor is not None:
            query["cursor"] = cursor
        return self.call(
            "watch", {"watcher": self.name, "cursor": cursor, "limit": WATCH_LIMIT, "resume": resume, "node": self.node},
            "GET", "/v1/watch?" + urllib.parse.urlencode(query), shape=_events_page_shape, wait_ms=WATCH_WAIT_S * 1000,
        )


def _events_page_shape(body: dict[str, Any]) -> dict[str, Any]:
    """A page of events (GET /watch, GET /events): each event's number (its cursor), id, type,
    aggregate, run, payload and time (epoch ms); and the cursor to resume from."""
    return {
        "events": [
            {
                "seq": int(event["cursor"]), "eventId": event["eventId"], "type": event["type"],
                "aggregateType": event["aggregateType"], "aggregateId": event["aggregateId"],
                "scopeId": event["scopeId"], "payload": event["payload"], "createdAt": epoch_ms(event["createdAt"]),
            }
            for event in body["events"]
        ],
        "nextCursor": int(body["nextCursor"]),
    }


# -- the workload ------------------------------------------------------------------------------


class Workload:
    """Every client role against the cluster's nodes (module docstring). Not restartable."""

    def __init__(
        self, base_urls: list[str], admin_key: str, history: History, seed: int, config: WorkloadConfig | None = None,
        context: ssl.SSLContext | None = None,
    ) -> None:
        """`context` verifies https:// nodes (the SDK's `once` callers trust the CA through the
        environment: `python -m chaos run --tls` sets it)."""
        self.base_urls = list(base_urls)
        self.admin_key = admin_key
        self.history = history
        self.seed = seed
        self.config = config if config is not None else WorkloadConfig()
        self.http = HttpClient(self.base_urls, admin_key, context=context)
        self.shared = _Shared(self.http, history, self.config)
        self.errors: list[str] = []  # exceptions that ended a client thread: bugs of the harness
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._clients: list[_Client] = []
        self._state = "new"
        self._once_function: Callable[..., Any] = runstate.once(
            _once_body, name=ONCE_NAME, lease=ONCE_LEASE, attempts=ONCE_ATTEMPTS
        )
        self._async_once_function: Callable[..., Any] = runstate.once(
            _once_body_async, name=ONCE_NAME, lease=ONCE_LEASE, attempts=ONCE_ATTEMPTS
        )

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Create the mailbox and the once run (bounded; RuntimeError if the cluster does not
        answer), then start every client thread."""
        if self._state != "new":
            raise RuntimeError(f"the workload was started already ({self._state})")
        self._state = "running"
        self._setup()
        for client in self._make_clients():
            thread = threading.Thread(target=self._run_client, args=(client,), name=client.name, daemon=True)
            self._clients.append(client)
            self._threads.append(thread)
        self.shared.started_at = time.monotonic()
        for thread in self._threads:
            thread.start()

    def _setup(self) -> None:
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        node = 0
        while True:
            answer = self.http.call(
                node, "POST", "/v1/mailboxes", {"name": MAILBOX, "mode": "WORK"}, holder="setup", timeout_s=REQUEST_TIMEOUT_S
            )
            if answer.ok:
                self.shared.mailbox_id = str(answer.body["id"])
                break
            if answer.code == "CONFLICT":  # made by an earlier attempt whose answer was lost
                listed = self.http.call(
                    node, "GET", f"/v1/mailboxes?name={MAILBOX}", holder="setup", timeout_s=REQUEST_TIMEOUT_S
                )
                if listed.ok and listed.body.get("mailboxes"):
                    self.shared.mailbox_id = str(listed.body["mailboxes"][0]["id"])
                    break
            if answer.outcome == FAIL or time.monotonic() >= deadline:
                raise RuntimeError(f"cannot create the mailbox {MAILBOX!r}: {answer.code}: {answer.message}")
            node += 1
            time.sleep(RETRY_PAUSE_S)
        setup = _Client("once-setup", 0, self.shared, self.seed, self._stopping)
        while self.shared.once_run is None:
            self.shared.once_run = setup.create_run("once")
            if self.shared.once_run is None:
                if time.monotonic() >= deadline:
                    raise RuntimeError("cannot create the run of the once callers")
                setup.pause(RETRY_PAUSE_S, paced=False)
        self._configure_sdk()

    def _configure_sdk(self) -> None:
        runstate.configure(
            base_url=self.base_urls, api_key=self.admin_key, scope_id=self.shared.once_run, holder="chaos-once"
        )

    def use_urls(self, base_urls: list[str]) -> None:
        """The cluster's nodes changed (a node replaced, added or removed): the clients' next calls,
        and the SDK's (`once` callers), go to these. Reconfiguring the SDK closes its process-wide
        client, so a `once` call in flight ends with an error, recorded as of unknown outcome."""
        self.base_urls = list(base_urls)
        self.http.use_urls(self.base_urls)
        if self._state == "running" and self.shared.once_run is not None:
            self._configure_sdk()

    def _make_clients(self) -> list[_Client]:
        config = self.config
        clients: list[_Client] = []
        counter = itertools.count()

        def common(name: str) -> dict[str, Any]:
            # Spread the clients over the nodes.
            return {"name": name, "node": next(counter) % len(self.base_urls), "shared": self.shared,
                    "seed": self.seed, "stopping": self._stopping}

        openings = ("crash", "stall", "long")
        clients += [_Producer(**common(f"producer-{i}"), index=i) for i in range(config.producers)]
        clients += [
            _Worker(**common(f"worker-{i}"), opening=openings[i] if i < len(openings) else None) for i in range(config.workers)
        ]
        clients += [_Reader(**common(f"reader-{i}")) for i in range(config.readers)]
        clients += [_OnceCaller(**common(f"once-{i}"), function=self._once_function) for i in range(config.once_callers)]
        clients += [
            _AsyncOnceCaller(**common(f"once-async-{i}"), function=self._async_once_function)
            for i in range(config.async_once_callers)
        ]
        clients += [_Grouper(**common(f"grouper-{i}")) for i in range(config.groupers)]
        clients += [_BarrierClient(**common(f"barrier-{i}"), creator=i == 0) for i in range(config.barrier_clients)]
        clients += [_TimerClient(**common(f"timers-{i}")) for i in range(config.timer_clients)]
        clients += [_PermitClient(**common(f"permits-{i}")) for i in range(config.permit_clients)]
        clients += [_BudgetClient(**common(f"budgets-{i}")) for i in range(config.budget_clients)]
        clients += [_AllowanceClient(**common(f"allowances-{i}")) for i in range(config.allowance_clients)]
        clients += [_Watcher(**common(f"watcher-{i}"), rewinds=i > 0) for i in range(config.watchers)]
        return clients

    def _run_client(self, client: _Client) -> None:
        try:
            client.loop()
        except Exception as error:  # noqa: BLE001 - reported, and the test fails on it
            log.exception("client %s failed", client.name)
            self.errors.append(f"{client.name}: {type(error).__name__}: {error}")

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every client (bounded by `timeout_s`): a call still open afterwards is written as
        unknown, an abandoned delivery as a `crash`. Closes the SDK's process-wide client."""
        if self._state != "running":
            return
        self._stopping.set()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [thread.name for thread in self._threads if thread.is_alive()]
        if stuck:
            log.warning("clients still in a call after %.0f s: %s", timeout_s, stuck)
        self.history.close_open("the workload stopped before this call returned")
        runstate.close()
        with contextlib.suppress(RunstateError):
            runstate.configure()  # back to the environment's settings
        self._state = "stopped"

    def finalize(self, timeout_s: float = FINALIZE_TIMEOUT_S) -> dict[str, Any]:
        """After the faults healed: complete what is left in the queues, wait for the last timers'
        time, then read every entity the workload created (linearizable reads, retried on unknown
        until the bound) and write its `final` line; then read the rest of the event log
        (`_read_events_final`). Returns `{"drained", "finals": {kind: count}, "missing": [[kind,
        id], ...], "events": {pages, events, complete}}`: `<kind>_refused` counts reads refused for
        certain (their final view is `{"error": {"code", "message"}}`); missing, those with no
        definite answer before the bound (no final line)."""
        if self._state != "stopped":
            raise RuntimeError("stop() the workload before finalize()")
        self._state = "finalized"
        deadline = time.monotonic() + timeout_s
        drainer = _Worker("drain", 0, self.shared, self.seed, threading.Event(), careful=True)
        drained = drainer.drain(min(deadline, time.monotonic() + DRAIN_TIMEOUT_S))
        self._wait_for_timers(deadline)
        counts: collections.Counter[str] = collections.Counter()
        missing: list[list[str]] = []
        node = 0
        for kind, entity_id, path, extra in self._final_reads():
            answer, node = self._read_final(path, node, deadline)
            if answer is None:
                missing.append([kind, entity_id])
            elif answer.ok:
                self.history.final(kind, entity_id, {**normalize_times(answer.body), **extra})
                counts[kind] += 1
            else:
                self.history.final(kind, entity_id, {"error": {"code": answer.code, "message": answer.message}})
                counts[f"{kind}_refused"] += 1
        events_read = self._read_events_final(deadline)
        self.history.flush()
        return {"drained": drained, "finals": dict(counts), "missing": missing, "events": events_read}

    def _read_events_final(self, deadline: float) -> dict[str, Any]:
        """The rest of the space's events, from the first watcher's last cursor until a page is
        empty (each page an `events_read` call; an unknown one retried on the next node, a
        CURSOR_EXPIRED one started again without a cursor), bounded by EVENTS_FINAL_PAGES_MAX pages
        and the deadline. Returns {pages, events, complete}."""
        watchers = [client for client in self._clients if isinstance(client, _Watcher)]
        reader = _Client("final-events", 0, self.shared, self.seed, threading.Event())
        cursor = watchers[0].cursor if watchers else None
        pages = seen = 0
        while pages < EVENTS_FINAL_PAGES_MAX and time.monotonic() < deadline:
            query: dict[str, Any] = {"limit": EVENTS_FINAL_LIMIT}
            if cursor is not None:
                query["cursor"] = cursor
            answer = reader.call(
                "events_read", {"cursor": cursor, "limit": EVENTS_FINAL_LIMIT, "node": reader.node},
                "GET", "/v1/events?" + urllib.parse.urlencode(query), shape=_events_page_shape,
            )
            pages += 1
            if answer.ok and answer.result is not None:
                if not answer.result["events"]:
                    return {"pages": pages, "events": seen, "complete": True}
                seen += len(answer.result["events"])
                cursor = int(answer.result["nextCursor"])
            elif answer.code == CURSOR_EXPIRED:
                cursor = None
            elif answer.outcome == FAIL:
                break
            else:
                time.sleep(FINAL_RETRY_PAUSE_S)
        return {"pages": pages, "events": seen, "complete": False}

    def _wait_for_timers(self, deadline: float) -> None:
        with self.shared.lock:
            fire_at_ms = [timer.fire_at_ms for timer in self.shared.timers.values()]
        if fire_at_ms:
            wait_s = (max(fire_at_ms) - time.time() * 1000) / 1000 + TIMER_SETTLE_S
            time.sleep(max(0.0, min(wait_s, deadline - time.monotonic())))

    def _final_reads(self) -> Iterator[tuple[str, str, str, dict[str, Any]]]:
        """(kind, id, path, fields added to the view) of every entity created."""
        with self.shared.lock:
            runs, tasks = list(self.shared.runs), list(self.shared.tasks)
            groups, barriers = list(self.shared.groups), list(self.shared.barriers)
            timers, once_keys, once_run = list(self.shared.timers), list(self.shared.once_keys), self.shared.once_run
            permit_ids, budget_ids = list(self.shared.permit_ids), list(self.shared.budget_ids)
        for run_id in runs:
            yield "run", run_id, f"/v1/scopes/{_segment(run_id)}", {}
        for task_id in tasks:
            yield "task", task_id, f"/v1/tasks/{_segment(task_id)}", {}
        for group_id in groups:
            yield "group", group_id, f"/v1/task-groups/{_segment(group_id)}", {}
        for barrier_id in barriers:
            yield "barrier", barrier_id, f"/v1/barriers/{_segment(barrier_id)}", {}
        for timer_id in timers:
            yield "timer", timer_id, f"/v1/timers/{_segment(timer_id)}", {}
        for permit_id in permit_ids:
            yield "permit", permit_id, f"/v1/permits/{_segment(permit_id)}", {}
        for budget_id in budget_ids:
            yield "budget", budget_id, f"/v1/budgets/{_segment(budget_id)}", {}
        if once_run is not None:
            for key in once_keys:
                query = urllib.parse.urlencode({"scopeId": once_run, "key": key})
                yield "once", key, f"/v1/once?{query}", {"scopeId": once_run}

    def _read_final(self, path: str, node: int, deadline: float) -> tuple[Answer | None, int]:
        """The first definite answer to the read (ok, or a refusal such as NOT_FOUND: an
        acknowledged entity is gone), or None if no node gave one before the deadline; and the
        node to ask next."""
        while True:
            answer = self.http.call(node, "GET", path, holder="final", timeout_s=REQUEST_TIMEOUT_S)
            if answer.outcome != UNKNOWN:
                return answer, node
            node = (node + 1) % len(self.base_urls)
            if time.monotonic() + FINAL_RETRY_PAUSE_S >= deadline:
                return None, node
            time.sleep(FINAL_RETRY_PAUSE_S)

    def __repr__(self) -> str:
        ended = sum(count for by_status in self.history.counts().values() for count in by_status.values())
        return (
            f"Workload(seed={self.seed}, state={self._state}, clients={len(self._clients)}, "
            f"operations={ended}, errors={len(self.errors)})"
        )
