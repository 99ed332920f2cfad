// disconnect.test.mjs — a client that goes away frees its slot: the request
// is canceled in the scheduler instead of running to its end.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  startServer, stopOk, streamUntil, until, metrics, slots, chat, LONG_ARGS, longChat,
} from './lib.mjs';

let srv;
before(async () => { srv = await startServer(['--slots', '1', ...LONG_ARGS]); });
after(async () => { if (srv) await stopOk(srv); });

const CHAT = '/v1/chat/completions';

async function counters() {
  const m = await metrics(srv);
  return { gone: m.get('kvstash_client_disconnects_total'), canceled: m.get('kvstash_requests_canceled_total') };
}

test('stream: disconnect during the prefill cancels the request', async () => {
  const before_ = await counters();
  // The role chunk comes at once; the prefill then takes seconds. Leave after it.
  const r = await streamUntil(srv, CHAT, longChat(), (json) => json?.choices?.[0]?.delta?.role === 'assistant');
  assert.ok(r.aborted);
  await until(async () => (await slots(srv))[0].busy === false, 'the slot to become idle');
  const s = (await slots(srv))[0];
  // Canceled before its first token: nothing was generated.
  assert.equal(s.n_generated, 0);
  await until(async () => (await counters()).canceled === before_.canceled + 1, 'the cancel to be counted');
  const after_ = await counters();
  assert.equal(after_.gone, before_.gone + 1);
});

test('non-stream: disconnect while waiting cancels the request', async () => {
  const before_ = await counters();
  const ac = new AbortController();
  const p = fetch(srv.base + CHAT, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(longChat()), signal: ac.signal,
  }).catch((e) => e);
  await until(async () => (await slots(srv))[0].busy, 'the slot to become busy');
  ac.abort();
  const res = await p;
  assert.equal(res.name, 'AbortError');
  await until(async () => (await slots(srv))[0].busy === false, 'the slot to become idle');
  assert.equal((await slots(srv))[0].n_generated, 0);
  await until(async () => (await counters()).canceled === before_.canceled + 1, 'the cancel to be counted');
  assert.equal((await counters()).gone, before_.gone + 1);
});

test('stream: disconnect after the first tokens frees the slot', async () => {
  const r = await streamUntil(srv, CHAT,
    { messages: [{ role: 'user', content: 'Talk for a long time.' }], temperature: 0, max_tokens: 2000 },
    (json) => typeof json?.choices?.[0]?.delta?.content === 'string' && json.choices[0].delta.content.length > 0);
  // Either we left mid-stream or the reply was shorter than one event; the slot frees either way.
  assert.ok(r.events.length >= 1);
  await until(async () => (await slots(srv))[0].busy === false, 'the slot to become idle');
});

test('the slot serves the next request normally', async () => {
  const r = await chat(srv, [{ role: 'user', content: 'hello again' }], { max_tokens: 8 });
  assert.equal(r.object, 'chat.completion');
});
