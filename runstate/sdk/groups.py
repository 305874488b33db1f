"""The groups of a run: `run.groups` (being built)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from runstate.sdk._http import Transport


class Groups:
    """`run.groups`: async handles."""

    def __init__(self, transport: Transport, scope_id: str) -> None:
        self._transport = transport
        self.scope_id = scope_id


class BlockingGroups:
    """`run.groups` of the blocking client."""

    def __init__(self, inner: Groups, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal
