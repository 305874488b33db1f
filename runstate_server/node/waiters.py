"""Long-poll waiters: futures parked on a key until an effect of the core wakes them.

A handler registers its waiter *before* it looks at (or proposes against) the state, so a wake
that lands in between is never missed; every wait has a timeout; every key and the whole table
have a maximum, past which a wait returns at once and the client simply polls again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

WAITERS_PER_KEY_MAX = 10_000
WAITERS_TOTAL_MAX = 100_000


class Waiter:
    __slots__ = ("_registry", "key", "future")

    def __init__(self, registry: Waiters, key: Hashable, future: asyncio.Future[None]) -> None:
        self._registry = registry
        self.key = key
        self.future = future

    async def wait(self, timeout_s: float) -> bool:
        """True if woken, False on timeout. The waiter is spent either way."""
        try:
            if timeout_s <= 0:
                return self.future.done()
            await asyncio.wait_for(asyncio.shield(self.future), timeout_s)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            self.close()

    def close(self) -> None:
        self._registry._discard(self)

    def __enter__(self) -> Waiter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Waiters:
    def __init__(self) -> None:
        self._by_key: dict[Hashable, set[Waiter]] = {}
        self._total = 0

    def register(self, key: Hashable) -> Waiter:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        waiter = Waiter(self, key, future)
        waiting = self._by_key.setdefault(key, set())
        if len(waiting) >= WAITERS_PER_KEY_MAX or self._total >= WAITERS_TOTAL_MAX:
            future.set_result(None)  # over the bound: answer now, the client polls again
            return waiter
        waiting.add(waiter)
        self._total += 1
        return waiter

    def wake(self, key: Hashable) -> None:
        waiting = self._by_key.pop(key, None)
        if not waiting:
            return
        self._total -= len(waiting)
        for waiter in waiting:
            if not waiter.future.done():
                waiter.future.set_result(None)

    def wake_all(self) -> None:
        for key in list(self._by_key):
            self.wake(key)

    def _discard(self, waiter: Waiter) -> None:
        waiting = self._by_key.get(waiter.key)
        if waiting is not None and waiter in waiting:
            waiting.discard(waiter)
            self._total -= 1
            if not waiting:
                del self._by_key[waiter.key]

    def __len__(self) -> int:
        return self._total
