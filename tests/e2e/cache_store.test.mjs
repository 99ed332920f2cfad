// cache_store.test.mjs — the server with every cache on (IMC, SPC and the
// persistent store, from a --config file): outputs equal an uncached
// server's, the store survives a restart, and the caches' counters show on /metrics.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startServer, stopOk, chat, metrics, slots } from './lib.mjs';

let dir;
let config;
let plain; // --no-cache-prompt: the reference outputs
before(async () => {
  dir = mkdtempSync(path.join(tmpdir(), 'kvstash-e2e-'));
  // Every directory inside the test's own: nothing lands in ~/.cache or /dev/shm.
  // port 1 and slots 3 check the precedence: the flag --port 0 wins, slots stays.
  config = path.join(dir, 'kvstash.yaml');
  writeFileSync(config, [
    'port: 1',
    'slots: 3',
    'models:',
    '  default:',
    '    incremental_cache: true',
    '    system_prompt_cache: true',
    'store:',
    '  enabled: true',
    `  cache_dir: ${path.join(dir, 'store')}`,
    `  shm_dir: ${path.join(dir, 'shm')}`,
    '',
  ].join('\n'));
  plain = await startServer(['--ctx', '2048', '--no-cache-prompt']);
});
after(async () => {
  if (plain) await stopOk(plain);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

// The first turn is a cold prefill: it leaves a cold save at the prompt's last
// stride multiple (256) that a replay of the same prompt can restore.
const CACHED = () => ['--ctx', '2048', '--config', config];
// Long enough (> store.min_tokens 256, > cache_min_tokens 100) for every tier to take it.
const system = { role: 'system', content: 'You are a careful assistant who answers briefly. '.repeat(40) };

async function converse(srv, users) {
  const msgs = [system];
  const out = [];
  for (const u of users) {
    msgs.push({ role: 'user', content: u });
    const r = await chat(srv, msgs, { max_tokens: 12 });
    msgs.push({ role: 'assistant', content: r.choices[0].message.content });
    out.push(r);
  }
  return out;
}

test('all caches on: replies equal the uncached server, and the store survives a restart', async () => {
  const users = ['Hello there.', 'What did I just say?', 'Thanks, bye.'];
  const ref = await converse(plain, users);

  const a = await startServer(CACHED(), { defaults: false });
  let first;
  try {
    first = await converse(a, users);
    for (let i = 0; i < users.length; i++) {
      assert.equal(first[i].choices[0].message.content, ref[i].choices[0].message.content, `turn ${i + 1}`);
    }
    assert.ok(first[1].usage.prompt_tokens_details.cached_tokens > 0);
    const m = await metrics(a);
    assert.ok(m.has('kvstash_spc_entries'));
    assert.ok(m.has('kvstash_store_lookups_total'));
    assert.ok(m.has('kvstash_cache_decisions_total{decision="miss"}'));
    assert.equal((await slots(a)).length, 3, 'slots from the config file');
  } finally {
    await stopOk(a); // the store writes what is queued before exit
  }
  assert.ok(readdirSync(path.join(dir, 'store')).some((f) => f.endsWith('.kvs')), 'kv files on disk');

  // A new process on the same directory: the first turn comes from the store.
  const b = await startServer(CACHED(), { defaults: false }); // same slot count as a
  try {
    const again = await converse(b, users.slice(0, 1));
    const r = again[0];
    assert.equal(r.choices[0].message.content, ref[0].choices[0].message.content);
    assert.equal(r.cache.mode, 'store', JSON.stringify(r.cache));
    assert.ok(r.usage.prompt_tokens_details.cached_tokens > 0);
    // The same prompt again: only a cold save (stride 256) is a proper prefix of it.
    assert.equal(r.usage.prompt_tokens_details.cached_tokens % 256, 0, JSON.stringify(r.usage));
    assert.ok(['ram', 'shm', 'disk'].includes(r.cache.tier));
    assert.equal(typeof r.cache.restore_ms, 'number');
    const m = await metrics(b);
    assert.ok(m.get('kvstash_store_hits_total') >= 1);
  } finally {
    await stopOk(b);
  }
});

test('two users sharing a system prompt get the uncached replies', async () => {
  const srv = await startServer(CACHED());
  try {
    for (const u of ['I am user one.', 'I am user two.', 'I am user three.']) {
      const [r] = await converse(srv, [u]);
      const [p] = await converse(plain, [u]);
      assert.equal(r.choices[0].message.content, p.choices[0].message.content, u);
    }
  } finally {
    await stopOk(srv);
  }
});

// A conversation whose slot was taken over comes back from the store alone:
// when the store holds more than the system prompt, SPC's state is not
// restored first (that restore would be overwritten right away).
test('a conversation back on a taken-over slot: restored from the store, not from SPC then the store', async () => {
  const sysA = { role: 'system', content: 'Agent A: you plan the work and answer briefly. '.repeat(12) };
  const sysB = { role: 'system', content: 'Agent B: you review the work and answer briefly. '.repeat(12) };
  const srv = await startServer([...CACHED(), '--slots', '1'], { defaults: false });
  try {
    const run = async (msgs) => {
      const r = await chat(srv, msgs, { max_tokens: 8 });
      const p = await chat(plain, msgs, { max_tokens: 8 });
      assert.equal(r.choices[0].message.content, p.choices[0].message.content, JSON.stringify(r.cache));
      return r;
    };
    const a = [sysA, { role: 'user', content: 'Plan a small garden.' }];
    const a1 = await run(a);
    a.push({ role: 'assistant', content: a1.choices[0].message.content }, { role: 'user', content: 'And the watering?' });
    await run([sysB, { role: 'user', content: 'Review the plan.' }]); // takes the only slot
    const m0 = await metrics(srv);
    assert.ok(m0.get('kvstash_spc_entries') >= 1, 'SPC holds a system prompt');
    const a2 = await run(a);
    const m1 = await metrics(srv);
    assert.equal(a2.cache.mode, 'store', JSON.stringify(a2.cache));
    assert.ok(a2.usage.prompt_tokens_details.cached_tokens > a1.usage.prompt_tokens - 8,
      `A's first turn came back (${JSON.stringify(a2.usage)})`);
    assert.equal(m1.get('kvstash_spc_restored_tokens_total'), m0.get('kvstash_spc_restored_tokens_total'),
      'no SPC restore before the store restore');
  } finally {
    await stopOk(srv);
  }
});
