// consume() settles many deliveries with few complete calls (src/completes.ts), each task once;
// prints one JSON report.
import { Runstate } from 'runstate-sdk';

const TASKS = 120;
const base = (process.env.RUNSTATE_BASE_URL ?? '').split(',')[0];
const rs = new Runstate({ holder: 'consume-many' });

/** Complete calls the node answered so far, single and batch (its GET /metrics). */
async function completeCalls(): Promise<{ single: number; batch: number }> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const counts = { single: 0, batch: 0 };
  for (const line of text.split('\n')) {
    if (!line.startsWith('runstate_http_requests_total{')) continue;
    const value = Number(line.slice(line.lastIndexOf(' ') + 1));
    if (line.includes('/messages/{id}/complete"')) counts.single += value;
    else if (line.includes('/messages/complete"')) counts.batch += value;
  }
  return counts;
}

await rs.mailboxes.ensure('many', { mode: 'WORK' });
const run = await rs.scopes.create({ name: 'consume-many' });
const queue = run.mailbox('many');
const tickets = await Promise.all(Array.from({ length: TASKS }, (_, n) => queue.submit({ n })));
const before = await completeCalls();
const calls = new Map<string, number>();
const stop = new AbortController();
const consuming = queue.consume<{ n: number }>(
  async (data, delivery) => {
    calls.set(delivery.taskId, (calls.get(delivery.taskId) ?? 0) + 1);
    await Promise.resolve();
    if (data.n % 3 === 0) {
      // A handler may complete its delivery itself, too.
      await delivery.complete({ payload: data.n * 2 });
      return -1;
    }
    return data.n * 2;
  },
  { concurrency: 30, signal: stop.signal },
);
const results = await Promise.all(tickets.map((ticket) => ticket.result({ timeoutMs: 60_000 })));
const after = await completeCalls();
stop.abort();
await consuming;
const batches = after.batch - before.batch;
console.log(
  JSON.stringify({
    outcomes: results.every((result, n) => result.state === 'SUCCEEDED' && result.outcome === n * 2 && result.attempt === 1),
    handledOnce: calls.size === TASKS && [...calls.values()].every((count) => count === 1),
    singleCompletes: after.single - before.single,
    fewerBatches: batches > 0 && batches < TASKS,
  }),
);
