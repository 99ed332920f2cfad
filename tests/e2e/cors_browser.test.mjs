// cors_browser.test.mjs — --cors-origin with a real browser: headless Chromium
// loads a page from another origin (a small HTTP server here, another port)
// whose script calls kvstash as a chat UI does: fetch() with Authorization,
// Content-Type: application/json and an x-stainless-* header (so the browser
// preflights), then reads the SSE stream to [DONE]; an error reply (wrong key)
// must be readable too; a server without --cors-origin, and one that allows
// another origin, must be refused by the browser. The page posts what it saw
// back to its own server. cors.test.mjs checks the same headers with fetch
// from node.
//
// Debian's Chromium is installed by scripts/setup.sh (issue 41: before, the
// test was skipped on every fresh machine); on a machine set up otherwise,
// without it (apt-get install chromium, or $KS_CHROMIUM), the test prints
// "SKIP: no Chromium" and CTest counts it as skipped.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { startServer, stopOk } from './lib.mjs';

function findChromium() {
  if (process.env.KS_CHROMIUM) return process.env.KS_CHROMIUM;
  for (const name of ['chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable']) {
    const r = spawnSync('sh', ['-c', `command -v ${name}`], { encoding: 'utf8' });
    if (r.status === 0 && r.stdout.trim()) return r.stdout.trim();
  }
  return null;
}
const CHROMIUM = findChromium();
const SKIP = CHROMIUM ? false : 'SKIP: no Chromium (apt-get install chromium, or set KS_CHROMIUM)';
if (SKIP) console.log(SKIP);

const KEY = 'browser-key-1';
const cleanups = [];
after(async () => { for (const f of cleanups.reverse()) await f(); });

// The chat UI: one page, and /result where its script reports.
function page({ kv, bare, other }) {
  const request = (key) => `{method: 'POST', headers: {'Authorization': 'Bearer ${key}', ` +
    `'Content-Type': 'application/json', 'x-stainless-os': 'Linux'}, body: JSON.stringify({messages: ` +
    `[{role: 'user', content: 'hi'}], temperature: 0, max_tokens: 8, stream: true})}`;
  return `<!doctype html><html><head><title>kvstash CORS</title></head><body><script>
const out = {origin: location.origin};
async function refused(base, what) {
  try { await fetch(base + '/v1/chat/completions', ${request(KEY)}); out[what] = 'readable'; }
  catch (e) { out[what] = 'refused: ' + e.name; }
}
async function run() {
  try {
    const res = await fetch('${kv}/v1/chat/completions', ${request(KEY)});
    out.status = res.status;
    out.contentType = res.headers.get('content-type');
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let text = '';
    out.reads = 0;
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      out.reads++;
      text += dec.decode(value, {stream: true});
    }
    const events = text.split('\\n\\n').filter((b) => b.length);
    out.events = events.length;
    out.last = events[events.length - 1];
    out.content = events.filter((e) => e !== 'data: [DONE]').map((e) => JSON.parse(e.slice(6)))
      .map((j) => j.choices[0]?.delta?.content ?? '').join('');
  } catch (e) { out.streamError = String(e); }
  try {
    const r = await fetch('${kv}/v1/chat/completions', ${request('wrong')});
    out.errorStatus = r.status;
    out.errorCode = (await r.json()).error.code;
  } catch (e) { out.errorError = String(e); }
  await refused('${bare}', 'withoutCors');
  await refused('${other}', 'otherOrigin');
}
run().finally(() => fetch('/result', {method: 'POST', body: JSON.stringify(out)}));
</script></body></html>`;
}

test('Chromium on another origin: preflighted POST, streamed read, errors readable; refused without CORS',
  { skip: SKIP, timeout: 240000 }, async () => {
    // The page's server first: its origin is what kvstash allows.
    let html = '';
    let report;
    const got = new Promise((resolve) => { report = resolve; });
    const pageSrv = http.createServer((req, res) => {
      if (req.method === 'POST' && req.url === '/result') {
        let b = '';
        req.on('data', (d) => { b += d; });
        req.on('end', () => { res.end('ok'); report(JSON.parse(b)); });
        return;
      }
      res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
      res.end(html);
    });
    await new Promise((r) => pageSrv.listen(0, '127.0.0.1', r));
    cleanups.push(() => new Promise((r) => pageSrv.close(r)));
    const origin = `http://127.0.0.1:${pageSrv.address().port}`;

    // --log debug: one access line per request, to see the browser's preflight.
    const kv = await startServer(['--cors-origin', origin, '--api-key', KEY, '--log', 'debug']);
    cleanups.push(() => stopOk(kv));
    const bare = await startServer(['--api-key', KEY]);
    cleanups.push(() => stopOk(bare));
    const other = await startServer(['--cors-origin', 'http://elsewhere.example', '--api-key', KEY]);
    cleanups.push(() => stopOk(other));
    html = page({ kv: kv.base, bare: bare.base, other: other.base });

    const profile = mkdtempSync(path.join(tmpdir(), 'kvstash-chromium-'));
    cleanups.push(async () => rmSync(profile, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 }));
    // Its own process group: the browser's helper processes go with it.
    const browser = spawn(CHROMIUM, ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage',
      '--no-first-run', '--no-default-browser-check', '--disable-extensions', `--user-data-dir=${profile}`,
      `${origin}/`], { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
    let browserErr = '';
    browser.stderr.on('data', (d) => { browserErr += d; });
    const exited = new Promise((r) => browser.on('exit', r));
    const group = (sig) => { try { process.kill(-browser.pid, sig); } catch { /* gone */ } };
    process.on('exit', () => group('SIGKILL')); // a failing or killed test leaves no browser behind
    cleanups.push(async () => {
      group('SIGTERM'); // a clean exit, so that nothing writes to the profile any more
      let timer;
      await Promise.race([exited, new Promise((r) => { timer = setTimeout(r, 10000); })]);
      clearTimeout(timer);
      group('SIGKILL');
    });

    let timer;
    const out = await Promise.race([
      got,
      new Promise((_, reject) => { timer = setTimeout(() => reject(new Error('no report from the page')), 180000); }),
      exited.then((code) => { throw new Error(`Chromium exited (${code}) before the page reported`); }),
    ]).catch((e) => { throw new Error(`${e.message}; Chromium stderr:\n${browserErr.slice(-3000)}`); })
      .finally(() => clearTimeout(timer));

    const what = JSON.stringify(out, null, 1);
    assert.equal(out.origin, origin);
    assert.equal(out.streamError, undefined, what);
    assert.equal(out.status, 200, what);
    assert.match(out.contentType, /^text\/event-stream/, what);
    assert.equal(out.last, 'data: [DONE]', what);
    assert.ok(out.events >= 3, what);
    assert.ok(out.content.length > 0, what);
    assert.equal(out.errorStatus, 401, `the 401 must be readable by the page: ${what}`);
    assert.equal(out.errorCode, 'invalid_api_key', what);
    assert.equal(out.withoutCors, 'refused: TypeError', `a server without --cors-origin: ${what}`);
    assert.equal(out.otherOrigin, 'refused: TypeError', `a server allowing another origin: ${what}`);
    // The browser did preflight: the allowed server answered an OPTIONS with 204.
    assert.match(kv.stderr, /\/v1\/chat\/completions -> 204 /, 'no preflight in the access log');
  });
