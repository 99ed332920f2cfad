// templates.test.mjs — the chat endpoint on tiny GGUFs that carry the real
// templates of the pinned llama.cpp source (Qwen2.5, Llama 3.1, Mistral Nemo,
// gpt-oss, Qwen3): the prompt the model gets is exactly the one llama.cpp's
// common library renders (/apply-template) with tools and a tool-call history;
// with --imc an agent conversation extends its slot by message hash; a
// template that re-renders the history (Qwen3 drops earlier reasoning) goes
// through the token-prefix fallback and keeps most of the prompt; cached
// output equals uncached output throughout.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, postJSON, BIN } from './lib.mjs';

const TEMPLATES = process.env.KS_TEMPLATES_DIR;
let dir;
const servers = [];

function model(file, name) {
  const out = path.join(dir, `${name}.gguf`);
  execFileSync(BIN, ['mkmodel', '--preset', 'tiny', '--seed', '1', '--chat-template', path.join(TEMPLATES, file), out],
    { stdio: 'ignore' });
  return out;
}
async function serve(m, extra = []) {
  const s = await startServer(['-m', m, '--ctx', '2048', ...extra]);
  servers.push(s);
  return s;
}

before(() => {
  assert.ok(TEMPLATES, 'KS_TEMPLATES_DIR is not set');
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-tmpl-'));
});
after(async () => {
  for (const s of servers) await stopOk(s);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
// A closed set of arguments, so that random weights finish the call.
const TOOLS_ENUM = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] } }, required: ['city'] } } }];
// Mistral's template wants tool-call ids of 9 alphanumeric characters.
const HISTORY = [
  { role: 'system', content: 'You are a weather bot.' },
  { role: 'user', content: 'Weather in Paris?' },
  { role: 'assistant', content: null, tool_calls: [{ id: 'abc123XYZ', type: 'function',
    function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
  { role: 'tool', tool_call_id: 'abc123XYZ', content: 'sunny, 21 C' },
];

const CASES = [
  ['Qwen-Qwen2.5-7B-Instruct.jinja', 'qwen25'],
  ['meta-llama-Llama-3.1-8B-Instruct.jinja', 'llama31'],
  ['mistralai-Mistral-Nemo-Instruct-2407.jinja', 'mistral'],
  ['openai-gpt-oss-120b.jinja', 'gptoss'],
  ['Qwen-Qwen3-0.6B.jinja', 'qwen3'],
];

for (const [file, name] of CASES) {
  test(`${name}: the chat prompt is the common library's, with tools and a tool-call history`, async () => {
    const srv = await serve(model(file, name));
    const body = { messages: HISTORY, tools: TOOLS };
    const a = await postJSON(srv, '/apply-template', body);
    assert.equal(a.status, 200, a.text);
    assert.match(a.json.prompt, /get_weather/);
    assert.match(a.json.prompt, /sunny, 21 C/);
    const t = await postJSON(srv, '/tokenize', { content: a.json.prompt, add_special: true });
    const c = await postJSON(srv, '/v1/chat/completions', { ...body, max_tokens: 4, temperature: 0 });
    assert.equal(c.status, 200, c.text);
    assert.equal(c.json.usage.prompt_tokens, t.json.tokens.length);
    const u = await postJSON(srv, '/v1/chat/completions', { ...body, max_tokens: 4, temperature: 0, cache_prompt: false });
    assert.deepEqual(u.json.choices[0].message, c.json.choices[0].message);
  });
}

test('IMC: an agent conversation with tool calls extends its slot by message hash', async () => {
  const srv = await serve(path.join(dir, 'qwen25.gguf'), ['--imc', '--slots', '2']);
  const first = HISTORY.slice(0, 2);
  const body1 = { messages: first, tools: TOOLS_ENUM, tool_choice: 'required', parallel_tool_calls: false,
    temperature: 0, max_tokens: 100 };
  const r1 = await postJSON(srv, '/v1/chat/completions', body1);
  assert.equal(r1.status, 200, r1.text);
  const m1 = r1.json.choices[0].message;
  assert.equal(r1.json.choices[0].finish_reason, 'tool_calls');
  const body2 = { messages: [...first, m1, { role: 'tool', tool_call_id: m1.tool_calls[0].id, content: 'sunny' }],
    tools: TOOLS_ENUM, temperature: 0, max_tokens: 6 };
  const r2 = await postJSON(srv, '/v1/chat/completions', body2);
  assert.equal(r2.status, 200, r2.text);
  assert.equal(r2.json.cache.mode, 'imc-hash');
  assert.ok(r2.json.usage.prompt_tokens_details.cached_tokens >= r1.json.usage.prompt_tokens);
  // Another tool list is another prefix: not the same branch.
  const other = [{ type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } }];
  const r3 = await postJSON(srv, '/v1/chat/completions', { ...body2, tools: other });
  assert.notEqual(r3.json.cache.mode, 'imc-hash');
  const u2 = await postJSON(srv, '/v1/chat/completions', { ...body2, cache_prompt: false });
  assert.deepEqual(u2.json.choices[0].message, r2.json.choices[0].message);
});

test('Qwen3 drops earlier reasoning from the history: the token-prefix fallback keeps most of the prompt', async () => {
  const srv = await serve(path.join(dir, 'qwen3.gguf'), ['--imc', '--slots', '2']);
  const sys = { role: 'system', content: 'You are a careful assistant. '.repeat(30) };
  const turn1 = [sys, { role: 'user', content: 'What is two plus two?' }];
  const r1 = await postJSON(srv, '/v1/chat/completions', { messages: turn1, temperature: 0, max_tokens: 4 });
  assert.equal(r1.status, 200, r1.text);
  // The client sends the answer back with its reasoning; the template renders
  // the finished turn without it, so the prompt is not a message-hash extension.
  const turn2 = [...turn1, { role: 'assistant', content: 'Four.', reasoning_content: 'Two and two make four.' },
    { role: 'user', content: 'And three plus three?' }];
  const a = await postJSON(srv, '/apply-template', { messages: turn2 });
  assert.doesNotMatch(a.json.prompt, /Two and two make four/);
  const r2 = await postJSON(srv, '/v1/chat/completions', { messages: turn2, temperature: 0, max_tokens: 4 });
  assert.equal(r2.status, 200, r2.text);
  assert.ok(['imc-hash', 'imc-token-prefix'].includes(r2.json.cache.mode), r2.json.cache.mode);
  assert.ok(r2.json.usage.prompt_tokens_details.cached_tokens >= r1.json.usage.prompt_tokens - 8,
    `cached ${r2.json.usage.prompt_tokens_details.cached_tokens} of the previous ${r1.json.usage.prompt_tokens}`);
  const u2 = await postJSON(srv, '/v1/chat/completions', { messages: turn2, temperature: 0, max_tokens: 4,
    cache_prompt: false });
  assert.deepEqual(u2.json.choices[0].message, r2.json.choices[0].message);
});
