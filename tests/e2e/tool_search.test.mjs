// tool_search.test.mjs — what the agents' newest releases send (issue 40),
// over real HTTP:
//  - Anthropic tool search: a tool with defer_loading is not rendered until a
//    tool_reference loads it, and each turn's prompt is a prefix of the next
//    one's (the next turn reads all of it from the cache); a loaded deferred
//    tool can be called;
//  - the mid-conversation tool changes: tool_addition and tool_removal in a
//    system message, rendered in place, the prefix kept;
//  - /messages and /messages/count_tokens without /v1;
//  - unknown nested fields logged once per path, the ignored ones not at all;
//  - a template that renders no tools: a warning at start, the request's log
//    line and cache.tools_ignored;
//  - no max_tokens and no --max-tokens: generation runs to the context's end;
//  - the debug access line names the path of a 404.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, postJSON, getJSON, templateModel, until, importClient } from './lib.mjs';

let srv, dir, model;

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-toolsearch-'));
  model = templateModel(dir);
  srv = await startServer(['-m', model, '--ctx', '4096', '--slots', '1', '--log', 'debug']);
});
after(async () => {
  if (srv) await stopOk(srv);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const schema = (prop) => ({ type: 'object', properties: { [prop]: { type: 'string' } }, required: [prop] });
const READ = { name: 'Read', description: 'Reads a file', input_schema: schema('file_path') };
const SEARCH = { name: 'ToolSearch', description: 'Finds deferred tools', input_schema: schema('query') };
// An enum: random weights would write a free string without end.
const FETCH = { name: 'WebFetch', description: 'Fetches a web page', defer_loading: true,
  input_schema: { type: 'object', properties: { url: { type: 'string', enum: ['https://example.org/'] } }, required: ['url'] } };
const PLACEHOLDER = { name: 'DeferredToolPlaceholder', description: 'x', input_schema: { type: 'object', properties: {} },
  defer_loading: true };
const SYSTEM = 'You are a coding agent. Search for tools you do not have.';
const ASK = { role: 'user', content: 'Fetch the page example.org for me.' };
const SEARCH_CALL = { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'ToolSearch',
  input: { query: 'select:WebFetch' } }] };
const LOADED = { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1',
  content: [{ type: 'tool_reference', tool_name: 'WebFetch' }] }] };

const body = (messages, tools, extra = {}) => ({ model: 'm', system: SYSTEM, max_tokens: 4, temperature: 0, messages,
  tools, ...extra });
const promptOf = (u) => u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;

async function send(b, route = '/v1/messages') {
  const r = await postJSON(srv, route, b);
  assert.equal(r.status, 200, r.text);
  return r.json;
}

async function count(b) {
  const { max_tokens, temperature, ...rest } = b;
  const r = await postJSON(srv, '/v1/messages/count_tokens', rest);
  assert.equal(r.status, 200, r.text);
  return r.json.input_tokens;
}

test('a deferred tool is not rendered until a tool_reference loads it; each turn is a prefix of the next', async () => {
  // Turn 1: WebFetch deferred and not loaded: the prompt is the one without it.
  const t1 = body([ASK], [READ, SEARCH, FETCH, PLACEHOLDER]);
  assert.equal(await count(t1), await count(body([ASK], [READ, SEARCH])));
  assert.ok(await count(body([ASK], [READ, SEARCH, { ...FETCH, defer_loading: false }])) > await count(t1));
  const r1 = await send(t1);
  const p1 = promptOf(r1.usage);
  // Turn 2: ToolSearch's result references WebFetch; the client now sends it (as Claude Code does).
  const t2 = body([ASK, SEARCH_CALL, LOADED], [READ, SEARCH, FETCH, PLACEHOLDER]);
  const r2 = await send(t2);
  assert.ok(r2.usage.cache_read_input_tokens >= p1,
    `turn 2 read ${r2.usage.cache_read_input_tokens} tokens from the cache, turn 1's prompt was ${p1}`);
  // The definition is in the prompt where the reference stands: the loaded tool costs its tokens there.
  const without = await count(body([ASK, SEARCH_CALL, { role: 'user', content: [{ type: 'tool_result',
    tool_use_id: 'toolu_1', content: '' }] }], [READ, SEARCH, FETCH, PLACEHOLDER]));
  assert.ok(await count(t2) > without + 10, 'the tool_reference renders the tool\'s definition');
  // Turn 3: a tool added and one removed mid-conversation, in a system message.
  const t3 = body([ASK, SEARCH_CALL, LOADED, { role: 'assistant', content: 'Loaded.' },
    { role: 'system', content: [
      { type: 'tool_addition', tool: { type: 'tool_definition', definition: { name: 'mcp__docs__search',
        description: 'Searches the docs', input_schema: schema('q') } } },
      { type: 'tool_removal', tool: { type: 'tool_reference', name: 'Read' } }] },
    { role: 'user', content: 'go on' }], [READ, SEARCH, FETCH, PLACEHOLDER]);
  const r3 = await send(t3);
  assert.ok(r3.usage.cache_read_input_tokens >= promptOf(r2.usage),
    `turn 3 read ${r3.usage.cache_read_input_tokens} of turn 2's ${promptOf(r2.usage)} tokens from the cache`);
});

// The official SDK (@anthropic-ai/sdk) sends the same shapes: defer_loading on
// a tool, a tool_reference block in a tool result (before issue 40: a 400); the
// later turn reads the earlier from the cache.
test('the Anthropic SDK: a deferred tool loaded by a tool_reference, turn 2 reads turn 1 from the cache', async () => {
  const Anthropic = (await importClient('@anthropic-ai/sdk')).default;
  const client = new Anthropic({ baseURL: srv.base, apiKey: 'none', maxRetries: 0 });
  const tools = [READ, SEARCH, FETCH];
  const r1 = await client.messages.create({ model: 'm', system: SYSTEM, max_tokens: 4, temperature: 0,
    messages: [ASK], tools });
  const r2 = await client.messages.create({ model: 'm', system: SYSTEM, max_tokens: 4, temperature: 0,
    messages: [ASK, SEARCH_CALL, LOADED], tools });
  assert.equal(r2.type, 'message');
  assert.ok(r2.usage.cache_read_input_tokens >= promptOf(r1.usage), JSON.stringify([r1.usage, r2.usage]));
});

test('a loaded deferred tool can be called; an unloaded one cannot be named', async () => {
  const prefill = { role: 'assistant', content: '<tool_call>\n' };
  const r = await send(body([ASK, SEARCH_CALL, LOADED, prefill], [READ, SEARCH, FETCH],
    { tool_choice: { type: 'tool', name: 'WebFetch', disable_parallel_tool_use: true }, max_tokens: 128 }));
  const use = r.content.find((b) => b.type === 'tool_use');
  assert.ok(use, JSON.stringify(r.content));
  assert.equal(use.name, 'WebFetch');
  assert.equal(use.input.url, 'https://example.org/');
  assert.equal(r.stop_reason, 'tool_use');
  // Not loaded: WebFetch is not among the tools the model may call.
  const bad = await postJSON(srv, '/v1/messages', body([ASK], [READ, SEARCH, FETCH],
    { tool_choice: { type: 'tool', name: 'WebFetch' } }));
  assert.equal(bad.status, 400, bad.text);
  assert.equal(bad.json.type, 'error');
});

test('/messages and /messages/count_tokens answer without /v1', async () => {
  const r = await send(body([ASK], [READ]), '/messages');
  assert.equal(r.type, 'message');
  const c = await postJSON(srv, '/messages/count_tokens', { model: 'm', messages: [ASK] });
  assert.equal(c.status, 200, c.text);
  assert.ok(c.json.input_tokens > 5);
});

test('unknown nested fields are logged once per path; the ignored ones are not', async () => {
  const from = srv.stderr.length;
  for (let i = 0; i < 2; i++) {
    await send(body([ASK], [{ ...READ, frobnicate: 1, eager_input_streaming: true }, { ...SEARCH, frobnicate: 2 }],
      { thinking: { type: 'disabled', display: 'omitted', zzz: true } }));
  }
  const log = srv.stderr.slice(from);
  const warned = (f) => log.split('\n').filter((l) => / W /.test(l) && l.includes(`ignored an unknown field '${f}'`));
  assert.equal(warned('tools[].frobnicate').length, 1, log);
  assert.equal(warned('thinking.zzz').length, 1, log);
  assert.equal(warned('thinking.display').length, 0, log);
  assert.equal(warned('tools[].eager_input_streaming').length, 0, log);
  // The request line's cached share: a tenth of a percent, floored.
  assert.match(log, / cached \d+ \(\d+\.\d%\), ttft /);
});

test('the access line names the path of a 404', async () => {
  const r = await getJSON(srv, '/v2/nothing/here');
  assert.equal(r.status, 404);
  await until(() => / \/v2\/nothing\/here -> 404 in /.test(srv.stderr), 'the access line');
});

test('a template without tools: a warning at start, the request says tools_ignored', async () => {
  // The tiny model's own template is ChatML: it renders no tools.
  const plain = await startServer(['--ctx', '512']);
  try {
    assert.match(plain.stderr, /chat template renders no tools/);
    const tools = [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }];
    const r = await postJSON(plain, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], tools,
      max_tokens: 2 });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.cache.tools_ignored, true);
    await until(() => /ignored tools the chat template cannot render: 'tools'/.test(plain.stderr), 'the log line');
    const n = await postJSON(plain, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    assert.equal(n.json.cache.tools_ignored, undefined);
  } finally {
    await stopOk(plain);
  }
  // Qwen2.5's template renders them: nothing said.
  const r = await postJSON(srv, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2,
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.cache.tools_ignored, undefined);
  assert.doesNotMatch(srv.stderr, /chat template renders no tools/);
});

test('no max_tokens: until the context\'s end (as llama-server), unless --max-tokens says otherwise', async () => {
  const ask = { messages: [{ role: 'user', content: 'count' }], ignore_eos: true, temperature: 0 };
  const open = await startServer(['--ctx', '256', '--slots', '1']);
  try {
    const props = await getJSON(open, '/props');
    assert.equal(props.json.default_generation_settings.params.n_predict, -1);
    const r = await postJSON(open, '/v1/chat/completions', ask);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].finish_reason, 'length');
    assert.equal(r.json.usage.prompt_tokens + r.json.usage.completion_tokens, 256);
  } finally {
    await stopOk(open);
  }
  const capped = await startServer(['--ctx', '256', '--slots', '1', '--max-tokens', '7']);
  try {
    const r = await postJSON(capped, '/v1/chat/completions', ask);
    assert.equal(r.json.usage.completion_tokens, 7);
  } finally {
    await stopOk(capped);
  }
});
