"""The recorded history of a chaos run: one JSON object per line, written by many client threads.

    history = History(report_dir / "history.jsonl")
    handle = history.record("worker-1", "complete", {"delivery": d, "taskId": t, "result": payload})
    handle.ok({"state": "SUCCEEDED"})      # or handle.fail(code, message) / handle.unknown(message)
    history.event("fault", {"kind": "kill", "node": "n2"})
    history.final("task", task_id, view)
    history.close()
    operations, events, finals = read_history(report_dir / "history.jsonl")

Three kinds of line (the chaos contract, chaos/README of issue 8):

- an operation `{"id", "client", "op", "call", "ret", "args", "result", "error", "status"}`,
  written once, when it ends. `call` and `ret` are `time.monotonic()` of the harness process.
  `status` is `ok` (acknowledged; `result` set), `fail` (a definite refusal: a 4xx answer with
  an error code; `error` set) or `unknown` (a timeout, a lost connection, a 503 or another 5xx:
  it may or may not have happened, now or later; `error` says why, and `ret` is null because its
  effect may land at any time after `call`).
- an event `{"event", "at", "detail"}` (faults, heals, health checks, start and stop).
- a final `{"final", "id", "view"}`: an entity's linearizable state read after the faults healed
  (`{"error": {"code", "message"}}` as the view when that read was refused for certain, e.g.
  NOT_FOUND for an entity whose creation was acknowledged).

An operation still open when the history closes (its client thread never returned) is written as
unknown, so every recorded call has exactly one line. Lines are buffered in memory (at most
`buffer_lines_max`, and for at most `flush_interval_s`) and then appended to the file by whichever
thread fills the buffer: a full buffer is flushed at once, nothing is ever dropped.
"""

from __future__ import annotations

import collections
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

STATUS_OK = "ok"
STATUS_FAIL = "fail"
STATUS_UNKNOWN = "unknown"
STATUSES = (STATUS_OK, STATUS_FAIL, STATUS_UNKNOWN)

# The error code of an operation whose client never saw an answer before the history closed.
CODE_NOT_RETURNED = "NOT_RETURNED"
CODE_UNKNOWN = "UNKNOWN"

BUFFER_LINES_MAX = 1_000
FLUSH_INTERVAL_S = 0.5
# Error messages kept in a line (a server's message or an exception's text).
MESSAGE_CHARS_MAX = 500

OPERATION_KEYS = ("id", "client", "op", "call", "ret", "args", "result", "error", "status")


def _encode(line: dict[str, Any]) -> str:
    return json.dumps(line, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class Operation:
    """One recorded call, open until `ok`, `fail` or `unknown` ends it. The first ending counts;
    a later one (a client answering after the history gave up on it) returns False and writes
    nothing."""

    __slots__ = ("id", "client", "op", "args", "call", "_history", "_ended")

    def __init__(self, history: History, op_id: int, client: str, op: str, args: dict[str, Any], call: float) -> None:
        self.id = op_id
        self.client = client
        self.op = op
        self.args = args
        self.call = call
        self._history = history
        self._ended = False

    @property
    def ended(self) -> bool:
        return self._ended

    def ok(self, result: dict[str, Any] | None = None) -> bool:
        """Acknowledged by the server, with what the client learned (`{}` when nothing)."""
        return self._history._end(self, STATUS_OK, result if result is not None else {}, None)

    def fail(self, code: str, message: str) -> bool:
        """Refused by the server for certain: nothing happened (a 4xx answer with an error code)."""
        return self._history._end(self, STATUS_FAIL, None, {"code": code, "message": message[:MESSAGE_CHARS_MAX]})

    def unknown(self, message: str, code: str = CODE_UNKNOWN) -> bool:
        """No definite answer: it may have happened, then or at any later time."""
        return self._history._end(self, STATUS_UNKNOWN, None, {"code": code, "message": message[:MESSAGE_CHARS_MAX]})

    def __repr__(self) -> str:
        return f"Operation(id={self.id}, client={self.client!r}, op={self.op!r}, ended={self._ended})"


class History:
    """A thread-safe JSON Lines writer of operations, events and finals (module docstring)."""

    def __init__(
        self,
        path: str | Path,
        *,
        buffer_lines_max: int = BUFFER_LINES_MAX,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if buffer_lines_max < 1:
            raise ValueError(f"buffer_lines_max must be at least 1, got {buffer_lines_max}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.buffer_lines_max = buffer_lines_max
        self.flush_interval_s = flush_interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._buffer: collections.deque[str] = collections.deque()
        self._last_flush = clock()
        self._next_id = 1
        self._open: dict[int, Operation] = {}
        self._counts: collections.Counter[tuple[str, str]] = collections.Counter()
        self._closing = False  # no new operation from now on
        self._closed = False

    # -- writing ---------------------------------------------------------------------------------

    def record(self, client: str, op: str, args: dict[str, Any]) -> Operation:
        """Start an operation now (its `call` time); end it with the handle's ok/fail/unknown."""
        _encode(args)  # fail here, in the caller, if the arguments are not JSON
        with self._lock:
            if self._closing:
                raise RuntimeError(f"the history {self.path} is closed")
            operation = Operation(self, self._next_id, client, op, args, self.clock())
            self._next_id += 1
            self._open[operation.id] = operation
            return operation

    def _end(self, operation: Operation, status: str, result: dict[str, Any] | None, error: dict[str, str] | None) -> bool:
        ret = self.clock()
        line = {
            "id": operation.id,
            "client": operation.client,
            "op": operation.op,
            "call": operation.call,
            "ret": None if status == STATUS_UNKNOWN else ret,
            "args": operation.args,
            "result": result,
            "error": error,
            "status": status,
        }
        text = _encode(line)
        with self._lock:
            if operation._ended or self._closed:
                return False
            operation._ended = True
            del self._open[operation.id]
            self._counts[(operation.op, status)] += 1
            self._append(text)
        return True

    def event(self, kind: str, detail: dict[str, Any] | None = None) -> None:
        """A point in time of the run (a fault, a heal, a health check, start, stop)."""
        text = _encode({"event": kind, "at": self.clock(), "detail": detail if detail is not None else {}})
        with self._lock:
            self._append(text)

    def final(self, kind: str, entity_id: str, view: dict[str, Any]) -> None:
        """An entity's state as read (linearizably) after the faults healed; when that read was
        refused for certain, the view is `{"error": {"code", "message"}}` (an object, where a
        task's own `error` is a string)."""
        text = _encode({"final": kind, "id": entity_id, "view": view})
        with self._lock:
            self._append(text)

    def _append(self, text: str) -> None:
        """Under the lock."""
        if self._closed:
            raise RuntimeError(f"the history {self.path} is closed")
        self._buffer.append(text)
        if len(self._buffer) >= self.buffer_lines_max or self.clock() - self._last_flush >= self.flush_interval_s:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._buffer:
            self._file.write("".join(line + "\n" for line in self._buffer))
            self._buffer.clear()
        self._file.flush()
        self._last_flush = self.clock()

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                self._flush_locked()

    def close_open(self, message: str, code: str = CODE_NOT_RETURNED) -> int:
        """Write every operation still open as unknown (its client is gone or gave up); returns
        how many. A later answer to one of them is ignored."""
        with self._lock:
            still_open = list(self._open.values())
        return sum(1 for operation in still_open if operation.unknown(message, code))

    def close(self) -> None:
        """Write the open operations as unknown, flush, close the file. Idempotent."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self.close_open("the history closed before this call returned")
        with self._lock:
            self._flush_locked()
            self._closed = True
            self._file.close()

    def __enter__(self) -> History:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # -- what was written ------------------------------------------------------------------------

    @property
    def open_count(self) -> int:
        with self._lock:
            return len(self._open)

    def counts(self) -> dict[str, dict[str, int]]:
        """How many operations ended so far: `{op: {status: count}}`."""
        with self._lock:
            items = list(self._counts.items())
        counts: dict[str, dict[str, int]] = {}
        for (op, status), count in sorted(items):
            counts.setdefault(op, {})[status] = count
        return counts

    def __repr__(self) -> str:
        ended = sum(count for by_status in self.counts().values() for count in by_status.values())
        return f"History(path={str(self.path)!r}, ended={ended}, open={self.open_count})"


class HistoryLines(NamedTuple):
    """A history file, parsed: operations by id (the order of their calls), events and finals in
    the order they were written."""

    operations: list[dict[str, Any]]
    events: list[dict[str, Any]]
    finals: list[dict[str, Any]]


def _check_operation(line: dict[str, Any], where: str) -> None:
    missing = [key for key in OPERATION_KEYS if key not in line]
    if missing:
        raise ValueError(f"{where}: an operation without {missing}")
    if line["status"] not in STATUSES:
        raise ValueError(f"{where}: unknown status {line['status']!r}")
    if not isinstance(line["id"], int) or not isinstance(line["call"], (int, float)):
        raise ValueError(f"{where}: id and call must be numbers")
    if line["status"] == STATUS_OK and not isinstance(line["result"], dict):
        raise ValueError(f"{where}: an ok operation without a result object")
    if line["status"] != STATUS_OK and not isinstance(line["error"], dict):
        raise ValueError(f"{where}: a {line['status']} operation without an error object")


def _lines(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, whether it ended with a newline)."""
    with open(path, encoding="utf-8") as file:
        for number, text in enumerate(file, start=1):
            yield number, text, text.endswith("\n")


def read_history(path: str | Path) -> HistoryLines:
    """Parse a history file. A last line cut short (the harness died while writing it) is skipped;
    any other line that is not one of the three kinds raises ValueError naming the line."""
    path = Path(path)
    operations: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    finals: list[dict[str, Any]] = []
    for number, text, complete in _lines(path):
        where = f"{path}:{number}"
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError as error:
            if not complete:
                break  # a torn last line
            raise ValueError(f"{where}: not JSON ({error})") from None
        if not isinstance(line, dict):
            raise ValueError(f"{where}: not a JSON object")
        if "op" in line:
            _check_operation(line, where)
            operations.append(line)
        elif "event" in line:
            events.append(line)
        elif "final" in line:
            finals.append(line)
        else:
            raise ValueError(f"{where}: neither an operation, an event nor a final")
    operations.sort(key=lambda operation: operation["id"])
    return HistoryLines(operations, events, finals)
