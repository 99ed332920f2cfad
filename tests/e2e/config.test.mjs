// config.test.mjs — `kvstash serve --config FILE`: a bad file stops the server
// before it listens, with exit code 2 and a message naming the key path
// (src/config/config.h); a good one is applied (per-model cache settings,
// slots), and flags still win.
import { test } from 'node:test';
import { spawn } from 'node:child_process';
import assert from 'node:assert/strict';
import {
  BIN, MODEL, startServer, stopOk, chat, getJSON, writeConfig, runBin, replyOf, until,
} from './lib.mjs';

// `kvstash serve` with a config file that must be refused.
async function refused(yaml) {
  const path = writeConfig(yaml);
  const r = await runBin(['serve', '-m', MODEL, '--port', '0', '--threads', '1', '--ctx', '256', '--config', path],
    { timeoutMs: 20000 });
  assert.doesNotMatch(r.stderr, /listening on/, `the server started with:\n${yaml}`);
  return { ...r, path };
}

const BAD = [
  { what: 'an unknown key', yaml: 'bogus: 1\n', key: 'bogus' },
  { what: 'a nested unknown key', yaml: 'models:\n  default:\n    foo: 1\n', key: 'models.default.foo' },
  { what: 'a wrong type', yaml: 'port: abc\n', key: 'port' },
  { what: 'a nested wrong type', yaml: 'models:\n  default:\n    cache_min_tokens: many\n', key: 'models.default.cache_min_tokens' },
  { what: 'an out-of-range value', yaml: 'slots: 0\n', key: 'slots' },
  { what: 'a boolean that is not one', yaml: 'models:\n  default:\n    incremental_cache: maybe\n', key: 'models.default.incremental_cache' },
  { what: 'a bad tier name', yaml: 'store:\n  reasons:\n    cold: tape\n', key: 'store.reasons.cold' },
  { what: 'an unknown save reason', yaml: 'store:\n  reasons:\n    lukewarm: disk\n', key: 'store.reasons.lukewarm' },
  { what: 'a redis TLS setting of the wrong type', yaml: 'store:\n  tiers:\n    redis:\n      tls:\n        verify: maybe\n',
    key: 'store.tiers.redis.tls.verify' },
];

for (const { what, yaml, key } of BAD) {
  test(`config with ${what} (${key}): exit code 2, stderr names the key path`, async () => {
    const r = await refused(yaml);
    assert.equal(r.code, 2, `exit code ${r.code} (signal ${r.signal}); stderr:\n${r.stderr}`);
    // the key path, quoted, so "slots" is not found inside another word
    assert.match(r.stderr, new RegExp(`'${key.replace(/\./g, '\\.')}'`), `stderr does not name '${key}':\n${r.stderr}`);
    assert.ok(r.stderr.includes(r.path), `stderr does not name the file:\n${r.stderr}`);
    assert.match(r.stderr, /line \d+/, 'stderr gives the line');
  });
}

test('a config file that is not YAML, or does not exist: exit code 2 and the file named', async () => {
  const r = await refused('slots: [1\n');
  assert.equal(r.code, 2, r.stderr);
  assert.ok(r.stderr.includes(r.path), r.stderr);
  assert.match(r.stderr, /syntax/i);
  const missing = r.path + '.missing';
  const m = await runBin(['serve', '-m', MODEL, '--port', '0', '--config', missing], { timeoutMs: 20000 });
  assert.equal(m.code, 2, m.stderr);
  assert.ok(m.stderr.includes(missing), m.stderr);
});

// The start line and the cache line of a running server.
async function startedWith(yaml, args = []) {
  const srv = await startServer(['--ctx', '512', '--config', writeConfig(yaml), ...args], { defaults: false });
  const line = await until(() => /cache: prompt \S+, imc \S+, spc \S+, store .*/.exec(srv.stderr)?.[0], 'the cache line', 10000);
  const start = /listening on .*\((model .*)\)/.exec(srv.stderr)[1];
  return { srv, line, start };
}

test('models.default.incremental_cache: true turns IMC on (start log, and a second turn is an imc-hash hit)', async () => {
  const { srv, line } = await startedWith('models:\n  default:\n    incremental_cache: true\n');
  try {
    assert.match(line, /imc on/);
    assert.match(line, /spc off/);
    const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'say one word' }];
    const r1 = await chat(srv, msgs);
    msgs.push({ role: 'assistant', content: replyOf(r1) }, { role: 'user', content: 'another' });
    const r2 = await chat(srv, msgs);
    assert.equal(r2.cache.mode, 'imc-hash', JSON.stringify(r2.cache));
  } finally {
    await stopOk(srv);
  }
});

test('models.default.system_prompt_cache: true turns SPC on; without the key both caches are off', async () => {
  let { srv, line } = await startedWith('models:\n  default:\n    system_prompt_cache: true\n');
  try {
    assert.match(line, /imc off, spc on/);
  } finally {
    await stopOk(srv);
  }
  ({ srv, line } = await startedWith('log: info\n'));
  try {
    assert.match(line, /prompt on, imc off, spc off/);
  } finally {
    await stopOk(srv);
  }
});

test('the models entry named like the model (general.name) wins over the file name and default', async () => {
  // the tiny model's general.name is kvstash-tiny; its file is tiny.gguf
  const { srv, line } = await startedWith(
    'models:\n  default:\n    system_prompt_cache: true\n  tiny:\n    system_prompt_cache: true\n' +
    '  kvstash-tiny:\n    incremental_cache: true\n');
  try {
    assert.match(line, /imc on, spc off/);
  } finally {
    await stopOk(srv);
  }
});

test('slots: the config sets them, a models entry overrides the top level, --slots wins over both', async () => {
  let { srv, start } = await startedWith('slots: 3\n');
  try {
    assert.match(start, /, 3 slots,/);
    const m = await getJSON(srv, '/v1/models');
    assert.equal(m.json.data[0].meta.n_slots, 3);
  } finally {
    await stopOk(srv);
  }
  ({ srv, start } = await startedWith('slots: 3\nmodels:\n  kvstash-tiny:\n    slots: 2\n'));
  try {
    assert.match(start, /, 2 slots,/);
  } finally {
    await stopOk(srv);
  }
  ({ srv, start } = await startedWith('slots: 3\nmodels:\n  default:\n    slots: 2\n', ['--slots', '1']));
  try {
    assert.match(start, /, 1 slots?,/);
  } finally {
    await stopOk(srv);
  }
});

test('slots of a models entry that does not apply are not used', async () => {
  // kvstash-tiny (general.name) is the entry that applies; it sets no slots,
  // so the top-level value holds. The file-name entry "tiny" must not leak.
  const { srv, start, line } = await startedWith(
    'slots: 2\nmodels:\n  tiny:\n    slots: 3\n  kvstash-tiny:\n    incremental_cache: true\n');
  try {
    assert.match(line, /imc on/);
    assert.match(start, /, 2 slots,/, `start line: ${start}`);
  } finally {
    await stopOk(srv);
  }
});

test('port: 0 in the config picks a free port, as --port 0 does (docs/SERVER.md)', async () => {
  const path = writeConfig('port: 0\n');
  // no --port flag (startServer always gives one): the config's port applies
  const proc = spawn(BIN, ['serve', '-m', MODEL, '--threads', '1', '--ctx', '256', '--config', path],
    { stdio: ['ignore', 'ignore', 'pipe'], env: { ...process.env, GGML_NO_BACKTRACE: '1' } });
  let stderr = '';
  proc.stderr.on('data', (d) => { stderr += d; });
  const exited = new Promise((res) => proc.on('exit', (code) => res(code)));
  try {
    const port = await until(() => {
      if (proc.exitCode !== null) throw new Error(`exited with ${proc.exitCode}:\n${stderr}`);
      return /kvstash: port=(\d+)/.exec(stderr)?.[1];
    }, 'the port line', 20000);
    assert.ok(Number(port) > 0);
    const h = await fetch(`http://127.0.0.1:${port}/health`);
    assert.equal(h.status, 200);
  } finally {
    if (proc.exitCode === null) proc.kill('SIGTERM');
    await exited;
  }
});
