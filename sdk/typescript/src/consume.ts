/**
 * The consume loop behind `Mailbox.consume`: receive, run handlers, keep leases, settle.
 *
 * The loop long-polls for as many deliveries as it has free handler slots; each delivery gets its
 * handler and a renewal timer. The renewer extends the lease every third of it and aborts the
 * delivery's signal when the lease is lost or the run stopped. Whatever the handler does not settle
 * itself is settled here: completed with its return value, retried with its error. The completes of
 * the call's deliveries (the handler's own too) go out together while one is in flight (completes.ts).
 */

import { requireInt } from './_checks.js';
import type { Completes } from './completes.js';
import { Delivery, ERROR_MESSAGE_CHARS_MAX } from './delivery.js';
import {
  ConfigError,
  DeadlineExceededError,
  LeaseLostError,
  NotFoundError,
  OutcomeUnknownError,
  RunstateError,
  ScopeCancelledError,
  UnavailableError,
} from './errors.js';
import { sleep } from './time.js';

export const CONCURRENCY_MAX = 1_000;
export const LEASE_MS_DEFAULT = 30_000;
// Long-poll wait of one receive.
const RECEIVE_WAIT_MS = 10_000;
const RECEIVE_BATCH_MAX = 100;
// Deliveries whose handler returned and whose settle (complete or retry) is still on its way, per
// handler slot: a slot is free again once its handler returns, so at most concurrency * (1 + this)
// deliveries are held. One complete call is in flight at a time and the next carries what piled up
// meanwhile, so this is how deep a worker's pipeline is: with 1, a worker of quick handlers spent
// every other round trip waiting for its complete to free deliveries for the next receive.
const SETTLING_PER_SLOT = 3;
// How long a stopping consume() lets running handlers finish before it gives up on them.
export const DRAIN_TIMEOUT_MS = 30_000;
// Backoff between receives while no server answers, and how long an outage is ridden out.
const BACKOFF_MS_INITIAL = 100;
const BACKOFF_MS_MAX = 5_000;
const UNAVAILABLE_MS_MAX = 60_000;
// Renewing: a third of the lease, but not more often than this.
const RENEW_INTERVAL_MS_MIN = 50;

export type Handler<T> = (data: T, delivery: Delivery<T>) => unknown;

export interface ConsumeOptions {
  /** Handlers running at once (1 to 1000, default 1). */
  concurrency?: number;
  /** The delivery lease, renewed every third of it (default 30 000 ms). */
  leaseMs?: number;
  /** Stops the loop: no new work, running handlers get up to 30 s, then their signals abort. */
  signal?: AbortSignal;
  /** Also take this queue's tasks of the runs below this one (a task group's run, say). */
  includeDescendants?: boolean;
}

export type Receive = (max: number, leaseMs: number, waitMs: number, signal: AbortSignal) => Promise<Delivery<unknown>[]>;

function describe(error: unknown): string {
  const text = error instanceof Error ? `${error.name}: ${error.message}` : `Error: ${String(error)}`;
  return text.slice(0, ERROR_MESSAGE_CHARS_MAX);
}

function isRunStopped(error: unknown): boolean {
  return error instanceof ScopeCancelledError || error instanceof DeadlineExceededError;
}

function warn(message: string): void {
  if (process.env.RUNSTATE_SDK_QUIET !== '1') console.warn(`runstate: ${message}`);
}

export class Consumer<T> {
  private readonly concurrency: number;
  private readonly leaseMs: number;
  private readonly running = new Set<Promise<void>>();
  private readonly deliveries = new Set<Delivery<unknown>>();
  // Of `deliveries`, those whose handler is done and whose settle is on its way: they hold no slot.
  private readonly settling = new Set<Delivery<unknown>>();
  // Resolved when a handler returns (a slot came free while its delivery settles).
  private handlerReturned: (() => void) | undefined;
  // Aborted when the user's signal aborts or a renewal learns that the run stopped.
  private readonly stopping = new AbortController();

  constructor(
    private readonly name: string,
    private readonly receive: Receive,
    private readonly handler: Handler<T>,
    options: ConsumeOptions,
    // The completes of this call's deliveries, sent together while one is in flight.
    private readonly completes?: Completes,
  ) {
    if (typeof handler !== 'function') throw new ConfigError('handler must be a function');
    this.concurrency = requireInt(options.concurrency ?? 1, 'concurrency', 1, CONCURRENCY_MAX);
    this.leaseMs = requireInt(options.leaseMs ?? LEASE_MS_DEFAULT, 'leaseMs', 1);
    const user = options.signal;
    if (user) {
      if (user.aborted) this.stopping.abort();
      else user.addEventListener('abort', () => this.stopping.abort(), { once: true });
    }
  }

  async run(): Promise<void> {
    try {
      await this.loop();
    } finally {
      await this.drain();
    }
  }

  private async loop(): Promise<void> {
    const stop = this.stopping.signal;
    const stopped = abortPromise(stop);
    let contacted = false;
    let unavailableSince: number | undefined;
    let backoffMs = BACKOFF_MS_INITIAL;
    while (!stop.aborted) {
      const held = this.running.size;
      const free = Math.min(
        this.concurrency - (held - this.settling.size), // slots without a running handler
        this.concurrency * (1 + SETTLING_PER_SLOT) - held, // the bound on deliveries held
      );
      if (free < 1) {
        const returned = new Promise<void>((resolve) => {
          this.handlerReturned = resolve;
        });
        await Promise.race([...this.running, stopped, returned]);
        this.handlerReturned = undefined;
        continue;
      }
      let deliveries: Delivery<unknown>[];
      try {
        deliveries = await this.receive(Math.min(free, RECEIVE_BATCH_MAX), this.leaseMs, RECEIVE_WAIT_MS, stop);
      } catch (error) {
        if (stop.aborted) return; // the receive in flight was given up
        if (isRunStopped(error)) return;
        if (error instanceof UnavailableError) {
          const now = Date.now();
          contacted ||= error instanceof OutcomeUnknownError;
          unavailableSince ??= now;
          if (!contacted || now - unavailableSince > UNAVAILABLE_MS_MAX) throw error;
          warn(`consume ${this.name}: ${error.message}; receiving again in ${backoffMs} ms`);
          await sleep(backoffMs, stop);
          backoffMs = Math.min(backoffMs * 2, BACKOFF_MS_MAX);
          continue;
        }
        throw error;
      }
      contacted = true;
      unavailableSince = undefined;
      backoffMs = BACKOFF_MS_INITIAL;
      if (stop.aborted) {
        await Promise.all(deliveries.map((delivery) => releaseQuietly(delivery)));
        return;
      }
      for (const delivery of deliveries) {
        if (this.completes) delivery.completeWith(this.completes);
        const task = this.handle(delivery as Delivery<T>).finally(() => {
          this.running.delete(task);
          this.deliveries.delete(delivery);
          this.settling.delete(delivery);
        });
        this.running.add(task);
        this.deliveries.add(delivery);
      }
    }
  }

  private async drain(): Promise<void> {
    if (this.running.size === 0) return;
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, DRAIN_TIMEOUT_MS);
    });
    await Promise.race([Promise.all([...this.running]), timedOut]);
    clearTimeout(timer);
    // Handlers still running past the grace period: abort their signals and hand the tasks back.
    for (const delivery of this.deliveries) {
      delivery.abort(new LeaseLostError('consume() stopped before the handler finished', { status: null }));
      if (!delivery.settled) await releaseQuietly(delivery);
    }
  }

  /** Run one handler under a renewed lease and settle its delivery. Never rejects. */
  private async handle(delivery: Delivery<T>): Promise<void> {
    let lost: string | undefined;
    let renewing = false;
    const intervalMs = Math.max(this.leaseMs / 3, RENEW_INTERVAL_MS_MIN);
    const renewer = setInterval(() => {
      if (renewing || delivery.settled || lost !== undefined) return;
      renewing = true;
      delivery.renew(this.leaseMs).then(
        () => {
          renewing = false;
        },
        (error: unknown) => {
          renewing = false;
          if (delivery.settled) return;
          if (error instanceof LeaseLostError || error instanceof NotFoundError || isRunStopped(error)) {
            lost = isRunStopped(error) ? `the run stopped (${(error as RunstateError).code})` : `the lease is lost (${describe(error)})`;
            if (isRunStopped(error)) this.stopping.abort();
            delivery.abort(error);
          } else {
            // UNAVAILABLE and the like: try again at the next interval; the lease may still hold.
            warn(`consume ${this.name}: renewing delivery ${delivery.taskId} failed: ${describe(error)}`);
          }
        },
      );
    }, intervalMs);
    let value: unknown;
    let failed: unknown;
    let threw = false;
    try {
      value = await this.handler(delivery.input, delivery);
    } catch (error) {
      threw = true;
      failed = error;
    } finally {
      clearInterval(renewer);
    }
    try {
      if (lost !== undefined) {
        warn(`consume ${this.name}: delivery ${delivery.taskId} abandoned: ${lost}`);
        return;
      }
      // The handler is done: its slot is free for the next delivery while this one settles.
      this.settling.add(delivery);
      this.handlerReturned?.();
      if (!threw) {
        if (!delivery.settled) await this.complete(delivery, value);
        return;
      }
      if (failed instanceof LeaseLostError) {
        warn(`consume ${this.name}: delivery ${delivery.taskId}: ${describe(failed)}`);
        return;
      }
      warn(`consume ${this.name}: handler of ${delivery.taskId} (attempt ${delivery.attempt}) threw ${describe(failed)}`);
      if (!delivery.settled) await retryQuietly(delivery, describe(failed));
    } catch (error) {
      warn(`consume ${this.name}: settling delivery ${delivery.taskId} failed: ${describe(error)}`);
    }
  }

  private async complete(delivery: Delivery<T>, value: unknown): Promise<void> {
    try {
      await delivery.complete({ payload: value === undefined ? null : value });
    } catch (error) {
      if (error instanceof LeaseLostError || isRunStopped(error)) {
        warn(`consume ${this.name}: completing ${delivery.taskId} refused: ${describe(error)}`);
        return;
      }
      warn(`consume ${this.name}: completing ${delivery.taskId} failed: ${describe(error)}`);
      if (!delivery.settled) await retryQuietly(delivery, `completing failed: ${describe(error)}`);
    }
  }
}

function abortPromise(signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) resolve();
    else signal.addEventListener('abort', () => resolve(), { once: true });
  });
}

async function retryQuietly(delivery: Delivery<unknown>, error: string): Promise<void> {
  try {
    await delivery.retry({ error });
  } catch (failure) {
    warn(`retrying delivery ${delivery.taskId} failed: ${describe(failure)}`);
  }
}

async function releaseQuietly(delivery: Delivery<unknown>): Promise<void> {
  try {
    await delivery.release();
  } catch {
    // best effort: the lease lapses anyway
  }
}
