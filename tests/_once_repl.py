"""A long-lived caller of a `once` function, for the default-run tests: it keeps its SDK client (and
so its cached default run) between calls.

Prints `ready`, then for every line `call` read from stdin calls `work("acme")` and prints
`result <json>` or `error <class name> <message>`. The function appends `ran <pid> <run id>` to the
file named by RS_TEST_EFFECTS.
"""

from __future__ import annotations

import json
import os
import sys

import runstate

EFFECTS_FILE = os.environ["RS_TEST_EFFECTS"]


@runstate.once(name="repl-work")
def work(company: str) -> dict[str, object]:
    run_id = runstate.context().run_id
    with open(EFFECTS_FILE, "a") as effects:
        effects.write(f"ran {os.getpid()} {run_id}\n")
    return {"company": company, "run": run_id, "pid": os.getpid()}


def main() -> None:
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "call":
            continue
        try:
            print("result", json.dumps(work("acme"), sort_keys=True), flush=True)
        except runstate.RunstateError as exc:
            print("error", type(exc).__name__, exc, flush=True)


if __name__ == "__main__":
    main()
