// docs: once-and-queues.md, "Queues that need resources" (type-checked; running it needs the pool,
// limit and budget to exist).
import runstate from 'runstate-sdk';
async function renderPage(url: string): Promise<string> {
  return `<html>${url}</html>`;
}

// --- sample ---
export const render = runstate.queue('render', async (input: { url: string }) => renderPage(input.url), {
  slots: 'browser',
  limit: { name: 'search-api', units: 1 },
  budget: { name: 'model-usd', amount: 0.4 },
});
// --- end of sample ---
