"""CPU a replica spends applying committed commands, per task; prints one JSON object.

    python -m bench.apply --tasks 10000 --preload 20000 --batch 50 --repeat 5

In process, no node: the lifecycle submit -> receive (deliver) -> complete of `--batch` tasks at
a time, as the cluster's batch load commits it (one log batch holding one `task.submit_many` of
`--batch` tasks, with one idempotency key, as a cluster at command level 2 commits a batch
submit; `--submits each` gives the level-1 form, one `task.submit` per task with a key each,
which is also what an older checkout applies; one log batch of receives of up to
`--receive-max` tasks each; one of `complete_many` commands of up to `--complete-max` items
each; and a tick), encoded as the
leader encodes them (cluster/codec.py) and applied through `ReplicatedLog.apply_batch`, the
body every replica runs, decode included. Before the measure, `--preload` tasks go through the
same lifecycle, so the state is as a busy node's: its tasks, a full event log, a full
idempotency table.

Measured: `time.process_time()` around the applies only (the commands are encoded beforehand),
per task; `--repeat` rounds over the same growing state, their median and each. The collector
runs with a node's thresholds (node/cli.py's tune_garbage_collector); its share (its collections
that start during an apply, timed through gc.callbacks) is given apart too: on a large state a
full collection takes tens of milliseconds, so where one falls makes the total noisy.
Deterministic: ids come from a seeded generator, so two runs apply the same commands.

On a shared machine a run's figure moves with what else runs. `--against DIR` compares with
another checkout (its `runstate_server`, this load): two processes, each with its own state, take
turns applying `--chunk` tasks (a few tens of milliseconds), so both see the same conditions; it
gives each side's median per chunk and the median of the chunks' ratios.

    python -m bench.apply --against /tmp/main-checkout --tasks 20000
    python -m bench.apply --against /tmp/older-checkout --submits each
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

from runstate_server.actors import dispatch, limits
from runstate_server.cluster import codec
from runstate_server.cluster.log import ReplicatedLog

SPACE = "bench-space"
MAILBOX = "bench"
HOLDER = "bench-worker"
LEASE_MS = 30_000  # the SDK's default
RETENTION_MS = 3_600_000
START_MS = 1_700_000_000_000
ROUND_MS = 20  # the clock advances this much per round: `--batch` tasks every 20 ms
SEED = 18


class Load:
    """The cluster's commands for one space, one run and one mailbox, with seeded ids, applied
    through apply_batch on one Core."""

    def __init__(self, batch: int, receive_max: int, complete_max: int, submits: str = "many") -> None:
        self.core = dispatch.Core()
        self.submits = submits  # "many": one task.submit_many per batch; "each": a task.submit per task
        # What apply_batch reads of its ReplicatedLog: the lock, the state machine, the counters.
        self.log = types.SimpleNamespace(
            _halt_reason=None,
            lock=threading.Lock(),
            _state_machine=self.core,
            counters=types.SimpleNamespace(batches_applied=0, commands_failed_internal=0),
            _on_applied=None,
        )
        self.random = random.Random(SEED)
        self.now_ms = START_MS
        self.epoch = 1
        self.batch = batch
        self.receive_max = receive_max
        self.complete_max = complete_max
        self.submitted = 0
        self.in_run = 0  # tasks submitted into the current run (a run holds at most tasks_per_run_max)
        self.mailbox_id = ""
        self.run_id = ""
        self.gc_s = 0.0  # CPU seconds of the collections that started while measuring
        self._gc_started: float | None = None
        self._measuring = False

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.process_time() if self._measuring else None
        elif self._gc_started is not None:
            self.gc_s += time.process_time() - self._gc_started
            self._gc_started = None

    def command_id(self) -> str:
        return f"{self.random.getrandbits(128):032x}"

    def command(self, kind: str, args: dict[str, Any], idem: bool = True) -> bytes:
        command: dict[str, Any] = {"type": kind, "v": dispatch.COMMAND_VERSION, "space": SPACE,
                                   "id": self.command_id(), "args": args}
        if idem:
            key = f"{self.random.getrandbits(96):024x}"
            command["idem"] = [key, hashlib.sha256(key.encode()).hexdigest()]
        return codec.encode_command(command)

    def batch_of(self, commands: list[bytes]) -> bytes:
        return codec.encode_batch(self.now_ms, self.epoch, commands)

    def apply(self, data: bytes) -> list[Any]:
        results: list[Any] = ReplicatedLog.apply_batch(self.log, data)  # type: ignore[arg-type]
        return results

    def timed(self, data: bytes) -> tuple[list[Any], float]:
        """apply(data), and the CPU seconds it took."""
        self._measuring = True
        started = time.process_time()
        results = self.apply(data)
        cpu_s = time.process_time() - started
        self._measuring = False
        return results, cpu_s

    def set_up(self) -> None:
        for data in (
            self.batch_of([codec.encode_command({"type": "leader.start", "v": 1, "space": "", "id": self.command_id(),
                                                 "args": {}})]),
            self.batch_of([self.command("mailbox.declare", {"name": MAILBOX})]),
        ):
            (result,) = self.apply(data)
            assert "error" not in result, result
            if "mailbox" in result:
                self.mailbox_id = result["mailbox"]["id"]
        self.new_run()
        assert self.mailbox_id and self.run_id

    def new_run(self) -> None:
        """The runs the tasks go into (untimed): a new one when the current one is full."""
        (result,) = self.apply(self.batch_of([self.command("run.create", {"name": None})]))
        assert "error" not in result, result
        self.run_id = result.get("run_id") or result["run"]["id"]
        self.in_run = 0

    def round(self) -> list[bytes]:
        """The log batches of one round of `batch` tasks, encoded; the receives' and completes'
        commands are made when their turn comes (they name what the earlier batches produced)."""
        items = []
        for _ in range(self.batch):
            self.submitted += 1
            encoded = json.dumps({"n": self.submitted}, separators=(",", ":")).encode()
            input_hash = hashlib.sha256(encoded).hexdigest()
            items.append({
                "run_id": self.run_id, "mailbox_id": self.mailbox_id, "key": input_hash, "input": encoded,
                "input_hash": input_hash, "attempts": None, "key_only": False, "deadline_ms": None, "subscriber": None,
            })
        if self.submits == "each":
            return [self.command("task.submit", item) for item in items]
        ids = [self.command_id() for _ in items]
        return [self.command("task.submit_many", {"items": items, "ids": ids})]

    def receives(self) -> bytes:
        commands = []
        remaining = self.batch
        while remaining > 0:
            count = min(remaining, self.receive_max)
            remaining -= count
            commands.append(self.command("task.receive", {
                "run_id": self.run_id, "mailbox_id": self.mailbox_id, "max": count, "lease_ms": LEASE_MS,
                "holder": HOLDER, "holder_session": None, "include_descendants": False, "tasks_only": False,
                "nonce": f"{self.random.getrandbits(96):024x}",
            }))
        return self.batch_of(commands)

    def completes(self, deliveries: list[dict[str, Any]]) -> bytes:
        items = [{"message_id": given["task_id"], "delivery_id": given["token"], "payload": b'{"ok":true}'}
                 for given in deliveries]
        commands = [self.command("delivery.complete_many", {"items": items[start:start + self.complete_max]})
                    for start in range(0, len(items), self.complete_max)]
        return self.batch_of(commands)

    def tick(self) -> bytes:
        return self.batch_of([codec.encode_command({"type": "tick", "v": 1, "space": "", "id": self.command_id(),
                                                    "args": {"retention_ms": RETENTION_MS}})])

    def run(self, tasks: int) -> float:
        """Apply `tasks` tasks' lifecycles; the CPU seconds their applies took."""
        cpu_s = 0.0
        for _ in range(tasks // self.batch):
            if self.in_run + self.batch > limits.tasks_per_run_max:
                self.new_run()
            self.in_run += self.batch
            self.now_ms += ROUND_MS
            results, spent_s = self.timed(self.batch_of(self.round()))
            cpu_s += spent_s
            if self.submits == "many":
                results = results[0].get("items", results)  # an error: the assert below shows it
            assert all(result.get("created") for result in results), results[:1]
            results, spent_s = self.timed(self.receives())
            cpu_s += spent_s
            deliveries = [given for result in results for given in result["deliveries"]]
            assert len(deliveries) == self.batch, results[:1]
            tick = self.tick()
            results, spent_s = self.timed(self.completes(deliveries))
            cpu_s += spent_s
            assert all("error" not in answer for result in results for answer in result["items"]), results[:1]
            cpu_s += self.timed(tick)[1]
        return cpu_s


def collect_as_a_node_does() -> None:
    """The node's collector thresholds (node/cli.py), where this checkout has them: with the
    interpreter's defaults a young collection ran every 700 allocations and took a share of the
    applies no node pays."""
    try:
        from runstate_server.node.cli import tune_garbage_collector
    except ImportError:  # a checkout from before the node tuned it
        return
    tune_garbage_collector()


def serve(load: Load) -> None:
    """--worker: apply as many tasks as each line of stdin says; answer each with a JSON line of
    the CPU seconds the applies took and the collector's share of them."""
    gc.callbacks.append(load.on_gc)
    print("ready", flush=True)
    for line in sys.stdin:
        load.gc_s = 0.0
        cpu_s = load.run(int(line))
        print(json.dumps({"cpu_s": cpu_s, "gc_s": load.gc_s}), flush=True)


def compare(args: argparse.Namespace) -> dict[str, Any]:
    """--against: this checkout and `args.against` in turns, `args.chunk` tasks at a time."""
    here = Path(__file__).resolve().parent.parent
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--preload", str(args.preload),
               "--batch", str(args.batch), "--receive-max", str(args.receive_max), "--complete-max", str(args.complete_max),
               "--submits", args.submits]
    sides = {}
    for name, root in (("against", Path(args.against).resolve()), ("this", here)):
        # The other checkout's runstate_server is found first; this file's load drives it.
        # One hash seed for both: the layout of their dicts, and so their probes, alike.
        environment = {**os.environ, "PYTHONPATH": str(root), "PYTHONHASHSEED": "18"}
        sides[name] = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       env=environment, cwd=root)
    for process in sides.values():
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    chunks: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    for index in range(args.tasks // args.chunk):
        order = list(sides) if index % 2 == 0 else list(reversed(sides))
        for name in order:
            process = sides[name]
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(f"{args.chunk}\n")
            process.stdin.flush()
            chunks[name].append(json.loads(process.stdout.readline()))
    for process in sides.values():
        assert process.stdin is not None
        process.stdin.close()
        process.wait()

    def per_task_us(seconds: float) -> float:
        return round(seconds / args.chunk * 1e6, 1)

    summary: dict[str, Any] = {}
    for name, measured in chunks.items():
        summary[name] = {
            "us_per_task": per_task_us(statistics.median(chunk["cpu_s"] for chunk in measured)),
            "us_per_task_without_gc": per_task_us(statistics.median(chunk["cpu_s"] - chunk["gc_s"] for chunk in measured)),
            "gc_us_per_task_mean": per_task_us(sum(chunk["gc_s"] for chunk in measured) / len(measured)),
        }
    ratios = [
        (this["cpu_s"] - this["gc_s"]) / (other["cpu_s"] - other["gc_s"])
        for this, other in zip(chunks["this"], chunks["against"], strict=True)
    ]
    summary["this_over_against_without_gc"] = round(statistics.median(ratios), 3)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks measured per round (default 10000)")
    parser.add_argument("--preload", type=int, default=20_000, help="tasks applied before the measure (default 20000)")
    parser.add_argument("--batch", type=int, default=50, help="tasks per log batch (default 50)")
    parser.add_argument("--receive-max", type=int, default=16, help="tasks per receive (default 16)")
    parser.add_argument("--complete-max", type=int, default=25, help="items per complete_many (default 25)")
    parser.add_argument("--submits", choices=("many", "each"), default="many",
                        help="a batch's submits as one task.submit_many (default: command level 2) or one task.submit "
                        "each (level 1, and what a checkout from before level 2 applies)")
    parser.add_argument("--repeat", type=int, default=5, help="measured rounds (default 5)")
    parser.add_argument("--against", help="another checkout to compare with, in turns (see above)")
    parser.add_argument("--chunk", type=int, default=500, help="tasks per turn with --against (default 500)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.against:
        json.dump({**compare(args), "tasks": args.tasks, "chunk": args.chunk, "preload": args.preload,
                   "submits": args.submits, "python": platform.python_version()}, sys.stdout)
        print()
        return
    collect_as_a_node_does()
    load = Load(args.batch, args.receive_max, args.complete_max, args.submits)
    load.set_up()
    load.run(args.preload)
    if args.worker:
        serve(load)
        return
    gc.callbacks.append(load.on_gc)
    per_task_us, gc_per_task_us = [], []
    for _ in range(args.repeat):
        load.gc_s = 0.0
        per_task_us.append(load.run(args.tasks) / args.tasks * 1e6)
        gc_per_task_us.append(load.gc_s / args.tasks * 1e6)
    without_gc_us = [total - collecting for total, collecting in zip(per_task_us, gc_per_task_us, strict=True)]
    json.dump({
        "us_per_task": round(statistics.median(per_task_us), 1),
        "us_per_task_without_gc": round(statistics.median(without_gc_us), 1),
        "gc_us_per_task": round(statistics.median(gc_per_task_us), 1),
        "us_per_task_each": [round(value, 1) for value in per_task_us],
        "us_per_task_without_gc_each": [round(value, 1) for value in without_gc_us],
        "tasks": args.tasks, "preload": args.preload, "batch": args.batch, "submits": args.submits,
        "receive_max": args.receive_max, "complete_max": args.complete_max,
        "state_tasks": len(load.core.state.tasks),
        "python": platform.python_version(),
    }, sys.stdout)
    print()


if __name__ == "__main__":
    main()
