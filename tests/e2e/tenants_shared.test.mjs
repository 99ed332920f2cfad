// tenants_shared.test.mjs — what a server with tenants shares with others
// and between its tenants (issue 28, the rest of "many users, one server"):
// the default shm directory said at start when keys or a cache secret are
// in force (every server of the Unix user shares it).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, writeStoreConfig, postJSON, getJSON, assertError, settleStore, metrics } from './lib.mjs';

const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-tenants-shared-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const SHARED = /W serve\s+store: the default shm tier \S+ is shared with every kvstash process of uid \d+ on this host/;

test('the default shm directory: a warning at start with keys or a cache secret, none with a directory of its own', async () => {
  const secret = path.join(dir, 'secret');
  writeFileSync(secret, 'a-cache-secret-of-32-bytes-or-so\n', { mode: 0o600 });
  const own = await writeStoreConfig(path.join(dir, 'own.yaml'), { cacheDir: path.join(dir, 'disk-own'), shmDir: path.join(dir, 'shm-own') });
  const cases = [
    // [flags, warned, what the warning says]
    [['--cache-dir', path.join(dir, 'disk1'), '--api-key', 'KA', '--api-key', 'KB'], true, /tenants/],
    [['--cache-dir', path.join(dir, 'disk2'), '--api-key', 'KA'], true, /tenants/],
    [['--cache-dir', path.join(dir, 'disk3'), '--cache-secret-file', secret], true, /without this cache secret .* refused here/],
    [['--cache-dir', path.join(dir, 'disk4')], false],
    [['--config', own, '--api-key', 'KA', '--api-key', 'KB', '--cache-secret-file', secret], false],
  ];
  for (const [flags, warned, says] of cases) {
    const srv = await startServer(flags);
    try {
      const err = srv.stderr;
      assert.match(err, /store: shm tier \S+ .*is shared with every kvstash process of uid/, 'the info line, always');
      if (warned) {
        assert.match(err, SHARED, `${flags.join(' ')}: ${err}`);
        assert.match(err.split('\n').filter((l) => SHARED.test(l)).join('\n'), says);
        assert.match(err, /give store\.shm_dir a directory of this server's own/);
      } else {
        assert.doesNotMatch(err, SHARED, flags.join(' '));
      }
    } finally {
      await stopOk(srv);
    }
  }
});

// Fairness between tenants (src/cache/route.h invariant 5): a tenant's run
// of requests evicts its own slots before anyone else's. Before, B's second
// unrelated request took the least recently used slot of all — A's — and
// A's next turn was a miss on its slot. And id_slot cannot name another
// tenant's slot to evict it.
const auth = (key) => ({ headers: { authorization: `Bearer ${key}` } });
async function ask(srv, key, content, extra = {}) {
  const r = await postJSON(srv, '/v1/chat/completions',
    { messages: [{ role: 'user', content }], temperature: 0, max_tokens: 4, ...extra }, auth(key));
  assert.equal(r.status, 200, r.text);
  return r.json;
}
const TOPICS = ['tulips in spring and the gardens of the old town', 'the rules of cricket explained slowly',
  'a recipe for bread with rye and caraway seeds', 'why the sky is blue at noon and red at dusk',
  'the history of the printing press in Europe', 'how bees find their way back to the hive'];

test('B\'s burst of requests reuses B\'s own slot and leaves A\'s idle slot alone', async () => {
  const srv = await startServer(['--slots', '2', '--api-key', 'KA', '--api-key', 'KB']);
  try {
    const A = 'my notes on the quarterly budget review and the numbers for the board meeting';
    const a1 = await ask(srv, 'KA', A);
    const b1 = await ask(srv, 'KB', TOPICS[0]);
    assert.notEqual(b1.cache.slot, a1.cache.slot);
    for (const t of TOPICS.slice(1)) {
      const r = await ask(srv, 'KB', t);
      assert.equal(r.cache.slot, b1.cache.slot, `B took A's idle slot: ${JSON.stringify(r.cache)}`);
    }
    // A's slot survived: its next turn continues there.
    const a2 = await postJSON(srv, '/v1/chat/completions', { temperature: 0, max_tokens: 4,
      messages: [{ role: 'user', content: A }, a1.choices[0].message, { role: 'user', content: 'and the totals?' }] },
    auth('KA'));
    assert.equal(a2.status, 200, a2.text);
    assert.equal(a2.json.cache.slot, a1.cache.slot, JSON.stringify(a2.json.cache));
    assert.notEqual(a2.json.cache.mode, 'miss', JSON.stringify(a2.json.cache));
    assert.ok(a2.json.usage.prompt_tokens_details.cached_tokens >= a1.usage.prompt_tokens - 1, JSON.stringify(a2.json.cache));
    // id_slot naming A's slot: routed as any request of B's, A's slot kept.
    const pinned = await ask(srv, 'KB', TOPICS[0] + ' again', { id_slot: a1.cache.slot });
    assert.equal(pinned.cache.slot, b1.cache.slot, JSON.stringify(pinned.cache));
    const a3 = await postJSON(srv, '/v1/chat/completions', { temperature: 0, max_tokens: 4,
      messages: [{ role: 'user', content: A }, a1.choices[0].message, { role: 'user', content: 'and the totals?' }] },
    auth('KA'));
    assert.equal(a3.json.cache.slot, a1.cache.slot);
    assert.notEqual(a3.json.cache.mode, 'miss', JSON.stringify(a3.json.cache));
    // A's own pin is honoured.
    const a4 = await ask(srv, 'KA', A, { id_slot: a1.cache.slot });
    assert.equal(a4.cache.slot, a1.cache.slot);
  } finally {
    await stopOk(srv);
  }
});

// /metrics counts every tenant's requests together (hits, misses,
// evictions): with several tenants a tenant's key does not open it, only the
// metrics key does (src/server/auth.c). Before, any key holder read the
// hit counters and learnt when other tenants hit.
test('/metrics with several tenants answers only the metrics key; with one tenant any key, as before', async () => {
  const get = (srv, key) => getJSON(srv, '/metrics', key ? auth(key) : {});
  let srv = await startServer(['--api-key', 'KA', '--api-key', 'KB']);
  try {
    const r = await get(srv, 'KA');
    assertError(r, 403, 'permission_denied');
    assert.match(r.json.error.message, /--metrics-key/);
    assert.equal((await get(srv, null)).status, 401);
    assert.match(srv.stderr, /\/metrics shows every tenant's counters: no metrics key/);
  } finally { await stopOk(srv); }
  srv = await startServer(['--api-key', 'KA', '--api-key', 'KB', '--metrics-key', 'MK']);
  try {
    const ok = await get(srv, 'MK');
    assert.equal(ok.status, 200);
    assert.match(ok.text, /kvstash_prompt_tokens_cached_total/);
    assertError(await get(srv, 'KB'), 403, 'permission_denied');
    assert.equal((await get(srv, 'nope')).status, 401);
    // the metrics key opens /metrics only
    const chat = await postJSON(srv, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 }, auth('MK'));
    assert.equal(chat.status, 401);
    assert.equal((await getJSON(srv, '/slots', auth('MK'))).status, 401);
  } finally { await stopOk(srv); }
  // One tenant: its key opens /metrics as before, and so does a metrics key.
  srv = await startServer(['--api-key', 'KA', '--metrics-key', 'MK']);
  try {
    assert.equal((await get(srv, 'KA')).status, 200);
    assert.equal((await get(srv, 'MK')).status, 200);
  } finally { await stopOk(srv); }
  // No API keys: a metrics key alone guards /metrics; the API stays open.
  srv = await startServer(['--metrics-key', 'MK']);
  try {
    assert.equal((await get(srv, null)).status, 401);
    assert.equal((await get(srv, 'MK')).status, 200);
    const chat = await postJSON(srv, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 });
    assert.equal(chat.status, 200);
  } finally { await stopOk(srv); }
});

// Warm start (--warm-slots) takes every tenant's states: each kvfile records
// its tenant (its key binds it), and the slot takes that tenant as its owner.
// Before, warm start recomputed every key as tenant 0's: a server with keys
// warmed no slot at all ("no stored state").
test('warm start puts each tenant\'s latest conversation into the slots, owned by that tenant', async () => {
  const d = mkdtempSync(path.join(dir, 'warm-'));
  const cfg = await writeStoreConfig(path.join(d, 'c.yaml'),
    { cacheDir: path.join(d, 'disk'), shmDir: path.join(d, 'shm'), stride: 16, minTokens: 16 });
  const keys = ['--api-key', 'KA', '--api-key', 'KB', '--api-key', 'KC', '--api-key', 'KD', '--metrics-key', 'MK'];
  const sys = (topic) => ({ role: 'system', content: `${topic}: you are a careful assistant who answers briefly. `.repeat(3) });
  const say = async (srv, key, msgs, content) => {
    msgs.push({ role: 'user', content });
    const r = await postJSON(srv, '/v1/chat/completions', { messages: msgs, temperature: 0, max_tokens: 8 }, auth(key));
    assert.equal(r.status, 200, r.text);
    msgs.push({ role: 'assistant', content: r.json.choices[0].message.content ?? '' });
    return r.json;
  };
  const x = [sys('Warmx')], y = [sys('Warmy')];
  let lastX, lastY;
  const a = await startServer(['--config', cfg, ...keys]);
  try {
    for (const u of ['Hello there.', 'What did I just say?']) lastX = await say(a, 'KA', x, u);
    for (const u of ['Good morning.', 'And then?']) lastY = await say(a, 'KB', y, u);
    await settleStore(a, 30000, { authorization: 'Bearer MK' });
  } finally {
    await stopOk(a);
  }
  const b = await startServer(['--config', cfg, ...keys, '--warm-slots', '2']);
  try {
    const m0 = await metrics(b, { authorization: 'Bearer MK' });
    assert.equal(m0.get('kvstash_warm_slots_total'), 2, `two slots warmed:\n${b.stderr}`);
    for (const [key, msgs, last] of [['KA', x, lastX], ['KB', y, lastY]]) {
      const r = await say(b, key, msgs, 'Thanks, bye.');
      assert.equal(r.cache.mode, 'prefix', `${key}: ${JSON.stringify(r.cache)}`);
      assert.ok(r.usage.prompt_tokens_details.cached_tokens >= last.usage.prompt_tokens, `${key}: ${JSON.stringify(r.cache)}`);
    }
    // C sends A's very conversation: it takes a slot (A's, the least recently
    // used) and reuses nothing of it — not its KV, and not the pieces of its
    // text the tokenization cache holds for A. C's render takes from the cache
    // only what its own prompt holds twice (the system message's render for
    // its SPC key is the prompt's first piece); A, sending the same, takes
    // nearly all of it.
    const fromCache = async (key) => {
      const m0 = await metrics(b, { authorization: 'Bearer MK' });
      const r = await postJSON(b, '/v1/chat/completions', { messages: x, temperature: 0, max_tokens: 4 }, auth(key));
      assert.equal(r.status, 200, r.text);
      const m1 = await metrics(b, { authorization: 'Bearer MK' });
      return [r.json, m1.get('kvstash_prompt_tokens_untokenized_total') - m0.get('kvstash_prompt_tokens_untokenized_total')];
    };
    const [c, cTook] = await fromCache('KC');
    assert.equal(c.usage.prompt_tokens_details.cached_tokens, 0, JSON.stringify(c.cache));
    const [, aTook] = await fromCache('KA');
    assert.ok(cTook + 40 < aTook, `from the tokenization cache: C ${cTook}, A ${aTook} of ${c.usage.prompt_tokens} tokens`);
    // count_tokens is a tenant's own too (issue 42: it rendered in one
    // namespace for every key): D, new, counting after A takes nothing of A's.
    const counted = async (key) => {
      const m0 = await metrics(b, { authorization: 'Bearer MK' });
      const r = await postJSON(b, '/v1/messages/count_tokens', { model: 'm', system: x[0].content,
        messages: [...x.slice(1), { role: 'user', content: 'Count me.' }] }, auth(key));
      assert.equal(r.status, 200, r.text);
      const m1 = await metrics(b, { authorization: 'Bearer MK' });
      return [r.json.input_tokens, m1.get('kvstash_prompt_tokens_untokenized_total') - m0.get('kvstash_prompt_tokens_untokenized_total')];
    };
    await counted('KA');
    const [n, dCount] = await counted('KD');
    const [, aCount] = await counted('KA');
    assert.ok(dCount + 40 < aCount, `count_tokens from the tokenization cache: D ${dCount}, A ${aCount} of ${n} tokens`);
  } finally {
    await stopOk(b);
  }
});
