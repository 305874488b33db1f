// docs: task-groups-and-cancellation.md, "Create a group and submit members" and "Record verdicts
// and wait for the decision". Between the two samples a worker (as the docs say: a queue consumer
// attached to the group's run) completes the members in this process.
import { Runstate } from 'runstate-sdk';
const rs = new Runstate({ holder: 'groups-sample' });
const isGoodDraft = (outcome: unknown): boolean => (outcome as { good: boolean }).good;

// --- sample ---
await rs.mailboxes.ensure('reviews', { mode: 'WORK' });
const run = await rs.scopes.create();


// Done when five drafts have been accepted.
const group = await run.groups.create({
  mailbox: 'reviews',
  condition: 'N_ACCEPTED',
  threshold: 5,
  parentScopeId: run.id, // cancelling the run also closes the group
});


const tickets = [];
for (let i = 0; i < 12; i++) {
  tickets.push(await group.submit({ draft: i }, { key: `draft-${i}` }));
}
// No more members: from now on the group can also fail as unreachable.
await group.close();


// Workers must attach to the group's own run to receive its members.
const { scopeId: groupRunId } = await group.status();
console.log(`start workers with RUNSTATE_SCOPE_ID=${groupRunId}`);
// --- end of sample ---

const stopWorker = new AbortController();
const worker = rs
  .scope(groupRunId)
  .mailbox('reviews')
  .consume<{ draft: number }>(async (data) => ({ draft: data.draft, good: data.draft % 2 === 0 }), { concurrency: 4, signal: stopWorker.signal });

// --- sample ---
// A reviewer process: judge each finished member.
for (const ticket of tickets) {
  const result = await ticket.result({ timeoutMs: 600_000 });
  if (result.state !== 'SUCCEEDED') continue;
  const verdict = isGoodDraft(result.outcome) ? await group.accept(ticket.id) : await group.reject(ticket.id);
  if (verdict.groupState === 'FINALIZED') break;
}


const decision = await group.wait({ timeoutMs: 600_000 });
console.log(decision.outcome, decision.outcomeReason); // e.g. SUCCESS threshold_reached
// --- end of sample ---

stopWorker.abort();
await worker; // returns: finalizing cancelled the group's run
const view = await group.status();
console.log(`members ${view.members.length}, accepted ${view.members.filter((member) => member.verdict === 'ACCEPTED').length}`);
const again = rs.scope(run.id).groups.byId(group.id);
console.log(`re-attached: ${(await again.wait({ timeoutMs: 1_000 })).outcomeReason}`);
