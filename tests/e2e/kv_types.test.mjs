// kv_types.test.mjs — the KV cache's types (issue 38, its first part):
// llama-server's -ctk/-ctv (and --cache-type-k/-v, YAML cache_type_k/v) set
// the engine's K and V types; /props names them and the exact status; a
// quantized V turns flash attention on (llama.cpp needs it), exact with the
// patched CPU backend's revision 5 (kv_quant.test.mjs: every cache path); a state saved under one type is never restored into a context of
// another (the types are in every entry's identity): the miss says so in
// cache.reason, and `kvstash cache ls/verify` name each entry's types; bad input exits 2
// naming the flag. The tiny-q4k model: a head size of 64 (quantized K/V
// blocks of 32 must divide it; the tiny model's 16 does not).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import {
  startServer, stopOk, postJSON, getJSON, writeConfig, writeStoreConfig, settleStore, metrics, MODEL, BIN,
} from './lib.mjs';

const Q4K = process.env.KS_TINY_Q4K_MODEL;
const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-kvtypes-'));
after(() => rmSync(dir, { recursive: true, force: true }));
const ask = (srv, content) => postJSON(srv, '/v1/chat/completions',
  { messages: [{ role: 'system', content: 'You answer briefly. '.repeat(12) }, { role: 'user', content }], max_tokens: 4, temperature: 0 });

test('-ctk/-ctv q8_0: /props names the types; flash attention on; exact (the patch\'s revision 5)', async () => {
  const srv = await startServer(['-m', Q4K, '-ctk', 'q8_0', '-ctv', 'q8_0']);
  try {
    const p = (await getJSON(srv, '/props')).json.kvstash;
    assert.equal(p.cache_type_k, 'q8_0');
    assert.equal(p.cache_type_v, 'q8_0');
    assert.equal(p.flash_attn, true);
    assert.equal(p.exact_mode, 'batch-invariant');
    assert.match(srv.stderr, /probe: a token decoded alone keeps its bits in a batch -> exact mode batch-invariant/);
    const r = await ask(srv, 'hello');
    assert.equal(r.status, 200, r.text);
  } finally {
    await stopOk(srv);
  }
  // The YAML keys, and a mixed pair: f16 K with q8_0 V.
  const cfg = writeConfig('cache_type_k: f16\ncache_type_v: q8_0\n');
  const s2 = await startServer(['-m', Q4K, '--config', cfg]);
  try {
    const p = (await getJSON(s2, '/props')).json.kvstash;
    assert.deepEqual([p.cache_type_k, p.cache_type_v], ['f16', 'q8_0']);
  } finally {
    await stopOk(s2);
  }
  // The default: F16, exact.
  const s3 = await startServer(['-m', Q4K]);
  try {
    const p = (await getJSON(s3, '/props')).json.kvstash;
    assert.deepEqual([p.cache_type_k, p.cache_type_v, p.exact_mode], ['f16', 'f16', 'batch-invariant']);
  } finally {
    await stopOk(s3);
  }
});

test('a state saved with one KV type is not restored into a context of another', async () => {
  const cfg = await writeStoreConfig(path.join(dir, 'store.yaml'),
    { cacheDir: path.join(dir, 'disk'), shmDir: path.join(dir, 'shm'), stride: 16, minTokens: 16 });
  const a = await startServer(['-m', Q4K, '--config', cfg]);
  let first;
  try {
    first = await ask(a, 'tell me about the sea');
    assert.equal(first.status, 200);
    await settleStore(a);
  } finally {
    await stopOk(a);
  }
  // The same types: restored from the store.
  const same = await startServer(['-m', Q4K, '--config', cfg]);
  try {
    const r = await ask(same, 'tell me about the sea');
    assert.equal(r.json.cache.mode, 'store', JSON.stringify(r.json.cache));
  } finally {
    await stopOk(same);
  }
  // q8_0: nothing of the f16 states; the miss says why, and counts.
  const other = await startServer(['-m', Q4K, '--config', cfg, '-ctk', 'q8_0', '-ctv', 'q8_0']);
  try {
    const m0 = await metrics(other);
    assert.equal(m0.get('kvstash_store_kv_type_misses_total'), 0);
    const r = await ask(other, 'tell me about the sea');
    assert.equal(r.json.usage.prompt_tokens_details.cached_tokens, 0, JSON.stringify(r.json.cache));
    assert.notEqual(r.json.cache.mode, 'store');
    assert.equal(r.json.cache.reason, 'stored-with-kv-f16/f16', JSON.stringify(r.json.cache));
    assert.equal((await metrics(other)).get('kvstash_store_kv_type_misses_total'), 1);
    assert.match(other.stderr, /cache miss \/ stored-with-kv-f16\/f16/);
    // A prompt no state of any type holds: a plain miss.
    const fresh = await ask(other, 'something else entirely, about mountains and snow');
    assert.doesNotMatch(fresh.json.cache.reason ?? '', /stored-with-kv/, JSON.stringify(fresh.json.cache));
    await settleStore(other);
  } finally {
    await stopOk(other);
  }
  // `kvstash cache ls` and `verify` name each entry's types (the name each
  // store registered beside its files).
  const cli = ['--cache-dir', path.join(dir, 'disk'), '--shm-dir', path.join(dir, 'shm')];
  const ls = spawnSync(BIN, ['cache', 'ls', ...cli], { encoding: 'utf8' });
  assert.equal(ls.status, 0, ls.stderr);
  const rows = ls.stdout.trim().split('\n');
  assert.match(rows[0], /MODEL +KV$/);
  const kvs = new Set(rows.slice(1).map((l) => l.trim().split(/\s+/).at(-1)));
  assert.deepEqual([...kvs].sort(), ['f16/f16', 'q8_0/q8_0'], ls.stdout);
  const v = spawnSync(BIN, ['cache', 'verify', ...cli], { encoding: 'utf8' });
  assert.equal(v.status, 0, v.stdout + v.stderr);
  assert.match(v.stdout, /^K\/V cache types: (f16\/f16 \d+, q8_0\/q8_0 \d+|q8_0\/q8_0 \d+, f16\/f16 \d+)$/m);
});

test('bad KV types exit 2 naming the flag', async () => {
  await assert.rejects(startServer(['-m', Q4K, '--cache-type-k', 'q9_9']),
    /exited \(code 2[\s\S]*--cache-type-k \(cache_type_k\): 'q9_9' is not a KV cache type/);
  await assert.rejects(startServer(['-m', Q4K, '-ctv', 'q4_0', '--flash-attn', 'off']),
    /exited \(code 2[\s\S]*--cache-type-v q4_0: a quantized V cache needs flash attention/);
  // A type whose block does not divide the model's head size (the tiny model's 16).
  await assert.rejects(startServer(['-m', MODEL, '-ctk', 'q8_0', '-ctv', 'q8_0']),
    /exited \(code 2[\s\S]*could not create a context with a q8_0 K \/ q8_0 V cache for this model/);
});
