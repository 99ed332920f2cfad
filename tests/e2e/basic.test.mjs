// basic.test.mjs — the endpoints and response shapes of `kvstash serve`.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, postJSON, getJSON, chat, stream } from './lib.mjs';

let srv;
before(async () => { srv = await startServer(); });
after(async () => { if (srv) await stopOk(srv); });

const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say something.' }];

test('listening line names the model, slots, ctx and how exactness is kept', () => {
  // setup builds the batch-invariant CPU backend, so exactness costs nothing
  assert.match(srv.stderr, /kvstash: listening on http:\/\/127\.0\.0\.1:\d+ \(model .+, 2 slots, ctx 512, CPU, exact: batch-invariant\)/);
});

test('GET /health', async () => {
  const r = await getJSON(srv, '/health');
  assert.equal(r.status, 200);
  assert.deepEqual(r.json, { status: 'ok' });
});

test('GET /v1/models', async () => {
  const r = await getJSON(srv, '/v1/models');
  assert.equal(r.status, 200);
  assert.equal(r.json.object, 'list');
  assert.equal(r.json.data.length, 1);
  const m = r.json.data[0];
  assert.equal(m.object, 'model');
  assert.equal(typeof m.id, 'string');
  assert.equal(m.meta.n_ctx_seq, 512);
});

test('non-stream chat completion', async () => {
  const r = await chat(srv, msgs, { max_tokens: 12 });
  assert.match(r.id, /^chatcmpl-[0-9a-f]{32}$/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(typeof r.created, 'number');
  assert.equal(typeof r.model, 'string');
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(c.message.role, 'assistant');
  assert.equal(typeof c.message.content, 'string');
  assert.ok(['stop', 'length'].includes(c.finish_reason));
  const u = r.usage;
  assert.ok(u.prompt_tokens > 0);
  assert.ok(u.completion_tokens >= 1 && u.completion_tokens <= 12);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
  assert.equal(typeof u.prompt_tokens_details.cached_tokens, 'number');
  const t = r.timings;
  for (const k of ['prompt_n', 'cache_n', 'prompt_ms', 'prompt_per_token_ms', 'prompt_per_second', 'predicted_n',
    'predicted_ms', 'predicted_per_token_ms', 'predicted_per_second']) assert.equal(typeof t[k], 'number', k);
  assert.equal(t.prompt_n + t.cache_n, u.prompt_tokens);
  assert.equal(t.cache_n, u.prompt_tokens_details.cached_tokens);
  assert.equal(t.predicted_n, u.completion_tokens);
  assert.equal(typeof r.cache.mode, 'string');
  assert.equal(r.cache.cached_tokens, t.cache_n);
  assert.ok(r.cache.slot === 0 || r.cache.slot === 1);
  if (c.finish_reason === 'length') assert.equal(u.completion_tokens, 12);
});

test('content as an array of text parts equals the joined string', async () => {
  const a = await chat(srv, [{ role: 'user', content: [{ type: 'text', text: 'one' }, { type: 'text', text: 'two' }] }],
    { cache_prompt: false });
  const b = await chat(srv, [{ role: 'user', content: 'one\ntwo' }], { cache_prompt: false });
  assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

test('stream chat completion: role chunk, deltas, finish, usage, [DONE]', async () => {
  const plain = await chat(srv, msgs, { max_tokens: 10 });
  const s = await stream(srv, '/v1/chat/completions',
    { messages: msgs, temperature: 0, max_tokens: 10, stream_options: { include_usage: true } });
  assert.equal(s.status, 200);
  assert.ok(s.done, 'ends with [DONE]');
  const objs = s.events.filter((e) => e.json).map((e) => e.json);
  for (const o of objs) {
    assert.equal(o.object, 'chat.completion.chunk');
    assert.equal(o.id, objs[0].id);
  }
  assert.deepEqual(objs[0].choices[0].delta, { role: 'assistant', content: '' });
  const fin = objs[objs.length - 2];
  assert.ok(['stop', 'length'].includes(fin.choices[0].finish_reason));
  const last = objs[objs.length - 1];
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage.completion_tokens, plain.usage.completion_tokens);
  assert.equal(last.usage.prompt_tokens, plain.usage.prompt_tokens);
  assert.equal(typeof last.timings.predicted_n, 'number');
  assert.equal(typeof last.cache.mode, 'string');
  // Greedy: the stream carries the same text as the non-streamed reply.
  assert.equal(s.text, plain.choices[0].message.content);
  assert.equal(s.finish, plain.choices[0].finish_reason);
});

test('stream without include_usage has no usage chunk', async () => {
  const s = await stream(srv, '/v1/chat/completions', { messages: msgs, temperature: 0, max_tokens: 4 });
  assert.ok(s.done);
  assert.equal(s.usage, null);
});

test('non-stream and stream text completion', async () => {
  const r = await postJSON(srv, '/v1/completions', { prompt: 'Once upon a time', temperature: 0, max_tokens: 8 });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.object, 'text_completion');
  assert.match(r.json.id, /^cmpl-/);
  assert.equal(typeof r.json.choices[0].text, 'string');
  assert.equal(r.json.choices[0].index, 0);
  assert.ok(['stop', 'length'].includes(r.json.choices[0].finish_reason));
  const s = await stream(srv, '/v1/completions',
    { prompt: 'Once upon a time', temperature: 0, max_tokens: 8, stream_options: { include_usage: true } });
  assert.ok(s.done);
  for (const e of s.events) if (e.json) assert.equal(e.json.object, 'text_completion');
  assert.equal(s.text, r.json.choices[0].text);
  assert.equal(s.usage.usage.completion_tokens, r.json.usage.completion_tokens);
  // Token ids are a prompt too.
  const t = await postJSON(srv, '/v1/completions', { prompt: [1, 5, 9, 12], temperature: 0, max_tokens: 3 });
  assert.equal(t.status, 200, t.text);
  assert.equal(t.json.usage.prompt_tokens, 4);
});

test('stop string ends the reply and is not included', async () => {
  const base = await postJSON(srv, '/v1/completions', { prompt: 'The', temperature: 0, max_tokens: 24, cache_prompt: false });
  const text = base.json.choices[0].text;
  const words = text.trim().split(/\s+/);
  assert.ok(words.length >= 3, `need a few words: ${JSON.stringify(text)}`);
  const stopWord = words[2];
  const idx = text.indexOf(stopWord);
  const r = await postJSON(srv, '/v1/completions',
    { prompt: 'The', temperature: 0, max_tokens: 24, stop: ['zzz-never', stopWord], cache_prompt: false });
  assert.equal(r.status, 200);
  assert.equal(r.json.choices[0].text, text.slice(0, idx));
  assert.equal(r.json.choices[0].finish_reason, 'stop');
  const s = await stream(srv, '/v1/completions', { prompt: 'The', temperature: 0, max_tokens: 24, stop: stopWord });
  assert.equal(s.text, text.slice(0, idx));
  assert.equal(s.finish, 'stop');
});

test('GET /slots lists the slots', async () => {
  const r = await getJSON(srv, '/slots');
  assert.equal(r.status, 200);
  assert.equal(r.json.length, 2);
  for (const [i, s] of r.json.entries()) {
    assert.equal(s.id, i);
    assert.equal(typeof s.busy, 'boolean');
    assert.ok(['idle', 'busy'].includes(s.state));
    for (const k of ['n_tokens', 'n_prompt', 'n_cached', 'n_generated', 'req_id']) assert.equal(typeof s[k], 'number', k);
  }
  assert.ok(r.json.some((s) => s.n_tokens > 0), 'some slot holds tokens after the requests above');
});

test('path aliases without /v1', async () => {
  const r = await postJSON(srv, '/chat/completions', { messages: msgs, max_tokens: 2 });
  assert.equal(r.status, 200);
  const m = await getJSON(srv, '/models');
  assert.equal(m.status, 200);
});

test('sampling with temperature > 0 and a seed is reproducible', async () => {
  const body = { messages: msgs, temperature: 1.0, top_k: 0, top_p: 1, min_p: 0, seed: 1234, max_tokens: 12 };
  const a = await chat(srv, body.messages, body);
  const b = await chat(srv, body.messages, body);
  assert.equal(a.choices[0].message.content, b.choices[0].message.content);
});

test('default max_tokens fills at most the context left', async () => {
  const r = await postJSON(srv, '/v1/completions', { prompt: 'x', temperature: 0 });
  assert.equal(r.status, 200);
  assert.ok(r.json.usage.prompt_tokens + r.json.usage.completion_tokens <= 512);
});
