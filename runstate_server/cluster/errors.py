"""The errors the replicated log raises. The node layer maps them to HTTP statuses."""

from __future__ import annotations


class NotLeader(Exception):
    """This node is not the Raft leader: forward the command to `leader_address` (None: unknown).

    The command was not applied by this node's proposal (it was never appended, or the entry was
    discarded by a new leader), so forwarding it is safe.
    """

    def __init__(self, leader_address: str | None) -> None:
        super().__init__(leader_address)
        self.leader_address = leader_address

    def __str__(self) -> str:
        return f"not the leader (leader: {self.leader_address or 'unknown'})"


class LogUnavailable(Exception):
    """The log cannot take the command now: no leader, queue full, timeout or stopped.

    The outcome of the command may be unknown (a timed-out command may still commit later), so a
    caller may only retry it if the command is idempotent (carries its key or ids).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ChangeRefused(Exception):
    """pysyncobj refused a membership change: another one is not yet committed, the leader's
    first entry is not yet applied, or the member is already in (or not in) the configuration.
    Nothing changed."""
