// hardening.test.mjs — HTTP edge cases of issue 13 ("Hardening"), each a
// regression test of one finding, over raw sockets where an HTTP client
// would not send the request:
//   3. conflicting or ambiguous Content-Length / Transfer-Encoding: 400, closed.
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
