import { Runstate } from 'runstate-sdk';

const rs = new Runstate({ holder: 'quickstart-producer' });

// Create the work queue if it doesn't exist yet (safe to call every time).
await rs.mailboxes.ensure('work', { mode: 'WORK' });

// A run groups everything this swarm does, so you can cancel it as one unit.
const run = await rs.scopes.create();
console.log(`RUNSTATE_SCOPE_ID=${run.id}`);

// Submit a task. The key identifies the logical task: submitting the same
// key with the same input again returns this task instead of a new one.
const ticket = await run.mailbox('work').submit(
  { greeting: 'runstate', n: 21 },
  { key: `quickstart-task-${Date.now()}` },
);
console.log(`task ${ticket.id} submitted, waiting for a worker...`);

// Poll until the task has a recorded result.
const outcome = await ticket.result({ timeoutMs: 60_000 });
console.log(outcome.state, outcome.outcome);
