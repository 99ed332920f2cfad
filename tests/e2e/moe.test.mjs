// moe.test.mjs — `kvstash serve` on the mixture-of-experts test models of
// issue 31: tiny-moe (qwen3moe, Q8_0 experts), tiny-moe-q4k (repacked Q4_K
// experts) and tiny-gptoss (gpt-oss: MXFP4 experts, attention sinks, a
// 32-token sliding window in half the layers, its real Harmony template).
// Every cache path gives the replies of --no-cache-prompt, bit for bit: the
// same slot over a chat, sub-agents on fewer slots (the store, copies), a
// restart, IMC by message hash and SPC, IMC's token-prefix fallback where
// gpt-oss's template renders the history differently from one turn to the
// next, a slot copy of a shared system prompt, and Redis between two hosts.
//
// What the cache keeps on gpt-oss: a sliding-window state restores exactly
// at the window's length or at window + 64k tokens (ks_engine_state_restorable,
// docs/LLAMA_FACTS.md), so there restores take such lengths; live reuse in
// the slot takes any length.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, stopOk, chat, getJSON, postJSON, replyOf, writeStoreConfig, writeConfig, metrics, settleStore,
  startRedis, redisHostConfig, alternateHosts } from './lib.mjs';

const MODELS = {
  'tiny-moe': process.env.KS_TINY_MOE_MODEL,
  'tiny-moe-q4k': process.env.KS_TINY_MOE_Q4K_MODEL,
  'tiny-gptoss': process.env.KS_TINY_GPTOSS_MODEL,
};
const EXPERTS = { 'tiny-moe': [16, 4], 'tiny-moe-q4k': [16, 4], 'tiny-gptoss': [8, 2] };
const SWA = { 'tiny-gptoss': 32 }; // the window; the others have none
const restorable = (name, n) => !SWA[name] || n <= SWA[name] || (n - SWA[name]) % 64 === 0;

const servers = [];
const dirs = [];
after(async () => {
  for (const s of servers) await stopOk(s);
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});
async function serve(args, opts) {
  const s = await startServer(args, opts);
  servers.push(s);
  return s;
}
async function stop(...done) {
  for (const s of done) await stopOk(s);
  const keep = servers.filter((s) => !done.includes(s));
  servers.length = 0;
  servers.push(...keep);
}
function tmp(name) {
  const d = mkdtempSync(path.join(os.tmpdir(), `ks-moe-${name}-`));
  dirs.push(d);
  return d;
}
const storeConfig = (dir) => writeStoreConfig(path.join(dir, 'store.yaml'),
  { cacheDir: path.join(dir, 'disk'), shmDir: path.join(dir, 'shm'), minTokens: 16, stride: 16 });
function modelOf(name) {
  const m = MODELS[name];
  assert.ok(m, `the ${name} model path is not set (run through ctest)`);
  return m;
}

const system = { role: 'system', content: 'You are a helpful assistant who answers in short sentences.' };
const questions = ['hello, what is the water like in the river?', 'tell me a story about a dog',
  'why did the dog run to the river?', 'and then what happened', 'describe the river in three words',
  'say something kind to the dog'];
// Each reply goes back without its last character, so that every turn after
// the first cuts the slot inside the previous reply as rendered.
const backOf = (text) => (text.length > 1 ? text.slice(0, -1) : text);

// One turn on the server under test and on the uncached one: the same reply.
async function both(srv, ref, msgs, what, max = 16) {
  const a = await chat(srv, msgs, { max_tokens: max, temperature: 0 });
  const b = await chat(ref, msgs, { max_tokens: max, temperature: 0 });
  assert.equal(a.status ?? 200, 200);
  assert.deepEqual(a.choices[0].message, b.choices[0].message, `${what}: reply differs from --no-cache-prompt`);
  assert.equal(a.usage.completion_tokens, b.usage.completion_tokens, `${what}: completion_tokens`);
  assert.equal(a.usage.prompt_tokens, b.usage.prompt_tokens, `${what}: prompt_tokens`);
  assert.equal(b.usage.prompt_tokens_details.cached_tokens, 0, `${what}: --no-cache-prompt cached`);
  return a;
}
const restored = (r) => ['store', 'spc', 'copy'].includes(r.cache.mode);

for (const name of Object.keys(MODELS)) {
  test(`${name}: the probe's finding in /props, and a ${questions.length}-turn chat equals --no-cache-prompt`, async () => {
    const model = modelOf(name);
    const cached = await serve(['-m', model, '--ctx', '1024']);
    const uncached = await serve(['-m', model, '--ctx', '1024', '--no-cache-prompt']);
    const p = await getJSON(cached, '/props');
    assert.equal(p.json.kvstash.probe, 'batch-invariant', JSON.stringify(p.json.kvstash));
    assert.equal(p.json.kvstash.exact_mode, 'batch-invariant');
    assert.deepEqual([p.json.kvstash.n_expert, p.json.kvstash.n_expert_used], EXPERTS[name]);
    assert.match(cached.stderr, new RegExp(`experts \\(${EXPERTS[name][1]} per token\\).*probe: a token decoded alone ` +
      'keeps its bits in a batch -> exact mode batch-invariant'));
    const msgs = [system];
    let prev = null;
    for (let i = 0; i < questions.length; i++) {
      msgs.push({ role: 'user', content: questions[i] });
      const a = await both(cached, uncached, msgs, `${name} turn ${i + 1}`, 24);
      assert.ok(a.usage.completion_tokens > 0, `${name} turn ${i + 1}: an empty reply`);
      if (prev) {
        const c = a.usage.prompt_tokens_details.cached_tokens;
        assert.ok(c >= prev.usage.prompt_tokens - 1, `${name} turn ${i + 1}: cached ${c} < previous prompt ` +
          `${prev.usage.prompt_tokens} (${JSON.stringify(a.cache)})`);
      }
      prev = a;
      msgs.push({ role: 'assistant', content: backOf(replyOf(a)) });
    }
    await stop(cached, uncached);
  });
}

// Three sub-agents take turns on two slots with the full store: a conversation
// whose slot the others took comes back from the store or from a copy of the
// slot that holds it (on gpt-oss: at a restorable length), never from a wrong
// state. (How much comes back is the store's business, store.test.mjs: here
// each reply goes back cut, so the finish saves are not prefixes of the next
// prompt and the states found are the stride saves.)
for (const name of Object.keys(MODELS)) {
  test(`${name}: sub-agents on fewer slots come back from the store or a copy, replies equal --no-cache-prompt`, async () => {
    const model = modelOf(name);
    const cfg = await storeConfig(tmp('sub'));
    const cached = await serve(['-m', model, '--ctx', '1024', '--slots', '2', '--config', cfg]);
    const uncached = await serve(['-m', model, '--ctx', '1024', '--no-cache-prompt']);
    const convs = [0, 1, 2].map((k) => [{ role: 'system', content: `You are sub-agent ${k}; you answer in short sentences.` }]);
    let restores = 0;
    for (let turn = 0; turn < 4; turn++) {
      for (let k = 0; k < convs.length; k++) {
        const msgs = convs[k];
        msgs.push({ role: 'user', content: `${questions[(turn + k) % questions.length]} (agent ${k})` });
        const what = `${name} agent ${k} turn ${turn + 1}`;
        const a = await both(cached, uncached, msgs, what);
        const c = a.usage.prompt_tokens_details.cached_tokens;
        if (restored(a)) {
          restores++;
          assert.ok(restorable(name, c), `${what}: ${c} tokens restored (${a.cache.mode}), not a restorable length`);
        }
        msgs.push({ role: 'assistant', content: backOf(replyOf(a)) });
      }
    }
    assert.ok(restores > 0, `${name}: no turn restored from the store or a copy`);
    await settleStore(cached);
    await stop(cached, uncached);
  });
}

// A new process for every turn: the first request it serves restores the
// conversation from the persistent store (disk and shm tiers).
for (const name of Object.keys(MODELS)) {
  test(`${name}: a restarted server restores the conversation from the store`, async () => {
    const model = modelOf(name);
    const cfg = await storeConfig(tmp('restart'));
    const uncached = await serve(['-m', model, '--ctx', '1024', '--no-cache-prompt']);
    const msgs = [system];
    let prevPrompt = 0;
    for (let turn = 0; turn < 3; turn++) {
      const srv = await serve(['-m', model, '--ctx', '1024', '--slots', '1', '--config', cfg]);
      msgs.push({ role: 'user', content: `${questions[turn]} ${'Tell me more about the river and the dog. '.repeat(4)}` });
      const what = `${name} turn ${turn + 1}`;
      const a = await both(srv, uncached, msgs, what);
      const c = a.usage.prompt_tokens_details.cached_tokens;
      if (turn > 0) {
        assert.equal(a.cache.mode, 'store', `${what}: ${JSON.stringify(a.cache)}`);
        assert.ok(restorable(name, c), `${what}: cached ${c}, not a restorable length`);
        // gpt-oss: the previous prompt's last restorable stride boundary
        const want = SWA[name] ? Math.min(prevPrompt, 96) : prevPrompt;
        assert.ok(c >= want, `${what}: cached ${c} < ${want}`);
      }
      prevPrompt = a.usage.prompt_tokens;
      msgs.push({ role: 'assistant', content: backOf(replyOf(a)) });
      await settleStore(srv);
      await stop(srv);
    }
    await stop(uncached);
  });
}

// IMC and SPC (tiny-moe): three sub-agents share a long system prompt on
// three slots; the first prefills it and SPC keeps it, the others restore it;
// from the second round on each agent is routed back to its slot by its
// message hashes.
test('tiny-moe: IMC by message hash and SPC with sub-agents, replies equal --no-cache-prompt', async () => {
  const model = modelOf('tiny-moe');
  const cfg = writeConfig('models:\n  default: { incremental_cache: true, system_prompt_cache: true, cache_min_tokens: 16 }\n');
  const cached = await serve(['-m', model, '--ctx', '1024', '--slots', '3', '--config', cfg]);
  const uncached = await serve(['-m', model, '--ctx', '1024', '--no-cache-prompt']);
  const sys = { role: 'system', content: `${system.content} ${'You help three agents who work on the river and the dog. '.repeat(4)}` };
  const convs = [0, 1, 2].map(() => [sys]);
  const prev = [0, 0, 0];
  for (let round = 0; round < 3; round++) {
    for (let k = 0; k < convs.length; k++) {
      const msgs = convs[k];
      msgs.push({ role: 'user', content: `${questions[(round + k) % questions.length]} (agent ${k})` });
      const what = `agent ${k} round ${round + 1}`;
      const a = await both(cached, uncached, msgs, what);
      const c = a.usage.prompt_tokens_details.cached_tokens;
      if (round === 0 && k > 0) assert.equal(a.cache.mode, 'spc', `${what}: ${JSON.stringify(a.cache)}`);
      if (round > 0) {
        assert.equal(a.cache.mode, 'imc-hash', `${what}: ${JSON.stringify(a.cache)}`);
        assert.ok(c >= prev[k] - 1, `${what}: cached ${c} < previous prompt ${prev[k]}`);
      }
      prev[k] = a.usage.prompt_tokens;
      msgs.push({ role: 'assistant', content: backOf(replyOf(a)) });
    }
  }
  await stop(cached, uncached);
});

// gpt-oss's template renders the history differently once the conversation
// goes on (seed 000's "IMC Non-Deterministic" case): the analysis written
// before a tool call is shown while the call is the last thing the assistant
// did, and dropped once a final answer follows it. The turn after that final
// answer is not an extension of the slot's tokens; IMC keeps the common prefix
// (up to the dropped analysis), cuts the rest and prefills from there, and the
// reply is the uncached one.
const TOOLS = [{ type: 'function', function: { name: 'get_weather', description: 'Current weather of a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
test('tiny-gptoss: IMC keeps the common prefix where the Harmony template drops earlier analysis', async () => {
  const model = modelOf('tiny-gptoss');
  const cfg = writeConfig('models:\n  default: { incremental_cache: true, cache_min_tokens: 16 }\n');
  const cached = await serve(['-m', model, '--ctx', '1024', '--slots', '2', '--config', cfg]);
  const uncached = await serve(['-m', model, '--ctx', '1024', '--no-cache-prompt']);
  const sys = { role: 'system', content: 'You are a weather bot. '.repeat(8) };
  const call = { role: 'assistant', content: 'I should look up the weather in Paris first.',
    tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] };
  const turn2 = [sys, { role: 'user', content: 'What is the weather in Paris?' }, call,
    { role: 'tool', tool_call_id: 'call_1', content: 'sunny, 21 C' }];
  const turn3 = [...turn2, { role: 'assistant', content: 'It is sunny in Paris.' },
    { role: 'user', content: 'And should I take an umbrella?' }];
  const t2 = await postJSON(cached, '/apply-template', { messages: turn2, tools: TOOLS });
  const t3 = await postJSON(cached, '/apply-template', { messages: turn3, tools: TOOLS });
  assert.match(t2.json.prompt, /look up the weather/);
  assert.doesNotMatch(t3.json.prompt, /look up the weather/, 'the template keeps the analysis: no divergence to test');
  const body = (messages) => ({ messages, tools: TOOLS, max_tokens: 8, temperature: 0 });
  const a1 = await chat(cached, turn2.slice(0, 2), { tools: TOOLS, max_tokens: 8, temperature: 0 });
  const a2 = await chat(cached, turn2, { tools: TOOLS, max_tokens: 8, temperature: 0 });
  const a3 = await chat(cached, turn3, { tools: TOOLS, max_tokens: 8, temperature: 0 });
  for (const [a, msgs, what] of [[a1, turn2.slice(0, 2), 'turn 1'], [a2, turn2, 'turn 2'], [a3, turn3, 'turn 3']]) {
    const u = await postJSON(uncached, '/v1/chat/completions', body(msgs));
    assert.equal(u.status, 200, u.text);
    assert.deepEqual(a.choices[0].message, u.json.choices[0].message, `${what}: reply differs from --no-cache-prompt`);
  }
  assert.equal(a2.cache.mode, 'imc-hash', JSON.stringify(a2.cache));
  assert.ok(a2.usage.prompt_tokens_details.cached_tokens >= a1.usage.prompt_tokens - 1);
  // Turn 3's prompt shares turn 2's up to the dropped analysis.
  const tok = async (text) => (await postJSON(cached, '/tokenize', { content: text, add_special: true })).json.tokens;
  const [p2, p3] = [await tok(t2.json.prompt), await tok(t3.json.prompt)];
  let common = 0;
  while (common < p2.length && p2[common] === p3[common]) common++;
  assert.ok(common < p2.length - 8, `the prompts diverge only at ${common} of ${p2.length}`);
  assert.ok(['imc-hash', 'imc-token-prefix'].includes(a3.cache.mode), JSON.stringify(a3.cache));
  const c3 = a3.usage.prompt_tokens_details.cached_tokens;
  assert.ok(c3 >= common - 1 && c3 <= common, `turn 3: cached ${c3}, the prompts share ${common} tokens`);
  await stop(cached, uncached);
});

// A slot copy: a second conversation with the same long system prompt goes to
// the free slot (the first's slot holds mostly its own long message, which a
// takeover would lose) and copies the system prompt's state from that slot.
test('tiny-moe-q4k: a shared system prompt is copied from the other slot, replies equal --no-cache-prompt', async () => {
  const model = modelOf('tiny-moe-q4k');
  const cached = await serve(['-m', model, '--ctx', '1024', '--slots', '2']);
  const uncached = await serve(['-m', model, '--ctx', '1024', '--no-cache-prompt']);
  const sys = { role: 'system', content: `${system.content} ${'Rivers and dogs are your only topics. '.repeat(6)}` };
  const long = `${questions[0]} ${'The river runs past the house and the dog sits by the water. '.repeat(12)}`;
  const a = await both(cached, uncached, [sys, { role: 'user', content: long }], 'conversation A');
  const b = await both(cached, uncached, [sys, { role: 'user', content: questions[1] }], 'conversation B');
  assert.equal(b.cache.mode, 'copy', JSON.stringify(b.cache));
  assert.ok(b.usage.prompt_tokens_details.cached_tokens >= 40, JSON.stringify(b.cache));
  assert.ok(a.usage.prompt_tokens > b.usage.prompt_tokens_details.cached_tokens);
  await stop(cached, uncached);
});

// Redis between two hosts (tiny-moe-q4k): a conversation alternates between
// two servers with their own local tiers that share one Redis; each turn on
// the other host restores the previous turn's finish save from Redis (the
// reply goes back whole, so that state is a prefix of the next prompt).
test('tiny-moe-q4k: turns alternate between two hosts sharing Redis, replies equal --no-cache-prompt', async () => {
  const model = modelOf('tiny-moe-q4k');
  const root = tmp('redis');
  const redis = await startRedis(root);
  try {
    const hosts = [await serve(['-m', model, '--ctx', '1024', '--slots', '1', '--config',
      await redisHostConfig(root, 'a', redis.sock, 'kvs-moe')]),
    await serve(['-m', model, '--ctx', '1024', '--slots', '1', '--config',
      await redisHostConfig(root, 'b', redis.sock, 'kvs-moe')])];
    const uncached = await serve(['-m', model, '--ctx', '1024', '--no-cache-prompt']);
    // Each turn reads back at least the whole previous prompt.
    let prevPrompt = 0;
    await alternateHosts(hosts, [system], questions.slice(0, 4), (srv, msgs, what) => both(srv, uncached, msgs, what),
      (a, what, turn) => {
        if (turn > 0)
          assert.ok(a.usage.prompt_tokens_details.cached_tokens >= prevPrompt, `${what}: ${JSON.stringify(a.cache)}`);
        prevPrompt = a.usage.prompt_tokens;
      });
    const m = await metrics(hosts[1]);
    assert.equal(m.get('kvstash_store_redis_errors_total'), 0);
    await stop(...hosts, uncached);
  } finally {
    redis.kill();
  }
});
