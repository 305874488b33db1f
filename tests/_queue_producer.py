"""A producer process: submits `count` jobs whose inputs repeat (n = i % distinct), all at once,
then waits for every result. Prints one JSON line: {"ids": [...], "results": [...]} in input order.

argv: count, distinct.
"""

from __future__ import annotations

import asyncio
import json
import sys

from _queue_jobs import square


async def main(count: int, distinct: int) -> None:
    inputs = [{"n": index % distinct} for index in range(count)]
    jobs = await asyncio.gather(*(square.asend(item) for item in inputs))
    results = await asyncio.gather(*(job.aresult() for job in jobs))
    print(json.dumps({"ids": [job.id for job in jobs], "results": results}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
