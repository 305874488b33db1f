// The transport against scripted HTTP servers on 127.0.0.1: kept-alive connections, what a call
// sends, and which failures are retried where (a call never sent, an answer lost, too large).
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { OutcomeUnknownError, UnavailableError } from '../src/errors.ts';
import { Transport } from '../src/transport.ts';

interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
  body: string;
}

interface Scripted {
  url: string;
  seen: Seen[];
  connections: number;
  close(): Promise<void>;
}

/** A server on a free port of 127.0.0.1 that records each request and lets `answer` reply. */
async function scripted(answer: (request: http.IncomingMessage, response: http.ServerResponse, body: string) => void): Promise<Scripted> {
  const seen: Seen[] = [];
  const server = http.createServer((request, response) => {
    const chunks: Buffer[] = [];
    request.on('data', (chunk: Buffer) => chunks.push(chunk));
    request.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      seen.push({ method: request.method ?? '', url: request.url ?? '', headers: request.headers, body });
      answer(request, response, body);
    });
  });
  const state = { connections: 0 };
  server.on('connection', () => {
    state.connections += 1;
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    get connections() {
      return state.connections;
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

function json(response: http.ServerResponse, status: number, value: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(value);
  response.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
  response.end(text);
}

/** A URL nothing listens on: a port a server had, closed again. */
async function refusedUrl(): Promise<string> {
  const server = await scripted(() => undefined);
  await server.close();
  return server.url;
}

function transport(baseUrls: string[], options: { timeoutMs?: number; answerBytesMax?: number } = {}): Transport {
  return new Transport({ baseUrls, spaceId: 'spc 1', apiKey: 'key-1', holder: 'worker-7', timeoutMs: options.timeoutMs ?? 5_000, ...options });
}

test('sequential calls share one kept-alive connection and carry what the server needs', async () => {
  const server = await scripted((_request, response) => json(response, 200, { ok: true }));
  try {
    const client = transport([server.url]);
    for (let i = 0; i < 3; i++) assert.deepEqual(await client.request('GET', '/tasks/tsk_1', { safe: true }), { ok: true });
    await client.request('POST', '/tasks', { body: { input: { n: 'é' } }, safe: true });
    assert.equal(server.connections, 1);
    const [get, , , post] = server.seen as [Seen, Seen, Seen, Seen];
    assert.equal(get.method, 'GET');
    assert.equal(get.url, '/v1/spaces/spc%201/tasks/tsk_1');
    assert.equal(get.headers.authorization, 'Bearer key-1');
    assert.equal(get.headers['x-runstate-holder'], 'worker-7');
    assert.match(String(get.headers['user-agent']), /^runstate-sdk-typescript\//);
    assert.equal(get.headers['idempotency-key'], undefined);
    assert.equal(post.body, '{"input":{"n":"é"}}');
    assert.equal(post.headers['content-type'], 'application/json');
    assert.equal(post.headers['content-length'], String(Buffer.byteLength(post.body)));
    assert.match(String(post.headers['idempotency-key']), /^[0-9a-f]{24}$/);
  } finally {
    await server.close();
  }
});

test('each request target is the one `new URL(base + path)` makes, with or without the shortcut past it', async () => {
  const server = await scripted((_request, response) => json(response, 200, { ok: true }));
  try {
    const port = server.url.slice(server.url.lastIndexOf(':') + 1);
    // Bases the shortcut takes (as `new URL` writes them), and bases it leaves to `new URL`.
    const bases = [server.url, `${server.url}/api`, `http://127.0.0.1:0${port}/A/./b`, `http://127.0.0.1:${port}/x%2e/`];
    const paths = ['/tasks/tsk_1', "/tasks/a'b(c)*~!$&,;=:@", '/tasks/%2e%2E', '/tasks/..', '/tasks/x/./y', '/tasks/é'];
    for (const base of bases) {
      const client = transport([base]);
      for (const path of paths) {
        await client.request('GET', path, { safe: true, query: { waitMs: 5, who: 'a b' } });
        const expected = new URL(`${base}/v1/spaces/spc%201${path}?waitMs=5&who=a+b`);
        assert.equal((server.seen.at(-1) as Seen).url, expected.pathname + expected.search, `${base} ${path}`);
      }
    }
  } finally {
    await server.close();
  }
});

test('a call whose connection is refused goes to the next server at once, even an unsafe one', async () => {
  const server = await scripted((_request, response) => json(response, 201, { id: 'run_1' }));
  try {
    const client = transport([await refusedUrl(), server.url]);
    assert.deepEqual(await client.request('POST', '/scopes', { body: {}, safe: false }), { id: 'run_1' });
    assert.equal(server.seen.length, 1);
  } finally {
    await server.close();
  }
});

test('an answer lost after the call was sent: a safe call goes to the next server, an unsafe one is OutcomeUnknownError', async () => {
  const dropping = await scripted((request) => request.socket.destroy());
  const answering = await scripted((_request, response) => json(response, 200, { ok: true }));
  try {
    assert.deepEqual(await transport([dropping.url, answering.url]).request('POST', '/tasks', { body: {}, safe: true }), { ok: true });
    assert.equal(answering.seen.length, 1);
    const unsafe = transport([dropping.url, answering.url]).request('POST', '/scopes', { body: {}, safe: false });
    await assert.rejects(unsafe, OutcomeUnknownError);
    assert.equal(answering.seen.length, 1); // not sent again anywhere
    assert.equal(dropping.seen.length, 2);
  } finally {
    await dropping.close();
    await answering.close();
  }
});

test('an answer cut short, one past the bound, or none within the timeout is lost', async () => {
  const short = await scripted((_request, response) => {
    response.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
    response.write('{"partial":');
    setTimeout(() => response.socket?.destroy(), 20);
  });
  const large = await scripted((_request, response) => json(response, 200, { blob: 'x'.repeat(5_000) }));
  const silent = await scripted(() => undefined);
  try {
    await assert.rejects(transport([short.url]).request('POST', '/scopes', { body: {}, safe: false }), OutcomeUnknownError);
    await assert.rejects(
      transport([large.url], { answerBytesMax: 1_000 }).request('POST', '/scopes', { body: {}, safe: false }),
      (error: Error) => error instanceof OutcomeUnknownError && /larger than 1000 bytes/.test(error.message),
    );
    assert.equal((await transport([large.url]).request('GET', '/x', { safe: true })).blob, 'x'.repeat(5_000));
    await assert.rejects(transport([silent.url], { timeoutMs: 200 }).request('POST', '/scopes', { body: {}, safe: false }), OutcomeUnknownError);
  } finally {
    await short.close();
    await large.close();
    await silent.close();
  }
});

test('error answers map to errors with their request id and Retry-After; a 503 is retried when safe', async () => {
  let calls = 0;
  const server = await scripted((_request, response) => {
    calls += 1;
    if (calls === 1) json(response, 503, { error: { code: 'UNAVAILABLE', message: 'electing' } }, { 'retry-after': '1', 'x-request-id': 'req_1' });
    else json(response, 200, { ok: calls });
  });
  try {
    const client = transport([server.url]);
    await assert.rejects(client.request('POST', '/scopes', { body: {}, safe: false }), (error: Error) => {
      assert.ok(error instanceof UnavailableError);
      assert.equal(error.requestId, 'req_1');
      assert.equal(error.retryAfterMs, 1_000);
      return true;
    });
    assert.deepEqual(await client.request('GET', '/x', { safe: true }), { ok: 2 });
  } finally {
    await server.close();
  }
});

test('a node naming its leader sends the next call there', async () => {
  const leader = await scripted((_request, response) => json(response, 200, { from: 'leader' }));
  const follower = await scripted((_request, response) => json(response, 200, { from: 'follower' }, { 'x-runstate-leader': leader.url }));
  try {
    const client = transport([follower.url, leader.url]);
    assert.deepEqual(await client.request('GET', '/x', { safe: true }), { from: 'follower' });
    assert.deepEqual(await client.request('GET', '/x', { safe: true }), { from: 'leader' });
  } finally {
    await leader.close();
    await follower.close();
  }
});

test("the caller's signal ends a call at once, with its reason, and it is not sent again", async () => {
  const silent = await scripted(() => undefined);
  try {
    const controller = new AbortController();
    const call = transport([silent.url]).request('GET', '/x', { safe: true, signal: controller.signal });
    setTimeout(() => controller.abort(new Error('stop now')), 50);
    await assert.rejects(call, /stop now/);
    assert.equal(silent.seen.length, 1);
  } finally {
    await silent.close();
  }
});

test('calls in flight are not capped: 150 waits held until the last arrives all get their answers', async () => {
  const CALLS = 150;
  const held: http.ServerResponse[] = [];
  const server = await scripted((_request, response) => {
    held.push(response);
    if (held.length === CALLS) for (const waiting of held) json(waiting, 200, { ok: true });
  });
  try {
    const client = transport([server.url]);
    const answers = await Promise.all(Array.from({ length: CALLS }, () => client.request('GET', '/wait', { safe: false })));
    assert.equal(answers.length, CALLS);
    assert.equal(server.connections, CALLS);
  } finally {
    await server.close();
  }
});
