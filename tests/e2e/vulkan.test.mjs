// vulkan.test.mjs — every cache path over device memory, in CI without a GPU:
// `kvstash serve` with all layers and the KV on a Vulkan device (setup's
// Vulkan module, build/deps/vulkan/, on Mesa's software device llvmpipe;
// docs/ARCHITECTURE.md "Devices"). Same-slot reuse, slot copies (n > 1), the
// system prompt cache, saves and restores through the ram, shm and disk
// tiers, and a restart from the store, each checked by its cached-token
// counts and cache modes. Vulkan's kernels are not batch-invariant, so the
// server says exact mode is unavailable and replies are not compared with
// uncached ones there; where exact mode is claimed (the Vulkan module loaded
// but the model on the CPU, -ngl 0) they are. /props and the listening line
// say where the model runs; exact mode keeps op offload off when layers stay
// on the CPU.
//
// Without the Vulkan module (setup with KS_GPU=none) or Vulkan's loader and
// Mesa's drivers, the test prints "SKIP: ..." and CTest counts it as skipped.
// Mesa's shader cache lives in build/mesa-shader-cache (MESA_SHADER_CACHE_DIR,
// set by CMake), shared by every build tree: cold, each new pipeline costs its
// LLVM compile (~4 min in all here; under ASan's allocator ~10x that).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import {
  startServer, stopOk, chat, getJSON, postJSON, metrics, writeConfig, writeStoreConfig, settleStore, replyOf,
  assertSameReply, mdelta,
} from './lib.mjs';

const MODULE = process.env.KS_VULKAN_MODULE;
const LIBVULKAN = ['/usr/lib/x86_64-linux-gnu/libvulkan.so.1', '/usr/lib/aarch64-linux-gnu/libvulkan.so.1',
  '/usr/lib64/libvulkan.so.1'].find((f) => existsSync(f));
const LAVAPIPE = ['/usr/share/vulkan/icd.d', '/etc/vulkan/icd.d'].some((d) =>
  existsSync(path.join(d, 'lvp_icd.x86_64.json')) || existsSync(path.join(d, 'lvp_icd.aarch64.json')));
const SKIP = !MODULE || !existsSync(MODULE)
  ? `SKIP: no Vulkan module (${MODULE || 'KS_VULKAN_MODULE unset'}; scripts/setup.sh installs it unless KS_GPU=none)`
  : !LIBVULKAN || !LAVAPIPE
    ? 'SKIP: no Vulkan loader or no Mesa lavapipe (apt-get install libvulkan1 mesa-vulkan-drivers; setup does)'
    : false;
if (SKIP) console.log(SKIP);

// The module, and llvmpipe (a CPU-type device ggml-vulkan uses only when named),
// rendering on one thread (LP_NUM_THREADS): ctest runs another test beside it,
// and the tiny model gains nothing from more (measured: 21 s either way).
const VK_ENV = { KS_GPU_MODULES: MODULE ?? '', GGML_VK_VISIBLE_DEVICES: '0', LP_NUM_THREADS: '1' };
const ALL = ['-ngl', 'all', '--ctx', '1024'];
const vk = (args, opts = {}) => startServer(args, { timeoutMs: 180000, ...opts, env: { ...VK_ENV, ...(opts.env ?? {}) } });

let root;
before(() => { root = mkdtempSync(path.join(tmpdir(), 'kvstash-e2e-vk-')); });
after(() => { if (root) rmSync(root, { recursive: true, force: true }); });

const sys = (topic, n = 4) => ({
  role: 'system',
  content: `${topic}: you are a careful assistant who answers briefly and checks every fact twice. `.repeat(n),
});
const cached = (r) => r.usage.prompt_tokens_details.cached_tokens;

test('all layers and the KV on Vulkan0: /props, the listening line, same-slot reuse, n=2 slot copies', { skip: SKIP, timeout: 600000 }, async () => {
  const srv = await vk([...ALL, '--slots', '2']);
  try {
    assert.match(srv.stderr, /kvstash: listening on .*\(model .+, 2 slots, ctx 1024, 3\/3 layers on Vulkan0, KV on Vulkan0, exact: unavailable \(Vulkan0 kernels are not batch-invariant/);
    assert.match(srv.stderr, / W serve +exact output is unavailable on 3\/3 layers on Vulkan0/);
    const p = (await getJSON(srv, '/props')).json.kvstash;
    assert.equal(p.exact, true);
    assert.equal(p.exact_mode, 'unavailable');
    assert.match(p.exact_reason, /^Vulkan0 kernels are not batch-invariant/);
    assert.equal(p.flash_attn, true, 'auto: on with a GPU in use');
    assert.deepEqual(p.gpu_backends, ['node-llama-cpp-3.22.1-vulkan']);
    const o = p.offload;
    assert.equal(o.layers, 3, 'tiny: 2 layers and the output layer');
    assert.equal(o.gpu_layers, 3);
    assert.equal(o.kv, 'Vulkan0');
    assert.equal(o.kv_offload, true);
    assert.equal(o.split_mode, 'layer');
    assert.equal(o.devices.length, 1);
    assert.equal(o.devices[0].name, 'Vulkan0');
    assert.match(o.devices[0].description, /llvmpipe/);
    assert.equal(o.devices[0].layers, 3);
    assert.equal(o.devices[0].kv, true);

    // Same slot: each turn reuses the previous prompt and reply.
    const msgs = [sys('Rivers'), { role: 'user', content: 'What is a river delta?' }];
    const t1 = await chat(srv, msgs, { max_tokens: 12 });
    assert.equal(t1.cache.mode, 'miss');
    msgs.push({ role: 'assistant', content: replyOf(t1) }, { role: 'user', content: 'And an estuary?' });
    const t2 = await chat(srv, msgs, { max_tokens: 12 });
    assert.equal(t2.cache.slot, t1.cache.slot);
    assert.ok(cached(t2) >= t1.usage.prompt_tokens, `turn 2 cached ${cached(t2)} < turn 1's prompt ${t1.usage.prompt_tokens}`);
    assert.equal(t2.timings.prompt_n, t2.usage.prompt_tokens - cached(t2));

    // n = 2: the second choice copies the first one's prompt from its slot
    // (state get on the device, set into the other slot).
    const m0 = await metrics(srv);
    const r = await postJSON(srv, '/v1/chat/completions', {
      messages: [sys('Gardens'), { role: 'user', content: 'Name a flower.' }], n: 2, max_tokens: 8, temperature: 0,
    });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.choices.length, 2);
    const m1 = await metrics(srv);
    const copied = mdelta(m0, m1, 'kvstash_slot_copied_tokens_total');
    assert.ok(copied >= r.json.usage.prompt_tokens / 2 - 1, `copied ${copied} tokens of a ${r.json.usage.prompt_tokens / 2}-token prompt`);
    assert.equal(mdelta(m0, m1, 'kvstash_cache_decisions_total{decision="copy"}'), 1);
  } finally {
    await stopOk(srv);
  }
});

test('SPC on Vulkan0: the system prompt is decoded once and restored into the other slot', { skip: SKIP, timeout: 600000 }, async () => {
  const cfg = writeConfig('affinity_min: 0.99\nmodels:\n  default:\n    cache_min_tokens: 16\n');
  const srv = await vk([...ALL, '--slots', '2', '--spc', '--config', cfg]);
  try {
    const s = sys('Shop', 3);
    const r1 = await chat(srv, [s, { role: 'user', content: 'how do I plant tulips' }], { max_tokens: 8 });
    const r2 = await chat(srv, [s, { role: 'user', content: 'which soil for roses' }], { max_tokens: 8 });
    assert.equal(r1.cache.mode, 'miss');
    assert.equal(r2.cache.mode, 'spc', JSON.stringify(r2.cache));
    assert.notEqual(r2.cache.slot, r1.cache.slot);
    assert.ok(cached(r2) > 16, `SPC restored ${cached(r2)} tokens`);
    const m = await metrics(srv);
    assert.equal(m.get('kvstash_spc_builds_total'), 1);
    assert.equal(m.get('kvstash_sys_prompt_prefills_total'), 1);
  } finally {
    await stopOk(srv);
  }
});

// A turn of A, of B (which takes A's one slot over), and A's next turn: A's
// first turn comes back from the store.
async function takeover(srv, settle = true) {
  const a = [sys('Astronomy'), { role: 'user', content: 'What is a comet?' }];
  const a1 = await chat(srv, a, { max_tokens: 8 });
  if (settle) await settleStore(srv);
  const b = [sys('Gardening'), { role: 'user', content: 'When do I plant tulips?' }];
  const b1 = await chat(srv, b, { max_tokens: 8 });
  if (settle) await settleStore(srv);
  a.push({ role: 'assistant', content: replyOf(a1) }, { role: 'user', content: 'And what is a meteor?' });
  const a2 = await chat(srv, a, { max_tokens: 8 });
  assert.equal(b1.cache.slot, a1.cache.slot, 'premise: one slot, B took it over');
  assert.ok(cached(b1) < 32, `premise: B shares only the header with A (${JSON.stringify(b1.cache)})`);
  return { a, a1, a2 };
}

test('store tiers on Vulkan0: ram, shm, disk, and disk after a restart', { skip: SKIP, timeout: 600000 }, async () => {
  // ram: the default RAM-only store
  const ram = await vk([...ALL, '--slots', '1', '--config', writeConfig('store:\n  enabled: false\n  min_tokens: 16\n  stride: 16\n')]);
  try {
    const { a1, a2 } = await takeover(ram);
    assert.equal(a2.cache.mode, 'store', JSON.stringify(a2.cache));
    assert.equal(a2.cache.tier, 'ram');
    assert.ok(cached(a2) >= a1.usage.prompt_tokens, `ram: cached ${cached(a2)} < ${a1.usage.prompt_tokens}`);
  } finally {
    await stopOk(ram);
  }

  // shm: the full store without a ram tier, finish saves to shm
  const dirs = { cacheDir: path.join(root, 'disk'), shmDir: path.join(root, 'shm') };
  const shmCfg = await writeStoreConfig(path.join(root, 'shm.yaml'), {
    ...dirs, stride: 16, minTokens: 16, tiers: { ram: 0 }, reasons: { cold: 'none', continued: 'none', finish: 'shm' },
  });
  const shm = await vk([...ALL, '--slots', '1', '--config', shmCfg]);
  try {
    const { a1, a2 } = await takeover(shm);
    assert.equal(a2.cache.mode, 'store', JSON.stringify(a2.cache));
    assert.equal(a2.cache.tier, 'shm');
    assert.ok(cached(a2) >= a1.usage.prompt_tokens - 16, `shm: cached ${cached(a2)} vs ${a1.usage.prompt_tokens}`);
  } finally {
    await stopOk(shm);
  }

  // disk: neither ram nor shm, finish saves to disk; then a new process
  // continues the conversation from the disk tier
  const diskDirs = { cacheDir: path.join(root, 'disk2'), shmDir: path.join(root, 'shm2') };
  const diskCfg = await writeStoreConfig(path.join(root, 'disk.yaml'), {
    ...diskDirs, stride: 16, minTokens: 16, tiers: { ram: 0, shm: 0 },
    reasons: { cold: 'none', continued: 'none', finish: 'disk' },
  });
  let conv;
  const a = await vk([...ALL, '--slots', '1', '--config', diskCfg]);
  try {
    const { a: msgs, a1, a2 } = await takeover(a);
    assert.equal(a2.cache.mode, 'store', JSON.stringify(a2.cache));
    assert.equal(a2.cache.tier, 'disk');
    assert.ok(cached(a2) >= a1.usage.prompt_tokens - 16, `disk: cached ${cached(a2)} vs ${a1.usage.prompt_tokens}`);
    msgs.push({ role: 'assistant', content: replyOf(a2) });
    conv = { msgs, prompt: a2.usage.prompt_tokens };
    await settleStore(a);
  } finally {
    await stopOk(a);
  }
  const b = await vk([...ALL, '--slots', '1', '--config', diskCfg]);
  try {
    conv.msgs.push({ role: 'user', content: 'Thanks, bye.' });
    const r = await chat(b, conv.msgs, { max_tokens: 8 });
    assert.equal(r.cache.mode, 'store', JSON.stringify(r.cache));
    assert.equal(r.cache.tier, 'disk');
    assert.ok(cached(r) >= conv.prompt - 16, `restart: cached ${cached(r)} < ${conv.prompt} - a stride`);
    const m = await metrics(b);
    assert.equal(m.get('kvstash_store_corrupt_files_total'), 0);
  } finally {
    await stopOk(b);
  }
});

test('layers on the CPU beside a Vulkan device: op offload off in exact mode; -ngl 0 is exact and replies equal cache_prompt:false', { skip: SKIP, timeout: 600000 }, async () => {
  // -ngl 1: the output layer on Vulkan0, both blocks on the CPU
  const part = await vk(['-ngl', '1', '--ctx', '1024', '--slots', '1']);
  try {
    const p = (await getJSON(part, '/props')).json.kvstash;
    assert.equal(p.offload.gpu_layers, 1);
    assert.equal(p.offload.kv, 'CPU', 'the KV of CPU layers stays on the CPU');
    assert.equal(p.offload.op_offload, false, 'exact mode: no CPU layer prefills on the GPU');
    assert.equal(p.exact_mode, 'unavailable');
    assert.match(part.stderr, /1\/3 layers on Vulkan0 \(2 on the CPU\), KV on CPU, exact: unavailable/);
  } finally {
    await stopOk(part);
  }
  // --no-exact -ngl 0: llama.cpp's op offload sends big prefills to the device
  const op = await vk(['-ngl', '0', '--no-exact', '--ctx', '1024', '--slots', '1']);
  try {
    const p = (await getJSON(op, '/props')).json.kvstash;
    assert.equal(p.offload.gpu_layers, 0);
    assert.equal(p.offload.op_offload, true);
    assert.equal(p.exact_mode, 'off');
    assert.match(op.stderr, /0\/3 layers on the GPU, op offload to Vulkan0, exact: off\)/);
  } finally {
    await stopOk(op);
  }
  // -ngl 0 in exact mode: the CPU alone, exact; a cached turn equals an uncached one
  const cpu = await vk(['-ngl', '0', '--ctx', '1024', '--slots', '1']);
  try {
    const p = (await getJSON(cpu, '/props')).json.kvstash;
    assert.equal(p.offload.devices.length, 0);
    assert.equal(p.exact_mode, 'batch-invariant');
    assert.equal(p.exact_reason, undefined);
    assert.match(cpu.stderr, /ctx 1024, CPU, exact: batch-invariant\)/);
    const msgs = [sys('Rivers'), { role: 'user', content: 'What is a river delta?' }];
    const t1 = await chat(cpu, msgs, { max_tokens: 12 });
    msgs.push({ role: 'assistant', content: replyOf(t1) }, { role: 'user', content: 'And an estuary?' });
    const t2 = await chat(cpu, msgs, { max_tokens: 12 });
    assert.ok(cached(t2) > 0);
    assertSameReply(t2, await chat(cpu, msgs, { max_tokens: 12, cache_prompt: false }), 'turn 2');
  } finally {
    await stopOk(cpu);
  }
});

// What landed after the GPU work (issues 36-38), on device memory: drafts
// verified and dropped from a device KV, a draft model on the device whose
// own KV goes through the store, quantized K/V on the device through the
// store and a restart, and models loaded and unloaded again with their
// states kept. Vulkan is not batch-invariant (the first test), so replies
// are not compared with other runs' here; what the device path must keep is
// the bookkeeping: every token of a turn that drafted is reused by the next.
const SPEC = ['--spec-type', 'ngram-simple', '--spec-ngram-simple-size-n', '3', '--spec-ngram-simple-size-m', '16',
  '--no-spec-adaptive'];

test('speculative decoding on Vulkan0: n-gram drafts and a draft model on the device; its KV from the store', { skip: SKIP, timeout: 600000 }, async () => {
  const ng = await vk([...ALL, '--slots', '1', ...SPEC]);
  try {
    const sp = (await getJSON(ng, '/props')).json.kvstash.speculative;
    assert.equal(sp.type, 'ngram-simple');
    assert.equal(sp.active, true);
    assert.equal(sp.exact, false, 'Vulkan: only as exact as a prefill');
    const msgs = [sys('Tides'), { role: 'user', content: 'Describe the tides.' }];
    const t1 = await chat(ng, msgs, { max_tokens: 72, ignore_eos: true });
    assert.equal(t1.usage.completion_tokens, 72);
    assert.ok(t1.timings.draft_n > 0 && t1.timings.draft_n_accepted > 0, JSON.stringify(t1.timings));
    assert.ok(t1.timings.draft_n_accepted < t1.timings.draft_n, `premise: some drafted rows were rejected (${JSON.stringify(t1.timings)})`);
    // The rejected rows left the device KV and the slot's tokens: the next
    // turn reuses all of the first one (prompt and reply but its last token).
    msgs.push({ role: 'assistant', content: replyOf(t1) }, { role: 'user', content: 'And the waves?' });
    const t2 = await chat(ng, msgs, { max_tokens: 8 });
    assert.equal(t2.cache.slot, t1.cache.slot);
    assert.ok(cached(t2) >= t1.usage.prompt_tokens + 71, `turn 2 cached ${cached(t2)} < ${t1.usage.prompt_tokens} + 71`);
    const m = await metrics(ng);
    assert.ok(m.get('kvstash_draft_accepted_total') > 0);
  } finally {
    await stopOk(ng);
  }

  // A draft model with its layers on the device (-ngld all), one slot, the
  // RAM store: a conversation taken over by another comes back with the
  // draft model's sequence read from the draft's store (state set on the device).
  const TARGET = process.env.KS_TINY_TARGET_MODEL, DRAFT = process.env.KS_TINY_DRAFT_MODEL;
  const md = await vk(['-m', TARGET, '-md', DRAFT, '-ngl', 'all', '-ngld', 'all', '--no-spec-adaptive', '--ctx', '1024',
    '--slots', '1', '--config', writeConfig('store:\n  enabled: false\n  min_tokens: 16\n  stride: 16\n')], { model: null });
  try {
    assert.equal((await getJSON(md, '/props')).json.kvstash.speculative.type, 'draft-simple');
    assert.match(md.stderr, /draft model kvstash-tiny-draft .*, 1 slots, \d+\/\d+ layers on Vulkan0, KV on Vulkan0/);
    const a = [sys('Astronomy', 6), { role: 'user', content: 'What is a comet?' }];
    const a1 = await chat(md, a, { max_tokens: 24, ignore_eos: true });
    assert.ok(a1.timings.draft_n_accepted > 0, `the pair agrees by construction: ${JSON.stringify(a1.timings)}`);
    await settleStore(md);
    const b1 = await chat(md, [sys('Gardening', 6), { role: 'user', content: 'When do I plant tulips?' }], { max_tokens: 24, ignore_eos: true });
    assert.equal(b1.cache.slot, a1.cache.slot, 'premise: one slot, B took it over');
    await settleStore(md);
    const m0 = await metrics(md);
    a.push({ role: 'assistant', content: replyOf(a1) }, { role: 'user', content: 'And a meteor?' });
    const a2 = await chat(md, a, { max_tokens: 24, ignore_eos: true });
    const m1 = await metrics(md);
    assert.equal(a2.cache.mode, 'store', JSON.stringify(a2.cache));
    const restored = mdelta(m0, m1, 'kvstash_draft_model_restored_tokens_total');
    const prefilled = mdelta(m0, m1, 'kvstash_draft_model_prefill_tokens_total');
    const fresh = a2.usage.prompt_tokens - cached(a2);
    assert.ok(restored >= a1.usage.prompt_tokens - 16, `the draft model restored ${restored} tokens`);
    assert.ok(prefilled <= fresh + 1, `the draft model prefilled ${prefilled} tokens for ${fresh} new ones`);
    assert.ok(a2.timings.draft_n_accepted > 0, JSON.stringify(a2.timings));
  } finally {
    await stopOk(md);
  }
});

test('quantized K/V on Vulkan0: -ctk/-ctv q8_0 through the disk tier and a restart; an F16 server does not take the state', { skip: SKIP, timeout: 600000 }, async () => {
  const Q4K = process.env.KS_TINY_Q4K_MODEL; // heads of 64: quantized K/V blocks of 32 divide them
  const dirs = { cacheDir: path.join(root, 'q8-disk'), shmDir: path.join(root, 'q8-shm') };
  const cfg = await writeStoreConfig(path.join(root, 'q8.yaml'), {
    ...dirs, stride: 16, minTokens: 16, tiers: { ram: 0, shm: 0 }, reasons: { cold: 'none', continued: 'none', finish: 'disk' },
  });
  const Q8 = ['-m', Q4K, '-ngl', 'all', '--ctx', '1024', '--slots', '1', '--config', cfg];
  const msgs = [sys('Harbours', 6), { role: 'user', content: 'What is a breakwater?' }];
  let t1, t2;
  const a = await vk([...Q8, '-ctk', 'q8_0', '-ctv', 'q8_0'], { model: null });
  try {
    const p = (await getJSON(a, '/props')).json.kvstash;
    assert.equal(p.cache_type_k, 'q8_0');
    assert.equal(p.cache_type_v, 'q8_0');
    assert.equal(p.flash_attn, true);
    assert.equal(p.offload.kv, 'Vulkan0');
    assert.equal(p.exact_mode, 'unavailable');
    t1 = await chat(a, msgs, { max_tokens: 12 });
    assert.equal(t1.cache.mode, 'miss');
    msgs.push({ role: 'assistant', content: replyOf(t1) }, { role: 'user', content: 'And a jetty?' });
    t2 = await chat(a, msgs, { max_tokens: 12 });
    assert.ok(cached(t2) >= t1.usage.prompt_tokens, `same slot: cached ${cached(t2)}`);
    await settleStore(a);
  } finally {
    await stopOk(a);
  }
  // An F16 server on the same store: the q8_0 state is not restored, and the miss says why.
  msgs.push({ role: 'assistant', content: replyOf(t2) }, { role: 'user', content: 'Thanks.' });
  const f = await vk(Q8, { model: null });
  try {
    const r = await chat(f, msgs, { max_tokens: 4 });
    assert.equal(cached(r), 0, JSON.stringify(r.cache));
    assert.match(r.cache.reason, /^stored-with-kv-q8_0\/q8_0/, JSON.stringify(r.cache));
  } finally {
    await stopOk(f);
  }
  // A q8_0 server again (a new process): the state comes back from the disk tier onto the device.
  const b = await vk([...Q8, '-ctk', 'q8_0', '-ctv', 'q8_0'], { model: null });
  try {
    const r = await chat(b, msgs, { max_tokens: 4 });
    assert.equal(r.cache.mode, 'store', JSON.stringify(r.cache));
    assert.equal(r.cache.tier, 'disk');
    assert.ok(cached(r) >= t1.usage.prompt_tokens, `restart: cached ${cached(r)} < ${t1.usage.prompt_tokens}`);
    assert.equal((await metrics(b)).get('kvstash_store_corrupt_files_total'), 0);
  } finally {
    await stopOk(b);
  }
});

test('several models on Vulkan0: one loaded at a time, a conversation back from the store after its model was unloaded', { skip: SKIP, timeout: 600000 }, async () => {
  const cfg = writeConfig(`models:
  alpha: { path: ${process.env.KS_TINY_MODEL} }
  beta: { path: ${process.env.KS_TINY_Q4K_MODEL} }
models_max: 1
store: { enabled: false, stride: 16, min_tokens: 16 }
`);
  const srv = await vk(['-ngl', 'all', '--ctx', '1024', '--slots', '1', '--config', cfg], { model: null });
  try {
    const ask = (model, messages) => postJSON(srv, '/v1/chat/completions', { model, messages, max_tokens: 8, temperature: 0 });
    const conv = [sys('Lighthouses', 6), { role: 'user', content: 'Why are lighthouses tall?' }];
    const t1 = await ask('alpha', conv);
    assert.equal(t1.status, 200, t1.text);
    assert.equal((await ask('beta', [{ role: 'user', content: 'hello' }])).status, 200);
    const st = Object.fromEntries((await getJSON(srv, '/v1/models')).json.data.map((x) => [x.id, x.status.value]));
    assert.equal(st.alpha, 'unloaded', JSON.stringify(st));
    assert.equal(st.beta, 'loaded', JSON.stringify(st));
    assert.match(srv.stderr, /alpha: unloaded \(least recently used, for beta/);
    conv.push(t1.json.choices[0].message, { role: 'user', content: 'And who keeps them?' });
    const t2 = await ask('alpha', conv);
    assert.equal(t2.status, 200, t2.text);
    assert.equal(t2.json.cache.mode, 'store', JSON.stringify(t2.json.cache));
    assert.ok(t2.json.cache.cached_tokens >= t1.json.usage.prompt_tokens, JSON.stringify(t2.json.cache));
    const p = (await getJSON(srv, '/props?model=alpha')).json.kvstash;
    assert.equal(p.offload.kv, 'Vulkan0');
  } finally {
    await stopOk(srv);
  }
});
