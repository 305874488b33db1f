/**
 * `runstate.queue` and `runstate.serve`: hand work to worker processes.
 *
 *     export const research = runstate.queue('research', async (input) => ..., { attempts: 5, lease: '60s', concurrency: 4 });
 *     const report = await research({ company: 'acme' });   // producer: submit and wait
 *     const job = await research.send({ company: 'globex' }); // or submit now, collect later
 *     await runstate.serve();                                // worker: run every queue of the process
 *
 * A queue is a work queue (mailbox, mode WORK) named after it, in the current run (see
 * `runstate.configure`). A job's key is `<name>:<hash of the input>` (or of `key(input)`), so the
 * same input in a run is the same job. `serve()` consumes every queue: leases are renewed while
 * the handler runs, its return value is recorded, an error puts the job back with backoff, a
 * result from a worker whose lease lapsed is dropped quietly.
 */

import { requireInt } from './_checks.js';
import { resultValue } from './_results.js';
import { CONCURRENCY_MAX, DRAIN_TIMEOUT_MS } from './consume.js';
import { runInContext } from './context.js';
import type { Delivery } from './delivery.js';
import {
  ConfigError,
  ConflictError,
  DeadlineExceededError,
  NotFoundError,
  ResultTimeoutError,
  RunstateError,
  ScopeCancelledError,
  TaskFailedError,
} from './errors.js';
import { makeKey } from './keys.js';
import { type Needs, checkNeeds, requirements } from './resources.js';
import { type Runtime, runtime } from './runtime.js';
import type { Ticket, TaskView } from './tickets.js';
import { type Duration, durationMs } from './time.js';
import type { Json } from './transport.js';

export const QUEUE_ATTEMPTS_DEFAULT = 5;
const QUEUE_LEASE_DEFAULT = '30s';
// One wait for a job's result when no timeout is given (then waited again).
const RESULT_SLICE_MS = 3_600_000;

export interface QueueOptions<I> extends Needs {
  /** Attempts before the job is FAILED (1 to 100, default 5). */
  attempts?: number;
  /** After this a dead worker's job is taken over: ms or `'60s'` (default 30 s). */
  lease?: Duration;
  /** Jobs at once per `serve()` (default 1). */
  concurrency?: number;
  /** What identifies the job instead of the whole input. */
  key?: (input: I) => unknown;
}

/** A submitted job: `id` (the task id), `key`, `created` (false when the same work was already submitted in the run). */
export class Job<O = unknown> {
  readonly id: string;
  readonly key: string | undefined;
  readonly created: boolean | undefined;

  constructor(private readonly ticket: Ticket) {
    this.id = ticket.id;
    this.key = ticket.key;
    this.created = ticket.created;
  }

  /**
   * Wait for the job's outcome and return the handler's result. Rejects with TaskFailedError (the
   * last error in its message) when its attempts are used, ScopeCancelledError /
   * DeadlineExceededError when its run was cancelled or ran out of time first,
   * ResultTimeoutError after `timeoutMs` (the job goes on).
   */
  async result(options: { timeoutMs?: number; timeout?: Duration } = {}): Promise<O> {
    const limit = options.timeoutMs ?? (options.timeout !== undefined ? durationMs(options.timeout, 'timeout') : undefined);
    let view: TaskView;
    for (;;) {
      try {
        view = await this.ticket.result({ timeoutMs: limit ?? RESULT_SLICE_MS });
        break;
      } catch (error) {
        if (!(error instanceof ResultTimeoutError) || limit !== undefined) throw error;
      }
    }
    return this.outcome(view);
  }

  private async outcome(view: TaskView): Promise<O> {
    const name = this.key ?? this.id;
    switch (view.state) {
      case 'SUCCEEDED':
        return view.outcome as O;
      case 'FAILED': {
        const task = await this.ticket.status();
        const attempts = Number(task.attempt ?? 0);
        const reason = typeof view.error === 'string' ? view.error : undefined;
        throw new TaskFailedError(`job ${name} (${this.id}) failed after ${attempts} attempts: ${reason ?? view.outcomeReason ?? ''}`, {
          attempts,
          taskId: this.id,
          ...(reason !== undefined ? { reason } : {}),
        });
      }
      case 'CANCELLED':
        throw new ScopeCancelledError(`job ${name} (${this.id}) was cancelled with its run`, { status: null });
      case 'EXPIRED':
        throw new DeadlineExceededError(`job ${name} (${this.id}) expired: its run is past its deadline`, { status: null });
      default:
        throw new RunstateError(`job ${this.id} ended in an unknown state ${String(view.state)}`, { code: 'INVALID_RESPONSE', status: null });
    }
  }
}

/** A queue: call it to submit and wait, `send` to submit only; `serve()` runs its handler in workers. */
export interface Queue<I, O> {
  (input: I): Promise<O>;
  /** Submit `input`; resolves to the Job (the existing one if this input, or key, was already submitted in the run). */
  send(input: I): Promise<Job<O>>;
  /** The job key `input` gets. */
  keyOf(input: I): string;
  readonly queueName: string;
  readonly attempts: number;
  readonly leaseMs: number;
  readonly concurrency: number;
  /** @internal */
  readonly spec: QueueSpec<I, O>;
}

/** @internal */
export class QueueSpec<I, O> {
  readonly attempts: number;
  readonly leaseMs: number;
  readonly concurrency: number;

  constructor(
    readonly name: string,
    readonly handler: ((input: I) => O | Promise<O>) | undefined,
    readonly options: QueueOptions<I>,
  ) {
    if (typeof name !== 'string' || !name) throw new ConfigError('a queue needs a non-empty name');
    if (handler !== undefined && typeof handler !== 'function') throw new ConfigError("a queue's handler must be a function");
    if (options.key !== undefined && typeof options.key !== 'function') throw new ConfigError('key must be a function of the input');
    this.attempts = requireInt(options.attempts ?? QUEUE_ATTEMPTS_DEFAULT, 'attempts', 1, 100);
    this.leaseMs = durationMs(options.lease ?? QUEUE_LEASE_DEFAULT, 'lease');
    this.concurrency = requireInt(options.concurrency ?? 1, 'concurrency', 1, CONCURRENCY_MAX);
    checkNeeds(options); // ConfigError now, not at the first submit
  }

  keyOf(input: I): string {
    const value = this.options.key ? this.options.key(input) : input;
    return makeKey(this.name, value, `the key of ${this.name}`);
  }

  async send(input: I): Promise<Job<O>> {
    const key = this.keyOf(input);
    const rt = runtime();
    await rt.declareQueue(this.name);
    const needs = await requirements(rt.client.transport, this.options);
    const ticket = await rt.inRun(async (scopeId) =>
      rt.client.scope(scopeId).mailbox(this.name).submit(input, {
        key,
        attempts: this.attempts,
        keyOnly: this.options.key !== undefined,
        ...(needs !== undefined ? { requirements: needs } : {}),
      }),
    );
    return new Job<O>(ticket);
  }

  /**
   * A worker declares the queue with its attempts and what its jobs need, so that jobs a producer
   * submits without them (a published client's, or a producer that does not define the handler)
   * still hold them. A queue declared with other settings keeps them (a warning).
   */
  async declare(rt: Runtime): Promise<void> {
    let needs: Json | undefined;
    try {
      needs = await requirements(rt.client.transport, this.options);
    } catch (error) {
      if (!(error instanceof NotFoundError)) throw error;
      warn(`serve: queue ${this.name} not declared with its needs: ${error.message}`);
    }
    try {
      await rt.declareQueue(this.name, { maxAttempts: this.attempts, ...(needs !== undefined ? { requirements: needs } : {}) });
    } catch (error) {
      if (!(error instanceof ConflictError) || error.code !== 'CONFLICT') throw error;
      warn(`serve: queue ${this.name} is declared with other settings, kept: ${error.message}`);
    }
  }

  /** The handler given to `consume`: sets `context()`, runs the user's handler, checks the result. */
  consumeHandler(scopeId: string): (data: unknown, delivery: Delivery<unknown>) => Promise<unknown> {
    const handler = this.handler;
    if (handler === undefined) throw new ConfigError(`queue ${this.name} has no handler to serve`);
    const what = `the result of queue ${this.name}`;
    return async (data, delivery) => {
      const context = {
        signal: delivery.signal,
        attempt: delivery.attempt,
        key: delivery.key ?? '',
        runId: delivery.scopeId ?? scopeId,
        spend: (amount: number) => delivery.spend(amount),
      };
      const value = await runInContext(context, () => handler(data as I));
      return resultValue(value, what);
    };
  }
}

function warn(message: string): void {
  if (process.env.RUNSTATE_SDK_QUIET !== '1') console.warn(`runstate: ${message}`);
}

// Every queue defined in this process with a handler, by name (the last definition of a name wins).
const registry = new Map<string, QueueSpec<unknown, unknown>>();

/**
 * Define the queue `name` with `handler` (one argument, the input; returns the result, a JSON value
 * of at most 64 KB). Options: `attempts` (default 5), `lease` (default `'30s'`), `concurrency`
 * (default 1), `key` (a function of the input that identifies the job), and what each job needs:
 * `slots`, `limit`, `budget` (which must exist). Without a handler, a producer-only queue.
 */
export function queue<I = unknown, O = unknown>(name: string, handler?: (input: I) => O | Promise<O>, options: QueueOptions<I> = {}): Queue<I, Awaited<O>> {
  const spec = new QueueSpec<I, Awaited<O>>(name, handler as ((input: I) => Awaited<O>) | undefined, options);
  if (handler !== undefined) registry.set(name, spec as QueueSpec<unknown, unknown>);
  const call = async (input: I): Promise<Awaited<O>> => (await spec.send(input)).result();
  return Object.assign(call, {
    send: (input: I) => spec.send(input),
    keyOf: (input: I) => spec.keyOf(input),
    queueName: name,
    attempts: spec.attempts,
    leaseMs: spec.leaseMs,
    concurrency: spec.concurrency,
    spec,
  });
}

export interface ServeOptions {
  /** The queues to run (default: every queue defined in this process with a handler). */
  queues?: Queue<never, unknown>[];
  /** Stops serving like SIGTERM does. */
  signal?: AbortSignal;
  /** Also stop on SIGTERM and SIGINT (default true). */
  handleSignals?: boolean;
}

async function serveIn(rt: Runtime, specs: QueueSpec<unknown, unknown>[], stop: AbortController): Promise<void> {
  for (const spec of specs) await spec.declare(rt);
  const [scopeId, isDefault] = await rt.scopeId();
  const scope = rt.client.scope(scopeId);
  const consumers = specs.map((spec) =>
    scope.mailbox(spec.name).consume(spec.consumeHandler(scopeId), {
      concurrency: spec.concurrency,
      leaseMs: spec.leaseMs,
      signal: stop.signal,
      includeDescendants: true,
    }),
  );
  const outcomes = consumers.map((consumer) => consumer.then(() => undefined, (error: unknown) => error));
  // One ended (the run stopped, or an error): the others stop too, draining their handlers.
  await Promise.race(outcomes);
  const stoppedByRun = !stop.signal.aborted;
  stop.abort();
  const errors = (await Promise.all(outcomes)).filter((outcome) => outcome !== undefined);
  if (stoppedByRun && isDefault) rt.forgetDefault(scopeId);
  if (errors.length > 0) throw errors[0];
}

/**
 * Run the queues of this process until the run stops or the process gets SIGTERM or SIGINT.
 * Takes up to each queue's `concurrency` jobs at once, renews their leases, records the return
 * values, puts a job back with backoff when its handler throws. On stopping it takes no new work
 * and waits up to 30 s for running handlers. ConfigError when no queue is defined,
 * UnavailableError when no server answers for a long time.
 */
export async function serve(options: ServeOptions = {}): Promise<void> {
  const specs = options.queues ? options.queues.map((item) => item.spec as QueueSpec<unknown, unknown>) : [...registry.values()];
  if (specs.length === 0) throw new ConfigError('serve() found no queue: define one with runstate.queue(name, handler) (import its module) first');
  const rt = runtime();
  const stop = new AbortController();
  const onSignal = (): void => {
    if (process.env.RUNSTATE_SDK_QUIET !== '1') console.warn(`runstate: stopping: no new work, up to ${DRAIN_TIMEOUT_MS / 1000} s for running handlers`);
    stop.abort();
  };
  const handleSignals = options.handleSignals ?? true;
  if (handleSignals) {
    process.once('SIGTERM', onSignal);
    process.once('SIGINT', onSignal);
  }
  const user = options.signal;
  if (user) {
    if (user.aborted) stop.abort();
    else user.addEventListener('abort', () => stop.abort(), { once: true });
  }
  try {
    await serveIn(rt, specs, stop);
  } finally {
    if (handleSignals) {
      process.removeListener('SIGTERM', onSignal);
      process.removeListener('SIGINT', onSignal);
    }
  }
}
