"""How long a new node takes to join a three-node cluster holding N small tasks and catch up:
recorded as a learner, caught up, promoted to voter. Prints one JSON object.

    python -m bench.membership --tasks 100000 --runs 2
    python -m bench.membership --tasks 1000000 --runs 1

Starts one three-node cluster on free 127.0.0.1 ports (fresh data dirs in a temporary directory),
fills it with N tasks as bench.memory does (`submit_many`, 100 per call, 8 producers, inputs of 100
bytes, at most 100,000 per run, so N is spread over runs), but each with a key of its own, so that
a batch answered UNAVAILABLE by a leader change under the load is sent again without doubling a
task. It waits until the three hold the same state (each applied the leader's commit index, then
one digest each agrees). Each run then starts a fourth node with `runstate node --join` (the three API URLs)
and polls, every 50 ms, from the moment its process is started:

- `join_answered_s`: its data dir holds membership.json, which it writes as soon as a member
  answered its join (recorded as a learner); this includes the process's start;
- `caught_up_s`: its applied index (its public GET /v1/health) reached the leader's commit index
  read when the join was answered (`target_index`);
- `voter_s`: the leader's GET /v1/cluster shows it with `voter` true (the leader looks at its
  learners every 0.5 s and promotes one whose applied index reached its commit index).

`catch_up_s` is caught_up_s - join_answered_s: what the learner spent receiving the leader's dump
and the rest of its log and applying them; `entries_per_s` and `tasks_per_s` divide the target
index and the tasks held by it. `leader_dump_bytes` is the size of the leader's raft.dump when the
node was started (null before the leader's first compaction), the state as of its last compaction,
and `leader_journal_file_bytes` that of its raft.journal, the log since (the file grows by doubling:
up to twice the entries it holds). The learner is sent the dump and those entries.
Between runs the joined node is killed and removed (DELETE /v1/cluster/members/{id}), so every run
joins a fresh node into three voters. Nothing is asserted on time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from runstate import AsyncRunstate
from runstate.sdk.errors import UnavailableError

from bench.failover import spread
from bench.memory import PAYLOAD_BYTES, PRODUCERS, SUBMIT_BATCH, padded
from bench.throughput import start_cluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from runstate_server.actors import limits  # noqa: E402
from runstate_server.cluster.log import DUMP_FILE_NAME, JOURNAL_FILE_NAME  # noqa: E402
from runstate_server.node.membership import MEMBERSHIP_FILE_NAME  # noqa: E402
from tests._cluster import Cluster, get_json  # noqa: E402 - the repository's cluster harness
from tests.test_cluster_membership import wait_level_proven  # noqa: E402

# Generous: on 2 shared cores a million tasks take minutes to reach three replicas, and as long
# to reach a learner.
CONVERGE_TIMEOUT_S = 1_800.0
JOIN_TIMEOUT_S = 1_800.0
REMOVED_TIMEOUT_S = 60.0
SUBMIT_GIVE_UP_S = 120.0  # one batch answered UNAVAILABLE again and again: no leader for that long
SUBMIT_REPEAT_PAUSE_S = 0.2
DIGEST_TIMEOUT_S = 300.0  # one node's digest of a million tasks, on loaded cores
DIGEST_PAUSE_S = 1.0


async def submit_keyed(url: str, api_key: str, run_id: str, first: int, count: int) -> tuple[int, int]:
    """bench.memory's submit (PRODUCERS producers, SUBMIT_BATCH per call, its inputs) with a key per
    task, so that a batch answered UNAVAILABLE (a leader change under the load: the busier the
    machine, the likelier with a million tasks) is sent again without doubling a task; how many
    tasks were accepted, and how many batches were sent again."""
    accepted = repeats = 0
    async with AsyncRunstate(api_key=api_key, base_url=url, holder="bench-producer") as rs:
        queue = rs.scope(run_id).mailbox("bench")
        chunks = iter(range(first, first + count, SUBMIT_BATCH))

        async def producer() -> None:
            nonlocal accepted, repeats
            for start in chunks:
                indexes = range(start, min(start + SUBMIT_BATCH, first + count))
                inputs, keys = [padded("n", i) for i in indexes], [f"t{i}" for i in indexes]
                given_up_at = time.monotonic() + SUBMIT_GIVE_UP_S
                while True:
                    try:
                        tickets = await queue.submit_many(inputs, keys=keys)
                        break
                    except UnavailableError:
                        if time.monotonic() > given_up_at:
                            raise
                        repeats += 1
                        await asyncio.sleep(SUBMIT_REPEAT_PAUSE_S)
                accepted += len(tickets)

        await asyncio.gather(*(producer() for _ in range(PRODUCERS)))
    return accepted, repeats


def fill(cluster: Cluster, tasks: int) -> dict[str, Any]:
    """Submit `tasks` tasks in as many runs as a run's bound needs, and wait until the three nodes
    hold them; how many were accepted and how long it took."""

    async def submit_all() -> tuple[int, int]:
        async with AsyncRunstate(api_key=cluster.admin_key, base_url=cluster.base_url) as rs:
            await rs.mailboxes.ensure("bench")
            shares = [min(limits.tasks_per_run_max, tasks - start) for start in range(0, tasks, limits.tasks_per_run_max)]
            run_ids = [(await rs.scopes.create(name=f"bench-{index}")).id for index in range(len(shares))]
        accepted = repeats = 0
        for run_id, share in zip(run_ids, shares, strict=True):
            count, repeated = await submit_keyed(cluster.base_url, cluster.admin_key, run_id, accepted, share)
            accepted, repeats = accepted + count, repeats + repeated
        return accepted, repeats

    started = time.perf_counter()
    accepted, repeats = asyncio.run(submit_all())
    submit_s = time.perf_counter() - started
    progress(f"submitted {accepted} tasks in {submit_s:.1f} s")
    wait_same_state(cluster, list(range(cluster.seed_size)))
    fill_s = time.perf_counter() - started
    return {
        "submitted": accepted,
        "submit_s": round(submit_s, 1),
        "submits_per_s": round(accepted / submit_s),
        "submit_batches_repeated": repeats,  # answered UNAVAILABLE, sent again
        "fill_s": round(fill_s, 1),  # until the three agree
    }


def wait_same_state(cluster: Cluster, indexes: list[int]) -> None:
    """Wait until the nodes `indexes` hold one state: their applied index (health, cheap) reaches the
    leader's commit index, then one digest each must agree. Not Cluster.wait_same_digest, which asks
    for digests every 50 ms: a digest encodes the whole state under the state's lock, seconds for a
    million tasks, and asked that often it starves the nodes' Raft threads into elections."""
    deadline = time.monotonic() + CONVERGE_TIMEOUT_S
    while True:
        leader = cluster.leader_index(timeout_s=CONVERGE_TIMEOUT_S)
        leader_health = cluster.health(leader)
        target = leader_health["commitIndex"] if leader_health is not None else None

        def applied(target: int | None = target) -> bool:
            views = [cluster.health(index) for index in indexes]
            return target is not None and all(view is not None and view["appliedIndex"] >= target for view in views)

        cluster.wait_until("every node applies the leader's commit index", applied, CONVERGE_TIMEOUT_S)
        asked_at = time.perf_counter()
        digests = [get_json(f"{cluster.urls[index]}/v1/cluster/digest", DIGEST_TIMEOUT_S, cluster.admin_key)
                   for index in indexes]
        seen = {(answer[1]["appliedIndex"], answer[1]["digest"]) if answer and answer[0] == 200 else None
                for answer in digests}
        agreed = seen.pop() if len(seen) == 1 else None
        if agreed is not None:
            progress(f"{len(indexes)} nodes agree at index {agreed[0]} "
                     f"(their digests took {time.perf_counter() - asked_at:.1f} s)")
            return
        if time.monotonic() >= deadline:
            raise AssertionError(f"the nodes never agreed; last digests {digests}\n{cluster.logs()}")
        time.sleep(DIGEST_PAUSE_S)  # a tick between two digests: ask again


def progress(line: str) -> None:
    print(f"bench.membership: {line}", file=sys.stderr, flush=True)


def file_bytes(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def is_voter(cluster: Cluster, leader: int, node_id: str) -> bool:
    view = cluster.api(leader).resending().ok("GET", "/v1/cluster")
    return any(node["id"] == node_id and node["voter"] is True for node in view["nodes"])


def one_join(cluster: Cluster, tasks: int) -> dict[str, Any]:
    """Start a fresh node with --join and time its way to voter."""
    leader = cluster.leader_index()
    dump_bytes = file_bytes(cluster.data_dir(leader) / DUMP_FILE_NAME)
    journal_bytes = file_bytes(cluster.data_dir(leader) / JOURNAL_FILE_NAME)
    new = cluster.add_node(join=list(range(cluster.seed_size)))
    node_id = cluster.ids[new]
    seen: dict[str, Any] = {}

    def probe() -> bool:
        now = time.perf_counter() - started
        if "target_index" not in seen:
            if not (cluster.data_dir(new) / MEMBERSHIP_FILE_NAME).exists():
                return False
            seen.setdefault("join_answered_s", now)
            health = cluster.health(leader)
            if health is None:  # busy: its commit index on the next look
                return False
            seen["target_index"] = health["commitIndex"]
        if "caught_up_s" not in seen:
            health = cluster.health(new)
            if health is None or health["appliedIndex"] < seen["target_index"]:
                return False
            seen["caught_up_s"] = time.perf_counter() - started
        # Asked only from here on: each look makes the leader ask every node's health, load that
        # would slow the catch-up it measures (and the leader promotes no node before it caught up).
        if not is_voter(cluster, leader, node_id):
            return False
        seen["voter_s"] = time.perf_counter() - started
        return True

    started = time.perf_counter()
    cluster.spawn(new)
    cluster.wait_until(f"{node_id} to join and become a voter", probe, JOIN_TIMEOUT_S)
    catch_up_s = seen["caught_up_s"] - seen["join_answered_s"]
    return {
        "node": node_id,
        "leader": cluster.ids[leader],
        "join_answered_s": round(seen["join_answered_s"], 2),
        "caught_up_s": round(seen["caught_up_s"], 2),
        "voter_s": round(seen["voter_s"], 2),
        "catch_up_s": round(catch_up_s, 2),
        "target_index": seen["target_index"],
        "entries_per_s": round(seen["target_index"] / catch_up_s) if catch_up_s > 0 else None,
        "tasks_per_s": round(tasks / catch_up_s) if catch_up_s > 0 else None,
        "leader_dump_bytes": dump_bytes,
        "leader_journal_file_bytes": journal_bytes,
    }


def remove(cluster: Cluster, index: int) -> None:
    """Kill the joined node and take it out of the configuration: three voters again."""
    cluster.kill(index)
    leader = cluster.leader_index()
    cluster.api(leader).resending().ok("DELETE", f"/v1/cluster/members/{cluster.ids[index]}")

    def three_voters() -> bool:
        view = cluster.api(leader).resending().ok("GET", "/v1/cluster")
        return sorted(node["id"] for node in view["nodes"]) == sorted(cluster.ids[: cluster.seed_size])

    cluster.wait_until(f"{cluster.ids[index]} removed", three_voters, REMOVED_TIMEOUT_S)


def bench(args: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="runstate-membership-") as scratch:
        cluster = start_cluster(args.fsync, Path(scratch) / "cluster")
        try:
            wait_level_proven(cluster)  # a join is refused until every node runs a release that joins
            filled = fill(cluster, args.tasks)
            for run in range(args.runs):
                if run:
                    remove(cluster, cluster.size - 1)
                    wait_same_state(cluster, list(range(cluster.seed_size)))
                runs.append(one_join(cluster, filled["submitted"]))
                progress(json.dumps({"run": run + 1, **runs[-1]}))
        except BaseException:
            print(cluster.logs(), file=sys.stderr)
            raise
        finally:
            cluster.stop()
    return {
        "benchmark": "membership",
        "tasks": args.tasks,
        "input_bytes": PAYLOAD_BYTES,
        "submit_batch": SUBMIT_BATCH,
        "fsync": args.fsync,
        **filled,
        "runs": runs,
        **{name: spread([run[name] for run in runs]) for name in ("join_answered_s", "caught_up_s", "voter_s", "catch_up_s")},
        "tasks_per_s": spread([run["tasks_per_s"] for run in runs if run["tasks_per_s"] is not None] or [0]),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.membership", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks the cluster holds (default 100000)")
    parser.add_argument("--runs", type=int, default=2, help="nodes joined one after the other (default 2)")
    parser.add_argument("--fsync", choices=("always", "never"), default="always")
    args = parser.parse_args(argv)
    if not 1 <= args.tasks <= limits.tasks_per_space_max:
        parser.error(f"--tasks must be 1 to {limits.tasks_per_space_max} (a space's bound)")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    print(json.dumps(bench(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
