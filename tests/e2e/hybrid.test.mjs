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
import { startServer, stopOk, chat, replyOf } from './lib.mjs';

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
