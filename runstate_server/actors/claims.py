"""Every rule of a claim: a fenced mutex lease on a (run, key).

One holder at a time holds a claim, under a lease it renews; release or a lapse frees it. Every
grant gets a fresh opaque token (`<claim id>.<generation>.<command id>`: the command id is the
leader's random choice, so a token cannot be guessed) and the claim's `generation` grows by one:
it never decreases, so a resource guarded by the claim can refuse writes carrying an older
generation (fencing). A token that is not the current grant's, or whose lease lapsed, is
STALE_CLAIM on renew and release and changes nothing.

Decisions: a claim is not re-entrant. An acquire while the lease is live is CLAIM_HELD, whoever
asks, the holder's own session included (a retried request is answered from the idempotency
record, actors/idempotency.py, before this rule runs); the error names when the lease runs out
(`retryAfterMs`). A released or lapsed claim keeps its generation (the entity stays until its run
is removed). Stopping the run refuses acquires and renewals (SCOPE_CANCELLED /
DEADLINE_EXCEEDED); releases stay allowed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runstate_server.actors import errors, limits, runs, storage
from runstate_server.actors.context import Context
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import DueKind, Run, State, register_table


@dataclass(slots=True)
class Claim:
    id: str
    space: str
    run_id: str
    key: str
    created_ms: int
    generation: int = 0  # grants so far: the current or last grant's number
    token: str | None = None  # the current grant's token; None once released or lapsed
    holder: str | None = None
    holder_session: str | None = None
    lease_ms: int = 0
    lease_expires_ms: int = 0
    observation: bytes | None = None  # what the last release left, as canonical JSON (bounded by the node)


register_table("claims", Claim)


def is_held(claim: Claim, now_ms: int) -> bool:
    return claim.token is not None and now_ms < claim.lease_expires_ms


def acquire(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    run = runs.require_run(ctx, args.get("run_id"))
    key, lease_ms = args["key"], args["lease_ms"]
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    runs.require_active(ctx, run)
    claim = ctx.state.claims.get(run.claims.get(key, ""))
    if claim is not None and is_held(claim, ctx.now_ms):
        raise _Held(claim, ctx.now_ms)
    if claim is None:
        claim = _create(ctx, run, key)
    generation_before = claim.generation
    claim.generation += 1
    claim.token = f"{claim.id}.{claim.generation}.{ctx.command_id}"
    claim.holder = args.get("holder")
    claim.holder_session = args.get("holder_session")
    claim.lease_ms = lease_ms
    claim.lease_expires_ms = ctx.now_ms + lease_ms
    assert claim.generation == generation_before + 1
    ctx.state.arm(claim.lease_expires_ms, DueKind.CLAIM_LEASE, claim.token)
    return _answer(claim)


class _Held(Rejected):
    """CLAIM_HELD, naming when the lease runs out unless renewed (Retry-After)."""

    def __init__(self, claim: Claim, now_ms: int) -> None:
        super().__init__(errors.CLAIM_HELD, f"claim {claim.key!r} is held by another holder")
        self.retry_after_ms = claim.lease_expires_ms - now_ms

    def as_result(self) -> dict[str, dict[str, Any]]:
        result: dict[str, dict[str, Any]] = super().as_result()
        result["error"]["retryAfterMs"] = self.retry_after_ms
        return result


def _create(ctx: Context, run: Run, key: str) -> Claim:
    if len(run.claims) >= limits.claims_per_run_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a run holds at most {limits.claims_per_run_max} claims")
    claim = Claim(id="clm_" + ctx.command_id, space=ctx.space.id, run_id=run.id, key=key, created_ms=ctx.now_ms)
    assert claim.id not in ctx.state.claims, "leader generated a duplicate claim id"
    cost = storage.claim_bytes(claim)
    storage.require_room(ctx, cost, "claim")
    storage.charge(ctx.state, claim.space, cost)
    ctx.state.claims[claim.id] = claim
    run.claims[key] = claim.id
    return claim


def _answer(claim: Claim) -> dict[str, Any]:
    """What every claim command answers: the claim as this command left it."""
    return {
        "claim_id": claim.id,
        "run_id": claim.run_id,
        "key": claim.key,
        "generation": claim.generation,
        "token": claim.token,
        "holder": claim.holder,
        "holder_session": claim.holder_session,
        "lease_expires_ms": claim.lease_expires_ms,
    }


def _require_lease(ctx: Context, args: dict[str, Any]) -> Claim:
    """The claim `token` holds, if it still does and names the path's `key`; else STALE_CLAIM. A
    token that names no claim of this space is stale too (as a forgotten one would be)."""
    token = args.get("token")
    claim_id = token.split(".", 1)[0] if isinstance(token, str) else None
    claim = ctx.state.claims.get(claim_id) if claim_id else None
    if claim is None or claim.space != ctx.space.id or claim.key != args.get("key") or claim.token != token:
        raise Rejected(errors.STALE_CLAIM, "this claim token is not the current one: it was released, lapsed or superseded")
    if ctx.now_ms >= claim.lease_expires_ms:
        raise Rejected(errors.STALE_CLAIM, f"the lease of claim {claim.key!r} lapsed")
    return claim


def renew(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    claim = _require_lease(ctx, args)
    lease_ms = args.get("lease_ms") or claim.lease_ms
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    runs.require_active(ctx, ctx.state.runs[claim.run_id])
    claim.lease_ms = lease_ms
    claim.lease_expires_ms = max(claim.lease_expires_ms, ctx.now_ms + lease_ms)
    return _answer(claim)


def release(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    claim = _require_lease(ctx, args)
    answer = _answer(claim)
    claim.token = None
    before = storage.claim_bytes(claim)
    observation = args.get("observation")
    claim.observation = None if observation is None else storage.json_bytes(observation)
    storage.charge(ctx.state, claim.space, storage.claim_bytes(claim) - before)
    return {**answer, "token": None, "released": True}


def on_lease_due(ctx: Context, token: str, due_ms: int) -> None:
    claim = ctx.state.claims.get(token.split(".", 1)[0])
    if claim is None or claim.token != token:
        return  # that grant ended already
    if claim.lease_expires_ms > due_ms:
        ctx.state.arm(claim.lease_expires_ms, DueKind.CLAIM_LEASE, token)  # renewed: look again then
        return
    claim.token = None  # lapsed: free for the next acquire, the generation kept


def extend_leases(state: State, now_ms: int) -> None:
    """Every held claim's lease runs its full length from now (see tasks.extend_leases)."""
    for claim in state.claims.values():
        if claim.token is not None:
            claim.lease_expires_ms = max(claim.lease_expires_ms, now_ms + claim.lease_ms)


def _on_run_remove(state: State, run: Run) -> None:
    for claim_id in run.claims.values():
        storage.charge(state, run.space, -storage.claim_bytes(state.claims.pop(claim_id)))


runs.RUN_REMOVE_HOOKS.append(_on_run_remove)

HANDLERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "claim.acquire": acquire,
    "claim.renew": renew,
    "claim.release": release,
}
DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {DueKind.CLAIM_LEASE: on_lease_due}
