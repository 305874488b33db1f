/** Tickets: a submitted task, its status and its recorded result. */

import { requireInt } from './_checks.js';
import { ResultTimeoutError } from './errors.js';
import { type Json, type Transport, segment } from './transport.js';
import { sleep } from './time.js';

/** How long `result()` waits when no timeout is given. */
export const RESULT_TIMEOUT_MS_DEFAULT = 60_000;
// One long poll of GET /tasks/{id}; the server holds at most this long.
const RESULT_POLL_SLICE_MS = 30_000;
// Shortest time between two result polls, in case a server answers a long poll early.
const RESULT_POLL_PAUSE_MS_MIN = 100;
export const TASK_STATES_DONE: ReadonlySet<string> = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED', 'EXPIRED']);

/** A task's view as the server gives it (`GET /tasks/{id}`). */
export interface TaskView {
  id: string;
  state: 'QUEUED' | 'RUNNING' | 'SUCCEEDED' | 'FAILED' | 'CANCELLED' | 'EXPIRED' | string;
  done?: boolean;
  /** The completed payload (SUCCEEDED). */
  outcome?: unknown;
  outcomeReason?: string | null;
  /** The last error message. */
  error?: string | null;
  attempt?: number;
  attempts?: number;
  input?: unknown;
  taskKey?: string;
  [field: string]: unknown;
}

/** A submitted task. `created` and `state` come from the submit (undefined when re-attached). */
export class Ticket {
  readonly id: string;
  readonly key: string | undefined;
  readonly created: boolean | undefined;
  state: string | undefined;
  private readonly path: string;

  constructor(
    private readonly transport: Transport,
    taskId: string,
    fields: { key?: string; created?: boolean; state?: string } = {},
  ) {
    this.path = `/tasks/${segment(taskId, 'task id')}`;
    this.id = taskId;
    this.key = fields.key;
    this.created = fields.created;
    this.state = fields.state;
  }

  /** The task's view (`state`, `attempt`, `input`, `outcome`, `outcomeReason`, `error`, ...). NotFoundError if unknown. */
  async status(): Promise<TaskView> {
    const view = (await this.transport.request('GET', this.path, { safe: true })) as TaskView;
    this.state = view.state ?? this.state;
    return view;
  }

  /**
   * Wait until the task has a recorded outcome and return its view. `state` is SUCCEEDED
   * (`outcome` holds the payload), FAILED (`error` holds the last error), CANCELLED or EXPIRED:
   * all are returned, not thrown. Throws ResultTimeoutError if the task is still unfinished after
   * `timeoutMs` (default 60 s; the task goes on), NotFoundError for an unknown task.
   */
  async result(options: { timeoutMs?: number; signal?: AbortSignal } = {}): Promise<TaskView> {
    const timeoutMs = requireInt(options.timeoutMs ?? RESULT_TIMEOUT_MS_DEFAULT, 'timeoutMs', 0);
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const started = Date.now();
      const waitMs = Math.min(Math.max(0, deadline - started), RESULT_POLL_SLICE_MS);
      const view = (await this.transport.request('GET', this.path, {
        query: { waitMs },
        safe: true,
        longPollMs: waitMs,
        ...(options.signal ? { signal: options.signal } : {}),
      })) as TaskView;
      this.state = view.state ?? this.state;
      if (view.done || TASK_STATES_DONE.has(view.state)) return view;
      const now = Date.now();
      if (now >= deadline) throw new ResultTimeoutError(this.id, timeoutMs, this.state);
      if (now - started < RESULT_POLL_PAUSE_MS_MIN) await sleep(Math.min(RESULT_POLL_PAUSE_MS_MIN, deadline - now), options.signal);
    }
  }

  /** Cancel the task if unfinished; a finished task stays as it is. Returns `{taskId, state, outcomeReason}`. */
  async cancel(reason?: string): Promise<Json> {
    const body = reason === undefined ? {} : { reason };
    const answer = await this.transport.request('POST', `${this.path}/cancel`, { body, safe: true });
    if (typeof answer.state === 'string') this.state = answer.state;
    return answer;
  }
}
