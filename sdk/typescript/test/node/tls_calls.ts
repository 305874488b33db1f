// One call of a client made from the environment (RUNSTATE_BASE_URL, RUNSTATE_CA_FILE,
// RUNSTATE_CLIENT_CERT, RUNSTATE_CLIENT_KEY) or, when TLS_OPTIONS is set, from those options as
// JSON; then a second call. Prints what each did: the space it reached, or the error's class,
// code, url, reason and message (TlsError for a TLS failure, at once).
import { ConfigError, Runstate, RunstateError, TlsError } from 'runstate-sdk';

function outcome(error: unknown): Record<string, unknown> {
  const known = error as RunstateError;
  return {
    error: known.constructor.name,
    code: known.code,
    message: known.message,
    ...(error instanceof TlsError ? { url: error.url, reason: error.reason } : {}),
  };
}

const options = process.env.TLS_OPTIONS ? (JSON.parse(process.env.TLS_OPTIONS) as Record<string, string>) : {};
let rs: Runstate;
try {
  rs = new Runstate(options);
} catch (error) {
  console.log(JSON.stringify({ made: outcome(error), config: error instanceof ConfigError }));
  process.exit(0);
}
const calls: Record<string, unknown>[] = [];
for (let call = 0; call < 2; call++) {
  try {
    await rs.mailboxes.ensure('work', { mode: 'WORK' });
    const run = await rs.scopes.create(); // unsafe to repeat: a TLS refusal is still a TlsError
    calls.push({ run: run.id.length > 0 });
  } catch (error) {
    calls.push(outcome(error));
  }
}
console.log(JSON.stringify({ calls }));
