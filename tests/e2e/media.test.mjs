// media.test.mjs — images in the APIs with a projector (kvstash mkmodel
// --mmproj: the tiny model and a random-weight vision projector), through
// the official OpenAI and Anthropic SDKs:
//  - every limit and bad input is a 400 with its code and the part's path,
//    and the server keeps serving;
//  - a screenshot conversation through each API: turn 2 with the same image
//    reads at least the previous prompt from the cache, the projector does
//    not run again (/metrics kvstash_media_encodes_total), and every answer
//    equals the one with cache_prompt: false;
//  - two conversations with different images of the same size share no
//    cached prefix past the text before the image, and with --imc their
//    message hashes differ;
//  - an image at turn 4 extends a text conversation, and a restarted server
//    restores the image's conversation from the store without encoding it;
//  - audio (mkmodel --mmproj-audio) through chat and Responses, cached the
//    same way, with its own checks.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BIN, startServer, stopOk, postJSON, importClient, assertError, metrics, QWEN25_TEMPLATE, writeStoreConfig,
  settleStore } from './lib.mjs';
import { png, pngHeaderOnly, wav, dataUrl, chatImage, chatAudio, respImage, msgImage } from './media.mjs';

let dir, model, mmproj, srv, OpenAI, Anthropic, oai, ant;
const CHAT = '/v1/chat/completions';
const MAX_BYTES = 60000;
const MAX_PIXELS = 256 * 256;

before(async () => {
  OpenAI = (await importClient('openai')).default;
  Anthropic = (await importClient('@anthropic-ai/sdk')).default;
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-media-'));
  model = path.join(dir, 'tiny.gguf');
  mmproj = path.join(dir, 'tiny-mmproj.gguf');
  execFileSync(BIN, ['mkmodel', '--preset', 'tiny', '--seed', '1', '--chat-template',
    path.join(process.env.KS_TEMPLATES_DIR, QWEN25_TEMPLATE), '--mmproj', mmproj, model], { stdio: 'ignore' });
  srv = await startServer(['-m', model, '--mmproj', mmproj, '--ctx', '2048', '--slots', '2',
    '--media-max-bytes', String(MAX_BYTES), '--media-max-items', '3', '--media-max-total-bytes', String(2 * MAX_BYTES),
    '--media-max-pixels', String(MAX_PIXELS)]);
  oai = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });
  ant = new Anthropic({ baseURL: srv.base, apiKey: 'none', maxRetries: 0, timeout: 120000 });
});
after(async () => {
  if (srv) await stopOk(srv);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const encodes = async () => (await metrics(srv)).get('kvstash_media_encodes_total');
const userWith = (...parts) => [{ role: 'user', content: [{ type: 'text', text: 'What does this screenshot show?' }, ...parts] }];
const bad = (parts) => postJSON(srv, CHAT, { messages: userWith(...parts), max_tokens: 4 });

test('/props and /v1/models report vision input', async () => {
  const p = await (await fetch(srv.base + '/props')).json();
  assert.deepEqual(p.modalities, { vision: true, video: false, audio: false });
  const m = await (await fetch(srv.base + '/v1/models')).json();
  assert.deepEqual(m.data[0].capabilities, ['completion', 'multimodal']);
  assert.deepEqual(m.data[0].modalities, { vision: true, audio: false });
});

test('limits and bad images: a 400 each, naming the part', async () => {
  const P = 'messages[0].content[1].image_url.url';
  const img = png(64, 64, 1);
  // One item larger than --media-max-bytes (a noisy PNG does not compress).
  const big = png(200, 120, 7);
  assert.ok(big.length > MAX_BYTES, `test image of ${big.length} bytes`);
  assertError(await bad([chatImage(big)]), 400, 'media_too_large', P);
  // More items than --media-max-items.
  assertError(await bad([img, img, img, img].map((b) => chatImage(b))), 400, 'too_many_media_items',
    'messages[0].content[4].image_url.url');
  // All items beyond --media-max-total-bytes.
  const mid = png(150, 90, 3);
  assert.ok(mid.length <= MAX_BYTES && 3 * mid.length > 2 * MAX_BYTES, `test image of ${mid.length} bytes`);
  assertError(await bad([chatImage(mid), chatImage(mid), chatImage(mid)]), 400, 'media_too_large',
    'messages[0].content[3].image_url.url');
  // Wider and taller than --media-max-pixels, read from the header alone.
  assertError(await bad([chatImage(pngHeaderOnly(300, 300))]), 400, 'image_too_large', P);
  assertError(await bad([{ type: 'image_url', image_url: { url: 'data:image/png;base64,iVBORw0KGgo*' } }]), 400,
    'invalid_base64', P);
  assertError(await bad([chatImage(img, 'image/jpeg')]), 400, 'media_type_mismatch', P);
  assertError(await bad([chatImage(img, 'image/tiff')]), 400, 'invalid_image_format', P);
  const webp = Buffer.from('RIFF\x1a\x00\x00\x00WEBPVP8 \x0e\x00\x00\x00\x00\x00\x00\x9d\x01\x2a\x40\x00\x40\x00', 'latin1');
  const w = assertError(await bad([chatImage(webp, 'image/webp')]), 400, 'invalid_image_format', P);
  assert.match(w.message, /WebP/);
  assertError(await bad([chatImage(Buffer.from('not an image at all, just text'), 'application/octet-stream')]), 400,
    'invalid_image_format', P);
  const remote = assertError(await bad([{ type: 'image_url', image_url: { url: 'https://example.com/a.png' } }]), 400,
    'invalid_image_url', P);
  assert.match(remote.message, /does not fetch remote images/);
  // A corrupt file whose header passes: the decoder refuses it before the encoder sees it.
  const corrupt = assertError(await bad([chatImage(pngHeaderOnly(32, 32))]), 400, 'invalid_image_format', P);
  assert.match(corrupt.message, /could not be decoded/);
  // Audio to a vision-only projector.
  assertError(await bad([chatAudio(wav(1600))]), 400, 'invalid_value', 'messages[0].content[1]');
  // The marker typed in the text would stand for an item that is not there.
  const mk = await postJSON(srv, CHAT, { max_tokens: 4, messages: [{ role: 'user', content: [
    { type: 'text', text: 'a <__media__> b' }, chatImage(img)] }] });
  assertError(mk, 400, 'invalid_value');
  assert.match(mk.json.error.message, /<__media__>/);
  // The SDK surfaces the same errors; the server still answers.
  await assert.rejects(oai.chat.completions.create({ model: 'x', max_tokens: 4, messages: userWith(chatImage(big)) }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'media_too_large' && e.param === P);
  const ok = await oai.chat.completions.create({ model: 'x', max_tokens: 4, temperature: 0, messages: userWith(chatImage(img)) });
  assert.equal(ok.choices.length, 1);
});

// The number of prompt tokens before the first image of a chat request:
// its prompt as rendered, tokenized up to the media marker.
async function tokensBeforeImage(body) {
  const t = await postJSON(srv, '/apply-template', body);
  assert.equal(t.status, 200, t.text);
  const at = t.json.prompt.indexOf('<__media__>');
  assert.ok(at > 0, t.json.prompt);
  const k = await postJSON(srv, '/tokenize', { content: t.json.prompt.slice(0, at), add_special: true });
  return k.json.tokens.length;
}

test('chat: turn 2 with the same screenshot reads turn 1 from the cache, no new encode, exact', async () => {
  const shot = png(64, 64, 11);
  const t1 = { messages: userWith(chatImage(shot)), max_tokens: 12, temperature: 0 };
  const e0 = await encodes();
  const r1 = await oai.chat.completions.create({ model: 'x', ...t1 });
  const e1 = await encodes();
  assert.ok(e1 > e0, 'the first turn encodes the image');
  const t2 = { ...t1, messages: [...t1.messages, { role: 'assistant', content: r1.choices[0].message.content },
    { role: 'user', content: 'And the button in the corner?' }] };
  const r2 = await oai.chat.completions.create({ model: 'x', ...t2 });
  assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens,
    `turn 2 read ${r2.usage.prompt_tokens_details.cached_tokens} cached tokens, turn 1 had ${r1.usage.prompt_tokens}`);
  assert.equal(await encodes(), e1, 'the image was not encoded again');
  // Streamed, the same turn from the cache gives the same text.
  let streamed = '';
  for await (const ch of await oai.chat.completions.create({ model: 'x', ...t2, stream: true }))
    streamed += ch.choices[0]?.delta?.content ?? '';
  assert.equal(streamed, r2.choices[0].message.content);
  assert.equal(await encodes(), e1);
  for (const [body, r] of [[t1, r1], [t2, r2]]) {
    const u = await postJSON(srv, CHAT, { ...body, cache_prompt: false });
    assert.equal(u.status, 200, u.text);
    assert.equal(u.json.choices[0].message.content, r.choices[0].message.content);
    assert.equal(u.json.usage.prompt_tokens, r.usage.prompt_tokens);
  }
});

test('chat: two images of the same size never share a cached prefix', async () => {
  const a = { messages: userWith(chatImage(png(64, 64, 21))), max_tokens: 8, temperature: 0 };
  const b = { messages: userWith(chatImage(png(64, 64, 22))), max_tokens: 8, temperature: 0 };
  const before = await tokensBeforeImage(a);
  const ra = await postJSON(srv, CHAT, a);
  assert.equal(ra.status, 200, ra.text);
  // Both slots hold a's prompt, so b can only reuse what it shares with it.
  const r1 = await postJSON(srv, CHAT, { ...a, id_slot: 1 });
  assert.equal(r1.status, 200, r1.text);
  assert.equal(r1.json.cache.slot, 1);
  const rb = await postJSON(srv, CHAT, b);
  assert.equal(rb.status, 200, rb.text);
  assert.ok(rb.json.usage.prompt_tokens_details.cached_tokens <= before,
    `b reused ${rb.json.usage.prompt_tokens_details.cached_tokens} tokens; the text before its image is ${before}`);
  // The same image again is found past the image, in the slot b did not take.
  const ra2 = await postJSON(srv, CHAT, a);
  assert.ok(ra2.json.usage.prompt_tokens_details.cached_tokens > before + 32,
    JSON.stringify([before, ra.json.cache, r1.json.cache, rb.json.cache, ra2.json.cache]));
  assert.equal(ra2.json.choices[0].message.content, ra.json.choices[0].message.content);
  const ub = await postJSON(srv, CHAT, { ...b, cache_prompt: false });
  assert.equal(ub.json.choices[0].message.content, rb.json.choices[0].message.content);
});

test('responses: a screenshot conversation through previous_response_id', async () => {
  const shot = png(64, 64, 31);
  const e0 = await encodes();
  const r1 = await oai.responses.create({ model: 'x', max_output_tokens: 10, temperature: 0,
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Describe this page.' }, respImage(shot)] }] });
  const e1 = await encodes();
  assert.ok(e1 > e0);
  const r2 = await oai.responses.create({ model: 'x', max_output_tokens: 10, temperature: 0,
    previous_response_id: r1.id, input: 'Where is the search box?' });
  assert.ok(r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens,
    `turn 2 read ${r2.usage.input_tokens_details.cached_tokens}, turn 1 had ${r1.usage.input_tokens}`);
  assert.equal(await encodes(), e1);
  const u = await postJSON(srv, '/v1/responses', { model: 'x', max_output_tokens: 10, temperature: 0, cache_prompt: false,
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'Describe this page.' }, respImage(shot)] }] });
  assert.equal(u.status, 200, u.text);
  assert.equal(u.json.output_text ?? u.json.output.find((o) => o.type === 'message')?.content[0].text, r1.output_text);
});

test('messages: a screenshot in a tool result, then the next turn from the cache', async () => {
  const shot = png(64, 64, 41);
  const history = [
    { role: 'user', content: 'Take a screenshot and tell me what you see.' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 'toolu_1', name: 'screenshot', input: {} }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_1', content: [msgImage(shot)] }] },
  ];
  const tools = [{ name: 'screenshot', description: 'Takes a screenshot', input_schema: { type: 'object', properties: {} } }];
  const e0 = await encodes();
  const m1 = await ant.messages.create({ model: 'x', max_tokens: 10, temperature: 0, tools, messages: history });
  const e1 = await encodes();
  assert.ok(e1 > e0);
  const n1 = m1.usage.input_tokens + m1.usage.cache_read_input_tokens + (m1.usage.cache_creation_input_tokens ?? 0);
  // count_tokens counts the image's tokens as the generation does.
  const ct = await ant.messages.countTokens({ model: 'x', tools, messages: history });
  assert.equal(ct.input_tokens, n1);
  const text1 = m1.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  const m2 = await ant.messages.create({ model: 'x', max_tokens: 10, temperature: 0, tools, messages: [...history,
    { role: 'assistant', content: text1 || '.' }, { role: 'user', content: [{ type: 'text', text: 'Zoom in.' }] }] });
  assert.ok(m2.usage.cache_read_input_tokens >= n1, `turn 2 read ${m2.usage.cache_read_input_tokens}, turn 1 had ${n1}`);
  assert.equal(await encodes(), e1);
  const u = await postJSON(srv, '/v1/messages', { model: 'x', max_tokens: 10, temperature: 0, tools, messages: history,
    cache_prompt: false });
  assert.equal(u.status, 200, u.text);
  assert.deepEqual(u.json.content, m1.content);
  // A media_type that is not the bytes' is refused in Anthropic's words, with its path.
  await assert.rejects(ant.messages.create({ model: 'x', max_tokens: 4, messages: [{ role: 'user', content: [
    msgImage(shot, 'image/gif')] }] }),
  (e) => e instanceof Anthropic.BadRequestError && /messages\.0\.content\.0\.source/.test(e.message) &&
    /png but its type says image\/gif/.test(e.message));
});

test('messages: a cache breakpoint after an image falls after the image, not at its marker', async () => {
  const shot = png(64, 64, 43);
  const first = [{ role: 'user', content: [{ type: 'text', text: 'What does this screenshot show?' }, msgImage(shot),
    { type: 'text', text: 'Answer briefly.', cache_control: { type: 'ephemeral' } }] }];
  // On the last message the breakpoint is the prompt without its generation prompt.
  const a = await ant.messages.create({ model: 'x', max_tokens: 4, temperature: 0, messages: first });
  const whole = a.cache?.pinned_tokens;
  assert.ok(whole > 0, JSON.stringify(a.cache));
  const before = await tokensBeforeImage({ messages: [{ role: 'user', content: [
    { type: 'text', text: 'What does this screenshot show?' }, chatImage(shot)] }] });
  assert.ok(whole > before + 1, `the pin (${whole}) lies past the image (which starts at ${before})`);
  // The same breakpoint as an earlier message's: found by rendering the conversation up to
  // it, its image stepped over — the same tokens.
  const text = a.content.filter((x) => x.type === 'text').map((x) => x.text).join('') || '.';
  const b = await ant.messages.create({ model: 'x', max_tokens: 4, temperature: 0, messages: [...first,
    { role: 'assistant', content: text }, { role: 'user', content: 'And the corner?' }] });
  assert.equal(b.cache?.pinned_tokens, whole, JSON.stringify(b.cache));
});

test('chat: a second image at turn 2 extends from the first, which is not encoded again', async () => {
  const t1 = { messages: userWith(chatImage(png(64, 64, 51))), max_tokens: 8, temperature: 0 };
  const r1 = await postJSON(srv, CHAT, t1);
  assert.equal(r1.status, 200, r1.text);
  const e1 = await encodes();
  const t2 = { ...t1, messages: [...t1.messages, { role: 'assistant', content: r1.json.choices[0].message.content },
    { role: 'user', content: [{ type: 'text', text: 'And this one, after it?' }, chatImage(png(64, 64, 52))] }] };
  const r2 = await postJSON(srv, CHAT, t2);
  assert.equal(r2.status, 200, r2.text);
  assert.ok(r2.json.usage.prompt_tokens_details.cached_tokens >= r1.json.usage.prompt_tokens,
    `turn 2 read ${r2.json.usage.prompt_tokens_details.cached_tokens}, turn 1 had ${r1.json.usage.prompt_tokens}`);
  assert.equal(await encodes(), e1 + 1, 'only the second image was encoded');
  const u = await postJSON(srv, CHAT, { ...t2, cache_prompt: false });
  assert.equal(u.json.choices[0].message.content, r2.json.choices[0].message.content);
});

test('metrics count the images received', async () => {
  const m = await metrics(srv);
  assert.ok(m.get('kvstash_media_items_total{kind="image"}') >= 6, JSON.stringify([...m]));
  assert.ok(m.get('kvstash_media_bytes_total') > 0);
  assert.ok(m.get('kvstash_media_tokens_reused_total') > 0);
});

// With the incremental message cache (--imc) conversations are routed by
// message hashes, which carry each image's SHA-256: turn 2 of a screenshot
// conversation is an imc-hash hit, and the same text with another image is
// not (its hash differs at the image's message), so it never routes onto
// the first conversation's branch as if the messages matched.
test('imc: the message hashes tell two images apart', async () => {
  const s2 = await startServer(['-m', model, '--mmproj', mmproj, '--ctx', '2048', '--slots', '2', '--imc']);
  try {
    const post = async (body) => {
      const r = await postJSON(s2, CHAT, { max_tokens: 8, temperature: 0, ...body });
      assert.equal(r.status, 200, r.text);
      return r.json;
    };
    const sys = { role: 'system', content: 'You are a screen reader.' };
    const conv = (seed) => [sys, ...userWith(chatImage(png(64, 64, seed)))];
    const a1 = await post({ messages: conv(51) });
    const a2 = await post({ messages: [...conv(51), { role: 'assistant', content: a1.choices[0].message.content },
      { role: 'user', content: 'More detail, please.' }] });
    assert.equal(a2.cache.mode, 'imc-hash', JSON.stringify(a2.cache));
    assert.ok(a2.usage.prompt_tokens_details.cached_tokens >= a1.usage.prompt_tokens);
    const b2 = await post({ messages: [...conv(52), { role: 'assistant', content: a1.choices[0].message.content },
      { role: 'user', content: 'More detail, please.' }] });
    assert.notEqual(b2.cache.mode, 'imc-hash', JSON.stringify(b2.cache));
    assert.ok(b2.usage.prompt_tokens_details.cached_tokens < a1.usage.prompt_tokens - 32, JSON.stringify(b2.cache));
    const u = await postJSON(s2, CHAT, { max_tokens: 8, temperature: 0, cache_prompt: false, messages: [...conv(52),
      { role: 'assistant', content: a1.choices[0].message.content }, { role: 'user', content: 'More detail, please.' }] });
    assert.equal(u.json.choices[0].message.content, b2.choices[0].message.content);
  } finally {
    await stopOk(s2);
  }
});

// Audio (a projector with an audio encoder: mkmodel --mmproj-audio): input_audio
// through chat and Responses, cached like an image, with its own checks.
test('audio: input_audio through chat and responses, from the cache on turn 2', async () => {
  const av = path.join(dir, 'tiny-mmproj-av.gguf');
  const avModel = path.join(dir, 'tiny-av.gguf');
  execFileSync(BIN, ['mkmodel', '--preset', 'tiny', '--seed', '1', '--chat-template',
    path.join(process.env.KS_TEMPLATES_DIR, QWEN25_TEMPLATE), '--mmproj', av, '--mmproj-audio', avModel], { stdio: 'ignore' });
  const s3 = await startServer(['-m', avModel, '--mmproj', av, '--ctx', '2048', '--slots', '2']);
  try {
    const p = await (await fetch(s3.base + '/props')).json();
    assert.deepEqual(p.modalities, { vision: true, video: false, audio: true });
    const clip = wav(16000, 16000, 3);
    const c3 = new OpenAI({ baseURL: s3.base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });
    const t1 = { model: 'x', max_tokens: 8, temperature: 0,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'Transcribe this.' }, chatAudio(clip)] }] };
    const r1 = await c3.chat.completions.create(t1);
    const e1 = (await metrics(s3)).get('kvstash_media_encodes_total');
    assert.ok(e1 > 0);
    const r2 = await c3.chat.completions.create({ ...t1, messages: [...t1.messages,
      { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'Louder?' }] });
    assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens);
    assert.equal((await metrics(s3)).get('kvstash_media_encodes_total'), e1);
    const u = await postJSON(s3, CHAT, { ...t1, cache_prompt: false });
    assert.equal(u.json.choices[0].message.content, r1.choices[0].message.content);
    // Responses' input_audio: the same prompt, so the same tokens and the cache's.
    const rr = await c3.responses.create({ model: 'x', max_output_tokens: 8, temperature: 0, input: [{ role: 'user',
      content: [{ type: 'input_text', text: 'Transcribe this.' }, { type: 'input_audio', input_audio: {
        data: clip.toString('base64'), format: 'wav' } }] }] });
    assert.equal(rr.usage.input_tokens, r1.usage.prompt_tokens);
    assert.ok(rr.usage.input_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1);
    // Its checks: the declared format against the bytes, an image where audio was announced.
    const a = (part) => postJSON(s3, CHAT, { max_tokens: 4, messages: [{ role: 'user', content: [part] }] });
    assertError(await a(chatAudio(clip, 'mp3')), 400, 'media_type_mismatch', 'messages[0].content[0].input_audio.data');
    assertError(await a(chatAudio(png(8, 8), 'wav')), 400, 'media_type_mismatch', 'messages[0].content[0].input_audio.data');
    assertError(await a(chatAudio(clip, 'ogg')), 400, 'invalid_value', 'messages[0].content[0].input_audio.format');
    assertError(await a({ type: 'input_audio', input_audio: { data: clip.toString('base64') } }), 400,
      'missing_required_parameter', 'messages[0].content[0].input_audio.format');
    // RIFF/WAVE magic and no format chunk behind it: the decoder refuses it.
    const bad = assertError(await a(chatAudio(Buffer.concat([clip.subarray(0, 12), Buffer.from('garbage!garbage!')]))), 400,
      'invalid_audio_format', 'messages[0].content[0].input_audio.data');
    assert.match(bad.message, /could not be decoded/);
  } finally {
    await stopOk(s3);
  }
});

// An image added at turn 4 of a text conversation extends what the slot holds
// (the text before it is read from the cache), and after a restart the
// store gives the image's conversation back: no prefill of the image, no
// encode, the same output.
test('an image mid-conversation extends it; a restarted server restores it from the store', async () => {
  const storeDirPath = path.join(dir, 'store');
  const config = await writeStoreConfig(path.join(dir, 'store.yaml'), { cacheDir: path.join(storeDirPath, 'disk'),
    shmDir: path.join(storeDirPath, 'shm') });
  const args = ['-m', model, '--mmproj', mmproj, '--ctx', '2048', '--slots', '2', '--config', config];
  let s4 = await startServer(args);
  const turn = async (srvx, messages) => {
    const r = await postJSON(srvx, CHAT, { messages, max_tokens: 8, temperature: 0 });
    assert.equal(r.status, 200, r.text);
    return r.json;
  };
  const msgs = [{ role: 'system', content: 'You help with a web page. '.repeat(4) }];
  let last, withImage;
  try {
    for (const q of ['Open the page.', 'Scroll down.', 'What is at the bottom?']) {
      msgs.push({ role: 'user', content: q });
      last = await turn(s4, msgs);
      msgs.push({ role: 'assistant', content: last.choices[0].message.content });
    }
    msgs.push(...userWith(chatImage(png(64, 64, 61))));
    withImage = await turn(s4, msgs);
    assert.ok(withImage.usage.prompt_tokens_details.cached_tokens >= last.usage.prompt_tokens,
      `turn 4 read ${withImage.usage.prompt_tokens_details.cached_tokens}, turn 3's prompt was ${last.usage.prompt_tokens}`);
    msgs.push({ role: 'assistant', content: withImage.choices[0].message.content });
    await settleStore(s4);
  } finally {
    await stopOk(s4);
  }
  s4 = await startServer(args);
  try {
    msgs.push({ role: 'user', content: 'And the footer links?' });
    const after = await turn(s4, msgs);
    assert.equal(after.cache.mode, 'store', JSON.stringify(after.cache));
    // The whole of turn 4's prompt, image included, comes back from the store.
    assert.ok(after.usage.prompt_tokens_details.cached_tokens >= withImage.usage.prompt_tokens,
      JSON.stringify([after.cache, withImage.usage]));
    assert.equal((await metrics(s4)).get('kvstash_media_encodes_total'), 0, 'the restored image was not encoded');
    const u = await postJSON(s4, CHAT, { messages: msgs, max_tokens: 8, temperature: 0, cache_prompt: false });
    assert.equal(u.json.choices[0].message.content, after.choices[0].message.content);
  } finally {
    await stopOk(s4);
  }
});

test('a second process beside the first restores the image conversation from the shared store', async () => {
  const storeDirPath = path.join(dir, 'store2');
  const config = await writeStoreConfig(path.join(dir, 'store2.yaml'), { cacheDir: path.join(storeDirPath, 'disk'),
    shmDir: path.join(storeDirPath, 'shm') });
  const args = ['-m', model, '--mmproj', mmproj, '--ctx', '2048', '--slots', '2', '--config', config];
  const a = await startServer(args);
  const b = await startServer(args);
  try {
    const msgs = [{ role: 'system', content: 'You read dashboards. '.repeat(4) }, ...userWith(chatImage(png(64, 64, 71)))];
    const r1 = await postJSON(a, CHAT, { messages: msgs, max_tokens: 8, temperature: 0 });
    assert.equal(r1.status, 200, r1.text);
    await settleStore(a);
    msgs.push({ role: 'assistant', content: r1.json.choices[0].message.content },
      { role: 'user', content: 'Which panel is red?' });
    const r2 = await postJSON(b, CHAT, { messages: msgs, max_tokens: 8, temperature: 0 });
    assert.equal(r2.status, 200, r2.text);
    assert.equal(r2.json.cache.mode, 'store', JSON.stringify(r2.json.cache));
    assert.ok(r2.json.usage.prompt_tokens_details.cached_tokens >= r1.json.usage.prompt_tokens,
      JSON.stringify([r2.json.cache, r1.json.usage]));
    assert.equal((await metrics(b)).get('kvstash_media_encodes_total'), 0, 'process B encoded nothing');
    const u = await postJSON(b, CHAT, { messages: msgs, max_tokens: 8, temperature: 0, cache_prompt: false });
    assert.equal(u.json.choices[0].message.content, r2.json.choices[0].message.content);
  } finally {
    await stopOk(a);
    await stopOk(b);
  }
});
