// consume() frees a handler slot when the handler returns (src/consume.ts, SETTLING_PER_SLOT): with
// one slot, the next tasks' handlers start while the first one's complete is still on its way, as
// long as the slot's handler and the deliveries being completed stay within 1 + SETTLING_PER_SLOT;
// the next handler only once that complete is answered. A proxy in front of the node holds every
// complete's answer back for two seconds, so the order is not left to chance. Prints one JSON report.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Runstate } from 'runstate-sdk';

const COMPLETE_HELD_MS = 2_000;
const HELD_MAX = 1 + 3; // one slot's handler and SETTLING_PER_SLOT (3) deliveries being completed
const base = (process.env.RUNSTATE_BASE_URL ?? '').split(',')[0];
const completesAnswered: number[] = [];

const proxy = http.createServer((request, response) => {
  const chunks: Buffer[] = [];
  request.on('data', (chunk: Buffer) => chunks.push(chunk));
  request.on('end', async () => {
    const headers = Object.fromEntries(
      Object.entries(request.headers).filter(([name]) => !['host', 'content-length', 'connection'].includes(name)),
    ) as Record<string, string>;
    const body = chunks.length > 0 ? Buffer.concat(chunks) : undefined;
    const answer = await fetch(base + (request.url ?? '/'), { method: request.method, headers, body });
    const payload = Buffer.from(await answer.arrayBuffer());
    const path = new URL(request.url ?? '/', base).pathname;
    if (request.method === 'POST' && path.endsWith('/complete')) {
      await new Promise((resolve) => setTimeout(resolve, COMPLETE_HELD_MS));
      completesAnswered.push(performance.now());
    }
    const contentType = answer.headers.get('content-type');
    response.writeHead(answer.status, contentType ? { 'content-type': contentType } : {});
    response.end(payload);
  });
});
await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
const proxyUrl = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;

const rs = new Runstate({ baseUrl: proxyUrl, holder: 'consume-settle' });
await rs.mailboxes.ensure('settle', { mode: 'WORK' });
const run = await rs.scopes.create({ name: 'consume-settle' });
const queue = run.mailbox('settle');
const tickets = await Promise.all(Array.from({ length: HELD_MAX + 1 }, (_, n) => queue.submit({ n })));
const started: number[] = [];
const stop = new AbortController();
const consuming = queue.consume<{ n: number }>(
  async (data) => {
    started.push(performance.now());
    return data.n;
  },
  { concurrency: 1, signal: stop.signal },
);
const results = await Promise.all(tickets.map((ticket) => ticket.result({ timeoutMs: 60_000 })));
stop.abort();
await consuming;
proxy.close();
console.log(
  JSON.stringify({
    outcomes: results.every((result) => result.state === 'SUCCEEDED'),
    handlers: started.length,
    withinBoundBeforeFirstCompleteAnswered: (started[HELD_MAX - 1] ?? Infinity) < (completesAnswered[0] ?? -Infinity),
    nextAfterIt: (started[HELD_MAX] ?? -Infinity) > (completesAnswered[0] ?? Infinity),
  }),
);
