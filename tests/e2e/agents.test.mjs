// agents.test.mjs — the coding agents people run, as a user runs them: the
// real CLIs from the npm registry at the versions pinned in
// tests/e2e/package.json (Claude Code 2.1.332 and, one wire format back,
// 2.1.197; Codex 0.171.0; opencode 1.18.33), non-interactive, against the
// real server, with nothing but the settings docs/AGENTS.md gives every
// user. Each CLI makes a tool round trip: the model asks for a tool, the CLI
// runs it and sends its result, the model answers; then a second turn
// continues the session. No request may be refused, and every request after
// the first of a session must read >= 90% of its prompt from the cache (the
// request right after a tool call: all of the previous prompt, the prefix
// property across turns).
//
// The model is tiny-agent (lib.mjs agentModel): random weights, so its replies
// are random words and it never calls a tool of its own accord. A test-side
// proxy (toolproxy.mjs) stands between the CLI and the server: every request
// reaches the server and is served in full, and for the requests each test's
// script picks, the proxy answers with a tool call in the API's own wire
// format instead of the server's words. Claude Code's script first calls
// ToolSearch for a deferred tool (WebFetch), so its tool_reference comes back
// and the deferred tool joins the request (docs/AGENTS.md). Also the Vercel AI
// SDK (ai 6, @ai-sdk/openai-compatible): a streamed three-step tool loop.
// Each CLI runs in a fresh HOME and a scratch project, offline but for the
// server.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  startServer, stopOk, importClient, agentModel, templateModel, servedSince, refusedSince, until, CLIENTS_DIR,
  writeConfig,
} from './lib.mjs';
import { startToolProxy } from './toolproxy.mjs';

const MODEL = 'qwen3-coder'; // what a user of a local model passes: a name the agents do not know
const README = 'A tiny project for the agent tests.\n';
let srv, dir;

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'ks-agents-'));
  srv = await startServer(['-m', agentModel(dir), '--ctx', '65536', '--slots', '2']);
});
after(async () => {
  if (srv) await stopOk(srv);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const bin = (name) => path.join(CLIENTS_DIR, 'node_modules', '.bin', name);
// Two Claude Code releases side by side: each package's own native binary.
const claudeBin = (pkg) => path.join(CLIENTS_DIR, 'node_modules', ...pkg.split('/'), 'bin', 'claude.exe');

// A scratch project and HOME for one agent.
function sandbox(name) {
  const root = path.join(dir, name);
  const home = path.join(root, 'home'), proj = path.join(root, 'proj');
  mkdirSync(home, { recursive: true });
  mkdirSync(path.join(proj, 'src'), { recursive: true });
  writeFileSync(path.join(proj, 'README.txt'), README);
  writeFileSync(path.join(proj, 'src', 'main.c'), 'int main(void) { return 0; }\n');
  return { home, proj };
}

// Runs an agent CLI to its end: { code, stdout, stderr }. Only PATH and the
// given variables are in its environment.
function run(cmd, args, { cwd, env, timeoutMs = 300000 }) {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { cwd, env: { PATH: process.env.PATH, TERM: 'dumb', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '', stderr = '';
    p.stdout.on('data', (d) => { stdout += d; });
    p.stderr.on('data', (d) => { stderr += d; });
    const timer = setTimeout(() => { p.kill('SIGKILL'); reject(new Error(`${cmd} ${args.join(' ')}: no end after ${timeoutMs} ms\nstdout: ${stdout}\nstderr: ${stderr.slice(-3000)}`)); }, timeoutMs);
    p.on('error', (e) => { clearTimeout(timer); reject(e); });
    p.on('close', (code) => { clearTimeout(timer); resolve({ code, stdout, stderr }); });
  });
}

const ok = (r, what) => assert.equal(r.code, 0, `${what}: exit ${r.code}\nstdout: ${r.stdout.slice(-2000)}\nstderr: ${r.stderr.slice(-3000)}`);

// A script for the proxy: the agent's main requests (those that carry the
// tool `marker`; title and other side requests carry none) are answered with
// these calls in turn, then passed through. steps: [[{name, input}], ...].
function script(api, marker, steps) {
  const names = (b) => (b.tools ?? []).map((t) => t.name ?? t.function?.name);
  const left = [...steps];
  return { plan: ({ api: a, body }) => (a === api && names(body).includes(marker) && left.length ? left.shift() : null), left };
}

// The session's requests as the server served them, and the proxy's view of
// them: every one 200, nothing refused; each after the first reads >= 90% of
// its prompt from the cache, and each after a scripted tool call all of the
// prompt before it (the turns' tokens are a prefix of the next turn's).
async function assertSession(t, px, from, what, n_scripted) {
  const main = px.log.filter((e) => e.api);
  await until(() => servedSince(srv, from).length >= main.length, `${what}: ${main.length} requests in the log`).catch(() => {});
  const served = servedSince(srv, from);
  t.diagnostic(`${what}: ${JSON.stringify(served)}`);
  assert.deepEqual(px.log.filter((e) => e.status !== 200).map((e) => `${e.method} ${e.path} -> ${e.status}`), [],
    `${what}: a request was not answered 200`);
  assert.deepEqual(refusedSince(srv, from), [], `${what}: requests were refused`);
  assert.equal(px.log.filter((e) => e.scripted).length, n_scripted, `${what}: the scripted tool calls`);
  assert.equal(served.length, main.length, `${what}: ${JSON.stringify(served)}`);
  // A side request (a title) may come first: the cached ones are the main conversation's later requests.
  const conv = main.map((e, i) => ({ ...e, served: served[i] })).filter((e) => e.body.tools?.length);
  for (let i = 1; i < conv.length; i++) {
    const { prompt, cached } = conv[i].served;
    assert.ok(cached >= 0.9 * prompt, `${what}: request ${i + 1} read ${cached} of ${prompt} tokens from the cache`);
    if (conv[i - 1].scripted)
      assert.ok(cached >= conv[i - 1].served.prompt,
        `${what}: request ${i + 1} after a tool call re-prefilled the previous prompt: ${JSON.stringify(served)}`);
  }
  return conv;
}

// The second turn's first request: the longest prompt the turn sent (an
// agent may add small side requests) must be read >= 90% from the cache.
function assertCachedTurn(t, reqs, what) {
  assert.ok(reqs.length > 0, `${what}: no request reached the server`);
  const main = reqs.reduce((a, b) => (b.prompt > a.prompt ? b : a));
  t.diagnostic(`${what}: turn 2 ${JSON.stringify(reqs)}`);
  assert.ok(main.cached >= 0.9 * main.prompt,
    `${what}: the second turn read ${main.cached} of ${main.prompt} prompt tokens from the cache: ${JSON.stringify(reqs)}`);
}

// The blocks of a Messages request's last user message.
const lastUserBlocks = (b) => {
  const m = [...b.messages].reverse().find((x) => x.role === 'user');
  return Array.isArray(m?.content) ? m.content : [];
};

function claudeEnv(home, base) {
  return {
    HOME: home,
    ANTHROPIC_BASE_URL: base,
    ANTHROPIC_API_KEY: 'none',
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', // no telemetry, no title request (docs/AGENTS.md)
    CLAUDE_CODE_ATTRIBUTION_HEADER: '0',           // a stable prompt start across sessions (docs/AGENTS.md)
    CLAUDE_CODE_AUTO_COMPACT_WINDOW: '65536',      // the server's context (docs/AGENTS.md)
  };
}

test('Claude Code 2.1.332: ToolSearch loads a deferred tool, Read runs, then --continue; all from the cache', async (t) => {
  const { home, proj } = sandbox('claude');
  const readme = path.join(proj, 'README.txt');
  const sc = script('messages', 'ToolSearch', [
    [{ name: 'ToolSearch', input: { query: 'select:WebFetch', max_results: 5 } }],
    [{ name: 'Read', input: { file_path: readme } }],
  ]);
  const px = await startToolProxy(srv, sc.plan);
  try {
    const from = srv.stderr.length;
    const r1 = await run(claudeBin('@anthropic-ai/claude-code'), ['-p', 'what is in README.txt?', '--model', MODEL],
      { cwd: proj, env: claudeEnv(home, px.base) });
    ok(r1, 'claude turn 1');
    assert.equal(sc.left.length, 0, 'Claude Code sent fewer requests than the script has tool calls');
    const conv = await assertSession(t, px, from, 'claude', 2);
    assert.ok(conv.length >= 3, `three requests: ${conv.length}`);
    // Tool search as Claude Code 2.1.332 speaks it: deferred tools, a tool_reference.
    const deferred = (b) => b.tools.filter((x) => x.defer_loading).map((x) => x.name);
    assert.ok(!deferred(conv[0].body).includes('WebFetch'), 'WebFetch is not in the first request');
    assert.ok(deferred(conv[1].body).includes('WebFetch'), `the loaded tool comes back deferred: ${deferred(conv[1].body)}`);
    const ref = lastUserBlocks(conv[1].body).find((x) => x.type === 'tool_result');
    assert.deepEqual(ref?.content, [{ type: 'tool_reference', tool_name: 'WebFetch' }]);
    // Read ran: the file's text is in the result the next request carries.
    const res = lastUserBlocks(conv[2].body).find((x) => x.type === 'tool_result');
    assert.ok(JSON.stringify(res?.content ?? '').includes('A tiny project'), `Read's result: ${JSON.stringify(res)}`);
    const mid = srv.stderr.length;
    const r2 = await run(claudeBin('@anthropic-ai/claude-code'), ['-p', 'thanks, and src/main.c?', '--continue', '--model', MODEL],
      { cwd: proj, env: claudeEnv(home, px.base) });
    ok(r2, 'claude turn 2');
    assertCachedTurn(t, servedSince(srv, mid), 'claude');
    assert.deepEqual(refusedSince(srv, from), [], 'Claude Code\'s requests were refused');
  } finally {
    await px.close();
  }
});

test('Claude Code 2.1.197: Read runs, then --continue; all from the cache', async (t) => {
  const { home, proj } = sandbox('claude-2.1.197');
  const sc = script('messages', 'Read', [[{ name: 'Read', input: { file_path: path.join(proj, 'README.txt') } }]]);
  const px = await startToolProxy(srv, sc.plan);
  try {
    const from = srv.stderr.length;
    const r1 = await run(claudeBin('claude-code-2.1.197'), ['-p', 'what is in README.txt?', '--model', MODEL],
      { cwd: proj, env: claudeEnv(home, px.base) });
    ok(r1, 'claude 2.1.197 turn 1');
    assert.equal(sc.left.length, 0);
    const conv = await assertSession(t, px, from, 'claude 2.1.197', 1);
    assert.ok(conv.length >= 2);
    const res = lastUserBlocks(conv[1].body).find((x) => x.type === 'tool_result');
    assert.ok(JSON.stringify(res?.content ?? '').includes('A tiny project'), `Read's result: ${JSON.stringify(res)}`);
    const mid = srv.stderr.length;
    const r2 = await run(claudeBin('claude-code-2.1.197'), ['-p', 'thanks', '--continue', '--model', MODEL],
      { cwd: proj, env: claudeEnv(home, px.base) });
    ok(r2, 'claude 2.1.197 turn 2');
    assertCachedTurn(t, servedSince(srv, mid), 'claude 2.1.197');
  } finally {
    await px.close();
  }
});

function codexConfig(home, base) {
  const codexHome = path.join(home, '.codex');
  mkdirSync(codexHome, { recursive: true });
  // docs/AGENTS.md: a provider for the server, Responses wire API; analytics
  // and the plugin sync off (they reach OpenAI's and GitHub's hosts).
  writeFileSync(path.join(codexHome, 'config.toml'), [
    `model = "${MODEL}"`,
    'model_provider = "kvstash"',
    '',
    '[model_providers.kvstash]',
    'name = "kvstash"',
    `base_url = "${base}/v1"`,
    'wire_api = "responses"',
    '',
    '[analytics]',
    'enabled = false',
    '',
    '[features]',
    'plugins = false',
    ''].join('\n'));
  return { HOME: home, CODEX_HOME: codexHome };
}

test('Codex 0.171.0: a shell command runs, then exec resume --last; all from the cache', async (t) => {
  const { home, proj } = sandbox('codex');
  const sc = script('responses', 'exec_command', [[{ name: 'exec_command', input: { cmd: 'cat README.txt' } }]]);
  const px = await startToolProxy(srv, sc.plan);
  try {
    const env = codexConfig(home, px.base);
    const from = srv.stderr.length;
    const r1 = await run(bin('codex'), ['exec', '--skip-git-repo-check', 'what is in README.txt?'], { cwd: proj, env });
    ok(r1, 'codex turn 1');
    assert.equal(sc.left.length, 0);
    const conv = await assertSession(t, px, from, 'codex', 1);
    assert.ok(conv.length >= 2);
    const out = conv[1].body.input.find((x) => x.type === 'function_call_output');
    assert.ok(out, `the call's output comes back: ${JSON.stringify(conv[1].body.input.map((x) => x.type))}`);
    const mid = srv.stderr.length;
    const r2 = await run(bin('codex'), ['exec', 'resume', '--last', '--skip-git-repo-check', 'thanks'], { cwd: proj, env });
    ok(r2, 'codex turn 2');
    assertCachedTurn(t, servedSince(srv, mid), 'codex');
  } finally {
    await px.close();
  }
});

test('opencode: read runs, then run --continue; all from the cache', async (t) => {
  const { home, proj } = sandbox('opencode');
  const sc = script('chat', 'read', [[{ name: 'read', input: { filePath: path.join(proj, 'README.txt') } }]]);
  const px = await startToolProxy(srv, sc.plan);
  try {
    const env = {
      HOME: home,
      // docs/AGENTS.md: an OpenAI-compatible provider for the server.
      OPENCODE_CONFIG_CONTENT: JSON.stringify({
        model: `kvstash/${MODEL}`,
        provider: { kvstash: { npm: '@ai-sdk/openai-compatible', name: 'kvstash',
          options: { baseURL: `${px.base}/v1`, apiKey: 'none' }, models: { [MODEL]: { name: MODEL } } } },
      }),
      OPENCODE_DISABLE_MODELS_FETCH: '1', // its model catalogue is fetched from its own host otherwise
      // Offline for the test: opencode starts a background npm install of its
      // plugin package on every run (it does not wait for it); let it fail at once.
      npm_config_offline: 'true',
    };
    const from = srv.stderr.length;
    const r1 = await run(bin('opencode'), ['run', 'what is in README.txt?'], { cwd: proj, env });
    ok(r1, 'opencode turn 1');
    assert.equal(sc.left.length, 0);
    const conv = await assertSession(t, px, from, 'opencode', 1);
    assert.ok(conv.length >= 2);
    const res = conv[1].body.messages.find((m) => m.role === 'tool');
    assert.ok(JSON.stringify(res?.content ?? '').includes('A tiny project'), `read's result: ${JSON.stringify(res)}`);
    const mid = srv.stderr.length;
    const r2 = await run(bin('opencode'), ['run', '--continue', 'thanks'], { cwd: proj, env });
    ok(r2, 'opencode turn 2');
    assertCachedTurn(t, servedSince(srv, mid), 'opencode');
  } finally {
    await px.close();
  }
});

// Qwen2.5's template here: its required-tool grammar starts the output with
// the call (Qwen3-Coder's lets text come first, and random weights then write
// words until max_tokens).
test('the AI SDK: a streamed three-step tool loop; each step reads the earlier ones from the cache', async () => {
  const { streamText, tool, stepCountIs, jsonSchema } = await importClient('ai');
  const { createOpenAICompatible } = await importClient('@ai-sdk/openai-compatible');
  const srv = await startServer(['-m', templateModel(dir), '--ctx', '4096', '--slots', '2']);
  try {
    await toolLoop(srv, streamText, tool, stepCountIs, jsonSchema, createOpenAICompatible);
  } finally {
    await stopOk(srv);
  }
});

async function toolLoop(srv, streamText, tool, stepCountIs, jsonSchema, createOpenAICompatible) {
  const provider = createOpenAICompatible({ name: 'kvstash', baseURL: `${srv.base}/v1`, apiKey: 'none' });
  let calls = 0;
  const from = srv.stderr.length;
  const result = streamText({
    model: provider(MODEL),
    system: 'You are a weather assistant. Use the tool for every city.',
    prompt: 'What is the weather in Paris, Rome and Oslo?',
    temperature: 0,
    maxOutputTokens: 256,
    toolChoice: 'required', // random weights call no tool of their own accord
    // one call per step (the provider passes its own options through to the body)
    providerOptions: { kvstash: { parallel_tool_calls: false } },
    tools: {
      get_weather: tool({
        description: 'The current weather of a city',
        inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string', enum: ['Paris', 'Rome', 'Oslo'] } },
          required: ['city'], additionalProperties: false }),
        execute: async ({ city }) => { calls++; return { city, sky: 'clear', celsius: 21 }; },
      }),
    },
    stopWhen: stepCountIs(3),
  });
  let chunks = 0;
  for await (const part of result.fullStream) { if (part.type === 'error') throw part.error; chunks++; }
  const steps = await result.steps;
  assert.equal(steps.length, 3, JSON.stringify(steps.map((x) => x.finishReason)));
  assert.equal(calls, 3);
  assert.ok(chunks > 3);
  // The server logs each request before its reply's last bytes, but the
  // log comes through another pipe than the reply: wait for it to arrive.
  await until(() => servedSince(srv, from).length >= 3, 'three requests in the log').catch(() => {});
  const reqs = servedSince(srv, from);
  assert.equal(reqs.length, 3, JSON.stringify(reqs));
  for (let i = 1; i < 3; i++)
    assert.ok(reqs[i].cached >= reqs[i - 1].prompt, `step ${i + 1} re-prefilled step ${i}'s prompt: ${JSON.stringify(reqs)}`);
  assert.deepEqual(refusedSince(srv, from), []);
}

// Claude Code with a main and a small model (docs/AGENTS.md "A main and a
// small model"): one server of two models (docs/SERVER.md "Several
// models"), the main one under the name the user passes, the small one under
// Claude Code's haiku alias (ANTHROPIC_DEFAULT_HAIKU_MODEL). The script has
// the main model start a sub-agent on "haiku" (the Agent tool's model
// field, as a user's agent definitions do): its requests go to the small
// model, the main conversation's to the main one, each from its own cache.
test('Claude Code 2.1.332 with a main and a small model: a haiku sub-agent runs on the small one', async (t) => {
  const { home, proj } = sandbox('claude-two-models');
  const small = path.join(dir, 'small-agent.gguf');
  execFileSync(process.env.KS_BIN, ['mkmodel', '--preset', 'tiny-agent', '--seed', '2', '--chat-template',
    path.join(process.env.KS_TEMPLATES_DIR, 'Qwen3-Coder.jinja'), small], { stdio: 'ignore' });
  const cfg = writeConfig(`models:
  main: { path: ${agentModel(dir)}, aliases: [${MODEL}, "claude-*sonnet*", "claude-*opus*"] }
  small: { path: ${small}, aliases: ["claude-*haiku*"] }
default_model: main
`);
  const two = await startServer(['--config', cfg, '--ctx', '65536', '--slots', '2'], { model: null });
  const sc = script('messages', 'Agent', [
    [{ name: 'Agent', input: { description: 'look around', prompt: 'list the files of this project',
      subagent_type: 'general-purpose', model: 'haiku' } }],
  ]);
  const px = await startToolProxy(two, sc.plan);
  try {
    const from = two.stderr.length;
    const r = await run(claudeBin('@anthropic-ai/claude-code'), ['-p', 'what is in this project?', '--model', MODEL,
      '--allowedTools', 'Agent'], { cwd: proj, env: { ...claudeEnv(home, px.base), ANTHROPIC_DEFAULT_HAIKU_MODEL: 'claude-haiku-4-5' } });
    ok(r, 'claude with two models');
    assert.equal(sc.left.length, 0, 'the main model never got to start the sub-agent');
    const main = px.log.filter((e) => e.api);
    await until(() => servedSince(two, from).length >= main.length, 'every request in the log').catch(() => {});
    const served = servedSince(two, from);
    t.diagnostic(`claude two models: ${JSON.stringify(served)}`);
    assert.deepEqual(px.log.filter((e) => e.status !== 200).map((e) => `${e.path} -> ${e.status}`), []);
    assert.deepEqual(refusedSince(two, from), [], 'requests were refused');
    assert.equal(served.length, main.length, JSON.stringify(served));
    // Each request went to the model its name routes to.
    main.forEach((e, i) => assert.equal(served[i].model, /haiku/.test(e.body.model) ? 'small' : 'main',
      `request ${i + 1} (${e.body.model}) served by ${served[i].model}`));
    assert.ok(served.some((s) => s.model === 'small'), `the sub-agent's requests: ${JSON.stringify(served)}`);
    assert.ok(served.some((s) => s.model === 'main'));
    assert.match(two.stderr, /models small: loaded/);
    assert.match(two.stderr, /models main: loaded/);
    // The main conversation after the sub-agent returned: from the main model's cache.
    const mains = served.filter((s) => s.model === 'main');
    const last = mains[mains.length - 1];
    assert.ok(mains.length >= 2 && last.cached >= 0.9 * last.prompt, `main model's last request: ${JSON.stringify(mains)}`);
  } finally {
    await px.close();
    await stopOk(two);
  }
});
