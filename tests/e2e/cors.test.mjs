// cors.test.mjs — --cors-origin (docs/SERVER.md "CORS"): the requests a browser
// sends for a chat UI on another origin, header for header. A preflight
// (OPTIONS, no API key) answers 204 with what the route allows; every reply
// to an allowed Origin — 200, streams, each error status — carries
// Access-Control-Allow-Origin and Vary: Origin; another origin gets none, and
// so does every request of a server started without the flag. Chat
// completions, Responses and Messages alike.
// cors_browser.test.mjs drives a real browser through the same exchange.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  startServer, stopOk, runBin, MODEL, writeConfig, until, slots, parseSSE, LONG_ARGS, longChat,
} from './lib.mjs';

const KEY = 'cors-key-1';
const UI = 'http://localhost:5173'; // the chat UI's origin
const OTHER = 'http://127.0.0.1:5173'; // allowed too
const EVIL = 'https://evil.example';
const CHAT = '/v1/chat/completions';
const MAX_BODY = 4096;
const body = { messages: [{ role: 'user', content: 'hi' }], temperature: 0, max_tokens: 4 };

// What Chrome sends for fetch(url, {method: 'POST', headers: {Authorization,
// 'Content-Type': 'application/json', 'x-stainless-os': ...}}) from UI.
const preflightHeaders = (origin) => ({
  Origin: origin,
  'Access-Control-Request-Method': 'POST',
  'Access-Control-Request-Headers': 'authorization,content-type,x-stainless-os',
  'Sec-Fetch-Mode': 'cors',
  'Sec-Fetch-Site': 'cross-site',
  'Sec-Fetch-Dest': 'empty',
});

async function request(srv, method, path, { headers = {}, body: b } = {}) {
  const res = await fetch(srv.base + path, { method, headers, body: b });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, text, json };
}
const preflight = (srv, path, origin, extra = {}) =>
  request(srv, 'OPTIONS', path, { headers: { ...preflightHeaders(origin), ...extra } });
const post = (srv, path, b, headers = {}) => request(srv, 'POST', path, {
  headers: { 'Content-Type': 'application/json', ...headers }, body: typeof b === 'string' ? b : JSON.stringify(b),
});
const withKey = (origin) => ({ Origin: origin, Authorization: `Bearer ${KEY}` });

// The CORS headers of a reply to an allowed origin.
function assertAllowed(r, origin, what) {
  assert.equal(r.headers.get('access-control-allow-origin'), origin, `${what}: Allow-Origin (status ${r.status})`);
  assert.match(r.headers.get('vary') ?? '', /\bOrigin\b/, `${what}: Vary`);
  assert.match(r.headers.get('access-control-expose-headers') ?? '', /\bRetry-After\b/, `${what}: Expose-Headers`);
  assert.equal(r.headers.get('access-control-allow-credentials'), null, `${what}: credentials are never allowed`);
}
function assertNoCors(r, what) {
  for (const h of ['access-control-allow-origin', 'access-control-allow-methods', 'access-control-allow-headers',
    'access-control-expose-headers']) assert.equal(r.headers.get(h), null, `${what}: ${h} (status ${r.status})`);
}

let srv; // --cors-origin UI --cors-origin OTHER --api-key KEY
before(async () => {
  srv = await startServer(['--cors-origin', UI, '--cors-origin', OTHER, '--api-key', KEY,
    '--max-body-bytes', String(MAX_BODY)]);
});
after(async () => { if (srv) await stopOk(srv); });

test('a browser preflight from an allowed origin: 204 with the route\'s methods and the requested headers, no key needed', async () => {
  const r = await preflight(srv, CHAT, UI);
  assert.equal(r.status, 204, r.text);
  assert.equal(r.text, '');
  assertAllowed(r, UI, 'preflight');
  assert.equal(r.headers.get('access-control-allow-methods'), 'POST, OPTIONS');
  assert.equal(r.headers.get('access-control-allow-headers'), 'authorization,content-type,x-stainless-os');
  assert.ok(Number(r.headers.get('access-control-max-age')) > 0, 'Max-Age');
  assert.equal(r.headers.get('access-control-allow-private-network'), null, 'not asked: not given');
  // The second origin of the list, and a GET route's methods.
  const m = await preflight(srv, '/v1/models', OTHER, { 'Access-Control-Request-Method': 'GET' });
  assert.equal(m.status, 204, m.text);
  assertAllowed(m, OTHER, 'GET preflight');
  assert.equal(m.headers.get('access-control-allow-methods'), 'GET, HEAD, OPTIONS');
});

test('the headers the official SDKs send are echoed; a request without any gets the fixed list', async () => {
  // What openai@6 asks for in a browser (dangerouslyAllowBrowser).
  const sdk = 'authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-os,' +
    'x-stainless-package-version,x-stainless-retry-count,x-stainless-runtime,x-stainless-runtime-version,' +
    'x-stainless-timeout,anthropic-version,anthropic-dangerous-direct-browser-access';
  const r = await preflight(srv, CHAT, UI, { 'Access-Control-Request-Headers': sdk });
  assert.equal(r.status, 204);
  assert.equal(r.headers.get('access-control-allow-headers'), sdk);
  const none = await request(srv, 'OPTIONS', CHAT, { headers: { Origin: UI, 'Access-Control-Request-Method': 'POST' } });
  assert.equal(none.status, 204);
  const list = none.headers.get('access-control-allow-headers').toLowerCase();
  for (const h of ['authorization', 'content-type', 'x-api-key', 'anthropic-version', 'openai-beta', 'x-stainless-os'])
    assert.ok(list.split(/,\s*/).includes(h), `${h} missing from ${list}`);
  // Something that is not a list of header names is never sent back.
  const odd = await preflight(srv, CHAT, UI, { 'Access-Control-Request-Headers': 'authorization; evil=1' });
  assert.equal(odd.status, 204);
  assert.doesNotMatch(odd.headers.get('access-control-allow-headers'), /evil/);
});

test('Chrome\'s Private Network Access question is answered for an allowed origin', async () => {
  const r = await preflight(srv, CHAT, UI, { 'Access-Control-Request-Private-Network': 'true' });
  assert.equal(r.status, 204);
  assert.equal(r.headers.get('access-control-allow-private-network'), 'true');
});

test('then the streamed POST with the key: 200, Allow-Origin, the whole SSE stream', async () => {
  const r = await post(srv, CHAT, { ...body, stream: true }, { ...withKey(UI), 'x-stainless-os': 'Linux' });
  assert.equal(r.status, 200, r.text);
  assert.match(r.headers.get('content-type'), /^text\/event-stream/);
  assertAllowed(r, UI, 'stream');
  const events = parseSSE(r.text);
  assert.equal(events[events.length - 1].data, '[DONE]');
  const whole = await post(srv, CHAT, body, withKey(UI));
  assert.equal(whole.status, 200, whole.text);
  assertAllowed(whole, UI, 'non-streamed chat');
  assert.equal(whole.json.object, 'chat.completion');
  const models = await request(srv, 'GET', '/v1/models', { headers: withKey(OTHER) });
  assert.equal(models.status, 200);
  assertAllowed(models, OTHER, 'GET /v1/models');
  const health = await request(srv, 'GET', '/health', { headers: { Origin: UI } });
  assertAllowed(health, UI, '/health');
});

test('the Responses and Messages routes: preflight, stream and error the same way', async () => {
  for (const [path, asked] of [['/v1/responses', 'authorization,content-type,openai-beta,x-stainless-os'],
    ['/v1/messages', 'anthropic-dangerous-direct-browser-access,anthropic-version,content-type,x-api-key'],
    ['/v1/messages/count_tokens', 'anthropic-version,content-type,x-api-key']]) {
    const p = await preflight(srv, path, UI, { 'Access-Control-Request-Headers': asked });
    assert.equal(p.status, 204, `${path}: ${p.text}`);
    assertAllowed(p, UI, `preflight ${path}`);
    assert.equal(p.headers.get('access-control-allow-methods'), 'POST, OPTIONS');
    assert.equal(p.headers.get('access-control-allow-headers'), asked);
  }
  const anthropic = { Origin: UI, 'x-api-key': KEY, 'anthropic-version': '2023-06-01' };
  const m = await post(srv, '/v1/messages', { model: 'm', max_tokens: 4, stream: true,
    messages: [{ role: 'user', content: 'hi' }] }, anthropic);
  assert.equal(m.status, 200, m.text);
  assert.match(m.headers.get('content-type'), /^text\/event-stream/);
  assertAllowed(m, UI, 'Messages stream');
  assert.match(m.text, /message_stop/);
  const n = await post(srv, '/v1/messages/count_tokens', { model: 'm', messages: [{ role: 'user', content: 'hi' }] },
    anthropic);
  assert.equal(n.status, 200, n.text);
  assertAllowed(n, UI, 'count_tokens');
  const me = await post(srv, '/v1/messages', { model: 'm', max_tokens: 4, messages: [] }, { Origin: UI });
  assert.equal(me.status, 401, me.text);
  assertAllowed(me, UI, 'Messages 401');
  const r = await post(srv, '/v1/responses', { model: 'm', input: 'hi', max_output_tokens: 16, stream: true },
    withKey(UI));
  assert.equal(r.status, 200, r.text);
  assertAllowed(r, UI, 'Responses stream');
  assert.match(r.text, /event: response\.(completed|incomplete)\n/); // the last event, whichever ends it
});

test('every error status reaches the page: 400, 401, 404, 405, 413 carry Allow-Origin', async () => {
  const cases = [
    ['401 no key', await post(srv, CHAT, body, { Origin: UI }), 401],
    ['401 wrong key', await post(srv, CHAT, body, { Origin: UI, Authorization: 'Bearer nope' }), 401],
    ['400 bad JSON', await post(srv, CHAT, '{"messages": [', withKey(UI)), 400],
    ['400 bad field', await post(srv, CHAT, { ...body, temperature: 9 }, withKey(UI)), 400],
    ['404 unknown path', await request(srv, 'GET', '/v1/nothing', { headers: withKey(UI) }), 404],
    ['405 wrong method', await request(srv, 'GET', CHAT, { headers: withKey(UI) }), 405],
    ['413 body too large', await post(srv, CHAT, { ...body, pad: 'x'.repeat(MAX_BODY) }, withKey(UI)), 413],
  ];
  for (const [what, r, status] of cases) {
    assert.equal(r.status, status, `${what}: ${r.text}`);
    assert.equal(typeof r.json?.error?.message, 'string', `${what}: ${r.text}`);
    assertAllowed(r, UI, what);
  }
  // While CORS is on, OPTIONS is one of a route's methods.
  assert.equal(cases[5][1].headers.get('allow'), 'POST, OPTIONS');
});

test('an OPTIONS on an unknown path is a 404; a plain OPTIONS (no preflight) lists the methods', async () => {
  const r = await preflight(srv, '/v1/nothing', UI);
  assert.equal(r.status, 404, r.text);
  assert.equal(r.json.error.code, 'unknown_url');
  const plain = await request(srv, 'OPTIONS', '/v1/models');
  assert.equal(plain.status, 204);
  assert.equal(plain.headers.get('allow'), 'GET, HEAD, OPTIONS');
  assertNoCors(plain, 'OPTIONS without Origin');
});

test('another origin: its preflight is a 403 without CORS headers, its requests carry none', async () => {
  for (const origin of [EVIL, 'http://localhost:5174', 'null']) {
    const p = await preflight(srv, CHAT, origin);
    assert.equal(p.status, 403, `${origin}: ${p.text}`);
    assert.equal(p.json.error.code, 'origin_not_allowed');
    assertNoCors(p, `preflight from ${origin}`);
    assert.match(p.headers.get('vary') ?? '', /\bOrigin\b/);
    const r = await post(srv, CHAT, { ...body, stream: true }, withKey(origin));
    assert.equal(r.status, 200, r.text); // served (CORS is not authentication), but a browser will not show it
    assertNoCors(r, `stream to ${origin}`);
    const e = await post(srv, CHAT, body, { Origin: origin });
    assert.equal(e.status, 401);
    assertNoCors(e, `401 to ${origin}`);
  }
  // No Origin at all (curl, the SDKs in node): no CORS headers.
  const r = await post(srv, CHAT, body, { Authorization: `Bearer ${KEY}` });
  assert.equal(r.status, 200);
  assertNoCors(r, 'no Origin');
});

test('a 503 queue_full reaches the page with Retry-After readable', async () => {
  const s2 = await startServer(['--slots', '1', '--max-queue', '1', ...LONG_ARGS, '--cors-origin', UI]);
  try {
    const long = post(s2, CHAT, longChat({ max_tokens: 4 }), { Origin: UI });
    await until(async () => (await slots(s2))[0].busy, 'the long request to take the slot');
    const rs = await Promise.all([...Array(3).keys()].map(() => post(s2, CHAT, body, { Origin: UI })));
    const full = rs.filter((r) => r.status === 503);
    assert.ok(full.length >= 1, rs.map((r) => r.status).join(','));
    for (const r of full) {
      assert.equal(r.json.error.code, 'queue_full');
      assert.equal(r.headers.get('retry-after'), '1');
      assertAllowed(r, UI, '503');
    }
    const l = await long;
    assert.equal(l.status, 200, l.text);
    assertAllowed(l, UI, 'the long request');
  } finally {
    await stopOk(s2);
  }
});

test('without --cors-origin: no CORS header on any reply, and a preflight is refused (405)', async () => {
  const s2 = await startServer([]);
  try {
    const p = await preflight(s2, CHAT, UI);
    assert.equal(p.status, 405, p.text);
    assert.equal(p.headers.get('allow'), 'POST');
    assertNoCors(p, 'preflight');
    assert.equal(p.headers.get('vary'), null);
    const r = await post(s2, CHAT, { ...body, stream: true }, { Origin: UI });
    assert.equal(r.status, 200);
    assertNoCors(r, 'stream');
    assert.equal(r.headers.get('vary'), null);
    const e = await post(s2, CHAT, '{', { Origin: UI });
    assert.equal(e.status, 400);
    assertNoCors(e, '400');
  } finally {
    await stopOk(s2);
  }
});

test('--cors-origin "*": any origin gets Allow-Origin: *, and without --api-key a warning', async () => {
  const s2 = await startServer(['--cors-origin', '*']);
  try {
    // Logged after the port line: wait for it.
    await until(() => /W serve .*'\*' without --api-key/.test(s2.stderr), 'the warning about * without a key', 10000);
    for (const origin of [EVIL, UI, 'null']) {
      const p = await preflight(s2, CHAT, origin);
      assert.equal(p.status, 204, p.text);
      assertAllowed(p, '*', `preflight from ${origin}`);
      const r = await post(s2, CHAT, { ...body, stream: true }, { Origin: origin });
      assert.equal(r.status, 200);
      assertAllowed(r, '*', `stream to ${origin}`);
    }
  } finally {
    await stopOk(s2);
  }
});

test('cors_origins in the config file; --cors-origin replaces the file\'s list', async () => {
  const cfg = writeConfig(`cors_origins:\n  - ${EVIL}\n  - ${OTHER}\n`);
  const s2 = await startServer(['--config', cfg]);
  try {
    await until(() => /I serve .*cors: browser pages from https:\/\/evil\.example http:\/\/127\.0\.0\.1:5173 may/
      .test(s2.stderr), 'the cors line', 10000);
    assertAllowed(await preflight(s2, CHAT, EVIL), EVIL, 'file origin 1');
    assertAllowed(await preflight(s2, CHAT, OTHER), OTHER, 'file origin 2');
    assert.equal((await preflight(s2, CHAT, UI)).status, 403);
  } finally {
    await stopOk(s2);
  }
  const s3 = await startServer(['--config', cfg, '--cors-origin', UI]);
  try {
    assertAllowed(await preflight(s3, CHAT, UI), UI, 'flag origin');
    assert.equal((await preflight(s3, CHAT, EVIL)).status, 403, 'the file\'s origin is replaced');
  } finally {
    await stopOk(s3);
  }
});

test('an origin that a browser never sends is refused at start: exit code 2, the reason on stderr', async () => {
  for (const [origin, want] of [['http://localhost:5173/', /not an origin/], ['localhost:5173', /not an origin/],
    ['null', /'null' origin/], ['', /empty origin/], ['http://host/path', /not an origin/]]) {
    const r = await runBin(['serve', '-m', MODEL, '--port', '0', '--cors-origin', origin], { timeoutMs: 20000 });
    assert.equal(r.code, 2, `${origin}: exit ${r.code}\n${r.stderr}`);
    assert.match(r.stderr, /--cors-origin: /);
    assert.match(r.stderr, want, r.stderr);
  }
  const many = [...Array(17).keys()].flatMap((i) => ['--cors-origin', `http://h${i}.example`]);
  const r = await runBin(['serve', '-m', MODEL, '--port', '0', ...many], { timeoutMs: 20000 });
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /at most 16 origins/);
  const bad = await runBin(['serve', '-m', MODEL, '--port', '0', '--config',
    writeConfig('cors_origins: [http://ok.example, "https://x.example/"]\n')], { timeoutMs: 20000 });
  assert.equal(bad.code, 2, bad.stderr);
  assert.match(bad.stderr, /'cors_origins\[1\]' at line 1: .*not an origin/);
});
