// queue.test.mjs — a full queue answers 503 queue_full with Retry-After at
// once; the accepted requests still complete.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, postJSON, until, slots, metrics, chat, LONG_ARGS, longChat } from './lib.mjs';

let srv;
before(async () => { srv = await startServer(['--slots', '1', '--max-queue', '1', ...LONG_ARGS]); });
after(async () => { if (srv) await stopOk(srv); });

const CHAT = '/v1/chat/completions';

test('503 queue_full when the only slot is busy and the queue holds one', async () => {
  const long = postJSON(srv, CHAT, longChat({ max_tokens: 4 }));
  await until(async () => (await slots(srv))[0].busy, 'the long request to take the slot');
  const short = { messages: [{ role: 'user', content: 'hi' }], temperature: 0, max_tokens: 4 };
  const rs = await Promise.all([...Array(4).keys()].map(() => postJSON(srv, CHAT, short)));
  const full = rs.filter((r) => r.status === 503);
  const ok = rs.filter((r) => r.status === 200);
  assert.equal(full.length, 3, rs.map((r) => r.status).join(','));
  assert.equal(ok.length, 1);
  for (const r of full) {
    assert.equal(r.json.error.code, 'queue_full');
    assert.equal(r.json.error.type, 'server_error');
    assert.equal(r.headers.get('retry-after'), '1');
  }
  const l = await long;
  assert.equal(l.status, 200, l.text);
  const m = await metrics(srv);
  assert.equal(m.get('kvstash_requests_rejected_total'), 3);
  assert.equal(m.get('kvstash_http_errors_total{code="503"}'), 3);
});

test('once the slot is free requests are accepted again', async () => {
  await until(async () => !(await slots(srv))[0].busy, 'the slot to become idle');
  const r = await chat(srv, [{ role: 'user', content: 'hi' }], { max_tokens: 4 });
  assert.equal(r.object, 'chat.completion');
});
