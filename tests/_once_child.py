"""One caller of a `once` function, for the multi-process tests.

argv: start file, effects file, mode (plain | hang-first | slow-first), lease. Prints `ready`,
waits for the start file (all callers start at one moment), calls `work("acme")` and prints
`result <json>` or `error <class name> <message>`. The function appends `start <pid> <attempt>`
and `done <pid> <attempt>` to the effects file (one write each, atomic with O_APPEND).
"""

from __future__ import annotations

import json
import os
import sys
import time

import runstate

START_FILE, EFFECTS_FILE, MODE, LEASE = sys.argv[1:5]
POLL_S = 0.01


def record(line: str) -> None:
    with open(EFFECTS_FILE, "a") as effects:
        effects.write(f"{line} {os.getpid()} {runstate.context().attempt}\n")


@runstate.once(name="proc-work", lease=LEASE, attempts=5)
def work(company: str) -> dict[str, object]:
    context = runstate.context()
    record("start")
    if context.attempt == 1 and MODE == "hang-first":
        time.sleep(3600)  # killed with kill -9 meanwhile
    if context.attempt == 1 and MODE == "slow-first":
        # Frozen (SIGSTOP) past its lease meanwhile; after SIGCONT a refused renewal sets the signal.
        while not context.signal.is_set():
            time.sleep(POLL_S)
        record("signal")
        return {"company": company, "attempt": context.attempt, "pid": os.getpid()}
    time.sleep(0.3)  # long enough that the other callers are waiting
    record("done")
    return {"company": company, "attempt": context.attempt, "pid": os.getpid()}


def main() -> None:
    print("ready", flush=True)
    while not os.path.exists(START_FILE):
        time.sleep(POLL_S)
    try:
        print("result", json.dumps(work("acme"), sort_keys=True), flush=True)
    except runstate.RunstateError as exc:
        print("error", type(exc).__name__, exc, flush=True)


if __name__ == "__main__":
    main()
