"""The benchmark's short form: it runs end to end and prints the numbers it promises (no timing
assertions: speed is measured by `python -m bench.throughput`, not judged here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._typescript import build_package

BENCH_TIMEOUT_S = 180
TASKS = 200
CLUSTER_TASKS = 1000


@pytest.mark.parametrize(
    "flags",
    [(), ("--auth", "--no-coalesce"), ("--needs",), ("--cluster",), ("--batch", "20", "--payload-bytes", "4000"),
     ("--tls",)],
    ids=["plain", "auth", "needs", "cluster", "payload", "tls"],
)
def test_throughput_bench_short_form(flags: tuple[str, ...]) -> None:
    # A cluster's followers' CPU is split between threads by clock ticks (10 ms): enough tasks that
    # their Raft threads' share stands out from their loops'.
    tasks = CLUSTER_TASKS if "--cluster" in flags else TASKS
    finished = subprocess.run(
        [sys.executable, "-m", "bench.throughput", "--tasks", str(tasks), "--workers", "1", "--producers", "8", *flags],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert report["states"] == {"SUCCEEDED": tasks}
    assert report["payload_bytes"] == (4000 if "--payload-bytes" in flags else 0)
    assert report["auth"] is ("--auth" in flags or "--cluster" in flags)  # a cluster always requires keys
    assert report["nodes"] == (3 if "--cluster" in flags else 1)
    assert report["fsync"] == "always"
    assert report["tls"] is ("--tls" in flags)
    assert report["cpu_s"]["node"] > 0
    assert set(report["cpu_us_per_task"]) == {"producer", "workers", "node"}
    # Each node's CPU, its event loop's and its other threads': a cluster's one leader and two
    # followers (whose Raft thread applies the log: most of their CPU).
    nodes = report["node_cpu_s"]
    assert sorted(node["role"] for node in nodes) == (["follower", "follower", "leader"] if "--cluster" in flags else ["dev"])
    # The node answering HTTP spends CPU on its loop; a follower's loop may not reach one clock tick
    # (10 ms) in a run this short, while its Raft thread applies every task.
    assert all(node["loop"] > 0 for node in nodes if node["role"] != "follower")
    if "--cluster" in flags:
        followers = [node for node in nodes if node["role"] == "follower"]
        assert sum(node["other_threads"] for node in followers) > sum(node["loop"] for node in followers)
    assert report["needs"] is ("--needs" in flags)
    assert report["coalesce"] is ("--no-coalesce" not in flags)
    assert report["tasks_per_s"] > 0
    assert set(report["submit_latency_ms"]) == {"p50", "p99", "max"}
    # Raft messages the nodes sent, per task: a cluster's appends at least; a dev node has no peers.
    if "--cluster" in flags:
        assert report["raft_messages_per_task"]["append_entries"] > 0
    else:
        assert "raft_messages_per_task" not in report


def test_route_cpu_bench_short_form() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "bench.route_cpu", "--batches", "4", "--singles", "20", "--batch", "10"],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert set(report) == {"code", "batch", "submit", "recv", "complete", "results"}
    for route in ("batch", "submit", "recv", "complete", "results"):
        assert set(report[route]) == {"us_per_request", "us_per_task", "loop_us_per_request"}


def test_timer_bench_short_form() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "bench.timers", "--timers", "5"],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert report["timers"] == 5
    assert set(report["fired_late_ms"]) == {"p50", "p99", "max"}
    assert report["fired_late_ms"]["p50"] >= 0  # never before its time
    assert 0 <= report["fired_within_100ms"] <= 5


def test_memory_bench_short_form() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "bench.memory", "--tasks", "2000", "--warmup", "200", "--settle-s", "0.2"],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert report["submitted"] == 2000 and report["warmup_tasks"] == 200
    assert report["states"] == {"SUCCEEDED": 2000}
    assert report["fsync"] == "always"
    rss = report["rss_mib"]
    assert 0 < rss["baseline"] <= rss["peak"]
    assert rss["queued"] <= rss["peak"] and rss["completed"] <= rss["peak"]
    assert set(report["file_backed_mib"]) == {"baseline", "queued", "completed"}
    # Present and of the right kind; their size is measured, not judged (RSS may even shrink).
    assert set(report["bytes_per_task"]) == {"queued", "completed"}
    assert all(isinstance(value, int) for value in report["bytes_per_task"].values())
    assert set(report["tasks_in_24gb"]) == {"queued", "completed"}
    assert all(value > 0 for value in report["tasks_in_24gb"].values())
    charge = report["charged_bytes_per_task"]
    assert charge["completed"] > charge["queued"] > 100
    assert set(report["rss_per_charge"]) == {"queued", "completed", "peak"}
    assert report["rss_per_charge"]["completed"] == round(report["bytes_per_task"]["completed"] / charge["completed"], 2)


def test_apply_bench_short_form() -> None:
    root = Path(__file__).parent.parent

    def run(*flags: str) -> dict[str, object]:
        finished = subprocess.run(
            [sys.executable, "-m", "bench.apply", "--tasks", "200", "--preload", "100", *flags],
            cwd=root, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
        )
        assert finished.returncode == 0, finished.stderr
        report: dict[str, object] = json.loads(finished.stdout.strip().splitlines()[-1])
        return report

    report = run("--repeat", "2")
    assert report["state_tasks"] == 100 + 2 * 200
    assert isinstance(report["us_per_task"], float) and report["us_per_task"] > 0
    # A batch's submits as one command (the default, command level 2) or as one command each.
    each = run("--repeat", "1", "--submits", "each")
    assert (report["submits"], each["submits"], each["state_tasks"]) == ("many", "each", 100 + 200)
    # Against a checkout of its own: both sides run and compare.
    compared = run("--against", str(root), "--chunk", "100")
    assert set(compared) >= {"this", "against", "this_over_against_without_gc"}


def test_apply_bench_moves_on_to_a_new_run_when_one_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # `--tasks 20000` with the default preload and repeat is 120,000 tasks: more than a run holds.
    from bench.apply import Load
    from runstate_server.actors import limits

    monkeypatch.setattr(limits, "tasks_per_run_max", 120)
    load = Load(batch=50, receive_max=16, complete_max=25)
    load.set_up()
    first_run = load.run_id
    assert load.run(300) > 0  # asserts every submit was created
    assert load.run_id != first_run and len(load.core.state.tasks) == 300


def test_consume_cpu_bench_short_form() -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "bench.consume_cpu", "--tasks", "300", "--concurrency", "8"],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert (report["tasks"], report["concurrency"]) == (300, 8)
    assert report["us_per_task"] > 0


@pytest.mark.parametrize(
    "flags", [(), ("--cluster", "--via", "follower", "--gap-ms", "2"), ("--cluster", "--via", "follower", "--tls")],
    ids=["dev", "cluster-follower-sparse", "cluster-follower-tls"],
)
def test_latency_bench_short_form(flags: tuple[str, ...]) -> None:
    requests = 60
    finished = subprocess.run(
        [sys.executable, "-m", "bench.latency", "--requests", str(requests), "--warmup", "5", *flags],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stderr
    report = json.loads(finished.stdout.strip().splitlines()[-1])
    assert report["requests"] == requests and report["fsync"] == "always"
    assert report["nodes"] == (3 if flags else 1)
    assert report["gap_ms"] == (2 if "--gap-ms" in flags else 0)
    assert report["tls"] is ("--tls" in flags)  # over HTTPS the follower forwards to the leader over HTTPS too
    for phase in ("raw", "sdk"):
        assert_latencies(report[phase]["submit_ms"])
        assert report[phase]["client_cpu_ms_per_request"] >= 0
    nodes = report["raw"]["node_cpu_ms_per_request"]
    if flags:
        assert report["via"] == "follower"
        assert sorted(node["role"] for node in nodes) == ["follower", "follower", "leader"]
        assert [node["role"] for node in nodes if node["client"]] == ["follower"]
    else:
        assert [(node["role"], node["client"]) for node in nodes] == [("dev", True)]
    # Every submit of the raw phase costs the node(s) CPU (a clock tick is 10 ms: 60 submits of
    # ~1 ms of the serving node's CPU each pass several).
    assert sum(node["ms"] for node in nodes) > 0
    assert "etcd" not in report


def test_latency_bench_typescript_phase(run_temp: Path) -> None:
    """`--typescript` adds the TypeScript SDK's phase: as many submits, timed, and its process's CPU."""
    build_package(run_temp)  # sdk/typescript's dev dependencies (tsx), as the TypeScript tests install them
    requests = 40
    report = run_bench("latency", "--requests", str(requests), "--warmup", "5", "--typescript")
    assert_latencies(report["typescript"]["submit_ms"])
    assert report["typescript"]["client_cpu_ms_per_request"] > 0


def assert_latencies(latency: dict[str, float]) -> None:
    """A phase's p50/p90/p99/max in ms, each at least the one before."""
    assert set(latency) == {"p50", "p90", "p99", "max"}
    assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] <= latency["max"]


def run_bench(module: str, *flags: str) -> Any:
    """What `python -m bench.<module> *flags` prints (it must succeed)."""
    finished = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", *flags],
        cwd=Path(__file__).parent.parent, capture_output=True, text=True, timeout=BENCH_TIMEOUT_S,
    )
    assert finished.returncode == 0, finished.stderr
    return json.loads(finished.stdout.strip().splitlines()[-1])


def test_floor_bench_short_form() -> None:
    requests = 40
    report = run_bench("floor", "--requests", str(requests), "--warmup", "5", "--cluster")
    assert report["requests"] == requests and report["targets_ms"] == {"dev_submit_p50": 0.5, "cluster_submit_p50": 1.5}
    for phase in ("round_trip_ms", "with_fdatasync_ms", "aiohttp_round_trip_ms", "aiohttp_with_fdatasync_ms", "cluster_ms"):
        assert_latencies(report[phase])


def test_the_floor_benchs_journal_holds_each_entry_after_its_end_offset(tmp_path: Path) -> None:
    from bench.floor import FRAME, JOURNAL_BYTES_MIN, Journal

    journal = Journal(tmp_path / "journal")
    entries = [b"x" * size for size in (10, 700, 2000, 3)]
    for entry in entries:
        journal.append(entry)
    data = (tmp_path / "journal").read_bytes()
    end = int.from_bytes(data[:8], "little")
    assert end == 8 + sum(FRAME.size + len(entry) for entry in entries)
    assert len(data) >= end and len(data) >= JOURNAL_BYTES_MIN
    position, read = 8, []
    while position < end:
        (length,) = FRAME.unpack_from(data, position)
        read.append(data[position + FRAME.size:position + FRAME.size + length])
        position += FRAME.size + length
    assert read == entries
