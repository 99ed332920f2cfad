// native.test.mjs — llama-server's own completion endpoints on `kvstash
// serve` (docs/SERVER.md "llama-server's /completion and /infill"): POST
// /completion (its reply shape, streamed without [DONE], n_probs as
// completion_probabilities, several prompts as an array, stop strings as
// stop_type "word") and POST /infill, the fill-in-the-middle endpoint of
// llama.vim and llama.vscode: its prompt built token for token as
// llama-server builds it (checked against the same tokens sent to
// /completion), its files read from the prefix cache on the next request,
// the same reply with and without the cache, and its errors.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startServer, stopOk, postJSON, stream, assertError, runBin, importClient } from './lib.mjs';

let root;
let srv; // the tiny model with Qwen2.5-Coder's FIM tokens (mkmodel --fim)
let plain; // the tiny model without them
before(async () => {
  root = mkdtempSync(path.join(tmpdir(), 'kvstash-e2e-native-'));
  const fim = path.join(root, 'tiny-fim.gguf');
  const mk = await runBin(['mkmodel', '--preset', 'tiny', '--fim', '--seed', '1', fim]);
  assert.equal(mk.code, 0, mk.stderr);
  srv = await startServer(['--slots', '1', '--ctx', '4096'], { model: fim });
  plain = await startServer(['--slots', '1']);
});
after(async () => {
  if (srv) await stopOk(srv);
  if (plain) await stopOk(plain);
  if (root) rmSync(root, { recursive: true, force: true });
});

const GREEDY = { temperature: 0, n_predict: 12 };

async function ok(s, p, body) {
  const r = await postJSON(s, p, body);
  assert.equal(r.status, 200, `${p}: ${r.status} ${r.text}`);
  return r.json;
}

async function tokenize(content, extra = {}) {
  return (await ok(srv, '/tokenize', { content, ...extra })).tokens;
}

test('/completion answers in llama-server\'s shape, the same text as /v1/completions', async () => {
  const prompt = 'The quick ocean was warm, and a strong mind said';
  const r = await ok(srv, '/completion', { prompt, ...GREEDY });
  for (const k of ['index', 'content', 'tokens', 'id_slot', 'stop', 'model', 'tokens_predicted', 'tokens_evaluated',
    'generation_settings', 'prompt', 'has_new_line', 'truncated', 'stop_type', 'stopping_word', 'tokens_cached',
    'timings']) assert.ok(k in r, `no ${k}: ${JSON.stringify(r)}`);
  assert.equal(r.stop, true);
  assert.equal(r.prompt, prompt);
  assert.equal(r.tokens_predicted, 12);
  assert.equal(r.stop_type, 'limit');
  assert.equal(r.tokens_evaluated, (await tokenize(prompt, { add_special: true })).length);
  assert.equal(r.generation_settings.n_predict, 12);
  assert.equal(r.generation_settings.temperature, 0);
  const oai = await ok(srv, '/v1/completions', { prompt, max_tokens: 12, temperature: 0 });
  assert.equal(r.content, oai.choices[0].text);
  // several prompts: an array, one object each
  const many = await ok(srv, '/completion', { prompt: [prompt, 'hello world'], ...GREEDY });
  assert.ok(Array.isArray(many) && many.length === 2, JSON.stringify(many).slice(0, 200));
  assert.equal(many[0].content, r.content);
  assert.equal(many[1].prompt, 'hello world');
  assert.deepEqual(many.map((x) => x.index), [0, 1]);
});

test('/completion streams pieces, then the whole object with stop: true, and no [DONE]', async () => {
  const prompt = 'hello world, the ocean';
  const whole = await ok(srv, '/completion', { prompt, ...GREEDY, n_probs: 2 });
  assert.equal(whole.completion_probabilities.length, 12);
  for (const p of whole.completion_probabilities) {
    assert.ok(Number.isInteger(p.id) && typeof p.token === 'string' && typeof p.logprob === 'number', JSON.stringify(p));
    assert.equal(p.top_logprobs.length, 2);
    assert.equal(p.top_logprobs[0].id, p.id, 'greedy: the sampled token is the most likely');
  }
  assert.equal(whole.completion_probabilities.map((p) => p.token).join(''), whole.content);
  const s = await stream(srv, '/completion', { prompt, ...GREEDY, n_probs: 2 });
  assert.equal(s.status, 200);
  assert.equal(s.done, false, 'llama-server ends /completion\'s stream without [DONE]');
  const ev = s.events.map((e) => e.json);
  const last = ev[ev.length - 1];
  assert.equal(last.stop, true);
  assert.equal(last.content, '');
  assert.equal(last.tokens_predicted, 12);
  assert.ok(ev.slice(0, -1).every((e) => e.stop === false));
  assert.equal(ev.map((e) => e.content).join(''), whole.content);
  const probs = ev.flatMap((e) => e.completion_probabilities ?? []);
  assert.deepEqual(probs.map((p) => p.id), whole.completion_probabilities.map((p) => p.id));
});

test('/completion: a stop string ends it with stop_type "word" and names it', async () => {
  const prompt = 'The quick ocean was warm, and a strong mind said';
  const free = await ok(srv, '/completion', { prompt, ...GREEDY });
  const words = free.content.trim().split(/\s+/);
  assert.ok(words.length >= 3, free.content);
  const word = words[2];
  const r = await ok(srv, '/completion', { prompt, ...GREEDY, stop: [word] });
  assert.equal(r.stop_type, 'word');
  assert.equal(r.stopping_word, word);
  assert.ok(free.content.startsWith(r.content) && !r.content.includes(word), `${r.content} / ${free.content}`);
});

// llama-server's format_prompt_infill (tools/server/server-common.cpp), in
// tokens: [REP]myproject\n [SEP]name\n text ... [SEP]filename\n [BOS]? [PRE]
// prefix prompt [SUF] suffix [MID], prefix and suffix cut to 3/4 and 1/4 of
// a 2048-token batch.
async function infillTokens({ input_prefix, input_suffix, prompt = '', input_extra = [] }, spm = false) {
  const [pre, suf, mid, rep, sep] = await Promise.all(
    ['<|fim_prefix|>', '<|fim_suffix|>', '<|fim_middle|>', '<|repo_name|>', '<|file_sep|>'].map(async (t) => {
      const ids = await tokenize(t);
      assert.equal(ids.length, 1, `${t} is one token`);
      return ids[0];
    }));
  const plainTok = (s) => (s ? tokenize(s, { parse_special: false }) : []);
  const extra = [rep, ...(await plainTok('myproject\n'))];
  for (const c of input_extra) extra.push(sep, ...(await plainTok(`${c.filename ?? 'tmp'}\n`)), ...(await plainTok(c.text)));
  extra.push(sep, ...(await plainTok('filename\n')));
  const p = await plainTok(input_prefix);
  const s = await plainTok(input_suffix);
  const pr = prompt ? await tokenize(prompt) : [];
  const bos = (await tokenize('x', { add_special: true })).length === 2 ? [(await tokenize('x', { add_special: true }))[0]] : [];
  const pTake = Math.min(p.length, 3 * 512);
  const sTake = Math.min(s.length, Math.max(0, 512 - (2 + pr.length)));
  const prePart = [pre, ...p.slice(p.length - pTake), ...pr];
  const sufPart = [suf, ...s.slice(0, sTake)];
  return [...extra, ...bos, ...(spm ? [...sufPart, ...prePart] : [...prePart, ...sufPart]), mid];
}

const FILES = [
  { filename: 'util.py', text: 'import os\n\ndef helper(x):\n    return x * 2\n'.repeat(6) },
  { filename: 'main.py', text: 'from util import helper\nprint(helper(3))\n'.repeat(6) },
];

test('/infill builds llama-server\'s prompt, token for token, and answers as /completion does on it', async () => {
  const cases = [
    { input_prefix: 'def add(a, b):\n    ', input_suffix: '\n\nprint(add(1, 2))\n' },
    { input_prefix: 'def add(a, b):\n    ', input_suffix: '\n', input_extra: FILES, prompt: 'ret' },
    // code that spells the FIM tokens stays text; prefix and suffix past their budgets are cut
    { input_prefix: '<|fim_prefix|> x = 1\n'.repeat(400), input_suffix: 'y = <|fim_middle|>\n'.repeat(300),
      input_extra: [{ text: 'no name given\n' }] },
    { input_prefix: '', input_suffix: '' },
  ];
  for (const c of cases) {
    const want = await infillTokens(c);
    const r = await ok(srv, '/infill', { ...c, ...GREEDY });
    assert.equal(r.tokens_evaluated, want.length, `prompt length for ${JSON.stringify(c).slice(0, 80)}`);
    const ref = await ok(srv, '/completion', { prompt: want, ...GREEDY });
    assert.equal(ref.tokens_evaluated, want.length);
    assert.equal(r.content, ref.content, 'the same prompt, the same greedy reply');
    assert.equal(r.stop, true);
    assert.ok(!('prompt' in r) || typeof r.prompt === 'string');
  }
});

test('--spm-infill: the suffix before the prefix, token for token as llama-server orders them', async () => {
  const spm = await startServer(['--slots', '1', '--ctx', '4096', '--spm-infill'], { model: path.join(root, 'tiny-fim.gguf') });
  try {
    const c = { input_prefix: 'def add(a, b):\n    ', input_suffix: '\nprint(1)\n', input_extra: FILES, prompt: 'ret' };
    const want = await infillTokens(c, true);
    assert.notDeepEqual(want, await infillTokens(c, false));
    // the first token's log-probability tells the orders apart (the same tokens, in another order)
    const first = (x) => x.completion_probabilities[0].logprob;
    const r = await ok(spm, '/infill', { ...c, ...GREEDY, n_probs: 1 });
    assert.equal(r.tokens_evaluated, want.length);
    const ref = await ok(spm, '/completion', { prompt: want, ...GREEDY, n_probs: 1 });
    assert.equal(r.content, ref.content);
    assert.equal(first(r), first(ref));
    const psm = await ok(spm, '/completion', { prompt: await infillTokens(c, false), ...GREEDY, n_probs: 1 });
    assert.notEqual(first(r), first(psm));
  } finally {
    await stopOk(spm);
  }
});

test('/infill: the files come first, so the next request reads them from the cache; the reply is the uncached one', async () => {
  const a = { input_extra: FILES, input_prefix: 'def add(a, b):\n    ', input_suffix: '\n', ...GREEDY };
  const r1 = await ok(srv, '/infill', a);
  // the cursor moved on: a longer prefix, the same files
  const b = { ...a, input_prefix: 'def add(a, b):\n    total = a + b\n    ' };
  const r2 = await ok(srv, '/infill', b);
  const nFiles = (await infillTokens({ ...b, input_prefix: '', input_suffix: '' })).length - 3;
  assert.ok(r2.cache.cached_tokens >= nFiles, `cached ${r2.cache.cached_tokens} of ${r2.tokens_evaluated}, files ${nFiles}`);
  assert.ok(r2.timings.prompt_n < r2.tokens_evaluated - nFiles + 1, JSON.stringify(r2.timings));
  assert.ok(r1.tokens_evaluated > nFiles);
  const cold = await ok(srv, '/infill', { ...b, cache_prompt: false });
  assert.equal(cold.cache.cached_tokens, 0);
  assert.equal(r2.content, cold.content, 'cached and uncached replies are the same');
  const s = await stream(srv, '/infill', b);
  assert.equal(s.events.map((e) => e.json.content).join(''), r2.content);
  assert.equal(s.events[s.events.length - 1].json.stop, true);
});

test('n_indent: a later line indented less ends the reply before its first character (stop_type "limit")', async () => {
  // a grammar fixes the text whatever the random weights say
  const grammar = 'root ::= "x = 1\\n    y = 2\\n  z = 3\\n    w\\n"';
  const body = { input_prefix: 'def f():\n', input_suffix: '', n_predict: 60, temperature: 0, grammar };
  const free = await ok(srv, '/infill', body);
  assert.equal(free.content, 'x = 1\n    y = 2\n  z = 3\n    w\n');
  assert.equal((await ok(srv, '/infill', { ...body, n_indent: 2 })).content, free.content);
  const cut = await ok(srv, '/infill', { ...body, n_indent: 4 });
  assert.equal(cut.content, 'x = 1\n    y = 2\n  ');
  assert.equal(cut.stop_type, 'limit');
  assert.ok(cut.tokens_predicted < free.tokens_predicted, `${cut.tokens_predicted} vs ${free.tokens_predicted}`);
  const s = await stream(srv, '/infill', { ...body, n_indent: 4 });
  assert.equal(s.events.map((e) => e.json.content).join(''), cut.content);
  assert.equal(s.events[s.events.length - 1].json.stop_type, 'limit');
  // the OpenAI shape says "length", as llama-server's does
  const oai = await ok(srv, '/v1/completions', { prompt: 'a', max_tokens: 60, temperature: 0, n_indent: 4, grammar });
  assert.equal(oai.choices[0].text, cut.content);
  assert.equal(oai.choices[0].finish_reason, 'length');
  assertError(await postJSON(srv, '/infill', { ...body, n_indent: -1 }), 400, undefined, 'n_indent');
});

test('t_max_predict_ms: past it, the reply ends at the next newline (stop_type "limit")', async () => {
  // 40 fixed lines (a grammar) take far more than 1 ms to generate, even under a sanitizer
  const body = { input_prefix: 'x', input_suffix: '', n_predict: 400, temperature: 0, grammar: 'root ::= ("ab\\n"){40}' };
  const full = await ok(srv, '/infill', body);
  assert.equal(full.content, 'ab\n'.repeat(40));
  const cut = await ok(srv, '/infill', { ...body, t_max_predict_ms: 1 });
  assert.equal(cut.stop_type, 'limit');
  assert.ok(cut.content.length >= 3 && cut.content.length < full.content.length, JSON.stringify(cut.content));
  assert.ok(full.content.startsWith(cut.content) && cut.content.endsWith('\n'), JSON.stringify(cut.content));
  assert.ok(cut.tokens_predicted < full.tokens_predicted);
  const oai = await ok(srv, '/v1/completions', { prompt: 'x', max_tokens: 400, temperature: 0, grammar: body.grammar,
    t_max_predict_ms: 1 });
  assert.equal(oai.choices[0].finish_reason, 'length');
  assert.ok(oai.choices[0].text.endsWith('\n') && oai.choices[0].text.length < full.content.length);
  // a bound the reply never reaches changes nothing
  assert.equal((await ok(srv, '/infill', { ...body, t_max_predict_ms: 600000 })).content, full.content);
});

test('response_fields: the whole reply keeps those paths, each under its path (llama.vscode reads "timings/prompt_n")', async () => {
  const body = { input_prefix: 'def f(x):\n    ', input_suffix: '\n', ...GREEDY, n_probs: 1 };
  const all = await ok(srv, '/infill', body);
  const fields = ['content', 'timings/prompt_n', 'timings/predicted_n', 'tokens_cached', 'completion_probabilities',
    'no/such/path'];
  const r = await ok(srv, '/infill', { ...body, response_fields: fields });
  assert.deepEqual(Object.keys(r).sort(), fields.slice(0, 5).sort());
  assert.equal(r.content, all.content);
  assert.equal(r['timings/predicted_n'], 12);
  assert.ok(Number.isInteger(r['timings/prompt_n']));
  assert.equal(r.completion_probabilities.length, 12);
  // streamed: the pieces as before, the last event cut to the fields
  const s = await stream(srv, '/completion', { prompt: 'hello', ...GREEDY, response_fields: ['content', 'stop'] });
  assert.deepEqual(s.events[s.events.length - 1].json, { content: '', stop: true });
  assertError(await postJSON(srv, '/infill', { ...body, response_fields: 'content' }), 400, 'invalid_type',
    'response_fields');
  assertError(await postJSON(srv, '/infill', { ...body, response_fields: [3] }), 400, 'invalid_type', 'response_fields');
});

test('llama.vim\'s cache warm-up (n_predict 0, response_fields [""]): {} back, and the files are in the cache after', async () => {
  const files = [{ filename: 'warm.py', text: 'def warm(x):\n    return x + 1\n'.repeat(20) }];
  // the request llama.vim sends when its ring of chunks changes, field for field
  const r = await ok(srv, '/infill', {
    input_prefix: '', input_suffix: '', input_extra: files, prompt: '', n_predict: 0, temperature: 0.0, stream: false,
    samplers: [], cache_prompt: true, t_max_prompt_ms: 1, t_max_predict_ms: 1, response_fields: [''],
  });
  assert.deepEqual(r, {});
  const next = await ok(srv, '/infill', { input_extra: files, input_prefix: 'def main():\n    ', input_suffix: '\n', ...GREEDY });
  const nFiles = (await infillTokens({ input_extra: files, input_prefix: '', input_suffix: '' })).length - 3;
  assert.ok(next.cache.cached_tokens >= nFiles, `cached ${next.cache.cached_tokens}, files ${nFiles}`);
  // n_predict 0 is one token, as llama-server counts it
  assert.equal((await ok(srv, '/completion', { prompt: 'hello', n_predict: 0 })).tokens_predicted, 1);
});

test('samplers: llama-server\'s order, names or chars (llama.vscode: top_k, top_p, infill)', async () => {
  const body = { input_prefix: 'def f(x):\n    ', input_suffix: '\n', n_predict: 16, seed: 42, top_k: 40, top_p: 0.99 };
  const a = await ok(srv, '/infill', { ...body, samplers: ['top_k', 'top_p', 'infill'] });
  const b = await ok(srv, '/infill', { ...body, samplers: 'kpi' });
  assert.equal(a.content, b.content, 'the same order by names and by chars, the same seed');
  // with the temperature step last, temperature 0 is greedy; without it, temperature 0 does nothing
  const greedy = await ok(srv, '/infill', { ...body, temperature: 0 });
  assert.equal((await ok(srv, '/infill', { ...body, temperature: 0, samplers: ['top_k', 'temperature'] })).content,
    greedy.content);
  const seeds = await Promise.all([1, 2, 3, 4].map((seed) =>
    ok(srv, '/infill', { ...body, seed, temperature: 0, samplers: [] })));
  assert.ok(new Set(seeds.map((r) => r.content)).size > 1, 'no temperature step: draws from the logits as they are');
  // steps kvstash has no parameter for are no-ops (llama-server's defaults); unknown names are left out
  assert.equal((await ok(srv, '/infill', { ...body, samplers: ['dry', 'top_k', 'typ_p', 'top_p', 'xtc', 'infill', 'nope'] })).content,
    a.content);
  assertError(await postJSON(srv, '/infill', { ...body, samplers: ['adaptive_p'] }), 400, 'unsupported_value', 'samplers[0]');
  assertError(await postJSON(srv, '/infill', { ...body, samplers: [3] }), 400, 'invalid_type', 'samplers[0]');
  assertError(await postJSON(srv, '/infill', { ...body, samplers: 7 }), 400, 'invalid_type', 'samplers');
  assertError(await postJSON(srv, '/infill', { ...body, samplers: 'k'.repeat(33) }), 400, 'array_above_max_length', 'samplers');
});

test('the openai SDK sends llama-server\'s fields on /v1/completions: n_indent, t_max_predict_ms, samplers, n_predict 0', async () => {
  const OpenAI = (await importClient('openai')).default;
  const oai = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'none', maxRetries: 0, timeout: 120000 });
  const grammar = 'root ::= "x = 1\\n    y = 2\\n  z = 3\\n"';
  const cut = await oai.completions.create({ model: 'x', prompt: 'a', max_tokens: 60, temperature: 0, grammar, n_indent: 4 });
  assert.equal(cut.choices[0].text, 'x = 1\n    y = 2\n  ');
  assert.equal(cut.choices[0].finish_reason, 'length');
  const lines = await oai.completions.create({ model: 'x', prompt: 'x', max_tokens: 400, temperature: 0,
    grammar: 'root ::= ("ab\\n"){40}', t_max_predict_ms: 1 });
  assert.equal(lines.choices[0].finish_reason, 'length');
  assert.ok(lines.choices[0].text.endsWith('\n') && lines.choices[0].text.length < 120, lines.choices[0].text);
  const body = { model: 'x', prompt: 'def f(x):', max_tokens: 8, seed: 7, top_k: 40, top_p: 0.99 };
  const a = await oai.completions.create({ ...body, samplers: ['top_k', 'top_p', 'infill'] });
  const b = await oai.completions.create({ ...body, samplers: 'kpi' });
  assert.equal(a.choices[0].text, b.choices[0].text);
  const one = await oai.completions.create({ model: 'x', prompt: 'hello', n_predict: 0 });
  assert.equal(one.usage.completion_tokens, 1);
  await assert.rejects(oai.completions.create({ ...body, samplers: ['adaptive_p'] }),
    (e) => e.status === 400 && e.error?.param === 'samplers[0]');
});

test('/infill refuses what it cannot take, and the server goes on', async () => {
  const base = { input_prefix: 'a', input_suffix: 'b', n_predict: 2 };
  assertError(await postJSON(srv, '/infill', { input_suffix: 'b' }), 400, 'missing_required_parameter', 'input_prefix');
  assertError(await postJSON(srv, '/infill', { input_prefix: 'a' }), 400, 'missing_required_parameter', 'input_suffix');
  assertError(await postJSON(srv, '/infill', { ...base, input_prefix: 7 }), 400, 'invalid_type', 'input_prefix');
  assertError(await postJSON(srv, '/infill', { ...base, prompt: ['x'] }), 400, 'invalid_type', 'prompt');
  assertError(await postJSON(srv, '/infill', { ...base, input_extra: { text: 'x' } }), 400, 'invalid_type', 'input_extra');
  assertError(await postJSON(srv, '/infill', { ...base, input_extra: ['x'] }), 400, 'invalid_type', 'input_extra[0]');
  assertError(await postJSON(srv, '/infill', { ...base, input_extra: [{ filename: 'f' }] }), 400,
    'missing_required_parameter', 'input_extra[0].text');
  assertError(await postJSON(srv, '/infill', { ...base, input_extra: [{ text: 'x', filename: 3 }] }), 400,
    'invalid_type', 'input_extra[0].filename');
  assertError(await postJSON(srv, '/infill', { ...base, messages: [] }), 400, 'unsupported_parameter', 'messages');
  assertError(await postJSON(srv, '/completion', { n_predict: 2 }), 400, 'missing_required_parameter', 'prompt');
  // a model without fill-in-the-middle tokens: llama-server's 501
  const e = assertError(await postJSON(plain, '/infill', base), 501, 'infill_unsupported');
  assert.match(e.message, /Infill is not supported by this model: prefix token is missing/);
  // both servers still answer
  assert.equal((await ok(srv, '/infill', base)).stop, true);
  assert.equal((await ok(plain, '/completion', { prompt: 'hello', n_predict: 2 })).tokens_predicted, 2);
});
