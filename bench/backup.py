"""Backup and restore at scale: `runstate backup`'s duration and size, the longest write stall it
caused on the node it read from, and `runstate restore`'s duration.

    python -m bench.backup --tasks 100000
    python -m bench.backup --tasks 1000000

Starts a `runstate dev` node (fsync never: filling it is not what is measured), fills it with
`--tasks` small tasks (POST /tasks/batch), then, while one client writes sequentially (POST
/tasks, one at a time) and records each write's latency, runs `runstate backup` against the node,
and after it `runstate restore` into a fresh dir. Prints numbers; asserts nothing on time. The
stall is the longest write latency while the backup ran, beside the longest and the p99 before it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from runstate_server.actors import limits
from tests._nodes import DevNode

BATCH_TASKS = 100  # tasks per POST /tasks/batch while filling (limits.submit_batch_max)
FILL_THREADS = 4
WRITES_SPACE = "bench-writes"  # the measured writes' space
BASELINE_S = 3.0  # sequential writes measured before the backup
REQUEST_TIMEOUT_S = 60.0
CLI_TIMEOUT_S = 1800.0
STALLS_SHOWN = 5  # the longest writes during the backup, with when they started


def post(url: str, path: str, body: Any) -> Any:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as answer:
        return json.loads(answer.read())


def fill(url: str, tasks: int) -> tuple[str, str]:
    space = "/v1/spaces/default"
    # A run holds at most limits.tasks_per_run_max tasks: one run per that many.
    runs = [post(url, space + "/scopes", {})["id"] for _ in range(0, tasks, limits.tasks_per_run_max)]
    mailbox = post(url, space + "/mailboxes", {"name": "bench"})["id"]

    def batch(start: int) -> None:
        size = min(BATCH_TASKS, tasks - start)
        run = runs[start // limits.tasks_per_run_max]
        post(url, space + "/tasks/batch", {"tasks": [
            {"scopeId": run, "mailboxId": mailbox, "input": {"n": start + i}} for i in range(size)
        ]})

    with ThreadPoolExecutor(FILL_THREADS) as pool:
        list(pool.map(batch, range(0, tasks, BATCH_TASKS)))
    # The measured writes go to a space of their own (the filled one is at its limits on tasks),
    # which must exist before it is used.
    post(url, "/v1/spaces", {"id": WRITES_SPACE})
    writes_space = f"/v1/spaces/{WRITES_SPACE}"
    return post(url, writes_space + "/scopes", {})["id"], post(url, writes_space + "/mailboxes", {"name": "writes"})["id"]


def writes(url: str, run: str, mailbox: str, stop: threading.Event, latencies: list[tuple[float, float]]) -> None:
    """Sequential writes until `stop`: (start, seconds) each."""
    while not stop.is_set():
        started = time.monotonic()
        post(url, f"/v1/spaces/{WRITES_SPACE}/tasks", {"scopeId": run, "mailboxId": mailbox, "input": {"w": len(latencies)}})
        latencies.append((started, time.monotonic() - started))


def _logged_at(log: str, text: str) -> list[float]:
    """The wall-clock times (local time, as the node logs them) of the log lines holding `text`."""
    moments = []
    for line in log.splitlines():
        if text in line and (match := re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)):
            moments.append(time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")) + int(match.group(2)) / 1000)
    return moments


def runstate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runstate_server.node.cli", *args], capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.backup", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000, help="small tasks in the state (default 100000)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-backup-"))
    node = DevNode(root / "node", "--fsync", "never", "--log-level", "info")  # info: the fork's hold of the state
    try:
        node.start()
        started = time.monotonic()
        run, mailbox = fill(node.url, args.tasks)
        print(f"filled {args.tasks:,} tasks in {time.monotonic() - started:.1f} s", flush=True)
        stop = threading.Event()
        latencies: list[tuple[float, float]] = []
        writer = threading.Thread(target=writes, args=(node.url, run, mailbox, stop, latencies), daemon=True)
        writer.start()
        time.sleep(BASELINE_S)
        backup_start = time.monotonic()
        out = root / "bench.backup"
        runstate("backup", "--out", str(out), "--url", node.url)
        backup_end = time.monotonic()
        time.sleep(0.5)
        stop.set()
        writer.join(REQUEST_TIMEOUT_S)
        before = sorted(seconds for at, seconds in latencies if at < backup_start)
        during = [seconds for at, seconds in latencies if backup_start <= at <= backup_end]
        restore_start = time.monotonic()
        runstate("restore", str(out), "--data-dir", str(root / "restored"))
        restore_s = time.monotonic() - restore_start
        p99 = before[int(len(before) * 0.99)] if before else 0.0
        print(f"tasks                 {args.tasks:,}")
        print(f"backup                {backup_end - backup_start:.2f} s (the CLI: fork, write, stream, verify)")
        print(f"backup size           {out.stat().st_size / 1e6:.1f} MB")
        print(f"writes before         {len(before)}: p99 {p99 * 1000:.1f} ms, max {max(before, default=0) * 1000:.1f} ms")
        print(f"writes during backup  {len(during)}: max {max(during, default=0) * 1000:.1f} ms (the longest stall)")
        longest = sorted(((seconds, at) for at, seconds in latencies if backup_start <= at <= backup_end), reverse=True)
        print("longest writes        " + ", ".join(
            f"{seconds * 1000:.0f} ms at +{at - backup_start:.2f} s" for seconds, at in longest[:STALLS_SHOWN]))
        print(f"restore               {restore_s:.2f} s (read, verify, load-check, write)")
        wall = time.time() - time.monotonic()  # monotonic -> wall clock
        dumps = [moment - wall - backup_start for moment in _logged_at(node.log(), "Raft dump of")
                 if backup_start <= moment - wall <= backup_end]
        print(f"own Raft dumps        {len(dumps)} finished during the backup, at "
              + (", ".join(f"+{offset:.2f} s" for offset in dumps) or "-")
              + " (a dump's end compacts the journal: compare with the longest writes)")
        held = re.findall(r"the state held ([0-9.]+) s", node.log())
        print(f"state held for fork   {float(held[-1]) * 1000:.1f} ms (writes wait this long; the rest of a stall is "
              "the machine: the child, the CLI and the node share its cores)" if held else "state held for fork   ?")
    finally:
        node.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
