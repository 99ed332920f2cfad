// metrics.test.mjs — /metrics is valid Prometheus text and its counters move.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, chat, getJSON, metrics } from './lib.mjs';

let srv;
before(async () => { srv = await startServer(); });
after(async () => { if (srv) await stopOk(srv); });

const NAMES = [
  'kvstash_requests_total', 'kvstash_requests_rejected_total', 'kvstash_requests_canceled_total',
  'kvstash_prompt_tokens_total', 'kvstash_prompt_tokens_cached_total', 'kvstash_prompt_tokens_prefilled_total',
  'kvstash_cache_hit_ratio', 'kvstash_prompt_seconds_total', 'kvstash_tokens_predicted_total',
  'kvstash_predicted_seconds_total', 'kvstash_slots_busy', 'kvstash_slots_total', 'kvstash_queue_depth',
  'kvstash_http_requests_total', 'kvstash_client_disconnects_total', 'kvstash_uptime_seconds',
];

test('every line parses and every family has HELP and TYPE', async () => {
  const res = await fetch(srv.base + '/metrics');
  assert.equal(res.status, 200);
  assert.match(res.headers.get('content-type'), /^text\/plain; version=0\.0\.4/);
  const text = await res.text();
  const m = await metrics(srv); // parseProm asserts the line syntax
  for (const n of NAMES) {
    assert.ok(m.has(n), `missing ${n}`);
    assert.match(text, new RegExp(`^# HELP ${n} .+$`, 'm'));
    assert.match(text, new RegExp(`^# TYPE ${n} (counter|gauge)$`, 'm'));
  }
  assert.equal(m.get('kvstash_slots_total'), 2);
  assert.match(text, /^# TYPE kvstash_http_errors_total counter$/m);
});

test('the cached-token counter and the hit ratio move with a second turn', async () => {
  const m0 = await metrics(srv);
  const msgs = [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Name a color.' }];
  const r1 = await chat(srv, msgs, { max_tokens: 8 });
  msgs.push({ role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'Another?' });
  const r2 = await chat(srv, msgs, { max_tokens: 8 });
  const cached = r2.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > 0);
  const m1 = await metrics(srv);
  const d = (k) => m1.get(k) - m0.get(k);
  assert.equal(d('kvstash_requests_total'), 2);
  assert.equal(d('kvstash_prompt_tokens_total'), r1.usage.prompt_tokens + r2.usage.prompt_tokens);
  assert.equal(d('kvstash_prompt_tokens_cached_total'), r1.usage.prompt_tokens_details.cached_tokens + cached);
  assert.equal(d('kvstash_tokens_predicted_total'), r1.usage.completion_tokens + r2.usage.completion_tokens);
  assert.ok(d('kvstash_prompt_seconds_total') > 0);
  assert.ok(m1.get('kvstash_cache_hit_ratio') > 0 && m1.get('kvstash_cache_hit_ratio') <= 1);
  assert.equal(m1.get('kvstash_slots_busy'), 0);
  assert.equal(m1.get('kvstash_queue_depth'), 0);
});

test('a conversation sent again is tokenized only where it grew (the tokenization cache)', async () => {
  const msgs = [{ role: 'system', content: 'You are a careful assistant. '.repeat(10) },
    { role: 'user', content: 'Tell me about prompt caches. '.repeat(8) }];
  const m0 = await metrics(srv);
  const r1 = await chat(srv, msgs, { max_tokens: 4 });
  const m1 = await metrics(srv);
  msgs.push({ role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'Go on.' });
  const r2 = await chat(srv, msgs, { max_tokens: 4 });
  const m2 = await metrics(srv);
  const d = (a, b, k) => b.get(k) - a.get(k);
  // the first request tokenized most of its prompt (pieces such as '<|im_end|>\n' are
  // met before); the second took its first two messages from the cache
  assert.ok(d(m0, m1, 'kvstash_prompt_tokens_tokenized_total') > r1.usage.prompt_tokens / 2);
  const reused = d(m1, m2, 'kvstash_prompt_tokens_untokenized_total');
  const fresh = d(m1, m2, 'kvstash_prompt_tokens_tokenized_total');
  assert.ok(reused > r1.usage.prompt_tokens - 20, `untokenized ${reused} of ${r2.usage.prompt_tokens}`);
  assert.ok(fresh < r2.usage.prompt_tokens - r1.usage.prompt_tokens + 20, `tokenized ${fresh}`);
  assert.ok(m2.get('kvstash_tokcache_bytes') > 0);
});

test('HTTP errors are counted by status', async () => {
  const m0 = await metrics(srv);
  await getJSON(srv, '/does-not-exist');
  const m1 = await metrics(srv);
  assert.equal((m1.get('kvstash_http_errors_total{code="404"}') ?? 0) - (m0.get('kvstash_http_errors_total{code="404"}') ?? 0), 1);
  assert.ok(m1.get('kvstash_http_requests_total') > m0.get('kvstash_http_requests_total'));
});
