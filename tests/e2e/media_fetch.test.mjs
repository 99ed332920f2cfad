// media_fetch.test.mjs — images named by URL rather than carried: http://
// from the hosts --media-fetch-hosts allows (a real HTTP server on
// loopback, made here) and file:// below --media-path, through the official
// SDKs:
//  - a fetched image is the same item as the same bytes sent inline: the
//    same answer, and no second encode; equal to cache_prompt: false;
//  - Anthropic's url source and Responses' input_image take URLs too;
//  - every refusal is a 400 naming the part: a host not in the list, a
//    redirect to one, too many redirects, a body past --media-max-bytes
//    (with and without a Content-Length), an HTTP error, a timeout, bytes
//    that are not an image, a file:// path that is absolute, climbs with
//    '..' or leaves the directory through a link, and a missing file;
//  - the server keeps serving after each.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, writeFileSync, symlinkSync } from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { BIN, startServer, stopOk, postJSON, importClient, assertError, metrics, QWEN25_TEMPLATE } from './lib.mjs';
import { png, chatImage, respImage } from './media.mjs';

let dir, srv, web, port, OpenAI, Anthropic, oai, ant;
const CHAT = '/v1/chat/completions';
const MAX_BYTES = 60000;
const SHOT = png(64, 64, 21);
const BIG = png(200, 120, 7);
const P = 'messages[0].content[1].image_url.url';

before(async () => {
  OpenAI = (await importClient('openai')).default;
  Anthropic = (await importClient('@anthropic-ai/sdk')).default;
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-fetch-'));
  const model = path.join(dir, 'tiny.gguf');
  const mmproj = path.join(dir, 'tiny-mmproj.gguf');
  execFileSync(BIN, ['mkmodel', '--preset', 'tiny', '--seed', '1', '--chat-template',
    path.join(process.env.KS_TEMPLATES_DIR, QWEN25_TEMPLATE), '--mmproj', mmproj, model], { stdio: 'ignore' });
  // The media directory, a file beside it and a link out of it.
  const media = path.join(dir, 'media');
  mkdirSync(path.join(media, 'shots'), { recursive: true });
  writeFileSync(path.join(media, 'shots', 'a.png'), SHOT);
  writeFileSync(path.join(dir, 'outside.png'), SHOT);
  symlinkSync(path.join(dir, 'outside.png'), path.join(media, 'link.png'));
  assert.ok(BIG.length > MAX_BYTES);
  web = http.createServer((req, res) => {
    const u = req.url;
    if (u === '/a.png') return res.writeHead(200, { 'content-type': 'image/png' }).end(SHOT);
    // Servers label images loosely: the bytes decide.
    if (u === '/mislabelled') return res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(SHOT);
    if (u === '/big.png') return res.writeHead(200, { 'content-type': 'image/png' }).end(BIG);
    if (u === '/endless') { // chunked, no length, never ends on its own
      res.writeHead(200, { 'content-type': 'image/png' });
      const t = setInterval(() => { if (!res.write(Buffer.alloc(16384, 7))) {} }, 1);
      res.on('close', () => clearInterval(t));
      return undefined;
    }
    if (u === '/page') return res.writeHead(200, { 'content-type': 'text/html' }).end('<html>not an image</html>');
    if (u === '/redir') return res.writeHead(302, { location: '/a.png' }).end();
    if (u === '/away') return res.writeHead(302, { location: `http://localhost:${port}/a.png` }).end();
    if (u === '/loop') return res.writeHead(302, { location: '/loop' }).end();
    if (u === '/slow') return undefined; // never answers
    return res.writeHead(404).end('no');
  });
  await new Promise((ok) => web.listen(0, '127.0.0.1', ok));
  port = web.address().port;
  srv = await startServer(['-m', model, '--mmproj', mmproj, '--ctx', '2048', '--slots', '2',
    '--media-max-bytes', String(MAX_BYTES), '--media-path', media, '--media-fetch-hosts', 'example.invalid, 127.0.0.1',
    '--media-fetch-timeout-ms', '500']);
  oai = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });
  ant = new Anthropic({ baseURL: srv.base, apiKey: 'none', maxRetries: 0, timeout: 120000 });
});
after(async () => {
  if (srv) await stopOk(srv);
  if (web) { web.closeAllConnections(); web.close(); }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const url = (p) => `http://127.0.0.1:${port}${p}`;
const encodes = async () => (await metrics(srv)).get('kvstash_media_encodes_total');
const userWith = (...parts) => [{ role: 'user', content: [{ type: 'text', text: 'What does this screenshot show?' }, ...parts] }];
const byUrl = (u) => ({ type: 'image_url', image_url: { url: u } });
const bad = (u) => postJSON(srv, CHAT, { messages: userWith(byUrl(u)), max_tokens: 4 });

test('an image fetched over http is the same item as its bytes inline: same answer, one encode, exact', async () => {
  const body = (part) => ({ model: 'x', messages: userWith(part), max_tokens: 12, temperature: 0 });
  const e0 = await encodes();
  const r1 = await oai.chat.completions.create(body(byUrl(url('/a.png'))));
  const e1 = await encodes();
  assert.equal(e1, e0 + 1, 'the fetched image was encoded once');
  for (const part of [chatImage(SHOT), byUrl(url('/redir')), byUrl(url('/mislabelled')), byUrl('file://shots/a.png')]) {
    const r = await oai.chat.completions.create(body(part));
    assert.equal(r.choices[0].message.content, r1.choices[0].message.content);
    assert.ok(r.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1,
      `read ${r.usage.prompt_tokens_details.cached_tokens} of ${r1.usage.prompt_tokens} from the cache`);
  }
  assert.equal(await encodes(), e1, 'the same bytes by another way were not encoded again');
  const u = await postJSON(srv, CHAT, { ...body(byUrl(url('/a.png'))), cache_prompt: false });
  assert.equal(u.status, 200, u.text);
  assert.equal(u.json.choices[0].message.content, r1.choices[0].message.content);
});

test('anthropic url sources and responses input_image take URLs too', async () => {
  const m = await ant.messages.create({ model: 'x', max_tokens: 8, temperature: 0, messages: [{ role: 'user', content: [
    { type: 'text', text: 'What does this screenshot show?' },
    { type: 'image', source: { type: 'url', url: url('/a.png') } }] }] });
  assert.equal(m.type, 'message');
  assert.ok(m.usage.input_tokens > 0);
  const refused = await postJSON(srv, '/v1/messages', { model: 'x', max_tokens: 4, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'url', url: `http://localhost:${port}/a.png` } }] }] });
  assert.equal(refused.status, 400, refused.text);
  assert.equal(refused.json.type, 'error');
  assert.match(refused.json.error.message, /messages\.0\.content\.0\.source.*does not fetch images from 'localhost'/);
  const r = await oai.responses.create({ model: 'x', max_output_tokens: 8, temperature: 0, input: [{ role: 'user',
    content: [{ type: 'input_text', text: 'Describe.' }, { ...respImage(SHOT), image_url: url('/a.png') }] }] });
  assert.ok(r.status === 'completed' || r.incomplete_details?.reason === 'max_output_tokens', r.status);
  assert.ok(r.usage.input_tokens > 0);
});

test('refused and failed fetches: a 400 each, naming the part; the server keeps serving', async () => {
  let e = assertError(await bad(`http://localhost:${port}/a.png`), 400, 'invalid_image_url', P);
  assert.match(e.message, /does not fetch images from 'localhost'.*--media-fetch-hosts/);
  e = assertError(await bad(url('/away')), 400, 'invalid_image_url', P);
  assert.match(e.message, /'localhost'/, 'a redirect to a host not allowed');
  e = assertError(await bad(url('/loop')), 400, 'image_fetch_failed', P);
  assert.match(e.message, /redirects more than 3 times/);
  e = assertError(await bad(url('/big.png')), 400, 'media_too_large', P);
  assert.match(e.message, /--media-max-bytes/);
  assertError(await bad(url('/endless')), 400, 'media_too_large', P);
  e = assertError(await bad(url('/missing.png')), 400, 'image_fetch_failed', P);
  assert.match(e.message, /HTTP 404/);
  e = assertError(await bad(url('/slow')), 400, 'image_fetch_failed', P);
  assert.match(e.message, /[Tt]imeout/);
  assertError(await bad(url('/page')), 400, 'invalid_image_format', P);
  assertError(await bad(`ftp://127.0.0.1:${port}/a.png`), 400, 'invalid_image_url', P);
  e = assertError(await bad('file:///etc/passwd'), 400, 'invalid_image_url', P);
  assert.match(e.message, /relative/);
  e = assertError(await bad('file://shots/../../outside.png'), 400, 'invalid_image_url', P);
  assert.match(e.message, /'\.\.'/);
  e = assertError(await bad('file://link.png'), 400, 'invalid_image_url', P);
  assert.match(e.message, /outside the server's media directory/);
  e = assertError(await bad('file://shots/none.png'), 400, 'image_fetch_failed', P);
  assert.doesNotMatch(e.message, new RegExp(dir), 'the error names no server path');
  // greedy: a sampled reply may end on an end-of-turn token within 2 (it did, once in CI)
  const ok = await oai.chat.completions.create({ model: 'x', messages: userWith(byUrl(url('/a.png'))), max_tokens: 2,
    temperature: 0 });
  assert.equal(ok.choices[0].finish_reason, 'length');
});

test('a server without --media-fetch-hosts or --media-path fetches nothing', async () => {
  const plain = await startServer(['-m', path.join(dir, 'tiny.gguf'), '--mmproj', path.join(dir, 'tiny-mmproj.gguf'),
    '--ctx', '1024']);
  try {
    for (const u of [url('/a.png'), 'file://shots/a.png']) {
      const r = await postJSON(plain, CHAT, { messages: userWith(byUrl(u)), max_tokens: 4 });
      const e = assertError(r, 400, 'invalid_image_url', P);
      assert.match(e.message, /not allowed on this server|does not fetch remote images/);
    }
  } finally {
    await stopOk(plain);
  }
  // A media path that is not a directory is refused at start.
  // --threads 1 as startServer gives it: ggml's own thread pool is not instrumented for TSan.
  const s = execFileSync('sh', ['-c', `"${BIN}" serve -m "${path.join(dir, 'tiny.gguf')}" --threads 1 --media-path ` +
    `"${path.join(dir, 'outside.png')}" 2>&1; echo "exit $?"`], { encoding: 'utf8' });
  assert.match(s, /media path .* is not a directory[\s\S]*exit 2/);
});
