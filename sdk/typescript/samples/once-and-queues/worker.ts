// docs: once-and-queues.md, "Workers" (worker.ts).
// --- sample ---
import runstate from 'runstate-sdk';
import './research.ts';

await runstate.serve(); // until the run stops or the process gets SIGTERM
// --- end of sample ---

console.log('serve() returned');
