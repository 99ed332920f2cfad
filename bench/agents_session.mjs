// agents_session.mjs — a multi-turn session of each coding-agent CLI against
// `kvstash serve`, as docs/AGENTS.md sets them up, and what the cache served:
// for every request, its prompt and cached tokens (from the server's log).
// Two sessions per agent in the same project and HOME, so the table also shows
// what a new session reuses of the previous one (the agent's system prompt and
// tools).
//
// usage: node bench/agents_session.mjs [--turns N] [--model GGUF] [--out FILE.md]
// Needs `make build clients` (the CLIs come from tests/e2e/package.json).
// Default model: a tiny-agent model with Qwen3-Coder's template (random
// weights: the replies are random words, the prompts are the agents' real ones).
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const BIN = path.join(ROOT, 'build', 'kvstash');
const NPM = path.join(ROOT, 'build', 'e2e-npm', 'node_modules', '.bin');
const args = process.argv.slice(2);
const opt = (name, def) => { const i = args.indexOf(name); return i >= 0 ? args[i + 1] : def; };
const TURNS = Number(opt('--turns', '4'));
const OUT = opt('--out', null);
const MODEL_NAME = 'qwen3-coder';
const dir = mkdtempSync(path.join(os.tmpdir(), 'ks-agents-bench-'));
let model = opt('--model', null);
if (!model) {
  model = path.join(dir, 'agent.gguf');
  execFileSync(BIN, ['mkmodel', '--preset', 'tiny-agent', '--chat-template',
    path.join(ROOT, 'build', 'deps', 'common', 'templates', 'Qwen3-Coder.jinja'), model], { stdio: 'ignore' });
}

function startServer() {
  return new Promise((resolve, reject) => {
    const p = spawn(BIN, ['serve', '-m', model, '--port', '0', '--ctx', '65536', '--slots', '2'], { stdio: ['ignore', 'ignore', 'pipe'] });
    const srv = { proc: p, log: '' };
    p.stderr.on('data', (d) => {
      srv.log += d;
      const m = /kvstash: port=(\d+)/.exec(srv.log);
      if (m && !srv.base) { srv.base = `http://127.0.0.1:${m[1]}`; resolve(srv); }
    });
    p.on('exit', (c) => reject(new Error(`server exited ${c}: ${srv.log}`)));
  });
}

function run(cmd, argv, cwd, env) {
  return new Promise((resolve) => {
    const p = spawn(cmd, argv, { cwd, env: { PATH: process.env.PATH, TERM: 'dumb', ...env }, stdio: ['ignore', 'ignore', 'ignore'] });
    p.on('close', (code) => resolve(code));
  });
}

function served(srv, from) {
  const out = [];
  for (const m of srv.log.slice(from).matchAll(/I http +(\S+) slot \d+: prompt (\d+) tok, cached (\d+) /g))
    out.push({ prompt: +m[2], cached: +m[3] });
  return out;
}

const QUESTIONS = ['list the files here', 'what is in README.txt?', 'and in src/main.c?', 'summarise the project',
  'anything to fix?', 'thanks'];

const AGENTS = {
  'Claude Code': (base, home) => ({
    cmd: path.join(NPM, 'claude'),
    argv: (q, turn) => ['-p', q, '--model', MODEL_NAME, ...(turn > 0 ? ['--continue'] : [])],
    env: { HOME: home, ANTHROPIC_BASE_URL: base, ANTHROPIC_API_KEY: 'none', CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
      CLAUDE_CODE_ATTRIBUTION_HEADER: '0', CLAUDE_CODE_AUTO_COMPACT_WINDOW: '65536' },
  }),
  Codex: (base, home) => {
    const ch = path.join(home, '.codex');
    mkdirSync(ch, { recursive: true });
    writeFileSync(path.join(ch, 'config.toml'), `model = "${MODEL_NAME}"\nmodel_provider = "kvstash"\n\n` +
      `[model_providers.kvstash]\nname = "kvstash"\nbase_url = "${base}/v1"\nwire_api = "responses"\n\n` +
      '[analytics]\nenabled = false\n\n[features]\nplugins = false\n');
    return {
      cmd: path.join(NPM, 'codex'),
      argv: (q, turn) => (turn > 0 ? ['exec', 'resume', '--last', '--skip-git-repo-check', q] : ['exec', '--skip-git-repo-check', q]),
      env: { HOME: home, CODEX_HOME: ch },
    };
  },
  opencode: (base, home) => ({
    cmd: path.join(NPM, 'opencode'),
    argv: (q, turn) => ['run', ...(turn > 0 ? ['--continue'] : []), q],
    env: { HOME: home, OPENCODE_DISABLE_MODELS_FETCH: '1', npm_config_offline: 'true',
      OPENCODE_CONFIG_CONTENT: JSON.stringify({ model: `kvstash/${MODEL_NAME}`, provider: { kvstash: {
        npm: '@ai-sdk/openai-compatible', name: 'kvstash', options: { baseURL: `${base}/v1`, apiKey: 'none' },
        models: { [MODEL_NAME]: { name: MODEL_NAME } } } } }) },
  }),
};

const lines = ['| agent | session | turn | requests | prompt tokens | cached | cached / prompt |', '|---|--:|--:|--:|--:|--:|--:|'];
const srv = await startServer();
try {
  for (const [name, make] of Object.entries(AGENTS)) {
    // One user, one project: the second session starts anew in the same place
    // (the agents put the working directory in their prompts).
    const home = path.join(dir, name.replace(/\W/g, '_'));
    const proj = path.join(home, 'proj');
    mkdirSync(path.join(proj, 'src'), { recursive: true });
    writeFileSync(path.join(proj, 'README.txt'), 'A tiny project.\n');
    writeFileSync(path.join(proj, 'src', 'main.c'), 'int main(void) { return 0; }\n');
    const a = make(srv.base, home);
    for (let session = 1; session <= 2; session++) {
      for (let turn = 0; turn < TURNS; turn++) {
        const from = srv.log.length;
        const code = await run(a.cmd, a.argv(QUESTIONS[turn % QUESTIONS.length], turn), proj, a.env);
        await new Promise((r) => setTimeout(r, 300)); // the last finish line
        const reqs = served(srv, from);
        const p = reqs.reduce((s, q) => s + q.prompt, 0), c = reqs.reduce((s, q) => s + q.cached, 0);
        lines.push(`| ${name} | ${session} | ${turn + 1}${code ? ` (exit ${code})` : ''} | ${reqs.length} | ${p} | ${c} | ${p ? (c / p).toFixed(3) : '-'} |`);
        console.error(lines[lines.length - 1]);
      }
    }
  }
} finally {
  srv.proc.kill('SIGTERM');
  rmSync(dir, { recursive: true, force: true });
}
const table = lines.join('\n') + '\n';
if (OUT) writeFileSync(OUT, table);
console.log(table);
