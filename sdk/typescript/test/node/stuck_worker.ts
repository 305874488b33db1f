// A worker whose handler never returns (until its signal aborts): killed with kill -9 by the test,
// its task must be taken over by another worker with attempt 2.
import { Runstate } from 'runstate-sdk';

const rs = new Runstate({ holder: `stuck-${process.pid}` });
await rs.scope(process.env.RUNSTATE_SCOPE_ID!).mailbox('work').consume(
  async (_data, delivery) => {
    console.log(`holding ${delivery.taskId} attempt ${delivery.attempt}`);
    await new Promise((resolve) => delivery.signal.addEventListener('abort', resolve));
  },
  { leaseMs: Number(process.env.LEASE_MS ?? 30_000) },
);
