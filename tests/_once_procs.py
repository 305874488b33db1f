"""Helpers of the multi-process SDK tests: Python children with piped output, an effects file that
children append to, bounded waits (a failure, never a timing assertion)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

HERE = Path(__file__).parent
WAIT_S = 90.0  # bound of every wait for progress
POLL_S = 0.02


def sdk_env(base_url: str, scope_id: str | None, **extra: str) -> dict[str, str]:
    env = {**os.environ, "RUNSTATE_BASE_URL": base_url, "PYTHONUNBUFFERED": "1"}
    for name in ("RUNSTATE_SPACE_ID", "RUNSTATE_API_KEY", "RUNSTATE_SCOPE_ID"):
        env.pop(name, None)
    env.update(extra)
    if scope_id is not None:
        env["RUNSTATE_SCOPE_ID"] = scope_id
    return env


class Children:
    """Python children started from tests/; every one is killed and reaped at the end."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[str]] = []

    def spawn(self, script: str, *args: str, env: dict[str, str]) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, str(HERE / script), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        self.processes.append(process)
        return process

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(OSError):
                    process.send_signal(signal.SIGCONT)
                    process.kill()
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(WAIT_S)
            if process.stdout is not None:
                process.stdout.close()


@contextlib.contextmanager
def children() -> Iterator[Children]:
    made = Children()
    try:
        yield made
    finally:
        made.close()


def read_line(process: subprocess.Popen[str], prefix: str) -> str:
    """The first line of the child's output starting with `prefix` (earlier lines are dropped)."""
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        if line.startswith(prefix):
            return line.rstrip("\n")
        seen.append(line)
    raise AssertionError(f"the child exited ({process.wait()}) without printing {prefix!r}: {''.join(seen)[-3000:]}")


def output(process: subprocess.Popen[str]) -> str:
    """Everything the child prints until it exits (bounded)."""
    assert process.stdout is not None
    text = process.stdout.read()
    process.wait(WAIT_S)
    return text


def wait_until(what: str, condition: Callable[[], bool], describe: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {WAIT_S} s; {describe()}")
        time.sleep(POLL_S)


def lines(path: Path) -> list[list[str]]:
    try:
        return [line.split() for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []
