// tenants.test.mjs — issue 28: many API keys, one server; a tenant cannot
// read another's prompts through the cache, nor take over its stored
// Responses conversations (docs/SECURITY.md "Tenants", "Ids and stored
// conversations").
//
// The attack of the issue, over real HTTP: A sends a prompt with a secret;
// B, holding another valid key, sends guesses that share a long prefix with
// it. Before tenants, B's guess was routed to A's slot (or copied it, or
// restored A's stored state) and reported how many tokens matched
// (cached_tokens, cache.reason diverged-at-token-N). Now each of B's guesses
// must look exactly like a request that shares nothing: compared with a
// control request sent by a third key in the same situation.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, rmSync, writeFileSync, renameSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  startServer, stopOk, postJSON, getJSON, assertError, writeConfig, writeStoreConfig, settleStore,
} from './lib.mjs';

const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-tenants-'));
after(() => rmSync(dir, { recursive: true, force: true }));

const SECRET = 'my bank PIN is 4921 and my mother maiden name is Smith and I live at 12 Oak street';
const GUESSES = ['my bank PIN is 4921 and my mother maiden name is Jones',
  'my bank PIN is 4921 and my mother maiden name is Smith and I live at 12 Oak road',
  SECRET];
const CONTROLS = ['completely unrelated words about gardening and tulips in spring',
  'a second control that shares nothing with anything sent before it'];

const auth = (key) => (key ? { headers: { authorization: `Bearer ${key}` } } : {});
async function ask(srv, key, content, extra = {}) {
  const messages = Array.isArray(content) ? content : [{ role: 'user', content }];
  const r = await postJSON(srv, '/v1/chat/completions', { messages, temperature: 0, max_tokens: 4, ...extra },
    auth(key));
  assert.equal(r.status, 200, r.text);
  return r.json;
}
// What a response says about the cache: every field a client could learn from.
const seen = (r) => ({
  cached: r.usage.prompt_tokens_details.cached_tokens,
  mode: r.cache.mode,
  reason: r.cache.reason ?? '',
  cache_n: r.timings.cache_n,
  prefilled: r.timings.prompt_n === r.usage.prompt_tokens,
});
const MISS = (reason) => ({ cached: 0, mode: 'miss', reason, cache_n: 0, prefilled: true });

test('another key\'s guesses at a prompt look like any miss, and the victim\'s slot survives them', async () => {
  const srv = await startServer(['--slots', '4', '--api-key', 'KA', '--api-key', 'KB', '--api-key', 'KC']);
  try {
    const a1 = await ask(srv, 'KA', SECRET);
    assert.deepEqual(seen(a1), MISS('no-slot'));
    // Each guess of B next to a control of C, both taking an empty slot: the
    // same answer whatever B shares with A.
    const b = await ask(srv, 'KB', GUESSES[0]);
    const c = await ask(srv, 'KC', CONTROLS[0]);
    assert.deepEqual(seen(b), MISS('no-slot'), 'B guess 1');
    assert.deepEqual(seen(c), MISS('no-slot'), 'C control');
    // B's further guesses, one of them the whole secret: B may reuse only
    // its own slot (what it sent itself), never A's tokens.
    for (const g of GUESSES.slice(1)) {
      const r = await ask(srv, 'KB', g);
      assert.equal(r.cache.slot, b.cache.slot, `B left its own slot: ${JSON.stringify(r.cache)}`);
      assert.equal(r.cache.mode, 'prefix', `B took more than its own slot: ${JSON.stringify(r.cache)}`);
    }
    // A's slot survived: its next request is all cached, from its own slot.
    const a2 = await ask(srv, 'KA', SECRET);
    assert.equal(a2.cache.slot, a1.cache.slot, JSON.stringify(a2.cache));
    assert.equal(a2.usage.prompt_tokens_details.cached_tokens, a1.usage.prompt_tokens - 1, JSON.stringify(a2.cache));
    // /slots shows each key its own slots' counts, and of the others their state only.
    const slotsOf = async (key) => (await getJSON(srv, '/slots', auth(key))).json;
    const [sa, sb] = [await slotsOf('KA'), await slotsOf('KB')];
    assert.equal(sa[a1.cache.slot].n_prompt, a1.usage.prompt_tokens);
    assert.equal(sb[a1.cache.slot].n_prompt, null);
    assert.equal(sb[a1.cache.slot].n_tokens, null);
    assert.equal(typeof sb[b.cache.slot].n_prompt, 'number'); // B's own: shown
    assert.ok(sb[b.cache.slot].n_tokens > 0);
    // Within one tenant the cache works as before: A's variant reuses A's prefix.
    const a3 = await ask(srv, 'KA', GUESSES[0]);
    assert.ok(a3.usage.prompt_tokens_details.cached_tokens > 16, JSON.stringify(a3.cache));
  } finally {
    await stopOk(srv);
  }
});

test('the store keeps tenants apart: another key never restores A\'s saved state', async () => {
  const d = mkdtempSync(path.join(dir, 'store-'));
  const cfg = await writeStoreConfig(path.join(d, 'c.yaml'),
    { cacheDir: path.join(d, 'disk'), shmDir: path.join(d, 'shm'), stride: 16, minTokens: 16 });
  const srv = await startServer(['--slots', '1', '--config', cfg, '--api-key', 'KA', '--api-key', 'KB',
    '--api-key', 'KC', '--metrics-key', 'MK']);
  try {
    const a1 = await ask(srv, 'KA', SECRET);
    await ask(srv, 'KC', CONTROLS[0]); // takes A's slot over: A's state is saved (evict, finish)
    await settleStore(srv, 30000, { authorization: 'Bearer MK' });
    // B guesses with the slot holding C's state and A's in the store; C
    // sends a control in the same situation (the slot now B's).
    const b = await ask(srv, 'KB', SECRET);
    const c = await ask(srv, 'KC', CONTROLS[1]);
    assert.deepEqual(seen(b), MISS('evicted'), JSON.stringify(b.cache));
    assert.deepEqual(seen(c), MISS('evicted'), JSON.stringify(c.cache));
    await settleStore(srv, 30000, { authorization: 'Bearer MK' });
    // A's own state is still there for A.
    const a2 = await ask(srv, 'KA', SECRET);
    assert.equal(a2.cache.mode, 'store', JSON.stringify(a2.cache));
    assert.ok(a2.usage.prompt_tokens_details.cached_tokens >= 16, JSON.stringify(a2.cache));
    assert.ok(a2.usage.prompt_tokens_details.cached_tokens < a1.usage.prompt_tokens);
  } finally {
    await stopOk(srv);
  }
});

test('previous_response_id: ids are 128 random bits, and another key\'s id is not found', async () => {
  const srv = await startServer(['--api-key', 'KA', '--api-key', 'KB']);
  const resp = (key, body) => postJSON(srv, '/v1/responses', { max_output_tokens: 4, temperature: 0, ...body }, auth(key));
  try {
    const ids = [];
    for (let i = 0; i < 3; i++) {
      const r = await resp('KA', { input: `hello number ${i}` });
      assert.equal(r.status, 200, r.text);
      assert.match(r.json.id, /^resp_[0-9a-f]{32}$/);
      ids.push(r.json.id);
    }
    assert.equal(new Set(ids).size, ids.length);
    const own = await resp('KA', { input: 'go on', previous_response_id: ids[0] });
    assert.equal(own.status, 200, own.text);
    // B with A's real id, and with a made-up one: the same error.
    const stolen = await resp('KB', { input: 'go on', previous_response_id: ids[1] });
    const guessed = await resp('KB', { input: 'go on', previous_response_id: `resp_${'0'.repeat(32)}` });
    assertError(stolen, 400, 'previous_response_not_found', 'previous_response_id');
    assertError(guessed, 400, 'previous_response_not_found', 'previous_response_id');
    const shape = (r) => r.json.error.message.replace(/'resp_[0-9a-f]+'/, "'ID'");
    assert.equal(shape(stolen), shape(guessed));
    // A can still continue it.
    assert.equal((await resp('KA', { input: 'go on', previous_response_id: ids[1] })).status, 200);
  } finally {
    await stopOk(srv);
  }
});

test('key file: names make tenants, and it is read again when rewritten (no restart)', async () => {
  const file = path.join(dir, 'keys');
  const write = (text) => { // whole, by rename: never half a file; private (others may not read keys)
    writeFileSync(file + '.tmp', text, { mode: 0o600 });
    renameSync(file + '.tmp', file);
  };
  write('# key   tenant\nK1 alice\nK2 alice\nK3 bob\n\n');
  const srv = await startServer(['--slots', '4', '--api-key-file', file]);
  try {
    await ask(srv, 'K1', SECRET);
    // K2 is alice too: it shares alice's cache, on purpose.
    const same = await ask(srv, 'K2', GUESSES[0]);
    assert.ok(same.usage.prompt_tokens_details.cached_tokens > 16, JSON.stringify(same.cache));
    // K3 is bob: nothing.
    assert.deepEqual(seen(await ask(srv, 'K3', GUESSES[1])), MISS('no-slot'));
    const body = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 };
    assertError(await postJSON(srv, '/v1/chat/completions', body, auth('K4')), 401, 'invalid_api_key');

    // Rotation: K1 out, K4 in (alice's new key keeps alice's cache).
    write('K2 alice\nK3 bob\nK4 alice\n');
    assertError(await postJSON(srv, '/v1/chat/completions', body, auth('K1')), 401, 'invalid_api_key');
    const k4 = await ask(srv, 'K4', SECRET);
    assert.equal(k4.usage.prompt_tokens_details.cached_tokens, k4.usage.prompt_tokens - 1, JSON.stringify(k4.cache));
    // A broken file is refused whole: the keys read last stay in force.
    write('K2 alice\nthis line has three fields\n');
    assert.equal((await postJSON(srv, '/v1/chat/completions', body, auth('K4'))).status, 200);
    assert.match(srv.stderr, /line 2: expected 'KEY \[NAME\]'.*stay in force/);
    // SIGHUP reads it again too.
    write('K9\n');
    srv.proc.kill('SIGHUP');
    assertError(await postJSON(srv, '/v1/chat/completions', body, auth('K4')), 401, 'invalid_api_key');
    assert.equal((await postJSON(srv, '/v1/chat/completions', body, auth('K9'))).status, 200);
  } finally {
    await stopOk(srv);
  }
});

test('a bad key file or --tenant-by stops the server at start (exit 2)', async () => {
  const bad = path.join(dir, 'bad-keys');
  writeFileSync(bad, 'a b c\n');
  for (const args of [['--api-key-file', bad], ['--api-key-file', path.join(dir, 'missing')],
    ['--tenant-by', 'prompt_cache_key,nonsense']]) {
    await assert.rejects(startServer(args), /exited \(code 2/, args.join(' '));
  }
});

// Issue 42: another local user must not be able to add a key, and no key
// setting may turn authentication off or blur two tenants without a word.
test('key files others may write, empty keys, a key given twice, a metrics key that is an API key: exit 2', async () => {
  const file = path.join(dir, 'keys-mode');
  writeFileSync(file, 'K1 alice\n');
  for (const [mode, what] of [[0o666, /writable by others/], [0o620, /writable by its group/],
    [0o644, /readable by others: they hold its keys/]]) {
    chmodSync(file, mode);
    await assert.rejects(startServer(['--api-key-file', file]), (e) => /exited \(code 2/.test(e.message) && what.test(e.message),
      mode.toString(8));
  }
  const dup = path.join(dir, 'keys-dup');
  writeFileSync(dup, 'K1 alice\nK1 bob\n', { mode: 0o600 });
  await assert.rejects(startServer(['--api-key-file', dup]), /line 2: a key given before/);
  await assert.rejects(startServer(['--api-key', '']), /--api-key: empty/);
  await assert.rejects(startServer([], { env: { KVSTASH_API_KEY: '' } }), /KVSTASH_API_KEY is set but empty/);
  await assert.rejects(startServer(['--api-key', 'KA', '--api-key', 'KA']), /API key 2 is given twice/);
  await assert.rejects(startServer(['--api-key', 'KA', '--api-key', 'KB', '--metrics-key', 'KA']),
    /the metrics key is also an API key/);
  // Readable by its group: taken, with a warning. Made writable by others
  // while the server runs: not read again, the keys read before stay in force.
  chmodSync(file, 0o640);
  const srv = await startServer(['--api-key-file', file]);
  try {
    assert.match(srv.stderr, /key file .* is readable by its group/);
    const body = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 };
    assert.equal((await postJSON(srv, '/v1/chat/completions', body, auth('K1'))).status, 200);
    writeFileSync(file, 'K1 alice\nK666 mallory\n');
    chmodSync(file, 0o666);
    assertError(await postJSON(srv, '/v1/chat/completions', body, auth('K666')), 401, 'invalid_api_key');
    assert.equal((await postJSON(srv, '/v1/chat/completions', body, auth('K1'))).status, 200);
    assert.match(srv.stderr, /writable by others: another user could add a key .*stay in force/);
  } finally {
    await stopOk(srv);
  }
});

// Issue 41: each tenant's own view. /metrics (the metrics key's) counts each
// tenant's use under the key file's names, the rest as "other", never a key;
// GET /tenant shows a key its own tenant's numbers and nothing of another's.
test('per-tenant counters: /metrics by the key file\'s names, GET /tenant a key\'s own', async () => {
  const file = path.join(dir, 'keys-usage');
  writeFileSync(file, 'KA1 alice\nKA2 alice\nKB1 bob\nKU\n', { mode: 0o600 });
  const srv = await startServer(['--slots', '4', '--api-key-file', file, '--metrics-key', 'MK']);
  try {
    await ask(srv, 'KA1', SECRET);
    const a2 = await ask(srv, 'KA2', SECRET); // alice's second key: the same tenant, its cache
    assert.ok(a2.usage.prompt_tokens_details.cached_tokens > 0);
    await ask(srv, 'KB1', CONTROLS[0]);
    await ask(srv, 'KU', CONTROLS[1]);
    const m = await getJSON(srv, '/metrics', auth('MK'));
    assert.equal(m.status, 200);
    const text = m.text;
    const val = (name, tenant) => Number(new RegExp(`^${name}\\{tenant="${tenant}"\\} (\\S+)$`, 'm').exec(text)?.[1]);
    assert.equal(val('kvstash_tenant_requests_total', 'alice'), 2, text);
    assert.equal(val('kvstash_tenant_requests_total', 'bob'), 1);
    assert.equal(val('kvstash_tenant_requests_total', 'other'), 1);
    assert.equal(val('kvstash_tenant_cached_tokens_total', 'alice'), a2.usage.prompt_tokens_details.cached_tokens);
    assert.equal(val('kvstash_tenant_cached_tokens_total', 'bob'), 0);
    assert.ok(val('kvstash_tenant_slots', 'alice') >= 1);
    for (const k of ['KA1', 'KA2', 'KB1', 'KU']) assert.ok(!text.includes(k), `a key in /metrics: ${k}`);
    // Each key's own view.
    const bob = await getJSON(srv, '/tenant', auth('KB1'));
    assert.equal(bob.status, 200, bob.text);
    assert.equal(bob.json.tenant, 'bob');
    assert.equal(bob.json.requests, 1);
    assert.equal(bob.json.cached_tokens, 0);
    assert.equal(bob.json.slots, 1);
    const alice = await getJSON(srv, '/tenant', auth('KA2'));
    assert.equal(alice.json.tenant, 'alice');
    assert.equal(alice.json.requests, 2);
    assert.ok(alice.json.cache_hit_rate > 0 && alice.json.cache_hit_rate < 1);
    const u = await getJSON(srv, '/tenant', auth('KU'));
    assert.equal(u.json.tenant, null);
    assert.equal(u.json.requests, 1);
    assert.equal((await getJSON(srv, '/tenant', auth('nope'))).status, 401);
    // The metrics key added to the key file while serving: the file is refused
    // as a bad one (a review found the rule held only at start).
    writeFileSync(file, 'KA1 alice\nKA2 alice\nKB1 bob\nKU\nMK mallory\n', { mode: 0o600 });
    const body = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 1 };
    assertError(await postJSON(srv, '/v1/chat/completions', body, auth('MK')), 401, 'invalid_api_key');
    assert.match(srv.stderr, /line 5: the metrics key is not an API key/);
    assert.equal((await postJSON(srv, '/v1/chat/completions', body, auth('KB1'))).status, 200);
  } finally {
    await stopOk(srv);
  }
});

const LONG_SYS = 'You are the support assistant of a large online shop that sells garden tools, seeds, pots, soil ' +
  'and outdoor furniture. Answer politely, in short sentences, and always suggest one product that fits.';
const sysMsgs = (user) => [{ role: 'system', content: LONG_SYS }, { role: 'user', content: user }];

test('--share-system-prompt shares system prompt states across tenants; without it, none', async () => {
  const cfg = writeConfig('affinity_min: 0.99\nmodels:\n  default:\n    cache_min_tokens: 16\n');
  for (const share of [true, false]) {
    const srv = await startServer(['--spc', '--slots', '3', '--config', cfg, '--api-key', 'KA', '--api-key', 'KB',
      ...(share ? ['--share-system-prompt'] : [])]);
    try {
      const a = await ask(srv, 'KA', sysMsgs('how do I plant tulips'));
      assert.equal(a.cache.mode, 'miss');
      const b = await ask(srv, 'KB', sysMsgs('which soil for roses'));
      if (share) {
        assert.equal(b.cache.mode, 'spc', JSON.stringify(b.cache));
        assert.ok(b.usage.prompt_tokens_details.cached_tokens > 16, JSON.stringify(b.cache));
      } else {
        assert.deepEqual(seen(b), MISS('no-slot'), JSON.stringify(b.cache));
      }
      // A's own tenant gets it either way.
      const a2 = await ask(srv, 'KA', sysMsgs('best pot for a lemon tree'));
      assert.equal(a2.cache.mode, 'spc', JSON.stringify(a2.cache));
    } finally {
      await stopOk(srv);
    }
  }
});

test('--tenant-by: prompt_cache_key, cache_salt and user subdivide a key; the same value shares', async () => {
  const srv = await startServer(['--slots', '8', '--tenant-by', 'prompt_cache_key,cache_salt,user']);
  try {
    await ask(srv, null, SECRET, { prompt_cache_key: 'team-1' });
    for (const other of [{ prompt_cache_key: 'team-2' }, { cache_salt: 'x' }, { user: 'bob' }, {},
      { prompt_cache_key: 'team-1', user: 'bob' }]) {
      const r = await ask(srv, null, GUESSES[0], other);
      assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0, `${JSON.stringify(other)}: ${JSON.stringify(r.cache)}`);
    }
    const same = await ask(srv, null, GUESSES[1], { prompt_cache_key: 'team-1' });
    assert.ok(same.usage.prompt_tokens_details.cached_tokens > 16, JSON.stringify(same.cache));
    // cache_salt is used here, so not logged as an ignored field.
    assert.doesNotMatch(srv.stderr, /ignored an unknown field 'cache_salt'/);
    // Anthropic's metadata.user_id is the user.
    const msg = (user) => postJSON(srv, '/v1/messages', { model: 'm', max_tokens: 4, temperature: 0,
      metadata: { user_id: user }, messages: [{ role: 'user', content: SECRET + ' and more' }] });
    assert.equal((await msg('u1')).status, 200);
    const m2 = await msg('u2');
    assert.equal(m2.json.usage.cache_read_input_tokens, 0, JSON.stringify(m2.json.usage));
    const m3 = await msg('u1');
    assert.ok(m3.json.usage.cache_read_input_tokens > 16, JSON.stringify(m3.json.usage));
  } finally {
    await stopOk(srv);
  }
});

test('single tenant: without keys, or with one, every request shares the cache as before', async () => {
  for (const keys of [[], ['--api-key', 'KA']]) {
    const key = keys.length ? 'KA' : null;
    const srv = await startServer(['--slots', '4', ...keys]);
    try {
      await ask(srv, key, SECRET);
      const r = await ask(srv, key, GUESSES[0], { user: 'someone-else', prompt_cache_key: 'p' });
      assert.ok(r.usage.prompt_tokens_details.cached_tokens > 16, JSON.stringify(r.cache));
    } finally {
      await stopOk(srv);
    }
  }
});
