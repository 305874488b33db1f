"""What a replica check costs a node, at a state of N small tasks; prints one JSON object.

    python -m bench.replicas --tasks 100000 1000000 --repeat 3

In process, no node: the state is built as a replica applies it (bench.apply's load: batches of
`task.submit_many`, each task a small JSON input, `tasks_per_run_max` per run, every task QUEUED).
Then, per run, what a node does when it applies a `replica.check` entry (node/replicas.py): a
`ForkedWrite` whose child hashes the state (`state_digest`: SHA-256 of the msgpack snapshot) and
writes the digest to a file. Measured:

- `fork_ms`: how long starting the child takes in the applying thread: the one pause of the apply
  (the node holds the log's lock through it);
- `child_s`: from the fork until the child's file is complete (polled every POLL_S), i.e. the time
  until the node can compare; the child runs at nice 10, beside the node;
- `inline_s` (once): the same digest computed in the process itself, as `GET /v1/cluster/digest`
  does, stopping the apply that long: what the fork avoids;
- `rss_mib`: the process's resident set with the state built.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.apply import ROUND_MS, Load
from runstate_server.actors import limits
from runstate_server.cluster._dumper import ForkedWrite
from runstate_server.node.replicas import state_digest

BATCH = 100  # tasks per task.submit_many while building the state (at most 100 per command)
POLL_S = 0.005  # how often the child is polled for its end
CHILD_TIMEOUT_S = 600.0  # a child that has not finished by then fails the run


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def build(load: Load, tasks: int) -> None:
    """Grow the load's state to `tasks` QUEUED tasks (submits only)."""
    while load.submitted < tasks:
        if load.in_run + load.batch > limits.tasks_per_run_max:
            load.new_run()
        load.in_run += load.batch
        load.now_ms += ROUND_MS
        (result,) = load.apply(load.batch_of(load.round()))
        assert "error" not in result, result


def one_check(load: Load, directory: Path, number: int) -> dict[str, float]:
    path = directory / f"check-{number}"
    state = load.core.state
    started = time.perf_counter()
    child = ForkedWrite(str(path), lambda: state_digest(state), fsync=False, what="bench replica check")
    fork_s = time.perf_counter() - started
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    while (done := child.poll()) is None:
        assert time.monotonic() < deadline, "the child did not finish in time"
        time.sleep(POLL_S)
    child_s = time.perf_counter() - started
    assert done, "the child failed"
    assert len(path.read_text()) == 64
    path.unlink()
    return {"fork_ms": round(fork_s * 1000, 2), "child_s": round(child_s, 3)}


def measure(tasks: int, repeat: int) -> dict[str, Any]:
    load = Load(BATCH, BATCH, BATCH)
    load.set_up()
    started = time.perf_counter()
    build(load, tasks)
    build_s = time.perf_counter() - started
    gc.collect()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-replicas-") as directory:
        for number in range(repeat):
            runs.append(one_check(load, Path(directory), number))
    started = time.perf_counter()
    digest = state_digest(load.core.state)
    inline_s = time.perf_counter() - started
    assert len(digest) == 64
    return {
        "tasks": load.submitted,
        "build_s": round(build_s, 1),
        "rss_mib": round(rss_mib()),
        "fork_ms": [run["fork_ms"] for run in runs],
        "fork_ms_median": statistics.median(run["fork_ms"] for run in runs),
        "child_s": [run["child_s"] for run in runs],
        "child_s_median": statistics.median(run["child_s"] for run in runs),
        "inline_s": round(inline_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, nargs="+", default=[100_000, 1_000_000],
                        help="state sizes to measure at, in tasks (default 100000 1000000)")
    parser.add_argument("--repeat", type=int, default=3, help="checks per size (default 3)")
    args = parser.parse_args(argv)
    sizes = []
    for tasks in args.tasks:
        sizes.append(measure(tasks, args.repeat))  # one at a time: each size's state is freed before the next
        gc.collect()
    report = {
        "benchmark": "replicas", "cpus": os.cpu_count(), "python": platform.python_version(),
        "sizes": sizes,
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
