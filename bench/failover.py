"""Failover time of a three-node cluster: kill -9 the leader, time the first write that succeeds
through the SDK given all three URLs; prints one JSON object.

    python -m bench.failover --runs 5

Starts one three-node cluster on free 127.0.0.1 ports (fresh data dirs in a temporary directory).
Each run: wait until all three nodes are up under one leader and hold the same state, make one
write (so the client is connected), kill -9 the leader, and time from the kill until a write
succeeds (a keyed submit, which the SDK retries on the next node by itself; `--write scope`
creates a run instead, which the SDK does not repeat, so the benchmark repeats it). Then the killed
node is restarted on its data for the next run. The time includes the SDK's own retry backoff:
it is what a client sees.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runstate import AsyncRunstate
from runstate.sdk.errors import UnavailableError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests._cluster import Cluster  # noqa: E402 - the repository's cluster harness

WRITE_GIVE_UP_S = 60.0


async def write(rs: AsyncRunstate, kind: str, run_id: str, n: int) -> None:
    if kind == "scope":
        await rs.scopes.create(name=f"failover-{n}")
    else:
        await rs.scope(run_id).mailbox("failover").submit({"n": n}, key=f"failover-{n}")


async def one_run(cluster: Cluster, kind: str, run_id: str, n: int) -> dict[str, Any]:
    leader = cluster.leader_index()
    async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.base_url, holder="bench-failover") as rs:
        await write(rs, kind, run_id, -n - 1)  # connected, and the cluster is writable
        attempts = 0
        killed_at = time.perf_counter()
        cluster.kill(leader)
        while True:
            attempts += 1
            try:
                await write(rs, kind, run_id, n)
                break
            except UnavailableError:
                if time.perf_counter() - killed_at > WRITE_GIVE_UP_S:
                    raise
                await asyncio.sleep(0.01)
        elapsed_s = time.perf_counter() - killed_at
    new_leader = cluster.leader_index()
    return {"seconds": round(elapsed_s, 3), "killed": cluster.ids[leader], "new_leader": cluster.ids[new_leader],
            "write_attempts": attempts}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
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
                runs.append(await one_run(cluster, args.write, run_id, n))
                cluster.start(*[index for index in range(cluster.size) if not cluster.running(index)])
        except BaseException:
            print(cluster.logs(), file=sys.stderr)
            raise
        finally:
            cluster.stop()
    seconds = [run["seconds"] for run in runs]
    return {
        "benchmark": "failover",
        "write": args.write,
        "fsync": args.fsync,
        "runs": runs,
        "median_s": round(statistics.median(seconds), 3),
        "max_s": max(seconds),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="leader kills (default 5)")
    parser.add_argument("--write", choices=("submit", "scope"), default="submit",
                        help="the write to time: a keyed submit (default) or creating a run")
    parser.add_argument("--fsync", choices=("always", "never"), default="always")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    print(json.dumps(asyncio.run(bench(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
