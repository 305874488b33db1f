// The shared key vectors (tests/key_vectors.json of the repository, read by the Python SDK's tests too).
// A vector may say how the TypeScript call that makes its key looks: `typescript.parameters` (the
// wrapped function's parameter list, as source) and `typescript.args`; without it, `args` are passed
// to a function of any number of parameters.
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { ConfigError, canonicalJson, makeKey, once, queue } from '../src/index.ts';

interface Vector {
  name: string;
  args: unknown[];
  canonical: string;
  key: string;
  typescript?: { parameters: string; args?: unknown[] };
}

/** An arrow function with the parameter list `parameters` (never called). */
function functionOf(parameters: string): (...args: unknown[]) => unknown {
  return new Function(`return (${parameters}) => null;`)() as (...args: unknown[]) => unknown;
}

const VECTORS = JSON.parse(readFileSync(new URL('../../../tests/key_vectors.json', import.meta.url), 'utf8')) as Vector[];

test('the shared vectors are there', () => {
  const names = new Set(VECTORS.map((vector) => vector.name));
  for (const name of ['unicode', 'utf16_order', 'nested', 'floats', 'ints', 'empty_containers', 'nulls', 'rfc8785']) assert.ok(names.has(name), name);
  // How a call becomes the hashed list: defaults, rest parameters, an options object (Python's keywords).
  for (const name of ['xlang-default', 'default_passed', 'xlang-varargs', 'varargs_none', 'kwargs', 'keyword_only_left_out', 'json_kinds_by_keyword']) {
    assert.ok(VECTORS.find((vector) => vector.name === name)?.typescript, name);
  }
});

for (const vector of VECTORS) {
  test(`key vector ${vector.name}`, () => {
    assert.equal(canonicalJson(vector.args), vector.canonical);
    const digest = createHash('sha256').update(vector.canonical, 'utf8').digest('hex').slice(0, 32);
    assert.equal(vector.key, `${vector.name}:${digest}`);
    assert.equal(makeKey(vector.name, vector.args), vector.key);
    // The same key through a once-wrapped function called as the vector says.
    const call = vector.typescript;
    const wrapped = once(call ? functionOf(call.parameters) : (..._args: unknown[]) => null, { name: vector.name });
    assert.equal(wrapped.onceKey(...(call?.args ?? vector.args)), vector.key);
  });
}

test('RFC 8785 examples', () => {
  const text =
    '{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],' +
    '"string":"\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/","literals":[null,true,false]}';
  assert.equal(
    canonicalJson(JSON.parse(text)),
    '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],' + '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}',
  );
  assert.equal(
    canonicalJson({ '\u20ac': 1, '\r': 2, '\ufb33': 3, '1': 4, '\u{1f600}': 5, '\u0080': 6, '\u00f6': 7 }),
    '{"\\r":2,"1":4,"\u0080":6,"ö":7,"€":1,"\u{1f600}":5,"\ufb33":3}',
  );
});

test('once keys: trailing undefined arguments do not count, key() is hashed as it is', () => {
  const research = once(async function researchCompany(_name: string, _depth?: number) {
    return null;
  });
  assert.equal(research.onceKey('acme'), makeKey('researchCompany', ['acme']));
  assert.equal(research.onceKey('acme', undefined), research.onceKey('acme'));
  const byDomain = once(async (company: { domain: string }, _http: object) => company.domain, {
    name: 'research',
    key: (company) => company.domain,
  });
  // As in Python and the published clients: a string key() returns is the key's text as it is.
  assert.equal(byDomain.onceKey({ domain: 'acme.com' }, {}), 'research:acme.com');
});

test('queue keys hash [input], or take the text key(input) returns', () => {
  const plain = queue('research', async (input: { company: string }) => input.company);
  assert.equal(plain.keyOf({ company: 'acme' }), makeKey('research', [{ company: 'acme' }]));
  // What the published 0.3.0 client computes for the quickstart's input.
  assert.equal(
    queue('q', async (input: { n: number }) => input.n).keyOf({ n: 21 }),
    'q:' + createHash('sha256').update('[{"n":21}]').digest('hex').slice(0, 32),
  );
  const keyed = queue('research', async (input: { company: string; at: string }) => input.company, { key: (input) => input.company });
  assert.equal(keyed.keyOf({ company: 'acme', at: 'now' }), 'research:acme');
  const pair = queue('pair', async (input: { a: number; b: string }) => input.a, { key: (input) => [input.a, input.b] });
  assert.equal(pair.keyOf({ a: 1, b: 'x' }), makeKey('pair', [1, 'x']));
  for (const bad of ['', 'k'.repeat(256)]) {
    const refused = queue('refused', async (input: number) => input, { key: () => bad });
    assert.throws(() => refused.keyOf(1), ConfigError);
  }
});

test('a default parameter left out is not hashed, as in Python and the published client', () => {
  const f = once(async (_company: string, _depth = 2) => 1, { name: 'xlang-default' });
  assert.equal(f.onceKey('acme'), 'xlang-default:07fad54f7446269afc481e306a48f046');
  assert.equal(f.onceKey('acme', 2), makeKey('xlang-default', ['acme', 2]));
  const g = once(async (..._names: string[]) => 1, { name: 'xlang-varargs' });
  assert.equal(g.onceKey('acme', 'globex'), 'xlang-varargs:d4b94c9e4d9992b4d62acd5480625c3c');
});

class Point {
  constructor(readonly x = 1) {}
}

class Money {
  toJSON(): string {
    return '1 EUR';
  }
}

// What the docs call anything else than a JSON value, with what JSON.stringify would have made of it.
const NOT_JSON: [string, unknown][] = [
  ['Date', new Date(0)], // '"1970-01-01T00:00:00.000Z"'
  ['Date nested', { when: [new Date(0)] }],
  ['Map', new Map([['a', 1]])], // '{}'
  ['Set', new Set([1])], // '{}'
  ['class instance', new Point()], // '{"x":1}'
  ['class instance with toJSON', new Money()], // '"1 EUR"'
  ['plain object with toJSON', { toJSON: () => 'x' }], // '"x"'
  ['Uint8Array', new Uint8Array([1, 2])], // '{"0":1,"1":2}'
  ['Buffer', Buffer.from('x')], // '{"type":"Buffer","data":[120]}'
  ['ArrayBuffer', new ArrayBuffer(2)], // '{}'
  ['boxed string', new String('x')], // '"x"'
  ['boxed number', new Number(1)], // '1'
  ['RegExp', /x/], // '{}'
  ['Error', new Error('x')], // '{}'
  ['BigInt', 10n], // throws a TypeError
  ['function', () => 1], // undefined
  ['symbol', Symbol('x')], // undefined
  ['undefined', undefined], // undefined
  ['undefined in an array', [1, undefined]], // '[1,null]'
  ['a hole in an array', [1, , 2]], // '[1,null,2]'
  ['symbol-named member', { a: 1, [Symbol('s')]: 2 }], // '{"a":1}'
  ['NaN', Number.NaN], // 'null'
  ['Infinity', Infinity], // 'null'
  ['-Infinity', -Infinity], // 'null'
  ['lone surrogate', '\ud800'],
  ['nested Set', { a: new Set() }],
];

test('values JSON cannot carry are ConfigError, in onceKey, keyOf and canonicalJson', () => {
  for (const [what, bad] of NOT_JSON) {
    assert.throws(() => canonicalJson(bad), ConfigError, what);
    assert.throws(() => once(async (_value: unknown, _last: string) => 1, { name: 'f' }).onceKey(bad, 'last'), ConfigError, what);
    assert.throws(() => queue('q', async (input: unknown) => input).keyOf(bad), ConfigError, what);
  }
  assert.throws(() => once(() => 1, {}), ConfigError); // anonymous without a name
});

test('a Date is not its ISO string (issue 39)', () => {
  const f = once(async (_when: unknown) => 1, { name: 'when' });
  assert.throws(() => f.onceKey(new Date(0)), { name: 'ConfigError', message: /when\[0\] is a Date/ });
  assert.equal(f.onceKey('1970-01-01T00:00:00.000Z'), makeKey('when', ['1970-01-01T00:00:00.000Z']));
});

test('a call with an argument that is not JSON is refused before anything runs', async () => {
  let ran = 0;
  const f = once(
    async (_value: unknown, _last: string) => {
      ran += 1;
      return 1;
    },
    { name: 'refused' },
  );
  // No server is configured for this test: the refusal comes before any request.
  // `bad` comes before another argument: a trailing undefined would be an argument left out.
  for (const [what, bad] of NOT_JSON) await assert.rejects(f(bad, 'last'), ConfigError, what);
  assert.equal(ran, 0);
});

test('JSON values that are kept: plain objects of any prototype-less kind, undefined members left out', () => {
  const bare = Object.assign(Object.create(null) as Record<string, unknown>, { b: 1, a: 2 });
  assert.equal(canonicalJson([bare]), '[{"a":2,"b":1}]');
  // An optional member set to undefined is the member left out, as JSON.stringify and the wire have it.
  assert.equal(canonicalJson({ a: 1, b: undefined }), '{"a":1}');
  // A trailing undefined argument is an argument left out.
  const f = once(async (_company: string, _depth?: number) => 1, { name: 'f' });
  assert.equal(f.onceKey('acme', undefined), f.onceKey('acme'));
  // One in the middle is refused: as null it would collide with null, which skips no default.
  assert.throws(() => f.onceKey(undefined as unknown as string, 2), ConfigError);
});
