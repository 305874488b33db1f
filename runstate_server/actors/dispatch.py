"""The dispatcher: apply one command to the state, deterministically.

A command is `{"type": str, "v": 1, "space": str, "id": str, "args": dict, "key": str | None,
"idem": [key, fingerprint] | None}` (idem: see idempotency.py); the
leader chose its id, and the batch it travels in carries `now_ms` and the leader's `epoch`. `key`
is the id of the API key the request was made with (absent on a node without auth, and on the
leader's own commands). `apply` never reads a clock, a random source or the environment, so every
replica computes the same result and the same state from the same log.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from runstate_server.actors import (
    access,
    allowances,
    barriers,
    budgets,
    claims,
    errors,
    events,
    groups,
    idempotency,
    integrity,
    limits,
    members,
    once,
    permits,
    resources,
    runs,
    tasks,
    timers,
    work_limits,
)
from runstate_server.actors.context import Context, Effect
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import (
    DueKind,
    Space,
    State,
    from_snapshot,
    number_in_creation_order,
    to_snapshot,
)

COMMAND_VERSION = 1
# The commands this code applies, as a level: a leader proposes a command of a level above 1 only
# when every node of the cluster told it that level or a higher one (cluster/_transport.py), for a
# node of an older release would refuse a command type it does not know, and its state would
# differ from the others'. Level 2: task.submit_many. Level 3: state.number_creations. Level 4:
# state.level, and pysyncobj's membership entries (a release before this one applies them only in
# part: cluster/DESIGN.md "Membership"). Level 5: cluster.identify (the cluster's id, for backups) and
# replica.check (actors/integrity.py).
COMMAND_LEVEL = 5
SUBMIT_MANY_LEVEL = 2
NUMBER_CREATIONS_LEVEL = 3
STATE_LEVEL_LEVEL = 4
MEMBERSHIP_LEVEL = 4
INTEGRITY_LEVEL = 5
# A cluster id (cluster.identify): "rsc_" and this many hex digits, made by the leader that proposes it.
CLUSTER_ID_PREFIX = "rsc_"
CLUSTER_ID_HEX_CHARS = 24



def proven_level(state: State) -> int:
    """The command level the applied log proves every node of the cluster applies. An entry of
    level L is proposed only while every node told L, and a node that meets a committed entry it
    cannot apply halts (cluster/DESIGN.md "Command levels"): so a numbered state (the level-3
    `state.number_creations` applied) proves level 3 for good, however the peers' connections come
    and go. A leader proposes at least at this level, so one request takes one form of command
    whichever leader proposes it and whenever (an idempotency record is per form). From level 4 on
    the proof is explicit: `state.level`, which a leader proposes once every node told it a level
    above the one proven."""
    return max(state.level, NUMBER_CREATIONS_LEVEL if state.creation_seq is not None else 1)


Handler = Callable[[Context, dict[str, Any]], Any]

HANDLERS: dict[str, Handler] = {
    "mailbox.create": tasks.create_mailbox,
    "mailbox.declare": tasks.declare_mailbox,
    "run.create": runs.create,
    "run.named": runs.named,
    "run.cancel": runs.cancel,
    "run.complete": runs.complete,
    "task.submit": tasks.submit,
    "task.submit_many": tasks.submit_many,
    "task.receive": tasks.receive,
    "task.cancel": tasks.cancel,
    "task.join": tasks.join,
    "task.detach": tasks.detach,
    "delivery.renew": tasks.renew,
    "delivery.complete": tasks.complete,
    "delivery.complete_many": tasks.complete_many,
    "delivery.retry": tasks.retry,
    "delivery.reject": tasks.reject,
    "delivery.release": tasks.release,
    "mailbox.ensure": tasks.ensure_mailbox,
    "once.acquire": once.acquire,
    "once.renew": once.renew,
    "once.complete": once.complete,
    "once.fail": once.fail,
    "once.release": once.release,
    **claims.HANDLERS,
    **groups.HANDLERS,
    **barriers.HANDLERS,
    **timers.HANDLERS,
    **resources.HANDLERS,
    **permits.HANDLERS,
    **budgets.HANDLERS,
    **allowances.HANDLERS,
    **access.HANDLERS,
    **work_limits.HANDLERS,
}

# Time-driven transitions of the later rule modules: due kind -> handler(ctx, entity id, due_ms).
DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {
    **claims.DUE_HANDLERS,
    **groups.DUE_HANDLERS,
    **barriers.DUE_HANDLERS,
    **timers.DUE_HANDLERS,
    **resources.DUE_HANDLERS,
    **permits.DUE_HANDLERS,
    **budgets.DUE_HANDLERS,
    **allowances.DUE_HANDLERS,
    **events.DUE_HANDLERS,
}

# Commands that are not about one space: driven by the leader itself.
SYSTEM_SPACE = ""
# The command types apply() knows besides HANDLERS: the leader's own.
BUILT_IN_KINDS = frozenset({
    "tick", "leader.start", "access.bootstrap", "barrier", "state.number_creations", "state.level",
    "cluster.learner_add", "cluster.learner_drop", "cluster.identify", integrity.CHECK_KIND,
})
# The built-in kinds a space may not send: they change the cluster, not a space.
_SYSTEM_ONLY_KINDS = frozenset({
    "access.bootstrap", "cluster.learner_add", "cluster.learner_drop", "cluster.identify", integrity.CHECK_KIND,
})


def unknown_kind(command: Any) -> str | None:
    """What in `command` this code cannot apply because a newer release wrote it (a higher command
    version, or a type unknown here), in a few words; None otherwise. A merely malformed command is
    not this: apply() refuses it, on every replica alike."""
    if not isinstance(command, dict):
        return None
    version = command.get("v")
    if type(version) is int and version > COMMAND_VERSION:
        return f"command version {version}"
    kind = command.get("type")
    if isinstance(kind, str) and kind not in HANDLERS and kind not in BUILT_IN_KINDS:
        return f"command type {kind!r}"
    return None


class Core:
    """The state machine the replicated log drives (see runstate_server.cluster.log.StateMachine)."""

    def __init__(self, state: State | None = None) -> None:
        self.state = state or State()

    @property
    def clock_ms(self) -> int:
        return self.state.clock_ms

    def apply(self, command: dict[str, Any], now_ms: int, epoch: int) -> tuple[Any, list[Effect]]:
        return apply(self.state, command, now_ms, epoch)

    def unknown_kind(self, command: Any) -> str | None:
        return unknown_kind(command)

    def snapshot(self) -> dict[str, Any]:
        return to_snapshot(self.state)

    def restore(self, snapshot: dict[str, Any]) -> None:
        self.state = from_snapshot(snapshot)


def apply(state: State, command: dict[str, Any], now_ms: int, epoch: int) -> tuple[Any, list[Effect]]:
    """Apply `command`; return (result, effects). A rejected command returns
    `{"error": {"code", "message"}}` and leaves the state unchanged."""
    now_ms = max(now_ms, state.clock_ms)  # time never goes backwards, whatever the leader's clock
    state.clock_ms = now_ms
    earliest_before = state.next_due_ms()
    effects: list[Effect] = []
    try:
        result = _apply(state, command, now_ms, epoch, effects)
    except Rejected as rejected:
        return rejected.as_result(), []
    earliest_after = state.next_due_ms()
    if earliest_after is not None and (earliest_before is None or earliest_after < earliest_before):
        effects.append(("arm", earliest_after))
    return result, effects


def _apply(state: State, command: dict[str, Any], now_ms: int, epoch: int, effects: list[Effect]) -> Any:
    if command.get("v") != COMMAND_VERSION:
        raise Rejected(errors.VALIDATION_FAILED, f"unsupported command version {command.get('v')!r}")
    space_id = command.get("space")
    key_id = command.get("key")
    if key_id is not None:
        # Before everything, the read barrier included: a command after a revoke in the log is
        # refused, whichever node checked its key before proposing it.
        access.require_command_key(state, key_id, space_id)
    kind = command.get("type")
    args = command.get("args") or {}
    if kind == "tick":
        return _tick(state, args, now_ms, epoch, effects)
    if kind == "leader.start":
        return _leader_start(state, now_ms, epoch)
    if kind in _SYSTEM_ONLY_KINDS and space_id != SYSTEM_SPACE:
        raise Rejected(errors.VALIDATION_FAILED, f"{kind} is a command of the leader, not of a space")
    if kind == "access.bootstrap":
        return access.bootstrap(state, args, now_ms)
    if kind == "cluster.learner_add":
        return members.add_learner(state, args, now_ms)
    if kind == "cluster.learner_drop":
        return members.drop_learner(state, args)
    if kind == "cluster.identify":
        return identify_cluster(state, args)
    if kind == integrity.CHECK_KIND:
        return integrity.check(args, str(command.get("id", "")))
    if kind == "barrier":
        return {}  # committed, so its proposer still led: reads after it are linearizable
    if kind == "state.number_creations":
        # The leader's, once every node applies it (NUMBER_CREATIONS_LEVEL); a second one is a no-op.
        if state.creation_seq is not None:
            return {"numbered": False}
        number_in_creation_order(state)
        return {"numbered": True}
    if kind == "state.level":
        # The leader's, once every node told it `level` (STATE_LEVEL_LEVEL): from now on the log
        # proves it (proven_level). It only ever rises.
        level = args.get("level") if isinstance(args, dict) else None
        if type(level) is not int or not STATE_LEVEL_LEVEL <= level <= COMMAND_LEVEL:
            raise Rejected(errors.VALIDATION_FAILED, f"state.level needs a level of {STATE_LEVEL_LEVEL} to {COMMAND_LEVEL}")
        state.level = max(state.level, level)
        return {"level": state.level}
    handler = HANDLERS.get(kind)  # type: ignore[arg-type]
    if handler is None:
        raise Rejected(errors.VALIDATION_FAILED, f"unknown command type {kind!r}")
    if not isinstance(space_id, str) or not space_id:
        raise Rejected(errors.VALIDATION_FAILED, "a command needs a space")
    space = state.spaces.get(space_id)
    is_new_space = space is None
    if space is None:
        # A space also comes into being when something is first created in it (a keyless node
        # has no space.create to call first); a command that creates nothing leaves no empty
        # space behind.
        if len(state.spaces) >= limits.spaces_max:
            raise Rejected(errors.LIMIT_EXCEEDED, f"at most {limits.spaces_max} spaces")
        space = Space(id=space_id, created_ms=now_ms)
    idem = command.get("idem")
    if idem is not None:
        replay = idempotency.replayed(state, space_id, idem, now_ms)
        if replay is not None:
            return replay["result"]
    ctx = Context(state, space, now_ms, epoch, str(command.get("id", "")), effects, key_id)
    result = handler(ctx, args)
    if is_new_space and (space.mailboxes or space.run_count or space.key_count or space.resource_counts):
        state.spaces[space_id] = space
    if idem is not None and space_id in state.spaces:  # a command that made no space changed nothing
        idempotency.record(state, space_id, idem, result, now_ms)
    return result


def is_cluster_id(value: Any) -> bool:
    """A cluster id as cluster.identify takes it: CLUSTER_ID_PREFIX and CLUSTER_ID_HEX_CHARS lowercase hex digits."""
    if not isinstance(value, str) or not value.startswith(CLUSTER_ID_PREFIX):
        return False
    digits = value[len(CLUSTER_ID_PREFIX):]
    return len(digits) == CLUSTER_ID_HEX_CHARS and all(char in "0123456789abcdef" for char in digits)


def identify_cluster(state: State, args: Any) -> dict[str, Any]:
    """`cluster.identify`: the leader's, once every node applies it (INTEGRITY_LEVEL), on a state
    that has no cluster id yet. The first one names the cluster for good; a later one (a second
    leader's, proposed before it applied the first) changes nothing and answers the id there is.
    A restore (node/backup.py) gives the new cluster its own id in the state it writes."""
    cluster_id = args.get("cluster_id") if isinstance(args, dict) else None
    if not is_cluster_id(cluster_id):
        raise Rejected(
            errors.VALIDATION_FAILED,
            f"cluster.identify needs a cluster_id of {CLUSTER_ID_PREFIX!r} and {CLUSTER_ID_HEX_CHARS} lowercase hex digits",
        )
    if state.cluster_id is None:
        state.cluster_id = cluster_id
        return {"cluster_id": cluster_id, "identified": True}
    return {"cluster_id": state.cluster_id, "identified": False}


def _leader_start(state: State, now_ms: int, epoch: int) -> dict[str, Any]:
    """A new leader's first command. From now on ticks of older epochs are refused, and, as etcd
    does on a leader change, every live lease is extended to its full length from now: a worker
    that could not reach anyone during the election keeps its task."""
    if epoch > state.epoch:
        state.epoch = epoch
        tasks.extend_leases(state, now_ms)
        once.extend_leases(state, now_ms)
        claims.extend_leases(state, now_ms)
        resources.extend_leases(state, now_ms)
    return {"epoch": state.epoch}


def _tick(state: State, args: dict[str, Any], now_ms: int, epoch: int, effects: list[Effect]) -> Any:
    """Run every time-driven transition that is due, at most `tick_entries_max` of them."""
    if epoch < state.epoch:
        raise Rejected(errors.STALE_EPOCH, f"tick from epoch {epoch}, the state is at epoch {state.epoch}")
    retention_ms = args["retention_ms"]
    processed = 0
    while state.due and state.due[0][0] <= now_ms and processed < limits.tick_entries_max:
        due_ms, _seq, kind, entity_id = heapq.heappop(state.due)
        processed += 1
        ctx = Context(state, _entity_space(state, kind, entity_id), now_ms, epoch, "", effects)
        if kind == DueKind.LEASE:
            tasks.on_lease_due(ctx, entity_id, due_ms)
        elif kind == DueKind.READY:
            tasks.on_ready_due(ctx, entity_id, due_ms)
        elif kind == DueKind.TASK_DEADLINE:
            tasks.on_deadline_due(ctx, entity_id, due_ms)
        elif kind == DueKind.DEADLINE:
            runs.on_deadline(ctx, entity_id, retention_ms)
        elif kind == DueKind.RETENTION:
            runs.on_retention(ctx, entity_id)
        elif kind == DueKind.ONCE_LEASE:
            once.on_lease_due(ctx, entity_id, due_ms)
        elif kind in DUE_HANDLERS:
            DUE_HANDLERS[kind](ctx, entity_id, due_ms)
        else:
            raise AssertionError(f"unknown due kind {kind!r}")
    return {"processed": processed}


_NO_SPACE = Space(id=SYSTEM_SPACE)


def _entity_space(state: State, kind: str, entity_id: str) -> Space:
    if kind in (DueKind.LEASE, DueKind.READY, DueKind.TASK_DEADLINE):
        entity: Any = state.tasks.get(entity_id.split(".", 1)[0])
    elif kind == DueKind.ONCE_LEASE:
        entity = state.once.get(entity_id.split(".", 1)[0])
    elif kind == DueKind.CLAIM_LEASE:
        entity = state.claims.get(entity_id.split(".", 1)[0])
    elif kind == DueKind.GROUP_DEADLINE:
        entity = state.groups.get(entity_id)
    elif kind == DueKind.TIMER:
        entity = state.timers.get(entity_id)
    elif kind == DueKind.EVENTS_AGE:  # events.py: the entity is the space itself
        return state.spaces.get(entity_id, _NO_SPACE)
    elif kind in resources.DUE_TABLES:
        entity = getattr(state, resources.DUE_TABLES[kind]).get(entity_id)
    else:
        entity = state.runs.get(entity_id)
    return state.spaces[entity.space] if entity is not None else _NO_SPACE
