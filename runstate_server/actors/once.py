"""Every rule of once: one holder at a time does the work of a (run, key), one result for all.

A once entry is OPEN until someone acquires it under a lease (HELD, answered GRANTED to that
caller). The holder records the result (DONE, final: every later acquire gets it), records a
failure (OPEN for the next caller, or FAILED once its attempts are used), or releases it (OPEN, no
attempt counted). A lease that lapses counts as a failed attempt.

The attempt limit is decided when an attempt fails: a failure names `max_attempts` and the entry
is FAILED when its failures reach it. The latest limit given is remembered (a granted acquire may
name one too), so a lapse, which names none, is checked against it; before any limit is known a
lapse never makes the entry FAILED. An acquire that changes nothing (HELD, or an outcome already
recorded) is marked UNCHANGED, so a retry of it looks again rather than replaying the answer.

Every lease has an opaque token (`<once id>.<lease number>.<command id>`: the command id is the
leader's random choice, so a token cannot be guessed), presented on renew, complete, fail and
release; a token that is not the current lease's is STALE_CLAIM and changes nothing. The lease is
valid while `now_ms < lease_expires_ms`, as for deliveries. Stopping the run refuses new acquires,
renewals and results; failures and releases stay allowed, recorded outcomes stay readable.
"""

from __future__ import annotations

from typing import Any

from runstate_server.actors import errors, idempotency, limits, runs, storage
from runstate_server.actors.context import Context, once_key
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import DueKind, Once, OnceState, Run, State

FINAL = (OnceState.DONE, OnceState.FAILED)
GRANTED = "GRANTED"  # the acquire's answer to the caller that now holds the lease


def acquire(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    run = runs.require_run(ctx, args.get("run_id"))
    key, lease_ms = args["key"], args["lease_ms"]
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    max_attempts = _max_attempts(args.get("max_attempts"), required=False)
    entry = ctx.state.once.get(run.once.get(key, ""))
    if entry is not None and entry.state in FINAL:
        return {**_answer(ctx, entry.state, entry), idempotency.UNCHANGED: True}
    runs.require_active(ctx, run)
    if entry is None:
        entry = _create(ctx, run, key)
    if entry.state == OnceState.HELD:
        if ctx.now_ms < entry.lease_expires_ms:
            return {**_answer(ctx, OnceState.HELD, entry), idempotency.UNCHANGED: True}
        _fail_attempt(ctx, entry, _lapse_message(entry), entry.max_attempts)  # lapsed, its tick not yet run
        if entry.state == OnceState.FAILED:
            return _answer(ctx, OnceState.FAILED, entry)
    if max_attempts is not None:
        entry.max_attempts = max_attempts  # the limit this holder's lapse is checked against
    entry.lease_count += 1
    entry.attempt = entry.failures + 1
    entry.token = f"{entry.id}.{entry.lease_count}.{ctx.command_id}"
    entry.lease_ms = lease_ms
    entry.lease_expires_ms = ctx.now_ms + lease_ms
    entry.holder = args.get("holder")
    entry.holder_session = args.get("holder_session")
    entry.state = OnceState.HELD
    ctx.state.arm(entry.lease_expires_ms, DueKind.ONCE_LEASE, entry.token)
    return {**_answer(ctx, GRANTED, entry), "token": entry.token, "lease_expires_ms": entry.lease_expires_ms}


def _max_attempts(value: Any, *, required: bool) -> int | None:
    if value is None and not required:
        return None
    if type(value) is not int or not 1 <= value <= limits.attempts_max:
        raise Rejected(errors.VALIDATION_FAILED, f"maxAttempts must be an integer from 1 to {limits.attempts_max}")
    return value


def _create(ctx: Context, run: Run, key: str) -> Once:
    if len(run.once) >= limits.once_per_run_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a run holds at most {limits.once_per_run_max} once keys")
    entry = Once(id="onc_" + ctx.command_id, space=ctx.space.id, run_id=run.id, key=key, max_attempts=None,
                 created_ms=ctx.now_ms)
    assert entry.id not in ctx.state.once, "leader generated a duplicate once id"
    cost = storage.once_bytes(entry)
    storage.require_room(ctx, cost, "once entry")
    storage.charge(ctx.state, entry.space, cost)
    ctx.state.once[entry.id] = entry
    run.once[key] = entry.id
    return entry


def _answer(ctx: Context, state: str, entry: Once) -> dict[str, Any]:
    """What every once command answers: the entry as this command left it, and whether its run is
    still active (a stopped run still answers its recorded outcomes)."""
    return {
        "state": state,
        "once_id": entry.id,
        "attempts": entry.failures,
        "result": entry.result if entry.state == OnceState.DONE else None,
        "last_error": entry.error,
        "run_effective": runs.effective(ctx.state, ctx.state.runs[entry.run_id], ctx.now_ms),
    }


def _require_lease(ctx: Context, args: dict[str, Any]) -> Once:
    """The entry of (run, key) if `token` is its current lease; else STALE_CLAIM (NOT_FOUND for an
    unknown run). A token of another key or run is stale for this one."""
    run = runs.require_run(ctx, args.get("run_id"))
    entry = ctx.state.once.get(run.once.get(args.get("key"), ""))  # type: ignore[arg-type]
    token = args.get("token")
    if entry is None or entry.token is None or entry.token != token or entry.state != OnceState.HELD:
        raise Rejected(errors.STALE_CLAIM, "this once lease is no longer held: it lapsed, ended or was taken over")
    if ctx.now_ms >= entry.lease_expires_ms:
        raise Rejected(errors.STALE_CLAIM, "this once lease lapsed")
    return entry


def renew(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    lease_ms = args["lease_ms"]
    assert limits.lease_ms_min <= lease_ms <= limits.lease_ms_max
    entry = _require_lease(ctx, args)
    runs.require_active(ctx, ctx.state.runs[entry.run_id])
    entry.lease_ms = lease_ms
    entry.lease_expires_ms = max(entry.lease_expires_ms, ctx.now_ms + lease_ms)
    return {**_answer(ctx, entry.state, entry), "lease_expires_ms": entry.lease_expires_ms}


def complete(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    repeated = _recorded_by(ctx, args)
    if repeated is not None:
        return _answer(ctx, repeated.state, repeated)  # the same complete again: the same answer
    entry = _require_lease(ctx, args)
    runs.require_active(ctx, ctx.state.runs[entry.run_id])
    before = storage.once_bytes(entry)
    entry.result = storage.json_bytes(args.get("result"))
    storage.charge(ctx.state, entry.space, storage.once_bytes(entry) - before)
    entry.finished_by = entry.token
    _settle(ctx, entry, OnceState.DONE)
    return _answer(ctx, entry.state, entry)


def fail(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    max_attempts = _max_attempts(args.get("max_attempts", limits.once_attempts_default), required=True)
    entry = _require_lease(ctx, args)
    entry.max_attempts = max_attempts
    _fail_attempt(ctx, entry, args.get("error") or "the holder reported a failure", max_attempts)
    return _answer(ctx, entry.state, entry)


def release(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    entry = _require_lease(ctx, args)
    _settle(ctx, entry, OnceState.OPEN)
    return _answer(ctx, entry.state, entry)


def _recorded_by(ctx: Context, args: dict[str, Any]) -> Once | None:
    run = ctx.state.runs.get(args.get("run_id"))  # type: ignore[arg-type]
    if run is None or run.space != ctx.space.id:
        return None
    entry = ctx.state.once.get(run.once.get(args.get("key"), ""))  # type: ignore[arg-type]
    if entry is None or entry.state != OnceState.DONE or entry.finished_by is None:
        return None
    return entry if entry.finished_by == args.get("token") else None


def _fail_attempt(ctx: Context, entry: Once, error: str, max_attempts: int | None) -> None:
    entry.failures += 1
    before = storage.once_bytes(entry)
    entry.error = error
    storage.charge(ctx.state, entry.space, storage.once_bytes(entry) - before)
    used = max_attempts is not None and entry.failures >= max_attempts
    _settle(ctx, entry, OnceState.FAILED if used else OnceState.OPEN)


def _settle(ctx: Context, entry: Once, state: str) -> None:
    """The current lease ends with `state`; whoever waits on the entry looks again."""
    entry.state = state
    entry.token = None
    if state in FINAL:
        entry.finished_ms = ctx.now_ms
    ctx.wake(once_key(entry.run_id, entry.key))


def finisher(entry: Once) -> str | None:
    """Who finished the entry: the holder of the lease that recorded its result (DONE) or its last
    failed attempt (FAILED, a lapse included). Derived, not stored: `holder` changes only when a
    lease is granted, which a final entry never sees again. None while not final, and when that
    holder declared no name."""
    return entry.holder if entry.state in FINAL else None


def _lapse_message(entry: Once) -> str:
    return f"lease expired (holder {entry.holder or 'unknown'})"


def on_lease_due(ctx: Context, token: str, due_ms: int) -> None:
    entry = ctx.state.once.get(token.split(".", 1)[0])
    if entry is None or entry.token != token or entry.state != OnceState.HELD:
        return  # that lease ended already
    if entry.lease_expires_ms > due_ms:
        ctx.state.arm(entry.lease_expires_ms, DueKind.ONCE_LEASE, token)  # renewed: look again then
        return
    _fail_attempt(ctx, entry, _lapse_message(entry), entry.max_attempts)


def extend_leases(state: State, now_ms: int) -> None:
    """Every held entry's lease runs its full length from now (see tasks.extend_leases)."""
    for entry in state.once.values():
        if entry.state == OnceState.HELD:
            entry.lease_expires_ms = max(entry.lease_expires_ms, now_ms + entry.lease_ms)


def _on_run_stop(ctx: Context, run: Run, task_state: str) -> None:
    for key in run.once:
        ctx.wake(once_key(run.id, key))  # waiting callers look again and learn the run stopped


def _on_run_remove(state: State, run: Run) -> None:
    for once_id in run.once.values():
        storage.charge(state, run.space, -storage.once_bytes(state.once.pop(once_id)))


runs.RUN_STOP_HOOKS.append(_on_run_stop)
runs.RUN_REMOVE_HOOKS.append(_on_run_remove)
