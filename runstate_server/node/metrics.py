"""What this node observes for its metrics (GET /metrics renders them: node/api/metrics.py): task
ends, lease expiries and takeovers from the effects of the entries it applies, and its HTTP
requests. Node-local memory, not replicated: each node counts from its own start (its log replay
included), and a restart starts again from zero, which Prometheus reads as a counter reset."""

from __future__ import annotations

from typing import Any

from runstate_server.actors.state import TaskState
from runstate_server.histogram import Histogram

# Bucket bounds of a task's latency (seconds from its submit to its end) and of its attempts.
TASK_LATENCY_SECONDS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
TASK_ATTEMPTS_BUCKETS = (0.0, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0, 100.0)
# (method, route, status) series of the HTTP request counter: routes and statuses are few, but a
# bound all the same; a request of a new series past it is counted under method and route "other".
HTTP_SERIES_MAX = 2_000
OTHER_ROUTE = "other"
# A client may send any method: the others are counted as "other".
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED_ROUTE = "unmatched"  # a path no route matches (404, 405)


class NodeMetrics:
    def __init__(self) -> None:
        # By the task's final state (SUCCEEDED, FAILED, CANCELLED, EXPIRED).
        self.task_latency_seconds = {state: Histogram(TASK_LATENCY_SECONDS_BUCKETS) for state in sorted(TaskState.TERMINAL)}
        self.task_attempts = {state: Histogram(TASK_ATTEMPTS_BUCKETS) for state in sorted(TaskState.TERMINAL)}
        self.lease_expiries = 0
        self.takeovers = 0  # lease expiries after which the task was queued for another worker
        self.http_requests: dict[tuple[str, str, str], int] = {}

    def observe(self, effect: tuple[Any, ...]) -> None:
        """An ("observe", what, ...) effect of an applied entry (actors/context.py)."""
        what = effect[1]
        if what == "task_ended":
            _, _, _space, _mailbox, state, latency_ms, attempts = effect
            self.task_latency_seconds[state].observe(max(latency_ms, 0) / 1000)
            self.task_attempts[state].observe(attempts)
        elif what == "lease_expired":
            self.lease_expiries += 1
            self.takeovers += 1 if effect[4] else 0

    def count_request(self, method: str, route: str, status: str) -> None:
        series = (method if method in HTTP_METHODS else OTHER_ROUTE, route, status)
        if series not in self.http_requests and len(self.http_requests) >= HTTP_SERIES_MAX:
            series = (OTHER_ROUTE, OTHER_ROUTE, status)
        self.http_requests[series] = self.http_requests.get(series, 0) + 1
