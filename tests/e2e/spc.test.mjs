// spc.test.mjs — the System Prompt Cache (seed 000, 5.2) over real HTTP, alone
// and with the Incremental Message Cache: a system prompt is decoded once, then
// restored into other slots; every reply equals the reply of a reference server
// that never caches (--no-cache-prompt), at temperature 0.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  startServer, stopOk, chat, metrics, slots, chatml, countTokens, writeConfig, replyOf,
  assertSameReply, metric, mdelta,
} from './lib.mjs';

let ref; // the uncached reference
before(async () => { ref = await startServer(['--no-cache-prompt', '--slots', '1']); });
after(async () => { if (ref) await stopOk(ref); });

const LONG_SYS =
  'You are the support assistant of a large online shop that sells garden tools, seeds, pots, soil ' +
  'and outdoor furniture. Answer politely, in short sentences, and always suggest one product that fits ' +
  'the question. Never talk about prices you are not sure of and never promise delivery dates.';
const USERS = ['how do I plant tulips', 'which soil for roses', 'best pot for a lemon tree',
  'how often to water ferns', 'a bench for a small garden', 'seeds for a shady spot'];

const sysMsgs = (sys, user) => [{ role: 'system', content: sys }, { role: 'user', content: user }];

// One request on srv, compared with the reference.
async function ask(srv, msgs, what, extra = {}) {
  const r = await chat(srv, msgs, extra);
  assertSameReply(r, await chat(ref, msgs, extra), what);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, r.cache.cached_tokens, `${what}: usage vs cache`);
  return r;
}

// Asserts the counters of "one system prompt, decoded once".
function assertDecodedOnce(m, what) {
  assert.equal(metric(m, 'kvstash_spc_builds_total'), 1, `${what}: SPC builds`);
  assert.equal(metric(m, 'kvstash_sys_prompt_prefills_total'), 1, `${what}: system-prompt prefills`);
  assert.equal(metric(m, 'kvstash_spc_entries'), 1, `${what}: SPC entries`);
  assert.equal(metric(m, 'kvstash_spc_inserts_total'), 1, `${what}: SPC inserts`);
}

test('SPC: 6 users, one long system prompt: decoded once, restored into the other slots, exact replies', async () => {
  // affinity_min 0.99: a user whose prompt is not (almost) all in a slot is
  // not routed by prefix, so users 2 and 3 deterministically take the empty
  // slots, where the system prompt must come from the SPC.
  const cfg = writeConfig('affinity_min: 0.99\nmodels:\n  default:\n    cache_min_tokens: 16\n');
  const srv = await startServer(['--spc', '--slots', '3', '--config', cfg]);
  try {
    const nSys = await countTokens(ref, chatml([{ role: 'system', content: LONG_SYS }], false));
    assert.ok(nSys > 16);
    const r1 = await ask(srv, sysMsgs(LONG_SYS, USERS[0]), 'user 1');
    assert.equal(r1.cache.mode, 'miss', JSON.stringify(r1.cache));
    assert.equal(r1.cache.cached_tokens, 0);
    const m1 = await metrics(srv);
    assertDecodedOnce(m1, 'after user 1');
    assert.equal(metric(m1, 'kvstash_spc_misses_total'), 1, 'the first lookup missed');
    assert.equal(metric(m1, 'kvstash_spc_restored_tokens_total'), 0);

    const modes = [];
    for (const u of [1, 2]) {
      const r = await ask(srv, sysMsgs(LONG_SYS, USERS[u]), `user ${u + 1}`);
      assert.equal(r.cache.mode, 'spc', `user ${u + 1}: ${JSON.stringify(r.cache)}`);
      assert.equal(r.cache.slot, u, 'an empty slot');
      assert.equal(r.cache.cached_tokens, nSys, 'the system prompt, restored');
      assert.equal(r.timings.prompt_n, r.usage.prompt_tokens - nSys);
      modes.push(r.cache.mode);
    }
    // the others at once: whatever slot they land on, the system prompt is
    // never prefilled again
    const rest = await Promise.all([3, 4, 5].map((u) => chat(srv, sysMsgs(LONG_SYS, USERS[u]))));
    for (const [k, r] of rest.entries()) {
      const u = k + 3;
      assertSameReply(r, await chat(ref, sysMsgs(LONG_SYS, USERS[u])), `user ${u + 1}`);
      assert.ok(['spc', 'prefix', 'miss'].includes(r.cache.mode), `user ${u + 1}: ${JSON.stringify(r.cache)}`);
      assert.ok(r.cache.cached_tokens >= nSys, `user ${u + 1}: cached ${r.cache.cached_tokens} < ${nSys}`);
      modes.push(r.cache.mode);
    }
    const m = await metrics(srv);
    assertDecodedOnce(m, 'after 6 users');
    const nSpc = modes.filter((x) => x === 'spc').length;
    assert.equal(metric(m, 'kvstash_cache_decisions_total{decision="spc"}'), nSpc);
    assert.equal(metric(m, 'kvstash_spc_restored_tokens_total'), nSpc * nSys);
    assert.equal(metric(m, 'kvstash_spc_lookups_hit_total'), nSpc);
  } finally {
    await stopOk(srv);
  }
});

test('SPC with default routing: 1 user, then 5 at once: the system prompt is prefilled once and every reply is exact', async () => {
  const srv = await startServer(['--spc', '--slots', '3']);
  try {
    const nSys = await countTokens(ref, chatml([{ role: 'system', content: LONG_SYS }], false));
    assert.ok(nSys >= 100, 'above the default cache_min_tokens');
    const r1 = await ask(srv, sysMsgs(LONG_SYS, USERS[0]), 'user 1');
    assert.equal(r1.cache.mode, 'miss');
    const rs = await Promise.all(USERS.slice(1).map((u) => chat(srv, sysMsgs(LONG_SYS, u), { max_tokens: 24 })));
    for (const [k, r] of rs.entries()) {
      const what = `user ${k + 2}`;
      assertSameReply(r, await chat(ref, sysMsgs(LONG_SYS, USERS[k + 1]), { max_tokens: 24 }), what);
      // slot 0 by prefix, or another slot with the system prompt from the SPC
      assert.ok(['spc', 'prefix'].includes(r.cache.mode), `${what}: ${JSON.stringify(r.cache)}`);
      assert.ok(r.cache.cached_tokens >= nSys, `${what}: cached ${r.cache.cached_tokens}`);
      if (r.cache.mode === 'spc') assert.equal(r.cache.cached_tokens, nSys);
    }
    const m = await metrics(srv);
    assertDecodedOnce(m, 'after 6 users');
    const nSpc = rs.filter((r) => r.cache.mode === 'spc').length;
    assert.equal(metric(m, 'kvstash_spc_restored_tokens_total'), nSpc * nSys);
  } finally {
    await stopOk(srv);
  }
});

test('SPC + IMC: a new branch with the same system prompt is built in an empty slot from the SPC; both branches stay cached', async () => {
  const SYS = 'Planner. You plan tasks and split them into small steps for the others to do later.';
  const srv = await startServer(['--spc', '--imc', '--slots', '3', '--config',
    writeConfig('models:\n  default:\n    cache_min_tokens: 16\n')]);
  try {
    const nSys = await countTokens(ref, chatml([{ role: 'system', content: SYS }], false));
    assert.ok(nSys >= 16);
    const a = sysMsgs(SYS, 'start the work on the parser now');
    const a1 = await ask(srv, a, 'branch A turn 1', { max_tokens: 32 });
    assert.equal(a1.cache.mode, 'miss');
    const m0 = await metrics(srv);
    assert.equal(metric(m0, 'kvstash_spc_builds_total'), 1, 'the first request captured the system prompt');
    assert.equal(metric(m0, 'kvstash_sys_prompt_prefills_total'), 1);
    a.push({ role: 'assistant', content: replyOf(a1) }, { role: 'user', content: 'now split it into steps' });
    const a2 = await ask(srv, a, 'branch A turn 2', { max_tokens: 32 });
    assert.equal(a2.cache.mode, 'imc-hash');
    assert.equal(a2.cache.slot, a1.cache.slot);

    // premise: B shares only the system prompt and the user header with A's
    // branch, less than half of it, so IMC keeps A's branch and builds B in an
    // empty slot
    const shared = await countTokens(ref, chatml([{ role: 'system', content: SYS }], false) + '<|im_start|>user\n');
    const aTokens = (await slots(srv))[a1.cache.slot].n_tokens;
    assert.ok(2 * shared < aTokens, `premise: shared ${shared}, A holds ${aTokens}`);

    const m1 = await metrics(srv);
    const b = sysMsgs(SYS, 'review the plan of the lexer');
    const b1 = await ask(srv, b, 'branch B turn 1', { max_tokens: 32 });
    const m2 = await metrics(srv);
    assert.equal(b1.cache.mode, 'spc', JSON.stringify(b1.cache));
    assert.notEqual(b1.cache.slot, a1.cache.slot);
    assert.equal(b1.cache.cached_tokens, nSys);
    assert.equal(mdelta(m1, m2, 'kvstash_spc_restored_tokens_total'), nSys);
    assert.equal(mdelta(m1, m2, 'kvstash_cache_decisions_total{decision="spc"}'), 1);
    assert.equal(mdelta(m1, m2, 'kvstash_sys_prompt_prefills_total'), 0, 'the system prompt was not prefilled');
    assert.equal(mdelta(m1, m2, 'kvstash_slot_evictions_total'), 0);
    assert.equal(metric(m2, 'kvstash_spc_builds_total'), 1);

    // both branches continue in their slots
    a.push({ role: 'assistant', content: replyOf(a2) }, { role: 'user', content: 'go on' });
    const a3 = await ask(srv, a, 'branch A turn 3', { max_tokens: 32 });
    assert.equal(a3.cache.mode, 'imc-hash', JSON.stringify(a3.cache));
    assert.equal(a3.cache.slot, a1.cache.slot);
    b.push({ role: 'assistant', content: replyOf(b1) }, { role: 'user', content: 'go on' });
    const b2 = await ask(srv, b, 'branch B turn 2', { max_tokens: 32 });
    assert.equal(b2.cache.mode, 'imc-hash', JSON.stringify(b2.cache));
    assert.equal(b2.cache.slot, b1.cache.slot);
    assert.ok(b2.cache.cached_tokens >= b1.usage.prompt_tokens);

    // a third branch takes the last empty slot, again from the SPC
    const c1 = await ask(srv, sysMsgs(SYS, 'test the plan of the code generator'), 'branch C turn 1', { max_tokens: 32 });
    assert.equal(c1.cache.mode, 'spc', JSON.stringify(c1.cache));
    assert.equal(c1.cache.cached_tokens, nSys);
    assert.equal(new Set([a1.cache.slot, b1.cache.slot, c1.cache.slot]).size, 3);
    const m3 = await metrics(srv);
    assert.equal(metric(m3, 'kvstash_spc_builds_total'), 1);
    assert.equal(metric(m3, 'kvstash_sys_prompt_prefills_total'), 1);
    assert.equal(metric(m3, 'kvstash_spc_restored_tokens_total'), 2 * nSys);
  } finally {
    await stopOk(srv);
  }
});

test('SPC: a "developer" message is the same system prompt: it is restored from the entry a "system" message built', async () => {
  const srv = await startServer(['--spc', '--slots', '2', '--config',
    writeConfig('affinity_min: 0.99\nmodels:\n  default:\n    cache_min_tokens: 16\n')]);
  try {
    const nSys = await countTokens(ref, chatml([{ role: 'system', content: LONG_SYS }], false));
    const r1 = await ask(srv, sysMsgs(LONG_SYS, USERS[0]), 'system user');
    assert.equal(r1.cache.mode, 'miss');
    const dev = [{ role: 'developer', content: LONG_SYS }, { role: 'user', content: USERS[1] }];
    const r2 = await ask(srv, dev, 'developer user');
    assert.equal(r2.cache.mode, 'spc', JSON.stringify(r2.cache));
    assert.equal(r2.cache.cached_tokens, nSys);
    const m = await metrics(srv);
    assertDecodedOnce(m, 'system + developer');
  } finally {
    await stopOk(srv);
  }
});
