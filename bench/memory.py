"""The memory one small task costs in a dev node; prints one JSON object.

    python -m bench.memory --tasks 100000 --fsync always

Starts its own `runstate dev` node on a free 127.0.0.1 port with a fresh data dir, opens a run,
and warms the node up with 10,000 tasks submitted and completed (so the baseline already holds
what any busy node holds: the HTTP machinery, a snapshot, the bounded event log and idempotency
table). It then submits N tasks through the HTTP API in batch calls (`submit_many`, 100 per call,
8 producers), each with an input of 100 bytes of canonical JSON and no key of its own (the node
gives it one), and reads the node's
resident set size (VmRSS, /proc): the growth over the baseline divided by N is what one QUEUED task
costs. Then it receives them (100 per call) and completes each with a result of 100 bytes, and
reads the RSS again: what one SUCCEEDED task costs (its run still open, so the node keeps it).
From these it extrapolates how many such tasks a node holds in 24 GB of memory, and gives beside
them what the node's own accounting (runstate_server/actors/storage.py, state.task_bytes) charges
one such task, QUEUED and SUCCEEDED, and the ratio of each growth to its charge (`rss_per_charge`):
near 1 the node's bound on what it holds (`node_bytes_max`) bounds its memory; above 1, the
process grows past it by that factor (a drift to measure again for, state.TASK_OVERHEAD_BYTES).

With --profile the node runs under tracemalloc (slower, and its RSS then includes tracemalloc's own
bookkeeping: read the RSS figures of such a run as rough) and the report adds the allocation
sites (file:line) that grew most from the baseline to the end, in bytes per task.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runstate import AsyncRunstate

from bench.throughput import start_node as throughput_node
from bench.throughput import stop_node, wait_healthy

NODE_EXIT_TIMEOUT_S = 30.0
SETTLE_S = 2.0  # default wait after a phase, before the RSS is read: the node ends what it was doing
PROFILE_TIMEOUT_S = 600.0
NODE_MEMORY_BYTES = 24 * 10**9  # "24 GB", as a machine's memory is sold
PAYLOAD_BYTES = 100
SUBMIT_BATCH = 100
RECEIVE_BATCH = 100
PRODUCERS = 8
RECEIVERS = 4  # each completes its batch of up to 100 deliveries concurrently
RECEIVE_WAIT_MS = 1_000
IDLE_RECEIVES_MAX = 30  # empty receives in a row (of RECEIVE_WAIT_MS each) before the benchmark gives up
# A delivery's lease: the SDK's default. A completed task's lease entry stays in the node's due-time
# heap until the lease would have ended, so the tasks completed in the last LEASE_MS carry it too.
LEASE_MS = 30_000
# Enough to fill what the node bounds by count, not by tasks (a space's event log and its remembered
# idempotency results), so that the growth measured after the baseline is the tasks' own.
WARMUP_TASKS = 10_000
TOP_SITES = 15

# Run in the node's process under --profile: the node, with SIGUSR1 dumping a tracemalloc snapshot
# to the path in RUNSTATE_BENCH_TRACE (written beside it, then renamed, so a reader never sees half).
_PROFILED_NODE = """
import os, signal, sys, tracemalloc
tracemalloc.start(1)
def dump(signum, frame):
    path = os.environ["RUNSTATE_BENCH_TRACE"]
    tracemalloc.take_snapshot().dump(path + ".part")
    os.replace(path + ".part", path)
signal.signal(signal.SIGUSR1, dump)
from runstate_server.node.cli import main
sys.exit(main(sys.argv[1:]))
"""


def padded(field: str, n: int) -> dict[str, Any]:
    """A JSON object whose canonical encoding is exactly PAYLOAD_BYTES bytes: {field: n, "pad": "x..."}."""
    bare = len(json.dumps({field: n, "pad": ""}, separators=(",", ":")))
    return {field: n, "pad": "x" * max(0, PAYLOAD_BYTES - bare)}


def memory_kib(pid: int) -> dict[str, int]:
    """The process's VmRSS, VmHWM (peak RSS) and RssFile (the part of VmRSS that maps files: the
    journal, which pysyncobj maps, and the code), in KiB."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM", "RssFile"):
            found[name] = int(value.split()[0])
    return found


def start_node(fsync: str, data_dir: Path, profile: Path | None) -> tuple[subprocess.Popen[bytes], str]:
    if profile is None:
        return throughput_node(fsync, data_dir)
    return throughput_node(
        fsync, data_dir, python_args=("-c", _PROFILED_NODE), env={**os.environ, "RUNSTATE_BENCH_TRACE": str(profile)},
    )


async def submit(url: str, run_id: str, first: int, count: int) -> tuple[int, int]:
    """Submit tasks first .. first+count-1 in batch calls from PRODUCERS producers; how many were
    accepted, and the longest key the node gave one."""
    accepted = key_chars = 0
    async with AsyncRunstate(base_url=url, holder="bench-producer") as rs:
        queue = rs.scope(run_id).mailbox("bench")
        chunks = iter(range(first, first + count, SUBMIT_BATCH))

        async def producer() -> None:
            nonlocal accepted, key_chars
            for start in chunks:
                inputs = [padded("n", i) for i in range(start, min(start + SUBMIT_BATCH, first + count))]
                tickets = await queue.submit_many(inputs)
                accepted += len(tickets)  # after the await: `accepted += len(await ...)` would lose updates
                key_chars = max([key_chars, *(len(ticket.key or "") for ticket in tickets)])

        await asyncio.gather(*(producer() for _ in range(PRODUCERS)))
    return accepted, key_chars


async def complete(url: str, run_id: str, count: int) -> dict[str, int]:
    """Receive and complete `count` tasks, each with a result of PAYLOAD_BYTES; the states the
    completions answered."""
    states: dict[str, int] = {}
    left = count
    async with AsyncRunstate(base_url=url, holder="bench-worker") as rs:
        queue = rs.scope(run_id).mailbox("bench")

        async def finish(delivery: Any) -> None:
            answer = await delivery.complete(result={"payload": padded("m", len(states))})
            states[answer["state"]] = states.get(answer["state"], 0) + 1

        async def receiver() -> None:
            nonlocal left
            idle = 0
            while left > 0:
                deliveries = await queue.receive(max=min(RECEIVE_BATCH, left), lease_ms=LEASE_MS, wait_ms=RECEIVE_WAIT_MS)
                left -= len(deliveries)
                idle = 0 if deliveries else idle + 1
                if idle > IDLE_RECEIVES_MAX:
                    raise RuntimeError(f"{left} tasks were never delivered")
                await asyncio.gather(*(finish(delivery) for delivery in deliveries))

        await asyncio.gather(*(receiver() for _ in range(RECEIVERS)))
    return states


async def read_memory(pid: int, settle_s: float) -> dict[str, int]:
    await asyncio.sleep(settle_s)
    return memory_kib(pid)


async def trace(node: subprocess.Popen[bytes], path: Path) -> Any:
    """Ask the profiled node for a tracemalloc snapshot and load it."""
    import tracemalloc

    path.unlink(missing_ok=True)
    node.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + PROFILE_TIMEOUT_S
    while not path.exists():
        if time.monotonic() > deadline or node.poll() is not None:
            raise RuntimeError("the profiled node wrote no tracemalloc snapshot")
        await asyncio.sleep(0.2)
    return tracemalloc.Snapshot.load(str(path))


def top_sites(before: Any, after: Any, tasks: int) -> list[dict[str, Any]]:
    root = str(Path(sys.prefix).parent) + os.sep
    rows = []
    for stat in after.compare_to(before, "lineno")[:TOP_SITES]:
        frame = stat.traceback[0]
        where = frame.filename.replace(root, "").replace(str(Path(__file__).parent.parent) + os.sep, "")
        rows.append({
            "site": f"{where}:{frame.lineno}",
            "bytes_per_task": round(stat.size_diff / tasks, 1),
            "blocks_per_task": round(stat.count_diff / tasks, 2),
        })
    return rows


def per_task(grown_kib: int, tasks: int) -> int:
    return round(grown_kib * 1024 / tasks)


def charged(key_chars: int) -> dict[str, int]:
    """What the node's accounting charges one of the benchmark's tasks, QUEUED and SUCCEEDED:
    state.task_bytes of such a task, its payloads encoded as the node keeps them."""
    from runstate_server.actors.state import TaskState, json_bytes, new_task, task_bytes

    task = new_task(
        id="tsk_" + "0" * 20, space="default", run_id="run_" + "0" * 20, mailbox="bench", key="k" * key_chars,
        input=json_bytes(padded("n", 0)), input_hash="k" * key_chars, attempts=3, created_ms=0,
    )
    queued = task_bytes(task)
    task.delivery_count, task.state = 1, TaskState.SUCCEEDED
    task.outcome = json_bytes({"payload": padded("m", 0)})  # as complete() sends it
    return {"queued": queued, "completed": task_bytes(task)}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from runstate_server.actors import limits

    # The tasks go to as many runs as a run's bound needs; the warm-up to a run of its own, left
    # out where it would pass the space's task bound.
    warmup = min(args.warmup, max(0, limits.tasks_per_space_max - args.tasks))
    shares = [min(limits.tasks_per_run_max, args.tasks - start) for start in range(0, args.tasks, limits.tasks_per_run_max)]
    with tempfile.TemporaryDirectory(prefix="runstate-bench-") as scratch:
        trace_path = Path(scratch) / "trace" if args.profile else None
        node, url = start_node(args.fsync, Path(scratch) / "data", trace_path)
        profile: dict[str, Any] = {}
        try:
            await wait_healthy(url, node)
            async with AsyncRunstate(base_url=url) as rs:
                warmup_run = (await rs.scopes.create(name="bench-warmup")).id
                runs = [(await rs.scopes.create(name=f"bench-{index}")).id for index in range(len(shares))]
            if warmup:
                await submit(url, warmup_run, -warmup, warmup)
                await complete(url, warmup_run, warmup)
            base = await read_memory(node.pid, args.settle_s)
            before = await trace(node, trace_path) if trace_path else None
            started = time.perf_counter()
            accepted: list[int] = []
            key_chars = 0
            for run_id, share in zip(runs, shares, strict=True):
                count, chars = await submit(url, run_id, sum(accepted), share)
                accepted.append(count)
                key_chars = max(key_chars, chars)
            submit_s = time.perf_counter() - started
            queued = await read_memory(node.pid, args.settle_s)
            started = time.perf_counter()
            states: dict[str, int] = {}
            for run_id, share in zip(runs, accepted, strict=True):
                for state, count in (await complete(url, run_id, share)).items():
                    states[state] = states.get(state, 0) + count
            complete_s = time.perf_counter() - started
            done = await read_memory(node.pid, args.settle_s)
            if trace_path:
                profile["top_sites"] = top_sites(before, await trace(node, trace_path), max(sum(accepted), 1))
        finally:
            stop_node(node, NODE_EXIT_TIMEOUT_S)
    accepted_total = sum(accepted)
    queued_per_task = per_task(queued["VmRSS"] - base["VmRSS"], accepted_total)
    done_per_task = per_task(done["VmRSS"] - base["VmRSS"], accepted_total)
    charge = charged(key_chars)
    return {
        "benchmark": "memory_per_task",
        "nodes": 1,
        "tasks": args.tasks,
        "submitted": accepted_total,
        "warmup_tasks": warmup,
        "runs": len(runs),
        "fsync": args.fsync,
        "profile": args.profile,
        "input_bytes": PAYLOAD_BYTES,
        "result_bytes": PAYLOAD_BYTES,
        "submit_s": round(submit_s, 1),
        "complete_s": round(complete_s, 1),
        "states": states,
        "rss_mib": {
            "baseline": round(base["VmRSS"] / 1024, 1),
            "queued": round(queued["VmRSS"] / 1024, 1),
            "completed": round(done["VmRSS"] / 1024, 1),
            "peak": round(done["VmHWM"] / 1024, 1),
        },
        # The part of the RSS that maps files (in rss_mib): mostly the journal.
        "file_backed_mib": {
            name: round(reading.get("RssFile", 0) / 1024, 1)
            for name, reading in (("baseline", base), ("queued", queued), ("completed", done))
        },
        "bytes_per_task": {"queued": queued_per_task, "completed": done_per_task},
        "peak_bytes_per_task": per_task(done["VmHWM"] - base["VmRSS"], accepted_total),
        "charged_bytes_per_task": charge,
        # RSS growth per task over its charge: how far past node_bytes_max the process grows.
        "rss_per_charge": {
            "queued": round(queued_per_task / charge["queued"], 2),
            "completed": round(done_per_task / charge["completed"], 2),
            "peak": round(per_task(done["VmHWM"] - base["VmRSS"], accepted_total) / charge["completed"], 2),
        },
        "tasks_in_24gb": {
            "queued": NODE_MEMORY_BYTES // max(queued_per_task, 1),
            "completed": NODE_MEMORY_BYTES // max(done_per_task, 1),
        },
        "limits": {
            "tasks_per_run_max": limits.tasks_per_run_max,
            "tasks_per_space_max": limits.tasks_per_space_max,
            "node_bytes_max": limits.node_bytes_max,
            "tasks_charged_into_node_bytes_max": limits.node_bytes_max // charge["completed"],
        },
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        **profile,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks to submit and complete (default 100000)")
    parser.add_argument("--fsync", choices=("always", "never"), default="always")
    parser.add_argument(
        "--profile", action="store_true",
        help="run the node under tracemalloc and report the allocation sites that grew most, per task (slower)",
    )
    parser.add_argument(
        "--warmup", type=int, default=WARMUP_TASKS,
        help=f"tasks submitted and completed before the baseline, in a run of their own (default {WARMUP_TASKS}; "
        "fewer where the space's task bound leaves no room)",
    )
    parser.add_argument(
        "--settle-s", type=float, default=SETTLE_S,
        help=f"seconds to wait after each phase before reading the RSS (default {SETTLE_S})",
    )
    args = parser.parse_args(argv)
    if args.tasks < 1:
        parser.error("--tasks must be at least 1")
    print(json.dumps(asyncio.run(bench(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
