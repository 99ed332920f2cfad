// hybrid.test.mjs — `kvstash serve` on the hybrid (tiny-hybrid, lfm2) and
// sliding-window (tiny-swa, gemma3) test models of issue 15: the server
// starts, answers, and a multi-turn chat gives the greedy replies of
// --no-cache-prompt, turn by turn.
//
// What the cache achieves on them today: tiny-swa trims like `llama` (the
// engine's SWA cache is full-size), so every turn after the first reuses the
// previous prompt. tiny-hybrid cannot trim: a turn whose common prefix ends
// inside the slot's tokens is a full prefill with the reason
// "partial-rm-unsupported" (until the checkpoints of issue 15).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, chat, replyOf, writeStoreConfig } from './lib.mjs';

const MODELS = {
  'tiny-hybrid': process.env.KS_TINY_HYBRID_MODEL,
  'tiny-swa': process.env.KS_TINY_SWA_MODEL,
};

const servers = [];
after(async () => {
  for (const s of servers) await stopOk(s);
});

const system = { role: 'system', content: 'You are a helpful assistant who answers in short sentences.' };
const questions = ['hello, what is the water like in the river?', 'tell me a story about a dog',
  'why did the dog run to the river?'];

async function converse(srv) {
  const msgs = [system];
  const out = [];
  for (const q of questions) {
    msgs.push({ role: 'user', content: q });
    const r = await chat(srv, msgs, { max_tokens: 24, temperature: 0 });
    msgs.push({ role: 'assistant', content: replyOf(r) });
    out.push(r);
  }
  return out;
}

for (const [name, model] of Object.entries(MODELS)) {
  test(`${name}: a 3-turn chat equals --no-cache-prompt, turn by turn`, async () => {
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
      if (name === 'tiny-swa') {
        // A trim never loses more than the reply's last tokens as rendered.
        assert.ok(c >= a[i - 1].usage.prompt_tokens - 1, `${what}: cached ${c} < previous prompt`);
      } else if (c === 0) {
        assert.equal(a[i].cache.reason, 'partial-rm-unsupported', `${what}: cache.reason`);
      } else {
        // The rendered reply matched the generated one to its end: an extension, no trim.
        assert.ok(c >= a[i - 1].usage.prompt_tokens, `${what}: cached ${c} without a trim`);
      }
    }
    await stopOk(cached);
    await stopOk(uncached);
    servers.length = 0;
  });
}

// A sliding-window model's state past the window does not restore bit for bit
// (llama keeps only the window's cells and sets them into other cells), so
// restores from the store, SPC or another slot stop at the window (32 tokens
// on tiny-swa): two conversations taking turns on one slot, each turn after
// the other's, restore at most that much, and every reply equals the uncached
// one.
test('tiny-swa: restores stop at the sliding window, replies equal --no-cache-prompt', async () => {
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
  let windowed = 0;
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
        assert.ok(c <= 32, `${what}: ${c} tokens restored (${a.cache.mode}) past the 32-token window`);
        windowed++;
      }
      msgs.push({ role: 'assistant', content: replyOf(b) });
    }
  }
  // The store was asked: each conversation's turns after the first found a
  // stored state of its own (the other conversation held the slot), cut to
  // the window.
  assert.ok(windowed > 0, 'no restore at all: the test did not reach the store');
  await stopOk(cached);
  await stopOk(uncached);
  servers.length = 0;
  rmSync(dir, { recursive: true, force: true });
});
