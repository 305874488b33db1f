// Slots and rate-limit units taken directly by a run; prints one JSON report.
import { Runstate, ScopeCancelledError, ValidationError, WaitTimeoutError } from 'runstate-sdk';

const rs = new Runstate({ holder: 'slots' });
const report: Record<string, unknown> = {};
await rs.pools.ensure('gpu', { size: 1 });
await rs.limits.ensure('api', { units: 2, per: '1s' });
const run = await rs.scopes.create();

// Held for a block: a second acquire times out meanwhile; the slot is back afterwards.
report.inside = await run.slot('gpu', async () => run.pools.acquire('gpu', { timeoutMs: 200 }).catch((err) => err instanceof WaitTimeoutError));
const again = await run.pools.acquire('gpu', { timeoutMs: 1_000 });
// A waiter in line gets it when it is released.
const waiting = run.pools.acquire('gpu', { timeoutMs: 10_000 });
setTimeout(() => void again.release(), 300);
const next = await waiting;
report.handedOver = next.id !== again.id;
await next.release();

// Cancelling the run while a slot is held: the renewal is refused and the block's signal aborts.
const doomed = await rs.scopes.create();
report.cancelled = await doomed
  .slot(
    'gpu',
    async (lease) => {
      await rs.scope(doomed.id).cancel();
      await new Promise((resolve) => lease.signal.addEventListener('abort', resolve));
      return 'finished';
    },
    { leaseMs: 600 },
  )
  .catch((err) => err instanceof ScopeCancelledError);

// Rate-limit units: two at once, the third when the window has room again.
const taken = [await run.limits.take('api'), await run.limits.take('api')];
report.exhausted = await run.limits.take('api', { timeoutMs: 0 }).catch((err) => err instanceof WaitTimeoutError);
const third = await run.limits.take('api', { timeoutMs: 10_000 });
report.taken = [...taken, third].every((take) => typeof take.consumptionId === 'string' && take.units === 1);

// Budget reservations: settled with what was spent, a wait that times out, one over the total.
await rs.budgets.ensure('usd', { total: 1 });
report.spentBlock = await run.budget('usd', 0.4, (reservation) => {
  reservation.spend(0.1);
  return reservation.spent;
});
const held = await run.budgets.reserve('usd', { amount: 0.5 });
report.notEnough = await run.budgets.reserve('usd', { amount: 0.5, timeoutMs: 0 }).catch((err) => err instanceof WaitTimeoutError);
report.overTotal = await run.budgets.reserve('usd', { amount: 2, timeoutMs: 0 }).catch((err) => err instanceof ValidationError);
report.released = (await held.release()).released;
const budget = await rs.budgets.status('usd');
report.budget = [budget.settledMinor, budget.reservedMinor];
console.log(JSON.stringify(report));
