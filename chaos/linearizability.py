"""A linearizability checker: Wing & Gong's search with Lowe's memoization, as porcupine does it.

A history is a list of operations, each with the client that made it, its call and return times,
its input and its output. It is linearizable for a model when every operation can be given one
point between its call and its return such that running the model's steps in the order of those
points accepts every output. An operation that never returned (`ret=None`: a timeout, a
connection lost) may have taken effect at any time after its call, or never: it may be left out,
and when it is placed the model sees `UNKNOWN` as its output.

The search (Lowe, "Testing for linearizability", 2017; porcupine's `checkSingle`) walks a linked
list of call and return events in time order. At a call it tries to linearize that operation now
(the model accepts its output from the current state); at a return of an operation not yet
linearized it backtracks. It remembers every (set of linearized operations, model state) it has
reached, so no such pair is explored twice. A search is bounded by `budget_steps`: past it the
answer is `UNKNOWN` (undecided), never a hang. A model partitions a history by key (one register
per task); each key is searched on its own, with its own budget.

On a violation the result carries the shortest failing prefix of that key's history: the
operations called up to the first return at which no linearization exists (operations still
running at that time count as not returned). Linearizability is closed under prefixes, so the
shortest one is found by a binary search over the return times.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

BUDGET_STEPS_DEFAULT = 100_000

State = TypeVar("State", bound=Hashable)


class _Unknown(enum.Enum):
    UNKNOWN = "unknown"

    def __repr__(self) -> str:
        return "UNKNOWN"


# The output a model's step receives for an operation that never returned.
UNKNOWN = _Unknown.UNKNOWN


@dataclass(frozen=True)
class Operation:
    """One client operation: `ret` None when it never returned (its `output` is then ignored).
    `id` is the caller's own reference (a history line's id), carried into results."""

    client: str
    call: float
    ret: float | None
    input: Any
    output: Any
    id: Any = None


@dataclass(frozen=True)
class Model(Generic[State]):
    """`init` is the initial state; `step(state, input, output)` returns (the output is possible
    from `state`, the state after the operation), and gets `UNKNOWN` as the output of an operation
    that never returned; `partition(operations)` groups a history by key (default: one group).
    States must be hashable: the search memoizes them."""

    init: State
    step: Callable[[State, Any, Any], tuple[bool, State]]
    partition: Callable[[Sequence[Operation]], Mapping[Hashable, Sequence[Operation]]] | None = None

    def groups(self, operations: Sequence[Operation]) -> Mapping[Hashable, Sequence[Operation]]:
        return {None: operations} if self.partition is None else self.partition(operations)


class Outcome(str, enum.Enum):
    OK = "ok"  # linearizable
    VIOLATION = "violation"  # no linearization exists
    UNKNOWN = "unknown"  # the search ran out of its step budget before deciding


@dataclass(frozen=True)
class Result:
    """`key` and `prefix` name the first key that failed (for UNKNOWN: the first undecided one) and,
    for a violation, its shortest failing prefix in call order; `prefix_end` is the return time
    that prefix ends at. `outcomes` has every key's outcome; `steps` the search steps used in all."""

    outcome: Outcome
    key: Hashable | None = None
    prefix: tuple[Operation, ...] = ()
    prefix_end: float | None = None
    steps: int = 0
    outcomes: Mapping[Hashable, Outcome] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.OK


def check(model: Model[Any], operations: Iterable[Operation], budget_steps: int = BUDGET_STEPS_DEFAULT) -> Result:
    """Whether the history is linearizable for `model`: each key of `model.partition` is searched
    with at most `budget_steps` steps. VIOLATION if a key has none (the first such key, with its
    shortest failing prefix), else UNKNOWN if a key's search ran out of steps, else OK."""
    assert budget_steps > 0, budget_steps
    history = list(operations)
    for operation in history:
        assert operation.ret is None or operation.ret >= operation.call, operation
    outcomes: dict[Hashable, Outcome] = {}
    first_unknown: Hashable | None = None
    steps_total = 0
    for key, group in model.groups(history).items():
        outcome, steps = _search(model, group, budget_steps)
        steps_total += steps
        outcomes[key] = outcome
        if outcome == Outcome.UNKNOWN and first_unknown is None:
            first_unknown = key
        if outcome == Outcome.VIOLATION:
            prefix, end, steps = _shortest_failing_prefix(model, group, budget_steps)
            return Result(Outcome.VIOLATION, key, prefix, end, steps_total + steps, outcomes)
    if first_unknown is not None:
        return Result(Outcome.UNKNOWN, first_unknown, steps=steps_total, outcomes=outcomes)
    return Result(Outcome.OK, steps=steps_total, outcomes=outcomes)


# -- the search ----------------------------------------------------------------------------------


@dataclass(eq=False)
class _Entry:
    """A call or return event in the doubly linked list the search lifts operations out of."""

    index: int  # the operation's position in the group (its bit in the linearized set)
    operation: Operation | None  # None for the list's head
    is_call: bool
    match: _Entry | None = None  # a call's return event
    previous: _Entry | None = None
    next: _Entry | None = None


def _event_list(operations: Sequence[Operation]) -> _Entry:
    """The head of a list of every call and return, in time order; a call before a return at the
    same time (so operations that touch are concurrent, the weaker claim); returns of operations
    that never returned last."""
    events: list[tuple[float, int, int, _Entry]] = []
    for index, operation in enumerate(operations):
        call = _Entry(index, operation, is_call=True)
        call.match = _Entry(index, operation, is_call=False)
        ret = math.inf if operation.ret is None else operation.ret
        events.append((operation.call, 0, index, call))
        events.append((ret, 1, index, call.match))
    events.sort(key=lambda event: event[:3])
    head = _Entry(-1, None, is_call=False)
    last = head
    for *_, entry in events:
        last.next, entry.previous = entry, last
        last = entry
    return head


def _lift(call: _Entry) -> None:
    """Take a linearized operation's call and return out of the list."""
    assert call.previous is not None and call.next is not None and call.match is not None
    call.previous.next, call.next.previous = call.next, call.previous
    ret = call.match
    assert ret.previous is not None
    ret.previous.next = ret.next
    if ret.next is not None:
        ret.next.previous = ret.previous


def _unlift(call: _Entry) -> None:
    """Put an operation back where it was (the reverse of `_lift`)."""
    assert call.previous is not None and call.next is not None and call.match is not None
    ret = call.match
    assert ret.previous is not None
    ret.previous.next = ret
    if ret.next is not None:
        ret.next.previous = ret
    call.previous.next = call
    call.next.previous = call


def _search(model: Model[Any], operations: Sequence[Operation], budget_steps: int) -> tuple[Outcome, int]:
    """One key's history: (its outcome, the steps used)."""
    head = _event_list(operations)
    entry = head.next
    state = model.init
    linearized = 0  # bit i: operation i is linearized
    seen: set[tuple[int, Hashable]] = {(0, state)}
    stack: list[tuple[_Entry, Any]] = []  # (a linearized call, the state before it)
    steps = 0
    while entry is not None:
        if steps >= budget_steps:
            return Outcome.UNKNOWN, steps
        steps += 1
        operation = entry.operation
        assert operation is not None
        if entry.is_call:
            output = UNKNOWN if operation.ret is None else operation.output
            possible, after = model.step(state, operation.input, output)
            if possible:
                reached = (linearized | 1 << entry.index, after)
                if reached not in seen:
                    seen.add(reached)
                    stack.append((entry, state))
                    linearized, state = reached
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
            continue
        if operation.ret is None:
            # The first return left is one that never happens: every operation that returned is
            # linearized, and the ones still running may take effect later or never.
            return Outcome.OK, steps
        if not stack:
            return Outcome.VIOLATION, steps
        # This operation returned and none of the orders tried so far placed it: undo the last
        # choice and try the operation after it instead.
        entry, state = stack.pop()
        linearized &= ~(1 << entry.index)
        _unlift(entry)
        entry = entry.next
    return Outcome.OK, steps


def _truncated(operations: Sequence[Operation], end: float) -> list[Operation]:
    """The history as it stood at time `end`: operations called by then, the ones returning later
    as not returned yet."""
    return [
        operation if operation.ret is not None and operation.ret <= end else dataclasses.replace(operation, ret=None)
        for operation in operations
        if operation.call <= end
    ]


def _shortest_failing_prefix(
    model: Model[Any], operations: Sequence[Operation], budget_steps: int
) -> tuple[tuple[Operation, ...], float | None, int]:
    """The operations called up to the earliest return time at which the history already has no
    linearization (in call order), that time, and the steps used. A prefix the budget could not
    decide counts as not failing, so the answer is a failing prefix, the shortest when every
    search decided."""
    ends = sorted({operation.ret for operation in operations if operation.ret is not None})
    low, high = 0, len(ends) - 1  # the whole history fails, so ends[high] does
    steps_total = 0
    while low < high:
        middle = (low + high) // 2
        outcome, steps = _search(model, _truncated(operations, ends[middle]), budget_steps)
        steps_total += steps
        if outcome == Outcome.VIOLATION:
            high = middle
        else:
            low = middle + 1
    if not ends:
        return tuple(operations), None, steps_total
    end = ends[low]
    prefix = sorted((operation for operation in operations if operation.call <= end), key=lambda op: op.call)
    return tuple(prefix), end, steps_total


# -- a write-once register (a task's result) -----------------------------------------------------


@dataclass(frozen=True)
class Complete:
    """Write `value` to the register `key` once. Output: True (accepted) or False (refused)."""

    key: Hashable
    value: Hashable


@dataclass(frozen=True)
class Read:
    """Read the register `key`. Output: None while it is empty, else the value written."""

    key: Hashable


def _write_once_step(state: Hashable | None, input: Any, output: Any) -> tuple[bool, Hashable | None]:
    if isinstance(input, Read):
        return (output is UNKNOWN or output == state), state
    assert isinstance(input, Complete), input
    if output is UNKNOWN:
        # It may have been accepted (when empty) or refused; never returning, it may also not have
        # happened at all, which the search covers by not placing it.
        return True, input.value if state is None else state
    if output:
        # The first write wins. The same value accepted again is a client repeating its own
        # write after a lost answer, which the server answers again without a second effect.
        return (state is None or state == input.value), input.value
    # Refused: no effect. A refusal may have other causes than a value already written (a lost
    # lease), so it is possible in every state.
    return True, state


def _by_register(operations: Sequence[Operation]) -> dict[Hashable, list[Operation]]:
    groups: dict[Hashable, list[Operation]] = {}
    for operation in operations:
        groups.setdefault(operation.input.key, []).append(operation)
    return groups


# Per-key write-once registers: `Complete(key, value)` and `Read(key)`. Values must be hashable
# (the checker passes canonical JSON text).
write_once_register: Model[Hashable | None] = Model(init=None, step=_write_once_step, partition=_by_register)
