"""A histogram of observations with fixed bucket bounds, for the node's metrics (Prometheus'
cumulative buckets, sum and count). Both layers record into one: the cluster (the journal's fsync
time, on the Raft thread) and the node (task latency and attempts, on the event loop), so it takes
a lock and imports nothing of either."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HistogramView:
    bounds: tuple[float, ...]  # upper bounds of the buckets, ascending; +Inf is implied
    cumulative: tuple[int, ...]  # observations <= each bound, then the total (the +Inf bucket)
    total: float  # the sum of the observations

    @property
    def count(self) -> int:
        return self.cumulative[-1]


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        assert bounds and list(bounds) == sorted(set(bounds)), "bucket bounds ascend, each once"
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative); the last: above every bound
        self._total = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self._bounds, value)  # the first bound >= value: Prometheus' `le`
        with self._lock:
            self._counts[index] += 1
            self._total += value

    def view(self) -> HistogramView:
        with self._lock:
            counts, total = list(self._counts), self._total
        cumulative, running = [], 0
        for count in counts:
            running += count
            cumulative.append(running)
        return HistogramView(self._bounds, tuple(cumulative), total)
