"""`rs.diagnostics`: who holds what, and why something waits (the server's `ops` views).

    view = await rs.diagnostics.run(run_id)     # the run and its descendants
    for worker in view["workers"]:              # each holder: its tasks, keys, grants, reservations
        print(worker["holder"], worker["keys"], worker["earliestLeaseExpiry"])
    for entry in view["waiting"]:               # each waiting thing and what it waits for
        print(entry["kind"], entry.get("taskId"), entry.get("waitsFor"))
    waits = await rs.diagnostics.waits()        # the space's waiters on permits, allowances, budgets

Views of one moment, for people and tools: act on them through the other calls. The shapes are
the HTTP API's (docs/http-api.md, "Diagnostics"): plain dicts, times as ISO 8601 strings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runstate.sdk._http import path_segment

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from runstate.sdk._http import Transport


class Diagnostics:
    """`rs.diagnostics` (needs the coordination_read permission)."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def run(self, run_id: str) -> dict[str, Any]:
        """The run and its descendants: `workers` (each holder and what it holds, with its
        earliest lease expiry) and `waiting` (every queued task, waiter, barrier and timer, with
        what it waits for and who holds that). NotFoundError for an unknown run."""
        view: dict[str, Any] = await self._transport.request(
            "GET", f"/ops/runs/{path_segment(run_id, 'run id')}", safe=True
        )
        return view

    async def workers(self, run_id: str) -> list[dict[str, Any]]:
        """The holders of `run(run_id)`."""
        return list((await self.run(run_id))["workers"])

    async def waits(self) -> dict[str, Any]:
        """Everything of the space that waits on a resource: permit and allowance waiters in line,
        and queued jobs whose needs fall short (`{"waiting": [...], "truncated"}`)."""
        view: dict[str, Any] = await self._transport.request("GET", "/ops/waits", safe=True)
        return view


class BlockingDiagnostics:
    """`rs.diagnostics` of the blocking client (see `Diagnostics`)."""

    def __init__(self, inner: Diagnostics, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def run(self, run_id: str) -> dict[str, Any]:
        return self._portal.call(lambda: self._inner.run(run_id))

    def workers(self, run_id: str) -> list[dict[str, Any]]:
        return self._portal.call(lambda: self._inner.workers(run_id))

    def waits(self) -> dict[str, Any]:
        return self._portal.call(self._inner.waits)
