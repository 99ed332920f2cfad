// agent_fields.test.mjs — issue 25's request-field policy (docs/SERVER.md,
// "Request fields") over real HTTP with the official SDKs, on the requests the
// coding agents really send (captured from Claude Code 2.1.197 and Codex
// 0.169.0, trimmed): what steers a hosted service is ignored, what has a local
// meaning is mapped, hosted tools are dropped with a log line, an unknown
// field is ignored with a log line, and every refusal is in the log at the
// default level once per cause. The agents themselves run in agents.test.mjs.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, postJSON, importClient, templateModel, until } from './lib.mjs';

let srv, dir, Anthropic, OpenAI, anthropic, openai;

before(async () => {
  Anthropic = (await importClient('@anthropic-ai/sdk')).default;
  OpenAI = (await importClient('openai')).default;
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-agentf-'));
  const model = templateModel(dir, 'Qwen3-Coder.jinja', 'qwen3coder.gguf');
  srv = await startServer(['-m', model, '--ctx', '4096', '--slots', '2']);
  anthropic = new Anthropic({ baseURL: srv.base, apiKey: 'none', maxRetries: 0, timeout: 120000 });
  openai = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });
});
after(async () => {
  if (srv) await stopOk(srv);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

// Typed SSE events ("event: T\ndata: {...}"), the Messages and Responses way.
const typedEvents = (text) => text.split('\n\n').filter((b) => b.trim()).map((b) => {
  const data = b.split('\n').find((l) => l.startsWith('data: '));
  assert.ok(data, `an event without data: ${b.slice(0, 80)}`);
  return JSON.parse(data.slice(6));
});

// The lines the server logged since `from` (an offset into its stderr).
const logSince = (from) => srv.stderr.slice(from);
// The server logs a request's notes and refusals before it answers, but its
// stderr reaches this process on its own schedule: wait for the finish line
// of a request answered later (it names the response's id).
const logReaches = (id) => until(() => srv.stderr.includes(id), `the log line of ${id}`);
const refusals = (text) => text.split('\n').filter((l) => / -> 4\d\d /.test(l));

// Claude Code's first request for a model name it does not know (claude_*
// names leave out output_config and the system message in messages).
const claudeRequest = (prompt) => ({
  model: 'qwen3-coder',
  max_tokens: 8,
  temperature: 0,
  stream: true,
  system: [
    { type: 'text', text: 'You are a Claude agent, built on Anthropic\'s Claude Agent SDK.', cache_control: { type: 'ephemeral' } },
    { type: 'text', text: 'You are an interactive agent that helps users with software engineering tasks.', cache_control: { type: 'ephemeral' } },
  ],
  messages: [
    { role: 'user', content: [
      { type: 'text', text: '<system-reminder>\nToday\'s date is 2026-11-26.\n</system-reminder>\n' },
      { type: 'text', text: prompt, cache_control: { type: 'ephemeral' } }] },
    { role: 'system', content: 'Available agent types for the Agent tool:\n- Explore: read-only search agent.' },
  ],
  tools: [
    { name: 'Bash', description: 'Executes a bash command', input_schema: { type: 'object', properties: { command: { type: 'string' } }, required: ['command'], additionalProperties: false } },
    { name: 'Read', description: 'Reads a file', input_schema: { type: 'object', properties: { file_path: { type: 'string' } }, required: ['file_path'] } },
    { type: 'web_search_20250305', name: 'web_search', max_uses: 5 },
  ],
  metadata: { user_id: '{"device_id":"d","account_uuid":"","session_id":"s"}' },
  thinking: { type: 'adaptive' },
  context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] },
  output_config: { effort: 'high' },
});

test('Claude Code: HEAD / answers like a health check', async () => {
  const r = await fetch(srv.base + '/', { method: 'HEAD' });
  assert.equal(r.status, 200);
});

test('Claude Code\'s first request is served; usage agrees from message_start to message_delta; the next turn reads the prompt from the cache', async () => {
  const from = srv.stderr.length;
  // ?beta=true, as Claude Code posts it; the streamed events as it reads them.
  const events = typedEvents(await (await fetch(srv.base + '/v1/messages?beta=true', {
    method: 'POST', headers: { 'content-type': 'application/json', 'anthropic-version': '2023-06-01',
      'anthropic-beta': 'claude-code-20250219,context-management-2025-06-27' },
    body: JSON.stringify(claudeRequest('list the files here')) })).text());
  const start = events.find((e) => e.type === 'message_start');
  const delta = events.find((e) => e.type === 'message_delta');
  assert.ok(start && delta, JSON.stringify(events).slice(0, 500));
  for (const k of ['input_tokens', 'cache_read_input_tokens', 'cache_creation_input_tokens'])
    assert.equal(start.message.usage[k], delta.usage[k], `${k} differs between message_start and message_delta`);
  // kvstash's objects ride on message_delta, as on a whole reply.
  assert.equal(delta.cache.cached_tokens, delta.usage.cache_read_input_tokens);
  assert.equal(typeof delta.timings.prompt_n, 'number');
  const total = delta.usage.input_tokens + delta.usage.cache_read_input_tokens + delta.usage.cache_creation_input_tokens;
  assert.ok(delta.usage.cache_creation_input_tokens > 0, 'the breakpoints wrote the prefix');

  // Turn 2 through the SDK: the same prefix, the reply and a new message after it.
  const turn2 = claudeRequest('list the files here');
  turn2.stream = false;
  turn2.messages.push({ role: 'assistant', content: [{ type: 'text', text: 'Here they are.' }] },
    { role: 'user', content: [{ type: 'text', text: 'and the hidden ones?', cache_control: { type: 'ephemeral' } }] });
  const m = await anthropic.messages.create(turn2);
  assert.equal(m.type, 'message');
  const prompt2 = m.usage.input_tokens + m.usage.cache_read_input_tokens + m.usage.cache_creation_input_tokens;
  assert.ok(m.usage.cache_read_input_tokens >= 0.9 * prompt2,
    `turn 2 read ${m.usage.cache_read_input_tokens} of ${prompt2} prompt tokens from the cache`);
  assert.ok(prompt2 > total);

  await logReaches(m.id);
  const log = logSince(from);
  assert.deepEqual(refusals(log), [], 'no request was refused');
  // The server tool is dropped and said so, once; the hosted-service fields are silent.
  const dropped = log.split('\n').filter((l) => /ignored a server tool \(web_search_20250305\) 'tools\.2'/.test(l));
  assert.equal(dropped.length, 1, log);
  assert.doesNotMatch(log, /context_management|output_config|metadata/);
});

test('a system message a template cannot take inside messages: a 400 in the words Claude Code falls back on', async () => {
  const model = templateModel(dir, 'mistralai-Mistral-Nemo-Instruct-2407.jinja', 'nemo.gguf');
  const nemo = await startServer(['-m', model, '--ctx', '2048', '--slots', '1']);
  try {
    const body = claudeRequest('hi');
    body.stream = false;
    const r = await postJSON(nemo, '/v1/messages', body);
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.type, 'error');
    assert.equal(r.json.error.type, 'invalid_request_error');
    // Claude Code's test (cli.js): includes("not supported") && /role .{0,2}system/i
    assert.ok(r.json.error.message.includes('not supported') && /role .{0,2}system/i.test(r.json.error.message),
      r.json.error.message);
    // Its fallback: the same text as a <system-reminder> in the user turn.
    const sys = body.messages.pop();
    body.messages[0].content.push({ type: 'text', text: `<system-reminder>\n${sys.content}\n</system-reminder>` });
    const ok = await postJSON(nemo, '/v1/messages', body);
    assert.equal(ok.status, 200, ok.text);
    await until(() => nemo.stderr.includes(ok.json.id), 'the log line');
    assert.match(nemo.stderr, /POST \/v1\/messages -> 400 invalid_value \(messages\.1\.role\): .*role 'system' is not supported/);
  } finally {
    await stopOk(nemo);
  }
});

test('Anthropic output_config: effort is the template\'s reasoning effort, format a JSON schema the output follows', async () => {
  const m = await anthropic.messages.create({
    model: 'x', max_tokens: 60, temperature: 0, messages: [{ role: 'user', content: 'a city?' }],
    output_config: { effort: 'max', format: { type: 'json_schema', schema: { type: 'object',
      properties: { city: { type: 'string', enum: ['Paris', 'Rome'] } }, required: ['city'], additionalProperties: false } } },
  });
  const text = m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  assert.ok(['Paris', 'Rome'].includes(JSON.parse(text).city), text);
  const bad = await postJSON(srv, '/v1/messages', { model: 'x', max_tokens: 4, messages: [{ role: 'user', content: 'x' }],
    output_config: { effort: 'extreme' } });
  assert.equal(bad.status, 400);
  assert.match(bad.json.error.message, /output_config\.effort/);
});

// Codex 0.169.0's request (its first turn, trimmed): store false, include,
// prompt_cache_key, client_metadata, text.verbosity, a custom (freeform)
// tool, Codex's client-side tool_search and the hosted web_search.
const codexRequest = (input) => ({
  model: 'gpt-5.5',
  instructions: 'You are Codex, a coding agent.',
  input,
  tools: [
    { type: 'function', name: 'exec_command', description: 'Runs a command', strict: false,
      parameters: { type: 'object', properties: { cmd: { type: 'string' } }, required: ['cmd'], additionalProperties: false } },
    { type: 'custom', name: 'apply_patch', description: 'Edits files. This is a FREEFORM tool.',
      format: { type: 'grammar', syntax: 'lark', definition: 'start: begin_patch hunk+ end_patch' } },
    { type: 'namespace', name: 'mcp_docs', tools: [{ type: 'function', name: 'search', description: 'Searches the docs',
      parameters: { type: 'object', properties: { q: { type: 'string' } } } }] },
    { type: 'tool_search', execution: 'client', description: 'Tool discovery',
      parameters: { type: 'object', properties: { query: { type: 'string' } }, required: ['query'] } },
    { type: 'web_search', external_web_access: false, search_content_types: ['text', 'image'] },
  ],
  tool_choice: 'auto',
  parallel_tool_calls: true,
  reasoning: { effort: 'medium' },
  store: false,
  stream: true,
  include: ['reasoning.encrypted_content'],
  prompt_cache_key: '01a216b4-8209-7f41-a53d-9a48a675520e',
  text: { verbosity: 'low' },
  client_metadata: { thread_id: '01a216b4', 'x-codex-turn-metadata': '{"session_id":"s"}' },
  max_output_tokens: 8,
  temperature: 0,
});

test('Codex\'s Responses request is served; the stream\'s response.completed carries usage, cache and timings', async () => {
  const from = srv.stderr.length;
  const input = [
    { type: 'message', role: 'developer', content: [{ type: 'input_text', text: '<permissions instructions>sandbox: read-only</permissions instructions>' }] },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: '<environment_context>cwd: /tmp</environment_context>' }] },
    { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'list the files here' }] },
  ];
  const events = [];
  const st = await openai.responses.create(codexRequest(input));
  for await (const ev of st) events.push(ev);
  // max_output_tokens 8: incomplete, or completed when the reply ends before
  const done = events.find((e) => e.type === 'response.completed' || e.type === 'response.incomplete');
  assert.ok(done, events.map((e) => e.type).join(' '));
  assert.equal(done.response.usage.input_tokens_details.cached_tokens, done.response.cache.cached_tokens);
  assert.equal(typeof done.response.timings.prompt_n, 'number');
  // Turn 2 as Codex sends it (store false: the whole conversation again).
  const out = done.response.output.filter((i) => i.type === 'message');
  const turn2 = [...input, ...out.map((m) => ({ ...m, content: m.content.map((c) => ({ type: 'output_text', text: c.text })) })),
    { type: 'function_call', call_id: 'call_1', name: 'exec_command', arguments: '{"cmd":"ls"}' },
    { type: 'function_call_output', call_id: 'call_1', output: 'a.txt\nb.txt' },
    { type: 'custom_tool_call', call_id: 'call_2', name: 'apply_patch', input: '*** Begin Patch\n*** End Patch\n' },
    { type: 'custom_tool_call_output', call_id: 'call_2', output: 'Done!' },
    { type: 'function_call', call_id: 'call_3', namespace: 'mcp_docs', name: 'search', arguments: '{"q":"ls"}' },
    { type: 'function_call_output', call_id: 'call_3', output: 'nothing' }];
  const r2 = await openai.responses.create({ ...codexRequest(turn2), stream: false });
  assert.ok(['completed', 'incomplete'].includes(r2.status), r2.status);
  assert.ok(r2.usage.input_tokens_details.cached_tokens >= 0.9 * done.response.usage.input_tokens,
    `turn 2 read ${r2.usage.input_tokens_details.cached_tokens} tokens of the ${done.response.usage.input_tokens} of turn 1`);

  await logReaches(r2.id);
  const log = logSince(from);
  assert.deepEqual(refusals(log), [], 'no request was refused');
  for (const what of ['a hosted tool \\(tool_search\\) \'tools\\[3\\]\'', 'a hosted tool \\(web_search\\) \'tools\\[4\\]\''])
    assert.equal(log.split('\n').filter((l) => new RegExp('ignored ' + what).test(l)).length, 1, log);
  assert.doesNotMatch(log, /client_metadata|prompt_cache_key|verbosity|include/);
});

test('an unknown field is ignored and logged once; a refusal is logged at the default level once per cause', async () => {
  const from = srv.stderr.length;
  for (let i = 0; i < 3; i++) {
    const r = await postJSON(srv, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2,
      frobnicate: i });
    assert.equal(r.status, 200, r.text);
  }
  for (let i = 0; i < 3; i++) {
    const r = await postJSON(srv, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], temperature: 'hot' });
    assert.equal(r.status, 400);
  }
  const last = await postJSON(srv, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
  await logReaches(last.json.id);
  const log = logSince(from);
  assert.equal(log.split('\n').filter((l) => /ignored an unknown field 'frobnicate'/.test(l)).length, 1, log);
  const refused = refusals(log);
  assert.equal(refused.length, 1, log);
  assert.match(refused[0], / W http +POST \/v1\/chat\/completions -> 400 invalid_type \(temperature\): Invalid type for 'temperature'/);
});

test('--ctx beyond the model\'s trained context: the slot gets the trained context, and the log says so', async () => {
  const s = await startServer(['--ctx', '20000', '--slots', '1']); // the tiny model: 8192
  try {
    assert.match(s.stderr, / W serve +--ctx 20000 is more than this model takes: each slot gets 8192 tokens/);
    assert.match(s.stderr, /slots, ctx 8192,/);
  } finally {
    await stopOk(s);
  }
});
