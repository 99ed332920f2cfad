// hardening.test.mjs — HTTP edge cases of issue 13 ("Hardening"), each a
// regression test of one finding, over raw sockets where an HTTP client
// would not send the request:
//   3. conflicting or ambiguous Content-Length / Transfer-Encoding: 400, closed;
//   4. connection exhaustion: header timeout, per-client cap, 503 beyond the total;
//   5. a prompt far over the context is refused before it is tokenized;
//   6. a client that half-closes after its request still gets its reply;
//   8. a stream its client abandons is logged and counted as cancel, not stop.
import { test, before, after, describe } from 'node:test';
import assert from 'node:assert/strict';
import {
  startServer, stopOk, postJSON, getJSON, assertError, metrics, until, sleep, parseSSE, streamUntil,
  rawHTTP, rawOpen, rawRequest, parseHTTP, LONG_ARGS, LONG_PROMPT,
} from './lib.mjs';

const CHAT = '/v1/chat/completions';

describe('request framing (finding 3, RFC 9112 6.3)', () => {
  let srv;
  before(async () => { srv = await startServer(); });
  after(async () => { if (srv) await stopOk(srv); });

  // The one reply of a refused request: a 400 invalid_framing, then the
  // server closes the connection (nothing after it is read as a request).
  async function refused(payload, what) {
    const r = await rawHTTP(srv, payload, { timeoutMs: 10000 });
    assert.ok(r.closed, `${what}: the server kept the connection open: ${r.text}`);
    const res = parseHTTP(r.data);
    assert.equal(res.length, 1, `${what}: ${res.length} responses: ${r.text}`);
    assert.equal(res[0].status, 400, `${what}: ${r.text}`);
    assert.equal(res[0].headers.connection, 'close', what);
    const e = JSON.parse(res[0].body.toString()).error;
    assert.equal(e.code, 'invalid_framing', `${what}: ${r.text}`);
    assert.equal(e.type, 'invalid_request_error');
    return e;
  }

  test('two Content-Length headers: the smuggled second request is never answered', async () => {
    // MHD took the first length (2): "{}" was the body and the rest a
    // second request, answered 200 (a proxy honouring the last length sees one).
    const smuggled = 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n';
    const body = '{}' + smuggled;
    const e = await refused(rawRequest('POST', CHAT, {
      headers: ['Content-Type: application/json', 'Content-Length: 2', `Content-Length: ${body.length}`], body,
    }), 'conflicting lengths');
    assert.match(e.message, /more than one Content-Length/);
  });

  test('two equal Content-Length headers are refused too', async () => {
    await refused(rawRequest('POST', CHAT, { headers: ['Content-Length: 2', 'Content-Length: 2'], body: '{}' }),
      'equal lengths');
  });

  test('Content-Length with Transfer-Encoding', async () => {
    const e = await refused(rawRequest('POST', CHAT, {
      headers: ['Transfer-Encoding: chunked', 'Content-Length: 5'], body: '0\r\n\r\n',
    }), 'length and chunked');
    assert.match(e.message, /Content-Length together with Transfer-Encoding/);
  });

  test('a Transfer-Encoding other than chunked', async () => {
    await refused(rawRequest('POST', CHAT, { headers: ['Transfer-Encoding: gzip, chunked'], body: '0\r\n\r\n' }),
      'gzip, chunked');
    await refused(rawRequest('POST', CHAT, { headers: ['Transfer-Encoding: chunked', 'Transfer-Encoding: chunked'],
      body: '0\r\n\r\n' }), 'two Transfer-Encodings');
  });

  test('whitespace between a field name and its colon (RFC 9112 5.1)', async () => {
    // MHD keeps "Content-Length " as another field and reads no body.
    await refused(rawRequest('POST', CHAT, { headers: ['Content-Length : 2'], body: '{}' }), 'space before colon');
  });

  test('a malformed Content-Length: libmicrohttpd\'s own 400, then the connection closes', async () => {
    // MHD refuses these before kvstash sees the request (its HTML body;
    // 0.9.75 writes its header block twice), so they are not smuggled either.
    for (const v of ['2x', '2, 2', '-1', '']) {
      const r = await rawHTTP(srv, rawRequest('POST', CHAT, { headers: [`Content-Length: ${v}`], body: '{}' }));
      assert.ok(r.closed, `Content-Length "${v}": open`);
      assert.match(r.text, /^HTTP\/1\.1 400 /, `Content-Length "${v}": ${r.text}`);
      assert.doesNotMatch(r.text, /HTTP\/1\.1 200 /);
    }
  });

  test('a chunked body alone is still fine, and the server keeps serving', async () => {
    const body = JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    const chunked = `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
    const r = await rawHTTP(srv, rawRequest('POST', CHAT, {
      headers: ['Transfer-Encoding: chunked', 'Connection: close'], body: chunked,
    }));
    const res = parseHTTP(r.data);
    assert.equal(res.length, 1);
    assert.equal(res[0].status, 200, r.text);
    assert.equal((await getJSON(srv, '/health')).status, 200);
    const m = await metrics(srv);
    assert.ok(m.get('kvstash_http_errors_total{code="400"}') >= 6);
  });
});

describe('a prompt that cannot fit is refused before it is tokenized (finding 5)', () => {
  let srv;
  before(async () => { srv = await startServer(); }); // 512-token slots
  after(async () => { if (srv) await stopOk(srv); });

  // 8 MB: tokenizing it took seconds of CPU before the context check refused it.
  const BIG = 'x'.repeat(8_000_000);

  let longest; // the model's longest token, in bytes (from the message)

  test('completions: the bound names the prompt\'s bytes and the tokens they are at least', async () => {
    const r = await postJSON(srv, '/v1/completions', { prompt: BIG, max_tokens: 4 });
    const e = assertError(r, 400, 'context_length_exceeded', 'prompt');
    const m = /maximum context length is 512 tokens\. However, your prompt is 8000000 bytes, which is at least (\d+) tokens \(no token of this model is longer than (\d+) bytes\)/.exec(e.message);
    assert.ok(m, e.message);
    longest = Number(m[2]);
    assert.equal(Number(m[1]), Math.ceil(8_000_000 / longest));
    assert.ok(Number(m[1]) >= 512);
  });

  test('completions: each prompt of a batch is bounded', async () => {
    const r = await postJSON(srv, '/v1/completions', { prompt: ['hello', BIG], max_tokens: 4 });
    const e = assertError(r, 400, 'context_length_exceeded', 'prompt');
    assert.match(e.message, /your prompt is 8000000 bytes/);
  });

  test('chat: the rendered prompt is bounded before it is tokenized', async () => {
    const r = await postJSON(srv, CHAT, { messages: [{ role: 'user', content: BIG }], max_tokens: 4 });
    const e = assertError(r, 400, 'context_length_exceeded', 'messages');
    assert.match(e.message, /your messages render to more than \d+ bytes, which is at least 512 tokens/);
  });

  test('a prompt within the bound still gets the exact check, and one that fits runs', async () => {
    // Within (512 - 1) x longest bytes, but two tokens a 'hello world ': tokenized, then refused.
    const within = 'hello world '.repeat(Math.floor((511 * longest) / 12));
    const r = await postJSON(srv, '/v1/completions', { prompt: within, max_tokens: 4 });
    const e = assertError(r, 400, 'context_length_exceeded', 'prompt');
    assert.match(e.message, /your prompt resulted in \d+ tokens/);
    const ok = await postJSON(srv, '/v1/completions', { prompt: 'word '.repeat(50), max_tokens: 4, temperature: 0 });
    assert.equal(ok.status, 200, ok.text);
  });
});

describe('a client that half-closes after its request (finding 6)', () => {
  let srv;
  // The long prompt's prefill takes about a second: the connection thread
  // polls the socket (and sees end of file) several times before the reply.
  before(async () => { srv = await startServer(['--slots', '1', ...LONG_ARGS]); });
  after(async () => { if (srv) await stopOk(srv); });

  const body = (extra) => JSON.stringify({
    messages: [{ role: 'user', content: LONG_PROMPT }], temperature: 0, max_tokens: 8, cache_prompt: false, ...extra,
  });

  test('a whole reply', async () => {
    const m0 = await metrics(srv);
    const r = await rawHTTP(srv, rawRequest('POST', CHAT, { body: body({}) }), { halfClose: true, timeoutMs: 60000 });
    const res = parseHTTP(r.data);
    // Interim 100 Continue responses (the probes) come first, then the reply.
    const final = res.filter((x) => x.status >= 200);
    assert.equal(final.length, 1, r.text.slice(0, 500));
    assert.ok(res.slice(0, -1).every((x) => x.status === 100), r.text.slice(0, 500));
    assert.equal(final[0].status, 200, r.text.slice(0, 500));
    const j = JSON.parse(final[0].body.toString());
    assert.equal(j.object, 'chat.completion');
    assert.equal(j.choices[0].finish_reason, 'length');
    assert.equal(j.usage.completion_tokens, 8);
    const m1 = await metrics(srv);
    assert.equal(m1.get('kvstash_requests_canceled_total'), m0.get('kvstash_requests_canceled_total'));
    assert.equal(m1.get('kvstash_client_disconnects_total'), m0.get('kvstash_client_disconnects_total'));
  });

  test('a stream', async () => {
    const r = await rawHTTP(srv, rawRequest('POST', CHAT, { body: body({ stream: true }) }),
      { halfClose: true, timeoutMs: 60000 });
    const res = parseHTTP(r.data);
    assert.equal(res.length, 1, r.text.slice(0, 500));
    assert.equal(res[0].status, 200, r.text.slice(0, 500));
    assert.match(res[0].headers['content-type'], /^text\/event-stream/);
    // The probes are SSE comments (":"), which clients skip.
    const text = res[0].body.toString().split('\n\n').filter((b) => b !== ':').join('\n\n');
    const events = parseSSE(text);
    assert.equal(events[events.length - 1].data, '[DONE]');
    const finish = events.map((e) => e.json?.choices?.[0]?.finish_reason).filter(Boolean);
    assert.deepEqual(finish, ['length']);
  });

  test('a client that closes its socket while waiting still frees the slot', async () => {
    // The same end of file as a half-close; the probe tells them apart.
    const m0 = await metrics(srv);
    const c = await rawOpen(srv, rawRequest('POST', CHAT, { body: body({ max_tokens: 64 }) }));
    await until(async () => (await getJSON(srv, '/slots')).json[0].busy, 'the slot to become busy');
    c.sock.end(); // FIN; the socket is then destroyed by Node when the server resets it
    c.sock.destroy();
    await until(async () => (await getJSON(srv, '/slots')).json[0].busy === false, 'the slot to become idle');
    const m1 = await metrics(srv);
    assert.equal(m1.get('kvstash_requests_canceled_total'), m0.get('kvstash_requests_canceled_total') + 1);
    assert.equal((await getJSON(srv, '/slots')).json[0].n_generated, 0);
  });
});

describe('a stream its client abandons (finding 8)', () => {
  let srv;
  before(async () => { srv = await startServer(['--slots', '2', '--ctx', '8192']); });
  after(async () => { if (srv) await stopOk(srv); });

  test('is logged and counted as cancel, not stop', async () => {
    // The connection thread marked the request gone, then canceled it; a
    // decode step running across the two saw "gone" in its token callback
    // and ended the request as stop. Another slot's long prefill makes each
    // step long (about half the tries ended as stop): eight tries.
    for (let i = 0; i < 8; i++) {
      const m0 = await metrics(srv);
      const prefill = postJSON(srv, CHAT, {
        messages: [{ role: 'user', content: LONG_PROMPT }], max_tokens: 1, cache_prompt: false, id_slot: 1,
      });
      await until(async () => (await getJSON(srv, '/slots')).json[1].busy, 'the prefill to start');
      let id = null;
      // ignore_eos and a long max_tokens: the generation runs on when the client leaves.
      const r = await streamUntil(srv, CHAT, {
        messages: [{ role: 'user', content: 'Talk for a long time.' }], temperature: 0, max_tokens: 4000,
        ignore_eos: true, id_slot: 0,
      }, (json) => {
        id ??= json?.id;
        return typeof json?.choices?.[0]?.delta?.content === 'string' && json.choices[0].delta.content.length > 0;
      });
      assert.ok(r.aborted);
      assert.match(id, /^chatcmpl-/);
      assert.equal((await prefill).status, 200);
      const line = await until(() => srv.stderr.split('\n').find((l) => l.includes(` ${id} slot `)),
        `the log line of ${id}`);
      assert.match(line, /, finish cancel,/, `try ${i}: ${line}`);
      const m1 = await metrics(srv);
      assert.equal(m1.get('kvstash_requests_canceled_total'), m0.get('kvstash_requests_canceled_total') + 1, `try ${i}`);
      assert.equal(m1.get('kvstash_client_disconnects_total'), m0.get('kvstash_client_disconnects_total') + 1);
      assert.ok((await getJSON(srv, '/slots')).json[0].n_generated < 4000);
    }
  });
});

describe('connection exhaustion (finding 4)', () => {
  let srv;
  const TIMEOUT_S = 2;
  before(async () => {
    srv = await startServer(['--header-timeout', String(TIMEOUT_S), '--max-connections', '6',
      '--max-connections-per-client', '4']);
  });
  after(async () => { if (srv) await stopOk(srv); });

  // A GET from its own loopback address (a client of its own), read whole.
  async function getFrom(addr, path = '/health') {
    const r = await rawHTTP(srv, rawRequest('GET', path, { headers: ['Connection: close'], body: null }),
      { localAddress: addr });
    const res = parseHTTP(r.data);
    assert.equal(res.length, 1, `${addr} ${path}: ${r.text}`);
    return res[0];
  }
  const connections = async () => {
    const m = await getFrom('127.0.0.9', '/metrics');
    return Number(/^kvstash_http_connections (\d+)$/m.exec(m.body.toString())[1]);
  };
  const PARTIAL = 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/'; // no end of headers

  test('idle partial headers from one client cannot block a fresh request, and are dropped', async () => {
    await until(async () => (await connections()) === 1, 'no connection but the metrics one');
    // One client opens 10 connections holding partial headers: 4 are kept
    // (--max-connections-per-client), each new one taking the place of the
    // oldest still awaiting its headers (issue 42: a client's fresh request
    // is never locked out by its own, or its proxy's, stalled connections).
    const idle = [];
    for (let i = 0; i < 10; i++) idle.push(await rawOpen(srv, PARTIAL, { localAddress: '127.0.0.1' }));
    await sleep(300);
    const t0 = Date.now();
    assert.equal(idle.filter((c) => c.isClosed()).length, 6, 'connections beyond the per-client cap');
    assert.ok(idle.slice(6).every((c) => !c.isClosed()), 'the last four are held');
    assert.ok(idle.every((c) => c.data().length === 0), 'no reply to a refused connection');
    // Another client is served from the budget left (6 - 4).
    const fresh = await getFrom('127.0.0.2');
    assert.equal(fresh.status, 200);
    assert.equal(JSON.parse(fresh.body.toString()).status, 'ok');
    await until(async () => (await connections()) === 5, '4 idle connections and the metrics one');

    // Two more idle ones from a third client fill the total: the next
    // connection gets a 503 and is closed, instead of waiting in the backlog.
    const more = [await rawOpen(srv, PARTIAL, { localAddress: '127.0.0.3' }),
      await rawOpen(srv, PARTIAL, { localAddress: '127.0.0.3' })];
    await sleep(200);
    const busy = await rawHTTP(srv, rawRequest('GET', '/health', { body: null }), { localAddress: '127.0.0.4' });
    assert.ok(busy.closed, busy.text);
    const res = parseHTTP(busy.data);
    assert.equal(res.length, 1, busy.text);
    assert.equal(res[0].status, 503);
    assert.equal(res[0].headers['retry-after'], '1');
    assert.equal(res[0].headers.connection, 'close');
    assert.equal(JSON.parse(res[0].body.toString()).error.code, 'too_many_connections');

    // The header timeout (not the 600 s idle one) drops every idle connection.
    const held = [...idle.slice(6), ...more];
    const ms = await Promise.all(held.map((c) => c.closed));
    const waited = Date.now() - t0;
    assert.ok(waited >= (TIMEOUT_S - 1) * 1000 && waited < (TIMEOUT_S + 3) * 1000, `dropped after ${waited} ms`);
    assert.ok(held.every((c) => c.data().length === 0), 'a timed-out connection gets no reply');
    assert.ok(ms.every((x) => x < (TIMEOUT_S + 4) * 1000), `closed after ${ms} ms`);
    // The first client is served again.
    assert.equal((await getJSON(srv, '/health')).status, 200);
  });

  test('a connection that sends nothing is dropped after the header timeout', async () => {
    const c = await rawOpen(srv, null, { localAddress: '127.0.0.5' });
    const ms = await c.closed;
    assert.ok(ms >= (TIMEOUT_S - 1) * 1000 && ms < (TIMEOUT_S + 3) * 1000, `closed after ${ms} ms`);
  });

  test('an idle keep-alive connection outlives the header timeout', async () => {
    const c = await rawOpen(srv, rawRequest('GET', '/health', { body: null }), { localAddress: '127.0.0.6' });
    await until(() => parseHTTP(c.data()).length === 1, 'the first reply');
    await sleep((TIMEOUT_S + 1) * 1000);
    assert.ok(!c.isClosed(), 'the keep-alive connection was dropped by the header timeout');
    c.sock.write(rawRequest('GET', '/health', { body: null }));
    await until(() => parseHTTP(c.data()).length === 2, 'the second reply');
    assert.deepEqual(parseHTTP(c.data()).map((x) => x.status), [200, 200]);
    c.sock.destroy();
  });
});
