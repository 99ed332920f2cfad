// media_errors.test.mjs — images and audio sent to a model without a
// projector, through the official SDKs of the three APIs: each is refused
// with a 400 that says the model takes no image (or audio) input and names
// the part, and the same conversation without the media still answers.
// (The limits and bad files, which need a projector to be reached, are in
// media.test.mjs.)
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, postJSON, getJSON, importClient, assertError } from './lib.mjs';
import { png, wav, chatImage, chatAudio, respImage, msgImage } from './media.mjs';

let srv, OpenAI, Anthropic, oai, ant;
const IMG = png(32, 24, 1);

before(async () => {
  OpenAI = (await importClient('openai')).default;
  Anthropic = (await importClient('@anthropic-ai/sdk')).default;
  srv = await startServer([]);
  oai = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'none', maxRetries: 0 });
  ant = new Anthropic({ baseURL: srv.base, apiKey: 'none', maxRetries: 0 });
});
after(async () => { if (srv) await stopOk(srv); });

test('chat completions: an image or audio part is a 400 naming the part', async () => {
  await assert.rejects(oai.chat.completions.create({ model: 'x', max_tokens: 4,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'what is this?' }, chatImage(IMG)] }] }),
  (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.code, 'invalid_value');
    assert.equal(e.param, 'messages[0].content[1]');
    assert.match(e.message, /no image input/);
    assert.match(e.message, /--mmproj/);
    return true;
  });
  await assert.rejects(oai.chat.completions.create({ model: 'x', max_tokens: 4,
    messages: [{ role: 'user', content: [chatAudio(wav(1600))] }] }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === 'messages[0].content[0]' && /no audio input/.test(e.message));
  // The same turn without the image is answered.
  const r = await oai.chat.completions.create({ model: 'x', max_tokens: 4, temperature: 0,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'what is this?' }] }] });
  assert.equal(r.object, 'chat.completion');
});

test('responses: input_image is a 400 naming the part', async () => {
  await assert.rejects(oai.responses.create({ model: 'x', max_output_tokens: 4,
    input: [{ role: 'user', content: [{ type: 'input_text', text: 'describe' }, respImage(IMG)] }] }),
  (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, String(e));
    assert.equal(e.param, 'input[0].content[1].image_url');
    assert.match(e.message, /no image input/);
    return true;
  });
  assertError(await postJSON(srv, '/v1/responses', { input: [{ role: 'user', content: [{ type: 'input_image',
    file_id: 'file-abc' }] }] }), 400, 'unsupported_value', 'input[0].content[0].file_id');
});

test('messages: an image block is a 400 in Anthropic\'s shape', async () => {
  await assert.rejects(ant.messages.create({ model: 'x', max_tokens: 4,
    messages: [{ role: 'user', content: [msgImage(IMG), { type: 'text', text: 'what is it?' }] }] }),
  (e) => {
    assert.ok(e instanceof Anthropic.BadRequestError, String(e));
    assert.equal(e.error.type, 'error');
    assert.equal(e.error.error.type, 'invalid_request_error');
    assert.match(e.error.error.message, /messages\.0\.content\.0\.source/);
    assert.match(e.error.error.message, /no image input/);
    return true;
  });
  // A screenshot in a tool result (Claude Code's computer and browser tools) too.
  const r = await postJSON(srv, '/v1/messages', { model: 'x', max_tokens: 4, messages: [
    { role: 'user', content: 'take a screenshot' },
    { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'shot', input: {} }] },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: [msgImage(IMG)] }] }] });
  assert.equal(r.status, 400, r.text);
  assert.match(r.json.error.message, /messages\.2\.content\.0\.content\.0\.source.*no image input/);
  // A url source is refused as any image is here, before anything is fetched.
  const u = await postJSON(srv, '/v1/messages', { model: 'x', max_tokens: 4, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'url', url: 'https://example.com/cat.png' } }] }] });
  assert.equal(u.status, 400);
  assert.match(u.json.error.message, /messages\.0\.content\.0\.source.*no image input/);
  const f = await postJSON(srv, '/v1/messages', { model: 'x', max_tokens: 4, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'file', file_id: 'f1' } }] }] });
  assert.equal(f.status, 400);
  assert.match(f.json.error.message, /only base64 and url image sources/);
  const t = await postJSON(srv, '/v1/messages', { model: 'x', max_tokens: 4, messages: [{ role: 'user', content: [
    { type: 'image', source: { type: 'base64', media_type: 'image/tiff', data: 'AAAA' } }] }] });
  assert.equal(t.status, 400);
  assert.match(t.json.error.message, /media_type/);
});

test('count_tokens refuses media the same way', async () => {
  const r = await postJSON(srv, '/v1/messages/count_tokens', { model: 'x', messages: [{ role: 'user', content: [msgImage(IMG)] }] });
  assert.equal(r.status, 400, r.text);
  assert.match(r.json.error.message, /no image input/);
});

test('/props and /v1/models say the model takes text only', async () => {
  const p = await getJSON(srv, '/props');
  assert.equal(p.status, 200);
  assert.deepEqual(p.json.modalities, { vision: false, video: false, audio: false });
  const m = await getJSON(srv, '/v1/models');
  assert.deepEqual(m.json.data[0].capabilities, ['completion']);
  assert.deepEqual(m.json.data[0].modalities, { vision: false, audio: false });
});
