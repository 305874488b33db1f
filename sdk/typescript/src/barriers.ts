/** Barriers: release everyone waiting once `target` distinct participants have arrived. */

import { requireInt } from './_checks.js';
import { WAIT_TIMEOUT_MS_DEFAULT, waitUntil } from './_waiting.js';
import { ConflictError } from './errors.js';
import { type Json, type Transport, field, segment } from './transport.js';

export interface BarrierView {
  id: string;
  scopeId: string;
  target: number;
  arrivals: number;
  epoch: number;
  state: 'WAITING' | 'RELEASED' | 'CANCELLED';
  [field: string]: unknown;
}

export class Barriers {
  constructor(
    private readonly transport: Transport,
    readonly scopeId: string,
  ) {}

  /**
   * A new barrier of this run for `target` (1 to 10000) participants: configuration, so the key
   * needs `resource_config` (ForbiddenError without it; `byName` is a worker's call).
   */
  async create(options: { target: number }): Promise<Barrier> {
    const body = { scopeId: this.scopeId, target: requireInt(options.target, 'target', 1, 10_000) };
    const view = (await this.transport.request('POST', '/barriers', { body, safe: false })) as BarrierView;
    return new Barrier(this.transport, field<string>(view, 'id'), view);
  }

  /** The run's barrier called `name`, created on the first call. ConflictError for another target. */
  async byName(name: string, options: { target: number }): Promise<Barrier> {
    const body = { scopeId: this.scopeId, target: requireInt(options.target, 'target', 1, 10_000) };
    const view = (await this.transport.request('PUT', `/barriers/by-name/${segment(name, 'barrier name')}`, { body, safe: true })) as BarrierView;
    return new Barrier(this.transport, field<string>(view, 'id'), view);
  }

  /** A handle on barrier `barrierId` (no request). */
  get(barrierId: string): Barrier {
    return new Barrier(this.transport, barrierId);
  }
}

export class Barrier {
  readonly id: string;
  view: BarrierView | undefined;
  private readonly path: string;

  constructor(
    private readonly transport: Transport,
    barrierId: string,
    view?: BarrierView,
  ) {
    this.path = `/barriers/${segment(barrierId, 'barrier id')}`;
    this.id = barrierId;
    this.view = view;
  }

  /** Arrive as `key` (idempotent per key). ConflictError BARRIER_RELEASED after the release for a new key. */
  async arrive(options: { key: string }): Promise<BarrierView> {
    segment(options.key, 'key');
    this.view = (await this.transport.request('POST', `${this.path}/arrive`, { body: { arrivalKey: options.key }, safe: true })) as BarrierView;
    return this.view;
  }

  /** The barrier's view. */
  async status(): Promise<BarrierView> {
    this.view = (await this.transport.request('GET', this.path, { safe: true })) as BarrierView;
    return this.view;
  }

  /**
   * Wait until the barrier is RELEASED; returns its view. ConflictError BARRIER_CANCELLED if it is
   * cancelled (its run stopped), WaitTimeoutError after `timeoutMs` (default 60 s).
   */
  async wait(options: { timeoutMs?: number } = {}): Promise<BarrierView> {
    let epoch: number | undefined = this.view?.epoch;
    const view = await waitUntil(
      async (waitMs) => {
        const answer = await this.transport.request('GET', `${this.path}/wait`, { query: { waitMs, epoch }, safe: true, longPollMs: waitMs });
        if (epoch === undefined && typeof answer.epoch === 'number') epoch = answer.epoch;
        if (answer.state === 'CANCELLED') throw new ConflictError(`barrier ${this.id} was cancelled`, { code: 'BARRIER_CANCELLED', status: null });
        return answer;
      },
      (answer: Json) => answer.state === 'RELEASED',
      options.timeoutMs ?? WAIT_TIMEOUT_MS_DEFAULT,
      `the release of barrier ${this.id}`,
    );
    this.view = view as BarrierView;
    return this.view;
  }
}
