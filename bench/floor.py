"""This machine's floors under the submit latency targets; prints one JSON object.

    python -m bench.floor                  # a round trip, and a round trip with one fdatasync
    python -m bench.floor --cluster        # also the least a three-node write can take

What no server of this design can beat on this machine, measured with `bench.latency`'s raw client
(one keep-alive connection, one request outstanding, the same submit body) against servers that do
nothing else: each a bare asyncio protocol (HTTP/1.1: the head, a Content-Length body, a constant
201 answer), in a process of its own, as a node is.

- `round_trip_ms`: the server answers at once.
- `with_fdatasync_ms`: the server first writes the body to a journal file (pwrite of the entry and
  of the file's end offset, as the Raft journal does) and fdatasyncs it, on its event loop.
- `aiohttp_round_trip_ms` and `aiohttp_with_fdatasync_ms`: the same two, from an aiohttp server
  (the node's HTTP framework, the release it pins) instead: one route at the submit's path whose
  handler reads the body, appends it to the journal as above (the second), and answers a constant
  with `web.json_response`; no middleware, no authentication, no parsing of the body.
- `cluster_ms` (`--cluster`): a leader and two followers, each a process with its own journal: the
  leader sends the body to both followers over TCP, then writes and syncs its own copy; each
  follower writes and syncs it and acknowledges; the leader answers once its own sync and one
  follower's acknowledgement are in (a majority of three): the replication a Raft write needs and
  nothing else (no terms, no indexes, no encryption).

Each is p50/p90/p99/max in ms over `--requests` after `--warmup`; `--gap-ms N` idles N ms before
each counted request (a disk's sync is slower when syncs come apart: docs/performance.md). The
targets the issue names are printed beside them (`targets_ms`). Ports are free ones on 127.0.0.1;
the journals live in a temporary directory, removed at the end with the processes.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import select
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.latency import RawClient, add_pacing_options, check_pacing_options, summary, timed

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
TARGETS_MS = {"dev_submit_p50": 0.5, "cluster_submit_p50": 1.5}
# The journal grows by doubling from this size, as the Raft journal's file does.
JOURNAL_BYTES_MIN = 1024
ANSWER_JSON = {"id": "tsk_floor", "state": "PENDING"}
ANSWER_BODY = json.dumps(ANSWER_JSON, separators=(",", ":")).encode()
SUBMIT_PATH = "/v1/spaces/default/tasks"
ANSWER = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(ANSWER_BODY), ANSWER_BODY,
)
HEAD_END = b"\r\n\r\n"
FRAME = struct.Struct(">I")  # a replicated entry's length, before its bytes
ACK = b"k"


class Journal:
    """Entries appended after an 8-byte end offset at the start of the file, each write synced."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        self._size = JOURNAL_BYTES_MIN
        os.ftruncate(self._fd, self._size)
        self._end = 8

    def append(self, entry: bytes) -> None:
        end = self._end + FRAME.size + len(entry)
        while end > self._size:
            self._size *= 2
            os.ftruncate(self._fd, self._size)
        os.pwrite(self._fd, FRAME.pack(len(entry)) + entry, self._end)
        os.pwrite(self._fd, end.to_bytes(8, "little"), 0)
        self._end = end
        os.fdatasync(self._fd)


class _Buffered(asyncio.Protocol):
    """A connection whose bytes gather in `_buffer` until a whole message is there."""

    def __init__(self) -> None:
        self._buffer = b""
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport


class HttpFloor(_Buffered):
    """Answers each request with ANSWER, after `on_body(body)` (None: at once) has finished."""

    def __init__(self, on_body: Any) -> None:
        super().__init__()
        self._on_body = on_body

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while True:
            end = self._buffer.find(HEAD_END)
            if end < 0:
                return
            length = 0
            for line in self._buffer[:end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self._buffer) < end + len(HEAD_END) + length:
                return
            body = self._buffer[end + len(HEAD_END):end + len(HEAD_END) + length]
            self._buffer = self._buffer[end + len(HEAD_END) + length:]
            if self._on_body is None:
                self._answer()
            else:
                self._on_body(body, self._answer)

    def _answer(self) -> None:
        assert self._transport is not None
        self._transport.write(ANSWER)


class Follower(_Buffered):
    """Appends each entry the leader sends to its journal, then acknowledges it."""

    def __init__(self, journal: Journal) -> None:
        super().__init__()
        self._journal = journal

    def data_received(self, data: bytes) -> None:
        assert self._transport is not None
        self._buffer += data
        while len(self._buffer) >= FRAME.size:
            (length,) = FRAME.unpack_from(self._buffer)
            if len(self._buffer) < FRAME.size + length:
                return
            self._journal.append(self._buffer[FRAME.size:FRAME.size + length])
            self._buffer = self._buffer[FRAME.size + length:]
            self._transport.write(ACK)


class Replicas(asyncio.Protocol):
    """The leader's connection to one follower: the acknowledgements come back in order."""

    def __init__(self, acknowledged: Any) -> None:
        self._acknowledged = acknowledged

    def data_received(self, data: bytes) -> None:
        for _ in range(len(data)):
            self._acknowledged()


async def serve_aiohttp(journal: Journal | None) -> None:
    """The floor of the node's HTTP framework: one route at the submit's path, nothing else."""
    async def submit(request: web.Request) -> web.Response:
        body = await request.read()
        if journal is not None:
            journal.append(body)
        return web.json_response(ANSWER_JSON, status=201)

    app = web.Application()
    app.router.add_post(SUBMIT_PATH, submit)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    await web.SockSite(runner, listener).start()
    print(listener.getsockname()[1], flush=True)
    try:
        await asyncio.Event().wait()  # until the bench terminates the process
    finally:
        await runner.cleanup()


async def serve(role: str, journal_path: Path | None, follower_ports: list[int]) -> None:
    loop = asyncio.get_running_loop()
    journal = Journal(journal_path) if journal_path is not None else None
    if role == "aiohttp":
        await serve_aiohttp(journal)
        return
    if role == "follower":
        assert journal is not None
        server = await loop.create_server(lambda: Follower(journal), "127.0.0.1", 0)
    else:
        on_body: Any = None
        if journal is not None and not follower_ports:
            def on_body(body: bytes, answer: Any) -> None:
                journal.append(body)
                answer()
        elif journal is not None:
            waiting: list[Any] = []  # answers waiting for a follower's acknowledgement, in order
            acknowledgements = [0] * len(follower_ports)
            senders = []
            for index, port in enumerate(follower_ports):
                def acknowledged(index: int = index) -> None:
                    acknowledgements[index] += 1
                    # The first acknowledgement of an entry makes a majority with the leader's own copy.
                    if acknowledgements[index] > max(acknowledgements[:index] + acknowledgements[index + 1:], default=0):
                        waiting.pop(0)()
                transport, _ = await loop.create_connection(functools.partial(Replicas, acknowledged), "127.0.0.1", port)
                senders.append(transport)

            def on_body(body: bytes, answer: Any) -> None:
                frame = FRAME.pack(len(body)) + body
                for sender in senders:
                    sender.write(frame)
                journal.append(body)  # synced while the followers sync theirs
                waiting.append(answer)
        server = await loop.create_server(lambda: HttpFloor(on_body), "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()  # until the bench terminates the process


def start(role: str, journal_path: Path | None, follower_ports: list[int] | None = None) -> tuple[subprocess.Popen[str], int]:
    command = [sys.executable, "-m", "bench.floor", "--serve", role]
    if journal_path is not None:
        command += ["--journal", str(journal_path)]
    for port in follower_ports or []:
        command += ["--follower-port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], START_TIMEOUT_S)
    line = process.stdout.readline() if ready else ""  # its port, once it listens
    if not line.strip().isdigit():
        process.kill()
        process.wait()
        raise RuntimeError(f"the {role} floor server did not start within {START_TIMEOUT_S} s (printed {line!r})")
    return process, int(line)


def submits(port: int, requests: int, warmup: int, gap_s: float) -> dict[str, float]:
    client = RawClient(f"http://127.0.0.1:{port}", None)
    try:
        def submit(index: int) -> None:
            body = {"scopeId": "run_floor", "mailboxId": "mbx_floor", "input": {"n": index}, "taskKey": f"task-{index}"}
            client.call(SUBMIT_PATH, body, expect=201)

        for index in range(warmup):
            submit(index)
        return summary(timed(submit, range(warmup, warmup + requests), gap_s))
    finally:
        client.close()


def bench(args: argparse.Namespace) -> dict[str, Any]:
    gap_s = args.gap_ms / 1000
    report: dict[str, Any] = {
        "benchmark": "latency_floor", "requests": args.requests, "gap_ms": args.gap_ms, "cpus": os.cpu_count(),
        "python": sys.version.split()[0], "targets_ms": TARGETS_MS,
    }
    processes: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="runstate-floor-") as scratch:
        try:
            phases: list[tuple[str, str, Path | None]] = [
                ("round_trip_ms", "leader", None), ("with_fdatasync_ms", "leader", Path(scratch) / "dev"),
                ("aiohttp_round_trip_ms", "aiohttp", None), ("aiohttp_with_fdatasync_ms", "aiohttp", Path(scratch) / "aiohttp"),
            ]
            for name, role, journal in phases:
                process, port = start(role, journal)
                processes.append(process)
                report[name] = submits(port, args.requests, args.warmup, gap_s)
            if args.cluster:
                follower_ports = []
                for index in (1, 2):
                    process, port = start("follower", Path(scratch) / f"follower-{index}")
                    processes.append(process)
                    follower_ports.append(port)
                process, port = start("leader", Path(scratch) / "leader", follower_ports)
                processes.append(process)
                report["cluster_ms"] = submits(port, args.requests, args.warmup, gap_s)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__.split("\n")[0])
    add_pacing_options(parser)
    parser.add_argument("--cluster", action="store_true", help="also the three-process replication floor")
    parser.add_argument("--serve", choices=("leader", "follower", "aiohttp"), help=argparse.SUPPRESS)  # a floor server process
    parser.add_argument("--journal", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--follower-port", type=int, action="append", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args.serve, args.journal, args.follower_port))
        return 0
    check_pacing_options(parser, args)
    print(json.dumps(bench(args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
