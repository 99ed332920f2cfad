// reply_memory.test.mjs — regression test for issue 28: a whole reply's
// memory is bounded by what it returns. `n: 16`, `max_tokens: 1000`,
// `top_logprobs: 20` built its logprobs as one JSON tree and deep-copied it:
// ~630 MB of peak resident memory for a 23 MB reply (chat), ~375 MB for a
// 6.8 MB one (completions). Now each entry is kept as the text it becomes
// (src/server/lptext.h): the server's VmHWM may grow by at most 4 times the
// reply's bytes (docs/SERVER.md "Memory"), and the reply is complete and
// well-formed. No timing.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { startServer, stopOk } from './lib.mjs';

let srv;
before(async () => { srv = await startServer(['--slots', '4', '--ctx', '1100']); });
after(async () => { if (srv) await stopOk(srv); });

// Under a sanitizer the memory is the sanitizer's: the budget is not checked there.
const SANITIZED = process.env.KS_SANITIZED === '1';
const hwm = () => Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${srv.proc.pid}/status`, 'utf8'))[1]) * 1024;

async function measured(path, body) {
  const h0 = hwm();
  const r = await fetch(`${srv.base}${path}`, { method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify(body) });
  const text = await r.text();
  const grew = hwm() - h0;
  assert.equal(r.status, 200, text.slice(0, 300));
  return { json: JSON.parse(text), bytes: Buffer.byteLength(text), grew };
}

test('chat: n 16 x 1000 tokens x top_logprobs 20 within 4x the reply bytes', async () => {
  const { json, bytes, grew } = await measured('/v1/chat/completions', {
    messages: [{ role: 'user', content: 'Hello' }], n: 16, max_tokens: 1000, logprobs: true, top_logprobs: 20,
    ignore_eos: true, temperature: 1, seed: 1,
  });
  assert.equal(json.choices.length, 16);
  for (const c of json.choices) {
    assert.equal(c.logprobs.content.length, 1000, `choice ${c.index}`);
    assert.equal(c.logprobs.content[999].top_logprobs.length, 20);
    assert.deepEqual(c.logprobs.refusal, []);
    assert.equal(c.logprobs.content.map((e) => e.token).join(''), c.message.content);
  }
  assert.ok(bytes > 10e6, `reply ${bytes} bytes`);
  if (!SANITIZED) assert.ok(grew <= 4 * bytes, `VmHWM grew ${grew} bytes for a ${bytes}-byte reply (budget ${4 * bytes})`);
});

test('completions: n 16 x 1000 tokens x logprobs 20 within 4x the reply bytes', async () => {
  const { json, bytes, grew } = await measured('/v1/completions', {
    prompt: 'Hello', n: 16, max_tokens: 1000, logprobs: 20, ignore_eos: true, temperature: 1, seed: 2,
  });
  assert.equal(json.choices.length, 16);
  for (const c of json.choices) {
    const lp = c.logprobs;
    assert.equal(lp.tokens.length, 1000);
    assert.equal(lp.token_logprobs.length, 1000);
    assert.equal(lp.top_logprobs.length, 1000);
    assert.equal(lp.text_offset.length, 1000);
    assert.equal(lp.tokens.join(''), c.text);
    assert.equal(lp.text_offset[999], Buffer.byteLength(lp.tokens.slice(0, 999).join('')));
  }
  if (!SANITIZED) assert.ok(grew <= 4 * bytes, `VmHWM grew ${grew} bytes for a ${bytes}-byte reply (budget ${4 * bytes})`);
});
