"""The ticker: turns the passing of time into `tick` commands, on the leader only.

The core never expires anything by itself. The leader watches the earliest due time in the state
(lease lapse, retry backoff, deadline, retention) and proposes a `tick` when it has passed; the
tick carries the leader's epoch, so a deposed leader's tick is refused by the state machine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runstate_server.node.server import Node

log = logging.getLogger(__name__)

IDLE_CHECK_S = 1.0  # look again at least this often, whatever the state says
RETRY_AFTER_ERROR_S = 0.2


class Ticker:
    def __init__(self, node: Node) -> None:
        self._node = node
        self._changed = asyncio.Event()

    def arm(self) -> None:
        """The earliest due time may have moved earlier, or leadership changed: look again."""
        self._changed.set()

    async def run(self) -> None:
        while True:
            self._changed.clear()
            delay_s = IDLE_CHECK_S
            if self._node.log.is_leader:
                try:  # once, as soon as every node applies it (Node.prove_levels_when_due)
                    await self._node.prove_levels_when_due()
                except Exception as error:  # not leader any more, or the log is unavailable
                    log.info("state.number_creations not applied: %s", error)
                due_ms = self._node.next_due_ms()
                if due_ms is not None:
                    delay_s = min(delay_s, (due_ms - time.time() * 1000) / 1000)
                if delay_s <= 0:
                    try:
                        await self._node.propose_system("tick", {"retention_ms": self._node.config.retention_ms})
                    except Exception as error:  # not leader any more, or the log is unavailable
                        log.info("tick not applied: %s", error)
                        await asyncio.sleep(RETRY_AFTER_ERROR_S)
                    continue
            try:
                await asyncio.wait_for(self._changed.wait(), delay_s)
            except asyncio.TimeoutError:
                pass
