import http from 'node:http';

// restart_tokcache.mjs PORT SYS_WORDS prep|turn — one request of the
// conversation bench/restart_tokcache.sh measures; prints the client's time in
// ms ("prep": the conversation up to its last turn, then that turn).
const [port, sysWords, mode] = process.argv.slice(2);
const vocab = ['alpha', 'function', 'return', 'value', 'error', 'file', 'directory', 'build', 'test', 'cache',
  'token', 'prompt', 'server', 'client', 'request', 'module', 'import', 'class', 'struct', 'buffer'];
const word = (i) => vocab[(i * 7919) % vocab.length] + ((i * 104729) % 51);
const msgs = [{ role: 'system', content: Array.from({ length: +sysWords }, (_, i) => word(i)).join(' ') }];
for (let t = 0; t < 3; t++) {
  msgs.push({ role: 'user', content: Array.from({ length: 40 }, (_, i) => word(t * 40 + i)).join(' ') });
  msgs.push({ role: 'assistant', content: `ok ${t}` });
}
msgs.push({ role: 'user', content: 'and now?' });
// One connection per request (no keep-alive: a reused connection's Nagle and
// delayed ACKs would be timed too), the body written in one piece.
function ask(m) {
  const body = Buffer.from(JSON.stringify({ messages: m, max_tokens: 2, temperature: 0 }));
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const req = http.request({ host: '127.0.0.1', port, path: '/v1/chat/completions', method: 'POST', agent: false,
      headers: { 'content-type': 'application/json', 'content-length': body.length } }, (res) => {
      const parts = [];
      res.on('data', (d) => parts.push(d));
      res.on('end', () => {
        const j = JSON.parse(Buffer.concat(parts).toString());
        if (res.statusCode !== 200) reject(new Error(JSON.stringify(j)));
        else resolve([performance.now() - t0, j]);
      });
    });
    req.on('socket', (s) => s.setNoDelay(true));
    req.on('error', reject);
    req.end(body);
  });
}
// a first request sets up node's HTTP client: not the server's time
await new Promise((resolve) => http.get({ host: '127.0.0.1', port, path: '/health', agent: false },
  (res) => { res.resume(); res.on('end', resolve); }));
if (mode === 'prep') {
  await ask(msgs.slice(0, -2));
  const [, j] = await ask(msgs);
  console.log(`prepared: ${j.usage.prompt_tokens} tokens`);
} else {
  const [ms] = await ask(msgs);
  console.log(ms.toFixed(1));
}
