// bounds.test.mjs — issue 42's probe, answered: what one key holder can make
// the server do to every other tenant. A raw GBNF grammar is sized before
// llama.cpp parses it (src/server/grammarsize.h): the grammars that crashed
// the server (60,000 nested groups), held its inference thread for seconds
// (60,000 alternatives, 650 KB) or a minute (300 x 300 alternatives, 5.8 KB)
// are refused at once, and a normal request sent meanwhile is served as fast
// as without them.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, postJSON, assertError } from './lib.mjs';

let srv;
before(async () => { srv = await startServer(['--slots', '2', '--ctx', '512']); });
after(async () => { if (srv) await stopOk(srv); });

const alternatives = (n) => `root ::= ${Array.from({ length: n }, (_, i) => `"w${String(i).padEnd(7, 'x')}"`).join(' | ')}`;
const product = (n, m) => `root ::= ${Array.from({ length: n }, (_, i) => `A "z${i}"`).join(' | ')}\n` +
  `A ::= ${Array.from({ length: m }, (_, i) => `"q${i}"`).join(' | ')}\n`;
const nested = (d) => `root ::= ${'('.repeat(d)}"a"${')'.repeat(d)}`;

// A normal request's time to its first token, streamed.
async function ttft() {
  const t0 = performance.now();
  const res = await fetch(`${srv.base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ messages: [{ role: 'user', content: 'hello' }], max_tokens: 4, stream: true, cache_prompt: false }) });
  const reader = res.body.getReader();
  await reader.read();
  const t = performance.now() - t0;
  while (!(await reader.read()).done);
  return t;
}

test('grammars that crashed or held the server are refused at once; a concurrent request is not held', async () => {
  const base = [];
  for (let i = 0; i < 3; i++) base.push(await ttft());
  base.sort((a, b) => a - b);
  const cases = [
    [alternatives(60000), /more than 262144/],        // the probe's 650 KB
    [alternatives(20000), /continue in 20000 ways/],   // 4.1 s before
    [product(300, 300), /continue in 90000 ways/],     // 70 s before, 5.8 KB
    [nested(60000), /nests groups deeper than 128/],   // SIGSEGV before
  ];
  for (const [grammar, why] of cases) {
    const [r, t] = await Promise.all([
      postJSON(srv, '/v1/completions', { prompt: 'hi', grammar, max_tokens: 2 }),
      ttft(),
    ]);
    assertError(r, 400, 'grammar_too_large', 'grammar');
    assert.match(r.json.error.message, why);
    assert.ok(t < base[1] + 1000, `a concurrent request waited ${t.toFixed(0)} ms (unloaded ${base[1].toFixed(0)} ms)`);
    // Chat takes a grammar too: the same bound.
    const c = await postJSON(srv, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], grammar, max_tokens: 2 });
    assertError(c, 400, 'grammar_too_large', 'grammar');
  }
  // Within the bounds: served.
  const ok = await postJSON(srv, '/v1/completions', { prompt: 'hi', grammar: product(60, 60), max_tokens: 2 });
  assert.equal(ok.status, 200, ok.text);
  assert.equal((await fetch(`${srv.base}/health`)).status, 200);
});
