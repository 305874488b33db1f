// docs: once-and-queues.md, "Failures and retries". Before the sample, the five attempts of the
// same key fail (each caller whose attempt it was gets the function's own error); from then on
// every caller, the sample's included, gets OnceFailedError.
async function researchCompany(name: string): Promise<string> {
  throw new Error(`no sources for ${name}`);
}
import runstate0 from 'runstate-sdk';
const earlier = runstate0.once(researchCompany, { attempts: 5 });
for (let attempt = 1; attempt <= 5; attempt++) {
  try {
    await earlier('acme');
  } catch (err) {
    console.log(`attempt ${attempt}: ${(err as Error).message}`);
  }
}

// --- sample ---
import runstate, { OnceFailedError } from 'runstate-sdk';

const research = runstate.once(researchCompany, { attempts: 5 });

try {
  await research('acme');
} catch (err) {
  if (err instanceof OnceFailedError) console.error(`gave up after ${err.attempts} attempts: ${err.message}`);
  else throw err;
}
// --- end of sample ---
