"""The barriers of a run: `run.barriers.create(target=)`, `run.barriers.by_name(name, target=)`,
`scope(id).barriers.get(id)`.

A barrier releases everyone waiting on it once `target` distinct keys have arrived. A named
barrier is the run's barrier of that name: every process that names it gets the same one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from runstate.sdk._waiting import wait_until
from runstate.sdk.errors import ConfigError

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from runstate.sdk._http import Transport

WAIT_TIMEOUT_MS_DEFAULT = 60_000


class Barriers:
    """`run.barriers`: create a barrier in this run, or get a handle on one by id."""

    def __init__(self, transport: Transport, scope_id: str) -> None:
        self._transport = transport
        self.scope_id = scope_id

    async def create(self, target: int) -> Barrier:
        """A new barrier that releases once `target` distinct keys arrived: configuration, so the
        key needs `resource_config` (ForbiddenError without it; `by_name` is a worker's call).
        ScopeCancelledError if the run stopped; ValidationError for a target out of range."""
        if isinstance(target, bool) or not isinstance(target, int) or target < 1:
            raise ConfigError(f"target must be a positive integer, got {target!r}")
        view = await self._transport.request(
            "POST", "/barriers", body={"scopeId": self.scope_id, "target": target}, safe=False
        )
        return Barrier(self._transport, view["id"], view)

    async def by_name(self, name: str, target: int) -> Barrier:
        """The run's barrier named `name`: created with `target`, or the existing one in whatever
        state it is (a released one stays released: a new key's arrive is BARRIER_RELEASED).
        ConflictError (CONFLICT) when it has another target; ScopeCancelledError when it does not
        exist yet and the run stopped."""
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name must be a non-empty string, got {name!r}")
        if isinstance(target, bool) or not isinstance(target, int) or target < 1:
            raise ConfigError(f"target must be a positive integer, got {target!r}")
        view = await self._transport.request(
            "PUT", f"/barriers/by-name/{quote(name, safe='')}", body={"scopeId": self.scope_id, "target": target},
            safe=True,
        )
        return Barrier(self._transport, view["id"], view)

    def get(self, barrier_id: str) -> Barrier:
        """A handle on barrier `barrier_id` (no request)."""
        return Barrier(self._transport, barrier_id)


class Barrier:
    """One barrier. `view` is the last state seen: `state` (WAITING, RELEASED, CANCELLED),
    `arrivals`, `target`, `epoch`."""

    def __init__(self, transport: Transport, barrier_id: str, view: dict[str, Any] | None = None) -> None:
        if not isinstance(barrier_id, str) or not barrier_id:
            raise ConfigError(f"barrier id must be a non-empty string, got {barrier_id!r}")
        self._transport = transport
        self.id = barrier_id
        self.view = view
        self._path = f"/barriers/{quote(barrier_id, safe='')}"
        # The epoch the last arrive() counted in, until a wait() saw its release.
        self._arrived_epoch: int | None = None

    def __repr__(self) -> str:
        return f"<Barrier {self.id}>"

    async def arrive(self, key: str) -> dict[str, Any]:
        """Arrive as `key` (idempotent per key: `arrived` is False for a repeat). Raises
        ConflictError with code BARRIER_RELEASED after the release, BARRIER_CANCELLED once its run
        stopped."""
        if not isinstance(key, str) or not key:
            raise ConfigError(f"key must be a non-empty string, got {key!r}")
        self.view = await self._transport.request("POST", f"{self._path}/arrive", body={"arrivalKey": key}, safe=True)
        self._arrived_epoch = self.view.get("epoch")
        return self.view

    async def status(self) -> dict[str, Any]:
        self.view = await self._transport.request("GET", self._path, safe=True)
        return self.view

    async def wait(self, timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT) -> dict[str, Any]:
        """Wait until the barrier's epoch is RELEASED and return its view (`state`, `arrivals`,
        `target`, `epoch`). The epoch is the one this handle's last `arrive` counted in, else the
        one current when the wait begins; if that epoch was released and the next one began
        meanwhile, the view describes that release and carries `currentEpoch`.
        Raises ConflictError with code BARRIER_CANCELLED if it was cancelled (its run stopped),
        WaitTimeoutError after `timeout_ms`."""
        epoch = self._arrived_epoch

        async def poll(wait_ms: int) -> dict[str, Any]:
            nonlocal epoch
            params = {"waitMs": str(wait_ms)}
            if epoch is not None:
                params["epoch"] = str(epoch)
            view: dict[str, Any] = await self._transport.request(
                "GET", f"{self._path}/wait", params=params, safe=True, long_poll_ms=wait_ms
            )
            epoch = view.get("epoch") if epoch is None else epoch  # later polls wait for the same epoch
            return view

        self.view = await wait_until(
            poll, lambda view: view.get("state") == "RELEASED", timeout_ms=timeout_ms, what=f"the release of barrier {self.id}"
        )
        self._arrived_epoch = None
        return self.view

    async def next_epoch(self) -> dict[str, Any]:
        """Reuse a RELEASED barrier: a new epoch with no arrivals. ConflictError if not released."""
        self.view = await self._transport.request("POST", f"{self._path}/nextEpoch", safe=False)
        return self.view


class BlockingBarriers:
    """`run.barriers` of the blocking client."""

    def __init__(self, inner: Barriers, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    @property
    def scope_id(self) -> str:
        return self._inner.scope_id

    def create(self, target: int) -> BlockingBarrier:
        return BlockingBarrier(self._portal.call(self._inner.create, target), self._portal)

    def by_name(self, name: str, target: int) -> BlockingBarrier:
        return BlockingBarrier(self._portal.call(self._inner.by_name, name, target), self._portal)

    def get(self, barrier_id: str) -> BlockingBarrier:
        return BlockingBarrier(self._inner.get(barrier_id), self._portal)


class BlockingBarrier:
    """One barrier, blocking calls (see `Barrier`)."""

    def __init__(self, inner: Barrier, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def view(self) -> dict[str, Any] | None:
        return self._inner.view

    def arrive(self, key: str) -> dict[str, Any]:
        return self._portal.call(self._inner.arrive, key)

    def status(self) -> dict[str, Any]:
        return self._portal.call(self._inner.status)

    def wait(self, timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT) -> dict[str, Any]:
        return self._portal.call(self._inner.wait, timeout_ms)

    def next_epoch(self) -> dict[str, Any]:
        return self._portal.call(self._inner.next_epoch)
