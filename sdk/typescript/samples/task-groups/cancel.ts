// docs: task-groups-and-cancellation.md, "Cancel a run".
import { Runstate, ScopeCancelledError } from 'runstate-sdk';
const rs = new Runstate({ holder: 'cancel-sample' });
await rs.mailboxes.ensure('work', { mode: 'WORK' });

// --- sample ---
const run = await rs.scopes.create({
  deadline: new Date(Date.now() + 60 * 60 * 1000).toISOString(), // optional: stop accepting work after an hour
});
const shard = await run.child(); // a sub-run, cancelled along with its parent


// ... later, from any process that knows the run id:
await rs.scope(run.id).cancel();


const status = await shard.status();
console.log(status.storedState, status.effective); // ACTIVE INACTIVE
// --- end of sample ---

try {
  await shard.mailbox('work').submit({ late: true });
} catch (err) {
  console.log(err instanceof ScopeCancelledError ? `refused: ${err.code}` : `unexpected: ${String(err)}`);
}
