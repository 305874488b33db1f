// docs: once-and-queues.md, "Shared tasks".
import runstate from 'runstate-sdk';
async function researchHandler(input: { company: string; requestedAt: string }): Promise<string> {
  return `report on ${input.company}`;
}

// --- sample ---
export const research = runstate.queue('research', researchHandler, {
  key: (input: { company: string; requestedAt: string }) => input.company,
});
// --- end of sample ---
