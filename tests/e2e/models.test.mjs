// models.test.mjs — one server, several models (issue 37; docs/SERVER.md
// "Several models"): three tiny models of different weights and a broken
// GGUF behind one port with --models-max 2. Routing by name, alias pattern
// and default model; the "model not found" error without a default; the
// least recently used idle model unloaded for a third; a pinned model never
// unloaded; idle unload; POST /models/load and /models/unload and the status
// list of /v1/models; two models answering at once; requests that arrive
// while their model loads; a broken GGUF listed as failed while the others
// serve; a conversation that continues after its model was unloaded and
// loaded again, read from the store and equal to the uncached reply; two
// models never reading each other's stored states; per-model /metrics,
// /slots, /props and the utility endpoints.
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync, mkdirSync, copyFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  BIN, startServer, stopOk, postJSON, getJSON, metrics, assertError, until, writeConfig, runBin, importClient,
} from './lib.mjs';

const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-models-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const M = {};
before(() => {
  // Three models of the tiny preset with other weights (seeds): each answers
  // its own way, and each has its own fingerprint in the store.
  for (const [name, seed] of [['alpha', 1], ['beta', 2], ['gamma', 3]]) {
    M[name] = path.join(dir, `${name}.gguf`);
    execFileSync(BIN, ['mkmodel', '--preset', 'tiny', '--seed', String(seed), M[name]], { stdio: 'ignore' });
  }
  M.broken = path.join(dir, 'broken.gguf');
  writeFileSync(M.broken, 'GGUF but not really a model file');
});

const msgs = (text) => [{ role: 'user', content: text }];
const ask = (srv, model, text, extra = {}) =>
  postJSON(srv, '/v1/chat/completions', { model, messages: msgs(text), max_tokens: 12, temperature: 0, ...extra });
const statusOf = async (srv) => {
  const r = await getJSON(srv, '/v1/models');
  assert.equal(r.status, 200, r.text);
  return Object.fromEntries(r.json.data.map((m) => [m.id, m.status]));
};
const waitState = (srv, name, value, what) =>
  until(async () => ((await statusOf(srv))[name].value === value ? true : null), what, 30000, 50);

function yaml({ extra = '', def = 'alpha', max = 2 } = {}) {
  return writeConfig(`models:
  alpha: { path: ${M.alpha}, aliases: ["claude-*sonnet*", "big"] }
  beta: { path: ${M.beta}, aliases: ["claude-*haiku*"] }
  gamma: { path: ${M.gamma}, pin: true }
  broken: { path: ${M.broken} }
models_max: ${max}
${def ? `default_model: ${def}` : ''}
${extra}`);
}

// What each model answers alone: a single-model server per model, the references.
const REF = {};
before(async () => {
  for (const name of ['alpha', 'beta', 'gamma']) {
    const s = await startServer(['--no-cache-prompt'], { model: M[name] });
    try {
      const r = await ask(s, 'whatever', 'tell me about the sea');
      assert.equal(r.status, 200, r.text);
      REF[name] = r.json.choices[0].message.content;
    } finally {
      await stopOk(s);
    }
  }
  assert.notEqual(REF.alpha, REF.beta, 'premise: the models answer differently');
  assert.notEqual(REF.beta, REF.gamma, 'premise: the models answer differently');
});

test('routing: names, alias patterns, the default model, the pinned one loaded at start', async () => {
  const srv = await startServer(['--config', yaml()], { model: null });
  try {
    assert.match(srv.stderr, /listening on .* \(4 models: alpha, beta, gamma \(pinned\), broken; default alpha; at most 2 loaded\)/);
    let st = await statusOf(srv);
    assert.equal(st.gamma.value, 'loaded', 'the pinned model loads at start');
    assert.equal(st.alpha.value, 'unloaded');
    // The broken GGUF is known at start: failed with its reason, never in the way.
    assert.equal(st.broken.failed, true);
    assert.match(st.broken.reason, /broken\.gguf/);
    for (const [model, want] of [['alpha', 'alpha'], ['claude-sonnet-4-5', 'alpha'], ['big', 'alpha'],
      ['claude-3-5-haiku-20241022', 'beta'], ['gamma', 'gamma'], ['no-such-model', 'alpha'], [undefined, 'alpha']]) {
      const r = await postJSON(srv, '/v1/chat/completions', {
        ...(model ? { model } : {}), messages: msgs('tell me about the sea'), max_tokens: 12, temperature: 0,
      });
      assert.equal(r.status, 200, `${model}: ${r.text}`);
      assert.equal(r.json.model, want, `${model} -> ${r.json.model}`);
      assert.equal(r.json.choices[0].message.content, REF[want], `${model}: not ${want}'s reply`);
    }
    // Anthropic Messages and Responses route the same way.
    const a = await postJSON(srv, '/v1/messages', { model: 'claude-haiku-4-5', max_tokens: 12, temperature: 0,
      messages: msgs('tell me about the sea') });
    assert.equal(a.status, 200, a.text);
    assert.equal(a.json.model, 'beta');
    const o = await postJSON(srv, '/v1/responses', { model: 'gamma', input: 'tell me about the sea',
      max_output_tokens: 12, temperature: 0 });
    assert.equal(o.status, 200, o.text);
    assert.equal(o.json.model, 'gamma');
    // The broken model: its reason, while the others serve.
    const b = await ask(srv, 'broken', 'hello');
    assertError(b, 500, 'model_load_failed', 'model');
    assert.match(b.json.error.message, /broken/);
    assert.equal((await ask(srv, 'gamma', 'tell me about the sea')).status, 200);
    st = await statusOf(srv);
    assert.equal(st.gamma.value, 'loaded');
    assert.equal(st.gamma.pinned, true);
  } finally {
    await stopOk(srv);
  }
});

test('an unknown model without a default gets "model not found" in each API\'s shape', async () => {
  const srv = await startServer(['--config', yaml({ def: '' })], { model: null });
  try {
    assertError(await ask(srv, 'no-such-model', 'hello'), 404, 'model_not_found', 'model');
    const a = await postJSON(srv, '/v1/messages', { model: 'nope', max_tokens: 4, messages: msgs('hi') });
    assert.equal(a.status, 404, a.text);
    assert.equal(a.json.type, 'error', a.text);
    assert.equal(a.json.error.type, 'not_found_error', a.text);
    // None named: which one is for the client to say.
    assertError(await postJSON(srv, '/v1/chat/completions', { messages: msgs('hi'), max_tokens: 4 }), 400,
      'model_required', 'model');
    // Every endpoint that takes a model resolves it the same way.
    assertError(await postJSON(srv, '/tokenize', { model: 'nope', content: 'hi' }), 404, 'model_not_found');
    const tk = await postJSON(srv, '/tokenize', { model: 'beta', content: 'hello world' });
    assert.equal(tk.status, 200, tk.text);
    assert.ok(tk.json.tokens.length > 0);
    const ct = await postJSON(srv, '/v1/messages/count_tokens', { model: 'claude-haiku-4-5', messages: msgs('hi') });
    assert.equal(ct.status, 200, ct.text);
    assert.ok(ct.json.input_tokens > 0);
    const at = await postJSON(srv, '/apply-template', { model: 'gamma', messages: msgs('hi') });
    assert.equal(at.status, 200, at.text);
    assert.match(at.json.prompt, /hi/);
    const p = await getJSON(srv, '/props?model=beta');
    assert.equal(p.status, 200, p.text);
    assert.equal(p.json.model_alias, 'beta');
    assert.equal(p.json.model_path, M.beta);
    // No model named and no default: the router's own properties, as
    // llama-server's router answers (a web UI reads /props at start).
    const rp = await getJSON(srv, '/props');
    assert.equal(rp.status, 200, rp.text);
    assert.equal(rp.json.role, 'router');
    assert.equal(rp.json.max_instances, 2);
    assert.equal(rp.json.default_generation_settings.n_ctx, 0);
    assert.deepEqual([...rp.json.kvstash.models].sort(), ['alpha', 'beta', 'broken', 'gamma']);
    assertError(await getJSON(srv, '/props?model=nope'), 404, 'model_not_found');
    // The server stays up after each of these.
    assert.equal((await getJSON(srv, '/health')).status, 200);
  } finally {
    await stopOk(srv);
  }
});

test('--models-max 2: the least recently used idle model goes for a third; the pinned one never', async () => {
  const srv = await startServer(['--config', yaml()], { model: null });
  try {
    assert.equal((await ask(srv, 'alpha', 'one')).status, 200);
    let st = await statusOf(srv);
    assert.equal(st.alpha.value, 'loaded');
    assert.equal(st.gamma.value, 'loaded');
    // beta needs room: alpha (not pinned) goes, gamma (pinned) stays.
    assert.equal((await ask(srv, 'beta', 'two')).status, 200);
    st = await statusOf(srv);
    assert.equal(st.beta.value, 'loaded');
    assert.equal(st.alpha.value, 'unloaded');
    assert.equal(st.gamma.value, 'loaded', 'the pinned model was unloaded');
    assert.match(srv.stderr, /alpha: unloaded \(least recently used, for beta: --models-max reached\)/);
    // And back: beta goes now.
    assert.equal((await ask(srv, 'alpha', 'three')).status, 200);
    st = await statusOf(srv);
    assert.equal(st.beta.value, 'unloaded');
    assert.equal(st.gamma.value, 'loaded');
    const m = await metrics(srv);
    assert.equal(m.get('kvstash_model_loads_total{model="alpha"}'), 2);
    assert.equal(m.get('kvstash_model_unloads_total{model="alpha"}'), 1);
    assert.equal(m.get('kvstash_model_unloads_total{model="gamma"}'), 0);
    assert.equal(m.get('kvstash_model_loaded{model="gamma"}'), 1);
    // Per-model series carry the model's label (each family once: parseProm checked the format).
    assert.ok(m.get('kvstash_requests_total{model="alpha"}') >= 1, [...m.keys()].filter((k) => k.startsWith('kvstash_requests_total')).join());
    assert.ok(m.has('kvstash_requests_total{model="gamma"}'));
    // The RAM budget is the models' together: each store's RAM tier gets its
    // share (2 GiB by default, four models).
    assert.equal(m.get('kvstash_store_tier_max_bytes{tier="ram",model="alpha"}'), (2048 * 2 ** 20) / 4);
    // The pinned one cannot be unloaded by hand either.
    assertError(await postJSON(srv, '/models/unload', { model: 'gamma' }), 400, 'model_pinned', 'model');
  } finally {
    await stopOk(srv);
  }
});

test('POST /models/load and /models/unload, the status list, idle unload', async () => {
  const srv = await startServer(['--config', yaml({ extra: 'sleep_idle_seconds: 2\n', max: 3 })], { model: null });
  try {
    const l = await postJSON(srv, '/models/load', { model: 'claude-haiku-4-5' });
    assert.equal(l.status, 200, l.text);
    assert.deepEqual(l.json, { success: true });
    await waitState(srv, 'beta', 'loaded', 'beta to load');
    assertError(await postJSON(srv, '/models/load', { model: 'beta' }), 400, 'model_loaded', 'model');
    assertError(await postJSON(srv, '/models/load', { model: 'nope' }), 404, 'model_not_found', 'model');
    assertError(await postJSON(srv, '/models/load', { nope: 1 }), 400, 'invalid_request', 'model');
    const models = (await getJSON(srv, '/v1/models')).json.data;
    const beta = models.find((m) => m.id === 'beta');
    assert.deepEqual(beta.aliases, ['claude-*haiku*']);
    assert.equal(beta.meta.n_slots, 2);
    assert.equal(beta.path, M.beta);
    assert.deepEqual(beta.architecture.input_modalities, ['text']);
    const u = await postJSON(srv, '/models/unload', { model: 'beta' });
    assert.equal(u.status, 200, u.text);
    await waitState(srv, 'beta', 'unloaded', 'beta to unload');
    assertError(await postJSON(srv, '/models/unload', { model: 'beta' }), 400, 'model_not_loaded', 'model');
    // Idle: alpha unused for 2 s goes by itself; gamma (pinned) stays.
    assert.equal((await ask(srv, 'alpha', 'hello')).status, 200);
    await waitState(srv, 'alpha', 'unloaded', 'alpha to unload when idle');
    assert.match(srv.stderr, /alpha: unloaded \(idle\)/);
    assert.equal((await statusOf(srv)).gamma.value, 'loaded');
    // A failed model may be tried again by hand (and fails again, said).
    assert.equal((await postJSON(srv, '/models/load', { model: 'broken' })).status, 200);
    await until(async () => ((await statusOf(srv)).broken.failed && !srv.stderr.includes('broken: loading') ? null
      : (await statusOf(srv)).broken.failed ? true : null), 'broken to fail again', 20000, 50);
  } finally {
    await stopOk(srv);
  }
});

test('--no-models-autoload: a request for an unloaded model is refused until it is loaded', async () => {
  const srv = await startServer(['--config', yaml(), '--no-models-autoload'], { model: null });
  try {
    const r = await ask(srv, 'beta', 'hello');
    assertError(r, 503, 'model_not_loaded', 'model');
    assert.equal(r.headers.get('retry-after'), '1');
    assert.equal((await postJSON(srv, '/models/load', { model: 'beta' })).status, 200);
    await waitState(srv, 'beta', 'loaded', 'beta to load');
    const ok = await ask(srv, 'beta', 'tell me about the sea');
    assert.equal(ok.status, 200, ok.text);
    assert.equal(ok.json.choices[0].message.content, REF.beta);
  } finally {
    await stopOk(srv);
  }
});

test('two models at once; requests that arrive while their model loads', async () => {
  const srv = await startServer(['--config', yaml({ max: 3 })], { model: null });
  try {
    // Four requests for beta (not loaded) and two for gamma, all at once: the
    // first of beta's loads it, the others wait for it; gamma answers meanwhile.
    const rs = await Promise.all([
      ask(srv, 'beta', 'tell me about the sea'), ask(srv, 'beta', 'tell me about the sea'),
      ask(srv, 'gamma', 'tell me about the sea'), ask(srv, 'claude-haiku', 'tell me about the sea'),
      ask(srv, 'gamma', 'tell me about the sea'), ask(srv, 'beta', 'tell me about the sea'),
    ]);
    for (const r of rs) assert.equal(r.status, 200, r.text);
    assert.deepEqual(rs.map((r) => r.json.model), ['beta', 'beta', 'gamma', 'beta', 'gamma', 'beta']);
    for (const r of rs) assert.equal(r.json.choices[0].message.content, REF[r.json.model]);
    assert.equal((srv.stderr.match(/beta: loading/g) || []).length, 1, 'beta loaded more than once');
    // /slots: every loaded model's slots, each naming its model; ?model= one's.
    const all = (await getJSON(srv, '/slots')).json;
    assert.deepEqual([...new Set(all.map((s) => s.model))].sort(), ['beta', 'gamma']);
    const g = (await getJSON(srv, '/slots?model=gamma')).json;
    assert.equal(g.length, 2);
    assert.ok(g.every((s) => s.model === 'gamma'));
  } finally {
    await stopOk(srv);
  }
});

const CONV = () => [{ role: 'system', content: 'You answer questions about the sea and ships. '.repeat(8) },
  { role: 'user', content: 'tell me about harbours' }];
const convBody = (model, m) => ({ model, messages: m, max_tokens: 24, temperature: 0 });

test('models load and unload while another one decodes: nothing is cut, nothing changes', async () => {
  const srv = await startServer(['--config', yaml({ max: 2 })], { model: null });
  try {
    // A long reply on gamma (pinned) ...
    const long = { model: 'gamma', messages: msgs('tell me a long story about the sea'), max_tokens: 400,
      temperature: 0, ignore_eos: true };
    const ref = await postJSON(srv, '/v1/chat/completions', long);
    assert.equal(ref.status, 200, ref.text);
    const during = postJSON(srv, '/v1/chat/completions', long);
    // ... while alpha and beta take turns in the other place (each unloads the other).
    const others = [];
    for (let i = 0; i < 6; i++) {
      const r = await ask(srv, i % 2 ? 'beta' : 'alpha', 'tell me about the sea');
      assert.equal(r.status, 200, r.text);
      others.push(r.json);
    }
    const g = await during;
    assert.equal(g.status, 200, g.text);
    assert.equal(g.json.choices[0].message.content, ref.json.choices[0].message.content, 'gamma\'s reply changed');
    assert.equal(g.json.usage.completion_tokens, 400);
    for (const o of others) assert.equal(o.choices[0].message.content, REF[o.model]);
    const m = await metrics(srv);
    assert.ok(m.get('kvstash_model_unloads_total{model="alpha"}') >= 2, 'alpha was not unloaded in between');
    assert.equal(m.get('kvstash_model_unloads_total{model="gamma"}'), 0);
  } finally {
    await stopOk(srv);
  }
});

test('a conversation continues from the store after its model was unloaded and loaded again', async () => {
  // The RAM-only store (the default): a conversation's state is saved when
  // its slot is taken (evict) and when its model is unloaded (unload).
  const cfg = yaml({ extra: 'store: { enabled: false, stride: 16, min_tokens: 32 }\n' });
  const srv = await startServer(['--config', cfg], { model: null });
  try {
    const conv = CONV();
    const t1 = await postJSON(srv, '/v1/chat/completions', convBody('alpha', conv));
    assert.equal(t1.status, 200, t1.text);
    conv.push(t1.json.choices[0].message, { role: 'user', content: 'and lighthouses?' });
    // beta then (gamma is pinned, --models-max 2): alpha is unloaded for it,
    // its slots going to its store (reason unload).
    assert.equal((await ask(srv, 'beta', 'hello')).status, 200);
    assert.equal((await statusOf(srv)).alpha.value, 'unloaded');
    // Turn 2 on alpha, loaded again: its prefix from the store.
    const t2 = await postJSON(srv, '/v1/chat/completions', convBody('alpha', conv));
    assert.equal(t2.status, 200, t2.text);
    const c = t2.json.cache;
    assert.equal(c.mode, 'store', JSON.stringify(c));
    assert.ok(c.cached_tokens >= 0.9 * t1.json.usage.prompt_tokens, JSON.stringify(c));
    assert.ok(c.cached_tokens >= 0.9 * t2.json.usage.prompt_tokens - 24, `less than 90% read: ${JSON.stringify(c)}`);
    const m = await metrics(srv);
    assert.ok(m.get('kvstash_store_saves_total{reason="unload",model="alpha"}') >= 1,
      [...m].filter(([k]) => k.startsWith('kvstash_store_saves_total')).map(([k, v]) => `${k} ${v}`).join('\n'));
    assert.match(srv.stderr, /alpha: unloaded \(least recently used, for beta/);
    // Equal to the uncached reply.
    const ref = await postJSON(srv, '/v1/chat/completions', { ...convBody('alpha', conv), cache_prompt: false });
    assert.equal(ref.status, 200, ref.text);
    assert.equal(ref.json.cache.cached_tokens, 0);
    assert.equal(t2.json.choices[0].message.content, ref.json.choices[0].message.content);
  } finally {
    await stopOk(srv);
  }
});

test('two models never read each other\'s stored states, on shared store directories', async () => {
  const cacheDir = path.join(dir, 'cache'), shmDir = path.join(dir, 'shm');
  const cfg = yaml({ max: 3, extra: `store:\n  enabled: true\n  cache_dir: ${cacheDir}\n  shm_dir: ${shmDir}\n  stride: 16\n  min_tokens: 32\n` });
  const srv = await startServer(['--config', cfg], { model: null });
  try {
    const conv = CONV();
    const a1 = await postJSON(srv, '/v1/chat/completions', convBody('alpha', conv));
    assert.equal(a1.status, 200, a1.text);
    await until(async () => ((await metrics(srv)).get('kvstash_store_saves_total{reason="finish",model="alpha"}') >= 1
      ? true : null), "alpha's finish save", 20000, 25);
    // The same conversation again on alpha: found (in its slot or the store).
    const a2 = await postJSON(srv, '/v1/chat/completions', convBody('alpha', conv));
    assert.ok(a2.json.cache.cached_tokens >= 32, JSON.stringify(a2.json.cache));
    // On beta: the same tokens, another model's weights — nothing of alpha's.
    const b1 = await postJSON(srv, '/v1/chat/completions', convBody('beta', conv));
    assert.equal(b1.status, 200, b1.text);
    assert.equal(b1.json.cache.cached_tokens, 0, `beta read alpha's state: ${JSON.stringify(b1.json.cache)}`);
    const m = await metrics(srv);
    assert.equal(m.get('kvstash_store_hits_total{model="beta"}'), 0);
    assert.ok(m.get('kvstash_store_lookups_total{model="beta"}') >= 1, 'beta looked in its store');
  } finally {
    await stopOk(srv);
  }
});

test('bad configurations exit 2 with a message', async () => {
  const bad = writeConfig(`models:\n  a: { path: ${M.alpha} }\ndefault_model: zzz\n`);
  let r = await runBin(['serve', '--config', bad, '--port', '0']);
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /default_model.*zzz.*none of the models/);
  r = await runBin(['serve', '--models-dir', path.join(dir, 'nope'), '--port', '0']);
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /--models-dir/);
  r = await runBin(['serve', '--models-max', '-3', '--port', '0']);
  assert.equal(r.code, 2, r.stderr);
  const alias = writeConfig(`models:\n  a: { path: ${M.alpha}, aliases: { x: 1 } }\n`);
  r = await runBin(['serve', '--config', alias, '--port', '0']);
  assert.equal(r.code, 2, r.stderr);
});

test('--models-dir: every GGUF of the directory is a model named by its stem', async () => {
  const md = path.join(dir, 'models-dir');
  mkdirSync(path.join(md, 'delta'), { recursive: true });
  copyFileSync(M.alpha, path.join(md, 'first.gguf'));
  copyFileSync(M.beta, path.join(md, 'delta', 'delta-model.gguf'));
  const srv = await startServer(['--models-dir', md, '--default-model', 'first'], { model: null });
  try {
    const ids = (await getJSON(srv, '/v1/models')).json.data.map((m) => m.id);
    assert.deepEqual(ids, ['delta', 'first']);
    const r = await ask(srv, 'delta', 'tell me about the sea');
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices[0].message.content, REF.beta);
    const d = await ask(srv, undefined, 'tell me about the sea');
    assert.equal(d.json.model, 'first');
    assert.equal(d.json.choices[0].message.content, REF.alpha);
  } finally {
    await stopOk(srv);
  }
});

test('-m with a table: the -m model joins it, the top-level projector is its own, a "default" entry lends settings only', async () => {
  const mm = path.join(dir, 'mm.gguf'), proj = path.join(dir, 'mm-mmproj.gguf');
  execFileSync(BIN, ['mkmodel', '--preset', 'tiny', '--seed', '1', '--mmproj', proj, mm], { stdio: 'ignore' });
  // "default" has a path of its own: a model named default, whose settings
  // (ctx) a model without an entry of its own (the -m one) takes, but not
  // its aliases or pin.
  const cfg = writeConfig(`mmproj: ${proj}
models:
  beta: { path: ${M.beta} }
  default: { path: ${M.gamma}, aliases: ["claude-*"], pin: true, ctx: 768 }
models_max: 3
`);
  const srv = await startServer(['--config', cfg, '--alias', 'vision'], { model: mm });
  try {
    const data = (await getJSON(srv, '/v1/models')).json.data;
    assert.deepEqual(data.map((m) => m.id).sort(), ['beta', 'default', 'vision']);
    assert.equal((await ask(srv, 'vision', 'hello')).status, 200);
    assert.equal((await ask(srv, 'beta', 'hello')).status, 200);
    const now = Object.fromEntries((await getJSON(srv, '/v1/models')).json.data.map((m) => [m.id, m]));
    assert.deepEqual(now.vision.architecture.input_modalities, ['text', 'image']);
    assert.deepEqual(now.beta.architecture.input_modalities, ['text'], 'the projector went to another model');
    assert.equal(now.vision.meta.n_ctx_seq, 768, 'the -m model did not take the default entry\'s settings');
    assert.equal(now.beta.meta.n_ctx_seq, 512, 'beta has an entry of its own');
    assert.deepEqual(now.vision.aliases, []);
    assert.equal(now.vision.status.pinned, false);
    assert.equal(now.default.status.pinned, true);
    // "claude-*" is default's alias only
    const r = await ask(srv, 'claude-x', 'hello');
    assert.equal(r.json.model, 'default');
  } finally {
    await stopOk(srv);
  }
});

test('the official OpenAI SDK: models.list() shows the table; a model by alias; an unknown one is its NotFoundError', async () => {
  const OpenAI = (await importClient('openai')).default;
  const srv = await startServer(['--config', yaml({ def: '' })], { model: null });
  try {
    const client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 60000 });
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    assert.deepEqual(ids, ['alpha', 'beta', 'gamma', 'broken']);
    const r = await client.chat.completions.create({ model: 'claude-haiku-4-5', messages: msgs('tell me about the sea'),
      max_tokens: 12, temperature: 0 });
    assert.equal(r.model, 'beta');
    assert.equal(r.choices[0].message.content, REF.beta);
    await assert.rejects(client.chat.completions.create({ model: 'nope', messages: msgs('hi'), max_tokens: 4 }),
      (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  } finally {
    await stopOk(srv);
  }
});
