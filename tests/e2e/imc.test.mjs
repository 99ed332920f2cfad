// imc.test.mjs — the Incremental Message Cache (seed 000, 5.3) over real HTTP:
// sub-agents routed to their slot by message hashes, LRU eviction and rebuild,
// the token-prefix fallback (template drift, edited messages), and concurrent
// requests that need a fresh slot. Every reply is compared with a reference
// server that never caches (--no-cache-prompt), at temperature 0.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  startServer, stopOk, chat, metrics, slots, chatml, countTokens, writeConfig, replyOf,
  assertSameReply, mdelta,
} from './lib.mjs';

let ref; // the uncached reference
before(async () => { ref = await startServer(['--no-cache-prompt', '--slots', '1']); });
after(async () => { if (ref) await stopOk(ref); });

// Sub-agent system prompts: their first words differ, so two agents share only
// BOS and the "<|im_start|>system\n" header.
const AGENT_SYS = [
  'Planner. You plan tasks and split them into small steps for the others to do later.',
  'Coder. You write code in C and explain every function you write in one sentence.',
  'Reviewer. You review code and list every bug you find with its line number and a fix.',
  'Tester. You write the tests for new code and check that every test can fail on a bug.',
  'Writer. You write the documentation and keep the readme true to what the code does.',
];
const LONG_SYS =
  'You are the support assistant of a large online shop that sells garden tools, seeds, pots, soil ' +
  'and outdoor furniture. Answer politely, in short sentences, and always suggest one product that fits ' +
  'the question. Never talk about prices you are not sure of and never promise delivery dates.';

const D = 'kvstash_cache_decisions_total';
const dec = (m0, m1, d) => mdelta(m0, m1, `${D}{decision="${d}"}`);

// One turn on srv and on the reference; the replies must be equal.
async function turn(srv, msgs, what, extra = {}) {
  const r = await chat(srv, msgs, extra);
  const u = await chat(ref, msgs, extra);
  assertSameReply(r, u, what);
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, r.cache.cached_tokens, `${what}: usage vs cache`);
  assert.equal(r.timings.prompt_n, r.usage.prompt_tokens - r.cache.cached_tokens, `${what}: prompt_n`);
  return r;
}

const cfgMin = (n) => writeConfig(`models:\n  default:\n    cache_min_tokens: ${n}\n`);

test('3 sub-agents interleaved on 3 slots: from round 2 on every request is an imc-hash hit that prefills only the new message', async () => {
  const srv = await startServer(['--slots', '3', '--imc']);
  try {
    const m0 = await metrics(srv);
    const conv = AGENT_SYS.slice(0, 3).map((s) => [{ role: 'system', content: s }, { role: 'user', content: 'start the work now' }]);
    const slotOf = [];
    const prev = [];
    const follow = ['now check it', 'continue with the next step', 'summarize what you did'];
    for (let round = 0; round < 4; round++) {
      for (let a = 0; a < 3; a++) {
        const what = `agent ${a} round ${round + 1}`;
        const msgs = conv[a];
        const r = await turn(srv, msgs, what);
        if (round === 0) {
          assert.equal(r.cache.mode, 'miss', `${what}: ${JSON.stringify(r.cache)}`);
          assert.equal(r.cache.cached_tokens, 0, what);
          slotOf[a] = r.cache.slot;
        } else {
          assert.equal(r.cache.mode, 'imc-hash', `${what}: ${JSON.stringify(r.cache)}`);
          assert.equal(r.cache.slot, slotOf[a], `${what}: stays in its slot`);
          assert.ok(r.cache.cached_tokens >= prev[a].r.usage.prompt_tokens,
            `${what}: cached ${r.cache.cached_tokens} < previous prompt ${prev[a].r.usage.prompt_tokens}`);
          // The slot holds the previous prompt and the reply's KV (the last
          // sampled token is never decoded): only the reply's last token, its
          // closing, the new user message and the assistant header are new.
          const kept = await countTokens(ref, chatml(prev[a].msgs, true) + replyOf(prev[a].r));
          const bound = r.usage.prompt_tokens - kept + 1;
          const prefilled = r.usage.prompt_tokens - r.cache.cached_tokens;
          assert.ok(prefilled <= bound, `${what}: prefilled ${prefilled} > ${bound} (new message + headers)`);
          assert.ok(prefilled < 40, `${what}: prefilled ${prefilled}`);
        }
        prev[a] = { r, msgs: msgs.slice() };
        msgs.push({ role: 'assistant', content: replyOf(r) }, { role: 'user', content: follow[round % 3] });
      }
    }
    assert.equal(new Set(slotOf).size, 3, `round 1 slots ${slotOf}`);
    const m1 = await metrics(srv);
    assert.equal(dec(m0, m1, 'imc-hash'), 9);
    assert.equal(dec(m0, m1, 'miss'), 3);
    assert.equal(dec(m0, m1, 'imc-token-prefix'), 0);
    assert.equal(mdelta(m0, m1, 'kvstash_slot_evictions_total'), 0, 'no branch was evicted');
    assert.equal(mdelta(m0, m1, 'kvstash_imc_rebuilds_total'), 3, 'one build per agent');
  } finally {
    await stopOk(srv);
  }
});

// The IMC-only behaviour of an evicted branch (a rebuild from scratch) is what
// this test checks: --cache-ram 0 turns off the default RAM store, which would
// restore a taken-over branch once its prompt reaches store.min_tokens
// (ram_store.test.mjs tests that).
const NO_STORE = ['--cache-ram', '0'];

test('5 sub-agents on 3 slots: LRU eviction, rebuild from scratch, and exact replies', async () => {
  const srv = await startServer(['--slots', '3', '--imc', ...NO_STORE]);
  try {
    const m0 = await metrics(srv);
    const header = await countTokens(ref, '<|im_start|>system\n'); // what any two agents share
    const conv = AGENT_SYS.map((s) => [{ role: 'system', content: s }, { role: 'user', content: 'begin' }]);
    // Slots by LRU (route.h): round 1 fills 0,1,2 then evicts 0 and 1; in
    // round 2 every agent finds its slot taken and evicts the least recently
    // used one; in round 3 the last three agents find their rebuilt branches.
    const plan = [
      { agents: [0, 1, 2, 3, 4], slots: [0, 1, 2, 0, 1] },
      { agents: [0, 1, 2, 3, 4], slots: [2, 0, 1, 2, 0] },
      { agents: [2, 3, 4], slots: [1, 2, 0] },
    ];
    for (const [round, { agents, slots: want }] of plan.entries()) {
      for (const [k, a] of agents.entries()) {
        const what = `agent ${a} round ${round + 1}`;
        const r = await turn(srv, conv[a], what);
        assert.equal(r.cache.slot, want[k], `${what}: slot (${JSON.stringify(r.cache)})`);
        if (round < 2) {
          assert.equal(r.cache.mode, 'miss', `${what}: ${JSON.stringify(r.cache)}`);
          assert.ok(r.cache.cached_tokens <= header, `${what}: a miss keeps at most the shared header`);
          const evicting = round === 1 || k >= 3;
          if (evicting) {
            // route.h: "evicted" when nothing matched; "below-threshold" when
            // another slot shared a prefix shorter than cache_min_tokens (BOS
            // and the system header are shared by every chat prompt).
            assert.ok(['evicted', 'below-threshold'].includes(r.cache.reason), `${what}: reason ${r.cache.reason}`);
          }
        } else {
          assert.equal(r.cache.mode, 'imc-hash', `${what}: ${JSON.stringify(r.cache)}`);
          assert.ok(r.cache.cached_tokens > 0);
        }
        conv[a].push({ role: 'assistant', content: replyOf(r) }, { role: 'user', content: 'go on' });
      }
    }
    const m1 = await metrics(srv);
    assert.equal(dec(m0, m1, 'miss'), 10);
    assert.equal(dec(m0, m1, 'imc-hash'), 3);
    // took over a non-empty slot: 2 in round 1, 5 in round 2
    assert.equal(mdelta(m0, m1, 'kvstash_slot_evictions_total'), 7);
    assert.equal(mdelta(m0, m1, 'kvstash_imc_rebuilds_total'), 10);
  } finally {
    await stopOk(srv);
  }
});

// The same sub-agent churn with the server's defaults plus --spc --imc: the
// default RAM-only store catches every branch an eviction takes away, so from
// round 2 on no agent is rebuilt — each comes back from its slot (imc-hash) or
// from RAM (store) with at least its previous prompt cached — and every reply
// still equals the uncached server's. The system prompts are long enough
// (> store.min_tokens, 256) to be saved.
test('5 sub-agents on 3 slots with the default RAM store: evicted branches come back from RAM, exact replies', async () => {
  const srv = await startServer(['--slots', '3', '--imc', '--spc']);
  try {
    const m0 = await metrics(srv);
    const conv = AGENT_SYS.map((s) => [{ role: 'system', content: `${s} ${LONG_SYS} ${LONG_SYS}` },
      { role: 'user', content: 'begin' }]);
    const prev = [];
    for (let round = 1; round <= 3; round++) {
      for (let a = 0; a < conv.length; a++) {
        const what = `agent ${a} round ${round}`;
        const r = await turn(srv, conv[a], what);
        if (round === 1) {
          assert.ok(r.usage.prompt_tokens > 256, `${what}: ${r.usage.prompt_tokens} prompt tokens, over store.min_tokens`);
        } else {
          assert.ok(['imc-hash', 'store'].includes(r.cache.mode), `${what}: ${JSON.stringify(r.cache)}`);
          assert.ok(r.cache.cached_tokens >= prev[a], `${what}: cached ${r.cache.cached_tokens} < previous prompt ${prev[a]}`);
        }
        prev[a] = r.usage.prompt_tokens;
        conv[a].push({ role: 'assistant', content: replyOf(r) }, { role: 'user', content: 'go on' });
      }
    }
    const m1 = await metrics(srv);
    assert.ok(dec(m0, m1, 'store') >= 4, `store restores: ${dec(m0, m1, 'store')}`);
    assert.equal(mdelta(m0, m1, 'kvstash_store_hits_total'), dec(m0, m1, 'store'));
  } finally {
    await stopOk(srv);
  }
});

test('template drift: an assistant message re-sent with other whitespace falls back to imc-token-prefix and salvages the common prefix', async () => {
  const srv = await startServer(['--slots', '2', '--imc', '--config', cfgMin(16)]);
  try {
    const c = [{ role: 'system', content: AGENT_SYS[1] }, { role: 'user', content: 'write a function that adds two numbers' }];
    const r1 = await turn(srv, c, 'turn 1');
    c.push({ role: 'assistant', content: 'here is the function you asked for' }, { role: 'user', content: 'now make it faster' });
    const r2 = await turn(srv, c, 'turn 2');
    assert.equal(r2.cache.mode, 'imc-hash', JSON.stringify(r2.cache));
    assert.equal(r2.cache.slot, r1.cache.slot);

    const d = structuredClone(c);
    d[2].content = 'here is  the function you asked for '; // whitespace drift
    d.push({ role: 'assistant', content: 'done' }, { role: 'user', content: 'thanks' });
    // The tokens agree up to "here is": the prompt of turn 1 (which ends with
    // the assistant header) and the words before the doubled space.
    const lcp = await countTokens(ref, chatml(c.slice(0, 2), true) + 'here is');
    assert.ok(lcp > r1.usage.prompt_tokens && lcp < r2.usage.prompt_tokens, `lcp ${lcp}`);
    const m0 = await metrics(srv);
    const r3 = await turn(srv, d, 'drifted turn 3');
    const m1 = await metrics(srv);
    assert.equal(r3.cache.mode, 'imc-token-prefix', JSON.stringify(r3.cache));
    assert.equal(r3.cache.slot, r1.cache.slot);
    assert.equal(r3.cache.cached_tokens, lcp, 'salvaged exactly the common token prefix');
    assert.ok(r3.cache.cached_tokens > 0 && r3.cache.cached_tokens < r3.usage.prompt_tokens);
    assert.equal(r3.cache.reason, `diverged-at-token-${lcp}`);
    assert.equal(mdelta(m0, m1, 'kvstash_imc_salvaged_tokens_total'), r3.cache.cached_tokens);
    assert.equal(dec(m0, m1, 'imc-token-prefix'), 1);
    assert.equal(dec(m0, m1, 'imc-hash'), 0);

    // The drifted branch is now the slot's branch: its next turn is a hash hit.
    d.push({ role: 'assistant', content: replyOf(r3) }, { role: 'user', content: 'bye' });
    const r4 = await turn(srv, d, 'turn 4');
    assert.equal(r4.cache.mode, 'imc-hash', JSON.stringify(r4.cache));
    assert.ok(r4.cache.cached_tokens >= r3.usage.prompt_tokens);
  } finally {
    await stopOk(srv);
  }
});

// A two-turn conversation, then the same with its first user message edited
// and a third turn. Returns what the edited request needs to be judged.
async function editScenario(srv, sys) {
  const c = [{ role: 'system', content: sys }, { role: 'user', content: 'write a function that adds two numbers' }];
  const r1 = await turn(srv, c, 'turn 1');
  c.push({ role: 'assistant', content: replyOf(r1) }, { role: 'user', content: 'now make it faster' });
  const r2 = await turn(srv, c, 'turn 2');
  assert.equal(r2.cache.mode, 'imc-hash', JSON.stringify(r2.cache));
  assert.equal(r2.cache.slot, r1.cache.slot);
  const e = structuredClone(c);
  e[1].content = 'write a function that multiplies two numbers';
  e.push({ role: 'assistant', content: replyOf(r2) }, { role: 'user', content: 'thanks' });
  // the tokens agree up to the edited word
  const lcp = await countTokens(ref, chatml(c.slice(0, 1), false) + '<|im_start|>user\nwrite a function that');
  const slotTokens = (await slots(srv))[r1.cache.slot].n_tokens;
  const m0 = await metrics(srv);
  const r3 = await turn(srv, e, 'edited turn 3');
  const m1 = await metrics(srv);
  return { c, e, r1, r2, r3, lcp, slotTokens, m0, m1 };
}

test('an edited earlier user message: the hash misses, the token prefix is salvaged up to the edit (imc-token-prefix, diverged-at-token-N)', async () => {
  const srv = await startServer(['--slots', '2', '--imc', '--config', cfgMin(16)]);
  try {
    const { r1, r3, lcp, slotTokens, m0, m1 } = await editScenario(srv, LONG_SYS);
    // premise: the shared part is at least half of the slot's branch, so the
    // router salvages it rather than building in the empty slot
    assert.ok(lcp >= 16 && 2 * lcp >= slotTokens, `lcp ${lcp}, slot holds ${slotTokens}`);
    assert.equal(r3.cache.mode, 'imc-token-prefix', JSON.stringify(r3.cache));
    assert.equal(r3.cache.slot, r1.cache.slot);
    assert.equal(r3.cache.cached_tokens, lcp);
    assert.equal(r3.cache.reason, `diverged-at-token-${r3.cache.cached_tokens}`);
    assert.equal(mdelta(m0, m1, 'kvstash_imc_salvaged_tokens_total'), lcp);
    assert.equal(dec(m0, m1, 'imc-token-prefix'), 1);
  } finally {
    await stopOk(srv);
  }
});

test('an edited earlier user message with cache_min_tokens above the shared prefix: built in the empty slot, the shared prefix copied from the other', async () => {
  const srv = await startServer(['--slots', '2', '--imc', '--config', cfgMin(1000)]);
  try {
    const { c, r1, r2, r3, lcp, m0, m1 } = await editScenario(srv, LONG_SYS);
    assert.ok(lcp > 0 && lcp < 1000);
    // The router salvages no token prefix below cache_min_tokens: the request
    // goes to the empty slot. The shared prefix is then copied from the
    // branch's slot, which stays intact (copies have their own minimum, 16).
    assert.equal(r3.cache.mode, 'copy', JSON.stringify(r3.cache));
    assert.notEqual(r3.cache.slot, r1.cache.slot, 'the empty slot');
    assert.equal(r3.cache.cached_tokens, lcp);
    assert.equal(r3.cache.reason, `diverged-at-token-${lcp}`);
    assert.equal(dec(m0, m1, 'copy'), 1);
    assert.equal(dec(m0, m1, 'imc-token-prefix'), 0);
    assert.equal(mdelta(m0, m1, 'kvstash_slot_copied_tokens_total'), lcp);
    assert.equal(mdelta(m0, m1, 'kvstash_slot_evictions_total'), 0);
    // the unedited branch is intact in its slot
    c.push({ role: 'assistant', content: replyOf(r2) }, { role: 'user', content: 'thanks' });
    const r4 = await turn(srv, c, 'unedited turn 3');
    assert.equal(r4.cache.mode, 'imc-hash', JSON.stringify(r4.cache));
    assert.equal(r4.cache.slot, r1.cache.slot);
  } finally {
    await stopOk(srv);
  }
});

test('an edit that shares less than half of the branch builds in the empty slot from a copy of the shared part and keeps the other branch', async () => {
  const srv = await startServer(['--slots', '2', '--imc', '--config', cfgMin(16)]);
  try {
    const { c, r1, r2, r3, lcp, slotTokens } = await editScenario(srv, AGENT_SYS[1]);
    assert.ok(lcp >= 16 && 2 * lcp < slotTokens, `premise: lcp ${lcp}, slot holds ${slotTokens}`);
    assert.equal(r3.cache.mode, 'copy', JSON.stringify(r3.cache));
    assert.notEqual(r3.cache.slot, r1.cache.slot);
    assert.equal(r3.cache.cached_tokens, lcp);
    assert.equal(r3.cache.reason, `diverged-at-token-${lcp}`);
    c.push({ role: 'assistant', content: replyOf(r2) }, { role: 'user', content: 'thanks' });
    const r4 = await turn(srv, c, 'unedited turn 3');
    assert.equal(r4.cache.mode, 'imc-hash', JSON.stringify(r4.cache));
    assert.equal(r4.cache.slot, r1.cache.slot);
  } finally {
    await stopOk(srv);
  }
});

test('a retried request, and a step back to an earlier turn, reuse all but the last prompt token and reply the same', async () => {
  const srv = await startServer(['--slots', '1', '--imc', '--config', cfgMin(16)]);
  try {
    const c = [{ role: 'system', content: AGENT_SYS[2] }, { role: 'user', content: 'review the parser' }];
    const r1 = await turn(srv, c, 'turn 1');
    // a client retry: the same messages again; the slot holds them and the reply
    const again = await turn(srv, c, 'retry');
    assert.equal(again.cache.mode, 'imc-hash', JSON.stringify(again.cache));
    assert.equal(again.cache.cached_tokens, again.usage.prompt_tokens - 1);
    assert.equal(again.cache.reason, undefined, 'everything reusable was reused');
    assert.equal(replyOf(again), replyOf(r1));
    const long = [...c, { role: 'assistant', content: replyOf(r1) }, { role: 'user', content: 'and the lexer' }];
    const r2 = await turn(srv, long, 'turn 2');
    assert.equal(r2.cache.mode, 'imc-hash', JSON.stringify(r2.cache));
    // back to turn 1 (regenerate): no slot caches exactly 2 messages, the
    // token prefix holds the whole prompt
    const back = await turn(srv, c, 'back to turn 1');
    assert.equal(back.cache.mode, 'imc-token-prefix', JSON.stringify(back.cache));
    assert.equal(back.cache.cached_tokens, back.usage.prompt_tokens - 1);
    assert.equal(replyOf(back), replyOf(r1));
    // and the conversation goes on from there on a new path
    const alt = [...c, { role: 'assistant', content: replyOf(back) }, { role: 'user', content: 'and the printer' }];
    const r3 = await turn(srv, alt, 'turn 2, other path');
    assert.equal(r3.cache.mode, 'imc-hash', JSON.stringify(r3.cache));
    assert.ok(r3.cache.cached_tokens >= back.usage.prompt_tokens);
  } finally {
    await stopOk(srv);
  }
});

test('race: concurrent requests that each need a fresh slot never share one', async () => {
  const topics = ['rivers', 'bread', 'trains', 'snow', 'music', 'cats', 'the moon', 'gardens', 'ships'];
  for (let round = 0; round < 3; round++) {
    const srv = await startServer(['--slots', '3', '--imc']);
    try {
      const conv = (i) => [{ role: 'system', content: `${AGENT_SYS[i % 5]} Today: ${topics[i]}.` },
        { role: 'user', content: `tell me about ${topics[i]}` }];
      const fire = async (ids, msgsOf) => {
        const rs = await Promise.all(ids.map((i) => chat(srv, msgsOf(i), { max_tokens: 32 })));
        const got = rs.map((r) => r.cache.slot);
        assert.equal(new Set(got).size, ids.length, `round ${round + 1}: slots ${got} (${rs.map((r) => r.cache.mode)})`);
        for (const [k, i] of ids.entries()) {
          assertSameReply(rs[k], await chat(ref, msgsOf(i), { max_tokens: 32 }), `round ${round + 1} conversation ${i}`);
        }
        return rs;
      };
      // empty slots
      const a = [round * 3, round * 3 + 1, round * 3 + 2].map((i) => i % topics.length);
      const ra = await fire(a, conv);
      for (const r of ra) assert.equal(r.cache.mode, 'miss');
      // every slot holds another branch: three evictions at once (a request
      // whose agent prompt another slot holds copies that prefix from there)
      const b = a.map((i) => (i + 4) % topics.length);
      const rb = await fire(b, conv);
      for (const r of rb) {
        assert.ok(r.cache.mode === 'miss' || (r.cache.mode === 'copy' && r.cache.cached_tokens >= 16),
          JSON.stringify(r.cache));
      }
      // and the new branches continue concurrently, each in its own slot
      const next = (i) => {
        const k = b.indexOf(i);
        return [...conv(i), { role: 'assistant', content: replyOf(rb[k]) }, { role: 'user', content: 'more' }];
      };
      const rc = await fire(b, next);
      for (const [k, r] of rc.entries()) {
        assert.equal(r.cache.mode, 'imc-hash', JSON.stringify(r.cache));
        assert.equal(r.cache.slot, rb[k].cache.slot);
      }
    } finally {
      await stopOk(srv);
    }
  }
});
