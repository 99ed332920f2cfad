// bounds.test.mjs — issue 42's probe, answered: what one key holder can make
// the server do to every other tenant. A raw GBNF grammar is sized before
// llama.cpp parses it (src/server/grammarsize.h): the grammars that crashed
// the server (60,000 nested groups), held its inference thread for seconds
// (60,000 alternatives, 650 KB) or a minute (300 x 300 alternatives, 5.8 KB)
// are refused at once, and a normal request sent meanwhile is served as fast
// as without them.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, postJSON, assertError, until } from './lib.mjs';

// Under a sanitizer the memory is the sanitizer's: the budget is not checked there.
const SANITIZED = process.env.KS_SANITIZED === '1';

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

// Slowloris: libmicrohttpd's timeout counts per pause, so headers trickled a
// byte a second under --header-timeout 3 kept their connections forever, and
// enough of them from one address locked its normal requests out. The whole
// headers now have the deadline (hdrwatch.h): each trickling connection is
// closed soon after it, and a normal request from the same address is served.
test('trickled headers are cut at the header deadline; a normal request from the same address is served', async () => {
  const net = await import('node:net');
  const s2 = await startServer(['--slots', '1', '--ctx', '256', '--header-timeout', '3', '--max-connections', '16']);
  try {
    const { port } = s2;
    const t0 = performance.now();
    const socks = [];
    const closed = [];
    for (let i = 0; i < 20; i++) {
      const sock = net.connect(port, '127.0.0.1');
      sock.on('error', () => {});
      sock.on('close', () => closed.push(performance.now() - t0));
      sock.write('POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ');
      socks.push(sock);
    }
    const drip = setInterval(() => { for (const s of socks) if (!s.destroyed) s.write('a'); }, 1000);
    try {
      // A normal request gets through well before the deadline: it takes the
      // place of a stalled connection of its address. (It may meet the
      // moment when the burst's cut connections are still counted: a 503 or
      // a reset, retried as a client does.)
      let r;
      for (;;) {
        r = await postJSON(s2, '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 })
          .catch((e) => ({ status: 0, text: String(e) }));
        if (r.status === 200 || performance.now() - t0 > 5000) break;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      assert.equal(r.status, 200, r.text);
      const tOk = performance.now() - t0;
      assert.ok(tOk < 2000, `the normal request came through after ${tOk.toFixed(0)} ms (the deadline is 3 s)`);
      await new Promise((resolve) => setTimeout(resolve, 6000));
      assert.equal(closed.length, 20, `the trickling connections still open after 6 s: ${20 - closed.length}`);
      // Closed by the deadline (3 s), not at once and not much later; the
      // normal request came through by then.
      for (const t of closed) assert.ok(t < 5500, `a trickling connection was closed after ${t.toFixed(0)} ms`);
      assert.match(s2.stderr, /closed a connection whose request headers took longer than 3 s/);
    } finally {
      clearInterval(drip);
      for (const s of socks) s.destroy();
    }
  } finally {
    await stopOk(s2);
  }
});

// Every message is sized before it is parsed and rendered: assistants' and
// tools' contents too, and the fields outside the prompt (issue 42: a 15 MB
// assistant message cost 206-264 MB before its 400, and /apply-template
// answered 200 at +760 MB for four). Each refusal costs the server less than
// twice the body it had to receive (VmHWM, the process's peak).
test('15 MB in an assistant message, a tool result, an unknown field or count_tokens: refused for less than twice the body', async (t) => {
  const { readFileSync } = await import('node:fs');
  const hwm = (pid) => Number(/VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024;
  const big = 'lorem ipsum dolor sit amet '.repeat(15 * (1 << 20) / 27);
  const user = { role: 'user', content: 'hi' };
  const cases = [
    ['/v1/chat/completions', { messages: [user, { role: 'assistant', content: big }, user] }, 400],
    ['/v1/chat/completions', { messages: [user, { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function',
      function: { name: 'f', arguments: '{}' } }] }, { role: 'tool', tool_call_id: 'c1', content: big }],
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }] }, 400],
    ['/v1/chat/completions', { messages: [user], max_tokens: 1, frobnicate: big }, 413],
    ['/v1/messages/count_tokens', { model: 'm', messages: [{ role: 'user', content: big }] }, 400],
    ['/v1/messages', { model: 'm', max_tokens: 1, messages: [user, { role: 'assistant', content: big }, user] }, 400],
    ['/v1/responses', { model: 'm', input: [user, { type: 'function_call_output', call_id: 'c', output: big }] }, 400],
    ['/apply-template', { messages: [user, { role: 'assistant', content: big }] }, 400],
    // Issue 41: a response format's schema of 10^5 nodes (3 MB) is refused before its parse.
    ['/v1/chat/completions', { messages: [user], max_tokens: 1, response_format: { type: 'json_schema', json_schema: {
      name: 'x', schema: { type: 'object', properties: Object.fromEntries(Array.from({ length: 100000 },
        (_, i) => [`p${i}`, { type: 'string' }])) } } } }, 413],
  ];
  for (const [route, body, status] of cases) {
    const s3 = await startServer(['--slots', '1', '--ctx', '512']);
    try {
      const text = JSON.stringify(body);
      // The server at rest, then after one request of its shape (its own steady state).
      await postJSON(s3, '/v1/chat/completions', { messages: [user], max_tokens: 1 });
      const before = hwm(s3.proc.pid);
      const r = await postJSON(s3, route, body);
      assert.equal(r.status, status, `${route}: ${r.text.slice(0, 300)}`);
      const grew = hwm(s3.proc.pid) - before;
      t.diagnostic(`${route} -> ${r.status}: peak +${(grew / 1048576).toFixed(1)} MiB for ${(text.length / 1048576).toFixed(1)} MiB`);
      if (!SANITIZED) assert.ok(grew < 2 * text.length, `${route}: peak memory grew ${(grew / 1048576).toFixed(1)} MiB for a ` +
        `${(text.length / 1048576).toFixed(1)} MiB body`);
      assert.equal((await postJSON(s3, '/v1/chat/completions', { messages: [user], max_tokens: 1 })).status, 200);
    } finally {
      await stopOk(s3);
    }
  }
});

// A kept-alive connection that trickles its next request line escaped the
// deadline (libmicrohttpd's idle timeout restarts with every byte; a review
// found it): idle time between requests is bounded by --timeout in all.
test('a kept-alive connection trickling its next request line is closed at the idle timeout', async () => {
  const net = await import('node:net');
  const s4 = await startServer(['--slots', '1', '--ctx', '256', '--timeout', '2', '--header-timeout', '5']);
  try {
    const sock = net.connect(s4.port, '127.0.0.1');
    let data = '';
    let closedAt = 0;
    const t0 = performance.now();
    sock.on('data', (d) => { data += d; });
    sock.on('error', () => {});
    const closed = new Promise((resolve) => sock.on('close', () => { closedAt = performance.now() - t0; resolve(); }));
    sock.write('GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n');
    const line = 'GET /health HTTP/1.1';
    let i = 0;
    const drip = setInterval(() => { if (!sock.destroyed && i < line.length) sock.write(line[i++]); }, 500);
    await Promise.race([closed, new Promise((resolve) => setTimeout(resolve, 8000))]);
    clearInterval(drip);
    sock.destroy();
    assert.match(data, /^HTTP\/1\.1 200/, 'the first request was answered');
    assert.ok(closedAt > 0 && closedAt < 4500, `closed after ${closedAt.toFixed(0)} ms (idle timeout 2 s; 0: still open)`);
    // The watcher logs just after it shuts the socket: the line may reach
    // stderr a moment after the client saw the close (seen under ASan).
    await until(() => /closed a connection idle between requests longer than 2 s/.test(s4.stderr),
      'the log line naming the idle close', 5000);
  } finally {
    await stopOk(s4);
  }
});
