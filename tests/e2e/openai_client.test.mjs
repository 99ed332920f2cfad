// openai_client.test.mjs — the official `openai` npm client against kvstash.
//
// The package is installed by `make test` (tests/e2e/package.json); missing
// fails this test: it is never skipped.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, importClient } from './lib.mjs';

const KEY = 'client-key';
let srv;
let OpenAI;

before(async () => {
  OpenAI = (await importClient('openai')).default;
  srv = await startServer(['--api-key', KEY]);
});
after(async () => { if (srv) await stopOk(srv); });

const client = () => new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: KEY, maxRetries: 0, timeout: 60000 });
const messages = [
  { role: 'system', content: 'You are a test.' },
  { role: 'user', content: 'Say hello to the client library.' },
];

test('models.list', async () => {
  const list = await client().models.list();
  assert.equal(list.data.length, 1);
  assert.equal(typeof list.data[0].id, 'string');
});

test('non-streamed chat completion', async () => {
  const r = await client().chat.completions.create({ model: 'any', messages, max_tokens: 12, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
});

test('streamed chat completion equals the non-streamed one', async () => {
  const c = client();
  const plain = await c.chat.completions.create({ model: 'any', messages, max_tokens: 12, temperature: 0 });
  const s = await c.chat.completions.create({
    model: 'any', messages, max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  let n = 0;
  for await (const chunk of s) {
    n++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    for (const ch of chunk.choices) {
      text += ch.delta?.content ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(n >= 3);
  assert.equal(text, plain.choices[0].message.content);
  assert.equal(finish, plain.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, plain.usage.completion_tokens);
});

test('text completion', async () => {
  const r = await client().completions.create({ model: 'any', prompt: 'Once upon a time', max_tokens: 6, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
});

test('errors surface as APIError with status and code', async () => {
  await assert.rejects(
    client().chat.completions.create({ model: 'any', messages: [], max_tokens: 4 }),
    (e) => e.status === 400 && e.code === 'empty_array' && e.param === 'messages',
  );
  const bad = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model: 'any', messages, max_tokens: 4 }),
    (e) => e.status === 401 && e.code === 'invalid_api_key');
});
