// admission.test.mjs — regression test for issue 28, "one request can cost
// seconds and gigabytes before it is refused": a tools array of 3,000 or
// 6,000 functions (1.8 and 3.5 MB) under a template that renders tools
// (Qwen3's) is refused with the 400 context_length_exceeded from its size
// alone — no template render (kvstash_template_renders_total unchanged,
// kvstash_refused_before_render_total counts it) and the server's peak
// resident memory (VmHWM) growing by at most 8 bytes per body byte (the
// parsed body), where the render cost 483 MB and 1.98 GB before. A request
// with tools that fits is still served, and one whose known strings fit but
// whose render does not is still refused after the render. No timing.
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
  test(`${n} tools: refused before any render, peak memory within 8 bytes per body byte`, async () => {
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
    if (!SANITIZED) assert.ok(h1 - h0 <= 8 * bytes, `VmHWM grew ${h1 - h0} bytes for a ${bytes}-byte body (budget ${8 * bytes})`);
  });
}

test('a user message longer than the context is refused before the render too', async () => {
  const m0 = await metrics(srv);
  const r = await ask({ messages: [{ role: 'user', content: 'word '.repeat(20000) }] });
  assertError(r, 400, 'context_length_exceeded', 'messages');
  const m1 = await metrics(srv);
  assert.equal(metric(m1, 'kvstash_template_renders_total'), metric(m0, 'kvstash_template_renders_total'));
});
