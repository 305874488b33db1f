"""Every rule of a claim: one holder at a time does the work of a (run, key), one result for all.

A claim is FREE until someone acquires it under a lease (HELD). The holder records the result
(DONE, final: every later acquire gets it), records a failure (FREE for the next caller, or FAILED
once its attempts are used), or releases it (FREE, no attempt counted). A lease that lapses counts
as a failed attempt. A lease id names its claim (`<claim id>.<lease number>.<nonce>`), so a stale
holder is told STALE_CLAIM. The lease is valid while `now_ms < lease_expires_ms`, as for deliveries.
Stopping the run refuses new acquires, renewals and results; failures and releases stay allowed,
recorded outcomes stay readable.
"""

from __future__ import annotations

from typing import Any

from runstate_server.actors import errors, limits, runs
from runstate_server.actors.context import Context, claim_key
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import Claim, ClaimState, DueKind, Run, State

FINAL = (ClaimState.DONE, ClaimState.FAILED)


def acquire(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    run = runs.require_run(ctx, args.get("run_id"))
    key, lease_ms = args["key"], args["lease_ms"]
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    claim = ctx.state.claims.get(run.claims.get(key, ""))
    if claim is not None and claim.state in FINAL:
        return _answer(claim.state, claim)
    runs.require_active(ctx, run)
    if claim is None:
        claim = _create(ctx, run, key, args.get("attempts", limits.claim_attempts_default))
    elif claim.state == ClaimState.HELD:
        if ctx.now_ms < claim.lease_expires_ms:
            return _answer("HELD", claim)
        _fail_attempt(ctx, claim, _lapse_message(claim))  # lapsed, its tick not yet run
        if claim.state == ClaimState.FAILED:
            return _answer(ClaimState.FAILED, claim)
    claim.lease_count += 1
    claim.attempt = claim.failures + 1
    claim.lease_id = f"{claim.id}.{claim.lease_count}.{ctx.command_id[:8]}"
    claim.lease_ms = lease_ms
    claim.lease_expires_ms = ctx.now_ms + lease_ms
    claim.holder = args.get("holder")
    claim.state = ClaimState.HELD
    ctx.state.arm(claim.lease_expires_ms, DueKind.CLAIM_LEASE, claim.lease_id)
    return {**_answer("GRANTED", claim), "lease_id": claim.lease_id}


def _create(ctx: Context, run: Run, key: str, attempts: Any) -> Claim:
    if type(attempts) is not int or not 1 <= attempts <= limits.attempts_max:
        raise Rejected(errors.VALIDATION_FAILED, f"attempts must be an integer from 1 to {limits.attempts_max}")
    if len(run.claims) >= limits.claims_per_run_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a run holds at most {limits.claims_per_run_max} claims")
    claim = Claim(
        id="clm_" + ctx.command_id, space=ctx.space.id, run_id=run.id, key=key, attempts=attempts,
        created_ms=ctx.now_ms,
    )
    assert claim.id not in ctx.state.claims, "leader generated a duplicate claim id"
    ctx.state.claims[claim.id] = claim
    run.claims[key] = claim.id
    return claim


def _answer(outcome: str, claim: Claim) -> dict[str, Any]:
    return {"outcome": outcome, "claim_id": claim.id}


def _require_lease(ctx: Context, lease_id: Any) -> Claim:
    """The claim the lease belongs to; STALE_CLAIM if the lease is no longer its current one."""
    claim_id = lease_id.split(".", 1)[0] if isinstance(lease_id, str) else None
    claim = ctx.state.claims.get(claim_id) if claim_id else None
    if claim is None or claim.space != ctx.space.id:
        raise Rejected(errors.NOT_FOUND, f"claim lease {lease_id!r} not found")
    if claim.lease_id != lease_id or claim.state != ClaimState.HELD or ctx.now_ms >= claim.lease_expires_ms:
        raise Rejected(errors.STALE_CLAIM, f"claim lease {lease_id} is no longer held: it lapsed or was taken over")
    return claim


def renew(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    lease_ms = args["lease_ms"]
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    claim = _require_lease(ctx, args.get("lease_id"))
    runs.require_active(ctx, ctx.state.runs[claim.run_id])
    claim.lease_ms = lease_ms
    claim.lease_expires_ms = max(claim.lease_expires_ms, ctx.now_ms + lease_ms)
    return {"claim_id": claim.id}


def complete(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    lease_id = args.get("lease_id")
    repeated = _recorded_by(ctx, lease_id)
    if repeated is not None:
        return {"claim_id": repeated.id}  # the same complete again: the same answer
    claim = _require_lease(ctx, lease_id)
    runs.require_active(ctx, ctx.state.runs[claim.run_id])
    claim.result = args.get("result")
    claim.finished_by = claim.lease_id
    _settle(ctx, claim, ClaimState.DONE)
    return {"claim_id": claim.id}


def fail(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    claim = _require_lease(ctx, args.get("lease_id"))
    _fail_attempt(ctx, claim, args.get("error") or "the holder reported a failure")
    return {"claim_id": claim.id}


def release(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    claim = _require_lease(ctx, args.get("lease_id"))
    _settle(ctx, claim, ClaimState.FREE)
    return {"claim_id": claim.id}


def _recorded_by(ctx: Context, lease_id: Any) -> Claim | None:
    claim_id = lease_id.split(".", 1)[0] if isinstance(lease_id, str) else None
    claim = ctx.state.claims.get(claim_id) if claim_id else None
    if claim is None or claim.space != ctx.space.id or claim.state != ClaimState.DONE:
        return None
    return claim if claim.finished_by == lease_id else None


def _fail_attempt(ctx: Context, claim: Claim, error: str) -> None:
    claim.failures += 1
    claim.error = error
    _settle(ctx, claim, ClaimState.FAILED if claim.failures >= claim.attempts else ClaimState.FREE)


def _settle(ctx: Context, claim: Claim, state: str) -> None:
    """The current lease ends with `state`; whoever waits on the claim looks again."""
    claim.state = state
    claim.lease_id = None
    if state in FINAL:
        claim.finished_ms = ctx.now_ms
    ctx.wake(claim_key(claim.run_id, claim.key))


def finisher(claim: Claim) -> str | None:
    """Who finished the claim: the holder of the lease that recorded its result (DONE) or its last
    failed attempt (FAILED, a lapse included). Derived, not stored: `holder` changes only when a
    lease is granted, which a final claim never sees again. None while not final, and when that
    holder declared no name."""
    return claim.holder if claim.state in FINAL else None


def _lapse_message(claim: Claim) -> str:
    return f"lease expired (holder {claim.holder or 'unknown'})"


def on_lease_due(ctx: Context, lease_id: str, due_ms: int) -> None:
    claim = ctx.state.claims.get(lease_id.split(".", 1)[0])
    if claim is None or claim.lease_id != lease_id or claim.state != ClaimState.HELD:
        return  # that lease ended already
    if claim.lease_expires_ms > due_ms:
        ctx.state.arm(claim.lease_expires_ms, DueKind.CLAIM_LEASE, lease_id)  # renewed: look again then
        return
    _fail_attempt(ctx, claim, _lapse_message(claim))


def extend_leases(state: State, now_ms: int) -> None:
    """Every held claim's lease runs its full length from now (see tasks.extend_leases)."""
    for claim in state.claims.values():
        if claim.state == ClaimState.HELD:
            claim.lease_expires_ms = max(claim.lease_expires_ms, now_ms + claim.lease_ms)
