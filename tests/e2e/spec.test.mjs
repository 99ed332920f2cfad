// spec.test.mjs — speculative decoding over HTTP (issue 36): a reply with
// drafts is the reply without them (the request field speculative.n_max: 0
// turns them off for one request), through every API and option a client
// uses — greedy and seeded sampling, logprobs, stop strings, a JSON schema,
// tool calls, n: 2, streamed and not — and on the cache paths (same slot,
// slot copy, SPC, IMC, the store after a restart), where a draft model's own
// KV follows the target's (its store, another slot's sequence); the counters show in
// timings, /slots, /metrics and /props; a hybrid model declines with its
// reason; bad settings exit 2 naming the flag.
//
// Drafts on the tiny model: random weights fall into repeating text, where
// n-grams of 3 tokens hit; --no-spec-adaptive verifies every draft (the
// adaptive choice follows this machine's timing, and a test that saw no
// draft verified would compare nothing). Every comparison asserts that the
// run with drafts accepted some.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  startServer, stopOk, postJSON, getJSON, stream, metrics, metricSum, writeConfig, writeStoreConfig, settleStore,
  runBin, templateModel, agentModel, importClient, until, MODEL,
} from './lib.mjs';

const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-spec-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const SPEC = ['--spec-type', 'ngram-simple', '--spec-ngram-simple-size-n', '3', '--spec-ngram-simple-size-m', '16',
  '--no-spec-adaptive'];
const OFF = { 'speculative.n_max': 0 };
const SYS = 'You are a careful assistant who answers in plain words. '.repeat(6);
const conv = (user) => [{ role: 'system', content: SYS }, { role: 'user', content: user }];

// The same body with and without drafts: equal replies; the drafted one
// verified drafts (and kept some, unless a grammar's short reply leaves
// that to chance: accepted false). Returns [with, without] (parsed JSON).
async function same(srv, route, body, what, { accepted = true } = {}) {
  const on = await postJSON(srv, route, body);
  assert.equal(on.status, 200, on.text);
  const off = await postJSON(srv, route, { ...body, ...OFF });
  assert.equal(off.status, 200, off.text);
  // Ids, times and counters differ from reply to reply; the rest must not.
  const VARY = new Set(['id', 'call_id', 'created', 'created_at', 'timings', 'cache', 'usage', 'system_fingerprint']);
  const strip = (j) => JSON.stringify(j, (k, v) => (VARY.has(k) ? undefined : v));
  assert.equal(strip(on.json), strip(off.json), `${what}: the reply changed with drafts`);
  const t = on.json.timings || {};
  assert.ok(t.draft_n > 0, `${what}: no draft verified: ${JSON.stringify(t)}`);
  if (accepted) assert.ok(t.draft_n_accepted > 0, `${what}: no draft accepted: ${JSON.stringify(t)}`);
  assert.ok(t.draft_n_accepted <= t.draft_n);
  assert.equal((off.json.timings || {}).draft_n, undefined, `${what}: speculative.n_max 0 still drafted`);
  return [on.json, off.json];
}

test('chat: greedy, seeded, logprobs, stop, n: 2, streamed — the same reply with and without drafts', async () => {
  const srv = await startServer([...SPEC, '--ctx', '1024']);
  try {
    const props = (await getJSON(srv, '/props')).json;
    assert.deepEqual(props.kvstash.speculative, { type: 'ngram-simple', draft_max: 16, active: true, exact: true });
    assert.equal(props.default_generation_settings.params['speculative.types'], 'ngram-simple');
    await until(() => /speculative decoding: ngram-simple, up to 16 tokens per step, exact/.test(srv.stderr),
      'the speculation line in the log'); // logged after the listening line
    const base = { messages: conv('describe the moon'), max_tokens: 200, temperature: 0, ignore_eos: true };
    const [g] = await same(srv, '/v1/chat/completions', base, 'greedy');
    await same(srv, '/v1/chat/completions', { ...base, temperature: 0.3, top_k: 4, seed: 11 }, 'seeded');
    await same(srv, '/v1/chat/completions', { ...base, logprobs: true, top_logprobs: 3 }, 'logprobs');
    // A stop string late in a greedy reply, where 8 characters occur for the
    // first time (replies loop: the first prompt whose reply has one late enough).
    let stop = null, sbase = null;
    for (const user of ['describe the moon', 'write a story about a ship', 'list old maps and roads',
      'tell me about rivers', 'explain the weather']) {
      const b = { ...base, messages: conv(user) };
      const text = (await postJSON(srv, '/v1/chat/completions', b)).json.choices[0].message.content;
      let at = text.length - 9;
      while (at > 0 && text.indexOf(text.slice(at, at + 8)) !== at) at--;
      if (at > 120) {
        stop = text.slice(at, at + 8);
        sbase = b;
        break;
      }
    }
    assert.ok(stop, 'no reply with a late stop string');
    const [st] = await same(srv, '/v1/chat/completions', { ...sbase, stop: [stop] }, 'stop');
    assert.equal(st.choices[0].finish_reason, 'stop');
    await same(srv, '/v1/chat/completions', { ...base, n: 2, temperature: 0.3, top_k: 4, seed: 5 }, 'n: 2');
    // Streamed: the same text as the reply without drafts, the counters on the last chunk.
    const s = await stream(srv, '/v1/chat/completions', { ...base, stream: true });
    assert.equal(s.text, g.choices[0].message.content);
    const last = s.events.map((e) => e.json).filter((j) => j && j.timings).pop();
    assert.ok(last.timings.draft_n_accepted > 0, JSON.stringify(last.timings));
    // The counters.
    const m = await metrics(srv);
    assert.ok(metricSum(m, 'kvstash_draft_accepted_total') > 0 || m.get('kvstash_draft_accepted_total') > 0);
    assert.ok(m.get('kvstash_draft_tokens_total') >= m.get('kvstash_draft_accepted_total'));
    assert.ok(m.get('kvstash_draft_steps_total') > 0);
    const slots = (await getJSON(srv, '/slots')).json;
    assert.ok(slots.some((x) => x.n_draft_accepted > 0 && x.n_drafted >= x.n_draft_accepted), JSON.stringify(slots));
    assert.match(srv.stderr, /tok\/s, drafts \d+\/\d+, finish/);
  } finally {
    await stopOk(srv);
  }
});

test('the official OpenAI SDK: speculative.n_max as an extra field; the drafts in the reply\'s timings', async () => {
  const OpenAI = (await importClient('openai')).default;
  const srv = await startServer([...SPEC, '--ctx', '1024']);
  try {
    const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
    const body = { model: 'm', messages: conv('describe the moon'), max_tokens: 160, temperature: 0, ignore_eos: true };
    const on = await client.chat.completions.create(body);
    const off = await client.chat.completions.create({ ...body, 'speculative.n_max': 0 });
    assert.equal(on.choices[0].message.content, off.choices[0].message.content);
    assert.ok(on.timings.draft_n_accepted > 0, JSON.stringify(on.timings));
    assert.equal(off.timings.draft_n, undefined);
    // Streamed through the SDK: the same text.
    let text = '';
    for await (const c of await client.chat.completions.create({ ...body, stream: true })) text += c.choices[0]?.delta?.content ?? '';
    assert.equal(text, on.choices[0].message.content);
  } finally {
    await stopOk(srv);
  }
});

test('Messages and Responses, a JSON schema, tool calls: the same with and without drafts', async () => {
  const model = templateModel(dir);
  const srv = await startServer(['-m', model, ...SPEC, '--ctx', '2048']);
  try {
    await same(srv, '/v1/messages', { model: 'm', max_tokens: 160, temperature: 0, ignore_eos: true,
      system: SYS, messages: [{ role: 'user', content: 'write a poem' }] }, 'messages');
    await same(srv, '/v1/responses', { model: 'm', max_output_tokens: 160, temperature: 0, ignore_eos: true,
      instructions: SYS, input: 'write a list' }, 'responses');
    const schema = { type: 'object', properties: { items: { type: 'array', items: { type: 'string' }, minItems: 12 } },
      required: ['items'] };
    await same(srv, '/v1/chat/completions', { messages: conv('list fruits'), max_tokens: 160, temperature: 0,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } }, 'json schema',
    { accepted: false });
    const tools = [{ type: 'function', function: { name: 'read', description: 'Read a file',
      parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } } }];
    const [tc] = await same(srv, '/v1/chat/completions', { messages: conv('read the file'), max_tokens: 160,
      temperature: 0, tools, tool_choice: 'required' }, 'tool call', { accepted: false });
    assert.ok(tc.choices[0].message.tool_calls.length > 0);
  } finally {
    await stopOk(srv);
  }
});

test('cache paths with drafts: same slot, copy, SPC, IMC and the store after a restart give the uncached reply',
  async () => {
    const cfg = await writeStoreConfig(path.join(dir, 'store.yaml'),
      { cacheDir: path.join(dir, 'disk'), shmDir: path.join(dir, 'shm'), stride: 16, minTokens: 16 });
    const args = [...SPEC, '--ctx', '1024', '--spc', '--imc', '--config', cfg];
    const t1 = { messages: conv('tell me about rivers'), max_tokens: 120, temperature: 0, ignore_eos: true };
    let r1;
    const a = await startServer(args);
    try {
      r1 = (await postJSON(a, '/v1/chat/completions', t1)).json;
      assert.ok(r1.timings.draft_n_accepted > 0);
      const t2 = { ...t1, messages: [...t1.messages, r1.choices[0].message, { role: 'user', content: 'and lakes' }] };
      const cached = (await postJSON(a, '/v1/chat/completions', t2)).json;
      assert.ok(cached.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(cached.cache));
      const cold = (await postJSON(a, '/v1/chat/completions', { ...t2, ...OFF, cache_prompt: false })).json;
      assert.equal(cold.usage.prompt_tokens_details.cached_tokens, 0);
      assert.equal(cached.choices[0].message.content, cold.choices[0].message.content, 'same slot');
      assert.ok(cached.timings.draft_n_accepted > 0);
      // Another conversation with the same system prompt (SPC) while the first slot is busy: a copy or SPC.
      const other = { ...t1, messages: conv('tell me about mountains') };
      const [x, y] = await Promise.all([postJSON(a, '/v1/chat/completions', t2), postJSON(a, '/v1/chat/completions', other)]);
      const xc = (await postJSON(a, '/v1/chat/completions', { ...t2, ...OFF, cache_prompt: false })).json;
      const yc = (await postJSON(a, '/v1/chat/completions', { ...other, ...OFF, cache_prompt: false })).json;
      assert.equal(x.json.choices[0].message.content, xc.choices[0].message.content, 'concurrent 1');
      assert.equal(y.json.choices[0].message.content, yc.choices[0].message.content, 'concurrent 2 (SPC or copy)');
      await settleStore(a);
    } finally {
      await stopOk(a);
    }
    // A restart: the second turn's prefix comes from the store.
    const b = await startServer(args);
    try {
      const t2 = { ...t1, messages: [...t1.messages, r1.choices[0].message, { role: 'user', content: 'and seas' }] };
      const warm = (await postJSON(b, '/v1/chat/completions', t2)).json;
      assert.ok(warm.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(warm.cache));
      assert.ok(warm.timings.draft_n_accepted > 0);
      const cold = (await postJSON(b, '/v1/chat/completions', { ...t2, ...OFF, cache_prompt: false })).json;
      assert.equal(warm.choices[0].message.content, cold.choices[0].message.content, 'store restore');
    } finally {
      await stopOk(b);
    }
  });

test('a mixture of experts: the same reply with and without drafts', async () => {
  const srv = await startServer(['-m', process.env.KS_TINY_MOE_MODEL, ...SPEC, '--ctx', '1024']);
  try {
    await same(srv, '/v1/chat/completions', { messages: conv('describe the moon'), max_tokens: 200, temperature: 0,
      ignore_eos: true }, 'moe greedy');
    await same(srv, '/v1/chat/completions', { messages: conv('write a story'), max_tokens: 200, temperature: 0.3,
      top_k: 4, seed: 9, ignore_eos: true }, 'moe seeded', { accepted: false });
  } finally {
    await stopOk(srv);
  }
});

test('a hybrid model declines with its reason; --spec-type none; bad settings exit 2 naming the flag', async () => {
  const hybrid = process.env.KS_TINY_HYBRID_MODEL;
  const h = await startServer(['-m', hybrid, ...SPEC]);
  try {
    const sp = (await getJSON(h, '/props')).json.kvstash.speculative;
    assert.equal(sp.active, false);
    assert.match(sp.reason, /cannot drop drafted tokens/);
    // (logged after the listening line: waited for)
    await until(() => /speculative decoding: off \(the model's memory cannot drop drafted tokens/.test(h.stderr),
      'the hybrid model\'s refusal in the log');
    const r = await postJSON(h, '/v1/chat/completions', { messages: conv('hi'), max_tokens: 40, temperature: 0,
      ignore_eos: true });
    assert.equal(r.status, 200);
    assert.equal(r.json.timings.draft_n, undefined);
  } finally {
    await stopOk(h);
  }
  const n = await startServer(['--spec-type', 'none']);
  try {
    assert.deepEqual((await getJSON(n, '/props')).json.kvstash.speculative,
      { type: 'none', draft_max: 16, active: false, exact: false });
    await until(() => /speculative decoding: off \(--spec-type none\)/.test(n.stderr), '"off (--spec-type none)" in the log');
  } finally {
    await stopOk(n);
  }
  for (const [args, re] of [
    [['--spec-type', 'draft-eagle9'], /--spec-type \(speculative\.type\): 'draft-eagle9' is not a speculative/],
    [['--spec-draft-n-max', '0'], /--spec-draft-n-max/],
    [['--draft-max', '65'], /--spec-draft-n-max/],
    [['--spec-ngram-mod-n-match', '0'], /--spec-ngram-mod-n-match/],
    [['--spec-draft-n-min', '20', '--spec-draft-n-max', '8'], /--spec-draft-n-min 20 is more than --spec-draft-n-max 8/],
    [['--config', writeConfig('speculative:\n  type: ngram-nope\n')], /speculative\.type/],
    [['--config', writeConfig('speculative:\n  draft_max: 99\n')], /speculative\.draft_max/],
    [['--config', writeConfig('models:\n  default:\n    speculative:\n      typo: 1\n')], /models\.default\.speculative\.typo/],
  ]) {
    const r = await runBin(['serve', '-m', MODEL, '--port', '0', '--threads', '1', ...args]);
    assert.equal(r.code, 2, `${args.join(' ')}: exit ${r.code}\n${r.stderr}`);
    assert.match(r.stderr, re);
  }
  // A bad request field: the API's error, the server stays up.
  const s = await startServer(SPEC);
  try {
    const r = await postJSON(s, '/v1/chat/completions', { messages: conv('hi'), max_tokens: 4, 'speculative.n_max': -3 });
    assert.equal(r.status, 400);
    assert.equal(r.json.error.param, 'speculative.n_max');
    assert.equal((await postJSON(s, '/v1/chat/completions', { messages: conv('hi'), max_tokens: 4 })).status, 200);
  } finally {
    await stopOk(s);
  }
});

test('a draft model (-md): the same replies; a cached turn prefills in it only the new tokens; bad ones exit 2',
  async () => {
    const TARGET = process.env.KS_TINY_TARGET_MODEL, DRAFT = process.env.KS_TINY_DRAFT_MODEL;
    const srv = await startServer(['-m', TARGET, '-md', DRAFT, '--no-spec-adaptive', '--ctx', '1024', '--slots', '1']);
    try {
      assert.equal((await getJSON(srv, '/props')).json.kvstash.speculative.type, 'draft-simple');
      assert.match(srv.stderr, /draft model kvstash-tiny-draft/);
      const t1 = { messages: conv('describe the moon'), max_tokens: 120, temperature: 0, ignore_eos: true };
      const [r1] = await same(srv, '/v1/chat/completions', t1, 'draft model');
      await same(srv, '/v1/chat/completions', { ...t1, temperature: 0.5, top_k: 8, seed: 3 }, 'draft model, seeded',
        { accepted: false });
      // The conversation's next turn on the same slot: the draft model decodes only its new tokens (+ 1).
      const m0 = await metrics(srv);
      const t2 = { ...t1, messages: [...t1.messages, r1.choices[0].message, { role: 'user', content: 'and the sun' }] };
      const r2 = (await postJSON(srv, '/v1/chat/completions', t2)).json;
      const m1 = await metrics(srv);
      const fresh = r2.usage.prompt_tokens - r2.usage.prompt_tokens_details.cached_tokens;
      const pre = m1.get('kvstash_draft_model_prefill_tokens_total') - m0.get('kvstash_draft_model_prefill_tokens_total');
      assert.ok(r2.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(r2.cache));
      assert.ok(pre <= fresh + 1, `the draft model prefilled ${pre} tokens for ${fresh} new ones`);
      assert.ok(m1.get('kvstash_draft_model_drafted_tokens_total') > 0);
    } finally {
      await stopOk(srv);
    }
    const other = agentModel(dir); // another vocabulary
    for (const [args, re] of [
      [['-m', TARGET, '-md', other], /--model-draft .*: not the model's vocabulary: /],
      [['-m', TARGET, '--spec-type', 'draft-simple'], /draft-simple needs a draft model/],
      [['-m', TARGET, '-md', DRAFT, '-ngld', 'lots'], /--gpu-layers-draft \(-ngld\)/],
      [['-m', TARGET, '-md', path.join(dir, 'missing.gguf')], /--model-draft \(speculative\.draft_model\)/],
      [['-m', TARGET, '-md', DRAFT, '--spec-draft-p-min', '2'], /--spec-draft-p-min/],
    ]) {
      const r = await runBin(['serve', '--port', '0', '--threads', '1', ...args]);
      assert.equal(r.code, 2, `${args.join(' ')}: exit ${r.code}\n${r.stderr}`);
      assert.match(r.stderr, re);
    }
  });

// The draft model's KV is a cache citizen (draft_model.h): a cached turn —
// the store after its slot was taken over, the store after a restart, a
// slot that starts from another's system prompt — decodes in the draft model
// no more than the target prefills, + 1; replies equal the uncached ones.
test('a draft model\'s KV follows the cache: store after an eviction, after a restart, another slot\'s prefix',
  async () => {
    const TARGET = process.env.KS_TINY_TARGET_MODEL, DRAFT = process.env.KS_TINY_DRAFT_MODEL;
    const cfg = await writeStoreConfig(path.join(dir, 'draft-store.yaml'),
      { cacheDir: path.join(dir, 'draft-disk'), shmDir: path.join(dir, 'draft-shm'), stride: 16, minTokens: 16 });
    const args = ['-m', TARGET, '-md', DRAFT, '--no-spec-adaptive', '--ctx', '1024', '--config', cfg];
    const ask = (msgs) => ({ messages: msgs, max_tokens: 48, temperature: 0, ignore_eos: true });
    // One request: its reply equals the uncached one; the draft model's
    // prompt decodes are at most the target's new tokens + 1.
    async function turn(srv, body, what, { cached = true } = {}) {
      const m0 = await metrics(srv);
      const r = (await postJSON(srv, '/v1/chat/completions', body)).json;
      const m1 = await metrics(srv);
      const cold = (await postJSON(srv, '/v1/chat/completions', { ...body, ...OFF, cache_prompt: false })).json;
      assert.equal(r.choices[0].message.content, cold.choices[0].message.content, `${what}: reply`);
      const d = (k) => m1.get(`kvstash_draft_model_${k}_total`) - m0.get(`kvstash_draft_model_${k}_total`);
      const fresh = r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens;
      if (cached) assert.ok(r.usage.prompt_tokens_details.cached_tokens > 0, `${what}: ${JSON.stringify(r.cache)}`);
      assert.ok(d('prefill_tokens') <= fresh + 1,
        `${what}: the draft model decoded ${d('prefill_tokens')} prompt tokens for the target's ${fresh} new ones`);
      assert.ok(r.timings.draft_n > 0, `${what}: no drafts`);
      return { r, copied: d('copied_tokens'), restored: d('restored_tokens') };
    }
    const x1 = [{ role: 'system', content: SYS }, { role: 'user', content: 'describe the moon and its phases' }];
    let x2;
    const a = await startServer([...args, '--slots', '1']);
    try {
      const r1 = (await postJSON(a, '/v1/chat/completions', ask(x1))).json;
      // Another conversation takes the only slot: both models' states of the first go to their stores.
      await postJSON(a, '/v1/chat/completions', ask([{ role: 'user', content: 'count the stars, slowly' }]));
      x2 = [...x1, r1.choices[0].message, { role: 'user', content: 'and the sun' }];
      const t = await turn(a, ask(x2), 'after an eviction');
      assert.equal(t.r.cache.mode, 'store', JSON.stringify(t.r.cache));
      assert.ok(t.restored > 0, 'the draft model read its state back from its store');
      await settleStore(a);
    } finally {
      await stopOk(a);
    }
    const b = await startServer([...args, '--slots', '1']);
    try {
      const t = await turn(b, ask([...x2.slice(0, -1), { role: 'user', content: 'and the tides' }]), 'after a restart');
      assert.equal(t.r.cache.mode, 'store', JSON.stringify(t.r.cache));
      assert.ok(t.restored > 0, 'the draft model read its state back after the restart');
    } finally {
      await stopOk(b);
    }
    // The same eviction without the draft model's cache (KS_DRAFT_CACHE=0, the
    // benchmarks' baseline): the bound above is one that fails without it.
    const n = await startServer(['-m', TARGET, '-md', DRAFT, '--no-spec-adaptive', '--ctx', '1024', '--slots', '1'],
      { env: { KS_DRAFT_CACHE: '0' } });
    try {
      const r1 = (await postJSON(n, '/v1/chat/completions', ask(x1))).json;
      await postJSON(n, '/v1/chat/completions', ask([{ role: 'user', content: 'count the stars, slowly' }]));
      const m0 = await metrics(n);
      const r = (await postJSON(n, '/v1/chat/completions',
        ask([...x1, r1.choices[0].message, { role: 'user', content: 'and the sun' }]))).json;
      const m1 = await metrics(n);
      assert.equal(r.cache.mode, 'store', JSON.stringify(r.cache));
      const fresh = r.usage.prompt_tokens - r.usage.prompt_tokens_details.cached_tokens;
      const pre = m1.get('kvstash_draft_model_prefill_tokens_total') - m0.get('kvstash_draft_model_prefill_tokens_total');
      assert.ok(pre > fresh + 1, `without its cache the draft model decoded ${pre} prompt tokens for ${fresh} new ones`);
      assert.equal(m1.get('kvstash_draft_model_restored_tokens_total'), 0);
    } finally {
      await stopOk(n);
    }
    // Two slots: the second starts with the first's system prompt; the
    // draft model takes it from the first slot's draft sequence.
    const c = await startServer(['-m', TARGET, '-md', DRAFT, '--no-spec-adaptive', '--ctx', '1024', '--slots', '2']);
    try {
      // a long reply: the first slot holds more than twice the shared system
      // prompt, so the second conversation gets the empty slot (route.c)
      const sys = 'You answer in plain words. '.repeat(2);
      await postJSON(c, '/v1/chat/completions',
        { ...ask([{ role: 'system', content: sys }, { role: 'user', content: 'describe the moon' }]), max_tokens: 160 });
      const y = [{ role: 'system', content: sys }, { role: 'user', content: 'describe a river at night, with its sounds' }];
      const u = await turn(c, ask(y), 'another slot, the same system prompt', { cached: false });
      assert.ok(u.copied > 0, 'the draft model took the system prompt from the other slot without decoding it');
      const sl = await getJSON(c, '/slots');
      assert.equal(sl.json.filter((x) => x.n_tokens > 0).length, 2, JSON.stringify(sl.json));
    } finally {
      await stopOk(c);
    }
  });

// Tenants (API keys): a drafter serves one key; another key's draft
// sequence is never copied and its stored draft states never read — the
// same prompt from B decodes it whole in the draft model — while A's own
// come back to A.
test('a draft model\'s cached KV stays with its key: another key neither copies nor restores it', async () => {
  const TARGET = process.env.KS_TINY_TARGET_MODEL, DRAFT = process.env.KS_TINY_DRAFT_MODEL;
  const cfg = await writeStoreConfig(path.join(dir, 'draft-tenants.yaml'),
    { cacheDir: path.join(dir, 'dt-disk'), shmDir: path.join(dir, 'dt-shm'), stride: 16, minTokens: 16 });
  const srv = await startServer(['-m', TARGET, '-md', DRAFT, '--no-spec-adaptive', '--ctx', '1024', '--slots', '1',
    '--config', cfg, '--api-key', 'KA', '--api-key', 'KB', '--metrics-key', 'MK']);
  const mk = { authorization: 'Bearer MK' };
  const ask = async (key, messages) => {
    const r = await postJSON(srv, '/v1/chat/completions', { messages, max_tokens: 48, temperature: 0, ignore_eos: true },
      { headers: { authorization: `Bearer ${key}` } });
    assert.equal(r.status, 200, r.text);
    return r.json;
  };
  const delta = async (fn) => {
    const m0 = await metrics(srv, mk);
    const r = await fn();
    const m1 = await metrics(srv, mk);
    const d = (k) => m1.get(`kvstash_draft_model_${k}_total`) - m0.get(`kvstash_draft_model_${k}_total`);
    return { r, prefill: d('prefill_tokens'), copied: d('copied_tokens'), restored: d('restored_tokens') };
  };
  try {
    const x = [{ role: 'system', content: SYS }, { role: 'user', content: 'describe the moon and its phases' }];
    const a1 = await ask('KA', x);
    // B, the same prompt, takes the only slot: A's drafter goes (its state
    // to the store, under A), B's starts empty and finds nothing of A's.
    const b = await delta(() => ask('KB', x));
    assert.equal(b.r.usage.prompt_tokens_details.cached_tokens, 0, JSON.stringify(b.r.cache));
    assert.equal(b.copied, 0);
    assert.equal(b.restored, 0);
    assert.ok(b.prefill >= b.r.usage.prompt_tokens, `B's draft decoded ${b.prefill} of ${b.r.usage.prompt_tokens}`);
    await settleStore(srv, 30000, mk);
    // A again: its own draft state comes back.
    const a2 = await delta(() => ask('KA', [...x, a1.choices[0].message, { role: 'user', content: 'and the sun' }]));
    assert.equal(a2.r.cache.mode, 'store', JSON.stringify(a2.r.cache));
    assert.ok(a2.restored > 0, 'A\'s draft state read back for A');
  } finally {
    await stopOk(srv);
  }
});

test('a models entry\'s speculative block applies; a flag wins over it', async () => {
  const cfg = writeConfig('models:\n  default:\n    speculative:\n      type: ngram-mod\n      draft_max: 8\n');
  const a = await startServer(['--config', cfg]);
  try {
    const sp = (await getJSON(a, '/props')).json.kvstash.speculative;
    assert.equal(sp.type, 'ngram-mod');
    assert.equal(sp.draft_max, 8);
  } finally {
    await stopOk(a);
  }
  const b = await startServer(['--config', cfg, '--spec-type', 'ngram-map-k', '--draft-max', '4']);
  try {
    const sp = (await getJSON(b, '/props')).json.kvstash.speculative;
    assert.deepEqual([sp.type, sp.draft_max], ['ngram-map-k', 4]);
  } finally {
    await stopOk(b);
  }
});
