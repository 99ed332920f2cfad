// kv_quant.test.mjs — quantized KV caches stay exact on the cache paths
// (issue 38): with -ctk/-ctv q8_0/q8_0, q4_0/q4_0 and f16/q8_0 (mixed), a
// reply read from the cache equals the reply of --no-cache-prompt on the same
// types — the same slot (each turn cut inside the previous reply), slot
// copies and the store's tiers for sub-agents on fewer slots, SPC and IMC, a
// restart (the store's disk and shm tiers, and warm start), two hosts
// sharing Redis, a mixture of experts, an image in the KV, a hybrid model's
// checkpoints — and concurrent requests equal sequential ones. The patched CPU
// backend's revision 5 tiles flash attention over quantized K/V
// (docs/LLAMA_FACTS.md); /props says exact. tiny-q4k and tiny-moe: head sizes
// of 64 (quantized K/V blocks of 32 must divide them).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, readFileSync } from 'node:fs';
import { png, chatImage } from './media.mjs';
import os from 'node:os';
import path from 'node:path';
import {
  startServer, stopOk, chat, getJSON, writeStoreConfig, settleStore, replyOf, writeConfig, metrics, startRedis,
  redisHostConfig, alternateHosts, BIN,
} from './lib.mjs';

const Q4K = process.env.KS_TINY_Q4K_MODEL;
const MOE = process.env.KS_TINY_MOE_MODEL;
const TYPES = [['q8_0', 'q8_0'], ['q4_0', 'q4_0'], ['f16', 'q8_0']];
const dirs = [];
after(() => { for (const d of dirs) rmSync(d, { recursive: true, force: true }); });
function tmp(name) {
  const d = mkdtempSync(path.join(os.tmpdir(), `ks-kvq-${name}-`));
  dirs.push(d);
  return d;
}
const kv = ([k, v]) => ['-ctk', k, '-ctv', v];
const storeConfig = (dir) => writeStoreConfig(path.join(dir, 'store.yaml'),
  { cacheDir: path.join(dir, 'disk'), shmDir: path.join(dir, 'shm'), minTokens: 16, stride: 16 });

const system = { role: 'system', content: 'You are a helpful assistant who answers in short sentences.' };
const questions = ['hello, what is the water like in the river?', 'tell me a story about a dog',
  'why did the dog run to the river?', 'and then what happened', 'describe the river in three words'];
const backOf = (text) => (text.length > 1 ? text.slice(0, -1) : text);

// One turn on the cached server and on the uncached one (same types): the same reply.
async function both(srv, ref, msgs, what, max = 16) {
  const a = await chat(srv, msgs, { max_tokens: max, temperature: 0 });
  const b = await chat(ref, msgs, { max_tokens: max, temperature: 0 });
  assert.deepEqual(a.choices[0].message, b.choices[0].message, `${what}: reply differs from --no-cache-prompt`);
  assert.equal(a.usage.completion_tokens, b.usage.completion_tokens, `${what}: completion_tokens`);
  assert.equal(b.usage.prompt_tokens_details.cached_tokens, 0, `${what}: --no-cache-prompt cached`);
  return a;
}

for (const t of TYPES) {
  const name = `${t[0]}/${t[1]}`;
  test(`${name}: exact in /props; a chat cut inside each reply equals --no-cache-prompt; concurrent equals sequential`, async () => {
    const cached = await startServer(['-m', Q4K, '--ctx', '1024', ...kv(t)]);
    const uncached = await startServer(['-m', Q4K, '--ctx', '1024', '--no-cache-prompt', ...kv(t)]);
    try {
      const p = (await getJSON(cached, '/props')).json.kvstash;
      assert.deepEqual([p.cache_type_k, p.cache_type_v, p.exact_mode], [t[0], t[1], 'batch-invariant']);
      const msgs = [system];
      let prev = null;
      for (let i = 0; i < questions.length; i++) {
        msgs.push({ role: 'user', content: questions[i] });
        const a = await both(cached, uncached, msgs, `${name} turn ${i + 1}`, 24);
        if (prev) assert.ok(a.usage.prompt_tokens_details.cached_tokens >= prev.usage.prompt_tokens - 1,
          `${name} turn ${i + 1}: not from the slot (${JSON.stringify(a.cache)})`);
        prev = a;
        msgs.push({ role: 'assistant', content: backOf(replyOf(a)) });
      }
      // Two requests at once (one batch) equal each alone.
      const bodies = questions.slice(0, 2).map((q) => [system, { role: 'user', content: `${q} Answer at length.` }]);
      const alone = [];
      for (const m of bodies) alone.push(await chat(uncached, m, { max_tokens: 32, temperature: 0 }));
      const together = await Promise.all(bodies.map((m) => chat(cached, m, { max_tokens: 32, temperature: 0,
        cache_prompt: false })));
      together.forEach((r, i) => assert.deepEqual(r.choices[0].message, alone[i].choices[0].message,
        `${name}: request ${i + 1} in a batch differs from alone`));
    } finally {
      await stopOk(cached);
      await stopOk(uncached);
    }
  });

  test(`${name}: sub-agents on fewer slots come back from a copy or the store; SPC and IMC; replies equal`, async () => {
    const cfg = await storeConfig(tmp('sub'));
    const cached = await startServer(['-m', Q4K, '--ctx', '1024', '--slots', '2', '--config', cfg, '--spc', '--imc',
      ...kv(t)]);
    const uncached = await startServer(['-m', Q4K, '--ctx', '1024', '--no-cache-prompt', ...kv(t)]);
    try {
      const shared = { role: 'system', content: 'You are one of three sub-agents; you answer in short sentences. '.repeat(3) };
      const convs = [0, 1, 2].map(() => [shared]);
      const modes = new Set();
      for (let turn = 0; turn < 3; turn++) {
        for (let k = 0; k < convs.length; k++) {
          const msgs = convs[k];
          msgs.push({ role: 'user', content: `${questions[(turn + k) % questions.length]} (agent ${k})` });
          const a = await both(cached, uncached, msgs, `${name} agent ${k} turn ${turn + 1}`);
          modes.add(a.cache.mode);
          msgs.push({ role: 'assistant', content: backOf(replyOf(a)) });
        }
      }
      assert.ok(['store', 'copy', 'spc'].some((m) => modes.has(m)), `${name}: nothing restored: ${[...modes]}`);
      await settleStore(cached);
    } finally {
      await stopOk(cached);
      await stopOk(uncached);
    }
  });
}

test('q8_0/q8_0: a restarted server restores the conversation from the store (and warm start), replies equal', async () => {
  const t = ['q8_0', 'q8_0'];
  const cfg = await storeConfig(tmp('restart'));
  // the same store, and a slot filled from it at start (warm start)
  const warm = writeConfig(readFileSync(cfg, 'utf8').replace('store:\n', 'store:\n  warm_slots: 1\n'));
  const uncached = await startServer(['-m', Q4K, '--ctx', '1024', '--no-cache-prompt', ...kv(t)]);
  try {
    const msgs = [system];
    for (let turn = 0; turn < 3; turn++) {
      // turn 2: warm start (the slot filled from the store before the request)
      const args = ['-m', Q4K, '--ctx', '1024', '--slots', '1', '--config', turn === 2 ? warm : cfg, ...kv(t)];
      const srv = await startServer(args);
      try {
        msgs.push({ role: 'user', content: `${questions[turn]} ${'Tell me more about the river and the dog. '.repeat(4)}` });
        const a = await both(srv, uncached, msgs, `restart turn ${turn + 1}`);
        if (turn === 1) assert.equal(a.cache.mode, 'store', `restart turn 2: ${JSON.stringify(a.cache)}`);
        if (turn > 0) assert.ok(a.cache.cached_tokens > 32, `restart turn ${turn + 1}: ${JSON.stringify(a.cache)}`);
        if (turn === 2) {
          assert.match(srv.stderr, /warm start: slot 0 holds \d+ tokens/);
          assert.notEqual(a.cache.mode, 'store', `warm start: the slot held it already: ${JSON.stringify(a.cache)}`);
        }
        msgs.push({ role: 'assistant', content: backOf(replyOf(a)) });
        await settleStore(srv);
      } finally {
        await stopOk(srv);
      }
    }
  } finally {
    await stopOk(uncached);
  }
});

test('tiny-moe with q8_0/q8_0: a chat equals --no-cache-prompt', async () => {
  const t = ['q8_0', 'q8_0'];
  const cached = await startServer(['-m', MOE, '--ctx', '1024', ...kv(t)]);
  const uncached = await startServer(['-m', MOE, '--ctx', '1024', '--no-cache-prompt', ...kv(t)]);
  try {
    assert.equal((await getJSON(cached, '/props')).json.kvstash.exact_mode, 'batch-invariant');
    const msgs = [system];
    for (let i = 0; i < 4; i++) {
      msgs.push({ role: 'user', content: questions[i] });
      const a = await both(cached, uncached, msgs, `moe turn ${i + 1}`, 24);
      msgs.push({ role: 'assistant', content: backOf(replyOf(a)) });
    }
  } finally {
    await stopOk(cached);
    await stopOk(uncached);
  }
});

test('q8_0/q8_0: turns alternate between two hosts sharing Redis, replies equal --no-cache-prompt', async () => {
  const t = ['q8_0', 'q8_0'];
  const root = tmp('redis');
  const redis = await startRedis(root);
  const servers = [];
  try {
    for (const h of ['a', 'b'])
      servers.push(await startServer(['-m', Q4K, '--ctx', '1024', '--slots', '1',
        '--config', await redisHostConfig(root, h, redis.sock, 'kvs-q8'), ...kv(t)]));
    const uncached = await startServer(['-m', Q4K, '--ctx', '1024', '--no-cache-prompt', ...kv(t)]);
    servers.push(uncached);
    await alternateHosts(servers, [system], questions.slice(0, 4), (srv, msgs, what) => both(srv, uncached, msgs, what));
    assert.equal((await metrics(servers[1])).get('kvstash_store_redis_errors_total'), 0);
  } finally {
    for (const s of servers) await stopOk(s);
    redis.kill();
  }
});

test('q8_0/q8_0 with an image in the KV: a conversation about it equals --no-cache-prompt; a restart restores it', async () => {
  const t = ['q8_0', 'q8_0'];
  const d = tmp('media');
  const model = path.join(d, 'q4k-mm.gguf'), proj = path.join(d, 'q4k-mmproj.gguf');
  execFileSync(BIN, ['mkmodel', '--preset', 'tiny-q4k', '--seed', '1', '--mmproj', proj, model], { stdio: 'ignore' });
  const cfg = await storeConfig(d);
  const uncached = await startServer(['-m', model, '--mmproj', proj, '--ctx', '1024', '--no-cache-prompt', ...kv(t)]);
  try {
    const msgs = [system, { role: 'user', content: [{ type: 'text', text: 'what is in this picture?' }, chatImage(png(64, 64, 3))] }];
    for (let run = 0; run < 2; run++) {
      // run 1: a fresh server, then its turns from the slot; run 2: after a restart, from the store
      const srv = await startServer(['-m', model, '--mmproj', proj, '--ctx', '1024', '--slots', '1', '--config', cfg,
        ...kv(t)]);
      try {
        for (let turn = 0; turn < 2; turn++) {
          const what = `media run ${run + 1} turn ${turn + 1}`;
          const a = await both(srv, uncached, msgs, what);
          if (run === 1 && turn === 0) assert.equal(a.cache.mode, 'store', `${what}: ${JSON.stringify(a.cache)}`);
          if (turn === 1) assert.ok(a.usage.prompt_tokens_details.cached_tokens > 64, `${what}: ${JSON.stringify(a.cache)}`);
          msgs.push({ role: 'assistant', content: backOf(replyOf(a)) }, { role: 'user', content: `and more? (${run}${turn})` });
        }
        await settleStore(srv);
      } finally {
        await stopOk(srv);
      }
    }
  } finally {
    await stopOk(uncached);
  }
});

test('tiny-hybrid-h64 with q8_0/q8_0: turns cut inside the reply go back to a checkpoint, replies equal', async () => {
  const t = ['q8_0', 'q8_0'];
  const model = process.env.KS_TINY_HYBRID_H64_MODEL;
  assert.ok(model, 'KS_TINY_HYBRID_H64_MODEL is not set (run through ctest)');
  const cached = await startServer(['-m', model, '--ctx', '1024', ...kv(t)]);
  const uncached = await startServer(['-m', model, '--ctx', '1024', '--no-cache-prompt', ...kv(t)]);
  try {
    assert.equal((await getJSON(cached, '/props')).json.kvstash.exact_mode, 'batch-invariant');
    const msgs = [system];
    let checkpoints = 0;
    for (let i = 0; i < 4; i++) {
      msgs.push({ role: 'user', content: questions[i] });
      const a = await both(cached, uncached, msgs, `hybrid turn ${i + 1}`, 24);
      if (/^checkpoint-at-token-/.test(a.cache.reason || '')) checkpoints++;
      // the reply goes back without its last words: the next prompt diverges
      // inside what the slot holds, which a hybrid memory cannot cut there
      const words = replyOf(a).split(' ');
      msgs.push({ role: 'assistant', content: words.slice(0, Math.max(1, words.length - 3)).join(' ') });
    }
    assert.ok(checkpoints > 0, 'no turn went back to a checkpoint');
  } finally {
    await stopOk(cached);
    await stopOk(uncached);
  }
});
