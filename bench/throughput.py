"""End-to-end throughput and submit latency against a dev node; prints one JSON object.

    python -m bench.throughput --tasks 5000 --workers 2 --fsync always
    python -m bench.throughput --tasks 5000 --workers 2 --tls           # the same over HTTPS

With --batch B the producers submit B tasks per call (submit_many) and wait for B results per
call (results); submit latency is then per call. Starts its own `runstate dev` node on a free 127.0.0.1 port with a fresh data dir (with
--cluster, a three-node cluster of `runstate node` processes; or uses --url),
opens a run, starts W worker processes that consume the run's queue with the SDK, submits N tasks
from P concurrent producers, waits for every result, then cancels the run (which stops the
workers) and stops the node.

With --tls the node(s) serve HTTPS: a private CA is made (`runstate certs init`, node/certs.py) in
the run's scratch directory, each node gets its certificate (`--tls-cert`, `--tls-key`; a cluster's
nodes also trust the CA for each other's APIs, `--tls-ca`, and speak mutual TLS on the Raft port,
`--peer-tls-*`), and every client of the run (this process, the workers, the SDK) trusts the CA
through the environment (`tls_environment`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runstate import AsyncRunstate

HEALTH_TIMEOUT_S = 30.0
RESULT_TIMEOUT_MS = 120_000
WORKER_EXIT_TIMEOUT_S = 30.0
NODE_STOP_TIMEOUT_S = 30.0
# What a worker process prints once it has started (imports alone take ~0.3 s of CPU).
WORKER_READY = "ready"

# --tls (bench.latency's too): the CA and the node certificates of one run.
TLS_NODES = ("n1", "n2", "n3")  # a dev node serves n1's certificate, a cluster's node nK its own
CA_FILE_ENV = "RUNSTATE_CA_FILE"  # the SDKs' CA option (issue 42)
# What ssl.create_default_context() reads (OpenSSL's default verify file): urllib's default context
# and an SDK without RUNSTATE_CA_FILE trust the CA through it.
OPENSSL_CA_FILE_ENV = "SSL_CERT_FILE"
NODE_CA_FILE_ENV = "NODE_EXTRA_CA_CERTS"  # Node.js's: bench.latency --typescript


def make_certs(scratch: Path) -> Path:
    """A private CA and a certificate for each of TLS_NODES in `scratch`/certs; the directory."""
    from runstate_server.node.certs import CERT_DAYS_DEFAULT, certs_init

    out = scratch / "certs"
    certs_init(out, list(TLS_NODES), [], CERT_DAYS_DEFAULT)  # shorter: the nodes warn of the expiry
    return out


def tls_environment(certs: Path) -> None:
    """Every client this process starts from now on (workers, the SDK, urllib) trusts `certs`' CA."""
    for name in (CA_FILE_ENV, OPENSSL_CA_FILE_ENV, NODE_CA_FILE_ENV):
        os.environ[name] = str(certs / "ca.pem")


def tls_flags(certs: Path | None, node_id: str, *, cluster: bool = False) -> list[str]:
    """A node's flags to serve its API over HTTPS with its certificate (none without `certs`); a
    cluster node's also to trust the CA for the others' APIs (`--tls-ca`) and to speak mutual TLS on
    the Raft port with the same certificate (`--peer-tls-*`)."""
    if certs is None:
        return []
    cert, key, ca = (str(certs / name) for name in (f"{node_id}.pem", f"{node_id}.key", "ca.pem"))
    flags = ["--tls-cert", cert, "--tls-key", key]
    if cluster:
        flags += ["--tls-ca", ca, "--peer-tls-cert", cert, "--peer-tls-key", key, "--peer-tls-ca", ca]
    return flags


def rotated(url: str, by: int) -> str:
    """The comma-separated URL list started at its `by`-th entry, so that clients of a cluster
    spread over its nodes instead of all going to the first one."""
    urls = url.split(",")
    by %= len(urls)
    return ",".join(urls[by:] + urls[:by])


def cpu_s(pid: int, thread: int | None = None) -> float | None:
    """CPU seconds (user + system) a live process (or one of its threads) has used so far; None
    where /proc is missing."""
    stat = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    try:
        fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loop_cpu_s(pid: int) -> float | None:
    """CPU seconds of a live process's main thread (a node's event loop: HTTP and, on a single
    node, Raft); the rest of the process is its other threads (a cluster node's Raft tick thread,
    which applies the log, and the journal's sync thread). None where /proc is missing."""
    return cpu_s(pid, thread=pid)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def wait_healthy(url: str, node: subprocess.Popen[bytes] | None) -> None:
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    async with AsyncRunstate(base_url=url) as rs:
        while True:
            if node is not None and node.poll() is not None:
                raise RuntimeError(f"the benchmark's node exited with {node.returncode} while starting")
            try:
                await rs.mailboxes.ensure("bench", mode="WORK")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


# With --needs every task needs a slot, a rate-limit unit and a budget reservation, sized so none
# of them is the bottleneck: what is measured is the cost of taking and returning them.
NEEDS: dict[str, Any] = {
    "slots": "bench-pool", "limit": {"name": "bench-limit", "units": 1}, "budget": {"name": "bench-budget", "reserve": 0.01},
}
NEEDS_POOL_SIZE = 10_000
NEEDS_LIMIT_UNITS = 1_000_000


def task_input(index: int, payload_bytes: int) -> dict[str, Any]:
    """A task's input: `{"n": index}`, with `payload_bytes` > 0 also about that many bytes of chat
    messages (as an agent's task carries: many small objects, the costly kind to parse and encode)."""
    if payload_bytes <= 0:
        return {"n": index}
    message = {"role": "user", "content": "Summarise the quarterly figures for the board, briefly.", "tokens": 12}
    count = max(1, payload_bytes // len(json.dumps(message)))
    return {"n": index, "messages": [{**message, "tokens": index % 100 + turn} for turn in range(count)]}


async def ensure_needs(rs: Any, tasks: int) -> None:
    await rs.pools.ensure("bench-pool", size=NEEDS_POOL_SIZE)
    await rs.limits.ensure("bench-limit", units=NEEDS_LIMIT_UNITS, per="1s")
    await rs.budgets.ensure("bench-budget", total=tasks * NEEDS["budget"]["reserve"] * 2)


async def produce(
    url: str, run_id: str, tasks: int, producers: int, batch: int, needs: bool, coalesce: bool = True,
    payload_bytes: int = 0,
) -> dict[str, Any]:
    """Submit `tasks` tasks from `producers` concurrent producers (one call per task, or
    `batch` tasks per call), then wait for every result the same way."""
    latencies_ms: list[float] = []
    async with AsyncRunstate(base_url=url, holder="bench-producer", coalesce=coalesce) as rs:
        queue = rs.scope(run_id).mailbox("bench")
        per_call = max(batch, 1)
        chunks = iter(range(0, tasks, per_call))
        tickets: list[Any] = []

        async def producer() -> None:
            for start in chunks:
                indexes = range(start, min(start + per_call, tasks))
                began = time.perf_counter()
                extra = NEEDS if needs else {}
                if batch:
                    tickets.extend(
                        await queue.submit_many(
                            [task_input(i, payload_bytes) for i in indexes], keys=[f"task-{i}" for i in indexes], **extra
                        )
                    )
                else:
                    tickets.append(await queue.submit(task_input(start, payload_bytes), key=f"task-{start}", **extra))
                latencies_ms.append((time.perf_counter() - began) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(producer() for _ in range(producers)))
        submitted_s = time.perf_counter() - started
        outcomes: list[dict[str, Any]] = []
        pending = iter(range(0, len(tickets), per_call))

        async def collector() -> None:
            for start in pending:
                if batch:
                    outcomes.extend(await rs.results(tickets[start : start + per_call], timeout_ms=RESULT_TIMEOUT_MS))
                else:
                    outcomes.append(await tickets[start].result(timeout_ms=RESULT_TIMEOUT_MS))

        await asyncio.gather(*(collector() for _ in range(producers)))
        elapsed_s = time.perf_counter() - started
    states: dict[str, int] = {}
    for outcome in outcomes:
        states[outcome["state"]] = states.get(outcome["state"], 0) + 1
    return {
        "elapsed_s": round(elapsed_s, 3),
        "tasks_per_s": round(tasks / elapsed_s, 1),
        "submit_s": round(submitted_s, 3),
        "submits_per_s": round(tasks / submitted_s, 1),
        "submit_latency_ms": {
            "p50": round(statistics.median(latencies_ms), 2),
            "p99": round(percentile(latencies_ms, 0.99), 2),
            "max": round(max(latencies_ms), 2),
        },
        "states": states,
    }


async def work(url: str, run_id: str, concurrency: int) -> None:
    async with AsyncRunstate(base_url=url, holder=f"bench-worker-{os.getpid()}") as rs:
        async def handle(data: dict[str, Any], delivery: Any) -> dict[str, Any]:
            if "messages" in data:  # --payload-bytes: a result as large as the input
                return {"doubled": data["n"] * 2, "messages": data["messages"]}
            return {"doubled": data["n"] * 2}

        # Imported and ready: the bench measures the CPU of the work from here on.
        print(WORKER_READY, flush=True)
        await rs.scope(run_id).mailbox("bench").consume(handle, concurrency=concurrency)


def start_node(
    fsync: str, data_dir: Path, *, auth: bool = False, python_args: tuple[str, ...] = ("-m", "runstate_server.node.cli"),
    env: dict[str, str] | None = None, certs: Path | None = None,
) -> tuple[subprocess.Popen[bytes], str]:
    """A dev node; with `auth`, it requires keys and RUNSTATE_API_KEY (inherited by the workers)
    is set to its first admin key. `python_args` run the node's CLI (bench.memory runs it under
    tracemalloc). With `certs` (make_certs) it serves HTTPS with the first node's certificate."""
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from tests._nodes import free_port

    port = free_port()
    flags = (["--auth"] if auth else []) + tls_flags(certs, TLS_NODES[0])
    if auth:
        os.environ["RUNSTATE_BOOTSTRAP_KEY"] = os.environ["RUNSTATE_API_KEY"] = "rsk_" + secrets.token_urlsafe(32)
    node = subprocess.Popen(
        [sys.executable, *python_args, "dev", "--port", str(port), "--data-dir", str(data_dir), "--fsync", fsync, *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )
    return node, f"{'https' if certs else 'http'}://127.0.0.1:{port}"


def stop_node(node: subprocess.Popen[bytes], timeout_s: float = NODE_STOP_TIMEOUT_S) -> None:
    """SIGTERM, then SIGKILL if the node has not exited within `timeout_s`."""
    node.terminate()
    try:
        node.wait(timeout_s)
    except subprocess.TimeoutExpired:
        node.kill()
        node.wait()


def start_cluster(fsync: str, root: Path, certs: Path | None = None) -> Any:
    """A three-node cluster (`runstate node` processes, as the tests start them); RUNSTATE_API_KEY
    (inherited by the workers) is set to its first admin key. With `certs` (make_certs, and
    tls_environment called) each node serves HTTPS with its own certificate."""
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from tests._cluster import Cluster

    cluster = Cluster(root, "--fsync", fsync)
    if certs is not None:
        cluster.urls = [url.replace("http://", "https://", 1) for url in cluster.urls]
        cluster.node_args = [tuple(tls_flags(certs, node_id, cluster=True)) for node_id in cluster.ids]
    os.environ["RUNSTATE_API_KEY"] = cluster.admin_key
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def node_counts(urls: list[str]) -> tuple[dict[str, float], dict[str, float], list[str]]:
    """From the nodes' GET /metrics, summed over the nodes: the requests they answered so far, by
    method and route template (on a cluster a follower counts a request it forwards, and the
    leader counts it again), and the Raft messages they sent, by type (none on one node); and each
    node's Raft role now."""
    sys.path.insert(0, str(Path(__file__).parent.parent))
    from tests._prometheus import scrape

    key = os.environ.get("RUNSTATE_API_KEY")
    requests: dict[str, float] = {}
    messages: dict[str, float] = {}
    roles: list[str] = []
    for node_url in urls:
        samples, _ = scrape(node_url, key)
        held = [dict(labels)["role"] for (name, labels), value in samples.items() if name == "runstate_raft_role" and value]
        roles.append(held[0] if held else "unknown")
        for (name, labels), count in samples.items():
            label = dict(labels)
            if name == "runstate_http_requests_total" and label["route"] != "/metrics":
                route = f"{label['method']} {label['route'].removeprefix('/v1/spaces/{spaceId}')}"
                requests[route] = requests.get(route, 0.0) + count
            elif name == "runstate_raft_messages_total" and label["direction"] == "sent":
                messages[label["type"]] = messages.get(label["type"], 0.0) + count
    return requests, messages, roles


def requests_per_task(before: dict[str, float], after: dict[str, float], tasks: int) -> dict[str, float]:
    """What grew between two counts, per task: in all, then by key, largest first."""
    per_task = {route: round((count - before.get(route, 0.0)) / tasks, 3) for route, count in after.items()}
    per_task = {route: share for route, share in per_task.items() if share > 0}
    return {"all": round(sum(per_task.values()), 3), **dict(sorted(per_task.items(), key=lambda item: -item[1]))}


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    node = cluster = None
    with tempfile.TemporaryDirectory(prefix="runstate-bench-") as scratch:
        url = args.url
        certs = make_certs(Path(scratch)) if args.tls else None
        if certs is not None:
            tls_environment(certs)
        if args.cluster:
            cluster = start_cluster(args.fsync, Path(scratch) / "cluster", certs)
            url = cluster.base_url
        elif url is None:
            node, url = start_node(args.fsync, Path(scratch) / "data", auth=args.auth, certs=certs)
        workers: list[subprocess.Popen[bytes]] = []
        try:
            await wait_healthy(url, node)
            async with AsyncRunstate(base_url=url) as rs:
                if args.needs:
                    await ensure_needs(rs, args.tasks)
                run_id = (await rs.scopes.create(name="bench")).id
            workers = [
                subprocess.Popen(
                    [sys.executable, "-m", "bench.throughput", "--role", "worker", "--url", rotated(url, index + 1),
                     "--run", run_id, "--concurrency", str(args.concurrency)],
                    cwd=Path(__file__).parent.parent, stdout=subprocess.PIPE,
                )
                for index in range(args.workers)
            ]
            for worker in workers:
                assert worker.stdout is not None
                if worker.stdout.readline().decode().strip() != WORKER_READY:
                    raise RuntimeError(f"a worker exited while starting ({worker.wait()})")
            worker_cpu_before = [cpu_s(worker.pid) or 0.0 for worker in workers]
            node_pids = [node.pid] if node else [p.pid for p in cluster.processes if p] if cluster else []
            node_cpu_before = [cpu_s(pid) for pid in node_pids]
            node_loop_cpu_before = [loop_cpu_s(pid) for pid in node_pids]
            producer_cpu_before = time.process_time()
            requests_before, messages_before, _ = node_counts(url.split(","))
            result = await produce(
                url, run_id, args.tasks, args.producers, args.batch, args.needs, coalesce=not args.no_coalesce,
                payload_bytes=args.payload_bytes,
            )
            requests_after, messages_after, roles_after = node_counts(url.split(","))
            result["requests_per_task"] = requests_per_task(requests_before, requests_after, args.tasks)
            if messages_after:
                result["raft_messages_per_task"] = requests_per_task(messages_before, messages_after, args.tasks)
            cpu = {
                "producer": round(time.process_time() - producer_cpu_before, 2),
                # Under the load only; their start (imports, mostly) apart.
                "workers": round(sum(
                    (cpu_s(worker.pid) or 0.0) - before for worker, before in zip(workers, worker_cpu_before, strict=True)
                ), 2),
                "workers_startup": round(sum(worker_cpu_before), 2),
            }
            if node_pids and None not in node_cpu_before:
                # Each node's share: its event loop's (HTTP; a single node's Raft too) and its
                # other threads' (a cluster node's Raft tick thread, which applies the log).
                loop_used = [(loop_cpu_s(pid) or 0.0) - (before or 0.0) for pid, before in zip(node_pids, node_loop_cpu_before, strict=True)]
                # One node, or the sum of a cluster's three.
                used = [(cpu_s(pid) or 0.0) - (before or 0.0) for pid, before in zip(node_pids, node_cpu_before, strict=True)]
                cpu["node"] = round(sum(used), 2)
                roles = roles_after if cluster else ["dev"]
                result["node_cpu_s"] = [
                    # The kernel scales a process's and a thread's times apart (from their exact
                    # run times): for a node whose other threads barely ran, the difference can be
                    # a tick below zero.
                    {"role": role, "loop": round(loop, 2), "other_threads": round(max(0.0, total - loop), 2)}
                    for role, loop, total in zip(roles, loop_used, used, strict=True)
                ]
            result["cpu_s"] = cpu
            result["cpu_us_per_task"] = {role: round(seconds * 1e6 / args.tasks) for role, seconds in cpu.items()
                                         if role != "workers_startup"}
            async with AsyncRunstate(base_url=url) as rs:
                await rs.scopes.cancel(run_id)
            for worker in workers:
                worker.wait(WORKER_EXIT_TIMEOUT_S)
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
                if worker.stdout is not None:
                    worker.stdout.close()
            if node is not None:
                stop_node(node)
            if cluster is not None:
                cluster.stop()
    known = args.url is None or args.cluster
    return {
        "benchmark": "end_to_end_tasks",
        "nodes": 3 if args.cluster else 1 if args.url is None else "unknown (--url)",
        "tasks": args.tasks,
        "workers": args.workers,
        "worker_concurrency": args.concurrency,
        "producers": args.producers,
        "submit_batch": args.batch,
        "payload_bytes": args.payload_bytes,
        "fsync": args.fsync if known else "unknown (--url)",
        "auth": (args.auth or args.cluster) if known else "unknown (--url)",
        "tls": args.tls if known else "unknown (--url)",
        "needs": args.needs,
        "coalesce": not args.no_coalesce,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        **result,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=5000, help="tasks to submit (default 5000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--concurrency", type=int, default=64, help="handlers per worker (default 64)")
    parser.add_argument("--producers", type=int, default=64, help="concurrent submitters (default 64)")
    parser.add_argument(
        "--batch", type=int, default=0,
        help="tasks per submit call and per result wait (0, the default: one call per task)",
    )
    parser.add_argument(
        "--payload-bytes", type=int, default=0,
        help="each task's input and result also carry about this many bytes of JSON objects (default 0: {\"n\": i})",
    )
    parser.add_argument("--fsync", choices=("always", "never"), default="always")
    parser.add_argument("--auth", action="store_true", help="start the node with --auth: every call carries a key")
    parser.add_argument(
        "--needs", action="store_true",
        help="every task needs a slot, a rate-limit unit and a budget reservation (none of them a bottleneck)",
    )
    parser.add_argument(
        "--no-coalesce", action="store_true",
        help="the producer's client sends one request per call (coalesce=False) instead of batching concurrent ones",
    )
    parser.add_argument(
        "--url",
        help="use running nodes instead of starting one: a URL, or a comma-separated list of a cluster's "
        "nodes (the producer starts at the first, worker i at the (i+1)-th)",
    )
    parser.add_argument(
        "--cluster", action="store_true",
        help="start a three-node cluster (API keys required, as always on a cluster) instead of one dev node",
    )
    parser.add_argument(
        "--tls", action="store_true",
        help="the node(s) serve HTTPS with certificates of a private CA made for the run; every client trusts it",
    )
    parser.add_argument("--role", choices=("bench", "worker"), default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cluster and (args.url or args.auth):
        parser.error("--cluster starts its own nodes, which always require keys: no --url, no --auth")
    if args.tls and args.url:
        parser.error("--tls starts its own node(s) with certificates: no --url (point SSL_CERT_FILE at a running one's CA)")
    if args.role == "worker":
        asyncio.run(work(args.url, args.run, args.concurrency))
        return 0
    print(json.dumps(asyncio.run(bench(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
