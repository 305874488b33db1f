/** A work queue within one run: submit tasks, receive or consume deliveries. */

import { leaseSeconds, requireInt } from './_checks.js';
import { Completes } from './completes.js';
import { type ConsumeOptions, Consumer, type Handler, LEASE_MS_DEFAULT } from './consume.js';
import { Delivery, type Given, givenFromAdmitted } from './delivery.js';
import { ConfigError, OutcomeUnknownError } from './errors.js';
import { mailboxId } from './mailboxes.js';
import { Ticket } from './tickets.js';
import { type DateLike, formatTime } from './time.js';
import { type Json, type RequestOptions, type Transport, encodeBody, field, segment } from './transport.js';

const RECEIVE_BATCH_MAX = 100;
const RECEIVE_WAIT_MS_MAX = 30_000;

export interface SubmitOptions {
  /** Identifies the logical task: the same key with the same input returns the existing task. */
  key?: string;
  /** Attempts before the task is FAILED (default: the queue's, else 5). */
  attempts?: number;
  /** With a key: the key alone names the task, whatever its input. */
  keyOnly?: boolean;
  /** The task is EXPIRED if unfinished by then. */
  deadline?: DateLike;
  /** The protocol's `requirements` (`{pools?, quotas?, budgets?}`). */
  requirements?: Json;
}

/** One task of a submit request; ConfigError for a malformed key or attempts. */
export function taskBody(input: unknown, options: SubmitOptions): Json {
  const body = taskFields(input, options);
  encodeBody(body, 'the task'); // ConfigError for an input JSON cannot carry, before any request
  return body;
}

/** The fields of one task, not yet checked for JSON. */
function taskFields(input: unknown, options: SubmitOptions): Json {
  const body: Json = { input: input === undefined ? null : input };
  if (options.keyOnly) {
    if (options.key === undefined) throw new ConfigError('keyOnly needs a key');
    body.keyOnly = true;
  }
  if (options.key !== undefined) {
    if (typeof options.key !== 'string' || !options.key) throw new ConfigError(`key must be a non-empty string, got ${String(options.key)}`);
    body.taskKey = options.key;
  }
  if (options.attempts !== undefined) body.attempts = requireInt(options.attempts, 'attempts', 1, 100);
  if (options.deadline !== undefined) body.deadline = formatTime(options.deadline, 'deadline');
  if (options.requirements !== undefined) body.requirements = options.requirements;
  return body;
}

export class Mailbox {
  constructor(
    private readonly transport: Transport,
    readonly scopeId: string,
    readonly name: string,
  ) {
    segment(scopeId, 'scope id');
    segment(name, 'mailbox name');
  }

  private async where(): Promise<{ scopeId: string; mailboxId: string }> {
    return { scopeId: this.scopeId, mailboxId: await this.resolveId() };
  }

  /** The mailbox's id: asked once per client, then known without a wait. */
  private resolveId(): string | Promise<string> {
    return this.transport.mailboxIds.get(this.name) ?? mailboxId(this.transport, this.name);
  }

  /**
   * Submit a task; returns its Ticket (`created` is false if the key already existed). The same
   * key with the same input returns the existing task (without a key, the server keys it by a hash
   * of its input). Throws KeyConflictError for the same key with another input,
   * ScopeCancelledError / DeadlineExceededError if the run stopped, NotFoundError if the queue
   * does not exist, ValidationError for an input over 64 KB.
   */
  async submit(input: unknown, options: SubmitOptions = {}): Promise<Ticket> {
    const task = taskFields(input, options);
    const taskText = encodeBody(task, 'the task'); // ConfigError for an input JSON cannot carry, before any request
    const id = await this.resolveId();
    // Safe to repeat: the server deduplicates by key (and by the idempotency key). The body is
    // `{scopeId, mailboxId, ...task}`, written around the task's text rather than encoded again.
    const request: RequestOptions = {
      encodedBody: `{"scopeId":${JSON.stringify(this.scopeId)},"mailboxId":${JSON.stringify(id)},${taskText.slice(1)}`,
      safe: true,
    };
    const answer = await this.transport.request('POST', '/tasks', request);
    const fields: { key?: string; created?: boolean; state?: string } = {};
    if (typeof answer.taskKey === 'string') fields.key = answer.taskKey;
    else if (options.key !== undefined) fields.key = options.key;
    if (typeof answer.created === 'boolean') fields.created = answer.created;
    if (typeof answer.state === 'string') fields.state = answer.state;
    return new Ticket(this.transport, field<string>(answer, 'taskId'), fields);
  }

  /**
   * Take up to `max` tasks under a lease of `leaseMs`, waiting up to `waitMs` for one. Returns the
   * deliveries, possibly none. ScopeCancelledError / DeadlineExceededError once the run stopped.
   * A lost answer returns no deliveries (one handed out meanwhile comes back when its lease lapses).
   */
  async receive<T = unknown>(options: { max?: number; leaseMs?: number; waitMs?: number } = {}): Promise<Delivery<T>[]> {
    try {
      return (await this.receiveOnce(options.max ?? 1, options.leaseMs ?? LEASE_MS_DEFAULT, options.waitMs ?? 0, false)) as Delivery<T>[];
    } catch (error) {
      if (error instanceof OutcomeUnknownError) return [];
      throw error;
    }
  }

  private async receiveOnce(max: number, leaseMs: number, waitMs: number, includeDescendants: boolean, signal?: AbortSignal): Promise<Delivery<unknown>[]> {
    const lease = {
      holder: this.transport.holder,
      holderSession: this.transport.holderSession,
      max: requireInt(max, 'max', 1, RECEIVE_BATCH_MAX),
      leaseSeconds: leaseSeconds(leaseMs),
      waitMs: requireInt(waitMs, 'waitMs', 0, RECEIVE_WAIT_MS_MAX),
    };
    const where = await this.where();
    const common = { safe: false, longPollMs: waitMs, ...(signal ? { signal } : {}) };
    if (includeDescendants) {
      const answer = await this.transport.request('POST', '/tasks/admit', { body: { ...where, ...lease, includeDescendants: true }, ...common });
      return ((answer.tasks as Json[] | undefined) ?? []).map((admitted) => new Delivery(this.transport, givenFromAdmitted(admitted)));
    }
    const answer = await this.transport.request('POST', `/mailboxes/${segment(where.mailboxId, 'mailbox id')}/recv`, {
      body: { scopeId: where.scopeId, ...lease },
      ...common,
    });
    // 204 (nothing to hand out) arrives as {}.
    return ((answer.messages as Given[] | undefined) ?? []).map((given) => new Delivery(this.transport, given));
  }

  /**
   * Run `handler(data, delivery)` for each task of this queue, up to `concurrency` at once. While
   * it runs, its lease is renewed every third of `leaseMs`. When it returns without settling the
   * delivery itself, the delivery is completed with `{payload: <return value>}`; when it throws,
   * the delivery is retried (attempt + 1, after a backoff). If the lease is lost or the run stops,
   * `delivery.signal` aborts and the delivery is left alone. A handler's slot takes the next task
   * as soon as the handler returns, while its delivery is being completed (so at most four times
   * `concurrency` deliveries are held, those beyond `concurrency` being completed).
   *
   * Resolves when the run is cancelled, completed or past its deadline, or when `signal` aborts
   * (running handlers get up to 30 s). Rides out short outages; rejects with UnavailableError if
   * no server answers at the start or for a long time, and with any other error of a receive.
   */
  async consume<T = unknown>(handler: Handler<T>, options: ConsumeOptions = {}): Promise<void> {
    const includeDescendants = options.includeDescendants ?? false;
    const consumer = new Consumer<T>(
      `${this.name}@${this.scopeId}`,
      (max, leaseMs, waitMs, signal) => this.receiveOnce(max, leaseMs, waitMs, includeDescendants, signal),
      handler,
      options,
      new Completes(this.transport),
    );
    await consumer.run();
  }
}
