// cache.test.mjs — prompt caching is reported, and never changes the output.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, chat, stream, metrics } from './lib.mjs';

let cached;   // default: cache on
let uncached; // --no-cache-prompt
before(async () => {
  cached = await startServer();
  uncached = await startServer(['--no-cache-prompt']);
});
after(async () => {
  if (cached) await stopOk(cached);
  if (uncached) await stopOk(uncached);
});

const system = { role: 'system', content: 'You are a helpful assistant who answers in short sentences.' };
const questions = ['What is the capital of France?', 'And of Spain?', 'Which one is bigger?', 'Thanks. Summarize.'];

// Runs a conversation turn by turn; returns the replies and the responses.
async function converse(srv, extra = {}) {
  const msgs = [system];
  const out = [];
  for (const q of questions) {
    msgs.push({ role: 'user', content: q });
    const r = await chat(srv, msgs, { max_tokens: 24, ...extra });
    const reply = r.choices[0].message.content;
    msgs.push({ role: 'assistant', content: reply });
    out.push(r);
  }
  return out;
}

test('the second turn of a conversation reuses the first turn\'s KV', async () => {
  const before = await metrics(cached);
  const turns = await converse(cached);
  assert.equal(turns[0].usage.prompt_tokens_details.cached_tokens, 0, 'first turn: cold');
  for (const [i, r] of turns.entries()) {
    if (i === 0) continue;
    const c = r.usage.prompt_tokens_details.cached_tokens;
    assert.ok(c > 0, `turn ${i + 1}: cached_tokens ${c}`);
    // At least the previous turn's whole prompt is a prefix of this one.
    assert.ok(c >= turns[i - 1].usage.prompt_tokens - 1, `turn ${i + 1}: cached ${c} < previous prompt`);
    assert.equal(r.timings.cache_n, c);
    assert.equal(r.cache.cached_tokens, c);
    assert.notEqual(r.cache.mode, 'miss');
  }
  const after_ = await metrics(cached);
  assert.ok(after_.get('kvstash_prompt_tokens_cached_total') > before.get('kvstash_prompt_tokens_cached_total'));
});

test('cache_prompt:false prefills everything and reports 0 cached', async () => {
  const turns = await converse(cached, { cache_prompt: false });
  for (const r of turns) {
    assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(r.timings.prompt_n, r.usage.prompt_tokens);
  }
});

test('--no-cache-prompt server reports 0 cached, even when a request asks for it', async () => {
  const turns = await converse(uncached, { cache_prompt: true });
  for (const r of turns) assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
});

test('temperature 0: cached output equals uncached output, turn by turn', async () => {
  const a = await converse(cached);
  const b = await converse(uncached);
  const c = await converse(cached, { cache_prompt: false });
  for (let i = 0; i < questions.length; i++) {
    const ta = a[i].choices[0].message.content;
    assert.equal(ta, b[i].choices[0].message.content, `turn ${i + 1} vs --no-cache-prompt`);
    assert.equal(ta, c[i].choices[0].message.content, `turn ${i + 1} vs cache_prompt:false`);
    assert.equal(a[i].choices[0].finish_reason, b[i].choices[0].finish_reason);
    assert.equal(a[i].usage.completion_tokens, b[i].usage.completion_tokens);
  }
  assert.ok(a.slice(1).every((r) => r.usage.prompt_tokens_details.cached_tokens > 0));
});

test('a streamed cached turn equals the uncached non-streamed turn', async () => {
  const msgs = [system, { role: 'user', content: questions[0] }];
  const first = await chat(cached, msgs, { max_tokens: 24 });
  msgs.push({ role: 'assistant', content: first.choices[0].message.content }, { role: 'user', content: questions[1] });
  const s = await stream(cached, '/v1/chat/completions',
    { messages: msgs, temperature: 0, max_tokens: 24, stream_options: { include_usage: true } });
  const u = await chat(uncached, msgs, { max_tokens: 24 });
  assert.equal(s.text, u.choices[0].message.content);
  assert.ok(s.usage.usage.prompt_tokens_details.cached_tokens > 0);
});
