// utility.test.mjs — llama-server's utility endpoints on `kvstash serve`:
// POST /tokenize, POST /detokenize, GET /props (docs/SERVER.md).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, postJSON, getJSON, assertError, runBin, MODEL } from './lib.mjs';

let srv;
before(async () => { srv = await startServer(['--ctx', '256', '--max-body-bytes', '4096']); });
after(async () => { if (srv) await stopOk(srv); });

const SENTENCE = 'The quick ocean was warm, and a strong mind said hello to the world.';

async function tokenize(body) {
  const r = await postJSON(srv, '/tokenize', body);
  assert.equal(r.status, 200, `tokenize: ${r.status} ${r.text}`);
  return r.json.tokens;
}

async function detokenize(tokens) {
  const r = await postJSON(srv, '/detokenize', { tokens });
  assert.equal(r.status, 200, `detokenize: ${r.status} ${r.text}`);
  return r.json.content;
}

// A piece is a string, or the byte values of a piece that is not UTF-8.
const pieceBytes = (p) => (typeof p === 'string' ? Buffer.from(p, 'utf8') : Buffer.from(p));

test('tokenize then detokenize gives the sentence back', async () => {
  const ids = await tokenize({ content: SENTENCE });
  assert.ok(ids.length > 3);
  for (const id of ids) assert.ok(Number.isInteger(id) && id >= 0, `id ${id}`);
  assert.equal(await detokenize(ids), SENTENCE);
  assert.equal(await detokenize([]), '');
  assert.deepEqual(await tokenize({ content: '' }), []);
});

test('with_pieces: {id, piece} whose bytes concatenate to the text', async () => {
  const ids = await tokenize({ content: SENTENCE });
  for (const text of [SENTENCE, 'héllo wörld — 日本語 ✓']) {
    const toks = await tokenize({ content: text, with_pieces: true });
    assert.ok(toks.length > 0);
    for (const t of toks) {
      assert.ok(Number.isInteger(t.id));
      assert.ok(typeof t.piece === 'string' || Array.isArray(t.piece), JSON.stringify(t));
      if (Array.isArray(t.piece)) for (const b of t.piece) assert.ok(Number.isInteger(b) && b >= 0 && b < 256);
    }
    assert.deepEqual(Buffer.concat(toks.map((t) => pieceBytes(t.piece))), Buffer.from(text, 'utf8'));
    if (text === SENTENCE) assert.deepEqual(toks.map((t) => t.id), ids);
  }
});

test('add_special adds the BOS the model has', async () => {
  const props = (await getJSON(srv, '/props')).json;
  assert.ok(props.bos_token.length > 0, 'the tiny model has a BOS token');
  const plain = await tokenize({ content: SENTENCE });
  const withBos = await tokenize({ content: SENTENCE, add_special: true, with_pieces: true });
  assert.equal(withBos.length, plain.length + 1);
  assert.equal(withBos[0].piece, props.bos_token);
  assert.deepEqual(withBos.slice(1).map((t) => t.id), plain);
  // Detokenize renders control tokens as their text, as llama-server does.
  assert.equal(await detokenize(withBos.map((t) => t.id)), props.bos_token + SENTENCE);
  // The default is add_special false.
  assert.deepEqual(await tokenize({ content: SENTENCE, add_special: false }), plain);
});

test('parse_special decides whether <|im_start|> is one control token', async () => {
  const text = '<|im_start|>user\nhello<|im_end|>';
  const parsed = await tokenize({ content: text, with_pieces: true });
  assert.equal(parsed[0].piece, '<|im_start|>');
  assert.equal(parsed.at(-1).piece, '<|im_end|>');
  // parse_special defaults to true.
  assert.deepEqual(await tokenize({ content: text }), parsed.map((t) => t.id));
  const literal = await tokenize({ content: text, parse_special: false, with_pieces: true });
  assert.ok(literal.length > parsed.length + 2, `${literal.length} vs ${parsed.length}`);
  assert.ok(!literal.some((t) => t.id === parsed[0].id), 'no <|im_start|> control token');
  assert.deepEqual(Buffer.concat(literal.map((t) => pieceBytes(t.piece))), Buffer.from(text));
  assert.equal(await detokenize(literal.map((t) => t.id)), text);
});

test('content may mix strings and token ids (llama-server tokenize_mixed)', async () => {
  const hello = await tokenize({ content: 'hello' });
  const world = await tokenize({ content: ' world' });
  const mixed = await tokenize({ content: [7, 'hello', ...world], add_special: true });
  // BOS is added only before a first element that is a string.
  assert.deepEqual(mixed, [7, ...hello, ...world]);
});

test('GET /props', async () => {
  const r = await getJSON(srv, '/props');
  assert.equal(r.status, 200);
  const p = r.json;
  assert.equal(p.default_generation_settings.n_ctx, 256);
  assert.match(srv.stderr, /ctx 256, CPU, exact: /);
  const sp = p.default_generation_settings.params;
  assert.equal(sp.temperature, 0.8);
  assert.equal(sp.top_k, 40);
  assert.equal(sp.top_p, 0.95);
  assert.equal(sp.min_p, 0.05);
  assert.equal(sp.n_predict, -1); // until EOS or the context's end, as llama-server (issue 40)
  assert.equal(sp.max_tokens, -1);
  assert.equal(p.total_slots, 2);
  assert.ok(p.model_path.endsWith('.gguf'), p.model_path);
  assert.match(p.chat_template, /<\|im_start\|>/);
  assert.equal(typeof p.bos_token, 'string');
  assert.equal(p.eos_token, '<|im_end|>');
  assert.match(p.build_info, /^kvstash-\d+\.\d+\.\d+ llama\.cpp-\S+$/);
  assert.deepEqual(p.modalities, { vision: false, video: false, audio: false });
  assert.equal(p.kvstash.cache_prompt, true);
  assert.equal(p.kvstash.exact, true);
  assert.equal(p.kvstash.exact_mode, 'batch-invariant');
  assert.equal(p.kvstash.exact_reason, undefined);
  // On the CPU alone (the tests load no GPU module): no device, every layer on the CPU.
  assert.deepEqual(p.kvstash.offload, { devices: [], gpu_layers: 0, layers: 3, kv: 'CPU', kv_offload: true,
    op_offload: false, split_mode: 'layer', main_gpu: 0 });
  assert.deepEqual(p.kvstash.gpu_backends, []);
  assert.equal(p.kvstash.probe, 'batch-invariant');
  assert.equal(p.kvstash.repacked, true);
  assert.equal(p.kvstash.n_expert, undefined); // a dense model
  assert.equal(p.kvstash.flash_attn, true); // --flash-attn auto, on the patched backend
  assert.match(p.kvstash.cpu_backend, /^kvstash-ggml-cpu-r\d+-/);
  assert.equal(p.kvstash.store, 'ram-only');
  assert.equal(p.build_info.split(' ')[0], `kvstash-${p.kvstash.version}`);
  const h = await fetch(srv.base + '/props', { method: 'HEAD' });
  assert.equal(h.status, 200);
});

test('GET /props: --no-repack keeps the weights as stored (kvstash.repacked)', async () => {
  const nr = await startServer(['--ctx', '256', '--no-repack']);
  try {
    const p = await getJSON(nr, '/props');
    assert.equal(p.status, 200);
    assert.equal(p.json.kvstash.repacked, false);
    assert.equal(p.json.kvstash.exact_mode, 'batch-invariant');
  } finally {
    await stopOk(nr);
  }
});

test('GET /props: kvstash.flash_attn is the setting in effect', async () => {
  const off = await startServer(['--ctx', '256', '--flash-attn', 'off']);
  try {
    const p = await getJSON(off, '/props');
    assert.equal(p.status, 200);
    assert.equal(p.json.kvstash.flash_attn, false);
  } finally {
    await stopOk(off);
  }
});

test('every bad input gets its 4xx, and the server still answers', async () => {
  const raw = (path, body) => postJSON(srv, path, body, { raw: true });
  assertError(await raw('/tokenize', '{"content":'), 400, 'invalid_json');
  assertError(await raw('/tokenize', '["hello"]'), 400, 'invalid_type');
  assertError(await postJSON(srv, '/tokenize', {}), 400, 'missing_required_parameter', 'content');
  assertError(await postJSON(srv, '/tokenize', { content: 5 }), 400, 'invalid_type', 'content');
  assertError(await postJSON(srv, '/tokenize', { content: ['a', true] }), 400, 'invalid_type', 'content[1]');
  assertError(await postJSON(srv, '/tokenize', { content: [1e9] }), 400, 'invalid_value', 'content[0]');
  assertError(await postJSON(srv, '/tokenize', { content: 'a', add_special: 'yes' }), 400, 'invalid_type', 'add_special');
  assertError(await postJSON(srv, '/tokenize', { content: 'a', parse_special: 0 }), 400, 'invalid_type', 'parse_special');
  assertError(await postJSON(srv, '/tokenize', { content: 'a', with_pieces: {} }), 400, 'invalid_type', 'with_pieces');
  assertError(await raw('/detokenize', 'tokens'), 400, 'invalid_json');
  assertError(await postJSON(srv, '/detokenize', {}), 400, 'missing_required_parameter', 'tokens');
  assertError(await postJSON(srv, '/detokenize', { tokens: '1 2' }), 400, 'invalid_type', 'tokens');
  assertError(await postJSON(srv, '/detokenize', { tokens: [1, 'x'] }), 400, 'invalid_type', 'tokens[1]');
  assertError(await postJSON(srv, '/detokenize', { tokens: [1, 2, 1000000] }), 400, 'invalid_value', 'tokens[2]');
  assertError(await postJSON(srv, '/detokenize', { tokens: [-1] }), 400, 'invalid_value', 'tokens[0]');
  assertError(await postJSON(srv, '/tokenize', { content: 'x'.repeat(5000) }), 413, 'request_too_large');
  assertError(await postJSON(srv, '/detokenize', { tokens: new Array(3000).fill(1) }), 413, 'request_too_large');
  const get = await getJSON(srv, '/tokenize');
  assertError(get, 405, 'method_not_allowed');
  assert.equal(get.headers.get('allow'), 'POST');
  // llama-server has no /v1 aliases for these.
  assertError(await postJSON(srv, '/v1/tokenize', { content: 'a' }), 404, 'unknown_url');
  // Changing props: what llama-server answers without --props.
  const pp = await postJSON(srv, '/props', {});
  assert.equal(pp.status, 501);
  assert.equal(pp.json.error.type, 'not_supported_error');
  const del = await fetch(srv.base + '/props', { method: 'DELETE' });
  assert.equal(del.status, 405);
  assert.equal(del.headers.get('allow'), 'GET, HEAD, POST');
  await del.text();
  assert.equal((await getJSON(srv, '/health')).status, 200);
  assert.equal((await postJSON(srv, '/detokenize', { tokens: [] })).status, 200);
});

test('the API key guards them, /health stays open', async () => {
  const keyed = await startServer(['--api-key', 'sesame']);
  try {
    assertError(await postJSON(keyed, '/tokenize', { content: 'a' }), 401, 'invalid_api_key');
    assertError(await postJSON(keyed, '/detokenize', { tokens: [1] }), 401, 'invalid_api_key');
    assertError(await getJSON(keyed, '/props'), 401, 'invalid_api_key');
    assertError(await postJSON(keyed, '/props', {}), 401, 'invalid_api_key');
    const auth = { headers: { Authorization: 'Bearer sesame' } };
    assert.equal((await postJSON(keyed, '/tokenize', { content: 'a' }, auth)).status, 200);
    assert.equal((await postJSON(keyed, '/detokenize', { tokens: [1] }, auth)).status, 200);
    const p = await getJSON(keyed, '/props', auth);
    assert.equal(p.status, 200);
    assert.equal(p.json.default_generation_settings.n_ctx, 512);
    assert.equal((await getJSON(keyed, '/health')).status, 200);
  } finally {
    await stopOk(keyed);
  }
});

// llama-server's short names: -t, -np/--parallel, -b/--batch-size mean what
// --threads, --slots and --batch do.
test('llama-server\'s -t, -np, -b and --parallel, --batch-size', async () => {
  for (const args of [['-t', '1', '-np', '3', '-b', '64'], ['--threads', '1', '--parallel', '3', '--batch-size', '64']]) {
    const s = await startServer(['--ctx', '256', ...args]);
    try {
      const p = (await getJSON(s, '/props')).json;
      assert.equal(p.total_slots, 3, args.join(' '));
      assert.match(s.stderr, /3 slots/);
    } finally {
      await stopOk(s);
    }
  }
});

// llama-server's -c (--ctx-size) is the slots' context together: each slot
// gets N / slots; an explicit --ctx (each slot's) wins.
test('llama-server\'s -c divides among the slots; --ctx wins', async () => {
  for (const [args, nCtx] of [[['-c', '1024', '-np', '4'], 256], [['--ctx-size', '1024', '--slots', '2'], 512],
    [['-c', '1024', '-np', '4', '--ctx', '768'], 768]]) {
    const s = await startServer(args, { defaults: false });
    try {
      const p = (await getJSON(s, '/props')).json;
      assert.equal(p.default_generation_settings.n_ctx, nCtx, args.join(' '));
    } finally {
      await stopOk(s);
    }
  }
  // A value out of range: exit 2 naming the flag.
  const r = await runBin(['serve', '-m', MODEL, '--port', '0', '--threads', '1', '-c', '10']);
  assert.equal(r.code, 2, r.stderr);
  assert.match(r.stderr, /--ctx-size \(-c\)/);
});
