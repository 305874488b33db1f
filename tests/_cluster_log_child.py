"""A tiny deterministic state machine for the cluster tests, and a child process that runs one log.

As a script: start a single-node ReplicatedLog on --data-dir (or in memory), print
`READY <json of the restored state>`, then propose --count commands from --workers concurrent
proposers, printing `ACK <id>` once each is acknowledged, then `DONE`. The tests kill it with
SIGKILL mid-stream and restart it on the same directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from runstate_server.cluster import LogConfig, ReplicatedLog


class RecordingMachine:
    """Records every command it applies, with the time and epoch it was applied at."""

    def __init__(self) -> None:
        self.clock_ms = 0
        self.applied: list[dict[str, Any]] = []  # {"id", "now_ms", "epoch"} per command
        self.values: dict[str, Any] = {}

    def apply(self, command: dict[str, Any], now_ms: int, epoch: int) -> tuple[Any, list[Any]]:
        assert now_ms >= self.clock_ms, "time went backwards"
        self.clock_ms = now_ms
        if command["type"] == "boom":
            raise RuntimeError("boom")
        self.applied.append({"id": command["id"], "now_ms": now_ms, "epoch": epoch})
        if command["type"] == "set":
            self.values[command["key"]] = command["value"]
        return {"id": command["id"], "position": len(self.applied)}, [("applied", command["id"])]

    def snapshot(self) -> dict[str, Any]:
        return {"v": 1, "clock_ms": self.clock_ms, "applied": list(self.applied), "values": dict(self.values)}

    def restore(self, snapshot: dict[str, Any]) -> None:
        assert snapshot["v"] == 1
        self.clock_ms = snapshot["clock_ms"]
        self.applied = list(snapshot["applied"])
        self.values = dict(snapshot["values"])


async def _main(arguments: argparse.Namespace) -> None:
    machine = RecordingMachine()
    log = ReplicatedLog(
        machine,
        self_address=f"127.0.0.1:{arguments.port}",
        data_dir=None if arguments.memory else Path(arguments.data_dir),
        password="child-password",
        config=LogConfig(log_compaction_entries_min=arguments.compaction_entries),
    )
    await log.start()
    try:
        await log.wait_ready(timeout_s=20)
        with log.lock:
            ids = [entry["id"] for entry in machine.applied]
        print("READY " + json.dumps(ids), flush=True)
        next_ids = iter(range(arguments.first_id, arguments.first_id + arguments.count))

        async def proposer() -> None:
            for command_id in next_ids:
                await log.propose({"type": "add", "id": command_id})
                print(f"ACK {command_id}", flush=True)

        await asyncio.gather(*(proposer() for _ in range(arguments.workers)))
        print("DONE", flush=True)
    finally:
        await log.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--first-id", type=int, default=0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--compaction-entries", type=int, default=5_000)
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
