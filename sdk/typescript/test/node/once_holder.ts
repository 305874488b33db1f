// A once caller. HOLD=1: the function waits for its signal (up to 20 s), so the test can stop this
// process (SIGSTOP) until another caller takes the work over, then continue it (SIGCONT): its
// renewal is refused, the signal aborts, and its late result is rejected with LeaseLostError.
import runstate, { LeaseLostError } from 'runstate-sdk';

const hold = process.env.HOLD === '1';
const work = runstate.once(
  async function slowWork(name: string) {
    const { signal, attempt } = runstate.context()!;
    console.log(`running attempt ${attempt}`);
    if (hold) {
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 20_000);
        signal.addEventListener('abort', () => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
    return { name, attempt, pid: process.pid, aborted: signal.aborted };
  },
  { lease: '1s' },
);
try {
  console.log(JSON.stringify({ result: await work('x') }));
} catch (err) {
  console.log(JSON.stringify({ error: err instanceof LeaseLostError ? 'LeaseLostError' : String(err) }));
}
