"""The queue both the producer and the workers of the multi-process tests import.

Environment: RS_TEST_EFFECTS (a file; the handler appends `start|done <pid> <n> <attempt>`),
RS_TEST_SLOW_S (how long a job takes), RS_TEST_LEASE, RS_TEST_CONCURRENCY.
"""

from __future__ import annotations

import os
import time

import runstate

EFFECTS_FILE = os.environ["RS_TEST_EFFECTS"]
SLOW_S = float(os.environ.get("RS_TEST_SLOW_S", "0.02"))


def record(what: str, n: int) -> None:
    with open(EFFECTS_FILE, "a") as effects:
        effects.write(f"{what} {os.getpid()} {n} {runstate.context().attempt}\n")


@runstate.queue(
    "proc-squares",
    lease=os.environ.get("RS_TEST_LEASE", "2s"),
    concurrency=int(os.environ.get("RS_TEST_CONCURRENCY", "8")),
)
def square(input: dict[str, int]) -> dict[str, int]:
    record("start", input["n"])
    time.sleep(SLOW_S)
    record("done", input["n"])
    return {"n": input["n"], "square": input["n"] ** 2}
