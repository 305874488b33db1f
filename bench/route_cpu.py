"""The node's CPU per request of each hot route, under a fixed load; prints one JSON object.

    python -m bench.route_cpu --code /path/to/checkout   # the node runs that checkout's code

Starts a `runstate dev --auth` node (fsync always) on a free port, then drives, one phase after
the other and `--concurrency` calls at a time over keep-alive connections: POST /tasks/batch
(`--batch` tasks each), POST /tasks, POST /mailboxes/{id}/recv (`--receive` each), POST
/messages/complete (`--batch` items each) and POST /tasks/results (`--batch` ids each, all
terminal). Each phase's figure is the node's utime + stime (/proc) over the phase, in µs per
request and per task, and its event loop's (the main thread's) per request. The client is a raw aiohttp session in this process (not the SDK: its CPU is
not the node's anyway, but a lighter client leaves the shared cores to the node).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from bench.throughput import cpu_s

HEALTH_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str, key: str, space: str) -> None:
        self.session, self.url, self.key, self.space = session, url, key, space

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.key}"}
        if method != "GET":
            headers["Idempotency-Key"] = secrets.token_hex(16)  # as the SDK sends on every write
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(body, separators=(",", ":")).encode()
        async with self.session.request(method, self.url + path, data=data, headers=headers) as response:
            text = await response.text()
            return response.status, (json.loads(text) if text else None)

    async def space_call(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = await self.call(method, f"/v1/spaces/{self.space}{path}", body)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {answer}")
        return answer


async def phase(
    pid: int, concurrency: int, calls: Sequence[Callable[[], Awaitable[Any]]], tasks: int
) -> dict[str, float]:
    work = iter(calls)

    async def runner() -> None:
        for call in work:
            await call()

    before, loop_before = cpu_s(pid), loop_cpu_s(pid)
    await asyncio.gather(*(runner() for _ in range(concurrency)))
    used_s = (cpu_s(pid) or 0.0) - (before or 0.0)
    loop_used_s = loop_cpu_s(pid) - loop_before
    return {
        "us_per_request": round(used_s / len(calls) * 1e6, 1), "us_per_task": round(used_s / tasks * 1e6, 1),
        "loop_us_per_request": round(loop_used_s / len(calls) * 1e6, 1),
    }


def loop_cpu_s(pid: int) -> float:
    """CPU seconds of the node's main thread, its event loop's (the Raft tick thread is another)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(url: str, key: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        _, identity = await Client(session, url, key, "").call("GET", "/v1/whoami")
        client = Client(session, url, key, identity["space"])
        mailbox = (await client.space_call("PUT", "/mailboxes/by-name/bench", {}))["id"]
        run = (await client.space_call("POST", "/scopes", {"name": "bench"}))["id"]
        size, results = args.batch, {}
        batches, singles = args.batches, args.singles
        ids: list[str] = []

        async def submit_batch(start: int) -> None:
            tasks = [
                {"scopeId": run, "mailboxId": mailbox, "taskKey": f"b{start + i}", "input": {"n": start + i}}
                for i in range(size)
            ]
            answer = await client.space_call("POST", "/tasks/batch", {"tasks": tasks})
            ids.extend(one["taskId"] for one in answer["tasks"])

        async def submit(n: int) -> None:
            body = {"scopeId": run, "mailboxId": mailbox, "taskKey": f"s{n}", "input": {"n": n}}
            ids.append((await client.space_call("POST", "/tasks", body))["taskId"])

        results["batch"] = await phase(
            pid, args.concurrency, [partial(submit_batch, s) for s in range(0, batches * size, size)], batches * size
        )
        results["submit"] = await phase(pid, args.concurrency, [partial(submit, n) for n in range(singles)], singles)

        deliveries: list[dict[str, str]] = []
        receives = -(-len(ids) // args.receive)

        async def receive() -> None:
            body = {"scopeId": run, "holder": "bench", "max": args.receive, "waitMs": 0}
            answer = await client.space_call("POST", f"/mailboxes/{mailbox}/recv", body)
            for given in (answer or {}).get("messages", []):
                deliveries.append({"id": given["message"]["id"], "token": given["token"]})

        results["recv"] = await phase(pid, args.concurrency, [receive for _ in range(receives)], len(ids))
        assert len(deliveries) == len(ids), (len(deliveries), len(ids))

        async def complete(start: int) -> None:
            items = [{**one, "result": {"payload": {"ok": True}}} for one in deliveries[start : start + size]]
            answer = await client.space_call("POST", "/messages/complete", {"items": items})
            assert all("error" not in item for item in answer["items"]), answer

        completes = range(0, len(deliveries), size)
        results["complete"] = await phase(pid, args.concurrency, [partial(complete, s) for s in completes], len(ids))

        async def wait_results(start: int) -> None:
            answer = await client.space_call("POST", "/tasks/results", {"ids": ids[start : start + size], "waitMs": 0})
            assert all(one.get("done") for one in answer["results"]), answer

        lookups = [partial(wait_results, s) for s in range(0, len(ids), size)]
        results["results"] = await phase(pid, args.concurrency, lookups, len(ids))
        return results


async def wait_healthy(url: str, node: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    async with aiohttp.ClientSession() as session:
        while True:
            if node.poll() is not None:
                raise RuntimeError(f"the node exited with {node.returncode} while starting")
            try:
                async with session.get(url + "/v1/health") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the node did not become healthy")
            await asyncio.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.route_cpu", description=__doc__.split("\n")[0])
    parser.add_argument("--code", type=Path, default=Path(__file__).parent.parent, help="checkout whose node runs")
    parser.add_argument("--batches", type=int, default=200, help="POST /tasks/batch calls")
    parser.add_argument("--singles", type=int, default=2000, help="POST /tasks calls")
    parser.add_argument("--batch", type=int, default=50, help="tasks, items or ids per batch call")
    parser.add_argument("--receive", type=int, default=10, help="max of each recv")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--fsync", choices=("always", "never"), default="always")
    parser.add_argument("--profile", type=Path, help="record the node with py-spy (--gil, raw) into this file")
    parser.add_argument("--py-spy", default="py-spy", help="the py-spy executable (for --profile)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from tests._nodes import free_port

    port = free_port()
    key = "rsk_" + secrets.token_urlsafe(32)
    env = {**os.environ, "RUNSTATE_BOOTSTRAP_KEY": key, "PYTHONPATH": str(args.code.resolve())}
    with tempfile.TemporaryDirectory(prefix="runstate-route-cpu-") as scratch:
        node = subprocess.Popen(
            [sys.executable, "-m", "runstate_server.node.cli", "dev", "--port", str(port), "--data-dir",
             str(Path(scratch) / "data"), "--fsync", args.fsync, "--auth"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=args.code,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            asyncio.run(wait_healthy(url, node))
            profiler = None
            if args.profile is not None:
                profiler = subprocess.Popen(
                    [args.py_spy, "record", "--gil", "-f", "raw", "-r", "200",
                     "-o", str(args.profile), "--pid", str(node.pid)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
                time.sleep(1.0)  # py-spy attaches
            results = asyncio.run(drive(url, key, node.pid, args))
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)
                profiler.wait(STOP_TIMEOUT_S)
        finally:
            node.terminate()
            node.wait(STOP_TIMEOUT_S)
    print(json.dumps({"code": str(args.code), **results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
