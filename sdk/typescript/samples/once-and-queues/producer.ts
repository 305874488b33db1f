// docs: once-and-queues.md, "Producers".
// --- sample ---
import { research } from './research.ts';

// Submit and wait for the result.
const report = await research({ company: 'acme' });

// Or submit now and collect later.
const job = await research.send({ company: 'globex' });
console.log(`submitted ${job.id}`);
const later = await job.result();
// --- end of sample ---

const again = await research.send({ company: 'globex' });
console.log(JSON.stringify({ report, later, sameJob: again.id === job.id }));
