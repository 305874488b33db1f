"""Idempotency keys: a retried mutation is applied once, and its first result is the answer to
every retry.

A command may carry `idem = [key, fingerprint]`: the client's `idempotency-key` and a digest of
the request it came with (method, path, body). The first command of a space with that key is
applied and its result remembered; a later command with the same key and fingerprint is not
applied again: it returns the remembered result. The same key with another fingerprint is
IDEMPOTENCY_CONFLICT. A rejected command is not remembered (it changed nothing, so a retry
simply tries again), nor is a result marked UNCHANGED (a receive that found nothing: the retry
should look again).

The table is part of the replicated state, so every replica replays alike and a retry that lands
on a new leader after a failover is still answered from it. It is bounded per space, in entries
(`idempotency_keys_per_space_max`, oldest first), in the bytes its results weigh
(`idempotency_bytes_per_space_max`: a once result can be 64 KiB) and in age
(`idempotency_key_ttl_ms`); the evictions happen in log order, when a key is recorded, so
replicas agree.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from runstate_server.actors import errors, limits
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import IDEMPOTENCY_WEIGHT as WEIGHT
from runstate_server.actors.state import State, result_bytes

# A result that says "this command changed nothing": it is not remembered.
UNCHANGED = "unchanged"


def replayed(state: State, space: str, idem: Any, now_ms: int) -> Any | None:
    """The remembered result for `idem` (wrapped as `{"result": ...}`), or None when the key is new
    or expired. Raises IDEMPOTENCY_CONFLICT when the key came with another request."""
    key, fingerprint = _parse(idem)
    table = state.idempotency.get(space)
    entry = None if table is None else table.get(key)
    if entry is None or entry[0] + limits.idempotency_key_ttl_ms <= now_ms:
        return None
    if entry[1] != fingerprint:
        raise Rejected(
            errors.IDEMPOTENCY_CONFLICT,
            f"the idempotency key {key!r} was used with another request; use a new key for a new request",
        )
    return {"result": entry[2]}


def record(state: State, space: str, idem: Any, result: Any, now_ms: int) -> None:
    """Remember `result` for `idem`, unless it is an error or UNCHANGED; forget what is too old or
    beyond the space's bound."""
    if errors.is_error(result) or (isinstance(result, dict) and result.get(UNCHANGED)):
        return
    key, fingerprint = _parse(idem)
    table = state.idempotency.get(space)
    if table is None:
        table = state.idempotency[space] = OrderedDict()
    weights = state.idempotency_bytes
    previous = table.pop(key, None)  # an expired entry of the same key: the new one goes to the end
    weight = weights.get(space, 0) - (0 if previous is None else previous[WEIGHT])
    entry_weight = result_bytes(result)
    table[key] = [now_ms, fingerprint, result, entry_weight]
    weight += entry_weight
    # The oldest entry is the first: an OrderedDict finds it at once (a dict's first entry is
    # found by skipping the slots its earlier evictions emptied, thousands of them).
    # The count and the weight are looked at first: the oldest is looked up only when they are within bounds.
    count_max, weight_max = limits.idempotency_keys_per_space_max, limits.idempotency_bytes_per_space_max
    oldest_allowed_ms = now_ms - limits.idempotency_key_ttl_ms
    while table and (
        len(table) > count_max or weight > weight_max or table[next(iter(table))][0] <= oldest_allowed_ms
    ):
        weight -= table.popitem(last=False)[1][WEIGHT]
    weights[space] = weight


def _parse(idem: Any) -> tuple[str, str]:
    if isinstance(idem, (list, tuple)) and len(idem) == 2:
        key, fingerprint = idem
        if (
            isinstance(key, str)
            and isinstance(fingerprint, str)
            and key
            and fingerprint
            and len(key) <= limits.idempotency_key_chars_max
        ):
            return key, fingerprint
    raise Rejected(errors.VALIDATION_FAILED, "a command's idem must be [key, fingerprint]")
