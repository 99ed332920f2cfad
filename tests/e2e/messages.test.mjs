// messages.test.mjs — the Anthropic Messages API (POST /v1/messages and
// /v1/messages/count_tokens) with the official `@anthropic-ai/sdk`:
// messages.create and messages.stream, a tool loop (tool_use -> tool_result
// -> answer), stop sequences, count_tokens, errors in Anthropic's shape, and
// every cached answer equal to the uncached one; the same conversation
// through /v1/chat/completions renders to the same tokens and shares the cache.
//
// Random weights never call a tool by themselves: tool_choice "any" with an
// assistant prefill ("<tool_call>\n") starts the call, and the template's
// tool-call grammar holds it valid (as in agent.test.mjs).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, postJSON, importClient, templateModel } from './lib.mjs';

let srv, dir, client, Anthropic, modelPath;

before(async () => {
  Anthropic = (await importClient('@anthropic-ai/sdk')).default;
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-msg-'));
  const model = templateModel(dir);
  modelPath = model;
  srv = await startServer(['-m', model, '--ctx', '2048', '--slots', '2']);
  client = new Anthropic({ baseURL: srv.base, apiKey: 'none', maxRetries: 0, timeout: 120000 });
});
after(async () => {
  if (srv) await stopOk(srv);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const TOOL = {
  name: 'get_weather',
  description: 'The current weather of a city',
  input_schema: {
    type: 'object',
    properties: { city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] } },
    required: ['city'],
    additionalProperties: false,
  },
};
const SYSTEM = 'You are a weather assistant. Use the tools.';
const ASK = { role: 'user', content: 'What is the weather in Paris?' };
const PREFILL = { role: 'assistant', content: '<tool_call>\n' };
const CALL = { model: 'kvstash', system: SYSTEM, messages: [ASK, PREFILL], tools: [TOOL],
  tool_choice: { type: 'any', disable_parallel_tool_use: true }, temperature: 0, max_tokens: 100 };

async function uncached(body) {
  const r = await postJSON(srv, '/v1/messages', { ...body, cache_prompt: false });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

const uses = (m) => m.content.filter((b) => b.type === 'tool_use');
const textOf = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');

function checkUse(b) {
  assert.equal(b.type, 'tool_use');
  assert.equal(b.name, 'get_weather');
  assert.ok(['Paris', 'Rome', 'Oslo'].includes(b.input.city), JSON.stringify(b.input));
  assert.ok(b.id.length > 0);
}

test('messages.create: a text reply with usage; cached equals uncached', async () => {
  const req = { model: 'kvstash', system: 'Be brief.', messages: [{ role: 'user', content: 'Tell me about the sea.' }],
    temperature: 0, max_tokens: 12 };
  const m = await client.messages.create(req);
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason));
  assert.equal(m.content[0].type, 'text');
  const n = m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.cache_creation_input_tokens;
  const count = await client.messages.countTokens({ model: 'kvstash', system: 'Be brief.', messages: req.messages });
  assert.equal(n, count.input_tokens, 'count_tokens counts the prompt the reply was made from');
  const again = await client.messages.create(req);
  assert.ok(again.usage.cache_read_input_tokens > 0, 'the same prompt again is read from the cache');
  assert.equal(again.usage.input_tokens + again.usage.cache_read_input_tokens, n);
  const u = await uncached(req);
  assert.equal(u.usage.cache_read_input_tokens, 0);
  assert.equal(textOf(u), textOf(m));
  assert.equal(textOf(again), textOf(m));
});

test('the same conversation through chat and messages: same tokens, shared cache, same output', async () => {
  const chat = await postJSON(srv, '/v1/chat/completions', {
    messages: [{ role: 'system', content: SYSTEM }, ASK], temperature: 0, max_tokens: 10 });
  assert.equal(chat.status, 200, chat.text);
  const m = await client.messages.create({ model: 'kvstash', system: SYSTEM, messages: [ASK], temperature: 0,
    max_tokens: 10 });
  const n = m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.cache_creation_input_tokens;
  assert.equal(n, chat.json.usage.prompt_tokens);
  assert.ok(m.usage.cache_read_input_tokens >= n - 1, `read ${m.usage.cache_read_input_tokens} of ${n}`);
  assert.equal(textOf(m), chat.json.choices[0].message.content);
});

test('tool loop: tool_use, tool_result, answer (messages.create)', async () => {
  const m1 = await client.messages.create(CALL);
  assert.equal(m1.stop_reason, 'tool_use', JSON.stringify(m1.content));
  const u = uses(m1);
  assert.equal(u.length, 1);
  checkUse(u[0]);
  const u1 = await uncached(CALL);
  assert.deepEqual(uses(u1).map((b) => b.input), u.map((b) => b.input));

  const req2 = { model: 'kvstash', system: SYSTEM, tools: [TOOL], temperature: 0, max_tokens: 12, messages: [ASK,
    { role: 'assistant', content: m1.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: u[0].id, content: '21 C, clear sky' }] }] };
  const m2 = await client.messages.create(req2);
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(m2.stop_reason));
  assert.ok(m2.usage.cache_read_input_tokens > 0);
  const u2 = await uncached(req2);
  assert.deepEqual(u2.content, JSON.parse(JSON.stringify(m2.content)));
});

test('tool loop streamed with messages.stream: the same call, then the answer', async () => {
  const whole = await client.messages.create(CALL);
  const s = client.messages.stream(CALL);
  const events = [];
  let json = '';
  s.on('streamEvent', (ev) => events.push(ev.type));
  s.on('inputJson', (delta) => { json += delta; });
  const m1 = await s.finalMessage();
  assert.equal(events[0], 'message_start');
  assert.equal(events.at(-1), 'message_stop');
  assert.ok(events.includes('content_block_start') && events.includes('content_block_stop'));
  assert.equal(m1.stop_reason, 'tool_use');
  const u = uses(m1);
  checkUse(u[0]);
  assert.deepEqual(u[0].input, uses(whole)[0].input);
  assert.deepEqual(JSON.parse(json), u[0].input);
  assert.ok(m1.usage.cache_read_input_tokens > 0, 'message_delta carries the final usage');

  const req2 = { ...CALL, tool_choice: { type: 'auto' }, max_tokens: 12, messages: [ASK,
    { role: 'assistant', content: m1.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: u[0].id, content: [{ type: 'text', text: 'sunny' }] },
      { type: 'text', text: 'Thanks. Summarize.' }] }] };
  let text = '';
  const s2 = client.messages.stream(req2);
  s2.on('text', (t) => { text += t; });
  const m2 = await s2.finalMessage();
  assert.equal(textOf(m2), text);
  const u2 = await uncached(req2);
  assert.equal(textOf(u2), text);
});

test('stop_sequences: stop_reason stop_sequence names the one met', async () => {
  const base = { model: 'kvstash', messages: [{ role: 'user', content: 'Count.' }], temperature: 0, max_tokens: 16 };
  const free = await client.messages.create(base);
  const text = textOf(free);
  const words = text.trim().split(/\s+/);
  assert.ok(words.length >= 3, text);
  const stop = ' ' + words[2];
  const m = await client.messages.create({ ...base, stop_sequences: ['@@never@@', stop] });
  assert.equal(m.stop_reason, 'stop_sequence');
  assert.equal(m.stop_sequence, stop);
  assert.equal(textOf(m), text.slice(0, text.indexOf(stop)));
});

test('errors come in Anthropic\'s shape; the server stays up', async () => {
  const r1 = await postJSON(srv, '/v1/messages', { model: 'x', messages: [ASK] });
  assert.equal(r1.status, 400);
  assert.equal(r1.json.type, 'error');
  assert.equal(r1.json.error.type, 'invalid_request_error');
  assert.match(r1.json.error.message, /max_tokens/);
  await assert.rejects(client.messages.create({ model: 'x', max_tokens: 4,
    messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: '' } }] }] }),
  (e) => e instanceof Anthropic.BadRequestError && /image/.test(e.message));
  await assert.rejects(client.messages.create({ model: 'x', max_tokens: 4, messages: [ASK], tools: [{ type: 'bash_20250124', name: 'bash' }] }),
    (e) => e.status === 400);
  const r2 = await postJSON(srv, '/v1/messages', { model: 'x', max_tokens: 4, messages: [{ role: 'tool', content: 'x' }] });
  assert.equal(r2.status, 400);
  assert.match(r2.json.error.message, /messages\.0\.role/);
  const r3 = await postJSON(srv, '/v1/messages', { model: 'x', max_tokens: 4, messages: [ASK],
    system: [{ type: 'text', text: 'x', cache_control: { type: 'ephemeral', ttl: '2d' } }] });
  assert.equal(r3.status, 400);
  assert.match(r3.json.error.message, /ttl/);
  const r4 = await postJSON(srv, '/v1/messages/count_tokens', { model: 'x', messages: [] });
  assert.equal(r4.status, 400);
  assert.equal(r4.json.type, 'error');
  const r5 = await postJSON(srv, '/v1/messages', '{not json', { raw: true });
  assert.equal(r5.status, 400);
  assert.equal(r5.json.type, 'error');
  const ok = await client.messages.create({ model: 'x', max_tokens: 2, messages: [ASK] });
  assert.equal(ok.type, 'message');
});

test('with --api-key: the SDK\'s x-api-key header works; without it a 401 in Anthropic\'s shape', async () => {
  const keyed = await startServer(['-m', modelPath, '--api-key', 'sekrit']);
  try {
    const c = new Anthropic({ baseURL: keyed.base, apiKey: 'sekrit', maxRetries: 0 });
    const m = await c.messages.create({ model: 'x', max_tokens: 2, messages: [ASK] });
    assert.equal(m.type, 'message');
    const r = await postJSON(keyed, '/v1/messages', { model: 'x', max_tokens: 2, messages: [ASK] });
    assert.equal(r.status, 401);
    assert.deepEqual(Object.keys(r.json).sort(), ['error', 'type']);
    assert.equal(r.json.error.type, 'authentication_error');
    const bad = new Anthropic({ baseURL: keyed.base, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(bad.messages.countTokens({ model: 'x', messages: [ASK] }),
      (e) => e instanceof Anthropic.AuthenticationError);
  } finally {
    await stopOk(keyed);
  }
});
