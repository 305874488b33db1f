// docs: once-and-queues.md, "Hand work to workers with a queue" (research.ts).
async function researchCompany(company: string): Promise<{ company: string; attempt: number }> {
  return { company, attempt: runstate.context()!.attempt };
}

// --- sample ---
import runstate from 'runstate-sdk';

export const research = runstate.queue(
  'research',
  async (input: { company: string }) => researchCompany(input.company),
  { attempts: 5, lease: '60s', concurrency: 4 },
);
// --- end of sample ---
