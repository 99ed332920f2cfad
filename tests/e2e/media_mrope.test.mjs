// media_mrope.test.mjs — images whose projector uses M-RoPE (Qwen2-VL:
// kvstash mkmodel --preset tiny-mrope --mmproj writes a qwen2vl text model
// and Qwen2-VL's projector; a 112x112 image is 16 tokens over 4 KV
// positions: engine/media.h note 2), served over HTTP:
//  - turn 2 with the same image reads turn 1 from the cache, the projector
//    does not run again, and both answers equal cache_prompt: false;
//  - the next turn on the other slot is copied from the first (mode "copy"),
//    with the uncached answer;
//  - two images of the same size share no cached prefix past the text
//    before the image;
//  - a restarted server on the same store dir restores the image's
//    conversation (mode "store"), encodes nothing, answers as uncached.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BIN, startServer, stopOk, postJSON, metrics, QWEN25_TEMPLATE, writeStoreConfig, settleStore } from './lib.mjs';
import { png, chatImage } from './media.mjs';

let dir, model, mmproj, config, srv;
const CHAT = '/v1/chat/completions';
const SIDE = 112;

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-media-mrope-'));
  model = path.join(dir, 'tiny-mrope.gguf');
  mmproj = path.join(dir, 'tiny-mrope-mmproj.gguf');
  execFileSync(BIN, ['mkmodel', '--preset', 'tiny-mrope', '--seed', '1', '--chat-template',
    path.join(process.env.KS_TEMPLATES_DIR, QWEN25_TEMPLATE), '--mmproj', mmproj, model], { stdio: 'ignore' });
  const storeDir = path.join(dir, 'store');
  config = await writeStoreConfig(path.join(dir, 'store.yaml'), { cacheDir: path.join(storeDir, 'disk'),
    shmDir: path.join(storeDir, 'shm') });
  srv = await startServer(['-m', model, '--mmproj', mmproj, '--ctx', '2048', '--slots', '2', '--config', config]);
});
after(async () => {
  if (srv) await stopOk(srv);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const encodes = async (s = srv) => (await metrics(s)).get('kvstash_media_encodes_total');
const userWith = (...parts) => [{ role: 'user', content: [{ type: 'text', text: 'What does this picture show?' }, ...parts] }];

async function uncachedSame(s, body, r) {
  const u = await postJSON(s, CHAT, { ...body, cache_prompt: false });
  assert.equal(u.status, 200, u.text);
  assert.equal(u.json.choices[0].message.content, r.json.choices[0].message.content);
}

// The tokens before the image's run: the prompt's text up to the marker and
// the text mtmd puts before a Qwen2-VL image (<|vision_start|>).
async function tokensBeforeImage(body) {
  const t = await postJSON(srv, '/apply-template', body);
  assert.equal(t.status, 200, t.text);
  const at = t.json.prompt.indexOf('<__media__>');
  assert.ok(at > 0, t.json.prompt);
  const k = await postJSON(srv, '/tokenize', { content: t.json.prompt.slice(0, at) + '<|vision_start|>',
    add_special: true });
  return k.json.tokens.length;
}

test('chat: turn 2 with the same image reads turn 1 from the cache, no new encode, exact; a copy too', async () => {
  const t1 = { messages: userWith(chatImage(png(SIDE, SIDE, 11))), max_tokens: 12, temperature: 0, id_slot: 0 };
  const e0 = await encodes();
  const r1 = await postJSON(srv, CHAT, t1);
  assert.equal(r1.status, 200, r1.text);
  const e1 = await encodes();
  assert.equal(e1, e0 + 1, 'the first turn encodes the image once');
  const t2 = { ...t1, messages: [...t1.messages, { role: 'assistant', content: r1.json.choices[0].message.content },
    { role: 'user', content: 'And the colors?' }] };
  const r2 = await postJSON(srv, CHAT, t2);
  assert.equal(r2.status, 200, r2.text);
  assert.ok(r2.json.usage.prompt_tokens_details.cached_tokens >= r1.json.usage.prompt_tokens,
    `turn 2 read ${r2.json.usage.prompt_tokens_details.cached_tokens}, turn 1 had ${r1.json.usage.prompt_tokens}`);
  assert.equal(await encodes(), e1, 'the image was not encoded again');
  for (const [body, r] of [[t1, r1], [t2, r2]]) await uncachedSame(srv, body, r);
  // Another branch of turn 2 on slot 1: copied from slot 0's KV (the
  // uncached runs above encoded the image for themselves).
  const e2 = await encodes();
  const t3 = { ...t2, id_slot: 1, messages: [...t1.messages, { role: 'assistant', content: 'No idea.' },
    { role: 'user', content: 'Look again?' }] };
  const r3 = await postJSON(srv, CHAT, t3);
  assert.equal(r3.status, 200, r3.text);
  assert.equal(r3.json.cache.mode, 'copy', JSON.stringify(r3.json.cache));
  assert.equal(await encodes(), e2, 'the copy encoded nothing');
  await uncachedSame(srv, t3, r3);
});

test('chat: two images of the same size never share a cached prefix', async () => {
  const a = { messages: userWith(chatImage(png(SIDE, SIDE, 21))), max_tokens: 8, temperature: 0 };
  const b = { messages: userWith(chatImage(png(SIDE, SIDE, 22))), max_tokens: 8, temperature: 0 };
  const before = await tokensBeforeImage(a);
  const ra = await postJSON(srv, CHAT, { ...a, id_slot: 0 });
  assert.equal(ra.status, 200, ra.text);
  const rb = await postJSON(srv, CHAT, { ...b, id_slot: 0 });
  assert.equal(rb.status, 200, rb.text);
  assert.ok(rb.json.usage.prompt_tokens_details.cached_tokens <= before,
    `b reused ${rb.json.usage.prompt_tokens_details.cached_tokens} tokens; the text before its image is ${before}`);
  await uncachedSame(srv, b, rb);
});

test('a restarted server on the same store restores the image conversation, no encode, exact', async () => {
  const msgs = [{ role: 'system', content: 'You describe pictures. '.repeat(4) }, ...userWith(chatImage(png(SIDE, SIDE, 41)))];
  const r1 = await postJSON(srv, CHAT, { messages: msgs, max_tokens: 8, temperature: 0 });
  assert.equal(r1.status, 200, r1.text);
  msgs.push({ role: 'assistant', content: r1.json.choices[0].message.content });
  await settleStore(srv);
  await stopOk(srv);
  srv = await startServer(['-m', model, '--mmproj', mmproj, '--ctx', '2048', '--slots', '2', '--config', config]);
  msgs.push({ role: 'user', content: 'Anything else in it?' });
  const body = { messages: msgs, max_tokens: 8, temperature: 0 };
  const r2 = await postJSON(srv, CHAT, body);
  assert.equal(r2.status, 200, r2.text);
  assert.equal(r2.json.cache.mode, 'store', JSON.stringify(r2.json.cache));
  assert.ok(r2.json.usage.prompt_tokens_details.cached_tokens >= r1.json.usage.prompt_tokens,
    JSON.stringify([r2.json.cache, r1.json.usage]));
  assert.equal(await encodes(), 0, 'the restored image was not encoded');
  await uncachedSame(srv, body, r2);
});
