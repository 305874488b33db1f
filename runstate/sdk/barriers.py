"""The barriers of a run: `run.barriers` (being built)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from runstate.sdk._http import Transport


class Barriers:
    """`run.barriers`: async handles."""

    def __init__(self, transport: Transport, scope_id: str) -> None:
        self._transport = transport
        self.scope_id = scope_id


class BlockingBarriers:
    """`run.barriers` of the blocking client."""

    def __init__(self, inner: Barriers, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal
