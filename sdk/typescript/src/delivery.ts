/** A delivery: one task handed to this worker under a lease, and the calls that settle it. */

import { leaseSeconds, requireInt } from './_checks.js';
import type { Completes } from './completes.js';
import { ConflictError, NotFoundError } from './errors.js';
import { type Json, type Transport, field, segment } from './transport.js';
import { parseTime } from './time.js';
import { settleJobReservations, spentMicros } from './resources.js';

// Error messages sent with a retry (the server's bound is 2 KiB).
export const ERROR_MESSAGE_CHARS_MAX = 2_000;

/** What a receive hands out: `{message, token, leaseExpiresAt}`. */
export interface Given {
  message: Json;
  token: string;
  leaseExpiresAt?: unknown;
}

/** An admitted task (`POST /tasks/admit`) as a receive's `Given`. */
export function givenFromAdmitted(admitted: Json): Given {
  const holds = admitted.holds as { reservationId?: string } | null | undefined;
  const reservations = (admitted.reservations as string[] | null | undefined) ?? [];
  return {
    message: {
      id: field<string>(admitted, 'taskId'),
      payload: admitted.payload,
      attempt: admitted.attempt,
      attempts: admitted.attempts,
      workKey: admitted.taskKey,
      scopeId: admitted.scopeId,
      needs: admitted.needs,
      reservations: reservations.filter((id) => id !== holds?.reservationId),
    },
    token: field<string>(admitted, 'token'),
    leaseExpiresAt: admitted.leaseExpiresAt,
  };
}

/**
 * One task handed to this worker under a lease. `id` is the delivery's token (another delivery of
 * the same task has another one), `taskId` the task, `key` its key, `input` its input, `attempt`
 * 1 for the first delivery. `signal` aborts when the lease is lost, the run stopped, or the
 * consumer is stopping the handler.
 */
export class Delivery<T = unknown> {
  readonly id: string;
  readonly taskId: string;
  readonly key: string | undefined;
  readonly input: T;
  readonly attempt: number;
  readonly attempts: number | undefined;
  readonly scopeId: string | undefined;
  /** What the task needs (`{slots, limit, budget, budgets: [{name, reserveMinor}]}`), or undefined. */
  readonly needs: Json | undefined;
  /** The budget reservations of the job's `requirements.budgets`, settled by `complete`. */
  readonly reservations: readonly string[];
  leaseExpiresAt: Date | undefined;
  readonly signal: AbortSignal;
  private readonly controller = new AbortController();
  private readonly path: string;
  private settledFlag = false;
  private spentTotalMicros: number | undefined;
  // Set by consume(): its completes go out together with the other handlers' (completes.ts).
  private completes: Completes | undefined;

  constructor(
    private readonly transport: Transport,
    given: Given,
  ) {
    const message = given.message;
    this.id = given.token;
    this.taskId = field<string>(message, 'id');
    this.path = `/messages/${segment(this.taskId, 'message id')}`;
    this.key = typeof message.workKey === 'string' ? message.workKey : undefined;
    this.input = message.payload as T;
    this.attempt = typeof message.attempt === 'number' ? message.attempt : 0;
    this.attempts = typeof message.attempts === 'number' ? message.attempts : undefined;
    this.scopeId = typeof message.scopeId === 'string' ? message.scopeId : undefined;
    this.needs = message.needs && typeof message.needs === 'object' ? (message.needs as Json) : undefined;
    this.reservations = Array.isArray(message.reservations) ? (message.reservations as string[]) : [];
    this.leaseExpiresAt = parseTime(given.leaseExpiresAt);
    this.signal = this.controller.signal;
  }

  /** True once complete/retry/reject/release was accepted, or the server said the lease is gone. */
  get settled(): boolean {
    return this.settledFlag;
  }

  /**
   * Report `amount` more spent of the job's budget reservation (a decimal, e.g. 0.12; no request).
   * `complete` settles the sum (without it, the whole reservation); retry and reject charge it
   * only when reported. ConfigError for a negative amount.
   */
  spend(amount: number): void {
    this.spentTotalMicros = (this.spentTotalMicros ?? 0) + spentMicros(amount);
  }

  /** The sum reported with `spend()`, or undefined if it was never called. */
  get spent(): number | undefined {
    return this.spentTotalMicros === undefined ? undefined : this.spentTotalMicros / 1_000_000;
  }

  private async settleReservations(whenNothingReported: 'whole' | 'nothing'): Promise<void> {
    if (this.reservations.length === 0) return;
    if (this.spentTotalMicros === undefined && whenNothingReported === 'nothing') return;
    const failures = await settleJobReservations(this.transport, this.reservations, this.needs, this.spentTotalMicros);
    for (const failure of failures) if (process.env.RUNSTATE_SDK_QUIET !== '1') console.warn(`runstate: ${failure}`);
  }

  /** Abort `signal` (used by the consume loop). */
  abort(reason: unknown): void {
    if (!this.controller.signal.aborted) this.controller.abort(reason);
  }

  /** @internal Send this delivery's complete with `completes` (used by the consume loop). */
  completeWith(completes: Completes): void {
    this.completes = completes;
  }

  private async settle(action: string, body: Json): Promise<Json> {
    const wire = { token: this.id, ...body };
    const single = () => this.transport.request('POST', `${this.path}/${action}`, { body: wire, safe: true });
    try {
      const answer = action === 'complete' && this.completes ? await this.completes.complete(this.taskId, wire, single) : await single();
      this.settledFlag = true;
      return answer;
    } catch (error) {
      // STALE_CLAIM, SCOPE_CANCELLED, ...: this delivery is no longer ours to settle.
      if (error instanceof ConflictError || error instanceof NotFoundError) this.settledFlag = true;
      throw error;
    }
  }

  /**
   * Record the task's result: `complete({ payload: {...} })`. Returns `{taskId, state: 'SUCCEEDED'}`.
   * Throws LeaseLostError if the lease lapsed or was taken over (nothing is recorded),
   * ScopeCancelledError / DeadlineExceededError if the run stopped, ResultTooLargeError over 64 KB.
   */
  async complete(result: { payload?: unknown } = { payload: null }): Promise<Json> {
    const payload = result.payload === undefined ? null : result.payload;
    const answer = await this.settle('complete', { result: { ...result, payload } });
    // Completed: the worker settles the job's reservations with what was spent (else the whole
    // reserve) and voids the rest, as the published worker does.
    await this.settleReservations('whole');
    return answer;
  }

  /**
   * Put the task back for another attempt after `delayMs` (default: the server's backoff).
   * Returns `{taskId, state}` (FAILED when the attempts are used up). LeaseLostError if the lease is gone.
   */
  async retry(options: { error?: string; delayMs?: number } = {}): Promise<Json> {
    const body: Json = { retry: true };
    if (options.error !== undefined) body.error = String(options.error).slice(0, ERROR_MESSAGE_CHARS_MAX);
    if (options.delayMs !== undefined) body.delayMs = requireInt(options.delayMs, 'delayMs', 0);
    await this.settleReservations('nothing'); // a failed attempt is charged only what it reported
    return this.settle('nack', body);
  }

  /** Fail the task now, without further attempts. Returns `{taskId, state: 'FAILED'}`. */
  async reject(options: { error?: string } = {}): Promise<Json> {
    const body: Json = { retry: false };
    if (options.error !== undefined) body.error = String(options.error).slice(0, ERROR_MESSAGE_CHARS_MAX);
    await this.settleReservations('nothing');
    return this.settle('nack', body);
  }

  /** Hand the task back at once, no attempt counted. Returns `{taskId, state}`. */
  async release(): Promise<Json> {
    return this.settle('nack', { retry: true, countAttempt: false });
  }

  /**
   * Extend the lease by `leaseMs` (default: the server's) from now; updates `leaseExpiresAt`.
   * LeaseLostError if the lease lapsed or was taken over, ScopeCancelledError /
   * DeadlineExceededError if the run stopped.
   */
  async renew(leaseMs?: number): Promise<Json> {
    const body: Json = { token: this.id };
    if (leaseMs !== undefined) body.leaseSeconds = leaseSeconds(leaseMs);
    const answer = await this.transport.request('POST', `${this.path}/renew`, { body, safe: true });
    const expires = parseTime(answer.leaseExpiresAt);
    if (expires !== undefined) this.leaseExpiresAt = expires;
    return answer;
  }
}
