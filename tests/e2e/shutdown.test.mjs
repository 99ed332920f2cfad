// shutdown.test.mjs — SIGTERM drains: running requests finish (or, past the
// shutdown timeout, end with a clean error event) and the process exits 0.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, stopOk, until, slots, LONG_ARGS, longChat } from './lib.mjs';

const CHAT = '/v1/chat/completions';

// Starts a long stream, returns { done: Promise<{events, text}>, first: Promise }.
function openStream(srv, body) {
  let gotFirst;
  const first = new Promise((r) => { gotFirst = r; });
  const done = (async () => {
    const res = await fetch(srv.base + CHAT, {
      method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...body, stream: true }),
    });
    assert.equal(res.status, 200);
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let raw = '';
    for (;;) {
      const { value, done: end } = await reader.read();
      if (end) break;
      raw += dec.decode(value, { stream: true });
      if (raw.includes('\n\n')) gotFirst();
    }
    const events = raw.split('\n\n').filter((b) => b).map((b) => b.slice(6));
    return { raw, events };
  })();
  return { first, done };
}

test('SIGTERM during a stream: the stream completes, exit 0', async () => {
  const srv = await startServer(['--slots', '1', '--shutdown-timeout', '120000', ...LONG_ARGS]);
  const s = openStream(srv, longChat({ max_tokens: 8 }));
  await s.first;
  await until(async () => (await slots(srv))[0].busy, 'the slot to become busy');
  srv.proc.kill('SIGTERM');
  const { events } = await s.done;
  assert.equal(events[events.length - 1], '[DONE]');
  const fin = JSON.parse(events[events.length - 2]);
  assert.ok(['stop', 'length'].includes(fin.choices[0].finish_reason));
  const r = await srv.stop();
  assert.equal(r.code, 0, r.stderr.slice(-2000));
  assert.match(r.stderr, /SIGTERM: stopping/);
  assert.match(r.stderr, /I serve +stopped/);
});

test('SIGTERM past the shutdown timeout: the stream ends with an error event, exit 0', async () => {
  const srv = await startServer(['--slots', '1', '--shutdown-timeout', '200', ...LONG_ARGS]);
  const s = openStream(srv, longChat({ max_tokens: 8 }));
  await s.first;
  await until(async () => (await slots(srv))[0].busy, 'the slot to become busy');
  srv.proc.kill('SIGTERM');
  const { events } = await s.done;
  const last = JSON.parse(events[events.length - 1]);
  assert.equal(last.error.code, 'shutting_down');
  assert.equal(last.error.type, 'server_error');
  const r = await srv.stop();
  assert.equal(r.code, 0, r.stderr.slice(-2000));
});

test('SIGTERM with a non-streamed request in flight past the timeout: 503, exit 0', async () => {
  const srv = await startServer(['--slots', '1', '--shutdown-timeout', '200', ...LONG_ARGS]);
  const p = fetch(srv.base + CHAT, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(longChat()),
  });
  await until(async () => (await slots(srv))[0].busy, 'the slot to become busy');
  srv.proc.kill('SIGTERM');
  const res = await p;
  assert.equal(res.status, 503);
  assert.equal((await res.json()).error.code, 'shutting_down');
  const r = await srv.stop();
  assert.equal(r.code, 0, r.stderr.slice(-2000));
});

test('SIGINT on an idle server exits 0 at once', async () => {
  const srv = await startServer();
  srv.proc.kill('SIGINT');
  const r = await srv.stop();
  assert.equal(r.code, 0);
  assert.match(r.stderr, /SIGINT: stopping/);
});

test('a second signal during the drain cancels at once', async () => {
  const srv = await startServer(['--slots', '1', '--shutdown-timeout', '120000', ...LONG_ARGS]);
  const s = openStream(srv, longChat({ max_tokens: 8 }));
  await s.first;
  await until(async () => (await slots(srv))[0].busy, 'the slot to become busy');
  srv.proc.kill('SIGTERM');
  await until(() => /SIGTERM: stopping/.test(srv.stderr), 'the drain to start');
  srv.proc.kill('SIGTERM');
  const { events } = await s.done;
  const last = JSON.parse(events[events.length - 1]);
  assert.equal(last.error.code, 'shutting_down');
  await stopOk(srv);
});
