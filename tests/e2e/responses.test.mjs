// responses.test.mjs — the OpenAI Responses API (POST /v1/responses) with the
// official `openai` SDK: responses.create streamed and not, a function tool
// (function_call -> function_call_output -> answer), a JSON-schema
// text.format through responses.parse, previous_response_id (kept, then a
// clear 400 for an unknown id), cached input tokens on turn 2, and every
// cached answer equal to the uncached one. The same conversation through
// /v1/chat/completions renders to the same tokens and shares the cache.
//
// Random weights never call a tool by themselves: tool_choice "required"
// with an assistant prefill ("<tool_call>\n", as in agent.test.mjs) starts the
// call, and the template's tool-call grammar holds it valid.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, postJSON, importClient, assertError, sleep, templateModel } from './lib.mjs';

let srv, dir, client, OpenAI, modelPath;

before(async () => {
  OpenAI = (await importClient('openai')).default;
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-resp-'));
  const model = templateModel(dir);
  modelPath = model;
  srv = await startServer(['-m', model, '--ctx', '2048', '--slots', '2']);
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
});
after(async () => {
  if (srv) await stopOk(srv);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const TOOL = {
  type: 'function',
  name: 'get_weather',
  description: 'The current weather of a city',
  parameters: {
    type: 'object',
    properties: { city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] } },
    required: ['city'],
    additionalProperties: false,
  },
  strict: true,
};
const INSTRUCTIONS = 'You are a weather assistant. Use the tools.';
const ASK = { role: 'user', content: 'What is the weather in Paris?' };
const PREFILL = { role: 'assistant', content: '<tool_call>\n' };
const CALL = { instructions: INSTRUCTIONS, input: [ASK, PREFILL], tools: [TOOL], tool_choice: 'required',
  parallel_tool_calls: false, temperature: 0, max_output_tokens: 100 };

async function uncached(body) {
  const r = await postJSON(srv, '/v1/responses', { ...body, cache_prompt: false, store: false });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

const calls = (r) => r.output.filter((i) => i.type === 'function_call');

function checkCall(fc) {
  assert.equal(fc.type, 'function_call');
  assert.equal(fc.name, 'get_weather');
  assert.match(fc.id, /^fc_/);
  assert.match(fc.call_id, /^[A-Za-z0-9]{9}$/);
  const args = JSON.parse(fc.arguments);
  assert.ok(['Paris', 'Rome', 'Oslo'].includes(args.city), fc.arguments);
}

test('responses.create: text output, output_text, usage; cached equals uncached', async () => {
  const req = { instructions: 'Be brief.', input: 'Tell me about the sea.', temperature: 0, max_output_tokens: 12 };
  const r = await client.responses.create(req);
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.ok(['completed', 'incomplete'].includes(r.status));
  if (r.status === 'incomplete') assert.equal(r.incomplete_details.reason, 'max_output_tokens');
  assert.equal(r.output.length, 1);
  assert.equal(r.output[0].type, 'message');
  assert.equal(r.output[0].content[0].type, 'output_text');
  assert.equal(r.output_text, r.output[0].content[0].text, 'the SDK assembles output_text');
  assert.ok(r.usage.input_tokens > 10);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.equal(r.instructions, 'Be brief.');
  const again = await client.responses.create(req);
  assert.ok(again.usage.input_tokens_details.cached_tokens > 0, 'the same prompt again comes from the cache');
  const u = await uncached(req);
  assert.equal(u.usage.input_tokens_details.cached_tokens, 0);
  assert.equal(u.output[0].content[0].text, r.output_text);
  assert.equal(again.output_text, r.output_text);
});

test('the same conversation through chat and responses: same tokens, shared cache, same output', async () => {
  const chat = await postJSON(srv, '/v1/chat/completions', {
    messages: [{ role: 'system', content: INSTRUCTIONS }, ASK], temperature: 0, max_tokens: 10 });
  assert.equal(chat.status, 200, chat.text);
  const r = await client.responses.create({ instructions: INSTRUCTIONS, input: [ASK], temperature: 0,
    max_output_tokens: 10 });
  assert.equal(r.usage.input_tokens, chat.json.usage.prompt_tokens);
  assert.ok(r.usage.input_tokens_details.cached_tokens >= chat.json.usage.prompt_tokens - 1,
    `cached ${r.usage.input_tokens_details.cached_tokens} of ${r.usage.input_tokens}`);
  assert.equal(r.output_text, chat.json.choices[0].message.content);
});

test('function tool: function_call, then function_call_output, then an answer (not streamed)', async () => {
  const r1 = await client.responses.create(CALL);
  assert.equal(r1.status, 'completed');
  const fc = calls(r1);
  assert.equal(fc.length, 1, JSON.stringify(r1.output));
  checkCall(fc[0]);
  const u1 = await uncached(CALL);
  assert.deepEqual(calls(u1).map((c) => [c.name, c.arguments]), fc.map((c) => [c.name, c.arguments]));

  // Turn 2 sends the whole history back, as a stateless client does.
  const req2 = { instructions: INSTRUCTIONS, tools: [TOOL], temperature: 0, max_output_tokens: 12,
    input: [ASK, { type: 'function_call', call_id: fc[0].call_id, name: fc[0].name, arguments: fc[0].arguments },
      { type: 'function_call_output', call_id: fc[0].call_id, output: '{"temperature_c": 21, "sky": "clear"}' }] };
  const r2 = await client.responses.create(req2);
  assert.ok(r2.usage.input_tokens_details.cached_tokens > 0);
  const u2 = await uncached(req2);
  assert.deepEqual(u2.output.map((i) => i.content ?? i.arguments), r2.output.map((i) => i.content ?? i.arguments));
});

test('function tool streamed: typed events in order, the same call as not streamed', async () => {
  const whole = await client.responses.create(CALL);
  const stream = await client.responses.create({ ...CALL, stream: true });
  const types = [];
  let args = '', final = null, added = null, seq = -1;
  for await (const ev of stream) {
    types.push(ev.type);
    assert.equal(ev.sequence_number, seq + 1, 'sequence numbers count up from 0');
    seq = ev.sequence_number;
    if (ev.type === 'response.output_item.added' && ev.item.type === 'function_call') added = ev.item;
    if (ev.type === 'response.function_call_arguments.delta') args += ev.delta;
    if (ev.type === 'response.completed') final = ev.response;
  }
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.equal(types.at(-1), 'response.completed');
  assert.ok(added && added.name === 'get_weather' && added.call_id, 'the call opens with its name and call_id');
  assert.ok(types.includes('response.function_call_arguments.done'));
  assert.ok(types.includes('response.output_item.done'));
  assert.equal(args, calls(whole)[0].arguments);
  checkCall(calls(final)[0]);
  assert.equal(calls(final)[0].arguments, args);
  assert.ok(final.usage.input_tokens_details.cached_tokens > 0);
});

test('text streamed with the SDK helper: deltas add up to the final text', async () => {
  const req = { input: 'Write about rivers.', temperature: 0, max_output_tokens: 16 };
  const s = client.responses.stream(req);
  let text = '';
  s.on('response.output_text.delta', (ev) => { text += ev.delta; });
  const final = await s.finalResponse();
  assert.equal(final.output_text, text);
  const whole = await client.responses.create(req);
  assert.equal(whole.output_text, text);
});

test('responses.parse with a JSON-schema text.format: valid objects', async () => {
  const schema = {
    type: 'object',
    properties: {
      city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] },
      level: { type: 'integer', minimum: 0, maximum: 9 },
    },
    required: ['city', 'level'],
    additionalProperties: false,
  };
  for (let seed = 1; seed <= 4; seed++) {
    const r = await client.responses.parse({ input: [ASK], temperature: 1, seed, max_output_tokens: 48,
      text: { format: { type: 'json_schema', name: 'weather', schema, strict: true } } });
    const p = r.output_parsed;
    assert.ok(p && typeof p === 'object', `seed ${seed}: ${r.output_text}`);
    assert.ok(['Paris', 'Rome', 'Oslo'].includes(p.city));
    assert.ok(Number.isInteger(p.level) && p.level >= 0 && p.level <= 9);
  }
});

test('previous_response_id: turn 2 is the conversation so far plus the input, from the cache', async () => {
  // Instructions do not carry over (as on OpenAI): a client sends them each turn.
  const I = 'You tell long stories.';
  const t1 = await client.responses.create({ instructions: I,
    input: 'Tell me a story about the sea and the mountains.', temperature: 0, max_output_tokens: 12 });
  const t2 = await client.responses.create({ instructions: I, previous_response_id: t1.id, input: 'And then?',
    temperature: 0, max_output_tokens: 12 });
  assert.equal(t2.previous_response_id, t1.id);
  assert.ok(t2.usage.input_tokens > t1.usage.input_tokens);
  // All of turn 1's prompt and most of its reply (the template may render the
  // reply's last tokens differently from how they were generated).
  assert.ok(t2.usage.input_tokens_details.cached_tokens >= t1.usage.input_tokens,
    `turn 2 cached ${t2.usage.input_tokens_details.cached_tokens} < turn 1 prompt ${t1.usage.input_tokens}`);
  // The same conversation sent whole gives the same prompt and, uncached, the same reply.
  const whole = await uncached({ instructions: I, input: [
    { role: 'user', content: 'Tell me a story about the sea and the mountains.' },
    { role: 'assistant', content: t1.output_text },
    { role: 'user', content: 'And then?' }], temperature: 0, max_output_tokens: 12 });
  assert.equal(whole.usage.input_tokens, t2.usage.input_tokens);
  assert.equal(whole.output[0].content[0].text, t2.output_text);
  // Chained again; without the instructions the prompt starts differently.
  const t3 = await client.responses.create({ instructions: I, previous_response_id: t2.id, input: 'The end.',
    temperature: 0, max_output_tokens: 4 });
  assert.ok(t3.usage.input_tokens_details.cached_tokens >= t2.usage.input_tokens);
  const t3b = await client.responses.create({ previous_response_id: t2.id, input: 'The end.', temperature: 0,
    max_output_tokens: 4 });
  assert.notEqual(t3b.usage.input_tokens, t3.usage.input_tokens);
});

test('previous_response_id that the server does not hold, store: false: a 400 that says so', async () => {
  await assert.rejects(client.responses.create({ previous_response_id: 'resp_unknown', input: 'x' }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.code, 'previous_response_not_found');
    assert.equal(e.param, 'previous_response_id');
    assert.match(e.message, /keeps responses in memory for \d+ s/);
    return true;
  });
  const t = await client.responses.create({ input: 'x', store: false, max_output_tokens: 2 });
  assert.equal(t.store, false);
  const r = await postJSON(srv, '/v1/responses', { previous_response_id: t.id, input: 'y' });
  assertError(r, 400, 'previous_response_not_found', 'previous_response_id');
});

test('bad requests: a 400 naming the field, the server stays up', async () => {
  assertError(await postJSON(srv, '/v1/responses', { input: 'x', conversation: 'conv_1' }), 400,
    'unsupported_parameter', 'conversation');
  assertError(await postJSON(srv, '/v1/responses', {}), 400, 'missing_required_parameter', 'input');
  assertError(await postJSON(srv, '/v1/responses', { input: [{ type: 'input_image', image_url: 'x' }] }), 400,
    'unsupported_value', 'input[0].type');
  assertError(await postJSON(srv, '/v1/responses', { input: [{ role: 'user', content: [{ type: 'input_image' }] }] }),
    400, 'missing_required_parameter', 'input[0].content[0].image_url');
  assertError(await postJSON(srv, '/v1/responses', { input: [{ role: 'user', content: [{ type: 'input_file' }] }] }),
    400, 'unsupported_value', 'input[0].content[0].type');
  assertError(await postJSON(srv, '/v1/responses', { input: 'x', tools: [{ type: 'wizardry' , name: 'w' }, { name: 'f' }] }),
    400, 'missing_required_parameter', 'tools[1].type');
  assertError(await postJSON(srv, '/v1/responses', { input: 'x', text: { format: { type: 'yaml' } } }), 400,
    'invalid_value', 'text.format.type');
  assertError(await postJSON(srv, '/v1/responses', { input: [{ type: 'function_call', name: 'f' }] }), 400,
    'missing_required_parameter', 'input[0].call_id');
  assertError(await postJSON(srv, '/v1/responses', { input: 'x', temperature: 'hot' }), 400, 'invalid_type',
    'temperature');
  assertError(await postJSON(srv, '/v1/responses', { input: 'x', background: true }), 400, 'unsupported_value',
    'background');
  const ok = await client.responses.create({ input: 'still up?', max_output_tokens: 2 });
  assert.equal(ok.object, 'response');
});

test('--responses-ttl: a response older than the TTL is forgotten with a 400; --responses-max 0 keeps none', async () => {
  const short = await startServer(['-m', modelPath, '--responses-ttl', '1']);
  const none = await startServer(['-m', modelPath, '--responses-max', '0']);
  try {
    const c = new OpenAI({ baseURL: `${short.base}/v1`, apiKey: 'none', maxRetries: 0 });
    const t1 = await c.responses.create({ input: 'hello', max_output_tokens: 2 });
    const t2 = await c.responses.create({ previous_response_id: t1.id, input: 'again', max_output_tokens: 2 });
    assert.equal(t2.previous_response_id, t1.id);
    await sleep(1500);
    const r = await postJSON(short, '/v1/responses', { previous_response_id: t1.id, input: 'late' });
    assertError(r, 400, 'previous_response_not_found', 'previous_response_id');
    assert.match(r.json.error.message, /for 1 s/);
    const n1 = await postJSON(none, '/v1/responses', { input: 'hello', max_output_tokens: 2 });
    assert.equal(n1.status, 200, n1.text);
    assertError(await postJSON(none, '/v1/responses', { previous_response_id: n1.json.id, input: 'x' }), 400,
      'previous_response_not_found', 'previous_response_id');
  } finally {
    await stopOk(short);
    await stopOk(none);
  }
});
