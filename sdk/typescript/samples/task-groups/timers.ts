// docs: task-groups-and-cancellation.md, "Timers". The docs' timer fires after 300 s; set
// TIMER_AFTER_SECONDS to wait less (the tests use 1 s).
import { Runstate } from 'runstate-sdk';
const rs = new Runstate({ holder: 'timers-sample' });
const run = await rs.scopes.create();
const afterSeconds = Number(process.env.TIMER_AFTER_SECONDS ?? 300);

// --- sample ---
const timer = await run.timers.create({ afterSeconds });
console.log(`fires at ${timer.fireAt.toISOString()}`);


const { firedAt } = await timer.wait({ timeoutMs: 360_000 });
console.log(`follow-up check at ${firedAt.toISOString()}`);
// --- end of sample ---

const other = await run.timers.create({ afterSeconds: 3600 });
await run.timers.get(other.id).cancel();
console.log(`cancelled: ${(await run.timers.get(other.id).status()).state}`);
