import { Runstate } from 'runstate-sdk';

const runId = process.env.RUNSTATE_SCOPE_ID;
if (!runId) throw new Error('set RUNSTATE_SCOPE_ID to the id the producer printed');

const rs = new Runstate({ holder: 'quickstart-worker' });
const queue = rs.scope(runId).mailbox('work');
console.log(`worker listening on run ${runId}`);

// Runs until the process is stopped.
await queue.consume<{ greeting: string; n: number }>(async (data, delivery) => {
  // Completing with a payload records it as the task's result.
  await delivery.complete({ payload: { doubled: data.n * 2 } });
  console.log(`completed ${delivery.id} (attempt ${delivery.attempt})`);
});
