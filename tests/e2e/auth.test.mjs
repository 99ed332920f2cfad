// auth.test.mjs — --api-key: every endpoint but /health needs the bearer key.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, postJSON, getJSON, assertError } from './lib.mjs';

const KEY = 'sekrit-key-123';
let srv;
before(async () => { srv = await startServer(['--api-key', KEY]); });
after(async () => { if (srv) await stopOk(srv); });

const body = { messages: [{ role: 'user', content: 'hi' }], temperature: 0, max_tokens: 4 };
const CHAT = '/v1/chat/completions';

test('/health stays open', async () => {
  const r = await getJSON(srv, '/health');
  assert.equal(r.status, 200);
});

test('missing key -> 401 invalid_api_key', async () => {
  for (const path of ['/v1/models', '/metrics', '/slots']) {
    const r = await getJSON(srv, path);
    assertError(r, 401, 'invalid_api_key');
    assert.equal(r.headers.get('www-authenticate'), 'Bearer');
  }
  assertError(await postJSON(srv, CHAT, body), 401, 'invalid_api_key');
});

test('wrong key -> 401', async () => {
  for (const h of [`Bearer ${KEY}x`, `Bearer ${KEY.slice(0, -1)}`, 'Bearer ', KEY, `Basic ${KEY}`]) {
    const r = await postJSON(srv, CHAT, body, { headers: { authorization: h } });
    assertError(r, 401, 'invalid_api_key');
  }
});

test('right key -> 200 (Authorization: Bearer, or X-Api-Key)', async () => {
  const a = await postJSON(srv, CHAT, body, { headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(a.status, 200, a.text);
  const b = await postJSON(srv, CHAT, body, { headers: { authorization: `bearer ${KEY}` } });
  assert.equal(b.status, 200);
  const c = await postJSON(srv, CHAT, body, { headers: { 'x-api-key': KEY } });
  assert.equal(c.status, 200);
  const m = await getJSON(srv, '/v1/models', { headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(m.status, 200);
});

test('401 is decided before the body: a bad body without a key is still 401', async () => {
  const r = await postJSON(srv, CHAT, '{not json', { raw: true });
  assertError(r, 401, 'invalid_api_key');
});

test('the key can come from $KVSTASH_API_KEY', async () => {
  const s2 = await startServer([], { env: { KVSTASH_API_KEY: 'from-env' } });
  try {
    assertError(await postJSON(s2, CHAT, body), 401, 'invalid_api_key');
    const ok = await postJSON(s2, CHAT, body, { headers: { authorization: 'Bearer from-env' } });
    assert.equal(ok.status, 200);
  } finally {
    await stopOk(s2);
  }
});
