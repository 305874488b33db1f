/**
 * Slots, rate limits and budgets of the space: `rs.pools`, `rs.limits`, `rs.budgets`, and what a
 * queue's jobs need (the protocol's `requirements`).
 *
 * On the wire a pool is a *permit*, a rate limit an *allowance* and a budget a budget in exact
 * integer minor units (`PUT /permits|allowances|budgets/by-name/{name}` declares one; a
 * declaration never changes an existing one). Ids (and a budget's scale) are looked up once per
 * name and client. A budget this SDK creates has scale 6 (millionths), as the Python SDK's, so that
 * sub-cent costs stay exact; an existing budget keeps its own scale.
 */

import { requireInt } from './_checks.js';
import { ConfigError, ConflictError, LeaseLostError, NotFoundError, RunstateError, ValidationError, WaitTimeoutError } from './errors.js';
import { type Duration, durationMs, parseTime, sleep } from './time.js';
import { type Json, type Transport, field, segment } from './transport.js';

const BUDGET_SCALE = 6;
const BUDGET_CURRENCY = 'USD';
const UNITS_MAX = 1_000_000;
// The protocol's allowance window: whole seconds, 1 s to a day.
const WINDOW_S_MAX = 86_400;
const MICROS_PER_UNIT = 1_000_000;

interface BudgetRow {
  id: string;
  scale: number;
}

const permitIds = new WeakMap<Transport, Map<string, string>>();
const allowanceIds = new WeakMap<Transport, Map<string, string>>();
const budgetRows = new WeakMap<Transport, Map<string, BudgetRow>>();

function cache<V>(map: WeakMap<Transport, Map<string, V>>, transport: Transport): Map<string, V> {
  let found = map.get(transport);
  if (found === undefined) {
    found = new Map();
    map.set(transport, found);
  }
  return found;
}

function amount(value: unknown, what: string): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) throw new ConfigError(`${what} must be a non-negative number, got ${String(value)}`);
  return value;
}

/**
 * `value` (a decimal, read exactly from its shortest form: 0.1 is one tenth) in minor units of a
 * budget of `scale`. ConfigError when negative, not a number, or finer than the minor units.
 */
export function toMinor(value: number, scale: number, what: string): bigint {
  amount(value, what);
  const [mantissa = '0', exponentText] = String(value).toLowerCase().split('e');
  const [whole = '0', fraction = ''] = mantissa.split('.');
  const shift = scale + Number(exponentText ?? 0) - fraction.length;
  const digits = BigInt(whole + fraction);
  if (shift >= 0) return digits * 10n ** BigInt(shift);
  const divisor = 10n ** BigInt(-shift);
  if (digits % divisor !== 0n) throw new ConfigError(`${what} ${value} is finer than the budget's minor units (scale ${scale})`);
  return digits / divisor;
}

async function declare(transport: Transport, route: string, name: string, what: string, body: Json): Promise<Json> {
  return transport.request('PUT', `/${route}/by-name/${segment(name, `${what} name`)}`, { body, safe: true });
}

async function permitId(transport: Transport, name: string): Promise<string> {
  const ids = cache(permitIds, transport);
  let id = ids.get(name);
  if (id === undefined) {
    id = field<string>(await declare(transport, 'permits', name, 'pool', {}), 'id');
    ids.set(name, id);
  }
  return id;
}

async function allowanceId(transport: Transport, name: string): Promise<string> {
  const ids = cache(allowanceIds, transport);
  let id = ids.get(name);
  if (id === undefined) {
    id = field<string>(await declare(transport, 'allowances', name, 'limit', {}), 'id');
    ids.set(name, id);
  }
  return id;
}

/** The budget `name`'s id and scale (looked up once); NotFoundError when it does not exist. */
async function budgetRow(transport: Transport, name: string): Promise<BudgetRow> {
  const rows = cache(budgetRows, transport);
  let row = rows.get(name);
  if (row === undefined) {
    const view = await declare(transport, 'budgets', name, 'budget', {});
    row = { id: field<string>(view, 'id'), scale: Number(field(view, 'scale')) };
    rows.set(name, row);
  }
  return row;
}

/** Pools of slots: `rs.pools`. */
export class Pools {
  constructor(private readonly transport: Transport) {}

  /** Create the pool `name` with `size` slots; safe to call every time. ConflictError if it exists with another size. */
  async ensure(name: string, options: { size: number }): Promise<Json> {
    const view = await declare(this.transport, 'permits', name, 'pool', { units: requireInt(options.size, 'size', 1, UNITS_MAX) });
    cache(permitIds, this.transport).set(name, field<string>(view, 'id'));
    return view;
  }

  /** The pool's view (`unitsTotal`, `unitsInUse`, `grants`, ...). NotFoundError if it does not exist. */
  async status(name: string): Promise<Json> {
    return this.transport.request('GET', `/permits/${segment(await permitId(this.transport, name), 'permit id')}`, { safe: true });
  }
}

/** Rate limits: `rs.limits`. */
export class Limits {
  constructor(private readonly transport: Transport) {}

  /**
   * Create the rate limit `name` of `units` per `per` (ms or `'1s'`, `'1m'`; whole seconds, 1 s to
   * a day); safe to call every time. ConflictError if it exists with other sizes.
   */
  async ensure(name: string, options: { units: number; per?: Duration }): Promise<Json> {
    const perMs = durationMs(options.per ?? '1s', 'per');
    if (perMs % 1000 !== 0 || perMs / 1000 > WINDOW_S_MAX) throw new ConfigError(`per must be whole seconds from 1 s to ${WINDOW_S_MAX} s`);
    const body = { unitsLimit: requireInt(options.units, 'units', 1, UNITS_MAX), windowSeconds: perMs / 1000 };
    const view = await declare(this.transport, 'allowances', name, 'limit', body);
    cache(allowanceIds, this.transport).set(name, field<string>(view, 'id'));
    return view;
  }

  /** The limit's view (`unitsLimit`, `windowSeconds`, `remaining`, ...). NotFoundError if it does not exist. */
  async status(name: string): Promise<Json> {
    return this.transport.request('GET', `/allowances/${segment(await allowanceId(this.transport, name), 'allowance id')}`, { safe: true });
  }
}

/** Spend budgets: `rs.budgets`. */
export class Budgets {
  constructor(private readonly transport: Transport) {}

  /** Create the budget `name` with `total` (a decimal, e.g. 25.0); safe to call every time. ConflictError if it exists with another total. */
  async ensure(name: string, options: { total: number }): Promise<Json> {
    const limitMinor = toMinor(options.total, BUDGET_SCALE, 'total');
    if (limitMinor < 1n) throw new ConfigError(`total must be more than 0, got ${options.total}`);
    const view = await declare(this.transport, 'budgets', name, 'budget', { limitMinor: String(limitMinor), scale: BUDGET_SCALE, currency: BUDGET_CURRENCY });
    cache(budgetRows, this.transport).set(name, { id: field<string>(view, 'id'), scale: Number(field(view, 'scale')) });
    return view;
  }

  /** The budget's view (`limitMinor`, `reservedMinor`, `settledMinor`, `scale`, `reservations`, ...). NotFoundError if it does not exist. */
  async status(name: string): Promise<Json> {
    const row = await budgetRow(this.transport, name);
    return this.transport.request('GET', `/budgets/${segment(row.id, 'budget id')}`, { safe: true });
  }
}

/** What a queue's jobs need: pool slots, rate-limit units, a budget reservation. */
export interface Needs {
  /** A pool name, or several (a name given n times is n slots). */
  slots?: string | string[];
  /** A rate limit: a name (one unit) or `{ name, units }`. */
  limit?: string | { name: string; units?: number };
  /**
   * A budget reservation: `{ name, amount }` (a decimal amount, as `budgets.reserve(name, { amount })`
   * names it). `reserve`, the name of earlier releases, still works and warns that it is deprecated.
   */
  budget?: { name: string; amount?: number; reserve?: number };
}

let reserveNameWarned = false;

/** A budget need's amount: `amount`, or the deprecated `reserve` (ConfigError for both or neither). */
function budgetAmount(budget: { name: string; amount?: number; reserve?: number }): number {
  if (budget.amount !== undefined && budget.reserve !== undefined) {
    throw new ConfigError('a budget need takes amount (or the deprecated reserve), not both');
  }
  if (budget.reserve !== undefined) {
    if (!reserveNameWarned) {
      reserveNameWarned = true;
      process.emitWarning("a budget need's reserve is deprecated: name it amount ({ name, amount })", 'DeprecationWarning');
    }
    return budget.reserve;
  }
  if (budget.amount === undefined) throw new ConfigError('a budget need takes an amount: { name, amount }');
  return budget.amount;
}

/** Check `needs` now (ConfigError), before the first submit. */
export function checkNeeds(needs: Needs): void {
  const { slots, limit, budget } = needs;
  if (slots !== undefined) {
    const names = typeof slots === 'string' ? [slots] : slots;
    if (!Array.isArray(names) || names.length === 0) throw new ConfigError('slots must be a pool name or a non-empty list of them');
    for (const name of names) segment(name, 'a pool name in slots');
  }
  if (limit !== undefined) {
    const named = typeof limit === 'string' ? { name: limit } : limit;
    segment(named?.name, 'limit name');
    if (named.units !== undefined) requireInt(named.units, 'limit units', 1, UNITS_MAX);
  }
  if (budget !== undefined) {
    segment(budget?.name, 'budget name');
    amount(budgetAmount(budget), 'budget amount');
  }
}

/**
 * `needs` as the protocol's `requirements` (`{pools: [{name, units}], quotas: [{name, units}],
 * budgets: [{name, reserveMinor}]}`), or undefined for nothing. A budget's reserve is converted
 * exactly to its minor units (NotFoundError for an unknown budget).
 */
export async function requirements(transport: Transport, needs: Needs): Promise<Json | undefined> {
  checkNeeds(needs);
  const body: Json = {};
  if (needs.slots !== undefined) {
    const units = new Map<string, number>();
    for (const name of typeof needs.slots === 'string' ? [needs.slots] : needs.slots) units.set(name, (units.get(name) ?? 0) + 1);
    body.pools = [...units].map(([name, count]) => ({ name, units: count }));
  }
  if (needs.limit !== undefined) {
    const named = typeof needs.limit === 'string' ? { name: needs.limit } : needs.limit;
    body.quotas = [{ name: named.name, units: named.units ?? 1 }];
  }
  if (needs.budget !== undefined) {
    const row = await budgetRow(transport, needs.budget.name);
    const reserveMinor = toMinor(budgetAmount(needs.budget), row.scale, 'budget amount');
    if (reserveMinor < 1n) throw new ConfigError(`budget amount must be at least one minor unit of budget ${needs.budget.name}`);
    body.budgets = [{ name: needs.budget.name, reserveMinor: String(reserveMinor) }];
  }
  return Object.keys(body).length > 0 ? body : undefined;
}

/** An amount spent, in micro-units (summed exactly). ConfigError if negative or not a number. */
export function spentMicros(value: number): number {
  return Math.round(amount(value, 'the amount spent') * MICROS_PER_UNIT);
}

/**
 * Charge `amountMinor` of a protocol reservation (workKey `settle:<id>`, allowOverrun: over the
 * reservation up to what the budget can still cover) and void what it still holds, as the
 * published worker does. A zero charge is a void. ConflictError (CONFLICT) once it had ended.
 */
async function settleReservation(transport: Transport, budgetPath: string, reservationId: string, amountMinor: bigint): Promise<Json> {
  const voidBody = { reservationId, workKey: `void:${reservationId}` };
  if (amountMinor === 0n) return transport.request('POST', `${budgetPath}/void`, { body: voidBody, safe: true });
  const settleBody = { reservationId, amountMinor: String(amountMinor), workKey: `settle:${reservationId}`, allowOverrun: true };
  const answer = await transport.request('POST', `${budgetPath}/settle`, { body: settleBody, safe: true });
  if (answer.state === 'ACTIVE' || answer.state === 'STALE') {
    await transport.request('POST', `${budgetPath}/void`, { body: voidBody, safe: true }).catch(() => undefined); // ended meanwhile: nothing more is held
  }
  return answer;
}

/**
 * After a job's delivery: settle each reservation of its `requirements.budgets` with `spentMicros`
 * (undefined: the whole reservation; over it, up to what the budget still has) and void the rest,
 * as the published worker does. Failures are returned as messages, never thrown (the job's outcome
 * is recorded already).
 */
export async function settleJobReservations(transport: Transport, reservations: readonly string[], needs: Json | undefined, micros: number | undefined): Promise<string[]> {
  const budgets = ((needs?.budgets as Json[] | undefined) ?? []).slice(0, reservations.length);
  const failures: string[] = [];
  for (const [index, need] of budgets.entries()) {
    const reservationId = reservations[index] as string;
    try {
      const row = await budgetRow(transport, String(need.name));
      let amountMinor = BigInt(String(need.reserveMinor));
      if (micros !== undefined) amountMinor = toMinor(micros / MICROS_PER_UNIT, row.scale, 'the amount spent');
      await settleReservation(transport, `/budgets/${segment(row.id, 'budget id')}`, reservationId, amountMinor);
    } catch (error) {
      // CONFLICT: it had ended (the delivery's end or its run's stop voided it).
      failures.push(`settling reservation ${reservationId} of budget ${String(need.name)} failed: ${error instanceof RunstateError ? error.message : String(error)}`);
    }
  }
  return failures;
}

// -- what a run takes directly: slots and rate-limit units ----------------------------------------

export const SLOT_LEASE_MS_DEFAULT = 30_000;
const TAKE_TIMEOUT_MS_DEFAULT = 60_000;
// Polling a waiter in a FIFO line: backing off from the first to the second.
const WAITER_POLL_MS_MIN = 50;
const WAITER_POLL_MS_MAX = 500;
const WAITER_TTL_S_MAX = 3600;
// Renewing: a third of the lease, but not more often than this.
const RENEW_INTERVAL_MS_MIN = 50;
const ALLOWANCE_REFUSALS: ReadonlySet<string> = new Set(['ALLOWANCE_EXHAUSTED', 'ALLOWANCE_COOLDOWN']);

function waiterTtlSeconds(deadline: number): number {
  return Math.min(WAITER_TTL_S_MAX, Math.max(1, Math.ceil((deadline - Date.now()) / 1000) + 1));
}

/**
 * One slot of a pool, held by a run (on the wire a permit's grant: `id` is the grantId). `signal`
 * aborts once a renewal is refused (the lease lapsed, or the run stopped); `lostError` is that
 * refusal.
 */
export class SlotLease {
  readonly signal: AbortSignal;
  lostError: RunstateError | undefined;
  leaseExpiresAt: Date | undefined;
  private readonly controller = new AbortController();

  constructor(
    private readonly transport: Transport,
    readonly id: string,
    readonly name: string,
    readonly scopeId: string,
    readonly leaseMs: number,
    private readonly token: string,
    expires: unknown,
  ) {
    this.signal = this.controller.signal;
    this.leaseExpiresAt = parseTime(expires);
  }

  get lost(): boolean {
    return this.lostError !== undefined;
  }

  /** Extend the lease by `leaseMs` (default: the one it was taken with) from now. LeaseLostError / ScopeCancelledError mark it lost. */
  async renew(leaseMs = this.leaseMs): Promise<Json> {
    const body = { token: this.token, leaseSeconds: requireInt(leaseMs, 'leaseMs', 1) / 1000 };
    try {
      const answer = await this.transport.request('POST', `/grants/${segment(this.id, 'grant id')}/renew`, { body, safe: true });
      this.leaseExpiresAt = parseTime(answer.leaseExpiresAt) ?? this.leaseExpiresAt;
      return answer;
    } catch (error) {
      if (error instanceof ConflictError || error instanceof NotFoundError) {
        this.lostError ??= error;
        this.controller.abort(error);
      }
      throw error;
    }
  }

  /** Give the slot back at once; `{released: false}` when it had lapsed or ended already. Allowed after the run stopped. */
  async release(): Promise<{ released: boolean }> {
    try {
      const answer = await this.transport.request('POST', `/grants/${segment(this.id, 'grant id')}/release`, { body: { token: this.token }, safe: true });
      return { released: Boolean(answer.released) };
    } catch (error) {
      if (error instanceof LeaseLostError) return { released: false };
      throw error;
    }
  }
}

/** `run.pools`: take slots of pools under this run. */
export class ScopePools {
  constructor(
    private readonly transport: Transport,
    readonly scopeId: string,
  ) {}

  /**
   * Take a slot of pool `name`, waiting up to `timeoutMs` (default 60 s) in the pool's FIFO line.
   * Renew it within `leaseMs` (default 30 s) and release it, or use `run.slot(name, fn)`, which
   * does both. WaitTimeoutError when no slot was free in time, ScopeCancelledError /
   * DeadlineExceededError once the run stopped, NotFoundError for an unknown pool.
   */
  async acquire(name: string, options: { leaseMs?: number; timeoutMs?: number } = {}): Promise<SlotLease> {
    const leaseMs = requireInt(options.leaseMs ?? SLOT_LEASE_MS_DEFAULT, 'leaseMs', 1);
    const timeoutMs = requireInt(options.timeoutMs ?? TAKE_TIMEOUT_MS_DEFAULT, 'timeoutMs', 0);
    const transport = this.transport;
    const path = `/permits/${segment(await permitId(transport, name), 'permit id')}`;
    const body: Json = { scopeId: this.scopeId, units: 1, holder: transport.holder, holderSession: transport.holderSession, leaseSeconds: leaseMs / 1000 };
    const tryAcquire = async (extra: Json = {}): Promise<Json | undefined> => {
      try {
        return await transport.request('POST', `${path}/acquire`, { body: { ...body, ...extra }, safe: true });
      } catch (error) {
        if (error instanceof ConflictError && error.code === 'CAPACITY_UNAVAILABLE') return undefined;
        throw error;
      }
    };
    const deadline = Date.now() + timeoutMs;
    let answer = await tryAcquire();
    while (answer === undefined) {
      // Full: join its FIFO line, and take the slot when it is our turn.
      if (Date.now() >= deadline) throw new WaitTimeoutError(`a slot of pool ${name}`, timeoutMs);
      const line = { scopeId: this.scopeId, units: 1, holder: transport.holder, ttlSeconds: waiterTtlSeconds(deadline) };
      const waiter = await transport.request('POST', `${path}/wait`, { body: line, safe: true });
      const waiterPath = `/permit-waiters/${segment(field<string>(waiter, 'waiterId'), 'waiter id')}`;
      let state = waiter.state;
      let pauseMs = WAITER_POLL_MS_MIN;
      try {
        for (;;) {
          if (state === 'SIGNALED') {
            answer = await tryAcquire({ waiterId: field<string>(waiter, 'waiterId') });
            if (answer !== undefined) break;
          } else if (state === 'CANCELLED') {
            answer = await tryAcquire(); // its run stopped (the acquire says how), or it was cancelled
            break;
          } else if (state !== 'WAITING') {
            break; // expired: join again
          }
          if (Date.now() >= deadline) break;
          await sleep(Math.min(pauseMs, deadline - Date.now()));
          pauseMs = Math.min(pauseMs * 1.5, WAITER_POLL_MS_MAX);
          state = (await transport.request('GET', waiterPath, { safe: true })).state;
        }
      } finally {
        if (answer === undefined) await transport.request('POST', `${waiterPath}/cancel`, { body: {}, safe: true }).catch(() => undefined);
      }
    }
    return new SlotLease(transport, field<string>(answer, 'grantId'), name, this.scopeId, leaseMs, field<string>(answer, 'token'), answer.leaseExpiresAt);
  }
}

/** `run.limits`: take units of rate limits under this run. */
export class ScopeLimits {
  constructor(
    private readonly transport: Transport,
    readonly scopeId: string,
  ) {}

  /**
   * Take `units` (default 1) of the rate limit `name`, waiting up to `timeoutMs` (default 60 s)
   * in its FIFO line until the window has room. Taken units are spent. Resolves to
   * `{consumptionId, units}`. WaitTimeoutError when not granted in time, ValidationError for more
   * units than the limit has, ScopeCancelledError once the run stopped, NotFoundError.
   */
  async take(name: string, options: { units?: number; timeoutMs?: number } = {}): Promise<{ consumptionId: string; units: number }> {
    const units = requireInt(options.units ?? 1, 'units', 1, UNITS_MAX);
    const timeoutMs = requireInt(options.timeoutMs ?? TAKE_TIMEOUT_MS_DEFAULT, 'timeoutMs', 0);
    const transport = this.transport;
    const path = `/allowances/${segment(await allowanceId(transport, name), 'allowance id')}`;
    const body = { scopeId: this.scopeId, units, holder: transport.holder };
    const tryConsume = async (): Promise<{ consumptionId: string; units: number } | undefined> => {
      try {
        const answer = await transport.request('POST', `${path}/consume`, { body, safe: true });
        return { consumptionId: field<string>(answer, 'consumptionId'), units };
      } catch (error) {
        if (error instanceof RunstateError && ALLOWANCE_REFUSALS.has(error.code)) return undefined;
        throw error;
      }
    };
    const deadline = Date.now() + timeoutMs;
    let taken = await tryConsume();
    while (taken === undefined) {
      // No room now: join its FIFO line, granted as the window opens.
      if (Date.now() >= deadline) throw new WaitTimeoutError(`${units} units of limit ${name}`, timeoutMs);
      let waiter = await transport.request('POST', `${path}/wait`, { body: { ...body, ttlSeconds: waiterTtlSeconds(deadline) }, safe: true });
      const waiterPath = `/allowance-waiters/${segment(field<string>(waiter, 'waiterId'), 'waiter id')}`;
      let pauseMs = WAITER_POLL_MS_MIN;
      try {
        for (;;) {
          if (waiter.state === 'GRANTED') {
            taken = { consumptionId: field<string>(waiter, 'consumptionId'), units };
            break;
          }
          if (waiter.state !== 'WAITING') {
            taken = await tryConsume(); // cancelled (its run stopped: the consume says how) or expired
            break;
          }
          if (Date.now() >= deadline) break;
          await sleep(Math.min(pauseMs, deadline - Date.now()));
          pauseMs = Math.min(pauseMs * 1.5, WAITER_POLL_MS_MAX);
          waiter = await transport.request('GET', waiterPath, { safe: true });
        }
      } finally {
        if (taken === undefined) {
          // Leave the line; a grant that came meanwhile counts as taken.
          const answer = await transport.request('POST', `${waiterPath}/cancel`, { body: {}, safe: true }).catch(() => undefined);
          if (answer?.state === 'GRANTED' && typeof answer.consumptionId === 'string') taken = { consumptionId: answer.consumptionId, units };
        }
      }
    }
    return taken;
  }
}

/**
 * Hold a slot of pool `name` while `fn(lease)` runs: taken (waiting up to `timeoutMs`), renewed
 * every third of `leaseMs`, released afterwards. If a renewal is refused, `lease.signal` aborts;
 * once `fn` returns, the refusal (LeaseLostError, ScopeCancelledError, ...) is thrown instead of
 * its result.
 */
export async function holdSlot<T>(pools: ScopePools, name: string, fn: (lease: SlotLease) => T | Promise<T>, options: { leaseMs?: number; timeoutMs?: number } = {}): Promise<T> {
  const lease = await pools.acquire(name, options);
  let renewing = false;
  const timer = setInterval(() => {
    if (renewing || lease.lost) return;
    renewing = true;
    lease.renew().then(
      () => (renewing = false),
      () => (renewing = false), // a refusal marks it lost; anything else: next interval
    );
  }, Math.max(lease.leaseMs / 3, RENEW_INTERVAL_MS_MIN));
  try {
    const value = await fn(lease);
    if (lease.lostError !== undefined) throw lease.lostError;
    return value;
  } finally {
    clearInterval(timer);
    await lease.release().catch(() => undefined);
  }
}

// A direct reservation's settleBy: now + its lease, within these bounds.
const SETTLE_BY_S_MIN = 60;
const SETTLE_BY_S_MAX = 86_400;
// Polling while the budget has not enough left.
const RESERVE_POLL_MS_MIN = 100;
const RESERVE_POLL_MS_MAX = 1_000;

/**
 * An amount reserved from a budget by a run. `spend(amount)` reports what was actually spent;
 * `settle()` charges it (default: the sum reported, else the whole reservation) and returns the
 * rest; `release()` returns it whole. On the wire a protocol reservation: it has no lease; its run's
 * stop voids it (a settle then throws LeaseLostError: nothing was charged).
 */
export class Reservation {
  private spentTotalMicros: number | undefined;

  constructor(
    private readonly transport: Transport,
    readonly id: string,
    readonly name: string,
    readonly scopeId: string,
    /** What was reserved, as a decimal. */
    readonly amount: number,
    private readonly budgetPath: string,
    private readonly scale: number,
  ) {}

  /** Report `amount` more spent (no request; `settle` sends the sum). ConfigError if negative. */
  spend(amount: number): void {
    this.spentTotalMicros = (this.spentTotalMicros ?? 0) + spentMicros(amount);
  }

  /** The sum reported with `spend()`, or undefined if it was never called. */
  get spent(): number | undefined {
    return this.spentTotalMicros === undefined ? undefined : this.spentTotalMicros / MICROS_PER_UNIT;
  }

  /** Charge `spent` (default: `this.spent`, else the whole reservation) and return the rest. LeaseLostError once it had ended. */
  async settle(spent?: number): Promise<Json> {
    const amountMinor = toMinor(spent ?? this.spent ?? this.amount, this.scale, 'the amount spent');
    try {
      return await settleReservation(this.transport, this.budgetPath, this.id, amountMinor);
    } catch (error) {
      if (error instanceof ConflictError && error.code === 'CONFLICT') {
        throw new LeaseLostError(`reservation ${this.id} of ${this.name} had ended (its run stopped?): nothing was charged: ${error.message}`, {
          status: error.status ?? null,
        });
      }
      throw error;
    }
  }

  /** Give it back whole; `{released: false}` when it had ended already. */
  async release(): Promise<{ released: boolean }> {
    try {
      const answer = await this.transport.request('POST', `${this.budgetPath}/void`, { body: { reservationId: this.id, workKey: `void:${this.id}` }, safe: true });
      return { released: answer.state === 'VOIDED' || answer.state === 'SETTLED' };
    } catch (error) {
      if (error instanceof ConflictError && error.code === 'CONFLICT') return { released: false };
      throw error;
    }
  }
}

/** `run.budgets`: reserve amounts of spend budgets under this run. */
export class ScopeBudgets {
  constructor(
    private readonly transport: Transport,
    readonly scopeId: string,
  ) {}

  /**
   * Reserve `amount` (a decimal) of budget `name`, waiting up to `timeoutMs` (default 60 s) until
   * that much remains. Its settleBy is now + `leaseMs` (at least a minute). WaitTimeoutError when
   * not enough remained in time, ValidationError for more than the budget's total, ConfigError
   * for an amount finer than its minor units, ScopeCancelledError once the run stopped.
   */
  async reserve(name: string, options: { amount: number; leaseMs?: number; timeoutMs?: number }): Promise<Reservation> {
    const leaseMs = requireInt(options.leaseMs ?? SLOT_LEASE_MS_DEFAULT, 'leaseMs', 1);
    const timeoutMs = requireInt(options.timeoutMs ?? TAKE_TIMEOUT_MS_DEFAULT, 'timeoutMs', 0);
    const row = await budgetRow(this.transport, name);
    const amountMinor = toMinor(options.amount, row.scale, 'amount');
    if (amountMinor < 1n) throw new ConfigError(`amount must be at least one minor unit of budget ${name}`);
    const settleSeconds = Math.min(Math.max(leaseMs / 1000, SETTLE_BY_S_MIN), SETTLE_BY_S_MAX);
    const path = `/budgets/${segment(row.id, 'budget id')}`;
    const body = { scopeId: this.scopeId, amountMinor: String(amountMinor), holder: this.transport.holder };
    const deadline = Date.now() + timeoutMs;
    let pauseMs = RESERVE_POLL_MS_MIN;
    for (;;) {
      try {
        const settleBy = new Date(Date.now() + settleSeconds * 1000).toISOString();
        const answer = await this.transport.request('POST', `${path}/reserve`, { body: { ...body, settleBy }, safe: true });
        return new Reservation(this.transport, field<string>(answer, 'reservationId'), name, this.scopeId, options.amount, path, row.scale);
      } catch (error) {
        if (!(error instanceof ConflictError) || error.code !== 'INSUFFICIENT_BUDGET') throw error;
      }
      const view = await this.transport.request('GET', path, { safe: true });
      if (amountMinor > BigInt(String(view.limitMinor ?? 0))) throw new ValidationError(`a reserve of ${options.amount} is more than the total of budget ${name}`, { status: null });
      if (Date.now() >= deadline) throw new WaitTimeoutError(`${options.amount} of budget ${name}`, timeoutMs);
      await sleep(Math.min(pauseMs, deadline - Date.now()));
      pauseMs = Math.min(pauseMs * 1.5, RESERVE_POLL_MS_MAX);
    }
  }
}

/**
 * Reserve `amount` of budget `name` while `fn(reservation)` runs; afterwards it is settled with
 * what `reservation.spend()` reported (else the whole reservation), or released whole if `fn`
 * threw before reporting anything.
 */
export async function holdBudget<T>(budgets: ScopeBudgets, name: string, amount: number, fn: (reservation: Reservation) => T | Promise<T>, options: { leaseMs?: number; timeoutMs?: number } = {}): Promise<T> {
  const reservation = await budgets.reserve(name, { amount, ...options });
  let value: T;
  try {
    value = await fn(reservation);
  } catch (error) {
    if (reservation.spent === undefined) await reservation.release().catch(() => undefined);
    else await reservation.settle().catch(() => undefined);
    throw error;
  }
  await reservation.settle();
  return value;
}
