// The client's less travelled calls against a real node; prints one JSON report.
import {
  ConflictError,
  KeyConflictError,
  NotFoundError,
  Runstate,
  ScopeCancelledError,
  WaitTimeoutError,
} from 'runstate-sdk';

const rs = new Runstate({ holder: 'calls' });
const report: Record<string, unknown> = {};
const name = (err: unknown): string => (err instanceof Error ? `${err.constructor.name}:${(err as { code?: string }).code}` : String(err));

await rs.mailboxes.ensure('jobs', { mode: 'WORK' });
report.ensureAgain = (await rs.mailboxes.ensure('jobs')).created;
report.otherMode = await rs.mailboxes.ensure('jobs', { mode: 'INBOX' }).catch(name);
const run = await rs.scopes.create({ name: 'calls', childLimit: 5 });
const jobs = run.mailbox('jobs');

// Submit: same key and input is the same task, another input a KeyConflictError.
const first = await jobs.submit({ a: 1 }, { key: 'k1' });
const again = await jobs.submit({ a: 1 }, { key: 'k1' });
report.submit = { created: [first.created, again.created], same: first.id === again.id };
report.keyConflict = await jobs.submit({ a: 2 }, { key: 'k1' }).catch((err) => err instanceof KeyConflictError);
report.unknownQueue = await run.mailbox('nope').submit({}).catch((err) => err instanceof NotFoundError);

// receive, retry, reject, release.
const [one] = await jobs.receive({ waitMs: 1_000 });
await one!.release(); // back at once, no attempt counted
const [two] = await jobs.receive({ waitMs: 1_000 });
report.released = { sameTask: two!.taskId === one!.taskId, attempt: two!.attempt };
await two!.reject({ error: 'not for me' });
const rejected = await first.result({ timeoutMs: 5_000 });
report.rejected = [rejected.state, rejected.outcomeReason];
report.staleComplete = await two!.complete({ payload: 1 }).catch(name);
const cancelled = await jobs.submit({ b: 1 });
report.cancelTask = (await cancelled.cancel('changed my mind')).state;
report.resultTimeout = await (await jobs.submit({ c: 1 })).result({ timeoutMs: 200 }).catch(name);

// Groups: joinTask, reject, a wait that times out, status of members.
await rs.mailboxes.ensure('reviews', { mode: 'WORK' });
const group = await run.groups.create({ mailbox: 'reviews', condition: 'ALL_TERMINAL' });
const groupRun = (await group.status()).scopeId;
const outside = await rs.scope(groupRun).mailbox('reviews').submit({ draft: 'outside' });
report.joined = (await group.joinTask(outside)).joined;
const member = await group.submit({ draft: 1 }, { key: 'd1' });
report.waitTimeout = await group.wait({ timeoutMs: 100 }).catch((err) => err instanceof WaitTimeoutError);
for (const delivery of await rs.scope(groupRun).mailbox('reviews').receive({ max: 2, waitMs: 1_000 })) {
  await delivery.complete({ payload: { ok: delivery.taskId === member.id } });
}
await group.accept(member);
await group.reject(outside.id);
await group.close();
const decided = await group.wait({ timeoutMs: 5_000 });
report.group = [decided.outcome, decided.outcomeReason, decided.members.map((m) => m.verdict).sort()];
report.groupClosed = await group.submit({ draft: 2 }, { key: 'd2' }).catch((err) => (err instanceof ConflictError ? err.code : name(err)));

// Named barriers and timers.
const barrier = await run.barriers.byName('merge', { target: 1 });
await barrier.arrive({ key: 'only' });
report.barrier = (await barrier.wait({ timeoutMs: 5_000 })).state;
report.barrierOtherTarget = await run.barriers.byName('merge', { target: 2 }).catch(name);
const timer = await run.timers.byName('nap', { afterSeconds: 0 });
report.timer = Boolean((await timer.wait({ timeoutMs: 5_000 })).firedAt);

// Children and their limit; cancelling refuses new work below.
const child = await run.child({ name: 'shard' });
report.child = (await child.status()).parentId === run.id;
await run.cancel('done');
report.afterCancel = await child.mailbox('jobs').submit({ d: 1 }).catch((err) => err instanceof ScopeCancelledError);
report.completeCancelled = await run.complete().catch(name);
console.log(JSON.stringify(report));
