// docs: task-groups-and-cancellation.md, "Barriers". The other two shards arrive between the
// coordinator's part and the third shard's.
import { Runstate } from 'runstate-sdk';
const rs = new Runstate({ holder: 'barriers-sample' });
const run = await rs.scopes.create();

// --- sample ---
// Coordinator:
const barrier = await run.barriers.create({ target: 3 });
// --- end of sample ---

for (const key of ['shard-0', 'shard-1']) await rs.scope(run.id).barriers.get(barrier.id).arrive({ key });

// --- sample ---
// Each shard, given barrier.id:
const handle = rs.scope(run.id).barriers.get(barrier.id);
await handle.arrive({ key: 'shard-2' }); // idempotent per key
const view = await handle.wait({ timeoutMs: 300_000 });
console.log(view.state, `${view.arrivals}/${view.target}`);
// --- end of sample ---
