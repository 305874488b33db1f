// docs: once-and-queues.md, "When a process dies".
const parts = ['intro', 'market', 'risks'];
async function writeSection(name: string, part: string, options: { signal: AbortSignal }): Promise<string> {
  options.signal.throwIfAborted();
  return `${name}/${part}`;
}
import runstate from 'runstate-sdk';

// --- sample ---
const writeReport = runstate.once(async function writeReport(name: string) {
  const { signal } = runstate.context()!;
  const sections = [];
  for (const part of parts) {
    signal.throwIfAborted();
    sections.push(await writeSection(name, part, { signal }));
  }
  return sections;
});
// --- end of sample ---

console.log(JSON.stringify(await writeReport('acme')));
