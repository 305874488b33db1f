"""Task groups: `run.groups.create(...)`, `run.groups.by_id(id)`.

A group decides once, under races, whether a set of member tasks is done (FIRST_ACCEPTED,
N_ACCEPTED with a threshold, ALL_TERMINAL) and stops its work in the same step. Members are tasks
of the group's own run (`(await group.status())["scopeId"]`), a child of `parent_scope_id` when
given: workers serving that parent run receive them (admit with includeDescendants), others attach
to the group's run. The calls are the published protocol's `/task-groups` routes.

    group = await run.groups.create(mailbox="reviews", condition="N_ACCEPTED", threshold=5,
                                    parent_scope_id=run.id)
    ticket = await group.submit({"draft": 1}, key="draft-1")
    await group.close()
    await group.accept(ticket.id)
    decision = await group.wait(timeout_ms=600_000)   # decision["outcome"], decision["outcomeReason"]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runstate.sdk._http import path_segment
from runstate.sdk._time import format_deadline
from runstate.sdk._waiting import wait_until
from runstate.sdk.errors import ConfigError

if TYPE_CHECKING:
    from datetime import datetime, timedelta

    from anyio.from_thread import BlockingPortal

    from runstate.sdk import client, sync
    from runstate.sdk._http import Transport

CONDITIONS = ("FIRST_ACCEPTED", "N_ACCEPTED", "ALL_TERMINAL")
GROUP_MEMBERS_MAX = 100  # the server's bound on members, threshold and expected_members
WAIT_TIMEOUT_MS_DEFAULT = 60_000


def _count(value: int | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= GROUP_MEMBERS_MAX:
        raise ConfigError(f"{what} must be an integer from 1 to {GROUP_MEMBERS_MAX}, got {value!r}")
    return value


def _task_id(task: Any) -> str:
    """A task id, from the id itself or from a ticket (anything with `.id`)."""
    task_id = task if isinstance(task, str) else getattr(task, "id", None)
    if not isinstance(task_id, str) or not task_id:
        raise ConfigError(f"task must be a task id or a ticket, got {task!r}")
    return task_id


class Groups:
    """`run.groups`: create a task group from this run, or re-attach to one by id."""

    def __init__(self, transport: Transport, scope_id: str) -> None:
        self._transport = transport
        self.scope_id = scope_id

    async def create(
        self,
        mailbox: str,
        condition: str,
        threshold: int | None = None,
        expected_members: int | None = None,
        deadline: datetime | timedelta | str | None = None,
        parent_scope_id: str | None = None,
    ) -> Group:
        """Create a group; returns its `Group` (`.view` holds the server's view, `.scope_id` its run).

        `condition` is FIRST_ACCEPTED, N_ACCEPTED (needs `threshold`, 1 to 100) or ALL_TERMINAL.
        `expected_members` (1 to 100, at least `threshold`) closes the group when that many joined.
        `deadline` (a datetime, a timedelta from now or an ISO 8601 string) finalizes it with
        FAILURE if undecided by then. With `parent_scope_id` the group's run is a child of that run,
        so cancelling it also finalizes the group. Raises NotFoundError if the mailbox or a run
        does not exist, ScopeCancelledError if this run or the parent stopped, ValidationError /
        ConfigError for bad arguments.
        """
        if condition not in CONDITIONS:
            raise ConfigError(f"condition must be one of {', '.join(CONDITIONS)}, got {condition!r}")
        from runstate.sdk.client import mailbox_id

        path_segment(mailbox, "mailbox")
        # scopeId: the run the group is created from, which must be active (an extension field).
        body: dict[str, Any] = {"mailboxId": None, "condition": condition, "scopeId": self.scope_id}
        optional = {
            "threshold": _count(threshold, "threshold"),
            "expectedMembers": _count(expected_members, "expected_members"),
            "deadline": format_deadline(deadline),
            "parentScopeId": parent_scope_id,
        }
        body.update({name: value for name, value in optional.items() if value is not None})
        body["mailboxId"] = await mailbox_id(self._transport, mailbox)
        # Not repeated blindly: a lost answer might hide a group that was created.
        view = await self._transport.request("POST", "/task-groups", body=body, safe=False)
        return Group(self._transport, view["groupId"], view)

    def by_id(self, group_id: str) -> Group:
        """A handle on group `group_id`, e.g. after a restart (no request)."""
        return Group(self._transport, group_id)


class Group:
    """One task group. `view` is the last group view seen (None until a call fetched one):
    `state` (OPEN, SEALED, FINALIZED), `outcome`, `outcomeReason`, `scopeId`, `members` (each with
    its `verdict` and `verdictBy`), ..."""

    def __init__(self, transport: Transport, group_id: str, view: dict[str, Any] | None = None) -> None:
        self._path = f"/task-groups/{path_segment(group_id, 'group id')}"
        self._transport = transport
        self.id = group_id
        self.view = view

    def __repr__(self) -> str:
        state = f" {self.view.get('state')}" if self.view else ""
        return f"<Group {self.id}{state}>"

    @property
    def scope_id(self) -> str | None:
        """The group's own run (where workers take its members), once a view was fetched."""
        return self.view.get("scopeId") if self.view else None

    async def submit(
        self, input: Any, key: str | None = None, attempts: int | None = None,
        deadline: datetime | timedelta | str | None = None,
    ) -> client.Ticket:
        """Submit a member task; returns its `Ticket` (`.created` is False for an existing member).
        Without a key the key is the input's hash; `deadline` (a datetime, a timedelta from now or
        an ISO 8601 string) expires the member if it has not finished by then.

        The same key and input as a member returns that member, even once the group is closed.
        Raises ConflictError (code CONFLICT) for a new member of a closed or finalized
        group (ScopeCancelledError / DeadlineExceededError once its run was stopped from outside),
        KeyConflictError for a member key with another input, LimitExceededError past 100 members.
        """
        from runstate.sdk.client import Ticket, _task_body

        body = _task_body(input, key, attempts)
        formatted = format_deadline(deadline)
        if formatted is not None:
            body["deadline"] = formatted
        answer = await self._transport.request("POST", f"{self._path}/tasks", body=body, safe=True)
        return Ticket(self._transport, answer["taskId"], key=answer.get("taskKey", key), created=answer.get("created"),
                      state=answer.get("state"))

    async def join_task(self, task_id: Any) -> dict[str, Any]:
        """Add an existing task as a member: one of the group's run, or an outside one (of any run
        of the space, e.g. this run) that is no member of another group; finalizing cancels it if
        unfinished. Returns `{"taskId", "joined", "groupState"}` (`joined` False if it was a
        member already). ConflictError once closed, or for a member of another group
        (ScopeCancelledError once its run was stopped from outside); NotFoundError."""
        body = {"taskId": _task_id(task_id)}
        return await self._transport.request("POST", f"{self._path}/join-task", body=body, safe=True)

    async def close(self) -> dict[str, Any]:
        """No new members; the group is evaluated at once. Returns `{"state", "outcome",
        "outcomeReason"}`: SEALED while undecided, FINALIZED if closing decided it (or it was
        decided before). Safe to call again."""
        return await self._transport.request("POST", f"{self._path}/close", body={}, safe=True)

    async def status(self) -> dict[str, Any]:
        """The group's view, with every member's `taskId`, `key`, task `state`, `verdict`
        (ACCEPTED, REJECTED or None), `verdictBy` (the holder of the client that gave the verdict,
        or None) and `late`. NotFoundError if unknown."""
        self.view = await self._transport.request("GET", self._path, safe=True)
        return self.view

    async def accept(self, task_id: Any) -> dict[str, Any]:
        """Accept a SUCCEEDED member (a task id or its ticket), as this client's `holder`. Returns
        `{"taskId", "verdict", "verdictBy", "late", "groupState", "outcome", "outcomeReason"}`;
        `verdictBy` is the holder recorded with the verdict (the first one's, on a repeat); `late`
        is True when the group was decided before (the verdict is recorded and changes nothing).
        Idempotent. ConflictError if the member has not SUCCEEDED or was rejected; NotFoundError if
        it is not a member."""
        return await self._judge("accept", task_id)

    async def reject(self, task_id: Any) -> dict[str, Any]:
        """Reject a finished member; same answer and rules as `accept` (ConflictError while the
        member is unfinished, or if it was accepted)."""
        return await self._judge("reject", task_id)

    async def _judge(self, kind: str, task_id: Any) -> dict[str, Any]:
        holder = self._transport.holder
        body = {} if holder is None else {"holder": holder}
        path = f"{self._path}/tasks/{path_segment(_task_id(task_id), 'task id')}/{kind}"
        return await self._transport.request("POST", path, body=body, safe=True)

    async def wait(self, timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT) -> dict[str, Any]:
        """Wait until the group is FINALIZED; returns its view (`outcome`: SUCCESS or FAILURE,
        `outcomeReason`). Raises WaitTimeoutError if still undecided after `timeout_ms` (nothing
        changes: wait again), NotFoundError if unknown."""

        async def poll(wait_ms: int) -> dict[str, Any]:
            return await self._transport.request(
                "GET", f"{self._path}/wait", params={"waitMs": str(wait_ms)}, safe=True, long_poll_ms=wait_ms
            )

        self.view = await wait_until(
            poll, lambda view: view.get("state") == "FINALIZED", timeout_ms=timeout_ms,
            what=f"the decision of group {self.id}",
        )
        return self.view


class BlockingGroups:
    """`run.groups` of the blocking client (see `Groups`)."""

    def __init__(self, inner: Groups, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    @property
    def scope_id(self) -> str:
        return self._inner.scope_id

    def create(
        self,
        mailbox: str,
        condition: str,
        threshold: int | None = None,
        expected_members: int | None = None,
        deadline: datetime | timedelta | str | None = None,
        parent_scope_id: str | None = None,
    ) -> BlockingGroup:
        group = self._portal.call(
            lambda: self._inner.create(
                mailbox, condition, threshold=threshold, expected_members=expected_members, deadline=deadline,
                parent_scope_id=parent_scope_id,
            )
        )
        return BlockingGroup(group, self._portal)

    def by_id(self, group_id: str) -> BlockingGroup:
        return BlockingGroup(self._inner.by_id(group_id), self._portal)


class BlockingGroup:
    """One task group, blocking calls (see `Group`)."""

    def __init__(self, inner: Group, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def __repr__(self) -> str:
        return repr(self._inner)

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def view(self) -> dict[str, Any] | None:
        return self._inner.view

    @property
    def scope_id(self) -> str | None:
        return self._inner.scope_id

    def submit(
        self, input: Any, key: str | None = None, attempts: int | None = None,
        deadline: datetime | timedelta | str | None = None,
    ) -> sync.Ticket:
        from runstate.sdk.sync import Ticket

        ticket = self._portal.call(lambda: self._inner.submit(input, key=key, attempts=attempts, deadline=deadline))
        return Ticket(ticket, self._portal)

    def join_task(self, task_id: Any) -> dict[str, Any]:
        return self._portal.call(self._inner.join_task, _task_id(task_id))

    def close(self) -> dict[str, Any]:
        return self._portal.call(self._inner.close)

    def status(self) -> dict[str, Any]:
        return self._portal.call(self._inner.status)

    def accept(self, task_id: Any) -> dict[str, Any]:
        return self._portal.call(self._inner.accept, _task_id(task_id))

    def reject(self, task_id: Any) -> dict[str, Any]:
        return self._portal.call(self._inner.reject, _task_id(task_id))

    def wait(self, timeout_ms: int = WAIT_TIMEOUT_MS_DEFAULT) -> dict[str, Any]:
        return self._portal.call(self._inner.wait, timeout_ms)
