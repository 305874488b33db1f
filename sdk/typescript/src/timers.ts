/** Timers: durable wakeups at a time or after a delay, fired on the server. */

import { WAIT_TIMEOUT_MS_DEFAULT, waitUntil } from './_waiting.js';
import { ConfigError } from './errors.js';
import { type DateLike, formatTime, parseTime } from './time.js';
import { type Json, type Transport, field, segment } from './transport.js';

export interface TimerView {
  id: string;
  scopeId: string;
  state: 'ARMED' | 'FIRED' | 'ACKED' | 'CANCELLED';
  fireAt: string;
  firedAt: string | null;
  [field: string]: unknown;
}

function when(options: { at?: DateLike; afterSeconds?: number }): Json {
  if ((options.at === undefined) === (options.afterSeconds === undefined)) throw new ConfigError('give exactly one of at and afterSeconds');
  if (options.at !== undefined) return { at: formatTime(options.at, 'at') };
  if (typeof options.afterSeconds !== 'number' || !Number.isFinite(options.afterSeconds) || options.afterSeconds < 0) {
    throw new ConfigError(`afterSeconds must be a non-negative number, got ${String(options.afterSeconds)}`);
  }
  return { afterSeconds: options.afterSeconds };
}

export class Timers {
  constructor(
    private readonly transport: Transport,
    readonly scopeId: string,
  ) {}

  /** Arm a timer of this run at `at` (a Date or ISO string) or after `afterSeconds`. */
  async create(options: { at?: DateLike; afterSeconds?: number }): Promise<Timer> {
    const view = (await this.transport.request('POST', '/timers', { body: { scopeId: this.scopeId, ...when(options) }, safe: false })) as TimerView;
    return new Timer(this.transport, field<string>(view, 'id'), view);
  }

  /** The run's timer called `name`, armed by the first call; later calls return it as it is. */
  async byName(name: string, options: { at?: DateLike; afterSeconds?: number }): Promise<Timer> {
    const body = { scopeId: this.scopeId, ...when(options) };
    const view = (await this.transport.request('PUT', `/timers/by-name/${segment(name, 'timer name')}`, { body, safe: true })) as TimerView;
    return new Timer(this.transport, field<string>(view, 'id'), view);
  }

  /** A handle on timer `timerId`, e.g. after a restart (no request). */
  get(timerId: string): Timer {
    return new Timer(this.transport, timerId);
  }
}

export class Timer {
  readonly id: string;
  view: TimerView | undefined;
  private readonly path: string;

  constructor(
    private readonly transport: Transport,
    timerId: string,
    view?: TimerView,
  ) {
    this.path = `/timers/${segment(timerId, 'timer id')}`;
    this.id = timerId;
    this.view = view;
  }

  /** When it fires (undefined until a view was fetched). */
  get fireAt(): Date {
    return parseTime(this.view?.fireAt) as Date;
  }

  /** The timer's view. */
  async status(): Promise<TimerView> {
    this.view = (await this.transport.request('GET', this.path, { safe: true })) as TimerView;
    return this.view;
  }

  /**
   * Wait for the timer to fire and acknowledge it in the same call (so the key needs
   * `coordination_write`: ForbiddenError without it); returns `{firedAt, view}`. ConflictError if
   * it was cancelled, WaitTimeoutError after `timeoutMs` (default 60 s).
   */
  async wait(options: { timeoutMs?: number } = {}): Promise<{ firedAt: Date; view: TimerView }> {
    const view = (await waitUntil(
      (waitMs) => this.transport.request('POST', `${this.path}/wait`, { query: { waitMs }, safe: true, longPollMs: waitMs }),
      (answer) => answer.done === true,
      options.timeoutMs ?? WAIT_TIMEOUT_MS_DEFAULT,
      `timer ${this.id}`,
    )) as TimerView;
    this.view = view;
    return { firedAt: parseTime(view.firedAt) ?? new Date(), view };
  }

  /** Disarm the timer if it has not fired (idempotent); ConflictError once it fired. */
  async cancel(): Promise<TimerView> {
    this.view = (await this.transport.request('POST', `${this.path}/cancel`, { body: {}, safe: true })) as TimerView;
    return this.view;
  }
}
