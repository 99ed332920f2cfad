// redis.test.mjs — the redis tier end to end (issue 14): two kvstash servers
// with separate store directories (as on two hosts) share conversations
// through one real redis-server, started by this test on a unix socket in its
// own temp directory (never the system's). Every reply is compared with a
// --no-cache-prompt server's (temperature 0): Redis may only make prefill
// cheaper, never change an output — also when Redis dies, comes back, loses
// chunks or refuses the password. The TLS tests (rediss://) give redis-server
// a TLS port on 127.0.0.1 with certificates made here by the openssl CLI: a
// CA, a server certificate for localhost and 127.0.0.1, a client
// certificate, and a second CA that signed none of them.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, mkdirSync, writeFileSync, existsSync } from 'node:fs';
import { spawn, spawnSync } from 'node:child_process';
import net from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startServer, stopOk, chat, metrics, sleep, settleStore, until, BIN, MODEL, makeSay, runBin } from './lib.mjs';
import { png, chatImage } from './media.mjs';

const MAX_TOKENS = 8;
let root;
let plain; // --no-cache-prompt: the reference outputs
const redises = new Set();

before(async () => {
  root = mkdtempSync(path.join(tmpdir(), 'kvstash-e2e-redis-'));
  const which = spawnSync('redis-server', ['--version']);
  assert.equal(which.status, 0, 'redis-server is needed (scripts/setup.sh installs it)');
  plain = await startServer(['--no-cache-prompt', '--ctx', '1024']);
});
after(async () => {
  if (plain) await stopOk(plain);
  for (const r of redises) r.kill9();
  if (root) rmSync(root, { recursive: true, force: true });
});

// A free TCP port on 127.0.0.1 (for redis-server's TLS port).
function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => { const { port } = s.address(); s.close(() => resolve(port)); });
  });
}

// The certificates of the TLS tests, made once by the openssl CLI (P-256 keys: quick).
let certsMemo;
function certs() {
  if (certsMemo) return certsMemo;
  const dir = path.join(root, 'certs');
  mkdirSync(dir, { recursive: true });
  const ssl = (...a) => {
    const r = spawnSync('openssl', a, { cwd: dir, encoding: 'utf8' });
    assert.equal(r.status, 0, `openssl ${a.join(' ')}: ${r.stderr}`);
  };
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '2'];
  const ca = (name, cn) => ssl('req', '-x509', ...ec, '-keyout', `${name}.key`, '-out', `${name}.pem`, '-subj', `/CN=${cn}`,
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
  const leaf = (name, cn, ext) => {
    writeFileSync(path.join(dir, `${name}.ext`), ext);
    ssl('req', ...ec, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${cn}`);
    ssl('x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-days', '2',
      '-out', `${name}.pem`, '-extfile', `${name}.ext`);
  };
  ca('ca', 'kvstash test CA');
  ca('other-ca', 'another CA');
  leaf('server', 'localhost', 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n');
  leaf('client', 'kvstash client', 'extendedKeyUsage=clientAuth\n');
  const f = (n) => path.join(dir, n);
  certsMemo = { ca: f('ca.pem'), otherCa: f('other-ca.pem'), serverCert: f('server.pem'), serverKey: f('server.key'),
    clientCert: f('client.pem'), clientKey: f('client.key') };
  return certsMemo;
}

// A redis-server on <dir>/r.sock (no TCP, no persistence), killed by its pid.
// With tls: also a TLS port on 127.0.0.1 (r.port) with the test certificates;
// authClients: it requires a client certificate (mutual TLS). The unix socket
// stays, for redis-cli.
async function startRedis(dir, { password, tls } = {}) {
  mkdirSync(dir, { recursive: true });
  const sock = path.join(dir, 'r.sock');
  const args = ['--port', '0', '--unixsocket', sock, '--unixsocketperm', '700', '--dir', dir,
    '--save', '', '--appendonly', 'no', '--daemonize', 'no'];
  if (password) args.push('--requirepass', password);
  let port;
  if (tls) {
    const c = certs();
    port = await freePort();
    args.push('--bind', '127.0.0.1', '--tls-port', String(port), '--tls-cert-file', c.serverCert,
      '--tls-key-file', c.serverKey, '--tls-ca-cert-file', c.ca, '--tls-auth-clients', tls.authClients ? 'yes' : 'no');
  }
  const proc = spawn('redis-server', args, { stdio: 'ignore' });
  const r = {
    proc, sock, password, port,
    cli(...a) {
      const out = spawnSync('redis-cli', ['-s', sock, ...a],
        { encoding: 'utf8', env: { ...process.env, ...(password ? { REDISCLI_AUTH: password } : {}) } });
      assert.equal(out.status, 0, `redis-cli ${a.join(' ')}: ${out.stderr}`);
      return out.stdout.trim();
    },
    kill9() { if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL'); redises.delete(r); },
    async stop() {
      r.kill9();
      if (proc.exitCode === null && proc.signalCode === null) await new Promise((res) => proc.on('exit', res));
    },
  };
  redises.add(r);
  await until(() => existsSync(sock) && spawnSync('redis-cli', ['-s', sock, 'ping'],
    { encoding: 'utf8', env: { ...process.env, ...(password ? { REDISCLI_AUTH: password } : {}) } }).stdout?.trim() === 'PONG',
  'redis-server to answer', 10000);
  return r;
}

// The config of a server with its own store directories (one "host") and the redis tier.
// redis.tls (an object): the store.tiers.redis.tls mapping.
function hostConfig(name, url, redis = {}) {
  const d = path.join(root, name);
  mkdirSync(d, { recursive: true });
  const lines = ['store:', '  enabled: true', `  cache_dir: ${d}/disk`, `  shm_dir: ${d}/shm`, '  stride: 16',
    '  min_tokens: 32', '  tiers:', '    redis:'];
  if (url) lines.push(`      url: "${url}"`);
  for (const [k, v] of Object.entries({ key_prefix: 'kvs-test', breaker_ms: 300, ...redis })) {
    if (k === 'tls') {
      lines.push('      tls:', ...Object.entries(v).map(([tk, tv]) => `        ${tk}: ${tv}`));
      continue;
    }
    lines.push(`      ${k}: ${Array.isArray(v) ? `[${v.join(', ')}]` : v}`);
  }
  const cfg = path.join(d, 'kvstash.yaml');
  writeFileSync(cfg, lines.join('\n') + '\n');
  return cfg;
}
// opts.args: more flags for `kvstash serve`.
const host = (name, url, redis = {}, { args = [], ...opts } = {}) =>
  startServer(['--config', hostConfig(name, url, redis), '--ctx', '1024', ...args], opts);

const sys = (topic) => ({ role: 'system', content: `${topic}: you are a careful assistant who answers briefly. `.repeat(3) });

// One turn on srv and on the reference server; asserts equal outputs.
async function turn(srv, msgs, what) {
  const r = await chat(srv, msgs, { max_tokens: MAX_TOKENS });
  const p = await chat(plain, msgs, { max_tokens: MAX_TOKENS });
  assert.equal(r.choices[0].message.content, p.choices[0].message.content, `${what}: output differs from --no-cache-prompt`);
  assert.equal(r.usage.completion_tokens, p.usage.completion_tokens, `${what}: completion_tokens`);
  assert.equal(r.usage.prompt_tokens, p.usage.prompt_tokens, `${what}: prompt_tokens`);
  return r;
}

// Appends a user message, runs the turn, appends the reply.
const say = makeSay(turn);

function assertRedisHit(r, atLeast, what) {
  assert.equal(r.cache.mode, 'store', `${what}: cache ${JSON.stringify(r.cache)}`);
  assert.equal(r.cache.tier, 'redis', `${what}: cache ${JSON.stringify(r.cache)}`);
  assert.ok(r.cache.cached_tokens >= atLeast, `${what}: cached ${r.cache.cached_tokens} < ${atLeast}`);
}

// The manifests (kvstash-redis lines) under a prefix, by key.
function manifests(redis, prefix) {
  const keys = redis.cli('--scan', '--pattern', `${prefix}:*`).split('\n').filter(Boolean);
  const out = new Map();
  for (const k of keys) {
    if (k.split(':').length !== 3 || k.endsWith(':lens')) continue;
    const v = redis.cli('GET', k);
    if (v.startsWith('kvstash-redis ')) out.set(k, v.split(' '));
  }
  return out;
}
// Waits until srv's submitting threads have asked Redis n times since the metrics m0.
const untilAsked = (srv, m0, n) => until(async () => (await metrics(srv)).get('kvstash_store_redis_prefetches_total') -
  (m0.get('kvstash_store_redis_prefetches_total') ?? 0) >= n, `${n} request(s) to ask Redis`, 2500, 20);

// Field i of a manifest line: magic version n_tokens reason created total chunk_bytes n_chunks csum nonce.
const M = { n_tokens: 2, total: 5, chunk_bytes: 6, n_chunks: 7, nonce: 9 };

// ------------------------------------------------------------------------ 1
test('a conversation begun on host A continues on host B from Redis, with the same output', async () => {
  const redis = await startRedis(path.join(root, 'r1'));
  const url = `unix://${redis.sock}`;
  const a = await host('a1', url);
  const b = await host('b1', url);
  try {
    const msgs = [sys('Shared')];
    const t1 = await say(a, msgs, 'Hello there, tell me a story.', 'A turn 1');
    await settleStore(a);
    const t2 = await say(b, msgs, 'And another one, please.', 'B turn 2');
    assertRedisHit(t2, t1.usage.prompt_tokens, 'B turn 2');
    await settleStore(b);
    // Back on A: B's finish save (longer than anything A holds) comes from Redis.
    const t3 = await say(a, msgs, 'Thanks. One more?', 'A turn 3');
    assertRedisHit(t3, t2.usage.prompt_tokens, 'A turn 3');
    const mb = await metrics(b);
    assert.ok(mb.get('kvstash_store_tier_hits_total{tier="redis"}') >= 1);
    assert.ok(mb.get('kvstash_store_redis_read_bytes_total') > 0);
    // B's submitting thread fetched it (the inference thread never asks Redis).
    assert.ok(mb.get('kvstash_store_redis_prefetch_used_total') >= 1, 'B restored a prefetched state');
    assert.ok(mb.get('kvstash_store_redis_prefetches_total') >= 1);
    assert.equal(mb.get('kvstash_store_redis_errors_total'), 0);
    assert.equal(mb.get('kvstash_store_redis_breaker_state'), 0);
    assert.equal(mb.get('kvstash_store_corrupt_files_total'), 0);
    // The accounting in Redis matches the entries there, once A's last save
    // (turn 3's finish, written after the reply) is complete: a save counts its
    // bytes before its manifest is written (too high meanwhile, never too low).
    await settleStore(a);
    let ms, sum;
    await until(() => {
      ms = manifests(redis, 'kvs-test');
      sum = [...ms.values()].reduce((s, f) => s + Number(f[M.total]), 0);
      return Number(redis.cli('GET', 'kvs-test:bytes')) === sum;
    }, 'the writers to finish their Redis saves', 10000);
    assert.ok(ms.size >= 2, `manifests in Redis: ${ms.size}`);
    assert.equal(Number(redis.cli('GET', 'kvs-test:bytes')), sum, 'kvs-test:bytes is the sum of the entries');
    assert.equal(Number(redis.cli('ZCARD', 'kvs-test:lru')), ms.size);
  } finally {
    await stopOk(a);
    await stopOk(b);
    await redis.stop();
  }
});

// ------------------------------------------------------------------------ 2
test('a state larger than one chunk round-trips; a chunk deleted makes a miss, never a wrong state', async () => {
  const redis = await startRedis(path.join(root, 'r2'));
  const url = `redis+unix://${redis.sock}`;
  // 64 KiB chunks (the smallest allowed): a state of a few hundred tokens of the tiny model spans several.
  const a = await host('a2', url, { chunk_bytes: '64KiB' });
  const b = await host('b2', url, { chunk_bytes: '64KiB' });
  const c = await host('c2', url, { chunk_bytes: '64KiB' });
  try {
    const long = (t) => ({ role: 'system', content: `${t}: you answer with care and in few words. `.repeat(30) });
    const msgs = [long('Chunky')];
    const t1 = await say(a, msgs, 'Hello, how are you?', 'A turn 1');
    assert.ok(t1.usage.prompt_tokens > 300, `prompt of ${t1.usage.prompt_tokens} tokens`);
    await settleStore(a);
    const ms = manifests(redis, 'kvs-test');
    assert.ok([...ms.values()].some((f) => Number(f[M.n_chunks]) >= 2), 'an entry of two chunks or more');
    const t2 = await say(b, msgs, 'Tell me something else.', 'B turn 2');
    assertRedisHit(t2, t1.usage.prompt_tokens, 'B turn 2 (multi-chunk)');

    // Delete chunk 1 of every multi-chunk entry: a third host must miss them.
    await settleStore(b);
    const deleted = [];
    for (const [k, f] of manifests(redis, 'kvs-test')) {
      if (Number(f[M.n_chunks]) < 2) continue;
      assert.equal(redis.cli('DEL', `${k}:${f[M.nonce]}:1`), '1');
      deleted.push(k);
    }
    assert.ok(deleted.length >= 1);
    const m0 = await metrics(c);
    msgs.push({ role: 'user', content: 'And now?' });
    const t3 = await turn(c, msgs, 'C turn 3');
    assert.ok(!(t3.cache.mode === 'store' && t3.cache.tier === 'redis' && t3.cache.cached_tokens > 300),
      `C restored a state with a missing chunk: ${JSON.stringify(t3.cache)}`);
    const m1 = await metrics(c);
    assert.ok(m1.get('kvstash_store_redis_broken_total') - (m0.get('kvstash_store_redis_broken_total') ?? 0) >= 1,
      'the broken entry was counted');
    assert.equal(m1.get('kvstash_store_corrupt_files_total'), 0, 'a missing chunk is a miss, not corruption');
    // The writer deletes what is left of the entry it met broken (the longest).
    await until(() => deleted.some((k) => redis.cli('EXISTS', k) === '0'), 'the broken entry to be deleted', 5000);

    // A damaged chunk (same length, one byte changed) is refused by the checksum.
    await settleStore(c);
    for (const [k, f] of manifests(redis, 'kvs-test')) redis.cli('SETRANGE', `${k}:${f[M.nonce]}:0`, '300', 'X');
    const d = await host('d2', url, { chunk_bytes: '64KiB' });
    try {
      msgs.push({ role: 'assistant', content: t3.choices[0].message.content });
      const t4 = await say(d, msgs, 'Go on.', 'D turn 4');
      assert.notEqual(t4.cache.tier, 'redis', `D restored a damaged entry: ${JSON.stringify(t4.cache)}`);
      assert.ok((await metrics(d)).get('kvstash_store_corrupt_files_total') >= 1, 'the damaged entry was counted');
    } finally {
      await stopOk(d);
    }
  } finally {
    await stopOk(a);
    await stopOk(b);
    await stopOk(c);
    await redis.stop();
  }
});

// ------------------------------------------------------------------------ 3
test('Redis paused, then killed mid-run: requests succeed as misses; hits come back after it restarts', async () => {
  const dir = path.join(root, 'r3');
  let redis = await startRedis(dir);
  const url = `unix://${redis.sock}`;
  const a = await host('a3', url, { timeout_ms: 200, breaker_errors: 2, breaker_ms: 300 });
  const b = await host('b3', url, { timeout_ms: 200, breaker_errors: 2, breaker_ms: 300 });
  try {
    const msgs = [sys('Outage')];
    await say(a, msgs, 'Hello there.', 'A turn 1');
    await settleStore(a);
    // Slow: Redis answers nothing for 1.5 s (CLIENT PAUSE). B's turn still succeeds, as a miss.
    const s0 = await metrics(b);
    redis.cli('CLIENT', 'PAUSE', '1500', 'ALL');
    const rs = await turn(b, [...msgs, { role: 'user', content: 'Quick question.' }], 'B while Redis is paused');
    assert.notEqual(rs.cache.tier, 'redis');
    assert.ok((await metrics(b)).get('kvstash_store_redis_errors_total') > s0.get('kvstash_store_redis_errors_total'),
      'the timeouts were counted');
    await sleep(1600);
    await redis.stop();
    // Down: B cannot reach A's state; every request still answers, correctly.
    for (const [i, u] of ['Still there?', 'Are you sure?', 'Fine.'].entries()) {
      const r = await say(b, msgs, u, `B turn ${i + 2} (Redis down)`);
      assert.notEqual(r.cache.tier, 'redis');
    }
    await settleStore(b);
    const m = await metrics(b);
    assert.ok(m.get('kvstash_store_redis_errors_total') >= 1, 'errors counted');
    assert.ok(m.get('kvstash_store_redis_breaker_opens_total') >= 1, 'the breaker opened');
    assert.ok(m.get('kvstash_store_redis_dropped_saves_total') >= 1, 'saves dropped and counted');
    // Back (empty: no persistence). A new conversation on A is found by B again.
    redis = await startRedis(dir);
    await sleep(400); // breaker_ms
    const msgs2 = [sys('Recovery')];
    let t1;
    await until(async () => {
      // The first save after the outage may be dropped while the breaker is still open.
      const q = [...msgs2, { role: 'user', content: 'Hello again.' }];
      t1 = await turn(a, q, 'A after restart');
      await settleStore(a);
      return manifests(redis, 'kvs-test').size > 0;
    }, 'A to save into the restarted Redis', 10000, 300);
    msgs2.push({ role: 'user', content: 'Hello again.' }, { role: 'assistant', content: t1.choices[0].message.content });
    const t2 = await say(b, msgs2, 'Welcome back.', 'B after restart');
    assertRedisHit(t2, t1.usage.prompt_tokens, 'B after restart');
    assert.equal((await metrics(b)).get('kvstash_store_redis_breaker_state'), 0, 'breaker closed again');
  } finally {
    await stopOk(a);
    await stopOk(b);
    await redis.stop();
  }
});

// ------------------------------------------------------------------------ 4
test('credentials from the URL or KVSTASH_REDIS_PASSWORD work and are never shown', async () => {
  const pw = 'hunter2-secret';
  const redis = await startRedis(path.join(root, 'r4'), { password: pw });
  const a = await host('a4', `redis+unix://:${pw}@${redis.sock}`);
  const b2 = await host('b4', `unix://${redis.sock}`, {}, { env: { KVSTASH_REDIS_PASSWORD: pw } });
  const bad = await host('x4', `redis+unix://:wrong-password@${redis.sock}`);
  try {
    const msgs = [sys('Secret')];
    const t1 = await say(a, msgs, 'Hello there.', 'A turn 1');
    await settleStore(a);
    const t2 = await say(b2, msgs, 'Again.', 'B turn 2');
    assertRedisHit(t2, t1.usage.prompt_tokens, 'B turn 2 (password from the environment)');
    // A wrong password: a warning, and the server serves without the tier.
    const t3 = await turn(bad, msgs, 'wrong password');
    assert.notEqual(t3.cache.tier, 'redis');
    assert.match(bad.stderr, /refused the credentials|AUTH/);
    for (const s of [a, b2, bad]) {
      assert.ok(!s.stderr.includes(pw), 'the password is in the log');
      const text = await (await fetch(s.base + '/metrics')).text();
      assert.ok(!text.includes(pw), 'the password is in /metrics');
      const props = await (await fetch(s.base + '/props')).text();
      assert.ok(!props.includes(pw), 'the password is in /props');
    }
    assert.match(a.stderr, /redis\+unix:\/\/:\*\*\*@/);
  } finally {
    await stopOk(a);
    await stopOk(b2);
    await stopOk(bad);
    await redis.stop();
  }
});

// ------------------------------------------------------------------------ 5
test('bad input: an invalid URL or TLS setting is refused at start; an unreachable Redis is a warning', async () => {
  for (const [url, re] of [['http://h:1', /expected redis:\/\//], ['redis://h:99999', /bad port/]]) {
    const r = spawnSync(BIN, ['serve', '-m', MODEL, '--port', '0', '--cache-redis', url], { encoding: 'utf8' });
    assert.equal(r.status, 2, `--cache-redis ${url}: exit ${r.status}\n${r.stderr}`);
    assert.match(r.stderr, re);
  }
  // TLS settings that cannot work stop the server before the model loads, naming the
  // problem (tests/cli/test_serve_ranges.sh has those that need no certificate).
  const c = certs();
  const tlsUrl = 'rediss://u:pw-not-shown@127.0.0.1:1';
  for (const [args, re] of [
    [['--cache-redis-tls-cert', c.clientCert, '--cache-redis-tls-key', c.serverKey], /does not match cert_file/],
    [['--cache-redis-tls-ca', c.clientKey], /cannot load the CA certificates of ca_file/],
    [['--cache-redis-tls-cert', c.clientKey, '--cache-redis-tls-key', c.clientKey], /cert_file '.*client\.key'/],
  ]) {
    const r = spawnSync(BIN, ['serve', '-m', MODEL, '--port', '0', '--cache-redis', tlsUrl, ...args],
      { encoding: 'utf8', timeout: 60000 });
    assert.equal(r.status, 2, `${args.join(' ')}: exit ${r.status}\n${r.stderr}`);
    assert.match(r.stderr, re);
    assert.doesNotMatch(r.stderr, /listening on|pw-not-shown/);
  }
  // YAML: an unknown key and a bad URL name the key.
  const d = path.join(root, 'bad5');
  mkdirSync(d, { recursive: true });
  for (const [body, re] of [['url: "nope://x"', /store\.tiers\.redis\.url/], ['chunk_bytes: 1', /chunk_bytes/],
    ['colour: red', /colour/], ['reasons: [pin]', /reasons/]]) {
    const f = path.join(d, 'k.yaml');
    writeFileSync(f, `store:\n  tiers:\n    redis:\n      ${body}\n`);
    const r = spawnSync(BIN, ['serve', '-m', MODEL, '--port', '0', '--config', f], { encoding: 'utf8' });
    assert.notEqual(r.status, 0, `${body} accepted`);
    assert.match(r.stderr, re);
  }
  // Unreachable: the server starts, warns, answers (as misses), and reports the breaker open.
  const s = await host('u5', `unix://${path.join(root, 'no-such.sock')}`);
  try {
    assert.match(s.stderr, /does not answer; serving without it/);
    const msgs = [sys('Nowhere')];
    await say(s, msgs, 'Hello?', 'unreachable turn 1');
    const m = await settleStore(s);
    assert.ok(m.get('kvstash_store_redis_errors_total') >= 1);
    assert.ok(m.get('kvstash_store_saves_total{reason="finish"}') >= 1, 'the local tiers still save');
  } finally {
    await stopOk(s);
  }
});

// ------------------------------------------------------------------------ 6
test('the budget: kvstash never grows Redis past max_bytes, evicting its least recently used', async () => {
  const redis = await startRedis(path.join(root, 'r6'));
  const max = 160 * 1024;
  const a = await host('a6', `unix://${redis.sock}`, { max_bytes: max });
  try {
    for (let i = 0; i < 6; i++) {
      const msgs = [sys(`Budget ${i}`)];
      await say(a, msgs, `Conversation number ${i}, hello.`, `conversation ${i}`);
      await settleStore(a);
      const used = Number(redis.cli('GET', 'kvs-test:bytes'));
      const sum = [...manifests(redis, 'kvs-test').values()].reduce((s, f) => s + Number(f[M.total]), 0);
      assert.ok(used <= max, `kvs-test:bytes ${used} > max_bytes ${max}`);
      assert.ok(sum <= max, `entries of ${sum} bytes > max_bytes ${max}`);
    }
    const m = await metrics(a);
    assert.ok(m.get('kvstash_store_tier_evictions_total{tier="redis"}') >= 1, 'evictions counted');
  } finally {
    await stopOk(a);
    await redis.stop();
  }
});

// ------------------------------------------------------------------------ 7
// A hybrid model (tiny-hybrid, issue 15): its memory cannot be cut back, so
// when the reply sent back differs from the one generated (here: less its
// last two words), only a state at the previous prompt's end serves the next
// turn. Host A saves it (reason checkpoint) to Redis too; host B, which never
// saw the conversation, restores all of the previous prompt from Redis.
test('hybrid model: the next turn on host B restores the previous prompt from the checkpoint in Redis', async () => {
  const hybrid = process.env.KS_TINY_HYBRID_MODEL;
  assert.ok(hybrid, 'KS_TINY_HYBRID_MODEL is not set (run through ctest)');
  const redis = await startRedis(path.join(root, 'r7'));
  const url = `unix://${redis.sock}`;
  const start = (name) => startServer(['-m', hybrid, '--config', hostConfig(name, url), '--ctx', '1024']);
  const a = await start('a7');
  const b = await start('b7');
  const ref = await startServer(['-m', hybrid, '--ctx', '1024', '--no-cache-prompt']);
  try {
    const msgs = [sys('Rivers and dogs'), { role: 'user', content: 'Tell me about the river and the dog.' }];
    const opts = { max_tokens: 16, temperature: 0 };
    const r1 = await chat(a, msgs, opts);
    assert.equal(r1.choices[0].message.content, (await chat(ref, msgs, opts)).choices[0].message.content, 'turn 1');
    await settleStore(a);
    msgs.push({ role: 'assistant', content: r1.choices[0].message.content.split(' ').slice(0, -2).join(' ') });
    msgs.push({ role: 'user', content: 'And what happened then?' });
    const r2 = await chat(b, msgs, opts);
    assert.equal(r2.choices[0].message.content, (await chat(ref, msgs, opts)).choices[0].message.content, 'turn 2');
    assertRedisHit(r2, r1.usage.prompt_tokens, 'turn 2 on host B');
    const m = await metrics(a);
    assert.ok(m.get('kvstash_store_saves_total{reason="checkpoint"}') >= 1, 'host A saved no checkpoint');
  } finally {
    await stopOk(a);
    await stopOk(b);
    await stopOk(ref);
    await redis.stop();
  }
});

// ------------------------------------------------------------------------ 7b
test('a Redis that does not answer holds up only the request that asks it, never the others', async () => {
  const redis = await startRedis(path.join(root, 'r8b'));
  const url = `unix://${redis.sock}`;
  // A long timeout: a lookup on the inference thread would stall every slot for 3 s.
  const a = await host('a8b', url, { timeout_ms: 3000, breaker_errors: 1, breaker_ms: 10000 });
  try {
    const order = [];
    const m0 = await metrics(a);
    // Redis stops answering; B (a new conversation) asks it for a prefix.
    redis.cli('CLIENT', 'PAUSE', '8000', 'ALL');
    const b = chat(a, [sys('Blocked'), { role: 'user', content: 'Hello?' }], { max_tokens: 2 })
      .then((r) => { order.push('B'); return r; });
    // B is in its lookup once its prefetch was counted.
    await untilAsked(a, m0, 1);
    // C asks nothing of Redis (cache_prompt false) and must not wait for B's
    // lookup: with lookups on the inference thread it would, and B (2 tokens)
    // would end first.
    const c = await chat(a, [sys('Free'), { role: 'user', content: 'Go.' }],
      { max_tokens: 32, ignore_eos: true, cache_prompt: false });
    order.push('C');
    assert.equal(c.usage.completion_tokens, 32);
    const br = await b;
    assert.deepEqual(order, ['C', 'B'], 'C was held up by B\'s Redis lookup');
    assert.equal(br.choices[0].finish_reason, 'length', 'B succeeded (a miss)');
    const m = await metrics(a);
    assert.ok(m.get('kvstash_store_redis_errors_total') >= 1, 'the timeout was counted');
  } finally {
    redis.kill9();
    await stopOk(a);
    await redis.stop();
  }
});

// TLS (rediss://): the same shared cache through a redis-server that speaks
// only TLS, with a password. Host A is configured in its YAML file
// (store.tiers.redis.tls), host B by flags and by the server's name rather
// than its address (SNI and host name verification).
test('TLS: a conversation begun on host A continues on host B through rediss://, with the same output', async () => {
  const pw = 'tls-secret-pw';
  const redis = await startRedis(path.join(root, 'r8'), { password: pw, tls: {} });
  const c = certs();
  const a = await host('a8', `rediss://:${pw}@127.0.0.1:${redis.port}`, { tls: { ca_file: c.ca } });
  const b = await host('b8', `rediss://localhost:${redis.port}`, {},
    { args: ['--cache-redis-tls-ca', c.ca], env: { KVSTASH_REDIS_PASSWORD: pw } });
  try {
    const msgs = [sys('Encrypted')];
    const t1 = await say(a, msgs, 'Hello there, tell me a story.', 'A turn 1');
    await settleStore(a);
    assert.ok(manifests(redis, 'kvs-test').size >= 1, 'A saved nothing to Redis over TLS');
    const t2 = await say(b, msgs, 'And another one, please.', 'B turn 2');
    assertRedisHit(t2, t1.usage.prompt_tokens, 'B turn 2 (TLS)');
    await settleStore(b);
    const t3 = await say(a, msgs, 'Thanks. One more?', 'A turn 3');
    assertRedisHit(t3, t2.usage.prompt_tokens, 'A turn 3 (TLS)');
    // Turn 3's saves land after the reply: wait for them, or `cache ls` below
    // and the count of manifests may see different sets.
    await settleStore(a);
    await settleStore(b);
    for (const s of [a, b]) {
      const m = await metrics(s);
      assert.equal(m.get('kvstash_store_redis_errors_total'), 0, 'no Redis error over TLS');
      assert.equal(m.get('kvstash_store_corrupt_files_total'), 0);
      assert.ok(!s.stderr.includes(pw), 'the password is in the log');
    }
    assert.ok((await metrics(b)).get('kvstash_store_redis_read_bytes_total') > 0);
    assert.match(a.stderr, /redis rediss:\/\/:\*\*\*@127\.0\.0\.1/, 'the start line names the redacted URL');
    // `kvstash cache` over TLS too, with serve's settings (--redis-tls-* for --cache-redis-tls-*).
    const ls = spawnSync(BIN, ['cache', 'ls', '--redis', `rediss://localhost:${redis.port}`, '--redis-tls-ca', c.ca,
      '--redis-prefix', 'kvs-test'], { encoding: 'utf8', env: { ...process.env, KVSTASH_REDIS_PASSWORD: pw } });
    assert.equal(ls.status, 0, ls.stderr);
    assert.equal(ls.stdout.split('\n').filter((l) => / redis /.test(l)).length, manifests(redis, 'kvs-test').size);
  } finally {
    await stopOk(a);
    await stopOk(b);
    await redis.stop();
  }
});

// ------------------------------------------------------------------------ 9
test('mutual TLS: with the client certificate the tier works; without it the tier is down and requests succeed', async () => {
  const redis = await startRedis(path.join(root, 'r9'), { tls: { authClients: true } });
  const c = certs();
  const url = `rediss://127.0.0.1:${redis.port}`;
  const withCert = { tls: { ca_file: c.ca, cert_file: c.clientCert, key_file: c.clientKey } };
  const a = await host('a9', url, withCert);
  const b = await host('b9', url, {}, { args: ['--cache-redis-tls-ca', c.ca, '--cache-redis-tls-cert', c.clientCert,
    '--cache-redis-tls-key', c.clientKey] });
  const x = await host('x9', url, { tls: { ca_file: c.ca } });
  try {
    const msgs = [sys('Mutual')];
    const t1 = await say(a, msgs, 'Hello there.', 'A turn 1');
    await settleStore(a);
    const t2 = await turn(b, [...msgs, { role: 'user', content: 'Again.' }], 'B turn 2 (client certificate)');
    assertRedisHit(t2, t1.usage.prompt_tokens, 'B turn 2 (mutual TLS)');
    // No client certificate: the server refuses the connection; X serves from its own tiers.
    assert.match(x.stderr, /does not answer; serving without it.*certificate required/,
      'the warning gives the TLS reason');
    const m0 = await metrics(x);
    for (const [i, u] of ['Again.', 'Once more.', 'And again.'].entries()) {
      await sleep(350); // past breaker_ms: each turn tries again
      const r = await turn(x, [...msgs, { role: 'user', content: u }], `X turn ${i + 2} (no client certificate)`);
      assert.notEqual(r.cache.tier, 'redis');
    }
    await settleStore(x);
    const m1 = await metrics(x);
    assert.ok(m1.get('kvstash_store_redis_errors_total') > m0.get('kvstash_store_redis_errors_total'),
      'the refused connections were counted');
    assert.ok(m1.get('kvstash_store_redis_breaker_opens_total') >= 1, 'the breaker opened');
    assert.equal(m1.get('kvstash_store_redis_read_bytes_total'), 0, 'nothing was read from Redis');
    assert.equal((await metrics(a)).get('kvstash_store_redis_errors_total'), 0);
  } finally {
    await stopOk(a);
    await stopOk(b);
    await stopOk(x);
    await redis.stop();
  }
});

// ----------------------------------------------------------------------- 10
// A server that cannot be verified — signed by another CA, or not carrying the
// name asked for — is treated as Redis down: a warning with the redacted URL
// and the TLS reason, every request answered, errors counted, the breaker
// retrying, nothing restored. --cache-redis-tls-insecure (verify: false)
// connects anyway.
test('TLS: a server that cannot be verified is Redis down: warnings, misses, the breaker; insecure connects', async () => {
  const redis = await startRedis(path.join(root, 'r10'), { tls: {} });
  const c = certs();
  const port = redis.port;
  const a = await host('a10', `rediss://127.0.0.1:${port}`, { tls: { ca_file: c.ca } });
  const wrongCa = await host('w10', `rediss://kvstash:pw-hidden@127.0.0.1:${port}`, { tls: { ca_file: c.otherCa } });
  const wrongName = await host('n10', `rediss://127.0.0.1:${port}`,
    { tls: { ca_file: c.ca, server_name: 'redis.example.org' } });
  const insecure = await host('i10', `rediss://127.0.0.1:${port}`, {}, { args: ['--cache-redis-tls-insecure'] });
  try {
    const msgs = [sys('Unverified')];
    const t1 = await say(a, msgs, 'Hello there.', 'A turn 1');
    await settleStore(a);
    assert.ok(manifests(redis, 'kvs-test').size >= 1, 'A saved nothing to Redis');
    const q = [...msgs, { role: 'user', content: 'Go on.' }];
    for (const [s, reason] of [[wrongCa, /certificate verify failed/], [wrongName, /certificate verify failed: hostname mismatch/]]) {
      assert.match(s.stderr, /redis tier: rediss:\/\/[^ ]*127\.0\.0\.1:\d+ does not answer; serving without it/);
      assert.match(s.stderr, reason);
      const m0 = await metrics(s);
      // Past the breaker's 300 ms, each turn tries again and fails again.
      for (let i = 0; i < 2; i++) {
        await sleep(350);
        const r = await turn(s, q, 'turn on an unverified server');
        assert.notEqual(r.cache.tier, 'redis', `restored from an unverified server: ${JSON.stringify(r.cache)}`);
      }
      await settleStore(s);
      const m1 = await metrics(s);
      assert.ok(m1.get('kvstash_store_redis_errors_total') > m0.get('kvstash_store_redis_errors_total'), 'errors counted');
      assert.ok(m1.get('kvstash_store_redis_breaker_opens_total') >= 1, 'the breaker opened');
      assert.equal(m1.get('kvstash_store_redis_read_bytes_total'), 0, 'nothing was read from Redis');
    }
    assert.match(wrongCa.stderr, /rediss:\/\/kvstash:\*\*\*@127\.0\.0\.1/, 'the URL is redacted');
    assert.ok(!wrongCa.stderr.includes('pw-hidden'), 'the password is in the log');
    // verify: false trusts any server: the state A saved is restored.
    const r = await turn(insecure, q, 'insecure turn');
    assertRedisHit(r, t1.usage.prompt_tokens, 'insecure');
  } finally {
    await stopOk(a);
    await stopOk(wrongCa);
    await stopOk(wrongName);
    await stopOk(insecure);
    await redis.stop();
  }
});

// ----------------------------------------------------------------------- 11
// `kvstash cache --redis` (src/cli/cache_redis.c) on what a server saved.
test('kvstash cache --redis: ls, stats, verify, gc and rm see the entries in Redis; a damaged chunk is named', async () => {
  const redis = await startRedis(path.join(root, 'r11'));
  const url = `unix://${redis.sock}`;
  const a = await host('a11', url);
  const kc = (...args) => spawnSync(BIN, ['cache', ...args, '--redis', url, '--redis-prefix', 'kvs-test'],
    { encoding: 'utf8', timeout: 60000 });
  const rowsOf = (out) => out.split('\n').filter((l) => / redis /.test(l)).map((l) => l.trim().split(/\s+/));
  const conv = [[sys('Listing one')], [sys('Listing two')]];
  let b;
  try {
    for (const [i, msgs] of conv.entries()) await say(a, msgs, `Hello, conversation ${i}.`, `A conversation ${i}`);
    await settleStore(a);
    let ms, sum;
    await until(() => {
      ms = manifests(redis, 'kvs-test');
      sum = [...ms.values()].reduce((s, f) => s + Number(f[M.total]), 0);
      return ms.size >= 2 && Number(redis.cli('GET', 'kvs-test:bytes')) === sum;
    }, 'the saves to Redis to complete', 10000);
    const keyOf = (k) => k.split(':')[2];

    // ls: one row per manifest, with its token count; a key prefix selects.
    const ls = kc('ls');
    assert.equal(ls.status, 0, ls.stderr);
    const rows = rowsOf(ls.stdout);
    assert.equal(rows.length, ms.size, ls.stdout);
    for (const [k, f] of ms) {
      const row = rows.find((r) => keyOf(k).startsWith(r[0]));
      assert.ok(row, `${k} is not listed:\n${ls.stdout}`);
      assert.equal(row[1], f[M.n_tokens], `tokens of ${k}`);
    }
    const [k0, f0] = [...ms][0];
    const one = kc('ls', keyOf(k0).slice(0, 10));
    assert.equal(rowsOf(one.stdout).length, 1, one.stdout);
    // With the host's directories named, its local entries are listed beside.
    const both = spawnSync(BIN, ['cache', 'ls', '--cache-dir', path.join(root, 'a11', 'disk'), '--shm-dir',
      path.join(root, 'a11', 'shm'), '--redis', url, '--redis-prefix', 'kvs-test'], { encoding: 'utf8' });
    assert.equal(both.status, 0, both.stderr);
    assert.equal(rowsOf(both.stdout).length, ms.size);
    assert.match(both.stdout, / (shm|disk) /, 'local entries listed too');

    // stats: the accounting.
    const st = kc('stats');
    assert.equal(st.status, 0, st.stderr);
    assert.equal(Number(/^redis\s+(\d+)\s/m.exec(st.stdout)?.[1]), ms.size, st.stdout);
    assert.match(st.stdout, new RegExp(`manifests ${ms.size}\\b`));

    // verify: every entry good; then one byte of one chunk changed: exit 1 naming that entry.
    const v0 = kc('verify');
    assert.equal(v0.status, 0, v0.stdout + v0.stderr);
    assert.match(v0.stdout, new RegExp(`${ms.size} redis entries checked: ${ms.size} good, 0 bad`));
    redis.cli('SETRANGE', `${k0}:${f0[M.nonce]}:0`, '300', 'X');
    const v1 = kc('verify');
    assert.equal(v1.status, 1, v1.stdout + v1.stderr);
    assert.match(v1.stdout, new RegExp(`bad: redis ${k0}: ECORRUPT`));
    assert.equal(v1.stdout.split('\n').filter((l) => l.startsWith('bad:')).length, 1, v1.stdout);

    // rm KEYPREFIX: that entry, with its accounting.
    const rm1 = kc('rm', keyOf(k0).slice(0, 12));
    assert.equal(rm1.status, 0, rm1.stderr);
    assert.match(rm1.stdout, new RegExp(`removed ${keyOf(k0)} \\(redis, ${f0[M.n_tokens]} tokens\\)`));
    assert.equal(redis.cli('EXISTS', k0), '0');
    assert.equal(redis.cli('EXISTS', `${k0}:${f0[M.nonce]}:0`), '0', 'its chunks are gone');
    assert.equal(Number(redis.cli('GET', 'kvs-test:bytes')), sum - Number(f0[M.total]), 'its bytes left the sum');
    assert.equal(Number(redis.cli('ZCARD', 'kvs-test:lru')), ms.size - 1);
    assert.equal(kc('verify').status, 0, 'the damaged entry is gone');

    // gc --max-bytes: the least recently used go until the rest fits.
    const left = [...manifests(redis, 'kvs-test').values()].map((f) => Number(f[M.total]));
    const budget = left.reduce((s, t) => s + t, 0) - 1;
    const gc = kc('gc', '--max-bytes', String(budget));
    assert.equal(gc.status, 0, gc.stderr);
    assert.match(gc.stdout, /redis: evicted [1-9]\d* entries/);
    assert.ok(Number(redis.cli('GET', 'kvs-test:bytes')) <= budget, 'within the budget');

    // rm --all: nothing of kvstash's is left but the zeroed sum; a new host misses.
    const all = kc('rm', '--all');
    assert.equal(all.status, 0, all.stderr);
    assert.equal(manifests(redis, 'kvs-test').size, 0);
    assert.equal(Number(redis.cli('GET', 'kvs-test:bytes')), 0);
    assert.equal(Number(redis.cli('ZCARD', 'kvs-test:lru')), 0);
    const keys = redis.cli('--scan', '--pattern', 'kvs-test:*').split('\n').filter(Boolean);
    assert.deepEqual(keys.filter((k) => k !== 'kvs-test:bytes'), [], 'keys left behind');
    assert.equal(rowsOf(kc('ls').stdout).length, 0);
    b = await host('b11', url);
    const t = await turn(b, [...conv[1], { role: 'user', content: 'Hello, conversation 1.' }], 'B after rm --all');
    assert.notEqual(t.cache.tier, 'redis', `restored after rm --all: ${JSON.stringify(t.cache)}`);
  } finally {
    await stopOk(a);
    if (b) await stopOk(b);
    await redis.stop();
  }
  // Unreachable: exit 1, the URL named without its password.
  const r = spawnSync(BIN, ['cache', 'ls', '--redis', `redis+unix://:pw-hidden@${path.join(root, 'no-such.sock')}`],
    { encoding: 'utf8' });
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr, /kvstash cache ls: redis redis\+unix:\/\/:\*\*\*@.*no-such\.sock: .*No such file/);
  assert.ok(!r.stderr.includes('pw-hidden'));
});

// ----------------------------------------------------------------------- 12
test('concurrent requests ask Redis on connections of their own: one slow reply does not queue the next', async () => {
  const redis = await startRedis(path.join(root, 'r12'));
  const url = `unix://${redis.sock}`;
  const a = await host('a12', url, { timeout_ms: 3000, breaker_errors: 1000, breaker_ms: 0 });
  try {
    const m0 = await metrics(a);
    // Redis answers nothing for 4.5 s; each lookup gives up after 3 s.
    redis.cli('CLIENT', 'PAUSE', '4500', 'ALL');
    const b1 = chat(a, [sys('First'), { role: 'user', content: 'Hello?' }], { max_tokens: 2 });
    await untilAsked(a, m0, 1);
    const b2 = chat(a, [sys('Second'), { role: 'user', content: 'Hello?' }], { max_tokens: 2 });
    await untilAsked(a, m0, 2);
    await Promise.all([b1, b2]);
    // Each waited on its own connection and timed out at 3 s (2 errors). Had
    // B2 queued behind B1's connection, it would have asked at 3 s and been
    // answered when the pause ended (1 error).
    const m = await metrics(a);
    assert.equal(m.get('kvstash_store_redis_errors_total') - (m0.get('kvstash_store_redis_errors_total') ?? 0), 2,
      'the second lookup waited for the first one\'s connection');
  } finally {
    await stopOk(a);
    await redis.stop();
  }
});

// ------------------------------------------------------------------------ issue 28
// Stored states are authenticated, not only checked: an entry written into
// Redis without the cache secret (here by a kvstash server without one, as
// anyone who can write the Redis could, checksums and all) is refused by
// servers that have the secret — counted as corrupt, the reply that of a miss
// — while the entries they write themselves are restored across hosts.
test('with a cache secret, an entry written without it is refused; tagged entries are shared', async () => {
  const redis = await startRedis(path.join(root, 'r-secret'));
  const url = `unix://${redis.sock}`;
  const env = { KVSTASH_CACHE_SECRET: 'a deployment secret for the e2e hosts' };
  const open = await host('s-open', url);
  let b, c, d;
  try {
    const msgs = [sys('Secret')];
    await say(open, msgs, 'Hello there, tell me a story.', 'unauthenticated host turn 1');
    await settleStore(open);
    await stopOk(open);
    assert.ok(manifests(redis, 'kvs-test').size >= 1, 'the unauthenticated host wrote to Redis');
    b = await host('s-b', url, {}, { env });
    const m0 = await metrics(b);
    const t2 = await say(b, [...msgs], 'And another one, please.', 'secret host B turn 2');
    assert.notEqual(t2.cache.tier, 'redis', `an untagged entry was restored: ${JSON.stringify(t2.cache)}`);
    const mb = await metrics(b);
    assert.ok(mb.get('kvstash_store_corrupt_files_total') - (m0.get('kvstash_store_corrupt_files_total') ?? 0) >= 1,
      'the refused entry is counted like a corrupt one');
    await settleStore(b);
    c = await host('s-c', url, {}, { env });
    const own = [sys('Tagged')];
    const u1 = await say(c, own, 'Hello there, tell me a story.', 'secret host C turn 1');
    await settleStore(c);
    d = await host('s-d', url, {}, { env });
    const u2 = await say(d, own, 'And another one, please.', 'secret host D turn 2');
    assertRedisHit(u2, u1.usage.prompt_tokens, 'secret host D turn 2');
    assert.equal((await metrics(d)).get('kvstash_store_corrupt_files_total'), 0);
    await settleStore(d);
    // kvstash cache verify: authenticates with the secret (the tagged entries are good, any
    // untagged one left is bad, named by its manifest); without it, says it could not.
    const secretFile = path.join(root, 'cache.secret');
    writeFileSync(secretFile, env.KVSTASH_CACHE_SECRET + '\n', { mode: 0o600 });
    const v = await runBin(['cache', 'verify', '--redis', url, '--redis-prefix', 'kvs-test', '--secret-file', secretFile]);
    assert.match(v.stdout, /^authenticated: /m, v.stdout + v.stderr);
    const good = Number(/(\d+) good/.exec(v.stdout)[1]);
    assert.ok(good >= 1, v.stdout);
    for (const line of v.stdout.split('\n').filter((l) => l.startsWith('bad: '))) assert.match(line, /: manifest: ECORRUPT/);
    const plainVerify = await runBin(['cache', 'verify', '--redis', url, '--redis-prefix', 'kvs-test']);
    assert.match(plainVerify.stdout, /^not authenticated: no cache secret/m);
  } finally {
    for (const s of [b, c, d]) if (s) await stopOk(s);
    await redis.stop();
  }
});

// Images through Redis (issue 29): host B, which never saw the image, reads
// the conversation with its image's KV from Redis and does not run the
// projector; the reply is the uncached one.
test('an image conversation begun on host A continues on host B from Redis, the image not encoded again', async () => {
  const model = process.env.KS_TINY_MM_MODEL;
  const proj = process.env.KS_TINY_MMPROJ;
  assert.ok(model && proj, 'KS_TINY_MM_MODEL / KS_TINY_MMPROJ are not set (run through ctest)');
  const redis = await startRedis(path.join(root, 'r12'));
  const url = `unix://${redis.sock}`;
  const media = { args: ['-m', model, '--mmproj', proj] };
  const a = await host('a12', url, {}, media);
  const b = await host('b12', url, {}, media);
  try {
    const opts = { max_tokens: MAX_TOKENS, temperature: 0 };
    const msgs = [sys('Screens'), { role: 'user', content: [{ type: 'text', text: 'What is on this screen?' },
      chatImage(png(64, 64, 81))] }];
    const r1 = await chat(a, msgs, opts);
    await settleStore(a);
    msgs.push({ role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'And the menu?' });
    const r2 = await chat(b, msgs, opts);
    assertRedisHit(r2, r1.usage.prompt_tokens, 'host B');
    assert.equal((await metrics(b)).get('kvstash_media_encodes_total'), 0, 'host B encoded the image');
    const u = await chat(b, msgs, { ...opts, cache_prompt: false });
    assert.equal(r2.choices[0].message.content, u.choices[0].message.content);
  } finally {
    await stopOk(a);
    await stopOk(b);
    await redis.stop();
  }
});
