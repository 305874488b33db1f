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
import { customKey, makeKey } from './keys.js';
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
        // The message is the handler's last error, as the published clients give it; the job is in
        // `taskId`, `attempts` and `reason`.
        throw new TaskFailedError(reason ?? `job ${name} (${this.id}) failed after ${attempts} attempts: ${view.outcomeReason ?? 'no error recorded'}`, {
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

/** How `gather` judges: `need` accepted results (default `'all'`), `accept(result, input)` (default: every result). */
export interface GatherOptions<O, I> {
  need?: number | 'all';
  accept?: (result: O, input: I) => boolean | Promise<boolean>;
  /** Bound on the wait for each member and for the decision (default an hour). */
  timeoutMs?: number;
}

// The server's bound on a group's members.
const GROUP_MEMBERS_MAX = 100;

/** A queue: call it to submit and wait, `send` to submit only; `serve()` runs its handler in workers. */
export interface Queue<I, O> {
  (input: I): Promise<O>;
  /** Submit `input`; resolves to the Job (the existing one if this input, or key, was already submitted in the run). */
  send(input: I): Promise<Job<O>>;
  /** The job key `input` gets. */
  keyOf(input: I): string;
  /** Submit the inputs as one task group and collect `need` accepted results (see `QueueSpec.gather`). */
  gather(inputs: readonly I[], options?: GatherOptions<O, I>): Promise<O[]>;
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
    readonly getRuntime: () => Runtime,
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

  /**
   * The attempts a submit names: this queue's when it has a handler or was given them; a
   * producer-only queue without them leaves the queue's declared attempts (its worker's) to apply.
   */
  private submitAttempts(): { attempts?: number } {
    return this.handler !== undefined || this.options.attempts !== undefined ? { attempts: this.attempts } : {};
  }

  keyOf(input: I): string {
    // As the published clients: the hash of `[input]`, or the text `key(input)` returns.
    const what = `the key of ${this.name}`;
    if (this.options.key) return customKey(this.name, this.options.key(input), what);
    return makeKey(this.name, [input], what);
  }

  async send(input: I): Promise<Job<O>> {
    const key = this.keyOf(input);
    const rt = this.getRuntime();
    await rt.declareQueue(this.name);
    const needs = await requirements(rt.client.transport, this.options);
    const ticket = await rt.inRun(async (scopeId) =>
      rt.client.scope(scopeId).mailbox(this.name).submit(input, {
        key,
        ...this.submitAttempts(),
        keyOnly: this.options.key !== undefined,
        ...(needs !== undefined ? { requirements: needs } : {}),
      }),
    );
    return new Job<O>(ticket);
  }

  /**
   * Submit every input as a member of one task group and judge each result with `accept`, until
   * `need` results are accepted (or, with `'all'`, every member finished). Resolves to the
   * accepted results in the order they were accepted; the group's run is cancelled afterwards, so
   * unfinished members stop. Rejects with TaskFailedError when `need` can no longer be reached.
   */
  async gather(inputs: readonly I[], options: GatherOptions<O, I> = {}): Promise<O[]> {
    const need = options.need ?? 'all';
    const byKey = new Map<string, I>();
    for (const input of inputs) byKey.set(this.keyOf(input), input);
    if (byKey.size === 0) return [];
    if (byKey.size > GROUP_MEMBERS_MAX) throw new ConfigError(`gather takes at most ${GROUP_MEMBERS_MAX} distinct inputs`);
    if (need !== 'all' && (!Number.isInteger(need) || need < 1 || need > byKey.size)) {
      throw new ConfigError(`need must be 'all' or an integer from 1 to ${byKey.size} (the distinct inputs), got ${String(need)}`);
    }
    const accept = options.accept ?? (() => true);
    const rt = this.getRuntime();
    await rt.declareQueue(this.name);
    const needs = await requirements(rt.client.transport, this.options);
    const group = await rt.inRun((scopeId) =>
      rt.client.scope(scopeId).groups.create({
        mailbox: this.name,
        condition: need === 'all' ? 'ALL_TERMINAL' : 'N_ACCEPTED',
        ...(need === 'all' ? {} : { threshold: need }),
        expectedMembers: byKey.size,
        parentScopeId: scopeId,
      }),
    );
    const accepted: O[] = [];
    try {
      const members = await Promise.all(
        [...byKey].map(async ([key, input]) => ({
          input,
          ticket: await group.submit(input, { key, ...this.submitAttempts(), ...(needs !== undefined ? { requirements: needs } : {}) }),
        })),
      );
      let decided = false;
      await Promise.all(
        members.map(async ({ input, ticket }) => {
          const view = await ticket.result({ timeoutMs: options.timeoutMs ?? RESULT_SLICE_MS });
          if (decided) return;
          if (view.state === 'SUCCEEDED' && (await accept(view.outcome as O, input))) {
            const verdict = await group.accept(ticket.id);
            if (!verdict.late) accepted.push(view.outcome as O);
            decided ||= verdict.groupState === 'FINALIZED';
          } else {
            decided ||= (await group.reject(ticket.id)).groupState === 'FINALIZED';
          }
        }),
      );
      const decision = await group.wait({ timeoutMs: options.timeoutMs ?? RESULT_SLICE_MS });
      if (decision.outcome !== 'SUCCESS' && need !== 'all') {
        throw new TaskFailedError(`gather of ${this.name} did not get ${need} accepted results (${decision.outcomeReason ?? 'undecided'})`, {
          attempts: this.attempts,
        });
      }
      return need === 'all' ? accepted : accepted.slice(0, need);
    } finally {
      // The group's own run: cancelling it stops what is still queued or running (best effort).
      const groupRun = group.scopeId ?? (await group.status().catch(() => undefined))?.scopeId;
      if (groupRun) await rt.client.scope(groupRun).cancel().catch(() => undefined);
    }
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

// Every queue defined in this process with the module-level `queue` and a handler, by name (the
// last definition of a name wins): what the module-level `serve()` runs.
const registry = new Map<string, QueueSpec<unknown, unknown>>();

/**
 * Define the queue `name` with `handler` (one argument, the input; returns the result, a JSON value
 * of at most 64 KB). Options: `attempts` (default 5), `lease` (default `'30s'`), `concurrency`
 * (default 1), `key` (a function of the input that identifies the job), and what each job needs:
 * `slots`, `limit`, `budget` (which must exist). Without a handler, a producer-only queue.
 */
export function queue<I = unknown, O = unknown>(name: string, handler?: (input: I) => O | Promise<O>, options: QueueOptions<I> = {}): Queue<I, Awaited<O>> {
  return queueOn(runtime, registry, name, handler, options);
}

/** `queue` on the runtime `getRuntime` gives, registered in `queues` for its `serve()`. */
export function queueOn<I, O>(
  getRuntime: () => Runtime,
  queues: Map<string, unknown>,
  name: string,
  handler: ((input: I) => O | Promise<O>) | undefined,
  options: QueueOptions<I>,
): Queue<I, Awaited<O>> {
  const spec = new QueueSpec<I, Awaited<O>>(getRuntime, name, handler as ((input: I) => Awaited<O>) | undefined, options);
  if (handler !== undefined) queues.set(name, spec);
  const call = async (input: I): Promise<Awaited<O>> => (await spec.send(input)).result();
  return Object.assign(call, {
    send: (input: I) => spec.send(input),
    gather: (inputs: readonly I[], gatherOptions?: GatherOptions<Awaited<O>, I>) => spec.gather(inputs, gatherOptions),
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
  return serveOn(runtime(), registry, options);
}

/** `serve` on `rt`, running `queues` unless options name them. */
export async function serveOn(rt: Runtime, queues: Map<string, unknown>, options: ServeOptions = {}): Promise<void> {
  const specs = options.queues ? options.queues.map((item) => item.spec as QueueSpec<unknown, unknown>) : ([...queues.values()] as QueueSpec<unknown, unknown>[]);
  if (specs.length === 0) throw new ConfigError('serve() found no queue: define one with runstate.queue(name, handler) (import its module) first');
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
