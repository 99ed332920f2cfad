// agents.test.mjs — the coding agents people run, as a user runs them: the
// real CLIs from the npm registry at the versions pinned in
// tests/e2e/package.json (Claude Code 2.1.197, the last release for Node 20;
// Codex 0.169.0; opencode 1.18.33), non-interactive, two turns each against
// the real server, with nothing but the settings docs/AGENTS.md gives every
// user. Each run must end well, the second turn's request must read >= 90%
// of its prompt from the cache, and no request may be refused. Also the
// Vercel AI SDK (ai 6, @ai-sdk/openai-compatible): a streamed three-step tool
// loop.
//
// The model is tiny-agent (lib.mjs agentModel): random weights, so the
// replies are random words and the agents rarely call a tool; what is tested
// is that the agents' real requests are served and cached. Each CLI runs in
// a fresh HOME and a scratch project, offline but for the server.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import {
  startServer, stopOk, importClient, agentModel, templateModel, servedSince, refusedSince, until, CLIENTS_DIR,
} from './lib.mjs';

const MODEL = 'qwen3-coder'; // what a user of a local model passes: a name the agents do not know
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

// A scratch project and HOME for one agent.
function sandbox(name) {
  const root = path.join(dir, name);
  const home = path.join(root, 'home'), proj = path.join(root, 'proj');
  mkdirSync(home, { recursive: true });
  mkdirSync(path.join(proj, 'src'), { recursive: true });
  writeFileSync(path.join(proj, 'README.txt'), 'A tiny project for the agent tests.\n');
  writeFileSync(path.join(proj, 'src', 'main.c'), 'int main(void) { return 0; }\n');
  return { home, proj };
}

// Runs an agent CLI to its end: { code, stdout, stderr }. Only PATH and the
// given variables are in its environment.
function run(cmd, args, { cwd, env, timeoutMs = 240000 }) {
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

// The second turn's first request: the longest prompt the turn sent (an
// agent may add small side requests) must be read >= 90% from the cache.
function assertCachedTurn(t, turn1, reqs, what) {
  assert.ok(reqs.length > 0, `${what}: no request reached the server`);
  const main = reqs.reduce((a, b) => (b.prompt > a.prompt ? b : a));
  t.diagnostic(`${what}: turn 1 ${JSON.stringify(turn1)}; turn 2 ${JSON.stringify(reqs)}`);
  assert.ok(main.cached >= 0.9 * main.prompt,
    `${what}: the second turn read ${main.cached} of ${main.prompt} prompt tokens from the cache: ${JSON.stringify(reqs)}`);
  return main;
}

test('Claude Code: claude -p, then --continue; the second turn reads its prompt from the cache', async (t) => {
  const { home, proj } = sandbox('claude');
  const env = {
    HOME: home,
    ANTHROPIC_BASE_URL: srv.base,
    ANTHROPIC_API_KEY: 'none',
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', // no telemetry, no title request (docs/AGENTS.md)
    CLAUDE_CODE_ATTRIBUTION_HEADER: '0',           // a stable prompt start across sessions (docs/AGENTS.md)
  };
  const from = srv.stderr.length;
  const r1 = await run(bin('claude'), ['-p', 'list the files here', '--model', MODEL], { cwd: proj, env });
  ok(r1, 'claude turn 1');
  assert.ok(r1.stdout.trim().length > 0, 'claude printed no reply');
  const turn1 = servedSince(srv, from);
  assert.ok(turn1.length >= 1 && turn1[0].prompt > 5000, `a real agent prompt: ${JSON.stringify(turn1)}`);
  const mid = srv.stderr.length;
  const r2 = await run(bin('claude'), ['-p', 'and what is in README.txt?', '--continue', '--model', MODEL], { cwd: proj, env });
  ok(r2, 'claude turn 2');
  assertCachedTurn(t, turn1, servedSince(srv, mid), 'claude');
  assert.deepEqual(refusedSince(srv, from), [], 'Claude Code\'s requests were refused');
});

test('Codex: codex exec, then exec resume --last; the second turn reads its prompt from the cache', async (t) => {
  const { home, proj } = sandbox('codex');
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
    `base_url = "${srv.base}/v1"`,
    'wire_api = "responses"',
    '',
    '[analytics]',
    'enabled = false',
    '',
    '[features]',
    'plugins = false',
    ''].join('\n'));
  const env = { HOME: home, CODEX_HOME: codexHome };
  const from = srv.stderr.length;
  const r1 = await run(bin('codex'), ['exec', '--skip-git-repo-check', 'list the files here'], { cwd: proj, env });
  ok(r1, 'codex turn 1');
  const turn1 = servedSince(srv, from);
  assert.ok(turn1.length >= 1 && turn1[0].prompt > 3000, `a real agent prompt: ${JSON.stringify(turn1)}`);
  const mid = srv.stderr.length;
  const r2 = await run(bin('codex'), ['exec', 'resume', '--last', '--skip-git-repo-check', 'and what is in README.txt?'],
    { cwd: proj, env });
  ok(r2, 'codex turn 2');
  assertCachedTurn(t, turn1, servedSince(srv, mid), 'codex');
  assert.deepEqual(refusedSince(srv, from), [], 'Codex\'s requests were refused');
});

test('opencode: opencode run, then run --continue; the second turn reads its prompt from the cache', async (t) => {
  const { home, proj } = sandbox('opencode');
  const env = {
    HOME: home,
    // docs/AGENTS.md: an OpenAI-compatible provider for the server.
    OPENCODE_CONFIG_CONTENT: JSON.stringify({
      model: `kvstash/${MODEL}`,
      provider: { kvstash: { npm: '@ai-sdk/openai-compatible', name: 'kvstash',
        options: { baseURL: `${srv.base}/v1`, apiKey: 'none' }, models: { [MODEL]: { name: MODEL } } } },
    }),
    OPENCODE_DISABLE_MODELS_FETCH: '1', // its model catalogue is fetched from its own host otherwise
    // Offline for the test: opencode starts a background npm install of its
    // plugin package on every run (it does not wait for it); let it fail at once.
    npm_config_offline: 'true',
  };
  const from = srv.stderr.length;
  const r1 = await run(bin('opencode'), ['run', 'list the files here'], { cwd: proj, env });
  ok(r1, 'opencode turn 1');
  const turn1 = servedSince(srv, from);
  assert.ok(turn1.some((q) => q.prompt > 3000), `a real agent prompt: ${JSON.stringify(turn1)}`);
  const mid = srv.stderr.length;
  const r2 = await run(bin('opencode'), ['run', '--continue', 'and what is in README.txt?'], { cwd: proj, env });
  ok(r2, 'opencode turn 2');
  assertCachedTurn(t, turn1, servedSince(srv, mid), 'opencode');
  assert.deepEqual(refusedSince(srv, from), [], 'opencode\'s requests were refused');
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
