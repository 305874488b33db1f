/** Waiting on a server long poll in slices until a condition holds or a timeout passes. */

import { requireInt } from './_checks.js';
import { WaitTimeoutError } from './errors.js';
import { sleep } from './time.js';
import type { Json } from './transport.js';

// One long poll (the server's bound); the shortest pause between two polls that answered early.
const POLL_SLICE_MS = 30_000;
const POLL_PAUSE_MS_MIN = 50;
export const WAIT_TIMEOUT_MS_DEFAULT = 60_000;

/** Call `poll(waitMs)` (a long poll) until `done(answer)`; WaitTimeoutError after `timeoutMs`. */
export async function waitUntil(poll: (waitMs: number) => Promise<Json>, done: (answer: Json) => boolean, timeoutMs: number, what: string): Promise<Json> {
  requireInt(timeoutMs, 'timeoutMs', 0);
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const started = Date.now();
    const answer = await poll(Math.min(Math.max(0, deadline - started), POLL_SLICE_MS));
    if (done(answer)) return answer;
    const now = Date.now();
    if (now >= deadline) throw new WaitTimeoutError(what, timeoutMs);
    if (now - started < POLL_PAUSE_MS_MIN) await sleep(Math.min(POLL_PAUSE_MS_MIN, deadline - now));
  }
}
