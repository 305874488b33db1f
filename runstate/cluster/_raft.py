"""The thin pysyncobj subclass: one @replicated method taking one bytes batch, nothing else.

Everything it needs arrives as `bridge` (the ReplicatedLog), set BEFORE SyncObj.__init__ so that
pysyncobj counts it among its own properties and never serializes it.
"""

from __future__ import annotations

import contextlib
import os
import queue
from collections.abc import Sequence
from typing import Any, Protocol

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated


class Bridge(Protocol):
    def apply_batch(self, batch: bytes) -> list[Any]: ...


class RaftNode(SyncObj):  # type: ignore[misc]
    def __init__(self, bridge: Bridge, self_address: str, peer_addresses: Sequence[str], conf: SyncObjConf):
        self._bridge = bridge
        try:
            # autoTick=False: binds the port here, synchronously.
            super().__init__(self_address, list(peer_addresses), conf)
        except BaseException:
            self.destroy_transport()
            self.close_pipe()
            raise

    @replicated
    def apply_batch(self, batch: bytes) -> list[Any]:
        return self._bridge.apply_batch(batch)

    def _checkCommandsToApply(self) -> None:
        # pysyncobj forwards a queued command to the leader when this node is not the leader; ours
        # must never be forwarded (the node layer forwards over HTTP and knows the outcome), so a
        # command queued just before this node lost leadership fails with NOT_LEADER instead.
        if not self._isLeader():
            self._reject_queued_commands()
        super()._checkCommandsToApply()

    def _reject_queued_commands(self) -> None:
        commands = self._SyncObj__commandsQueue
        while True:
            try:
                _, callback = commands.get_nowait()
            except queue.Empty:
                return
            self._SyncObj__callErrCallback(FAIL_REASON.NOT_LEADER, callback)

    # pysyncobj internals we read (single ints/objects: safe to read from another thread). Plain
    # methods, not properties: SyncObj.__init__ getattr()s every name in dir(self).

    def raft_state(self) -> int:
        return int(self._SyncObj__raftState)

    def noop_index(self) -> int | None:
        """Index of the no-op entry this node appended when it last became leader."""
        return self._SyncObj__noopIDx  # type: ignore[no-any-return]

    def leader_commit_index(self) -> int | None:
        return self._SyncObj__leaderCommitIndex  # type: ignore[no-any-return]

    def get_journal(self) -> Any:
        return self._SyncObj__raftLog

    def set_journal(self, journal: Any) -> None:
        self._SyncObj__raftLog = journal

    def destroy_transport(self) -> None:
        transport = getattr(self, "_SyncObj__transport", None)
        if transport is not None:
            with contextlib.suppress(Exception):
                transport.destroy()

    def close_pipe(self) -> None:
        """Close the notifier's pipe, which pysyncobj's destroy leaves open."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is None:
            return
        for name in ("_PipeNotifier__pipeR", "_PipeNotifier__pipeW"):
            fd = getattr(notifier, name, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
                setattr(notifier, name, None)

    def wake(self) -> None:
        """Wake the tick thread's poll (used by stop)."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            with contextlib.suppress(OSError, TypeError):
                notifier.notify()
