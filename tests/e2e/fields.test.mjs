// fields.test.mjs — request fields beyond the agent ones: max_tokens larger
// than the context leaves (generate until the context is full), several
// prompts in one /v1/completions request, a final assistant message that is
// continued, id_slot, and ignore_eos.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, postJSON } from './lib.mjs';

let srv;
before(async () => { srv = await startServer([]); }); // 2 slots of 512 tokens
after(async () => { if (srv) await stopOk(srv); });

const user = [{ role: 'user', content: 'Tell me a long story about the sea.' }];

test('max_tokens over the context: generation runs until the context is full, finish length', async () => {
  const r = await postJSON(srv, '/v1/chat/completions',
    { messages: user, max_tokens: 100000, temperature: 0, ignore_eos: true });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].finish_reason, 'length');
  assert.equal(r.json.usage.prompt_tokens + r.json.usage.completion_tokens, 512);
});

test('several prompts in one completion request: one choice each, as alone', async () => {
  const prompts = ['The sea is', 'Once upon a time', 'In the morning'];
  const r = await postJSON(srv, '/v1/completions', { prompt: prompts, max_tokens: 5, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  assert.deepEqual(r.json.choices.map((c) => c.index), [0, 1, 2]);
  let promptTokens = 0;
  for (let i = 0; i < prompts.length; i++) {
    const one = await postJSON(srv, '/v1/completions', { prompt: prompts[i], max_tokens: 5, temperature: 0 });
    assert.equal(r.json.choices[i].text, one.json.choices[0].text);
    promptTokens += one.json.usage.prompt_tokens;
  }
  assert.equal(r.json.usage.prompt_tokens, promptTokens);
});

test('a final assistant message is continued, and the reply holds only the new text', async () => {
  const msgs = [...user, { role: 'assistant', content: 'Once upon a time' }];
  const r = await postJSON(srv, '/v1/chat/completions', { messages: msgs, max_tokens: 6, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  const a = await postJSON(srv, '/apply-template', { messages: msgs });
  assert.ok(a.json.prompt.endsWith('Once upon a time'), a.json.prompt.slice(-40));
  assert.ok(!r.json.choices[0].message.content.startsWith('Once upon a time'));
  // The same text as a completion of the rendered prompt.
  const c = await postJSON(srv, '/v1/completions', { prompt: a.json.prompt, max_tokens: 6, temperature: 0 });
  assert.equal(r.json.choices[0].message.content, c.json.choices[0].text);
});

test('id_slot runs the request on that slot', async () => {
  for (const slot of [1, 0]) {
    const r = await postJSON(srv, '/v1/chat/completions', { messages: user, max_tokens: 2, temperature: 0, id_slot: slot });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.cache.slot, slot);
  }
});
