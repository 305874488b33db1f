// The shared key vectors (tests/key_vectors.json of the repository, read by the Python SDK's tests too).
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
}

const VECTORS = JSON.parse(readFileSync(new URL('../../../tests/key_vectors.json', import.meta.url), 'utf8')) as Vector[];

test('the shared vectors are there', () => {
  const names = new Set(VECTORS.map((vector) => vector.name));
  for (const name of ['unicode', 'utf16_order', 'nested', 'floats', 'ints', 'empty_containers', 'nulls', 'rfc8785']) assert.ok(names.has(name), name);
});

for (const vector of VECTORS) {
  test(`key vector ${vector.name}`, () => {
    assert.equal(canonicalJson(vector.args), vector.canonical);
    const digest = createHash('sha256').update(vector.canonical, 'utf8').digest('hex').slice(0, 32);
    assert.equal(vector.key, `${vector.name}:${digest}`);
    assert.equal(makeKey(vector.name, vector.args), vector.key);
    // The same key through a once-wrapped function called with the arguments.
    const wrapped = once((..._args: unknown[]) => null, { name: vector.name });
    assert.equal(wrapped.onceKey(...vector.args), vector.key);
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

test('values JSON cannot carry are ConfigError', () => {
  for (const bad of [Number.NaN, Infinity, undefined, () => 1, new Map(), Symbol('x'), 10n, '\ud800', { a: new Set() }]) {
    assert.throws(() => canonicalJson(bad), ConfigError, String(typeof bad));
  }
  assert.throws(() => once(() => 1, {}), ConfigError); // anonymous without a name
});
