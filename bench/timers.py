"""How late durable timers fire on an idle dev node; prints one JSON object.

    python -m bench.timers --timers 50

Starts its own `runstate dev` node (or uses --url), arms N timers spread over the next few
seconds, waits for all of them, and reports, per timer, how long after its due time the server
fired it (`firedAt - fireAt`, both stamped by the server), how many of them fired within 100 ms
of it (`fired_within_100ms`, out of `timers`), and how long after its due time the waiting client
got it back (wall clock here, so it includes the HTTP round trip).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runstate import AsyncRunstate

from bench.throughput import percentile, start_node, wait_healthy

SPREAD_S = 3.0
WAIT_TIMEOUT_MS = 120_000
ON_TIME_MS = 100


def summary(values_ms: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values_ms), 2),
        "p99": round(percentile(values_ms, 0.99), 2),
        "max": round(max(values_ms), 2),
    }


async def measure(url: str, count: int) -> dict[str, Any]:
    async with AsyncRunstate(base_url=url, holder="bench-timers") as rs:
        run = await rs.scopes.create(name="bench-timers")
        timers = [await run.timers.create(after_seconds=1.0 + SPREAD_S * n / count) for n in range(count)]
        server_ms: list[float] = []
        client_ms: list[float] = []

        async def wait(timer: Any) -> None:
            fired = await timer.wait(timeout_ms=WAIT_TIMEOUT_MS)
            received = datetime.now(timezone.utc)
            server_ms.append((fired["fired_at"] - timer.fire_at).total_seconds() * 1000)
            client_ms.append((received - timer.fire_at).total_seconds() * 1000)

        await asyncio.gather(*(wait(timer) for timer in timers))
        await run.cancel()
    return {
        "fired_late_ms": summary(server_ms),
        "received_late_ms": summary(client_ms),
        # The target on an idle node: every timer fired within 100 ms of its due time.
        "fired_within_100ms": sum(late_ms <= ON_TIME_MS for late_ms in server_ms),
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    node = None
    with tempfile.TemporaryDirectory(prefix="runstate-bench-") as scratch:
        url = args.url
        if url is None:
            node, url = start_node("always", Path(scratch) / "data")
        try:
            await wait_healthy(url, node)
            started = time.perf_counter()
            result = await measure(url, args.timers)
        finally:
            if node is not None:
                node.terminate()
                node.wait()
    return {"benchmark": "timer_lateness", "timers": args.timers, "elapsed_s": round(time.perf_counter() - started, 2), **result}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.timers", description=__doc__.split("\n")[0])
    parser.add_argument("--timers", type=int, default=50, help="timers to arm (default 50)")
    parser.add_argument("--url", help="use a running node instead of starting one")
    print(json.dumps(asyncio.run(bench(parser.parse_args(argv)))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
