// The client-bound surface the published 0.3.0 cross-language test drives: a client with a named
// run, `rs.queue(name)` as a producer-only queue served by another client's queue, send/result,
// gather with need and accept, a failing job, and `rs.once`.
import { Runstate, TaskFailedError } from 'runstate-sdk';

const run = `client-api-${process.pid}`;
const worker = new Runstate({ run, worker: 'ts-worker', timeout: '10s' });
const queueName = 'review';
worker.queue(
  queueName,
  async (doc: { doc: number; fail?: boolean }) => {
    if (doc.fail) throw new Error(`cannot review doc ${doc.doc}`);
    return { doc: doc.doc, by: 'worker' };
  },
  { attempts: 2, concurrency: 4 },
);
const stop = new AbortController();
const serving = worker.serve({ signal: stop.signal, handleSignals: false });

const rs = new Runstate({ run, worker: 'ts-producer', timeout: '10s' });
const review = rs.queue<{ doc: number; fail?: boolean }, { doc: number; by: string }>(queueName);
const called = await review({ doc: 1 });
const [j1, j2] = await Promise.all([review.send({ doc: 2 }), review.send({ doc: 2 })]);
const sent = await j1.result({ timeout: '20s' });
const gathered = await review.gather([{ doc: 3 }, { doc: 4 }, { doc: 6 }], { need: 2, accept: (r) => r.doc % 2 === 0 });
let failure: unknown = null;
try {
  await review({ doc: 99, fail: true });
} catch (err) {
  failure = { tsClass: err instanceof TaskFailedError, attempts: (err as TaskFailedError).attempts, message: (err as Error).message };
}
let calls = 0;
const shared = rs.once(async function shared(...args: unknown[]) {
  calls += 1;
  return { by: 'ts', args };
});
const first = await shared('acme', { depth: 2 });
const again = await worker.once(async function shared(..._args: unknown[]) {
  throw new Error('must not run: the result is recorded');
})('acme', { depth: 2 });
stop.abort();
await serving;
console.log(JSON.stringify({ called, sameJob: j1.id === j2.id, sent, gathered: gathered.map((r) => r.doc).sort(), failure, first, again, calls }));
