// hybrid.test.mjs — `kvstash serve` on the hybrid (tiny-hybrid, lfm2) and
// sliding-window (tiny-swa, gemma3) test models of issue 15: the server
// starts, answers, and a multi-turn chat gives the greedy replies of
// --no-cache-prompt, turn by turn.
//
// What the cache achieves on them: tiny-swa trims like `llama` (the engine's
// SWA cache is full-size), so every turn after the first reuses the previous
// prompt. tiny-hybrid cannot trim in place: a turn whose common prefix ends
// inside the slot's tokens goes back to the slot's latest checkpoint at or
// before it (the previous prompt's end, or a point of the reply; reason
// "checkpoint-at-token-K"), so it too reuses at least the previous prompt
// (issue 15; without checkpoints every such turn was a full prefill,
// "partial-rm-unsupported").
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, chat, replyOf, writeStoreConfig, writeConfig, metrics, settleStore } from './lib.mjs';

const MODELS = {
  'tiny-hybrid': process.env.KS_TINY_HYBRID_MODEL,
  'tiny-swa': process.env.KS_TINY_SWA_MODEL,
  'tiny-mamba': process.env.KS_TINY_MAMBA_MODEL, // recurrent: checkpoints as tiny-hybrid
};
// The models whose memory cannot drop a suffix (checkpoints); tiny-swa trims.
const CKPT = new Set(['tiny-hybrid', 'tiny-mamba']);

const servers = [];
after(async () => {
  for (const s of servers) await stopOk(s);
});

const system = { role: 'system', content: 'You are a helpful assistant who answers in short sentences.' };
const questions = ['hello, what is the water like in the river?', 'tell me a story about a dog',
  'why did the dog run to the river?', 'and then what happened', 'describe the river in three words',
  'say something kind to the dog'];

// Each reply goes back without its last character: the reply as rendered
// then differs from the generated one in its last token (as real templates
// and clients make it do; on tiny-hybrid the reply rendered whole matches the
// generated tokens, an extension that needs no trim), so every turn after
// the first must trim the slot inside the previous reply.
async function converse(srv) {
  const msgs = [system];
  const out = [];
  for (const q of questions) {
    msgs.push({ role: 'user', content: q });
    const r = await chat(srv, msgs, { max_tokens: 24, temperature: 0 });
    const text = replyOf(r);
    msgs.push({ role: 'assistant', content: text.length > 1 ? text.slice(0, -1) : text });
    out.push(r);
  }
  return out;
}

// Forgets a test's servers once stopped (a failed test's stay for `after`).
function forget(...done) {
  const keep = servers.filter((s) => !done.includes(s));
  servers.length = 0;
  servers.push(...keep);
}

for (const [name, model] of Object.entries(MODELS)) {
  test(`${name}: a ${questions.length}-turn chat equals --no-cache-prompt, turn by turn`, async () => {
    assert.ok(model, `the ${name} model path is not set (run through ctest)`);
    const args = ['-m', model, '--ctx', '1024'];
    const cached = await startServer(args);
    servers.push(cached);
    const uncached = await startServer([...args, '--no-cache-prompt']);
    servers.push(uncached);
    const a = await converse(cached);
    const b = await converse(uncached);
    for (let i = 0; i < questions.length; i++) {
      const what = `${name} turn ${i + 1}`;
      assert.ok(a[i].usage.completion_tokens > 0, `${what}: an empty reply`);
      assert.equal(replyOf(a[i]), replyOf(b[i]), `${what}: text differs from --no-cache-prompt`);
      assert.equal(a[i].choices[0].finish_reason, b[i].choices[0].finish_reason, `${what}: finish_reason`);
      assert.equal(a[i].usage.completion_tokens, b[i].usage.completion_tokens, `${what}: completion_tokens`);
      assert.equal(b[i].usage.prompt_tokens_details.cached_tokens, 0, `${what}: --no-cache-prompt cached`);
      if (i === 0) continue;
      const c = a[i].usage.prompt_tokens_details.cached_tokens;
      // A trim never loses more than the reply's last tokens as rendered; on
      // tiny-hybrid it goes back to a checkpoint, at worst the previous prompt's end.
      assert.ok(c >= a[i - 1].usage.prompt_tokens - 1, `${what}: cached ${c} < previous prompt ` +
        `${a[i - 1].usage.prompt_tokens} (${a[i].cache.reason})`);
      assert.notEqual(a[i].cache.reason, 'partial-rm-unsupported', `${what}: rebuilt`);
      if (name === 'tiny-swa') assert.doesNotMatch(a[i].cache.reason ?? '', /^checkpoint/, `${what}: cache.reason`);
    }
    const m = await metrics(cached);
    const restores = m.get('kvstash_checkpoint_restores_total');
    assert.equal(m.get('kvstash_partial_rm_rebuilds_total'), 0, `${name}: rebuilds`);
    if (CKPT.has(name)) {
      // Every turn after the first trims inside the previous reply, unless
      // that reply was cut by max_tokens: its last token, the one changed,
      // was sampled but never decoded, so the next prompt extends the slot.
      const trims = a.filter((r) => (r.cache.reason ?? '').startsWith('checkpoint-at-token-')).length;
      for (let i = 1; i < questions.length; i++) {
        const held = a[i - 1].usage.prompt_tokens + a[i - 1].usage.completion_tokens - 1;
        const c = a[i].usage.prompt_tokens_details.cached_tokens;
        assert.ok((a[i].cache.reason ?? '').startsWith('checkpoint-at-token-') || c >= held,
          `${name} turn ${i + 1}: cached ${c}, reason ${a[i].cache.reason}`);
      }
      assert.ok(trims >= 2, `${name}: only ${trims} turns trimmed (the test does not reach the checkpoints)`);
      assert.equal(restores, trims, `${name}: checkpoint restores`);
      assert.ok(m.get('kvstash_checkpoint_saves_total') >= questions.length, `${name}: checkpoint saves`);
    } else {
      assert.equal(restores, 0, `${name}: checkpoint restores`);
      assert.equal(m.get('kvstash_checkpoint_saves_total'), 0, `${name}: checkpoint saves`);
    }
    await stopOk(cached);
    await stopOk(uncached);
    forget(cached, uncached);
  });
}

// A sliding-window model's state past the window restores bit for bit only
// when its window starts at a multiple of 64 tokens (llama keeps only the
// window's cells and sets them into the first cells; the kernels' blocks
// must not shift: ks_engine_state_restorable), so restores from the store,
// SPC or another slot take at most the window (32 tokens on tiny-swa) or
// 32 + 64k tokens, and such a model saves only those: two conversations
// taking turns on one slot, each turn after the other's, restore such
// lengths — past the window too — and every reply equals the uncached one.
const swaRestorable = (n) => n <= 32 || (n - 32) % 64 === 0;
test('tiny-swa: restores take the window or aligned lengths, replies equal --no-cache-prompt', async () => {
  const model = MODELS['tiny-swa'];
  assert.ok(model, 'the tiny-swa model path is not set (run through ctest)');
  const args = ['-m', model, '--ctx', '1024', '--slots', '1'];
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-swa-'));
  const cfg = await writeStoreConfig(path.join(dir, 'store.yaml'),
    { cacheDir: path.join(dir, 'disk'), shmDir: path.join(dir, 'shm'), minTokens: 16, stride: 16 });
  const cached = await startServer([...args, '--config', cfg]);
  servers.push(cached);
  const uncached = await startServer([...args, '--no-cache-prompt']);
  servers.push(uncached);
  let windowed = 0, past = 0;
  const convs = [[{ role: 'system', content: 'You answer about rivers.' }],
    [{ role: 'system', content: 'You answer about dogs and their stories.' }]];
  for (let turn = 0; turn < 3; turn++) {
    for (let k = 0; k < convs.length; k++) {
      const msgs = convs[k];
      msgs.push({ role: 'user', content: `${questions[turn]} (conversation ${k})` });
      const a = await chat(cached, msgs, { max_tokens: 16, temperature: 0 });
      const b = await chat(uncached, msgs, { max_tokens: 16, temperature: 0 });
      const what = `conversation ${k} turn ${turn + 1}`;
      assert.equal(replyOf(a), replyOf(b), `${what}: text differs from --no-cache-prompt`);
      const c = a.usage.prompt_tokens_details.cached_tokens;
      if (a.cache.mode === 'store' || a.cache.mode === 'spc' || a.cache.mode === 'copy') {
        assert.ok(swaRestorable(c), `${what}: ${c} tokens restored (${a.cache.mode}), not 32 + 64k`);
        windowed++;
        if (c > 32) past++;
      }
      msgs.push({ role: 'assistant', content: replyOf(b) });
    }
  }
  // The store was asked: each conversation's turns after the first found a
  // stored state of its own (the other conversation held the slot), some of
  // them past the window (before aligned restores, at most 32 tokens).
  assert.ok(windowed > 0, 'no restore at all: the test did not reach the store');
  assert.ok(past > 0, 'no restore past the window');
  await stopOk(cached);
  await stopOk(uncached);
  forget(cached, uncached);
  rmSync(dir, { recursive: true, force: true });
});

// Sub-agents on fewer slots (issue 15): three conversations take turns on
// two slots of tiny-hybrid, each turn diverging inside its previous reply.
// A conversation that comes back to a slot that still holds it goes back to
// a checkpoint; one whose slot was taken over is restored from the store
// (its whole state at its previous prompt's end, reason `checkpoint`) or
// copied from the slot that holds it, with that slot's checkpoints. Either
// way every turn after the first keeps at least the previous prompt, and
// every reply equals --no-cache-prompt's.
test('tiny-hybrid: sub-agents on fewer slots keep their previous prompt, replies equal --no-cache-prompt', async () => {
  const model = MODELS['tiny-hybrid'];
  assert.ok(model, 'the tiny-hybrid model path is not set (run through ctest)');
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-hyb-sub-'));
  const cfg = await writeStoreConfig(path.join(dir, 'store.yaml'),
    { cacheDir: path.join(dir, 'disk'), shmDir: path.join(dir, 'shm'), minTokens: 16, stride: 16 });
  const cached = await startServer(['-m', model, '--ctx', '1024', '--slots', '2', '--config', cfg]);
  servers.push(cached);
  const uncached = await startServer(['-m', model, '--ctx', '1024', '--no-cache-prompt']);
  servers.push(uncached);
  const convs = [0, 1, 2].map((k) => [{ role: 'system', content: `You are sub-agent ${k}; you answer in short sentences.` }]);
  const prev = [0, 0, 0];
  const modes = new Map();
  for (let turn = 0; turn < 4; turn++) {
    for (let k = 0; k < convs.length; k++) {
      const msgs = convs[k];
      msgs.push({ role: 'user', content: `${questions[(turn + k) % questions.length]} (agent ${k})` });
      const a = await chat(cached, msgs, { max_tokens: 16, temperature: 0 });
      const b = await chat(uncached, msgs, { max_tokens: 16, temperature: 0 });
      const what = `agent ${k} turn ${turn + 1}`;
      assert.equal(replyOf(a), replyOf(b), `${what}: text differs from --no-cache-prompt`);
      const c = a.usage.prompt_tokens_details.cached_tokens;
      if (turn > 0) {
        assert.ok(c >= prev[k], `${what}: cached ${c} < previous prompt ${prev[k]} (${a.cache.mode}, ${a.cache.reason})`);
        modes.set(a.cache.mode, (modes.get(a.cache.mode) ?? 0) + 1);
      }
      prev[k] = a.usage.prompt_tokens;
      const text = replyOf(b);
      msgs.push({ role: 'assistant', content: text.length > 1 ? text.slice(0, -1) : text });
    }
  }
  // Three conversations on two slots: some turns found their slot taken.
  assert.ok((modes.get('store') ?? 0) + (modes.get('copy') ?? 0) > 0,
    `no turn restored from the store or a copy: ${JSON.stringify([...modes])}`);
  const m = await settleStore(cached);
  assert.ok(m.get('kvstash_store_saves_total{reason="checkpoint"}') > 0, 'no checkpoint saved in the store');
  // (A slot taken over by another agent still counts a rebuild: the system
  // prompts share their first tokens, which the slot cannot keep alone.)
  await stopOk(cached);
  await stopOk(uncached);
  forget(cached, uncached);
  rmSync(dir, { recursive: true, force: true });
});

// A restart (issue 15): the conversation's states are in the persistent
// store (disk and shm tiers), so the first turn a new process serves is a
// store hit: on tiny-hybrid the whole previous prompt (its checkpoint), on
// tiny-swa the window or an aligned length past it (see above); replies
// equal --no-cache-prompt's.
for (const [name, model] of Object.entries(MODELS)) {
  test(`${name}: a restarted server restores the conversation from the store`, async () => {
    assert.ok(model, `the ${name} model path is not set (run through ctest)`);
    const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-hyb-restart-'));
    const cfg = await writeStoreConfig(path.join(dir, 'store.yaml'),
      { cacheDir: path.join(dir, 'disk'), shmDir: path.join(dir, 'shm'), minTokens: 16, stride: 16 });
    const args = ['-m', model, '--ctx', '1024', '--slots', '1', '--config', cfg];
    const uncached = await startServer(['-m', model, '--ctx', '1024', '--no-cache-prompt']);
    servers.push(uncached);
    const msgs = [system];
    let prevPrompt = 0;
    for (let turn = 0; turn < 3; turn++) {
      const srv = await startServer(args); // a new process every turn
      servers.push(srv);
      msgs.push({ role: 'user', content: questions[turn] });
      const a = await chat(srv, msgs, { max_tokens: 16, temperature: 0 });
      const b = await chat(uncached, msgs, { max_tokens: 16, temperature: 0 });
      const what = `${name} turn ${turn + 1}`;
      assert.equal(replyOf(a), replyOf(b), `${what}: text differs from --no-cache-prompt`);
      const c = a.usage.prompt_tokens_details.cached_tokens;
      if (turn > 0) {
        assert.equal(a.cache.mode, 'store', `${what}: cache.mode (${a.cache.reason})`);
        if (CKPT.has(name)) assert.ok(c >= prevPrompt, `${what}: cached ${c} < previous prompt ${prevPrompt}`);
        else assert.ok(c > 0 && swaRestorable(c), `${what}: cached ${c}, not 32 + 64k tokens`);
      }
      prevPrompt = a.usage.prompt_tokens;
      const text = replyOf(b);
      msgs.push({ role: 'assistant', content: text.length > 1 ? text.slice(0, -1) : text });
      await settleStore(srv);
      await stopOk(srv);
      forget(srv);
    }
    await stopOk(uncached);
    forget(uncached);
    rmSync(dir, { recursive: true, force: true });
  });
}

// IMC and SPC on tiny-hybrid (issue 15: "everything else works on these
// models"): three sub-agents share a long system prompt on three slots. The
// first agent prefills it and SPC captures it; the two others restore it
// (spc); from round 2 on each agent is routed to its own slot by its message
// hashes (imc-hash), which goes back to a checkpoint inside its reply (sent
// back less its last two words, so the decoded reply must be cut). Every
// reply equals --no-cache-prompt's.
test('tiny-hybrid: IMC and SPC with sub-agents, replies equal --no-cache-prompt', async () => {
  const model = MODELS['tiny-hybrid'];
  assert.ok(model, 'the tiny-hybrid model path is not set (run through ctest)');
  const cfg = writeConfig('models:\n  default: { incremental_cache: true, system_prompt_cache: true, cache_min_tokens: 16 }\n');
  const cached = await startServer(['-m', model, '--ctx', '1024', '--slots', '3', '--config', cfg]);
  servers.push(cached);
  const uncached = await startServer(['-m', model, '--ctx', '1024', '--no-cache-prompt']);
  servers.push(uncached);
  const sys = { role: 'system', content: `${system.content} ${'You help three agents who work on the river and the dog. '.repeat(4)}` };
  const convs = [0, 1, 2].map(() => [sys]);
  const prev = [0, 0, 0];
  const modes = [];
  for (let round = 0; round < 3; round++) {
    for (let k = 0; k < convs.length; k++) {
      const msgs = convs[k];
      msgs.push({ role: 'user', content: `${questions[(round + k) % questions.length]} (agent ${k})` });
      const a = await chat(cached, msgs, { max_tokens: 16, temperature: 0 });
      const b = await chat(uncached, msgs, { max_tokens: 16, temperature: 0 });
      const what = `agent ${k} round ${round + 1}`;
      assert.equal(replyOf(a), replyOf(b), `${what}: text differs from --no-cache-prompt`);
      const c = a.usage.prompt_tokens_details.cached_tokens;
      if (round === 0 && k > 0) assert.equal(a.cache.mode, 'spc', `${what}: ${JSON.stringify(a.cache)}`);
      if (round > 0) {
        assert.equal(a.cache.mode, 'imc-hash', `${what}: ${JSON.stringify(a.cache)}`);
        assert.ok(c >= prev[k], `${what}: cached ${c} < previous prompt ${prev[k]} (${a.cache.reason})`);
      }
      modes.push(a.cache.mode);
      prev[k] = a.usage.prompt_tokens;
      // Less its last two words: the slot's decoded reply must be cut.
      msgs.push({ role: 'assistant', content: replyOf(b).split(' ').slice(0, -2).join(' ') });
    }
  }
  const m = await metrics(cached);
  assert.ok(m.get('kvstash_checkpoint_restores_total') > 0, 'no turn went back to a checkpoint');
  await stopOk(cached);
  await stopOk(uncached);
  forget(cached, uncached);
});

// Another process (issue 15): two servers on the same store directories, as
// two processes of one host; each turn of a conversation goes to the other
// one, which restores the whole previous prompt from the store (the
// checkpoint the first saved at its prompt's end) while the first still
// runs. Replies equal --no-cache-prompt's.
test('tiny-hybrid: turns alternate between two processes sharing the store', async () => {
  const model = MODELS['tiny-hybrid'];
  assert.ok(model, 'the tiny-hybrid model path is not set (run through ctest)');
  const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-hyb-2p-'));
  const cfg = await writeStoreConfig(path.join(dir, 'store.yaml'),
    { cacheDir: path.join(dir, 'disk'), shmDir: path.join(dir, 'shm'), minTokens: 16, stride: 16 });
  const args = ['-m', model, '--ctx', '1024', '--slots', '1', '--config', cfg];
  const pair = [await startServer(args), await startServer(args)];
  servers.push(...pair);
  const uncached = await startServer(['-m', model, '--ctx', '1024', '--no-cache-prompt']);
  servers.push(uncached);
  const msgs = [system];
  let prevPrompt = 0;
  for (let turn = 0; turn < 4; turn++) {
    const srv = pair[turn % 2];
    msgs.push({ role: 'user', content: questions[turn] });
    const a = await chat(srv, msgs, { max_tokens: 16, temperature: 0 });
    const b = await chat(uncached, msgs, { max_tokens: 16, temperature: 0 });
    const what = `turn ${turn + 1} on process ${turn % 2}`;
    assert.equal(replyOf(a), replyOf(b), `${what}: text differs from --no-cache-prompt`);
    const c = a.usage.prompt_tokens_details.cached_tokens;
    if (turn > 0) {
      assert.equal(a.cache.mode, 'store', `${what}: ${JSON.stringify(a.cache)}`);
      assert.ok(c >= prevPrompt, `${what}: cached ${c} < previous prompt ${prevPrompt}`);
    }
    prevPrompt = a.usage.prompt_tokens;
    const text = replyOf(b);
    msgs.push({ role: 'assistant', content: text.length > 1 ? text.slice(0, -1) : text });
    await settleStore(srv); // the other process finds the file once written
  }
  for (const s of [...pair, uncached]) await stopOk(s);
  forget(...pair, uncached);
  rmSync(dir, { recursive: true, force: true });
});
