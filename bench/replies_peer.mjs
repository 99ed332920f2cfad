// replies_peer.mjs — does a cached turn give the reply an uncached one gives?
// A few conversations of long greedy replies go to each server; every turn is
// sent twice, with the server's prompt cache (cache_prompt: true: the history
// comes back from the slot, generated tokens included, which the server
// decoded one at a time) and without it (cache_prompt: false: the whole prompt
// prefilled as a batch), and the two replies are compared. A server whose
// kernels compute a token decoded alone as it computes it inside a batch gives
// the same reply both ways on every turn; elsewhere a difference in the last
// bits of a logit can flip a greedy pick, and from there the rest of the
// reply. Each conversation goes on with the cached reply, as a client does.
//
// usage: node bench/replies_peer.mjs URL [URL ...] [--key value ...]
//   --name LABEL     a server's label, once per URL in the same order
//   --convs N        conversations per server (default 3)
//   --turns N        turns per conversation (default 4)
//   --max-tokens N   reply length (default 128; ignore_eos makes every reply that long)
//   --sys-words N    words of each conversation's system prompt (default 120)
//   --msg-words N    words of each user message (default 40)
//   --gap-ms N       wait before each request (default 0)
//   --base URL       speculation instead of the cache: once per URL, the same server's family
//                    without speculation; each turn is sent to both with cache_prompt: false and
//                    the replies compared (the URL's has speculation, the base's none)
//   --out DIR        write DIR/replies_peer.{md,csv} too
// Method: for each conversation and turn, each server in turn (rotating who
// goes first) gets the cached request, then the uncached one, streamed,
// temperature 0, ignore_eos. Reported per server: turns, identical turns, and
// for the others the reply token where the two first differ (counted in
// whitespace-separated words of the text); the TTFT of the cached and the
// uncached request (medians).
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs, median, words, label, streamChat } from './peer_lib.mjs';

const { opt, lists, rest, die } = parseArgs('replies_peer', process.argv.slice(2), ['name', 'base']);
const urls = rest.map((u) => u.replace(/\/+$/, ''));
const num = (k, d, min = 1) => {
  if (opt[k] === undefined) return d;
  const v = Number(opt[k]);
  if (!Number.isInteger(v) || v < min) die(`--${k} wants an integer >= ${min}`);
  return v;
};
if (!urls.length) die('usage: node bench/replies_peer.mjs URL [URL ...] [--name LABEL ...] [--convs N] [--turns N] ' +
  '[--max-tokens N] [--sys-words N] [--msg-words N] [--gap-ms N] [--out DIR]');
const CONVS = num('convs', 3), TURNS = num('turns', 4), MT = num('max-tokens', 128);
const SW = num('sys-words', 120), UW = num('msg-words', 40), GAP = num('gap-ms', 0, 0);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const names = lists.name.length ? lists.name : await Promise.all(urls.map(label));
if (names.length !== urls.length) die('--name: give one per URL, or none');
const BASES = lists.base.map((u) => u.replace(/\/+$/, ''));
const SPEC = BASES.length > 0;
if (SPEC && BASES.length !== urls.length) die('--base: give one per URL');

async function ask(url, messages, cache) {
  if (GAP) await sleep(GAP);
  const r = await streamChat(url, { messages, max_tokens: MT, temperature: 0, ignore_eos: true, cache_prompt: cache });
  return { text: r.text, ttft: r.ttft, tokens: r.usage ? r.usage.completion_tokens : NaN };
}

// The first whitespace-separated word where a and b differ (1-based), 0 if equal.
function firstDiff(a, b) {
  if (a === b) return 0;
  const x = a.split(/(\s+)/), y = b.split(/(\s+)/);
  let w = 0;
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    if (x[i] !== y[i]) return w + 1;
    if (x[i] && x[i].trim()) w++;
  }
  return w + 1;
}

const hist = urls.map(() => Array.from({ length: CONVS }, (_, c) =>
  [{ role: 'system', content: `${words(SW, 7000 + c)}.` }]));
const rows = urls.map(() => []);
process.stderr.write(`replies_peer: ${urls.length} server(s), ${CONVS} conversations x ${TURNS} turns, ` +
  `${MT}-token replies, ${SW}-word system prompts, ${UW}-word messages\n`);
for (let c = 0; c < CONVS; c++) {
  for (let t = 0; t < TURNS; t++) {
    const user = `${words(UW, 100 * c + t + 1)}?`;
    const line = [];
    for (let k = 0; k < urls.length; k++) {
      const s = (c * TURNS + t + k) % urls.length; // rotate who goes first
      const msgs = hist[s][c];
      msgs.push({ role: 'user', content: user });
      // cache mode: the cached request, then the uncached one; speculation
      // mode: the server with it, then its family's without (no cache either)
      const a = await ask(urls[s], msgs, !SPEC);
      const b = await ask(SPEC ? BASES[s] : urls[s], msgs, false);
      const d = firstDiff(a.text, b.text);
      rows[s].push({ conv: c + 1, turn: t + 1, same: d === 0, diff: d, ttft_cached: a.ttft, ttft_uncached: b.ttft,
        tokens: a.tokens });
      if (a.tokens !== MT) process.stderr.write(`replies_peer: warning: ${names[s]} replied ${a.tokens} tokens, not ${MT}\n`);
      msgs.push({ role: 'assistant', content: a.text });
      line.push(`${names[s]} ${d === 0 ? 'same' : `differs at word ${d}`}`);
    }
    process.stderr.write(`conversation ${c + 1} turn ${t + 1}: ${line.join('; ')}\n`);
  }
}

const f = (x, d = 0) => (Number.isFinite(x) ? x.toFixed(d) : '–');
const hdr = SPEC
  ? ['server', 'turns', 'identical (speculation = none)', 'differing turns: conversation.turn@word',
    'TTFT with speculation ms (median)', 'TTFT without ms (median)']
  : ['server', 'turns', 'identical (cached = uncached)', 'differing turns: conversation.turn@word',
    'TTFT cached ms (median)', 'TTFT uncached ms (median)'];
const table = urls.map((u, s) => {
  const xs = rows[s];
  const diffs = xs.filter((x) => !x.same).map((x) => `${x.conv}.${x.turn}@${x.diff}`);
  return [names[s], xs.length, xs.filter((x) => x.same).length, diffs.length ? diffs.join(' ') : '—',
    f(median(xs.map((x) => x.ttft_cached))), f(median(xs.map((x) => x.ttft_uncached)))];
});
const md = [`| ${hdr.join(' | ')} |`, `|---|${hdr.slice(1).map(() => '--:').join('|')}|`,
  ...table.map((r) => `| ${r.join(' | ')} |`)].join('\n');
const note = SPEC
  ? `${CONVS} conversations x ${TURNS} turns per server, each turn sent to it (speculation) and to its family's ` +
    `server without speculation, both without the cache (cache_prompt: false), greedy, ${MT} tokens with ` +
    `ignore_eos, ${SW}-word system prompts, ${UW}-word messages; each conversation goes on with the reply with ` +
    'speculation.'
  : `${CONVS} conversations x ${TURNS} turns per server, each turn sent with the cache and without ` +
    `(cache_prompt: false), greedy, ${MT} tokens with ignore_eos, ${SW}-word system prompts, ${UW}-word messages; ` +
    'each conversation goes on with the cached reply.';
process.stdout.write(`${md}\n\n${note}\n`);
if (opt.out) {
  writeFileSync(path.join(opt.out, SPEC ? 'replies_peer_spec.md' : 'replies_peer.md'), `${md}\n\n${note}\n`);
  const csv = ['server,conversation,turn,identical,first_diff_word,ttft_cached_ms,ttft_uncached_ms,tokens',
    ...urls.flatMap((u, s) => rows[s].map((x) => [JSON.stringify(names[s]), x.conv, x.turn, x.same ? 1 : 0, x.diff,
      f(x.ttft_cached, 1), f(x.ttft_uncached, 1), x.tokens].join(',')))].join('\n');
  writeFileSync(path.join(opt.out, SPEC ? 'replies_peer_spec.csv' : 'replies_peer.csv'), csv + '\n');
}
