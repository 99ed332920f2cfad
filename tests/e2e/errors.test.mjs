// errors.test.mjs — every bad input gets its status and an OpenAI error
// object, and the server keeps serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { startServer, stopOk, postJSON, getJSON, chat, assertError, metrics } from './lib.mjs';

const MAX_BODY = 65536;
let srv;
before(async () => { srv = await startServer(['--max-body-bytes', String(MAX_BODY)]); });
after(async () => { if (srv) await stopOk(srv); });

const user = [{ role: 'user', content: 'hi' }];
const CHAT = '/v1/chat/completions';

// [name, path, raw body (string) or object, status, code, param]
const cases = [
  ['malformed JSON', CHAT, '{"messages": [', 400, 'invalid_json', null],
  ['empty body', CHAT, '', 400, 'invalid_json', null],
  ['invalid UTF-8', CHAT, Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d]), 400, 'invalid_json', null],
  ['body is an array', CHAT, '[]', 400, 'invalid_type', null],
  ['missing messages', CHAT, {}, 400, 'missing_required_parameter', 'messages'],
  ['messages not an array', CHAT, { messages: 'hi' }, 400, 'invalid_type', 'messages'],
  ['empty messages', CHAT, { messages: [] }, 400, 'empty_array', 'messages'],
  ['message not an object', CHAT, { messages: [42] }, 400, 'invalid_type', 'messages[0]'],
  ['unknown role', CHAT, { messages: [{ role: 'robot', content: 'x' }] }, 400, 'invalid_value', 'messages[0].role'],
  ['missing role', CHAT, { messages: [{ content: 'x' }] }, 400, 'missing_required_parameter', 'messages[0].role'],
  ['content of wrong type', CHAT, { messages: [{ role: 'user', content: 7 }] }, 400, 'invalid_type', 'messages[0].content'],
  ['image content part', CHAT, { messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] },
    400, 'invalid_value', 'messages[0].content[0]'], // no projector: the model takes no images
  ['unknown content part', CHAT, { messages: [{ role: 'user', content: [{ type: 'file', file: {} }] }] },
    400, 'invalid_value', 'messages[0].content[0].type'],
  ['temperature as string', CHAT, { messages: user, temperature: 'hot' }, 400, 'invalid_type', 'temperature'],
  ['temperature out of range', CHAT, { messages: user, temperature: 3 }, 400, 'decimal_above_max_value', 'temperature'],
  ['max_tokens 0', CHAT, { messages: user, max_tokens: 0 }, 400, 'integer_below_min_value', 'max_tokens'],
  ['max_tokens negative', CHAT, { messages: user, max_tokens: -1 }, 400, 'integer_below_min_value', 'max_tokens'],
  ['max_tokens non-integer', CHAT, { messages: user, max_tokens: 2.5 }, 400, 'invalid_type', 'max_tokens'],
  ['top_k as string', CHAT, { messages: user, top_k: '5' }, 400, 'invalid_type', 'top_k'],
  ['stop of wrong type', CHAT, { messages: user, stop: 5 }, 400, 'invalid_type', 'stop'],
  ['too many stops', CHAT, { messages: user, stop: [...Array(17).keys()].map(String) }, 400, 'array_above_max_length', 'stop'],
  ['stream as string', CHAT, { messages: user, stream: 'yes' }, 400, 'invalid_type', 'stream'],
  ['n = 17', CHAT, { messages: user, n: 17 }, 400, 'integer_above_max_value', 'n'],
  ['a completions field on chat', CHAT, { messages: user, prompt: 'x' }, 400, 'unsupported_parameter', 'prompt'],
  ['a chat field on completions', '/v1/completions', { prompt: 'x', messages: user }, 400, 'unsupported_parameter',
    'messages'],
  ['a tool message without tool_call_id', CHAT, { messages: [{ role: 'tool', content: 'x' }] }, 400,
    'missing_required_parameter', 'messages[0].tool_call_id'],
  ['tool_choice required without tools', CHAT, { messages: user, tool_choice: 'required' }, 400, 'invalid_value', 'tool_choice'],
  ['a named tool that is not given', CHAT, { messages: user, tools: [{ type: 'function', function: { name: 'a' } }],
    tool_choice: { type: 'function', function: { name: 'b' } } }, 400, 'invalid_value', 'tool_choice.function.name'],
  ['response_format of an unknown type', CHAT, { messages: user, response_format: { type: 'xml' } }, 400, 'invalid_value',
    'response_format.type'],
  ['a JSON schema the converter cannot handle', CHAT, { messages: user, response_format: { type: 'json_schema',
    json_schema: { name: 'x', schema: { $ref: '#/definitions/missing' } } } }, 400, 'invalid_schema', 'response_format'],
  ['a grammar that does not parse', CHAT, { messages: user, grammar: 'root ::= (' }, 400, 'invalid_grammar', 'grammar'],
  ['logit_bias out of range', CHAT, { messages: user, logit_bias: { 5: 300 } }, 400, 'invalid_value', 'logit_bias.5'],
  ['logit_bias token outside the vocabulary', CHAT, { messages: user, logit_bias: { 99999999: 1 } }, 400, 'invalid_value',
    'logit_bias.99999999'],
  ['top_logprobs without logprobs', CHAT, { messages: user, top_logprobs: 3 }, 400, 'invalid_value', 'top_logprobs'],
  ['top_logprobs over 20', CHAT, { messages: user, logprobs: true, top_logprobs: 21 }, 400, 'integer_above_max_value', 'top_logprobs'],
  ['id_slot beyond the slots', CHAT, { messages: user, id_slot: 99 }, 400, 'invalid_value', 'id_slot'],
  ['echo true', '/v1/completions', { prompt: 'x', echo: true }, 400, 'unsupported_value', 'echo'],
  ['cache_prompt as string', CHAT, { messages: user, cache_prompt: 'no' }, 400, 'invalid_type', 'cache_prompt'],
  ['prompt alone over the context', CHAT, { messages: [{ role: 'user', content: 'word '.repeat(2000) }] },
    400, 'context_length_exceeded', 'messages'],
  ['missing prompt', '/v1/completions', {}, 400, 'missing_required_parameter', 'prompt'],
  ['empty prompt', '/v1/completions', { prompt: '' }, 400, 'invalid_value', 'prompt'],
  ['prompt of wrong type', '/v1/completions', { prompt: { a: 1 } }, 400, 'invalid_type', 'prompt'],
  ['token id outside the vocabulary', '/v1/completions', { prompt: [1, 99999999] }, 400, 'invalid_value', 'prompt[1]'],
  ['a prompt over the context', '/v1/completions', { prompt: 'word '.repeat(2000) }, 400, 'context_length_exceeded', 'prompt'],
];

for (const [name, path, body, status, code, param] of cases) {
  test(`${name} -> ${status} ${code}`, async () => {
    const raw = typeof body === 'string' || Buffer.isBuffer(body);
    const r = await postJSON(srv, path, body, { raw });
    const e = assertError(r, status, code, param);
    assert.equal(e.type, 'invalid_request_error');
    assert.match(r.headers.get('content-type'), /^application\/json/);
  });
}

test('body over max_body_bytes -> 413', async () => {
  const big = { messages: [{ role: 'user', content: 'x'.repeat(MAX_BODY + 10) }] };
  const r = await postJSON(srv, CHAT, big);
  assertError(r, 413, 'request_too_large');
});

test('chunked body over max_body_bytes -> 413', async () => {
  const chunk = new TextEncoder().encode('x'.repeat(8192));
  let n = 0;
  const body = new ReadableStream({
    pull(c) {
      if (n++ === 0) c.enqueue(new TextEncoder().encode('{"messages":[{"role":"user","content":"'));
      else if (n < 12) c.enqueue(chunk);
      else { c.enqueue(new TextEncoder().encode('"}]}')); c.close(); }
    },
  });
  const res = await fetch(srv.base + CHAT, { method: 'POST', body, duplex: 'half', headers: { 'content-type': 'application/json' } });
  assert.equal(res.status, 413);
  assert.equal((await res.json()).error.code, 'request_too_large');
});

test('a huge declared Content-Length is refused before the body is read', async () => {
  const reply = await new Promise((resolve, reject) => {
    const s = net.connect(srv.port, '127.0.0.1', () => {
      s.write(`POST ${CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 999999999\r\n\r\n`);
    });
    let data = '';
    const timer = setTimeout(() => { s.destroy(); resolve(data); }, 10000);
    const done = () => { clearTimeout(timer); resolve(data); };
    s.on('data', (d) => { data += d; });
    s.on('end', done);
    s.on('close', done);
    s.on('error', (e) => { clearTimeout(timer); reject(e); });
  });
  assert.match(reply, /^HTTP\/1\.1 413 /);
});

test('unknown path -> 404 unknown_url', async () => {
  const r = await postJSON(srv, '/v1/nothing', { a: 1 });
  assertError(r, 404, 'unknown_url');
  const g = await getJSON(srv, '/nope');
  assertError(g, 404, 'unknown_url');
});

test('wrong method -> 405 with Allow', async () => {
  const r = await getJSON(srv, CHAT);
  assertError(r, 405, 'method_not_allowed');
  assert.equal(r.headers.get('allow'), 'POST');
  const h = await postJSON(srv, '/health', {});
  assertError(h, 405, 'method_not_allowed');
  assert.equal(h.headers.get('allow'), 'GET, HEAD');
  const d = await fetch(srv.base + '/v1/models', { method: 'DELETE' });
  assert.equal(d.status, 405);
  await d.text();
});

test('a missing or odd Content-Type is tolerated', async () => {
  for (const ct of ['text/plain', 'application/x-www-form-urlencoded', undefined]) {
    const headers = ct ? { 'content-type': ct } : {};
    const res = await fetch(srv.base + CHAT, {
      method: 'POST', headers, body: JSON.stringify({ messages: user, max_tokens: 2 }),
    });
    assert.equal(res.status, 200, `content-type ${ct}`);
    await res.json();
  }
});

test('after all that the server still serves, and counted the errors', async () => {
  const r = await chat(srv, user, { max_tokens: 4 });
  assert.equal(r.object, 'chat.completion');
  const h = await getJSON(srv, '/health');
  assert.equal(h.status, 200);
  const m = await metrics(srv);
  assert.ok(m.get('kvstash_http_errors_total{code="400"}') >= cases.filter((c) => c[3] === 400).length);
  assert.ok(m.get('kvstash_http_errors_total{code="404"}') >= 2);
  assert.ok(m.get('kvstash_http_errors_total{code="405"}') >= 3);
  assert.ok(m.get('kvstash_http_errors_total{code="413"}') >= 2);
});
