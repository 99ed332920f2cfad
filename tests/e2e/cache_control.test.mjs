// cache_control.test.mjs — Anthropic's cache_control breakpoints mean
// something: the marked prefix is pinned in the store for its TTL, survives
// the eviction that takes an unmarked prefix of the same size, and the usage
// says exactly what was read and written. Driven with the official
// `@anthropic-ai/sdk` on /v1/messages and, as kvstash's extension, with
// `cache_control` on a chat message.
//
// Setup: one slot (every other conversation takes it over) and a 1 MiB RAM
// store (a ~1,200-token conversation of the tiny model fills most of it), so
// a few other conversations evict everything that is not pinned.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, postJSON, importClient, metrics, metric, templateModel, settleStore } from './lib.mjs';

let srv, dir, client, Anthropic;

before(async () => {
  Anthropic = (await importClient('@anthropic-ai/sdk')).default;
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-cc-'));
  const model = templateModel(dir);
  srv = await startServer(['-m', model, '--ctx', '4096', '--slots', '1', '--cache-ram', '1']);
  client = new Anthropic({ baseURL: srv.base, apiKey: 'none', maxRetries: 0, timeout: 120000 });
});
after(async () => {
  if (srv) await stopOk(srv);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const rules = (tag, n) => Array.from({ length: n }, (_, i) => `Rule ${tag}${i}: keep to the ${tag} river.`).join(' ');
const SYSTEM_A = `You are assistant A. ${rules('alpha', 40)}`;
const SYSTEM_B = `You are assistant B. ${rules('beta', 40)}`;

const ask = (system, q, cc) => client.messages.create({
  model: 'kvstash', max_tokens: 4, temperature: 0,
  system: [{ type: 'text', text: system, ...(cc ? { cache_control: { type: 'ephemeral' } } : {}) }],
  messages: [{ role: 'user', content: q }],
});

// Other conversations, long enough to take the slot and fill the RAM store.
async function others(tag, n = 3) {
  for (let i = 0; i < n; i++) {
    const m = await client.messages.create({ model: 'kvstash', max_tokens: 2, temperature: 0,
      system: `Other ${tag}${i}. ${rules(`o${tag}${i}x`, 90)}`, messages: [{ role: 'user', content: 'go' }] });
    assert.ok(m.usage.cache_read_input_tokens < 20, `shares only the template's opening: ${m.usage.cache_read_input_tokens}`);
  }
  // Their saves (and the evictions they cause) are written by the store's
  // writer thread: wait for it, or a loaded machine would still find the rest.
  await settleStore(srv);
}

const total = (u) => u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens;

test('a breakpoint on a long system prompt is written, then read after other conversations evicted the rest', async () => {
  const a1 = await ask(SYSTEM_A, 'First question?', true);
  const pinned = a1.usage.cache_creation_input_tokens;
  assert.ok(pinned > 300, `the system prompt was written: ${JSON.stringify(a1.usage)}`);
  assert.equal(a1.usage.cache_read_input_tokens, 0);
  assert.ok(a1.usage.input_tokens > 0 && a1.usage.input_tokens < 40, 'only the question is neither read nor written');
  assert.equal(a1.cache.pinned_tokens, pinned);

  // The same prefix without a breakpoint, then the other conversations.
  const b1 = await ask(SYSTEM_B, 'First question?', false);
  assert.equal(b1.usage.cache_creation_input_tokens, 0);
  await others('x');

  const b2 = await ask(SYSTEM_B, 'Second question?', false);
  const a2 = await ask(SYSTEM_A, 'Second question?', true);
  assert.ok(b2.usage.cache_read_input_tokens < 100,
    `without a breakpoint the prefix was evicted (read ${b2.usage.cache_read_input_tokens})`);
  assert.ok(a2.usage.cache_read_input_tokens >= pinned,
    `with the breakpoint it survived: read ${a2.usage.cache_read_input_tokens} of the ${pinned} pinned`);
  assert.equal(a2.usage.cache_creation_input_tokens, 0, 'nothing new to write: the pin was refreshed');
  const count = await client.messages.countTokens({ model: 'kvstash', system: SYSTEM_A,
    messages: [{ role: 'user', content: 'Second question?' }] });
  assert.equal(total(a2.usage), count.input_tokens, 'the three counts add up to the prompt');

  // And the answer restored from the pin is the uncached one.
  const u = await postJSON(srv, '/v1/messages', { model: 'kvstash', max_tokens: 4, temperature: 0, cache_prompt: false,
    system: SYSTEM_A, messages: [{ role: 'user', content: 'Second question?' }] });
  assert.equal(u.status, 200, u.text);
  assert.deepEqual(u.json.content, a2.content);
  assert.equal(total(u.json.usage), total(a2.usage));

  const m = await metrics(srv);
  assert.ok(metric(m, 'kvstash_cache_pins_saved_total') >= 1);
});

test('chat completions: cache_control on a message is the same breakpoint', async () => {
  const sys = `You are assistant C. ${rules('gamma', 40)}`;
  const body = (q) => ({ messages: [{ role: 'system', content: sys, cache_control: { type: 'ephemeral', ttl: '1h' } },
    { role: 'user', content: q }], temperature: 0, max_tokens: 4 });
  const c1 = await postJSON(srv, '/v1/chat/completions', body('One?'));
  assert.equal(c1.status, 200, c1.text);
  const written = c1.json.cache.written_tokens;
  assert.ok(written > 300, JSON.stringify(c1.json.cache));
  await others('y');
  const c2 = await postJSON(srv, '/v1/chat/completions', body('Two?'));
  assert.ok(c2.json.usage.prompt_tokens_details.cached_tokens >= written, JSON.stringify(c2.json.cache));
  assert.equal(c2.json.cache.written_tokens ?? 0, 0);
});
