// Runs the "Queues that need resources" sample (resources.ts): the pool, limit and budget are made
// first, a worker serves the queue in this process, and one job takes them.
import runstate, { Runstate } from 'runstate-sdk';

const rs = new Runstate({ holder: 'resources-sample' });
await rs.pools.ensure('browser', { size: 2 });
await rs.limits.ensure('search-api', { units: 10, per: '1s' });
await rs.budgets.ensure('model-usd', { total: 25 });

const { render } = await import('./resources.ts');
// A job that reports what it spent is charged that, not its whole reservation.
const measured = runstate.queue(
  'render-measured',
  async (input: { url: string }) => {
    runstate.context()!.spend(0.1);
    return input.url;
  },
  { slots: 'browser', budget: { name: 'model-usd', amount: 0.4 } },
);
const stop = new AbortController();
const serving = runstate.serve({ queues: [render, measured], signal: stop.signal, handleSignals: false });
const page = await render({ url: 'https://example.com/' });
await measured({ url: 'https://example.org/' });
stop.abort();
await serving;

const budget = await rs.budgets.status('model-usd');
const pool = await rs.pools.status('browser');
console.log(JSON.stringify({ page, settledMinor: budget.settledMinor, reservedMinor: budget.reservedMinor, scale: budget.scale, inUse: pool.unitsInUse }));
