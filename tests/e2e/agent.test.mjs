// agent.test.mjs — an agent on kvstash with the official `openai` SDK: the
// model's own template (Qwen2.5's, written into a tiny random-weight GGUF),
// tool calls (tool_choice required, then auto), tool results, structured
// output through chat.completions.parse, logprobs, logit_bias and n > 1;
// streamed and not, and every cached answer equal to the uncached one.
//
// Random weights never call a tool by themselves: "required" constrains the
// output with the template's tool-call grammar, and an "auto" call is started
// by an assistant prefill ("<tool_call>\n"), which the grammar then holds to a
// valid call.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, postJSON, importClient, templateModel } from './lib.mjs';

let srv, dir, client, OpenAI;

before(async () => {
  OpenAI = (await importClient('openai')).default;
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-agent-'));
  const model = templateModel(dir);
  srv = await startServer(['-m', model, '--ctx', '2048', '--slots', '2']);
  client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 120000 });
});
after(async () => {
  if (srv) await stopOk(srv);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather of a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] } },
      required: ['city'],
      additionalProperties: false,
    },
  },
}];
const START = [
  { role: 'system', content: 'You are a weather assistant. Use the tools.' },
  { role: 'user', content: 'What is the weather in Paris?' },
];
// The grammar of tool_choice "required" allows text before the call (as in
// llama.cpp), which random weights fill until max_tokens: the call is started
// by a prefill, then the grammar holds it to one valid call.
const PREFILL = { role: 'assistant', content: '<tool_call>\n' };
const CALL = { messages: [...START, PREFILL], tools: TOOLS, parallel_tool_calls: false, temperature: 0,
  max_tokens: 100 };

// The same request without the cache: the answer must not change.
async function uncached(body) {
  const r = await postJSON(srv, '/v1/chat/completions', { ...body, cache_prompt: false });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

function checkCall(tc) {
  assert.equal(tc.type, 'function');
  assert.match(tc.id, /^[A-Za-z0-9]{9}$/);
  assert.equal(tc.function.name, 'get_weather');
  const args = JSON.parse(tc.function.arguments);
  assert.ok(['Paris', 'Rome', 'Oslo'].includes(args.city), tc.function.arguments);
}

// Collects a streamed chat completion the way an SDK user does.
async function collect(stream) {
  let content = '';
  const calls = [];
  let finish = null, usage = null, sawHeaderFirst = true;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const ch of chunk.choices) {
      if (ch.delta?.content) content += ch.delta.content;
      for (const d of ch.delta?.tool_calls ?? []) {
        if (!calls[d.index]) {
          // OpenAI's order: the id and the name come first, with the call's first delta.
          if (!d.id || !d.function?.name) sawHeaderFirst = false;
          calls[d.index] = { id: d.id, type: 'function', function: { name: d.function?.name, arguments: '' } };
        }
        calls[d.index].function.arguments += d.function?.arguments ?? '';
      }
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { content, calls, finish, usage, sawHeaderFirst };
}

test('tools reach the prompt as the common library renders them', async () => {
  const body = { messages: START, tools: TOOLS };
  const a = await postJSON(srv, '/apply-template', body);
  assert.equal(a.status, 200, a.text);
  assert.match(a.json.prompt, /<tools>[\s\S]*get_weather[\s\S]*<\/tools>/);
  const t = await postJSON(srv, '/tokenize', { content: a.json.prompt, add_special: true });
  const c = await client.chat.completions.create({ ...body, max_tokens: 1, temperature: 0 });
  assert.equal(c.usage.prompt_tokens, t.json.tokens.length);
  const plain = await client.chat.completions.create({ messages: START, max_tokens: 1, temperature: 0 });
  assert.ok(plain.usage.prompt_tokens < c.usage.prompt_tokens - 50, 'the tools add their block to the prompt');
});

test('agent loop: required tool call, tool result, answer (not streamed)', async () => {
  const req1 = { ...CALL, tool_choice: 'required' };
  const r1 = await client.chat.completions.create(req1);
  const c1 = r1.choices[0];
  assert.equal(c1.finish_reason, 'tool_calls');
  assert.equal(c1.message.tool_calls.length, 1);
  checkCall(c1.message.tool_calls[0]);
  const u1 = await uncached(req1);
  assert.deepEqual(u1.choices[0].message.tool_calls.map((t) => t.function),
    c1.message.tool_calls.map((t) => t.function));

  const history = [...START, c1.message,
    { role: 'tool', tool_call_id: c1.message.tool_calls[0].id, content: '{"temperature_c": 21, "sky": "clear"}' }];
  const req2 = { messages: history, tools: TOOLS, tool_choice: 'auto', temperature: 0, max_tokens: 12 };
  const r2 = await client.chat.completions.create(req2);
  const c2 = r2.choices[0];
  assert.ok(['stop', 'length', 'tool_calls'].includes(c2.finish_reason));
  // The previous prompt is a prefix of this one: all of it comes from the cache.
  assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens,
    `cached ${r2.usage.prompt_tokens_details.cached_tokens} < previous prompt ${r1.usage.prompt_tokens}`);
  const u2 = await uncached(req2);
  assert.equal(u2.usage.prompt_tokens_details.cached_tokens, 0);
  assert.deepEqual(u2.choices[0].message, JSON.parse(JSON.stringify(c2.message)));
});

test('auto: an assistant prefill starts a call that the grammar keeps valid', async () => {
  const req = { ...CALL, tool_choice: 'auto' };
  const r = await client.chat.completions.create(req);
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
  checkCall(c.message.tool_calls[0]);
  const u = await uncached(req);
  assert.deepEqual(u.choices[0].message.tool_calls.map((t) => t.function),
    c.message.tool_calls.map((t) => t.function));
});

test('agent loop streamed: id and name first, then argument fragments; the same call as not streamed', async () => {
  const req1 = { ...CALL, tool_choice: 'required' };
  const whole = await client.chat.completions.create(req1);
  const s1 = await collect(await client.chat.completions.create({ ...req1, stream: true,
    stream_options: { include_usage: true } }));
  assert.equal(s1.finish, 'tool_calls');
  assert.ok(s1.sawHeaderFirst, 'a tool call began without its id and name');
  assert.equal(s1.calls.length, 1);
  checkCall(s1.calls[0]);
  assert.deepEqual(s1.calls[0].function, whole.choices[0].message.tool_calls[0].function);
  assert.ok(s1.usage.prompt_tokens_details.cached_tokens > 0);

  const history = [...START, { role: 'assistant', content: null, tool_calls: s1.calls },
    { role: 'tool', tool_call_id: s1.calls[0].id, content: 'sunny, 21 C' }];
  const req2 = { messages: history, tools: TOOLS, tool_choice: 'auto', temperature: 0, max_tokens: 12 };
  const s2 = await collect(await client.chat.completions.create({ ...req2, stream: true,
    stream_options: { include_usage: true } }));
  assert.ok(s2.usage.prompt_tokens_details.cached_tokens >= whole.usage.prompt_tokens);
  const u2 = await uncached(req2);
  assert.equal(s2.content, u2.choices[0].message.content ?? '');
});

test('chat.completions.parse with a JSON schema: 10 of 10 valid', async () => {
  const schema = {
    type: 'object',
    properties: {
      city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] },
      rain: { type: 'boolean' },
      level: { type: 'integer', minimum: 0, maximum: 9 },
    },
    required: ['city', 'rain', 'level'],
    additionalProperties: false,
  };
  for (let seed = 1; seed <= 10; seed++) {
    const r = await client.chat.completions.parse({
      messages: START, temperature: 1, seed, max_tokens: 64,
      response_format: { type: 'json_schema', json_schema: { name: 'weather', schema, strict: true } },
    });
    const p = r.choices[0].message.parsed;
    assert.ok(p && typeof p === 'object', `seed ${seed}: ${r.choices[0].message.content}`);
    assert.deepEqual(Object.keys(p).sort(), ['city', 'level', 'rain']);
    assert.ok(['Paris', 'Rome', 'Oslo'].includes(p.city));
    assert.equal(typeof p.rain, 'boolean');
    assert.ok(Number.isInteger(p.level) && p.level >= 0 && p.level <= 9);
  }
});

test('response_format json_object gives a JSON object; cached equals uncached', async () => {
  const req = { messages: START, temperature: 0, max_tokens: 48, response_format: { type: 'json_object' } };
  const r = await client.chat.completions.create(req);
  if (r.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(r.choices[0].message.content), 'object');
  else assert.match(r.choices[0].message.content, /^\s*\{/);
  assert.equal((await uncached(req)).choices[0].message.content, r.choices[0].message.content);
});

test('logprobs: the sampled token and its alternatives, in OpenAI\'s shape', async () => {
  const r = await client.chat.completions.create({ messages: START, temperature: 0, max_tokens: 6, logprobs: true,
    top_logprobs: 3 });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const t of lp) {
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
    for (let i = 1; i < 3; i++) assert.ok(t.top_logprobs[i - 1].logprob >= t.top_logprobs[i].logprob);
    // Greedy: the sampled token is the most likely one.
    assert.equal(t.token, t.top_logprobs[0].token);
    assert.equal(t.logprob, t.top_logprobs[0].logprob);
    assert.deepEqual(t.bytes, [...Buffer.from(t.token)]);
  }
  assert.equal(lp.map((t) => t.token).join(''), r.choices[0].message.content);
  // Streamed: the same entries, spread over the chunks.
  const stream = await client.chat.completions.create({ messages: START, temperature: 0, max_tokens: 6,
    logprobs: true, top_logprobs: 3, stream: true });
  const got = [];
  for await (const ch of stream) for (const c of ch.choices) got.push(...(c.logprobs?.content ?? []));
  assert.deepEqual(got.map((t) => [t.token, t.logprob]), lp.map((t) => [t.token, t.logprob]));
});

test('logit_bias changes the output', async () => {
  const base = await client.chat.completions.create({ messages: START, temperature: 0, max_tokens: 4 });
  const d = await postJSON(srv, '/detokenize', { tokens: [300] });
  const piece = d.json.content;
  const biased = await client.chat.completions.create({ messages: START, temperature: 0, max_tokens: 4,
    logit_bias: { 300: 100 } });
  assert.equal(biased.choices[0].message.content, piece.repeat(4));
  assert.notEqual(biased.choices[0].message.content, base.choices[0].message.content);
});

test('n: 2 returns two choices; choice 0 is the n = 1 output of the seed', async () => {
  const body = { messages: START, temperature: 1, seed: 7, max_tokens: 8 };
  const one = await client.chat.completions.create(body);
  const two = await client.chat.completions.create({ ...body, n: 2 });
  assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
  assert.equal(two.choices[0].message.content, one.choices[0].message.content);
  assert.equal(two.usage.prompt_tokens, one.usage.prompt_tokens);
  // Both choices' tokens are counted; the shared prompt once.
  assert.ok(two.usage.completion_tokens >= one.usage.completion_tokens);
  const greedy = await client.chat.completions.create({ messages: START, temperature: 0, max_tokens: 8, n: 3 });
  assert.equal(greedy.choices.length, 3);
  for (const c of greedy.choices) assert.equal(c.message.content, greedy.choices[0].message.content);
  // Streamed: each choice's deltas carry its index.
  const stream = await client.chat.completions.create({ ...body, n: 2, stream: true });
  const text = ['', ''];
  for await (const ch of stream) for (const c of ch.choices) text[c.index] += c.delta?.content ?? '';
  assert.deepEqual(text, two.choices.map((c) => c.message.content));
});
