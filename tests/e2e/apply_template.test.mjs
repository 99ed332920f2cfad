// apply_template.test.mjs — POST /apply-template: the prompt llama.cpp's
// common library renders with the model's own Jinja template (as
// llama-server's endpoint), on the tiny model (ChatML) and on a tiny model
// that carries Qwen2.5's real template with tools.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, postJSON, getJSON, assertError, templateModel } from './lib.mjs';

let tiny, qwen, dir;

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-apply-'));
  const model = templateModel(dir);
  tiny = await startServer([]);
  qwen = await startServer(['-m', model]);
});
after(async () => {
  if (tiny) await stopOk(tiny);
  if (qwen) await stopOk(qwen);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const MSGS = [
  { role: 'system', content: 'You are a test.' },
  { role: 'user', content: 'hello there' },
];

test('ChatML: the rendered prompt, and the chat endpoint prefills exactly its tokens', async () => {
  const r = await postJSON(tiny, '/apply-template', { messages: MSGS });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.prompt,
    '<|im_start|>system\nYou are a test.<|im_end|>\n<|im_start|>user\nhello there<|im_end|>\n<|im_start|>assistant\n');
  const t = await postJSON(tiny, '/tokenize', { content: r.json.prompt, add_special: true });
  assert.equal(t.status, 200, t.text);
  const c = await postJSON(tiny, '/v1/chat/completions',
    { messages: MSGS, max_tokens: 1, temperature: 0, cache_prompt: false });
  assert.equal(c.status, 200, c.text);
  assert.equal(c.json.usage.prompt_tokens, t.json.tokens.length);
});

// /apply-template shows the prompt of the chat route: the same parsing and
// translation (developer is system), the same tokens.
test('the body renders as the chat route renders it (developer is system)', async () => {
  const msgs = [{ role: 'developer', content: 'You are a test.' }, { role: 'user', content: 'hello there' }];
  const r = await postJSON(tiny, '/apply-template', { messages: msgs });
  assert.equal(r.status, 200, r.text);
  assert.ok(r.json.prompt.startsWith('<|im_start|>system\nYou are a test.<|im_end|>'), r.json.prompt);
  const t = await postJSON(tiny, '/tokenize', { content: r.json.prompt, add_special: true });
  const c = await postJSON(tiny, '/v1/chat/completions',
    { messages: msgs, max_tokens: 1, temperature: 0, cache_prompt: false });
  assert.equal(c.status, 200, c.text);
  assert.equal(c.json.usage.prompt_tokens, t.json.tokens.length);
});

test('Qwen2.5 template: tools, a tool call and its result are rendered', async () => {
  const body = {
    messages: [
      { role: 'system', content: 'You are a weather bot.' },
      { role: 'user', content: 'Weather in Paris?' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function',
        function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 21 C' },
    ],
    tools: [{ type: 'function', function: { name: 'get_weather', description: 'Current weather of a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }],
  };
  const r = await postJSON(qwen, '/apply-template', body);
  assert.equal(r.status, 200, r.text);
  const p = r.json.prompt;
  assert.match(p, /<tools>/);
  assert.match(p, /Current weather of a city/);
  assert.match(p, /<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}\n<\/tool_call>/);
  assert.match(p, /<tool_response>\nsunny, 21 C\n<\/tool_response>/);
  assert.ok(p.endsWith('<|im_start|>assistant\n'), p.slice(-60));
  // Without tools the same template renders no tool block.
  const plain = await postJSON(qwen, '/apply-template', { messages: MSGS });
  assert.equal(plain.status, 200, plain.text);
  assert.doesNotMatch(plain.json.prompt, /<tools>/);
});

test('bad requests get a 400 and the server stays up', async () => {
  assertError(await postJSON(tiny, '/apply-template', {}), 400, 'missing_required_parameter', 'messages');
  // Regression (issue 30): the raw body went to the template, skipping the chat
  // request's checks (a completions field was rendered around; a wrong type was
  // the template's error). It is parsed as a chat request now: chat's errors.
  assertError(await postJSON(tiny, '/apply-template', { messages: 'hi' }), 400, 'invalid_type', 'messages');
  assertError(await postJSON(tiny, '/apply-template', { messages: MSGS, prompt: 'x' }), 400, 'unsupported_parameter',
    'prompt');
  assertError(await postJSON(tiny, '/apply-template', { messages: [{ role: 'user' }], tools: 7 }), 400);
  assertError(await postJSON(tiny, '/apply-template', '{"messages": [', { raw: true }), 400);
  const h = await getJSON(tiny, '/health');
  assert.equal(h.status, 200);
  const ok = await postJSON(tiny, '/apply-template', { messages: MSGS });
  assert.equal(ok.status, 200);
});
