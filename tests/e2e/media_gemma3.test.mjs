// media_gemma3.test.mjs — images whose projector needs non-causal attention
// (Gemma 3: kvstash mkmodel --preset tiny-swa --mmproj writes the gemma3
// projector, 100 tokens an image), served over HTTP (engine/media.h note 2a):
//  - turn 2 with the same image reads turn 1 from the cache, the projector
//    does not run again, and both answers equal cache_prompt: false;
//  - two images of the same size share no cached prefix past the text
//    before the image;
//  - a server whose --batch cannot hold an image in one decode refuses it
//    with a 400 that says so, and keeps serving.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BIN, startServer, stopOk, postJSON, metrics, QWEN25_TEMPLATE } from './lib.mjs';
import { png, chatImage } from './media.mjs';

let dir, model, mmproj, srv;
const CHAT = '/v1/chat/completions';

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-media-g3-'));
  model = path.join(dir, 'tiny-swa.gguf');
  mmproj = path.join(dir, 'tiny-swa-mmproj.gguf');
  execFileSync(BIN, ['mkmodel', '--preset', 'tiny-swa', '--seed', '1', '--chat-template',
    path.join(process.env.KS_TEMPLATES_DIR, QWEN25_TEMPLATE), '--mmproj', mmproj, model], { stdio: 'ignore' });
  srv = await startServer(['-m', model, '--mmproj', mmproj, '--ctx', '2048', '--slots', '2']);
});
after(async () => {
  if (srv) await stopOk(srv);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const encodes = async () => (await metrics(srv)).get('kvstash_media_encodes_total');
const userWith = (...parts) => [{ role: 'user', content: [{ type: 'text', text: 'What does this picture show?' }, ...parts] }];

// The tokens before the image's run: the prompt's text up to the marker and
// the text mtmd puts before a Gemma 3 image (<start_of_image>).
async function tokensBeforeImage(body) {
  const t = await postJSON(srv, '/apply-template', body);
  assert.equal(t.status, 200, t.text);
  const at = t.json.prompt.indexOf('<__media__>');
  assert.ok(at > 0, t.json.prompt);
  const k = await postJSON(srv, '/tokenize', { content: t.json.prompt.slice(0, at) + '<start_of_image>',
    add_special: true });
  return k.json.tokens.length;
}

test('chat: turn 2 with the same image reads turn 1 from the cache, no new encode, exact', async () => {
  const t1 = { messages: userWith(chatImage(png(80, 80, 11))), max_tokens: 12, temperature: 0 };
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
  for (const [body, r] of [[t1, r1], [t2, r2]]) {
    const u = await postJSON(srv, CHAT, { ...body, cache_prompt: false });
    assert.equal(u.status, 200, u.text);
    assert.equal(u.json.choices[0].message.content, r.json.choices[0].message.content);
  }
});

test('chat: two images of the same size never share a cached prefix', async () => {
  const a = { messages: userWith(chatImage(png(80, 80, 21))), max_tokens: 8, temperature: 0 };
  const b = { messages: userWith(chatImage(png(80, 80, 22))), max_tokens: 8, temperature: 0 };
  const before = await tokensBeforeImage(a);
  const ra = await postJSON(srv, CHAT, { ...a, id_slot: 0 });
  assert.equal(ra.status, 200, ra.text);
  const rb = await postJSON(srv, CHAT, { ...b, id_slot: 0 });
  assert.equal(rb.status, 200, rb.text);
  assert.ok(rb.json.usage.prompt_tokens_details.cached_tokens <= before,
    `b reused ${rb.json.usage.prompt_tokens_details.cached_tokens} tokens; the text before its image is ${before}`);
  const ub = await postJSON(srv, CHAT, { ...b, cache_prompt: false });
  assert.equal(ub.json.choices[0].message.content, rb.json.choices[0].message.content);
});

test('a batch smaller than an image: a 400 naming --batch, and the server goes on', async () => {
  const small = await startServer(['-m', model, '--mmproj', mmproj, '--ctx', '1024', '--batch', '64']);
  try {
    const r = await postJSON(small, CHAT, { messages: userWith(chatImage(png(80, 80, 31))), max_tokens: 4 });
    assert.equal(r.status, 400, r.text);
    assert.match(r.text, /non-causal attention.*at least 100.*--batch/);
    const t = await postJSON(small, CHAT, { messages: [{ role: 'user', content: 'Hello' }], max_tokens: 4 });
    assert.equal(t.status, 200, t.text);
  } finally {
    await stopOk(small);
  }
});
