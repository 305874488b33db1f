// Lease semantics of consume(), against a real node:
// 1. a delivery whose worker died is taken over with attempt 2 (the test killed that worker);
// 2. cancelling the run aborts a running handler's signal and ends consume();
import { Runstate, ScopeCancelledError } from 'runstate-sdk';

const rs = new Runstate({ holder: 'takeover' });
const report: Record<string, unknown> = {};

// 1. Take over the stuck worker's task.
const takenOver = new AbortController();
await rs.scope(process.env.RUNSTATE_SCOPE_ID!).mailbox('work').consume(
  async (data, delivery) => {
    report.takeover = { attempt: delivery.attempt, data };
    takenOver.abort();
    return { done: true };
  },
  { leaseMs: 1_000, signal: takenOver.signal },
);
report.result = (await rs.task(process.env.TASK_ID!).result({ timeoutMs: 10_000 })).outcome;

// 2. Cancel the run under a running handler.
await rs.mailboxes.ensure('work', { mode: 'WORK' });
const run = await rs.scopes.create();
await run.mailbox('work').submit({ long: true });
const seen: string[] = [];
await run.mailbox('work').consume(
  async (_data, delivery) => {
    await rs.scope(run.id).cancel();
    await new Promise((resolve) => delivery.signal.addEventListener('abort', resolve));
    seen.push((delivery.signal.reason as Error).constructor.name);
  },
  { leaseMs: 600 },
);
report.cancelled = { seen, task: (await rs.scope(run.id).mailbox('work').receive().catch((err: unknown) => err)) instanceof ScopeCancelledError };

console.log(JSON.stringify(report));
