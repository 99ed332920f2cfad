// admission.test.mjs — regression test for issue 28, "one request can cost
// seconds and gigabytes before it is refused": a tools array of 3,000 or
// 6,000 functions (1.6 and 3.3 MB) under a template that renders tools
// (Qwen3's) is refused with the 400 context_length_exceeded from its size
// alone — no template render (kvstash_template_renders_total unchanged,
// kvstash_refused_before_render_total counts it), in every wire format and
// on count_tokens. It is refused from its body's bytes while they come in
// (src/server/prescan.h): the server's peak resident memory (VmHWM) grows by
// at most an eighth of the body — less than a request with one tool that
// fits grows it (+1.6 MB on a fresh server) — where the render cost 483 MB
// and 1.98 GB at first, and the parsed body 12 and 24 MB after the size
// bound came. A request with tools that fits is still served, and one whose
// known strings fit but whose render does not is still refused after the
// render. No timing.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { startServer, stopOk, postJSON, metrics, metric, assertError } from './lib.mjs';

const TEMPLATE = path.join(process.env.KS_TEMPLATES_DIR ?? '', 'Qwen-Qwen3-0.6B.jinja');
let srv;
before(async () => { srv = await startServer(['--chat-template', TEMPLATE]); });
after(async () => { if (srv) await stopOk(srv); });

// Under a sanitizer the memory is the sanitizer's: the budget is not checked there.
const SANITIZED = process.env.KS_SANITIZED === '1';
const hwm = () => Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${srv.proc.pid}/status`, 'utf8'))[1]) * 1024;
const tools = (n) => Array.from({ length: n }, (_, i) => ({
  type: 'function',
  function: {
    name: `tool_${i}`,
    description: `Does thing number ${i} with care and precision for the user's request.` + ' x'.repeat(150),
    parameters: { type: 'object', properties: { [`arg_${i}`]: { type: 'string', description: `the argument ${i}` } } },
  },
}));
const ask = (extra) => postJSON(srv, '/v1/chat/completions',
  { messages: [{ role: 'user', content: 'Hello' }], max_tokens: 4, temperature: 0, ...extra });

test('a request with tools that fits is rendered and served', async () => {
  const m0 = await metrics(srv);
  const small = [{ type: 'function', function: { name: 'get_weather', description: 'The weather in a city.',
    parameters: { type: 'object', properties: { city: { type: 'string', description: 'the city' } } } } }];
  const r = await ask({ tools: small });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  const m1 = await metrics(srv);
  assert.ok(metric(m1, 'kvstash_template_renders_total') > metric(m0, 'kvstash_template_renders_total'));
  assert.equal(metric(m1, 'kvstash_refused_before_render_total'), metric(m0, 'kvstash_refused_before_render_total'));
});

test('tools whose known text fits but whose render does not: refused after the render, as before', async () => {
  const m0 = await metrics(srv);
  const r = await ask({ tools: tools(3) });
  assertError(r, 400, 'context_length_exceeded', 'messages');
  assert.match(r.json.error.message, /resulted in \d+ tokens/);
  const m1 = await metrics(srv);
  assert.ok(metric(m1, 'kvstash_template_renders_total') > metric(m0, 'kvstash_template_renders_total'));
});

for (const n of [3000, 6000]) {
  test(`${n} tools: refused before any render or parse, peak memory within an eighth of the body`, async () => {
    const body = { messages: [{ role: 'user', content: 'Hello' }], max_tokens: 4, tools: tools(n) };
    const bytes = Buffer.byteLength(JSON.stringify(body));
    const m0 = await metrics(srv);
    const h0 = hwm();
    const r = await postJSON(srv, '/v1/chat/completions', body);
    const h1 = hwm();
    assertError(r, 400, 'context_length_exceeded', 'messages');
    assert.match(r.json.error.message, /your messages render to more than \d+ bytes, which is at least 512 tokens/);
    const m1 = await metrics(srv);
    assert.equal(metric(m1, 'kvstash_template_renders_total'), metric(m0, 'kvstash_template_renders_total'),
      'no render');
    assert.equal(metric(m1, 'kvstash_refused_before_render_total') - metric(m0, 'kvstash_refused_before_render_total'), 1);
    if (!SANITIZED) assert.ok(h1 - h0 <= bytes / 8, `VmHWM grew ${h1 - h0} bytes for a ${bytes}-byte body (budget ${bytes / 8})`);
  });
}

// The same 6,000 tools in each format's own shape, and 100,000 short user
// messages (presize counts them too): each refused from its first bytes.
const anthropicTools = (n) => tools(n).map((t) => ({ name: t.function.name, description: t.function.description,
  input_schema: t.function.parameters }));
// (The messages first: VmHWM is a high-water mark, and count_tokens rendered
// 6,000 tools — 2 GB — before; nothing may hide another's growth.)
const others = [
  ['/v1/chat/completions', { max_tokens: 4, messages: Array.from({ length: 100000 }, () => ({ role: 'user', content: 'hi there' })) }],
  ['/v1/responses', { input: 'Hello', max_output_tokens: 4,
    tools: tools(6000).map((t) => ({ type: 'function', ...t.function })) }],
  ['/v1/messages', { model: 'm', max_tokens: 4, messages: [{ role: 'user', content: 'Hello' }], tools: anthropicTools(6000) }],
  ['/v1/messages/count_tokens', { model: 'm', messages: [{ role: 'user', content: 'Hello' }], tools: anthropicTools(6000) }],
];
for (const [route, body] of others) {
  test(`${route}, ${Buffer.byteLength(JSON.stringify(body))} bytes: refused from its first bytes, no render`, async () => {
    const bytes = Buffer.byteLength(JSON.stringify(body));
    const m0 = await metrics(srv);
    const h0 = hwm();
    const r = await postJSON(srv, route, body);
    const h1 = hwm();
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.match(JSON.stringify(r.json), /render to more than \d+ bytes, which is at least 512 tokens/);
    const m1 = await metrics(srv);
    assert.equal(metric(m1, 'kvstash_template_renders_total'), metric(m0, 'kvstash_template_renders_total'));
    assert.equal(metric(m1, 'kvstash_refused_before_render_total') - metric(m0, 'kvstash_refused_before_render_total'), 1);
    if (!SANITIZED) assert.ok(h1 - h0 <= bytes / 8, `VmHWM grew ${h1 - h0} bytes for a ${bytes}-byte body`);
  });
}

// A body's keys and values are counted before the parse, on every route:
// each becomes a parser allocation (up to ~230 bytes for an empty object),
// so 15 MB of empty objects parsed to 1.1 GB (VmHWM +1,120 MB) before the
// chat parser refused them. Past 262,144 + 4 per token of context: 413
// request_too_large while the body comes in.
const empties = (n) => '{"messages":[' + '{},'.repeat(n - 1) + '{}]}';
const raw = async (route, body) => {
  const res = await fetch(srv.base + route, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  const text = await res.text();
  return { status: res.status, json: JSON.parse(text) };
};
for (const [route, body] of [
  ['/v1/chat/completions', empties(5_000_000)],
  ['/v1/chat/completions', '[' + '{},'.repeat(3_000_000) + '{}]'],
  ['/detokenize', '{"tokens":[' + '1,'.repeat(3_000_000) + '1]}'],
  ['/v1/completions', '{"max_tokens":1,"prompt":[' + '1,'.repeat(3_000_000) + '1]}'],
]) {
  test(`${route}, ${(body.length / 1e6).toFixed(1)} MB of ${body.slice(0, 14)}...: 413 before the parse, memory within an eighth`, async () => {
    const h0 = hwm();
    const r = await raw(route, body);
    const h1 = hwm();
    assertError(r, 413, 'request_too_large');
    assert.match(r.json.error.message, /more than \d+ JSON keys and values/);
    if (!SANITIZED) assert.ok(h1 - h0 <= body.length / 8, `VmHWM grew ${h1 - h0} bytes for a ${body.length}-byte body`);
  });
}

test('a body within the count is parsed as before: 200,000 token ids detokenized', async () => {
  const r = await raw('/detokenize', JSON.stringify({ tokens: Array.from({ length: 200000 }, () => 1) }));
  assert.equal(r.status, 200, JSON.stringify(r.json).slice(0, 200));
});

test('tools are sized whole, whatever tool_choice names: OpenAI renders every tool too', async () => {
  const r = await ask({ tools: tools(3000), tool_choice: { type: 'function', function: { name: 'tool_1' } } });
  assertError(r, 400, 'context_length_exceeded', 'messages');
  // One tool named among a few that fit: served, as before.
  const ok = await ask({ tools: tools(2).map((t) => ({ ...t, function: { ...t.function, description: 'short' } })),
    tool_choice: { type: 'function', function: { name: 'tool_1' } } });
  assert.equal(ok.status, 200, JSON.stringify(ok.json));
});

test('a user message longer than the context is refused before the render too', async () => {
  const m0 = await metrics(srv);
  const r = await ask({ messages: [{ role: 'user', content: 'word '.repeat(20000) }] });
  assertError(r, 400, 'context_length_exceeded', 'messages');
  const m1 = await metrics(srv);
  assert.equal(metric(m1, 'kvstash_template_renders_total'), metric(m0, 'kvstash_template_renders_total'));
});

// count_tokens and /apply-template render too: sized and bounded as a
// generation is (before, count_tokens rendered and tokenized any body: the
// 6,000 tools above took 15 s and 2 GB, and /apply-template rendered
// outside the render limit).
test('count_tokens: a prompt longer than the context is refused before the render; one that fits is counted', async () => {
  const m0 = await metrics(srv);
  const long = await postJSON(srv, '/v1/messages/count_tokens',
    { model: 'm', messages: [{ role: 'user', content: 'word '.repeat(20000) }] });
  assert.equal(long.status, 400, JSON.stringify(long.json));
  assert.equal(long.json.type, 'error');
  assert.match(long.json.error.message, /maximum context length is 512 tokens/);
  const m1 = await metrics(srv);
  assert.equal(metric(m1, 'kvstash_template_renders_total'), metric(m0, 'kvstash_template_renders_total'));
  assert.equal(metric(m1, 'kvstash_refused_before_render_total') - metric(m0, 'kvstash_refused_before_render_total'), 1);
  const ok = await postJSON(srv, '/v1/messages/count_tokens', { model: 'm', messages: [{ role: 'user', content: 'Hello' }] });
  assert.equal(ok.status, 200, JSON.stringify(ok.json));
  assert.ok(ok.json.input_tokens > 0);
  const m2 = await metrics(srv);
  assert.equal(metric(m2, 'kvstash_template_renders_total') - metric(m1, 'kvstash_template_renders_total'), 1,
    'counted under the render limit');
});

test('/apply-template: tools longer than the context refused before the render; a small request rendered, counted', async () => {
  const m0 = await metrics(srv);
  const big = await postJSON(srv, '/apply-template', { messages: [{ role: 'user', content: 'Hello' }], tools: tools(3000) });
  assertError(big, 400, 'context_length_exceeded', 'messages');
  const m1 = await metrics(srv);
  assert.equal(metric(m1, 'kvstash_template_renders_total'), metric(m0, 'kvstash_template_renders_total'));
  const ok = await postJSON(srv, '/apply-template', { messages: [{ role: 'user', content: 'Hello' }] });
  assert.equal(ok.status, 200, JSON.stringify(ok.json));
  assert.match(ok.json.prompt, /Hello/);
  const m2 = await metrics(srv);
  assert.equal(metric(m2, 'kvstash_template_renders_total') - metric(m1, 'kvstash_template_renders_total'), 1);
});

// JSON schemas are sized before any grammar is built from them (src/server/
// schemasize.h): 1,000 optional properties took 7.4 s to convert, an enum of
// 10,000 values 7.5 s to sample one token, 100,000 values more than a
// minute, a pattern (a{0,1000}){0,1000} 3.1 s. Each is now a 400
// schema_too_large naming the limit, before any render or grammar build, in
// every place a schema comes from; a schema within the limits is served.
const optional = (n) => ({ type: 'object', properties: Object.fromEntries(Array.from({ length: n }, (_, i) => [`p${i}`, { type: 'string' }])) });
const bigEnum = { type: 'string', enum: Array.from({ length: 100000 }, (_, i) => `value${i}`) };
const nested = { type: 'string', pattern: '^((a{0,1000}){0,1000})$' };
const schemaCases = [
  ['chat response_format', '/v1/chat/completions', 'response_format', /optional properties/,
    { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: optional(1000) } } }],
  ['a tool\'s parameters', '/v1/chat/completions', 'tools[1]', /enum values/,
    { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4, tools: [
      { type: 'function', function: { name: 'ok', parameters: { type: 'object', properties: {} } } },
      { type: 'function', function: { name: 'pick', parameters: { type: 'object', properties: { v: bigEnum } } } }] }],
  ['Responses text.format', '/v1/responses', 'response_format', /nested quantifiers/,
    { input: 'Hi', max_output_tokens: 4, text: { format: { type: 'json_schema', name: 'x', schema: { type: 'object', properties: { s: nested }, required: ['s'] } } } }],
  ['Messages output_config.format', '/v1/messages', 'response_format', /optional properties/,
    { model: 'm', max_tokens: 4, messages: [{ role: 'user', content: 'Hi' }], output_config: { format: { type: 'json_schema', schema: optional(1000) } } }],
  ['completions response_format', '/v1/completions', 'response_format', /enum values/,
    { prompt: 'Hi', max_tokens: 4, response_format: { type: 'json_schema', json_schema: { name: 'x', schema: bigEnum } } }],
];
for (const [what, route, param, why, body] of schemaCases) {
  test(`a schema too large for its grammar (${what}): 400 schema_too_large before any grammar is built`, async () => {
    const m0 = await metrics(srv);
    const r = await postJSON(srv, route, body);
    assert.equal(r.status, 400, JSON.stringify(r.json).slice(0, 300));
    const err = r.json.error;
    assert.match(err.message, /too large to build a grammar from/);
    assert.match(err.message, why);
    if (route !== '/v1/messages') { assert.equal(err.code, 'schema_too_large'); assert.equal(err.param, param); }
    const m1 = await metrics(srv);
    assert.equal(metric(m1, 'kvstash_template_renders_total'), metric(m0, 'kvstash_template_renders_total'));
    assert.equal(metric(m1, 'kvstash_grammar_builds_total'), metric(m0, 'kvstash_grammar_builds_total'));
  });
}

test('a schema within the limits is served (256 optional properties, 1,000 enum values)', async () => {
  const schema = { type: 'object', properties: { ...optional(256).properties }, required: [] };
  let r = await postJSON(srv, '/v1/chat/completions', { messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });
  assert.equal(r.status, 200, JSON.stringify(r.json).slice(0, 300));
  r = await postJSON(srv, '/v1/completions', { prompt: 'Hi', max_tokens: 4,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { enum: Array.from({ length: 1000 }, (_, i) => i) } } } });
  assert.equal(r.status, 200, JSON.stringify(r.json).slice(0, 300));
});
