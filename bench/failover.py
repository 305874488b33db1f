"""Failover time of a three-node cluster: kill -9 the leader, time the first write that succeeds
through the SDK given all three URLs; or, with `--transfer`, hand leadership over under a steady
write load and time the writes' longest stall. Prints one JSON object.

    python -m bench.failover --runs 5
    python -m bench.failover --runs 5 --transfer

Starts one three-node cluster on free 127.0.0.1 ports (fresh data dirs in a temporary directory).
Each run: wait until all three nodes are up under one leader and hold the same state, make one
write (so the client is connected), kill -9 the leader, and time from the kill until a write
succeeds (a keyed submit, which the SDK retries on the next node by itself; `--write scope`
creates a run instead, which the SDK does not repeat, so the benchmark repeats it). Then the killed
node is restarted on its data for the next run. The time includes the SDK's own retry backoff:
it is what a client sees.

With `--transfer`, each run instead starts `--writers` writers on one SDK client, each writing one
write after the other with WRITE_PAUSE_S between (each write timed the same way: from its first
call until it succeeds, the SDK's retries and the benchmark's repeats included), lets them run
LOAD_BEFORE_S, asks the leader for `POST /v1/cluster/transfer-leader` (to the most caught-up
voter), and stops them LOAD_AFTER_S after the answer. Per run: how long that call took (`transfer_s`), the longest time no write was
acknowledged (`stall_s`: the longest gap between two acknowledged writes of the run), the longest
single write (`longest_write_s`) and the median one (`write_median_s`, the load's pace).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runstate import AsyncRunstate
from runstate.sdk.errors import UnavailableError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests._cluster import Cluster  # noqa: E402 - the repository's cluster harness

WRITE_GIVE_UP_S = 60.0
WRITE_REPEAT_PAUSE_S = 0.01  # after an UnavailableError, before the benchmark sends the write again
# --transfer: the load runs this long before the transfer is asked for, and this long after its answer.
LOAD_BEFORE_S = 1.0
LOAD_AFTER_S = 1.0
WRITE_PAUSE_S = 0.005  # between two writes of one writer: a steady load, not a flood
WRITERS_MAX = 64


async def write(rs: AsyncRunstate, kind: str, run_id: str, n: int) -> None:
    if kind == "scope":
        await rs.scopes.create(name=f"failover-{n}")
    else:
        await rs.scope(run_id).mailbox("failover").submit({"n": n}, key=f"failover-{n}")


async def write_until_acknowledged(rs: AsyncRunstate, kind: str, run_id: str, n: int) -> int:
    """Send write `n` until it succeeds (again after each UnavailableError, for up to
    WRITE_GIVE_UP_S); how many times it was sent."""
    began = time.perf_counter()
    attempts = 0
    while True:
        attempts += 1
        try:
            await write(rs, kind, run_id, n)
            return attempts
        except UnavailableError:
            if time.perf_counter() - began > WRITE_GIVE_UP_S:
                raise
            await asyncio.sleep(WRITE_REPEAT_PAUSE_S)


async def one_run(cluster: Cluster, kind: str, run_id: str, n: int) -> dict[str, Any]:
    leader = cluster.leader_index()
    async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.base_url, holder="bench-failover") as rs:
        await write(rs, kind, run_id, -n - 1)  # connected, and the cluster is writable
        killed_at = time.perf_counter()
        cluster.kill(leader)
        attempts = await write_until_acknowledged(rs, kind, run_id, n)
        elapsed_s = time.perf_counter() - killed_at
    new_leader = cluster.leader_index()
    return {"seconds": round(elapsed_s, 3), "killed": cluster.ids[leader], "new_leader": cluster.ids[new_leader],
            "write_attempts": attempts}


async def one_transfer(cluster: Cluster, kind: str, run_id: str, numbers: Iterator[int], writers: int) -> dict[str, Any]:
    leader = cluster.leader_index()
    acknowledged_at: list[float] = []
    latencies_s: list[float] = []
    repeats = 0
    stopping = asyncio.Event()

    async def writer(rs: AsyncRunstate) -> None:
        nonlocal repeats
        while not stopping.is_set():
            called_at = time.perf_counter()
            attempts = await write_until_acknowledged(rs, kind, run_id, next(numbers))
            acknowledged_at.append(time.perf_counter())
            latencies_s.append(acknowledged_at[-1] - called_at)
            repeats += attempts - 1
            await asyncio.sleep(WRITE_PAUSE_S)

    async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.base_url, holder="bench-failover") as rs:
        await write(rs, kind, run_id, next(numbers))  # connected, and the cluster is writable
        load = [asyncio.create_task(writer(rs)) for _ in range(writers)]
        await asyncio.sleep(LOAD_BEFORE_S)
        asked_at = time.perf_counter()
        # A blocking client in a thread: the load's event loop goes on meanwhile.
        status, answer = await asyncio.to_thread(cluster.api(leader), "POST", "/v1/cluster/transfer-leader", {})
        transfer_s = time.perf_counter() - asked_at
        await asyncio.sleep(LOAD_AFTER_S)
        stopping.set()
        await asyncio.gather(*load)
    gaps_s = [later - earlier for earlier, later in itertools.pairwise(sorted(acknowledged_at))]
    return {
        "transfer_s": round(transfer_s, 3),
        "stall_s": round(max(gaps_s), 3),
        "longest_write_s": round(max(latencies_s), 3),
        "write_median_s": round(statistics.median(latencies_s), 4),
        "writes": len(latencies_s),
        "write_repeats": repeats,
        "status": status,
        "previous_leader": cluster.ids[leader],
        "new_leader": cluster.ids[cluster.leader_index()],
        "transferred": answer.get("transferred") if status == 200 else None,
    }


def spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "max": max(values)}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    numbers = itertools.count()  # every write of --transfer's load has a key of its own
    with tempfile.TemporaryDirectory(prefix="runstate-failover-") as scratch:
        cluster = Cluster(Path(scratch), "--fsync", args.fsync)
        runs: list[dict[str, Any]] = []
        try:
            cluster.start()
            async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.base_url) as rs:
                await rs.mailboxes.ensure("failover")
                run_id = (await rs.scopes.create(name="failover")).id
            for n in range(args.runs):
                cluster.wait_same_digest()
                if args.transfer:
                    runs.append(await one_transfer(cluster, args.write, run_id, numbers, args.writers))
                else:
                    runs.append(await one_run(cluster, args.write, run_id, n))
                    cluster.start(*[index for index in range(cluster.size) if not cluster.running(index)])
        except BaseException:
            print(cluster.logs(), file=sys.stderr)
            raise
        finally:
            cluster.stop()
    machine = {"cpus": os.cpu_count(), "python": platform.python_version()}
    if args.transfer:
        return {
            "benchmark": "failover", "mode": "transfer", "write": args.write, "fsync": args.fsync,
            "writers": args.writers, "runs": runs,
            **{name: spread([run[name] for run in runs]) for name in ("transfer_s", "stall_s", "longest_write_s")},
            **machine,
        }
    seconds = [run["seconds"] for run in runs]
    return {
        "benchmark": "failover",
        "mode": "kill",
        "write": args.write,
        "fsync": args.fsync,
        "runs": runs,
        "median_s": round(statistics.median(seconds), 3),
        "max_s": max(seconds),
        **machine,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="leader kills or transfers (default 5)")
    parser.add_argument("--write", choices=("submit", "scope"), default="submit",
                        help="the write to time: a keyed submit (default) or creating a run")
    parser.add_argument("--fsync", choices=("always", "never"), default="always")
    parser.add_argument("--transfer", action="store_true",
                        help="hand leadership over (POST /v1/cluster/transfer-leader) under a steady write load "
                             "instead of killing the leader")
    parser.add_argument("--writers", type=int, default=4,
                        help=f"--transfer: clients writing one after the other meanwhile (default 4, at most {WRITERS_MAX})")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not 1 <= args.writers <= WRITERS_MAX:
        parser.error(f"--writers must be 1 to {WRITERS_MAX}")
    print(json.dumps(asyncio.run(bench(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
