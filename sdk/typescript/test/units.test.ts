// Durations, times, error mapping and client settings: no server needed.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import runstate, {
  ConfigError,
  ConflictError,
  DeadlineExceededError,
  LeaseLostError,
  NotFoundError,
  OnceFailedError,
  ResultTooLargeError,
  Runstate,
  RunstateError,
  ScopeCancelledError,
  TaskFailedError,
  UnavailableError,
  ValidationError,
} from '../src/index.ts';
import { errorFromResponse } from '../src/errors.ts';
import { durationMs, formatTime } from '../src/time.ts';
import { parseBaseUrls } from '../src/transport.ts';
import { checkNeeds } from '../src/resources.ts';

test('durations: numbers are milliseconds, strings carry their unit', () => {
  assert.equal(durationMs(1500, 'lease'), 1500);
  assert.equal(durationMs('60s', 'lease'), 60_000);
  assert.equal(durationMs('500ms', 'lease'), 500);
  assert.equal(durationMs('2m', 'lease'), 120_000);
  assert.equal(durationMs('1h', 'lease'), 3_600_000);
  assert.equal(durationMs('1.5s', 'lease'), 1500);
  assert.equal(durationMs('30', 'lease'), 30_000); // a bare number in a string is seconds, as in Python
  for (const bad of ['', 'soon', '-1s', '0s', 0, Number.NaN, Infinity]) assert.throws(() => durationMs(bad as never, 'lease'), ConfigError);
});

test('times: Date or ISO string, written as toISOString, offsetless strings are UTC', () => {
  assert.equal(formatTime(new Date(Date.UTC(2026, 10, 29, 9))), '2026-11-29T09:00:00.000Z');
  assert.equal(formatTime('2026-11-29T09:00:00'), '2026-11-29T09:00:00.000Z');
  assert.equal(formatTime('2026-11-29T10:00:00+01:00'), '2026-11-29T09:00:00.000Z');
  assert.throws(() => formatTime('tomorrow'), ConfigError);
});

test('the error envelope maps to classes by code, then by status, keeping code and status', () => {
  const cases: [number, string | undefined, new (...args: never[]) => RunstateError][] = [
    [409, 'SCOPE_CANCELLED', ScopeCancelledError],
    [409, 'DEADLINE_EXCEEDED', DeadlineExceededError],
    [409, 'STALE_CLAIM', LeaseLostError],
    [409, 'SOMETHING_NEW', ConflictError],
    [404, undefined, NotFoundError],
    [400, 'VALIDATION_FAILED', ValidationError],
    [503, 'UNAVAILABLE', UnavailableError],
    [418, 'TEAPOT', RunstateError],
  ];
  for (const [status, code, cls] of cases) {
    const error = errorFromResponse(status, code, 'message');
    assert.ok(error instanceof cls, `${status} ${code}`);
    assert.equal(error.status, status);
    assert.equal(error.code, code ?? 'NOT_FOUND');
    assert.equal(error.message, 'message');
  }
  const tooLarge = errorFromResponse(400, 'VALIDATION_FAILED', 'result exceeds 65536 bytes');
  assert.ok(tooLarge instanceof ResultTooLargeError);
  assert.equal(tooLarge.code, 'VALIDATION_FAILED');
  assert.ok(new ScopeCancelledError('x') instanceof ConflictError);
  assert.equal(new ConfigError('bad').status, undefined);
  assert.equal(new OnceFailedError('gave up', { attempts: 5 }).attempts, 5);
  assert.equal(new TaskFailedError('failed', { taskId: 'tsk_1' }).jobId, 'tsk_1');
});

test('client settings: options, then the environment, then http://localhost:8080', () => {
  const saved = process.env.RUNSTATE_BASE_URL;
  try {
    delete process.env.RUNSTATE_BASE_URL;
    assert.deepEqual(parseBaseUrls(undefined), ['http://localhost:8080']);
    process.env.RUNSTATE_BASE_URL = 'http://a:1/, http://b:2';
    assert.deepEqual(parseBaseUrls(undefined), ['http://a:1', 'http://b:2']);
    assert.deepEqual(new Runstate({ baseURL: 'https://api.example.com/' }).baseUrls, ['https://api.example.com']);
    assert.throws(() => new Runstate({ baseURL: 'ftp://x' }), ConfigError);
    assert.throws(() => new Runstate({ holder: ' ' }), ConfigError);
  } finally {
    if (saved === undefined) delete process.env.RUNSTATE_BASE_URL;
    else process.env.RUNSTATE_BASE_URL = saved;
  }
});

test('the default export carries the module-level API and the error classes', () => {
  assert.equal(typeof runstate.once, 'function');
  assert.equal(typeof runstate.queue, 'function');
  assert.equal(typeof runstate.serve, 'function');
  assert.equal(runstate.context(), undefined);
  assert.equal(runstate.OnceFailedError, OnceFailedError);
});

test('a server that does not answer is UnavailableError after a few seconds of retries', async () => {
  const rs = new Runstate({ baseURL: 'http://127.0.0.1:9', spaceId: 'spc_x' });
  await assert.rejects(rs.scope('run_x').status(), UnavailableError);
});

test('budget amounts convert exactly to minor units', async () => {
  const { toMinor } = await import('../src/resources.ts');
  assert.equal(toMinor(0.4, 6, 'reserve'), 400_000n);
  assert.equal(toMinor(0.3, 2, 'reserve'), 30n);
  assert.equal(toMinor(25, 6, 'total'), 25_000_000n);
  assert.equal(toMinor(1e-6, 6, 'reserve'), 1n);
  assert.equal(toMinor(1e21, 0, 'total'), 10n ** 21n);
  assert.throws(() => toMinor(0.405, 2, 'reserve'), ConfigError);
  assert.throws(() => toMinor(-1, 2, 'reserve'), ConfigError);
});

test("a budget need's amount is `amount`; the deprecated `reserve` still works, not both", async () => {
  checkNeeds({ budget: { name: 'model-usd', amount: 0.4 } });
  const warnings: string[] = [];
  const listen = (warning: Error) => warnings.push(`${warning.name}: ${warning.message}`);
  process.on('warning', listen);
  try {
    checkNeeds({ budget: { name: 'model-usd', reserve: 0.4 } });
    await new Promise((resolve) => setImmediate(resolve)); // emitWarning delivers on a later tick
  } finally {
    process.off('warning', listen);
  }
  assert.deepEqual(warnings, ["DeprecationWarning: a budget need's reserve is deprecated: name it amount ({ name, amount })"]);
  assert.throws(() => checkNeeds({ budget: { name: 'model-usd', amount: 0.4, reserve: 0.4 } }), ConfigError);
  assert.throws(() => checkNeeds({ budget: { name: 'model-usd' } }), ConfigError);
});
