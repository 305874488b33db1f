// bench.latency's TypeScript phase: `requests` submits through the TypeScript SDK's `submit`, one
// after the other, after `warmup` uncounted ones; prints {"latencies_ms": [...],
// "client_cpu_ms_per_request": N} (this process's user + system CPU). Run by bench/latency.py as
//   node --import tsx bench/latency_typescript.mts URL REQUESTS WARMUP GAP_MS   (from sdk/typescript)
// RUNSTATE_API_KEY in the environment on a cluster, as for the Python SDK's phase.
import { setTimeout as sleep } from 'node:timers/promises';
import { Runstate } from '../sdk/typescript/src/index.ts';

const [url, requestsText, warmupText, gapText] = process.argv.slice(2);
if (url === undefined || requestsText === undefined || warmupText === undefined || gapText === undefined) {
  throw new Error('usage: latency_typescript.mts URL REQUESTS WARMUP GAP_MS');
}
const requests = Number(requestsText);
const warmup = Number(warmupText);
const gapMs = Number(gapText);
const rs = new Runstate({ baseURL: url, holder: 'bench-latency-typescript' });
const name = `latency-typescript-${process.pid}`;
await rs.mailboxes.ensure(name, { mode: 'WORK' });
const queue = rs.scope((await rs.scopes.create({ name })).id).mailbox(name);
for (let index = 0; index < warmup; index++) await queue.submit({ n: index }, { key: `task-${index}` });
const latencies: number[] = [];
const before = process.cpuUsage();
for (let index = warmup; index < warmup + requests; index++) {
  if (gapMs > 0) await sleep(gapMs);
  const started = process.hrtime.bigint();
  await queue.submit({ n: index }, { key: `task-${index}` });
  latencies.push(Number(process.hrtime.bigint() - started) / 1e6);
}
const cpu = process.cpuUsage(before);
console.log(JSON.stringify({ latencies_ms: latencies, client_cpu_ms_per_request: (cpu.user + cpu.system) / 1000 / requests }));
