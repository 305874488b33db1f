"""Fan-out latency of `runstate.once`: from the runner's return to the last of N waiting callers
getting the result; prints one JSON object.

    python -m bench.once --rounds 5 --callers 100 --processes 4

Starts a dev node on a free port (in memory) unless `--base-url` is given, and opens one run.
Each round uses a fresh key. The benchmark process calls the once function first and so runs it;
inside it, it releases the callers (spread over `--processes` processes, async, all at once),
waits until every one of them has called and `--settle-s` more (so they are all waiting), notes
the time and returns. Each caller notes when its call returned. Times are CLOCK_MONOTONIC
(`time.perf_counter`), which all processes of one machine share. The async callers of one
process (one event loop) waiting for the same key share one acquire and one long poll, sent from
their own loop (the SDK does that), so the fan-out crosses the server once per process. Each
process runs every round on one event loop, as a long-lived agent process would;
`--loop-per-round` runs each round in a fresh loop (`asyncio.run` per round), whose connections
then open before it and close right after it, while slower processes are still waiting.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import sys
import time
import uuid
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import runstate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests._nodes import DevNode  # noqa: E402 - the repository's node harness

CALL_TIMEOUT_S = 120.0

# Set in the benchmark process only: how its runner releases and waits for the callers.
_runner_hook: Any = None


@runstate.once(name="bench-once")
async def research(round_key: str) -> dict[str, Any]:
    assert _runner_hook is not None, "only the benchmark process runs the function"
    await _runner_hook()
    return {"round": round_key, "report": "x" * 200, "returned_at": time.perf_counter()}


def caller_process(connection: Connection, base_url: str, scope_id: str, callers: int, loop_per_round: bool) -> None:
    """A process of callers: per round, call `research(key)` `callers` times at once; send back
    when each call returned (the latest) and the results seen."""
    runstate.configure(base_url=base_url, scope_id=scope_id, holder=f"bench-caller-{os.getpid()}")

    async def one(round_key: str) -> tuple[float, float]:
        result = await research(round_key)
        return time.perf_counter(), result["returned_at"]

    async def every(round_key: str) -> list[tuple[float, float]]:
        connection.send(("calling", None))
        calls = asyncio.gather(*(one(round_key) for _ in range(callers)))
        return list(await asyncio.wait_for(calls, CALL_TIMEOUT_S))

    async def rounds() -> None:
        loop = asyncio.get_running_loop()
        while (round_key := await loop.run_in_executor(None, connection.recv)) is not None:
            connection.send(("done", await every(round_key)))

    try:
        if loop_per_round:
            while (round_key := connection.recv()) is not None:
                connection.send(("done", asyncio.run(every(round_key))))
        else:
            asyncio.run(rounds())
    finally:
        runstate.close()
        connection.close()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def bench(args: argparse.Namespace) -> dict[str, Any]:
    node = None
    if args.base_url is None:
        node = DevNode(None).start()
    base_url = args.base_url or node.url  # type: ignore[union-attr]
    try:
        with runstate.Runstate(base_url=base_url) as client:
            run_id = client.scopes.create(name="bench-once").id
        runstate.configure(base_url=base_url, scope_id=run_id, holder="bench-runner")
        spread = [args.callers // args.processes + (1 if index < args.callers % args.processes else 0)
                  for index in range(args.processes)]
        context = multiprocessing.get_context("spawn")
        pipes: list[Connection] = []
        processes = []
        for count in spread:
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=caller_process, args=(child_end, base_url, run_id, count, args.loop_per_round), daemon=True
            )
            process.start()
            child_end.close()
            pipes.append(parent_end)
            processes.append(process)
        last_ms: list[float] = []
        every_ms: list[float] = []

        async def one_round() -> None:
            global _runner_hook
            round_key = uuid.uuid4().hex

            async def release_callers() -> None:
                for pipe in pipes:
                    pipe.send(round_key)
                for pipe in pipes:
                    assert pipe.recv()[0] == "calling"
                await asyncio.sleep(args.settle_s)  # every caller's acquire answered HELD: waiting

            _runner_hook = release_callers
            returned_at = (await research(round_key))["returned_at"]
            loop = asyncio.get_running_loop()
            finished = [item for pipe in pipes for item in (await loop.run_in_executor(None, pipe.recv))[1]]
            assert all(seen == returned_at for _, seen in finished), "a caller got another result"
            latencies = [(done_at - returned_at) * 1000 for done_at, _ in finished]
            last_ms.append(max(latencies))
            every_ms.extend(latencies)

        async def rounds() -> None:
            for _ in range(args.rounds):
                await one_round()

        try:
            if args.loop_per_round:
                for _ in range(args.rounds):
                    asyncio.run(one_round())
            else:
                asyncio.run(rounds())
        finally:
            for pipe in pipes:
                pipe.send(None)
            for process in processes:
                process.join(10)
                if process.is_alive():
                    process.kill()
        return {
            "bench": "once_fanout",
            "callers": args.callers,
            "processes": args.processes,
            "rounds": args.rounds,
            "loop_per_round": args.loop_per_round,
            "last_caller_ms": {
                "median": round(statistics.median(last_ms), 2),
                "p99": round(percentile(last_ms, 0.99), 2),
                "max": round(max(last_ms), 2),
            },
            "every_caller_ms": {
                "p50": round(percentile(every_ms, 0.5), 2),
                "p99": round(percentile(every_ms, 0.99), 2),
            },
            "rounds_ms": [round(value, 2) for value in last_ms],
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "server": "dev node (started by the bench)" if node is not None else base_url,
        }
    finally:
        runstate.close()
        if node is not None:
            node.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.once", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callers", type=int, default=100)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--settle-s", type=float, default=0.5, help="wait after every caller called")
    parser.add_argument("--base-url", default=None, help="a running server (default: start a dev node)")
    parser.add_argument(
        "--loop-per-round", action="store_true",
        help="every process runs each round in a fresh event loop (asyncio.run per round), so its "
        "connections open and close every round; default: one loop per process for all rounds",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.callers < 1 or not 1 <= args.processes <= args.callers:
        parser.error("need rounds >= 1, callers >= 1 and 1 <= processes <= callers")
    print(json.dumps(bench(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
