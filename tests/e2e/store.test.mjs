// store.test.mjs — the persistent tiered store end to end, over HTTP on the
// tiny model: restarts, two processes on one directory, damaged and foreign
// files, kill -9 during saves, tier budgets, and a full disk. Every reply is
// compared with a --no-cache-prompt server's (temperature 0): the store may
// only make prefill cheaper, never change an output.
//
// Every store directory (cache_dir AND shm_dir) lives in this test's own temp
// directory, given through a --config file: nothing touches ~/.cache or /dev/shm.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  mkdtempSync, rmSync, readFileSync, writeFileSync, existsSync, readdirSync, statSync,
  truncateSync, copyFileSync, mkdirSync, statfsSync, unlinkSync, chmodSync, chownSync,
} from 'node:fs';
import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import path from 'node:path';
import {
  startServer, stopOk, chat, postJSON, metrics, sleep, writeStoreConfig, settleStore, metricSum, streamUntil, until,
  kvFiles, tempFiles, kvHeader, xxh3_64, kvNonzero, runBin,
  makeSay,
} from './lib.mjs';

const STRIDE = 16;
const MAX_TOKENS = 8;
// A warm turn never takes a cold save (savepoint.h: its finish save follows),
// so the cold saves here are the first turns'. CHUNKED servers take 16 tokens
// (one stride) per decode: a cold prefill then saves at its last
// stride-aligned chunk end.
const CHUNKED = ['--batch', '16'];

let root;
let mounted = null; // a tmpfs still mounted when a test failed early
let plain; // --no-cache-prompt, same --slots/--ctx: the reference outputs
before(async () => {
  root = mkdtempSync(path.join(tmpdir(), 'kvstash-e2e-store-'));
  plain = await startServer(['--no-cache-prompt']);
});
after(async () => {
  if (plain) await stopOk(plain);
  if (mounted) spawnSync('umount', ['-l', mounted]);
  if (root) rmSync(root, { recursive: true, force: true });
});

// A fresh directory with disk/ and shm/ tier paths and a config file. With
// tiers.shm 0 the server never creates shm/ (shm is then null).
async function storeDir(name, cfg = {}) {
  const d = path.join(root, name);
  mkdirSync(d);
  const disk = cfg.cacheDir ?? path.join(d, 'disk');
  const shmDir = path.join(d, 'shm');
  const config = await writeStoreConfig(path.join(d, 'kvstash.yaml'), { cacheDir: disk, shmDir, ...cfg });
  return { d, disk, shm: cfg.tiers?.shm === 0 ? null : shmDir, config };
}

// A system prompt of ~110 tokens whose first word differs per conversation, so
// that two conversations share less than store.min_tokens of prefix.
const sys = (topic) => ({ role: 'system', content: `${topic}: you are a careful assistant who answers briefly. `.repeat(3) });

// One turn on srv and on the reference server; asserts equal outputs.
async function turn(srv, msgs, what) {
  const r = await chat(srv, msgs, { max_tokens: MAX_TOKENS });
  const p = await chat(plain, msgs, { max_tokens: MAX_TOKENS });
  assert.equal(r.choices[0].message.content, p.choices[0].message.content, `${what}: output differs from --no-cache-prompt`);
  assert.equal(r.choices[0].finish_reason, p.choices[0].finish_reason, `${what}: finish_reason`);
  assert.equal(r.usage.completion_tokens, p.usage.completion_tokens, `${what}: completion_tokens`);
  assert.equal(r.usage.prompt_tokens, p.usage.prompt_tokens, `${what}: prompt_tokens`);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, r.cache.cached_tokens, `${what}: usage vs cache object`);
  return r;
}

// Appends a user message, runs the turn, appends the reply.
const say = makeSay(turn);

// Asserts a restore from the store covering at least `atLeast` tokens.
function assertStoreHit(r, atLeast, what) {
  const c = r.usage.prompt_tokens_details.cached_tokens;
  assert.equal(r.cache.mode, 'store', `${what}: cache ${JSON.stringify(r.cache)}`);
  assert.ok(['ram', 'shm', 'disk'].includes(r.cache.tier), `${what}: tier ${JSON.stringify(r.cache)}`);
  assert.equal(typeof r.cache.restore_ms, 'number', `${what}: restore_ms`);
  assert.ok(c >= atLeast, `${what}: cached_tokens ${c} < ${atLeast} (${JSON.stringify(r.cache)})`);
  assert.ok(c < r.usage.prompt_tokens, `${what}: cached ${c} of ${r.usage.prompt_tokens} prompt tokens`);
  assert.equal(r.timings.cache_n, c);
}

// `kvstash cache SUB` on the test's directories (a missing one is an error:
// the shm tier is named only when the server uses it).
const cli = (sub, dirs, ...rest) =>
  runBin(['cache', sub, '--cache-dir', dirs.disk, ...(dirs.shm ? ['--shm-dir', dirs.shm] : []), ...rest]);

// ------------------------------------------------------------------------ 1
test('restart: after SIGTERM a new process continues the conversation from the store', async () => {
  const dirs = await storeDir('restart');
  const msgs = [sys('Restart')];
  const turns = [];
  const a = await startServer(['--config', dirs.config, ...CHUNKED]);
  try {
    for (const [i, u] of ['Hello there.', 'What did I just say?', 'Tell me more.'].entries()) {
      turns.push(await say(a, msgs, u, `A turn ${i + 1}`));
    }
    assert.ok(turns[0].usage.prompt_tokens >= 32, 'the prompt is above store.min_tokens');
    const m = await settleStore(a);
    assert.ok(m.get('kvstash_store_saves_total{reason="cold"}') >= 1, 'the chunked prefills were cold-saved (to disk)');
  } finally {
    await stopOk(a); // exit 0: shutdown writes the queue
  }
  assert.ok((await kvFiles(dirs.disk)).length > 0, 'kvfiles in the disk tier after A');
  assert.deepEqual(await tempFiles(dirs.disk), [], 'no temp files left by a clean shutdown');
  assert.deepEqual(await tempFiles(dirs.shm), []);

  const b = await startServer(['--config', dirs.config]);
  try {
    const m0 = await metrics(b);
    assert.ok(m0.get('kvstash_store_tier_entries{tier="disk"}') + m0.get('kvstash_store_tier_entries{tier="shm"}') > 0,
      'B indexed the files of A at start');
    msgs.push({ role: 'user', content: 'Thanks, bye.' });
    const r = await turn(b, msgs, 'B turn 4');
    // At least the previous turn's prompt, less a stride (its finish save holds
    // prompt and reply; a cold save would be stride-aligned down).
    assertStoreHit(r, turns[2].usage.prompt_tokens - STRIDE, 'B turn 4');
    const m = await metrics(b);
    assert.ok(m.get('kvstash_store_hits_total') >= 1);
    assert.ok(m.get('kvstash_cache_decisions_total{decision="store"}') >= 1);
    assert.equal(m.get('kvstash_store_corrupt_files_total'), 0);
  } finally {
    await stopOk(b);
  }
});

// ----------------------------------------------------------------------- 1b
// A finish save waits store.finish_save_delay_ms on the idle slot (policy.c
// "Deferred finish saves"): the conversation's next turn sent right behind
// the reply supersedes it (no state copy before that turn), another
// conversation taking the slot gets it taken first, and so does a shutdown.
// The delay here (60 s, the most) outlasts the test, so nothing depends on
// how fast requests follow each other; a short one shows a save taken when due.
test('a finish save waits for the next turn: superseded by it, taken before a takeover and at shutdown', async () => {
  const dirs = await storeDir('deferred', { finishSaveDelayMs: 60000, reasons: { cold: 'none', continued: 'none', shutdown: 'none' } });
  const a = await startServer(['--slots', '1', '--config', dirs.config]);
  const A = [sys('Lakes')];
  let t3;
  try {
    const t1 = await say(a, A, 'What is a lake?', 'A turn 1');
    const t2 = await say(a, A, 'And a pond?', 'A turn 2');
    assert.ok(t2.usage.prompt_tokens_details.cached_tokens >= t1.usage.prompt_tokens, JSON.stringify(t2.cache));
    let m = await metrics(a);
    assert.equal(m.get('kvstash_store_finish_saves_superseded_total'), 1, 'turn 1\'s finish save: superseded by turn 2');
    assert.equal(m.get('kvstash_store_deferred_saves'), 1, 'turn 2\'s, waiting');
    assert.equal(m.get('kvstash_store_save_requests_total{reason="finish"}'), 0, 'nothing asked of the store yet');
    // Another conversation takes the only slot: turn 2's finish save is
    // taken first (as finish; the evict save then finds it held).
    const B = [sys('Deserts')];
    await say(a, B, 'What is a desert?', 'B turn 1');
    m = await until(async () => {
      const x = await metrics(a);
      return x.get('kvstash_store_saves_total{reason="finish"}') === 1 && x.get('kvstash_store_queued_saves') === 0
        ? x : null;
    }, 'A turn 2\'s finish save written');
    assert.equal(m.get('kvstash_store_deferred_saves'), 1, 'B turn 1\'s, waiting');
    assert.equal(m.get('kvstash_store_finish_saves_superseded_total'), 1);
    assert.equal(m.get('kvstash_store_saves_total{reason="evict"}') ?? 0, 0, 'A\'s state was held already');
    // A takes the slot back (B's save taken first) from the store.
    t3 = await say(a, A, 'Which is deeper?', 'A turn 3');
    assertStoreHit(t3, t2.usage.prompt_tokens, 'A turn 3');
  } finally {
    await stopOk(a); // A turn 3's save still waits: shutdown takes it (no shutdown saves here)
  }
  const b = await startServer(['--slots', '1', '--config', dirs.config]);
  try {
    const t4 = await say(b, A, 'Thanks.', 'A turn 4 in a new process');
    assertStoreHit(t4, t3.usage.prompt_tokens, 'A turn 4');
  } finally {
    await stopOk(b);
  }
  // A turn that superseded its predecessor's save and is then canceled (the
  // client leaves during its prefill) defers a save of what the slot holds:
  // without it nothing of this conversation would be stored (no shutdown,
  // cold or evict saves here), and a new process finds it.
  const cd = await storeDir('deferred-cancel', { finishSaveDelayMs: 60000,
    reasons: { cold: 'none', continued: 'none', shutdown: 'none' } });
  const slow = ['--slots', '1', '--ctx', '8192', '--batch', '2', '--config', cd.config];
  const d = await startServer(slow);
  const D = [sys('Glaciers'), { role: 'user', content: 'What is a glacier?' }];
  let d1;
  try {
    d1 = await chat(d, D, { max_tokens: MAX_TOKENS });
    D.push({ role: 'assistant', content: d1.choices[0].message.content },
      { role: 'user', content: 'hello world '.repeat(1500) });
    const gone = await streamUntil(d, '/v1/chat/completions', { messages: D, max_tokens: 8, temperature: 0 },
      (json) => json?.choices?.[0]?.delta?.role === 'assistant'); // leaves during the prefill
    assert.ok(gone.aborted);
    await until(async () => (await metrics(d)).get('kvstash_requests_canceled_total') === 1, 'the cancel');
    const m = await metrics(d);
    assert.equal(m.get('kvstash_store_finish_saves_superseded_total'), 1, 'turn 1\'s, by the canceled turn');
    assert.equal(m.get('kvstash_store_deferred_saves'), 1, 'the canceled turn\'s state, waiting');
  } finally {
    await stopOk(d); // shutdown takes it
  }
  const d2 = await startServer(['--slots', '1', '--ctx', '8192', '--config', cd.config]);
  try {
    const r = await chat(d2, D, { max_tokens: 4 }); // the client tries the canceled turn again
    assert.equal(r.cache.mode, 'store', JSON.stringify(r.cache));
    assert.ok(r.cache.cached_tokens >= d1.usage.prompt_tokens, JSON.stringify(r.cache));
  } finally {
    await stopOk(d2);
  }
  // Delay 0: every finish save is taken at once, none superseded.
  const zero = await storeDir('deferred0', { finishSaveDelayMs: 0, reasons: { cold: 'none', continued: 'none' } });
  const c = await startServer(['--slots', '1', '--config', zero.config]);
  try {
    const C = [sys('Rivers')];
    await say(c, C, 'What is a river?', 'C turn 1');
    await say(c, C, 'And a stream?', 'C turn 2');
    const m = await settleStore(c);
    assert.equal(m.get('kvstash_store_finish_saves_superseded_total'), 0);
    assert.equal(m.get('kvstash_store_saves_total{reason="finish"}'), 2);
  } finally {
    await stopOk(c);
  }
  // A short delay and nothing after the turn: its save is taken when due
  // (settleStore waits for the waiting saves too).
  const short = await storeDir('deferred-short', { finishSaveDelayMs: 200, reasons: { cold: 'none', continued: 'none' } });
  const e = await startServer(['--slots', '1', '--config', short.config]);
  try {
    await say(e, [sys('Oceans')], 'What is an ocean?', 'E turn 1');
    const m = await settleStore(e);
    assert.equal(m.get('kvstash_store_deferred_saves'), 0);
    assert.equal(m.get('kvstash_store_finish_saves_superseded_total'), 0);
    assert.equal(m.get('kvstash_store_saves_total{reason="finish"}'), 1, 'taken when due');
  } finally {
    await stopOk(e);
  }
});

// ----------------------------------------------------------------------- 1c
// Warm start (--warm-slots): a new process puts the latest state of each of
// the conversations A was serving into its slots before it serves, so their
// next turns reuse the slot's prefix (mode "prefix") as in a warm process —
// the newest first, an earlier turn of a conversation already taken skipped.
test('warm start: --warm-slots puts the latest state of each conversation into the slots at start', async () => {
  const dirs = await storeDir('warm');
  const x = [sys('Warmx')];
  const y = [sys('Warmy')];
  const a = await startServer(['--config', dirs.config]);
  let lastX, lastY;
  try {
    for (const [i, u] of ['Hello there.', 'What did I just say?', 'Tell me more.'].entries())
      lastX = await say(a, x, u, `x turn ${i + 1}`);
    for (const [i, u] of ['Good morning.', 'And then?'].entries()) lastY = await say(a, y, u, `y turn ${i + 1}`);
    await settleStore(a);
  } finally {
    await stopOk(a);
  }
  const b = await startServer(['--config', dirs.config, '--warm-slots', '2', '--log', 'info']);
  try {
    const m0 = await metrics(b);
    assert.equal(m0.get('kvstash_warm_slots_total'), 2, `two slots warmed:\n${b.stderr}`);
    // Each holds its conversation's finish save: the last prompt and the
    // reply's tokens decoded into the KV (all but a last one not fed back),
    // more than any earlier turn's state.
    const w = m0.get('kvstash_warm_tokens_total');
    const most = lastX.usage.prompt_tokens + lastX.usage.completion_tokens + lastY.usage.prompt_tokens +
      lastY.usage.completion_tokens;
    assert.ok(w >= most - 2 && w <= most, `the latest turn of x and of y: ${w} tokens, ${most} at most`);
    assert.match(b.stderr, /warm start: 2 of 2 slot\(s\) warmed/);
    // The tokenization cache took the warm slots' conversations in pieces:
    // their next renders are tokenized only where they grew.
    assert.match(b.stderr, /tokenization cache: [1-9]\d* pieces from the 2 warm slot\(s\)' conversations/);
    assert.ok(m0.get('kvstash_tokcache_bytes') > 0);
    for (const [msgs, last, what] of [[x, lastX, 'x turn 4'], [y, lastY, 'y turn 3']]) {
      const mb = await metrics(b);
      const r = await say(b, msgs, 'Thanks, bye.', what);
      const ma = await metrics(b);
      const seeded = ma.get('kvstash_prompt_tokens_untokenized_total') - mb.get('kvstash_prompt_tokens_untokenized_total');
      assert.ok(seeded > last.usage.prompt_tokens / 2, `${what}: ${seeded} tokens from the cache of ${r.usage.prompt_tokens}`);
      assert.equal(r.cache.mode, 'prefix', `${what}: ${JSON.stringify(r.cache)}`);
      assert.ok(r.usage.prompt_tokens_details.cached_tokens >= last.usage.prompt_tokens,
        `${what}: cached ${r.usage.prompt_tokens_details.cached_tokens} < ${last.usage.prompt_tokens}`);
    }
    const m = await metrics(b);
    assert.equal(m.get('kvstash_store_hits_total'), 0, 'no turn needed the store');
  } finally {
    await stopOk(b);
  }
  // A server with a cache secret takes no untagged state (B's and A's were
  // written without one) into its slots: warm start checks what a lookup checks.
  const secret = path.join(dirs.d, 'secret');
  writeFileSync(secret, 'a cache secret of this test, 32+ bytes long', { mode: 0o600 });
  const d = await startServer(['--config', dirs.config, '--warm-slots', '2', '--cache-secret-file', secret]);
  try {
    assert.equal((await metrics(d)).get('kvstash_warm_slots_total'), 0, `no slot warmed:\n${d.stderr}`);
    assert.match(d.stderr, /warm start: no stored state to put into the slots/);
    await say(d, x, 'One more thing.', 'x turn 5 (tagged saves)');
    await settleStore(d);
  } finally {
    await stopOk(d);
  }
  // ...and takes the states saved under its secret.
  const e = await startServer(['--config', dirs.config, '--warm-slots', '1', '--cache-secret-file', secret]);
  try {
    assert.equal((await metrics(e)).get('kvstash_warm_slots_total'), 1, `a tagged state warmed:\n${e.stderr}`);
    const r = await say(e, x, 'Bye now.', 'x turn 6');
    assert.equal(r.cache.mode, 'prefix', `x turn 6: ${JSON.stringify(r.cache)}`);
  } finally {
    await stopOk(e);
  }
  // Without a persistent store the setting says it does nothing.
  const c = await startServer(['--warm-slots', '2']);
  try {
    assert.match(c.stderr, /--warm-slots \(store.warm_slots\) needs the persistent store/);
    assert.equal((await metrics(c)).get('kvstash_warm_slots_total'), 0);
  } finally {
    await stopOk(c);
  }
});

// ----------------------------------------------------------------------- 1b
// Only evict and shutdown saves are on: a slot's KV must still be saved when
// it is dropped (another conversation takes the slot) and at SIGTERM
// (docs/ARCHITECTURE.md: "Before a slot's unsaved KV is dropped it is saved";
// "on shutdown a shutdown save per slot").
// Fails at the time of writing: sched.c store_save() sets slot->saved_n
// whenever ks_store_save() returns 0, which it also does for a save it drops
// (tier none), so the later evict and shutdown saves of that KV are skipped.
test('evict and shutdown saves persist a slot\'s KV when finish saves go to tier none', async () => {
  const reasons = { cold: 'none', continued: 'none', finish: 'none', evict: 'disk', shutdown: 'disk' };
  const dirs = await storeDir('evict-shutdown', { reasons });
  const reasonsOnDisk = async () => (await kvFiles(dirs.disk)).map((f) => kvHeader(readFileSync(path.join(dirs.disk, f))).reason);
  const x = [sys('Evicted')];
  const y = [sys('Stayed')];
  let tx, ty;
  // One slot: y's turn takes the slot from x, whose KV must be saved first.
  const a = await startServer(['--config', dirs.config, '--slots', '1']);
  try {
    tx = await say(a, x, 'Hello there.', 'x turn 1');
    ty = await say(a, y, 'Hello there.', 'y turn 1');
    const m = await settleStore(a);
    assert.ok(m.get('kvstash_store_saves_total{reason="evict"}') >= 1,
      `no evict save when y took x's slot (save requests: evict ${m.get('kvstash_store_save_requests_total{reason="evict"}')}, ` +
      `finish ${m.get('kvstash_store_save_requests_total{reason="finish"}')}; dropped ${m.get('kvstash_store_saves_not_written_total{cause="dropped"}')})`);
  } finally {
    await stopOk(a);
  }
  const rs = await reasonsOnDisk();
  assert.ok(rs.includes(3), `an evict-reason file on disk (reasons: ${rs})`);
  assert.ok(rs.includes(4), `a shutdown-reason file on disk (reasons: ${rs})`);
  const b = await startServer(['--config', dirs.config, '--slots', '1']);
  try {
    const r1 = await say(b, y, 'And then?', 'y turn 2 after restart');
    assertStoreHit(r1, ty.usage.prompt_tokens, 'y turn 2 (shutdown save)');
    const r2 = await say(b, x, 'And then?', 'x turn 2 after restart');
    assertStoreHit(r2, tx.usage.prompt_tokens, 'x turn 2 (evict save)');
  } finally {
    await stopOk(b);
  }
});

// ----------------------------------------------------------------------- 1c
// A cold prefill saves its prompt once, at the last stride boundary (its last
// chunk is cut there: one decode step beside a whole prompt's prefill); a warm
// turn never pays a step for a cold save, so a turn whose new tokens fit one
// chunk adds none. Another process replaying the first prompt restores exactly
// the cold save.
test('cold saves: one for a cold prefill at its last stride boundary, none for a warm one-chunk turn', async () => {
  const reasons = { cold: 'disk', continued: 'none', finish: 'disk', evict: 'disk', shutdown: 'disk' };
  const headers = async (dir) => (await kvFiles(dir)).map((f) => kvHeader(readFileSync(path.join(dir, f))));
  const msgs = [sys('Cold'), { role: 'user', content: 'Hello there.' }];
  const dirs = await storeDir('cold', { reasons });
  const a = await startServer(['--config', dirs.config]);
  let n;
  try {
    const r = await turn(a, msgs, 'cold turn');
    n = r.usage.prompt_tokens;
    assert.ok(n > 2 * STRIDE && n <= 512, `${n} prompt tokens: past stride boundaries, within one chunk`);
    let m = await settleStore(a);
    assert.equal(m.get('kvstash_store_save_requests_total{reason="cold"}'), 1, 'one cold save for the cold prefill');
    assert.equal(m.get('kvstash_store_saves_total{reason="cold"}'), 1, 'cold saves written');
    const w = [...msgs, { role: 'assistant', content: r.choices[0].message.content }, { role: 'user', content: 'And then? Tell me everything about it, step by step, with all the details you know.' }];
    const r2 = await turn(a, w, 'warm turn');
    assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= n, 'the warm turn reused the first');
    assert.ok(Math.floor((r2.usage.prompt_tokens - 1) / STRIDE) * STRIDE > r2.usage.prompt_tokens_details.cached_tokens,
      'the warm turn crosses a stride boundary');
    m = await settleStore(a);
    assert.equal(m.get('kvstash_store_save_requests_total{reason="cold"}'), 1, 'no cold save for a warm one-chunk turn');
    assert.equal(m.get('kvstash_store_saves_total{reason="finish"}'), 2, 'the finish saves');
  } finally {
    await stopOk(a);
  }
  const at = Math.floor((n - 1) / STRIDE) * STRIDE;
  const cold = (await headers(dirs.disk)).filter((h) => h.reason === 0);
  assert.equal(cold.length, 1, 'one cold-reason file');
  assert.equal(cold[0].nTokens, at, `the cold save of a ${n}-token prompt`);
  // Another process gets the first prompt again: restored from the cold save.
  const c = await startServer(['--config', dirs.config]);
  try {
    const r = await turn(c, msgs, 'replay');
    assertStoreHit(r, at, 'replay of the first prompt');
    assert.equal(r.usage.prompt_tokens_details.cached_tokens, at);
  } finally {
    await stopOk(c);
  }
});

// Issue 42: a store directory others may write to is made private (0700)
// with a line in the log, and an entry another user put there is never read
// (without a cache secret it would be restored as ours).
test('a store directory open to others is made private; entries of another owner are not read', async (t) => {
  const dirs = await storeDir('open-dir');
  const msgs = [sys('Opendir')];
  const a = await startServer(['--config', dirs.config, ...CHUNKED]);
  let last;
  try {
    for (const u of ['Hello there.', 'What did I just say?']) last = await say(a, msgs, u, 'A');
    await settleStore(a);
  } finally {
    await stopOk(a);
  }
  const files = await kvFiles(dirs.disk);
  assert.ok(files.length > 0);
  chmodSync(dirs.disk, 0o777);
  const root = process.getuid?.() === 0;
  // Only root can give files away: as root, A's entries become another user's.
  if (root) for (const f of files) chownSync(path.join(dirs.disk, f), 65534, 65534);
  else t.diagnostic('not root: the entries of another owner are not tried');
  rmSync(dirs.shm, { recursive: true, force: true }); // only the disk tier holds the conversation
  const b = await startServer(['--config', dirs.config]);
  try {
    assert.match(b.stderr, /was writable by others \(mode 777\): made private \(0700\)/);
    assert.equal(statSync(dirs.disk).mode & 0o777, 0o700);
    const r = await turn(b, [...msgs, { role: 'user', content: 'Thanks, bye.' }], 'B');
    if (root) assert.notEqual(r.cache.mode, 'store', `another owner's entry was restored: ${JSON.stringify(r.cache)}`);
    else assertStoreHit(r, last.usage.prompt_tokens - STRIDE, 'B');
  } finally {
    await stopOk(b);
  }
});

// Issue 41: a store directory another Unix user owns (one made first under
// our name in /dev/shm, say) is never used: its files could be that user's.
// The disk directory stops the server at start, naming the owner; the shm
// tier, an optional one (its default directory is shared by design), is
// turned off with a warning that says why. Needs root to give a directory
// away; as another user it uses a directory of root's.
test('a store directory owned by another user is refused, naming the owner', async (t) => {
  const d = path.join(root, 'foreign');
  mkdirSync(d);
  const asRoot = process.getuid?.() === 0;
  if (!asRoot && statSync('/').uid !== 0) return t.skip('no directory of another user to try');
  const owner = asRoot ? 65534 : 0; // nobody, or root
  const foreign = (name) => {
    if (!asRoot) return '/';
    const p = path.join(d, name);
    mkdirSync(p, { mode: 0o700 });
    chownSync(p, owner, owner);
    return p;
  };
  const shmCfg = await writeStoreConfig(path.join(d, 'shm.yaml'), { cacheDir: path.join(d, 'ok-disk'), shmDir: foreign('shm') });
  const srv = await startServer(['--config', shmCfg]);
  try {
    assert.match(srv.stderr, new RegExp(`shm tier disabled: .* is owned by uid ${owner}, not by us`));
    assert.match(srv.stderr, /shm {2}tier: off/);
  } finally {
    await stopOk(srv);
  }
  const diskCfg = await writeStoreConfig(path.join(d, 'disk.yaml'), { cacheDir: foreign('disk'), shmDir: path.join(d, 'ok-shm') });
  await assert.rejects(startServer(['--config', diskCfg]),
    (e) => /exited \(code 1/.test(e.message) && new RegExp(`is owned by uid ${owner}, not by us`).test(e.message));
});

// ------------------------------------------------------------------------ 2
test('two processes on one directory: a conversation moves from A to B and back', async () => {
  const dirs = await storeDir('two');
  const a = await startServer(['--config', dirs.config]);
  const b = await startServer(['--config', dirs.config]); // same --slots/--ctx as a
  try {
    const msgs = [sys('Shared')];
    const t1 = await say(a, msgs, 'Hello from process A.', 'turn 1 on A');
    assert.equal(t1.cache.mode, 'miss');
    await settleStore(a); // A's saves are published
    const t2 = await say(b, msgs, 'And now on process B.', 'turn 2 on B');
    assertStoreHit(t2, t1.usage.prompt_tokens - STRIDE, 'turn 2 on B (saved by A)');
    await settleStore(b);
    // A's slot still holds turn 1; B's longer saves beat it.
    const t3 = await say(a, msgs, 'Back on A again.', 'turn 3 on A');
    assertStoreHit(t3, t2.usage.prompt_tokens - STRIDE, 'turn 3 on A (saved by B)');
    assert.ok(t3.usage.prompt_tokens_details.cached_tokens > t2.usage.prompt_tokens_details.cached_tokens);

    // Both save the same states at the same time: one file per key (the second
    // writer's link() finds the first's file: a dedup), no temp files, no bad files.
    const m0 = { a: await settleStore(a), b: await settleStore(b) };
    const all = async () => [...await kvFiles(dirs.disk), ...await kvFiles(dirs.shm)];
    const old = new Set(await all());
    const race = [sys('Race'), { role: 'user', content: 'Both of you at once.' }];
    await Promise.all([turn(a, race, 'race on A'), turn(b, race, 'race on B')]);
    const m1 = { a: await settleStore(a), b: await settleStore(b) };
    const delta = (name) => metricSum(m1.a, name) - metricSum(m0.a, name) + metricSum(m1.b, name) - metricSum(m0.b, name);
    const fresh = (await all()).filter((f) => !old.has(f));
    assert.ok(fresh.length > 0, 'the race saved states');
    assert.equal(delta('kvstash_store_saves_total'), fresh.length, 'each written save is one new file');
    assert.ok(m1.a.get('kvstash_store_saves_not_written_total{cause="dedup"}') - m0.a.get('kvstash_store_saves_not_written_total{cause="dedup"}') +
      m1.b.get('kvstash_store_saves_not_written_total{cause="dedup"}') - m0.b.get('kvstash_store_saves_not_written_total{cause="dedup"}') >= 1,
    'the second save of a state was a dedup');
    assert.deepEqual([...await tempFiles(dirs.disk), ...await tempFiles(dirs.shm)], []);
    for (const s of [a, b]) {
      const m = await settleStore(s);
      assert.equal(m.get('kvstash_store_corrupt_files_total'), 0);
      assert.equal(m.get('kvstash_store_saves_not_written_total{cause="failed"}'), 0);
    }
  } finally {
    await stopOk(a);
    await stopOk(b);
  }
  const v = await cli('verify', dirs);
  assert.equal(v.code, 0, `verify after two writers:\n${v.stdout}${v.stderr}`);
});

// ------------------------------------------------------------------------ 3
test('damaged, version-bumped and other-model files are never served; verify names them', async (t) => {
  // Every reason to disk: all files of a conversation are in one directory.
  const reasons = { cold: 'disk', continued: 'disk', finish: 'disk', evict: 'disk', shutdown: 'disk' };
  const dirs = await storeDir('damage', { reasons });
  const model2 = path.join(dirs.d, 'tiny2.gguf');
  const mk = await runBin(['mkmodel', '--preset', 'tiny', '--seed', '2', model2]);
  assert.equal(mk.code, 0, mk.stderr);

  // Flip: a payload byte; Trunc: cut short; Version: format version 2 (valid
  // header check); Stale: another llama state version (valid header check);
  // Swap: model 2's file under model 1's name; Trailer: only the hit-statistics
  // trailer damaged (still valid); Control: untouched; Foreign: saved by model 2 only.
  const convs = ['Flip', 'Trunc', 'Version', 'Stale', 'Swap', 'Trailer', 'Control', 'Foreign'];
  const first = (c) => [sys(c), { role: 'user', content: `Hello, ${c}.` }];
  const msgs = {};   // conversation -> turn 1 with its reply (from the model that saved it)
  const files = {};  // conversation -> its kvfiles (model 1)
  const files2 = {}; // conversation -> its kvfiles (model 2)
  // Runs turn 1 of each conversation and attributes the new files to it.
  async function seed(srv, list, into, what) {
    for (const c of list) {
      const seen = new Set(await kvFiles(dirs.disk));
      const r = await chat(srv, first(c), { max_tokens: MAX_TOKENS });
      msgs[c] ??= [...first(c), { role: 'assistant', content: r.choices[0].message.content }];
      await settleStore(srv);
      into[c] = (await kvFiles(dirs.disk)).filter((f) => !seen.has(f));
      assert.ok(into[c].length > 0, `${what}: ${c} saved no file`);
    }
  }
  // Each conversation's turn 1 leaves a cold save at a stride multiple: a
  // cold prefill on a slot of its own, in 16-token chunks.
  // n_seq is part of the keys: every server here has 8 slots.
  const SLOTS = ['--slots', '8'];
  const a = await startServer(['--config', dirs.config, ...SLOTS, ...CHUNKED]);
  try {
    await seed(a, convs.filter((c) => c !== 'Foreign'), files, 'model 1');
  } finally {
    await stopOk(a);
  }
  const a2 = await startServer(['--config', dirs.config, '-m', model2, ...SLOTS, ...CHUNKED]);
  try {
    await seed(a2, ['Swap', 'Foreign'], files2, 'model 2');
  } finally {
    await stopOk(a2);
  }
  const all1 = Object.values(files).flat();
  const all2 = Object.values(files2).flat();
  assert.deepEqual([...all1, ...all2].sort(), await kvFiles(dirs.disk), 'every file attributed (shutdown saved nothing new)');
  const fp1 = kvHeader(readFileSync(path.join(dirs.disk, all1[0]))).modelFp;
  const fp2 = kvHeader(readFileSync(path.join(dirs.disk, all2[0]))).modelFp;
  assert.notEqual(fp1, fp2, 'the two models have different fingerprints');

  // Damage.
  const p = (f) => path.join(dirs.disk, f);
  for (const f of files.Flip) { // one payload byte
    const b = readFileSync(p(f));
    const h = kvHeader(b);
    const off = 160 + 4 * h.nTokens + Math.floor(h.payloadLen / 2);
    b[off] ^= 0x5a;
    writeFileSync(p(f), b);
  }
  files.Trunc.forEach((f, i) => { // mid-payload, then just the last byte
    const b = readFileSync(p(f));
    const h = kvHeader(b);
    truncateSync(p(f), i % 2 === 0 ? 160 + 4 * h.nTokens + Math.floor(h.payloadLen / 2) : b.length - 1);
  });
  // Rewrites a u32 header field and the header check after it.
  const setHeaderU32 = (f, off, value) => {
    const b = readFileSync(p(f));
    assert.equal(kvNonzero(xxh3_64(b.subarray(0, 152))), kvHeader(b).headerCheck, 'xxh3_64 reproduces the header check');
    b.writeUInt32LE(value, off);
    b.writeBigUInt64LE(kvNonzero(xxh3_64(b.subarray(0, 152))), 152);
    writeFileSync(p(f), b);
  };
  for (const f of files.Version) setHeaderU32(f, 8, 2);
  for (const f of files.Stale) setHeaderU32(f, 16, kvHeader(readFileSync(p(f))).stateVersion + 1);
  for (const f of files.Trailer) { // the trailer check (last 8 bytes)
    const b = readFileSync(p(f));
    b[b.length - 3] ^= 0xff;
    writeFileSync(p(f), b);
  }
  // A lookup probes stride multiples and the lengths of OWN entries only, so it
  // meets a stale file only at a stride multiple (the cold save); the stale
  // finish save at another length is never probed: ignored, never served.
  const staleMet = files.Stale.filter((f) => kvHeader(readFileSync(p(f))).nTokens % STRIDE === 0);
  assert.ok(staleMet.length >= 1, 'a stale file at a stride multiple');
  // A zero-length file under a key name.
  const empty = `${'ab'.repeat(32)}.kvs`;
  writeFileSync(p(empty), '');
  for (const f of files.Swap) { // model 2's state of the same conversation under model 1's name
    const n = kvHeader(readFileSync(p(f))).nTokens;
    const src = files2.Swap.find((g) => kvHeader(readFileSync(p(g))).nTokens === n) ?? files2.Swap[0];
    copyFileSync(p(src), p(f));
  }
  // The whole-file checksum covers the header too, so the Stale files (header
  // check rewritten, checksum not) read as ECORRUPT to verify; the server sees
  // their llama state version in the checked header first and treats them as stale.
  const damaged = [...files.Flip, ...files.Trunc, ...files.Version, ...files.Stale, ...files.Swap, empty];
  const total = all1.length + all2.length + 1;

  // verify (no model) names exactly the damaged files; foreign ones are fine,
  // and so is Trailer (the statistics are outside the checks).
  const v = await cli('verify', dirs);
  assert.equal(v.code, 1, `verify exit code:\n${v.stdout}${v.stderr}`);
  const bad = [...v.stdout.matchAll(/^bad: (\S+): /gm)].map((m) => path.basename(m[1])).sort();
  assert.deepEqual(bad, [...damaged].sort(), `verify output:\n${v.stdout}`);
  assert.match(v.stdout, new RegExp(`^${total} files checked: ${total - damaged.length} good, ${damaged.length} bad$`, 'm'));
  for (const f of files.Version) assert.match(v.stdout, new RegExp(`bad: \\S*${f}: EVERSION`), 'version bump reads as EVERSION');

  // A new model-1 server: damaged prefixes are misses with the uncached output.
  const b = await startServer(['--config', dirs.config, ...SLOTS]);
  let m0, m1;
  try {
    m0 = await metrics(b);
    for (const c of ['Flip', 'Trunc', 'Version', 'Stale', 'Swap', 'Foreign', 'Trailer', 'Control']) {
      const r = await turn(b, [...msgs[c], { role: 'user', content: 'And again?' }], c);
      if (c === 'Control' || c === 'Trailer') assertStoreHit(r, 32, `${c} conversation`);
      else assert.notEqual(r.cache.mode, 'store', `${c}: served from a damaged or foreign file: ${JSON.stringify(r.cache)}`);
    }
    m1 = await settleStore(b);
  } finally {
    await stopOk(b);
  }
  const counted = m1.get('kvstash_store_corrupt_files_total');
  t.diagnostic(`files: ${Object.entries(files).map(([c, f]) => `${c} ${f.length}`).join(', ')}; model 2: ${all2.length}; ` +
    `corrupt files counted at start ${m0.get('kvstash_store_corrupt_files_total')}, at the end ${counted}`);
  const expected = files.Flip.length + files.Trunc.length + staleMet.length + files.Swap.length + 1;
  assert.ok(counted >= expected, `corrupt files counted ${counted} < ${expected} (at start: ${m0.get('kvstash_store_corrupt_files_total')})`);
  assert.ok(counted > m0.get('kvstash_store_corrupt_files_total'), 'the flipped files were found by lookups');
  assert.equal(m1.get('kvstash_store_hits_total'), 2, 'only the Control and Trailer conversations hit');

  // Corrupt files were moved into quarantine/; the other version's and the
  // other model's files were left alone (docs/kvfile-format.md).
  const left = new Set(await kvFiles(dirs.disk));
  const quarantined = existsSync(path.join(dirs.disk, 'quarantine')) ? readdirSync(path.join(dirs.disk, 'quarantine')) : [];
  for (const f of [...files.Flip, ...files.Trunc, ...staleMet, ...files.Swap, empty]) {
    assert.ok(!left.has(f), `${f} still published`);
    assert.ok(quarantined.some((q) => q.startsWith(f)), `${f} not in quarantine/ (${quarantined.join(', ')})`);
  }
  for (const f of [...files.Version, ...files.Control, ...files.Trailer, ...all2]) assert.ok(left.has(f), `${f} was removed`);
  const v2 = await cli('verify', dirs);
  assert.equal(v2.code, 1);
  const bad2 = [...v2.stdout.matchAll(/^bad: (\S+): /gm)].map((m) => path.basename(m[1])).sort();
  const staleLeft = files.Stale.filter((f) => left.has(f));
  assert.deepEqual(bad2, [...files.Version, ...staleLeft].sort(), `after the server only the version-bumped (and unprobed stale) files remain bad:\n${v2.stdout}`);
});

// ------------------------------------------------------------------------ 4
test('kill -9 during saves, 8 rounds: no bad file is ever published', async (t) => {
  const dirs = await storeDir('kill', { continuedInterval: 8 });
  const sent = [];
  let published = 0;
  for (let round = 0; round < 8; round++) {
    const srv = await startServer(['--config', dirs.config]);
    let stop = false;
    let answered = 0;
    const errors = [];
    // Two clients, each a new conversation per request (new saves every time:
    // cold, continued every 8 tokens, finish).
    const worker = async (w) => {
      for (let i = 0; !stop; i++) {
        const msgs = [sys(`Crash${round}w${w}n${i}`), { role: 'user', content: 'Go on.' }];
        sent.push(msgs);
        try {
          const r = await postJSON(srv, '/v1/chat/completions', { messages: msgs, temperature: 0, max_tokens: 24 });
          if (r.status === 200) answered++;
          else errors.push(`${r.status} ${r.text.slice(0, 200)}`);
        } catch { return; } // the server died under us
      }
    };
    const ws = [worker(0), worker(1)];
    const delay = 50 + Math.floor(Math.random() * 351);
    await sleep(delay);
    srv.proc.kill('SIGKILL');
    const ex = await srv.exited;
    stop = true;
    await Promise.all(ws);
    assert.deepEqual(errors, [], `round ${round}: failed requests`);
    assert.equal(ex.signal, 'SIGKILL', `round ${round}: the server exited on its own (${JSON.stringify(ex)}):\n${srv.stderr.slice(-2000)}`);
    const n = (await kvFiles(dirs.disk)).length + (await kvFiles(dirs.shm)).length;
    t.diagnostic(`round ${round}: SIGKILL after ${delay} ms, ${answered} answered, ${n} files, ` +
      `${(await tempFiles(dirs.disk)).length + (await tempFiles(dirs.shm)).length} temp files`);
    published = n;
  }
  assert.ok(published > 0, 'the rounds published some states');
  const v = await cli('verify', dirs);
  assert.equal(v.code, 0, `verify after kill -9:\n${v.stdout}${v.stderr}`);
  assert.match(v.stdout, /^(\d+) files checked: \1 good, 0 bad$/m);

  // A new server cleans the dead writers' temp files and serves; replies equal
  // the uncached ones whether or not they come from the store.
  const srv = await startServer(['--config', dirs.config]);
  try {
    assert.deepEqual(await tempFiles(dirs.disk), [], 'temp files of killed servers removed at open');
    assert.deepEqual(await tempFiles(dirs.shm), []);
    const picks = [...sent.slice(0, 6), ...sent.filter((_, i) => i % 17 === 5).slice(0, 10)];
    for (const [i, msgs] of picks.entries()) await turn(srv, msgs, `replay ${i}`);
    const m = await metrics(srv);
    assert.equal(m.get('kvstash_store_corrupt_files_total'), 0, 'no bad file met');
    t.diagnostic(`replays: ${m.get('kvstash_store_hits_total')} store hits of ${m.get('kvstash_store_lookups_total')} lookups`);
  } finally {
    await stopOk(srv);
  }
});

// ------------------------------------------------------------------------ 5
test('budgets: the disk tier never holds more than its max_bytes, evicting least recently hit', async (t) => {
  const BUDGET = 150000; // ~3 states of ~130-230 tokens (~270 payload bytes a token)
  const reasons = { cold: 'disk', continued: 'disk', finish: 'disk', evict: 'disk', shutdown: 'disk' };
  const dirs = await storeDir('budget', { reasons, tiers: { ram: 0, shm: 0, disk: BUDGET } });
  // Bytes of published and in-progress files, each inode once (publishing
  // links the temp file to its final name before unlinking the temp name; a
  // file may also vanish between the listing and the stat).
  const du = async () => {
    const seen = new Map();
    for (const f of [...await kvFiles(dirs.disk), ...await tempFiles(dirs.disk)]) {
      try { const st = statSync(path.join(dirs.disk, f)); seen.set(st.ino, st.size); } catch { /* gone */ }
    }
    return [...seen.values()].reduce((a, b) => a + b, 0);
  };
  // Samples the tier's bytes (gauge and directory) all along, not only after a settle.
  let sampling = true;
  let maxSeen = { gauge: 0, dir: 0 };
  const sampler = async (srv) => {
    while (sampling) {
      try {
        const g = (await metrics(srv)).get('kvstash_store_tier_bytes{tier="disk"}');
        maxSeen = { gauge: Math.max(maxSeen.gauge, g), dir: Math.max(maxSeen.dir, await du()) };
      } catch { return; }
      await sleep(5);
    }
  };
  const srv = await startServer(['--config', dirs.config]);
  let m;
  const convs = [];
  const bg = sampler(srv);
  try {
    m = await metrics(srv);
    assert.equal(m.get('kvstash_store_tier_max_bytes{tier="disk"}'), BUDGET);
    assert.equal(m.get('kvstash_store_tier_max_bytes{tier="ram"}'), 0);
    for (let i = 0; i < 8; i++) {
      const msgs = [sys(`Budget${i}`)];
      await say(srv, msgs, 'First question?', `conversation ${i} turn 1`);
      convs.push(msgs);
      m = await settleStore(srv);
      const bytes = m.get('kvstash_store_tier_bytes{tier="disk"}');
      assert.ok(bytes <= BUDGET, `after conversation ${i}: tier bytes ${bytes} > ${BUDGET}`);
      const onDisk = await du();
      assert.ok(onDisk <= BUDGET, `after conversation ${i}: ${onDisk} bytes of kvfiles > ${BUDGET}`);
      assert.equal(m.get('kvstash_store_tier_entries{tier="disk"}'), (await kvFiles(dirs.disk)).length);
    }
    assert.ok(m.get('kvstash_store_tier_evictions_total{tier="disk"}') > 0, 'evictions happened');
    assert.ok(m.get('kvstash_store_saves_total{reason="finish"}') >= 8, 'every conversation was saved');
  } finally {
    sampling = false;
    await bg;
    await stopOk(srv);
  }
  assert.ok(maxSeen.gauge <= BUDGET && maxSeen.dir <= BUDGET, `budget ${BUDGET} exceeded while saving: ${JSON.stringify(maxSeen)}`);
  t.diagnostic(`max bytes seen: ${JSON.stringify(maxSeen)} (budget ${BUDGET}); evictions ${m.get('kvstash_store_tier_evictions_total{tier="disk"}')}`);
  assert.ok(maxSeen.gauge > BUDGET / 2, `the sampler saw the tier fill (${JSON.stringify(maxSeen)})`);
  assert.ok((await du()) <= BUDGET);
  // A new process (empty slots): the newest conversation survived eviction and
  // continues from the store; the oldest was evicted and prefills (same output).
  const srv2 = await startServer(['--config', dirs.config]);
  try {
    const r = await say(srv2, convs[convs.length - 1], 'Second question?', 'last conversation turn 2');
    assertStoreHit(r, 32, 'last conversation turn 2');
    const old = await say(srv2, convs[0], 'Second question?', 'first conversation turn 2');
    assert.notEqual(old.cache.mode, 'store', `evicted conversation: ${JSON.stringify(old.cache)}`);
    m = await settleStore(srv2);
    assert.ok(m.get('kvstash_store_tier_bytes{tier="disk"}') <= BUDGET);
    assert.ok(m.get('kvstash_store_tier_evictions_total{tier="disk"}') > 0, 'the new saves evicted older ones');
  } finally {
    await stopOk(srv2);
  }
  assert.ok((await du()) <= BUDGET);
  const st = await cli('stats', dirs);
  assert.equal(st.code, 0, st.stderr);
  const row = /^disk\s+(\d+)\s+\S+\s+/m.exec(st.stdout);
  assert.ok(row, `no disk row in:\n${st.stdout}`);
  assert.equal(Number(row[1]), (await kvFiles(dirs.disk)).length, `stats:\n${st.stdout}`);
});

// ------------------------------------------------------------------------ 6
test('disk full: saves are skipped with a warning, requests still succeed with the right output', async (t) => {
  const mnt = path.join(root, 'full');
  mkdirSync(mnt);
  const mount = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=1M', 'tmpfs', mnt], { encoding: 'utf8' });
  if (mount.status !== 0) {
    assert.fail(`cannot mount a 1 MiB tmpfs at ${mnt} (this test needs root and mount(8)): ` +
      `status ${mount.status} ${mount.error ?? ''} ${mount.stderr}`);
  }
  mounted = mnt;
  let srv;
  try {
    const reasons = { cold: 'disk', continued: 'disk', finish: 'disk', evict: 'disk', shutdown: 'disk' };
    const dirs = await storeDir('diskfull', { reasons, tiers: { shm: 0 }, cacheDir: path.join(mnt, 'cache') });
    // Leave 8 KiB: room for the directories and the fingerprint cache, not for a state (~40 KiB).
    const fs0 = statfsSync(mnt);
    const filler = path.join(mnt, 'filler');
    writeFileSync(filler, Buffer.alloc(Number(fs0.bavail) * fs0.bsize - 8192));
    srv = await startServer(['--config', dirs.config]);
    for (const c of ['Full1', 'Full2', 'Full3']) {
      const msgs = [sys(c)];
      await say(srv, msgs, 'Hello?', `${c} turn 1`);
      await say(srv, msgs, 'And then?', `${c} turn 2`);
    }
    let m = await settleStore(srv);
    assert.ok(m.get('kvstash_store_saves_not_written_total{cause="failed"}') > 0,
      `no failed save counted: ${m.get('kvstash_store_saves_not_written_total{cause="failed"}')}`);
    assert.match(srv.stderr, /^\S+ W store\s+.*save.*(failed|skipped)/m, `no warning about a failed save:\n${srv.stderr.slice(-3000)}`);
    assert.deepEqual(await tempFiles(dirs.disk), [], 'temp files left on the full disk');
    t.diagnostic(srv.stderr.split('\n').filter((l) => / W /.test(l)).slice(0, 3).join('\n'));
    assert.equal(m.get('kvstash_store_corrupt_files_total'), 0);

    // Space again: the store kept serving and saves now succeed.
    const failed = m.get('kvstash_store_saves_not_written_total{cause="failed"}');
    const saved = metricSum(m, 'kvstash_store_saves_total');
    unlinkSync(filler);
    await say(srv, [sys('Full4')], 'Hello?', 'Full4 turn 1');
    m = await settleStore(srv);
    assert.ok(metricSum(m, 'kvstash_store_saves_total') > saved, 'saves succeed once there is room');
    assert.equal(m.get('kvstash_store_saves_not_written_total{cause="failed"}'), failed);
    assert.ok((await kvFiles(dirs.disk)).length > 0);
    await stopOk(srv);
    srv = null;
    assert.deepEqual(await tempFiles(dirs.disk), []);
    const v = await cli('verify', dirs);
    assert.equal(v.code, 0, `verify:\n${v.stdout}${v.stderr}`);
  } finally {
    if (srv) await srv.stop();
    let u = spawnSync('umount', [mnt], { encoding: 'utf8' });
    if (u.status !== 0) u = spawnSync('umount', ['-l', mnt], { encoding: 'utf8' });
    assert.equal(u.status, 0, `umount ${mnt}: ${u.stderr}`);
    mounted = null;
  }
});
