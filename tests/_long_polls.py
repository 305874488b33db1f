"""Long polls parked on a node, for the tests of what a stopping node does with them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from runstate_server.node.config import LONG_POLL_MS_MAX
from tests._prometheus import scrape, value

LONG_POLL_WAIT_MS = LONG_POLL_MS_MAX  # the longest a long poll waits
# A node's stop that waited out its long polls would take their 30 s: well past this.
STOP_WITH_LONG_POLLS_S = 10.0
PARKED_TIMEOUT_S = 60.0


def parked_long_polls(url: str, count: int, key: str | None = None) -> None:
    """Wait until `count` long polls are parked on the node at `url` (runstate_long_polls)."""
    deadline = time.monotonic() + PARKED_TIMEOUT_S
    while value(scrape(url, key)[0], "runstate_long_polls") < count:
        assert time.monotonic() < deadline, f"{count} long polls never parked on {url}"
        time.sleep(0.02)


def start_long_polls(
    call: Callable[..., tuple[int, Any]], polls: dict[str, tuple[str, str, Any]]
) -> tuple[list[threading.Thread], dict[str, tuple[int, Any]]]:
    """Each of `polls` (name -> method, path, body) sent by `call` in a thread of its own: the
    threads, started, and the answers by name as they come."""
    answers: dict[str, tuple[int, Any]] = {}

    def poll(name: str) -> None:
        method, path, body = polls[name]
        answers[name] = call(method, path, body)

    threads = [threading.Thread(target=poll, args=(name,)) for name in polls]
    for thread in threads:
        thread.start()
    return threads, answers
