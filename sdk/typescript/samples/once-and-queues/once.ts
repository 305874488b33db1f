// docs: once-and-queues.md, "Do work once". The sample is between the markers, as written; the
// lines around it define what it leaves to the reader and print what it got.
let calls = 0;
async function researchCompany(name: string): Promise<{ name: string; calls: number }> {
  calls += 1;
  return { name, calls };
}

// --- sample ---
import runstate from 'runstate-sdk';

const research = runstate.once(researchCompany);

// Any number of agents can call this. The function runs once; they all get its result.
const report = await research('acme');
// --- end of sample ---

const again = await Promise.all([research('acme'), research('acme')]);
console.log(JSON.stringify({ report, again, calls, key: research.onceKey('acme') }));
