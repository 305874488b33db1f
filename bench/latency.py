"""Submit latency with one request outstanding, as a raw client and through the SDK; prints one JSON object.

    python -m bench.latency                        # a dev node
    python -m bench.latency --cluster              # a three-node cluster, through its leader
    python -m bench.latency --cluster --via follower
    python -m bench.latency --code ../other-checkout --cluster   # the nodes run that checkout's code
    python -m bench.latency --etcd http://127.0.0.1:2379         # the same client's puts to an etcd
    python -m bench.latency --typescript           # also through the TypeScript SDK
    python -m bench.latency --tls                  # over HTTPS (also with --cluster)

Starts its own node(s) (fsync always, unless --fsync never) on free 127.0.0.1 ports, opens a run
and a mailbox, and submits `--requests` tasks one after the other: first from a raw HTTP/1.1
client over one keep-alive connection (the standard library's http.client: the least a client
can add), then as many through the async SDK (`queue.submit`, what an application sees). Each
phase starts with `--warmup` submits that are not counted; `--gap-ms N` idles N ms before each
counted submit (sparse calls, as agents make them, meet a machine whose cores went idle). It prints the p50/p90/p99/max of each
phase in ms and, for the raw phase, each node's role and CPU per request (utime + stime from /proc,
in ms: `node_cpu_ms_per_request`; `client` marks the node the client talks to), and in each phase
the client's own CPU per request (`client_cpu_ms_per_request`: this process, the SDK's work in the
second phase).

With --typescript a third phase submits as many through the TypeScript SDK (`submit`, in a Node.js
process: bench/latency_typescript.mts, run with sdk/typescript's dev dependencies, `npm ci` there
first), with that process's CPU per request.

With --tls the node(s) serve HTTPS with certificates of a private CA made for the run (as
bench.throughput --tls) and every client trusts it: the raw client's one connection is then a TLS
connection, its handshake among the uncounted warm-up submits.

With --etcd URL it also puts as many small keys to that etcd (v3's JSON gateway, `POST
/v3/kv/put`) from the same raw client, one after the other: the reference the issue's latency
target names (etcd's put), measured on the same machine in the same sitting. The etcd is not
started here: run one, or three (Debian's etcd-server), beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import json
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from runstate import AsyncRunstate

from bench.throughput import (
    CA_FILE_ENV,
    cpu_s,
    make_certs,
    percentile,
    start_cluster,
    start_node,
    stop_node,
    tls_environment,
    wait_healthy,
)

TYPESCRIPT_PACKAGE = Path(__file__).resolve().parent.parent / "sdk" / "typescript"
TYPESCRIPT_SCRIPT = Path(__file__).resolve().parent / "latency_typescript.mts"
TYPESCRIPT_TIMEOUT_S = 600.0
REQUESTS_DEFAULT = 2000
WARMUP_DEFAULT = 200
REQUEST_TIMEOUT_S = 30.0
GAP_MS_MAX = 10_000.0


class RawClient:
    """One keep-alive HTTP/1.1 connection: JSON in, JSON out, any status but the expected one fails."""

    def __init__(self, url: str, key: str | None) -> None:
        parts = urlsplit(url)
        host = parts.hostname or "127.0.0.1"
        self._connection: http.client.HTTPConnection
        if parts.scheme == "https":  # --tls: trust the run's CA (tls_environment)
            context = ssl.create_default_context(cafile=os.environ.get(CA_FILE_ENV))
            self._connection = http.client.HTTPSConnection(host, parts.port, timeout=REQUEST_TIMEOUT_S, context=context)
        else:
            self._connection = http.client.HTTPConnection(host, parts.port, timeout=REQUEST_TIMEOUT_S)
        self._headers = {"content-type": "application/json"}
        if key:
            self._headers["authorization"] = f"Bearer {key}"

    def call(self, path: str, body: dict[str, Any], *, expect: int) -> dict[str, Any]:
        self._connection.request("POST", path, body=json.dumps(body), headers=self._headers)
        response = self._connection.getresponse()
        answer = response.read()
        if response.status != expect:
            raise RuntimeError(f"POST {path} answered {response.status}: {answer[:300]!r}")
        decoded: dict[str, Any] = json.loads(answer)
        return decoded

    def close(self) -> None:
        self._connection.close()


def summary(latencies_s: list[float]) -> dict[str, float]:
    latencies_ms = [latency * 1000 for latency in latencies_s]
    return {
        "p50": round(statistics.median(latencies_ms), 3),
        "p90": round(percentile(latencies_ms, 0.90), 3),
        "p99": round(percentile(latencies_ms, 0.99), 3),
        "max": round(max(latencies_ms), 3),
    }


def own_cpu_s() -> float:
    """This process's CPU time so far (user + system): the client's side of a phase."""
    times = os.times()
    return times.user + times.system


def timed(call: Callable[[int], None], indexes: range, gap_s: float) -> list[float]:
    """The seconds each call(index) took, one after the other, each after `gap_s` idle."""
    latencies_s: list[float] = []
    for index in indexes:
        if gap_s:
            time.sleep(gap_s)
        started = time.perf_counter()
        call(index)
        latencies_s.append(time.perf_counter() - started)
    return latencies_s


def raw_submits(
    url: str, key: str | None, requests: int, warmup: int, pids: list[tuple[str, int, bool]], gap_s: float,
) -> dict[str, Any]:
    """`warmup` + `requests` sequential POST /tasks from a raw client; the latencies of the last
    `requests` and each node's CPU per request over them."""
    client = RawClient(url, key)
    try:
        space = "/v1/spaces/default"
        run_id = client.call(f"{space}/scopes", {}, expect=201)["id"]
        mailbox_id = client.call(f"{space}/mailboxes", {"name": f"latency-{os.getpid()}"}, expect=201)["id"]

        def submit(index: int) -> None:
            body = {"scopeId": run_id, "mailboxId": mailbox_id, "input": {"n": index}, "taskKey": f"task-{index}"}
            client.call(f"{space}/tasks", body, expect=201)

        for index in range(warmup):
            submit(index)
        before = [cpu_s(pid) for _, pid, _ in pids]
        client_before_s = own_cpu_s()
        latencies_s = timed(submit, range(warmup, warmup + requests), gap_s)
        client_ms = (own_cpu_s() - client_before_s) / requests * 1000
        cpu_ms: list[dict[str, Any]] = []
        for (role, pid, serves), then in zip(pids, before, strict=True):
            now = cpu_s(pid)
            if now is not None and then is not None:
                cpu_ms.append({"role": role, "client": serves, "ms": round((now - then) / requests * 1000, 3)})
    finally:
        client.close()
    return {
        "submit_ms": summary(latencies_s), "node_cpu_ms_per_request": cpu_ms,
        "client_cpu_ms_per_request": round(client_ms, 3),
    }


async def sdk_submits(url: str, requests: int, warmup: int, gap_s: float) -> dict[str, Any]:
    """The same through the async SDK (RUNSTATE_API_KEY in the environment on a cluster)."""
    async with AsyncRunstate(base_url=url, holder="bench-latency") as rs:
        name = f"latency-sdk-{os.getpid()}"
        await rs.mailboxes.ensure(name, mode="WORK")
        queue = rs.scope((await rs.scopes.create(name=name)).id).mailbox(name)
        for index in range(warmup):
            await queue.submit({"n": index}, key=f"task-{index}")
        latencies_s: list[float] = []
        client_before_s = own_cpu_s()
        for index in range(warmup, warmup + requests):
            if gap_s:
                await asyncio.sleep(gap_s)
            started = time.perf_counter()
            await queue.submit({"n": index}, key=f"task-{index}")
            latencies_s.append(time.perf_counter() - started)
        client_ms = (own_cpu_s() - client_before_s) / requests * 1000
    return {"submit_ms": summary(latencies_s), "client_cpu_ms_per_request": round(client_ms, 3)}


def typescript_submits(url: str, requests: int, warmup: int, gap_s: float) -> dict[str, Any]:
    """The same through the TypeScript SDK, in a Node.js process of its own."""
    node = shutil.which("node")
    if node is None:
        raise SystemExit("--typescript needs Node.js 20 or later (node on the PATH)")
    if not (TYPESCRIPT_PACKAGE / "node_modules" / "tsx").is_dir():
        raise SystemExit(f"--typescript needs the TypeScript SDK's dev dependencies: run `npm ci` in {TYPESCRIPT_PACKAGE}")
    finished = subprocess.run(
        [node, "--import", "tsx", str(TYPESCRIPT_SCRIPT), url, str(requests), str(warmup), str(gap_s * 1000)],
        cwd=TYPESCRIPT_PACKAGE, capture_output=True, text=True, timeout=TYPESCRIPT_TIMEOUT_S,
    )
    if finished.returncode != 0:
        raise RuntimeError(f"the TypeScript phase failed:\n{finished.stderr[-3000:]}")
    answer = json.loads(finished.stdout.strip().splitlines()[-1])
    return {
        "submit_ms": summary([latency_ms / 1000 for latency_ms in answer["latencies_ms"]]),
        "client_cpu_ms_per_request": round(answer["client_cpu_ms_per_request"], 3),
    }


def etcd_puts(url: str, requests: int, warmup: int, gap_s: float) -> dict[str, Any]:
    """Sequential puts of small keys to an etcd's v3 JSON gateway, from the same raw client."""
    client = RawClient(url, None)

    def put(index: int) -> None:
        key = base64.b64encode(f"runstate-bench-latency/{index}".encode()).decode()
        value = base64.b64encode(json.dumps({"n": index}).encode()).decode()
        client.call("/v3/kv/put", {"key": key, "value": value}, expect=200)

    try:
        for index in range(warmup):
            put(index)
        latencies_s = timed(put, range(warmup, warmup + requests), gap_s)
    finally:
        client.close()
    return {"url": url, "put_ms": summary(latencies_s)}


def bench(args: argparse.Namespace) -> dict[str, Any]:
    code = args.code.resolve()
    gap_s = args.gap_ms / 1000
    # The node processes (the dev node, or the cluster's `runstate node`s) run `code`'s server.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])
    report: dict[str, Any] = {
        "benchmark": "submit_latency", "nodes": 3 if args.cluster else 1, "via": args.via if args.cluster else "dev",
        "fsync": args.fsync, "requests": args.requests, "gap_ms": args.gap_ms, "code": str(code), "cpus": os.cpu_count(),
        "python": sys.version.split()[0], "tls": args.tls,
    }
    with tempfile.TemporaryDirectory(prefix="runstate-bench-") as scratch:
        certs = make_certs(Path(scratch)) if args.tls else None
        if certs is not None:
            tls_environment(certs)
        if args.cluster:
            cluster = start_cluster(args.fsync, Path(scratch) / "cluster", certs)
            try:
                leader = cluster.leader_index()
                target = leader if args.via == "leader" else next(i for i in range(len(cluster.processes)) if i != leader)
                pids = []
                for index, process in enumerate(cluster.processes):
                    assert process is not None
                    pids.append(("leader" if index == leader else "follower", process.pid, index == target))
                url = cluster.urls[target]
                report["raw"] = raw_submits(url, os.environ["RUNSTATE_API_KEY"], args.requests, args.warmup, pids, gap_s)
                report["sdk"] = asyncio.run(sdk_submits(url, args.requests, args.warmup, gap_s))
                if args.typescript:
                    report["typescript"] = typescript_submits(url, args.requests, args.warmup, gap_s)
            finally:
                cluster.stop()
        else:
            node, url = start_node(args.fsync, Path(scratch) / "data", env=dict(os.environ), certs=certs)
            try:
                asyncio.run(wait_healthy(url, node))
                report["raw"] = raw_submits(url, None, args.requests, args.warmup, [("dev", node.pid, True)], gap_s)
                report["sdk"] = asyncio.run(sdk_submits(url, args.requests, args.warmup, gap_s))
                if args.typescript:
                    report["typescript"] = typescript_submits(url, args.requests, args.warmup, gap_s)
            finally:
                stop_node(node)
    if args.etcd:
        report["etcd"] = etcd_puts(args.etcd, args.requests, args.warmup, gap_s)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__.split("\n")[0])
    add_pacing_options(parser)
    parser.add_argument("--fsync", choices=("always", "never"), default="always")
    parser.add_argument("--cluster", action="store_true", help="a three-node cluster instead of a dev node")
    parser.add_argument("--via", choices=("leader", "follower"), default="leader", help="the cluster node the client talks to")
    parser.add_argument("--code", type=Path, default=Path(__file__).parent.parent, help="the checkout whose server the nodes run")
    parser.add_argument("--typescript", action="store_true", help="also submit through the TypeScript SDK (Node.js)")
    parser.add_argument(
        "--tls", action="store_true",
        help="the node(s) serve HTTPS with certificates of a private CA made for the run; every client trusts it",
    )
    parser.add_argument("--etcd", help="also time puts to this etcd's client URL (e.g. http://127.0.0.1:2379)")
    args = parser.parse_args(argv)
    check_pacing_options(parser, args)
    print(json.dumps(bench(args)), flush=True)
    return 0


def add_pacing_options(parser: argparse.ArgumentParser) -> None:
    """--requests, --warmup and --gap-ms: how many requests a phase counts, and how they are paced."""
    parser.add_argument("--requests", type=int, default=REQUESTS_DEFAULT, help=f"requests counted per phase (default {REQUESTS_DEFAULT})")
    parser.add_argument("--warmup", type=int, default=WARMUP_DEFAULT, help=f"requests before each phase, not counted (default {WARMUP_DEFAULT})")
    parser.add_argument(
        "--gap-ms", type=float, default=0.0,
        help="idle this long before each counted request (0, the default: back to back); an agent's calls come apart",
    )


def check_pacing_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.requests < 1 or args.warmup < 0 or not 0 <= args.gap_ms <= GAP_MS_MAX:
        parser.error(f"--requests must be at least 1, --warmup at least 0, --gap-ms 0 to {GAP_MS_MAX}")


if __name__ == "__main__":
    sys.exit(main())
