// ram_store.test.mjs — the default RAM-only KV store of `kvstash serve` (no
// --cache-dir, no store: section): a conversation whose slot was taken over by
// another one is restored from RAM (cache.mode "store", tier "ram") and replies
// exactly as an uncached server, while no file is written and no directory is
// created; --cache-ram sizes it (0: no store, the takeover is a rebuild);
// --no-cache-prompt and a request's cache_prompt:false mean no store lookups
// and no saves. Every reply is compared with a --no-cache-prompt server's.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, rmSync, readdirSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import {
  startServer, stopOk, chat, metrics, slots, settleStore, metricSum, writeConfig, replyOf,
  assertSameReply, mdelta, until, runBin, MODEL,
} from './lib.mjs';

const CTX = ['--ctx', '2048'];
const MiB = 1024 * 1024;

let root;
let plain; // --no-cache-prompt: the reference replies
before(async () => {
  root = mkdtempSync(path.join(tmpdir(), 'kvstash-e2e-ram-'));
  plain = await startServer([...CTX, '--slots', '1', '--no-cache-prompt']);
});
after(async () => {
  if (plain) await stopOk(plain);
  if (root) rmSync(root, { recursive: true, force: true });
});

// Two conversations whose system prompts (~350 tokens, over the default
// store.min_tokens of 256) differ from their first word: they share only BOS
// and the system header, so on one slot each one evicts the other.
const sys = (topic) => ({
  role: 'system',
  content: `${topic}: you are a careful assistant who answers briefly and checks every fact twice. `.repeat(6),
});

async function turn(srv, msgs, what, extra) {
  const r = await chat(srv, msgs, extra);
  assertSameReply(r, await chat(plain, msgs, extra), what);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, r.cache.cached_tokens, `${what}: usage vs cache`);
  return r;
}

// A turn 1, B turn 1 (takes A's slot over), A turn 2. With a store, waits for
// its writer after each turn, so that a lookup never races a queued save.
async function takeover(srv, { extra = {}, store = true } = {}) {
  const settle = async () => { if (store) await settleStore(srv); };
  const a = [sys('Astronomy'), { role: 'user', content: 'What is a comet?' }];
  const a1 = await turn(srv, a, 'A turn 1', extra);
  await settle();
  const b = [sys('Gardening'), { role: 'user', content: 'When do I plant tulips?' }];
  const b1 = await turn(srv, b, 'B turn 1', extra);
  await settle();
  a.push({ role: 'assistant', content: replyOf(a1) }, { role: 'user', content: 'And what is a meteor?' });
  const a2 = await turn(srv, a, 'A turn 2', extra);
  await settle();
  assert.ok(a1.usage.prompt_tokens > 256, `premise: A's prompt (${a1.usage.prompt_tokens}) is over store.min_tokens`);
  assert.equal(b1.cache.slot, a1.cache.slot, 'premise: one slot, B took it over');
  assert.ok(b1.cache.cached_tokens < 32, `premise: B shares only the header with A (${JSON.stringify(b1.cache)})`);
  return { a1, b1, a2 };
}

// Every file and directory under dir, recursively (relative paths).
function tree(dir) {
  const out = [];
  const walk = (d) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      out.push(path.relative(dir, p));
      if (e.isDirectory()) walk(p);
    }
  };
  walk(dir);
  return out.sort();
}

// What of /dev/shm a store of this user could touch: kvstash* entries, and the
// default shm tier directory's content.
const SHM_DIR = `/dev/shm/kvstash-${process.getuid()}`;
function shmState() {
  if (!existsSync('/dev/shm')) return null;
  return {
    entries: readdirSync('/dev/shm').filter((f) => f.startsWith('kvstash')).sort(),
    uidDir: existsSync(SHM_DIR) ? readdirSync(SHM_DIR).sort() : null,
  };
}

const cacheLine = (srv) => until(() => /cache: prompt \S+, imc \S+, spc \S+, store .*/.exec(srv.stderr)?.[0], 'the cache line', 10000);

test('default flags, 1 slot: a taken-over conversation is restored from RAM, exactly, and nothing is written to disk or /dev/shm', async () => {
  const xdg = path.join(root, 'xdg');
  const home = path.join(root, 'home');
  mkdirSync(xdg);
  mkdirSync(home);
  const shm0 = shmState();
  const srv = await startServer([...CTX, '--slots', '1'], { env: { XDG_CACHE_HOME: xdg, HOME: home } });
  try {
    assert.match(await cacheLine(srv), /prompt on, imc off, spc off, store ram-only \(2048 MiB\)/);
    const m0 = await metrics(srv);
    assert.equal(m0.get('kvstash_store_tier_max_bytes{tier="ram"}'), 2048 * MiB);
    assert.equal(m0.get('kvstash_store_tier_max_bytes{tier="shm"}'), 0, 'no shm tier');
    assert.equal(m0.get('kvstash_store_tier_max_bytes{tier="disk"}'), 0, 'no disk tier');

    const { a1, b1, a2 } = await takeover(srv);
    assert.equal(a1.cache.mode, 'miss');
    assert.equal(b1.cache.mode, 'miss', JSON.stringify(b1.cache));
    assert.equal(a2.cache.mode, 'store', JSON.stringify(a2.cache));
    assert.equal(a2.cache.tier, 'ram', JSON.stringify(a2.cache));
    assert.equal(typeof a2.cache.restore_ms, 'number');
    assert.equal(a2.cache.slot, a1.cache.slot);
    // A's whole first turn comes back (and the reply's KV, when it tokenizes
    // the same): only the new user message is left to prefill, not A's prompt.
    assert.ok(a2.usage.prompt_tokens_details.cached_tokens >= a1.usage.prompt_tokens,
      `A turn 2: cached ${a2.usage.prompt_tokens_details.cached_tokens} < A turn 1's prompt ${a1.usage.prompt_tokens}`);
    assert.equal(a2.timings.prompt_n, a2.usage.prompt_tokens - a2.cache.cached_tokens);

    const m1 = await metrics(srv);
    assert.equal(mdelta(m0, m1, 'kvstash_cache_decisions_total{decision="store"}'), 1);
    assert.equal(mdelta(m0, m1, 'kvstash_store_hits_total'), 1);
    assert.equal(mdelta(m0, m1, 'kvstash_store_tier_hits_total{tier="ram"}'), 1);
    assert.ok(m1.get('kvstash_store_tier_entries{tier="ram"}') >= 2, 'A and B are in RAM');
    assert.ok(m1.get('kvstash_store_tier_bytes{tier="ram"}') > 0);
    assert.equal(m1.get('kvstash_store_tier_entries{tier="shm"}'), 0);
    assert.equal(m1.get('kvstash_store_tier_entries{tier="disk"}'), 0);
    assert.equal(m1.get('kvstash_store_corrupt_files_total'), 0);
    const sl = await slots(srv);
    assert.equal(sl.length, 1);
    assert.ok(sl[0].n_tokens >= a2.usage.prompt_tokens, `/slots: ${JSON.stringify(sl[0])}`);
  } finally {
    await stopOk(srv); // shutdown saves map to no tier in RAM-only mode
  }
  assert.deepEqual(tree(xdg), [], 'nothing written under $XDG_CACHE_HOME');
  assert.deepEqual(tree(home), [], 'nothing written under $HOME');
  assert.deepEqual(shmState(), shm0, '/dev/shm unchanged');
});

test('--cache-ram 0: no store; the same takeover rebuilds A from scratch, with the same replies', async () => {
  const srv = await startServer([...CTX, '--slots', '1', '--cache-ram', '0']);
  try {
    assert.match(await cacheLine(srv), /store off$/);
    const { a1, a2 } = await takeover(srv, { store: false });
    assert.notEqual(a2.cache.mode, 'store', JSON.stringify(a2.cache));
    assert.ok(a2.cache.cached_tokens < 32, `A turn 2 rebuilt: ${JSON.stringify(a2.cache)}`);
    assert.ok(a2.timings.prompt_n > a1.usage.prompt_tokens, 'A turn 1 prefilled again');
    const m = await metrics(srv);
    assert.ok(!m.has('kvstash_store_lookups_total'), 'no store metrics without a store');
    assert.equal(metricSum(m, 'kvstash_store_save_requests_total'), 0);
    assert.equal(m.get('kvstash_cache_decisions_total{decision="store"}'), 0);
  } finally {
    await stopOk(srv);
  }
});

test('--no-cache-prompt: no store is opened, nothing is looked up or saved', async () => {
  // plain is such a server; the takeover ran on it as the reference
  assert.match(await cacheLine(plain), /prompt off, .*store off$/);
  const m0 = await metrics(plain);
  await takeover(plain, { store: false });
  const m = await metrics(plain);
  assert.ok(!m.has('kvstash_store_lookups_total'), 'no store metrics without a store');
  assert.equal(metricSum(m, 'kvstash_store_save_requests_total'), 0);
  assert.ok(mdelta(m0, m, 'kvstash_requests_total') >= 3);
  assert.equal(m.get('kvstash_prompt_tokens_cached_total'), 0);

  // not even a store asked for with --cache-dir: its directory is not created
  const d = path.join(root, 'nocache');
  const shm = path.join(root, 'nocache-shm');
  const srv = await startServer(['--no-cache-prompt', '--cache-dir', d,
    '--config', writeConfig(`store:\n  shm_dir: ${shm}\n`)]);
  try {
    assert.match(await cacheLine(srv), /prompt off, .*store off$/);
    assert.match(srv.stderr, /prompt caching is off: the KV store .* is not opened/);
    assert.ok(!(await metrics(srv)).has('kvstash_store_lookups_total'));
  } finally {
    await stopOk(srv);
  }
  assert.ok(!existsSync(d) && !existsSync(shm), 'no store directory was created');
});

test('cache_prompt:false requests on the default server: no store lookup and no save, even for states the store holds', async () => {
  const srv = await startServer([...CTX, '--slots', '1']);
  try {
    // control: with caching the store is asked and catches the takeover
    const c = await takeover(srv);
    assert.equal(c.a2.cache.mode, 'store', JSON.stringify(c.a2.cache));
    const m0 = await metrics(srv);
    assert.ok(m0.get('kvstash_store_lookups_total') > 0);
    // the same conversations again, without caching: the store holds A's
    // first turn, but it must not even be asked
    const { a2 } = await takeover(srv, { extra: { cache_prompt: false } });
    assert.equal(a2.cache.mode, 'miss', JSON.stringify(a2.cache));
    assert.equal(a2.cache.cached_tokens, 0);
    assert.equal(a2.cache.reason, 'cache-disabled');
    const m1 = await metrics(srv);
    assert.equal(mdelta(m0, m1, 'kvstash_store_lookups_total'), 0, 'no lookup');
    assert.equal(metricSum(m1, 'kvstash_store_save_requests_total') - metricSum(m0, 'kvstash_store_save_requests_total'), 0,
      'no save request');
    assert.equal(metricSum(m1, 'kvstash_store_saves_total') - metricSum(m0, 'kvstash_store_saves_total'), 0, 'no save');
    assert.equal(mdelta(m0, m1, 'kvstash_requests_total'), 3);
    // what such a request left in the slot is never stored: not when a
    // caching request takes the slot over (evict), nor at shutdown
    const g = await chat(srv, [sys('Cooking'), { role: 'user', content: 'Which flowers like shade?' }], { max_tokens: 4 });
    assert.equal(g.cache.mode, 'miss', JSON.stringify(g.cache));
    const m2 = await settleStore(srv);
    assert.equal(mdelta(m1, m2, 'kvstash_store_save_requests_total{reason="evict"}'), 0, 'no evict save of it');
    assert.ok(mdelta(m1, m2, 'kvstash_store_save_requests_total{reason="finish"}') >= 1, 'the caching request saves');
  } finally {
    await stopOk(srv);
  }
});

// The ram budget of a server started with args (and maybe a config), from its
// cache line and /metrics; null when it has no store.
async function ramBudget(args) {
  const srv = await startServer(['--ctx', '512', ...args]);
  try {
    const line = await cacheLine(srv);
    const m = await metrics(srv);
    if (!m.has('kvstash_store_lookups_total')) {
      assert.match(line, /store off$/);
      return null;
    }
    return { line, ram: m.get('kvstash_store_tier_max_bytes{tier="ram"}'), shm: m.get('kvstash_store_tier_max_bytes{tier="shm"}'),
      disk: m.get('kvstash_store_tier_max_bytes{tier="disk"}') };
  } finally {
    await stopOk(srv);
  }
}

test('--cache-ram over store.tiers.ram.max_bytes over the default, in both store modes', async () => {
  // the config sizes the RAM-only store; enabled: false keeps the full store off
  const ramCfg = writeConfig('store:\n  enabled: false\n  tiers:\n    ram: { max_bytes: 64MiB }\n');
  let b = await ramBudget(['--config', ramCfg]);
  assert.match(b.line, /store ram-only \(64 MiB\)$/);
  assert.deepEqual([b.ram, b.shm, b.disk], [64 * MiB, 0, 0]);
  b = await ramBudget(['--config', ramCfg, '--cache-ram', '32']);
  assert.match(b.line, /store ram-only \(32 MiB\)$/);
  assert.deepEqual([b.ram, b.shm, b.disk], [32 * MiB, 0, 0]);

  // a ram budget of 0 in the config: no store, unless the flag gives one
  const offCfg = writeConfig('store:\n  enabled: false\n  tiers:\n    ram: { max_bytes: 0 }\n');
  assert.equal(await ramBudget(['--config', offCfg]), null);
  b = await ramBudget(['--config', offCfg, '--cache-ram', '16']);
  assert.deepEqual([b.ram, b.shm, b.disk], [16 * MiB, 0, 0]);

  // --cache-dir: the full store, whose ram tier --cache-ram sizes (shm in a
  // temp directory: tests never touch /dev/shm)
  const d = path.join(root, 'full');
  mkdirSync(d);
  const fullCfg = writeConfig(`store:\n  enabled: false\n  shm_dir: ${path.join(d, 'shm')}\n`);
  b = await ramBudget(['--config', fullCfg, '--cache-dir', path.join(d, 'disk'), '--cache-ram', '8']);
  assert.match(b.line, new RegExp(`store on at ${path.join(d, 'disk')}$`));
  assert.deepEqual([b.ram, b.shm, b.disk], [8 * MiB, 1024 * MiB, 10240 * MiB]);
  b = await ramBudget(['--config', fullCfg, '--cache-dir', path.join(d, 'disk')]);
  assert.equal(b.ram, 2048 * MiB, 'the default ram budget');
});

test('--cache-ram takes a whole number of MiB', async () => {
  for (const v of ['-1', 'abc', '1.5', '']) {
    const r = await runBin(['serve', '-m', MODEL, '--port', '0', '--cache-ram', v], { timeoutMs: 20000 });
    assert.equal(r.code, 2, `--cache-ram '${v}': exit ${r.code}; ${r.stderr}`);
    assert.match(r.stderr, /--cache-ram must be an integer/);
  }
});
