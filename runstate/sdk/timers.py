"""The timers of a run: `run.timers` (being built)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from runstate.sdk._http import Transport


class Timers:
    """`run.timers`: async handles."""

    def __init__(self, transport: Transport, scope_id: str) -> None:
        self._transport = transport
        self.scope_id = scope_id


class BlockingTimers:
    """`run.timers` of the blocking client."""

    def __init__(self, inner: Timers, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal
