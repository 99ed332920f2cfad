// cli.test.mjs — `kvstash serve` start-up: flags, exit codes, port conflicts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { BIN, MODEL, requireEnv, startServer, stopOk, getJSON } from './lib.mjs';

function run(args) {
  requireEnv();
  const r = spawnSync(BIN, ['serve', ...args], { encoding: 'utf8', timeout: 60000, env: { ...process.env, GGML_NO_BACKTRACE: '1' } });
  return { code: r.status, stderr: r.stderr, stdout: r.stdout };
}

test('--help prints the usage and exits 0', () => {
  const r = run(['--help']);
  assert.equal(r.code, 0);
  assert.match(r.stdout, /usage: kvstash serve -m MODEL/);
  for (const f of ['--host', '--port', '--slots', '--ctx', '--threads', '--batch', '--no-cache-prompt', '--api-key',
    '--max-queue', '--config', '--log', '--cache-ram', '--cache-dir', '--timeout', '--header-timeout',
    '--max-connections', '--max-connections-per-client']) assert.ok(r.stdout.includes(f), f);
});

test('usage errors exit 2 with a message', () => {
  for (const [args, msg] of [
    [[], /no model/],
    [['-m', MODEL, '--bogus'], /unknown option '--bogus'/],
    [['-m', MODEL, '--port', '70000'], /--port must be an integer/],
    [['-m', MODEL, '--slots', '0'], /--slots must be an integer/],
    // --max-queue 0 used to start a server with a queue of 64 (sched.c's default)
    [['-m', MODEL, '--max-queue', '0'], /--max-queue must be an integer in \[1, 1000000\], got '0'/],
    [['-m', MODEL, '--max-queue', '1000001'], /--max-queue must be an integer in \[1, 1000000\]/],
    [['-m', MODEL, '--log', 'loud'], /--log must be/],
    // issue 13: the connection settings have ranges
    [['-m', MODEL, '--header-timeout', '0'], /--header-timeout must be an integer in \[1, 3600\]/],
    [['-m', MODEL, '--max-connections', '961'], /--max-connections must be an integer in \[1, 960\]/],
    [['-m', MODEL, '--max-connections', '8', '--max-connections-per-client', '9'],
      /--max-connections-per-client 9 is more than --max-connections 8/],
    [['-m', MODEL, '--max-connections-per-client', '257'], /more than --max-connections 256/],
    [['-m', MODEL, '--port'], /needs a value/],
    [['-m', MODEL, '--config', '/nonexistent/kvstash.yaml'], /nonexistent/],
  ]) {
    const r = run(args);
    assert.equal(r.code, 2, `${args.join(' ')}: ${r.stderr}`);
    assert.match(r.stderr, msg);
  }
});

test('a bad config key is refused with its path', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'kvstash-cli-'));
  try {
    const f = path.join(dir, 'bad.yaml');
    writeFileSync(f, 'slots: many\n');
    const r = run(['-m', MODEL, '--config', f]);
    assert.equal(r.code, 2);
    assert.match(r.stderr, /slots/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('runtime errors exit 1: missing model, port in use', async () => {
  const r = run(['-m', '/nonexistent/model.gguf', '--port', '0']);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /nonexistent/);
  const srv = await startServer();
  try {
    const r2 = run(['-m', MODEL, '--port', String(srv.port), '--threads', '1', '--ctx', '512', '--slots', '1']);
    assert.equal(r2.code, 1);
    assert.match(r2.stderr, /cannot listen on 127\.0\.0\.1:\d+/);
    // The first server is unaffected.
    assert.equal((await getJSON(srv, '/health')).status, 200);
  } finally {
    await stopOk(srv);
  }
});

test('the model id can be renamed with --alias', async () => {
  const srv = await startServer(['--alias', 'my-model']);
  try {
    const m = await getJSON(srv, '/v1/models');
    assert.equal(m.json.data[0].id, 'my-model');
    assert.match(srv.stderr, /\(model my-model, 2 slots, ctx 512, CPU, exact: batch-invariant\)/);
  } finally {
    await stopOk(srv);
  }
});
