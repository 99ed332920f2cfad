#!/usr/bin/env node
// draft_cache.mjs — what caching a draft model's KV buys (issue 36): a
// conversation comes back to its only slot after another took it, on kvstash
// with a draft model, its draft KV cached (the default: the draft model's
// store gives the conversation back) beside the same server with
// KS_DRAFT_CACHE=0 (the draft model decodes the whole prompt again, after the
// first token). Per round, on each server in turn: conversation A (a long
// system prompt), then B (takes the slot), then A's next turn — measured: its
// TTFT, its whole reply's time, its decode tok/s after the first token, and
// the prompt tokens the draft model decoded (from /metrics). Replies are
// compared (they must be the same: drafts never change a token). Not a test.
//
// usage: node bench/draft_cache.mjs --kvstash BIN --model TARGET --draft DRAFT [--threads 2]
//   [--rounds 3] [--sys-words 1200] [--max-tokens 128] [--out DIR]
import { writeFileSync, mkdirSync } from 'node:fs';
import path from 'node:path';
import { parseArgs, median, words, streamChat, freePort, startServer, stopServer, metric } from './peer_lib.mjs';

const { str, die } = parseArgs('draft_cache', process.argv.slice(2));
const KS = str('kvstash') || die('--kvstash BIN');
const MODEL = str('model') || die('--model TARGET');
const DRAFT = str('draft') || die('--draft DRAFT');
const THREADS = str('threads', '2'), ROUNDS = Number(str('rounds', '3'));
const SYS = Number(str('sys-words', '1200')), MT = Number(str('max-tokens', '128')), OUT = str('out', '');

async function start(kind) {
  const port = await freePort();
  if (kind === 'no-cache') process.env.KS_DRAFT_CACHE = '0';
  else delete process.env.KS_DRAFT_CACHE;
  return startServer(kind, KS, ['serve', '-m', MODEL, '-md', DRAFT, '--port', String(port), '--threads', THREADS,
    '--slots', '1', '--ctx', '4096', '--log', 'info'], port);
}

const res = { cache: [], 'no-cache': [] };
for (let r = 0; r < ROUNDS; r++) {
  for (const kind of r % 2 ? ['no-cache', 'cache'] : ['cache', 'no-cache']) {
    const s = await start(kind);
    try {
      const a = [{ role: 'system', content: `You are a helpful assistant. ${words(SYS, 300 + r)}` },
        { role: 'user', content: words(40, 400 + r) }];
      const body = (m) => ({ messages: m, max_tokens: MT, temperature: 0, ignore_eos: true });
      const a1 = await streamChat(s.url, body(a));
      await streamChat(s.url, body([{ role: 'user', content: words(60, 500 + r) }]));
      a.push({ role: 'assistant', content: a1.text }, { role: 'user', content: words(40, 600 + r) });
      const p0 = await metric(s.url, 'kvstash_draft_model_prefill_tokens_total');
      const x = await streamChat(s.url, body(a));
      const p1 = await metric(s.url, 'kvstash_draft_model_prefill_tokens_total');
      const decodeS = (x.times.at(-1) - x.times[0]) / 1000;
      res[kind].push({ ttft: x.ttft, total: x.total, tps: (x.times.length - 1) / decodeS, draftPrefill: p1 - p0,
        prompt: x.usage?.prompt_tokens, cached: x.usage?.prompt_tokens_details?.cached_tokens, text: x.text,
        drafted: x.timings?.draft_n, accepted: x.timings?.draft_n_accepted });
    } finally {
      await stopServer(s);
    }
    process.stderr.write(`draft_cache: round ${r + 1}/${ROUNDS} ${kind} done\n`);
  }
}
const same = res.cache.filter((x, i) => x.text === res['no-cache'][i].text).length;
const f = (v, d = 0) => (Number.isFinite(v) ? v.toFixed(d) : '–');
const row = (k) => {
  const xs = res[k];
  return `| ${k === 'cache' ? 'draft KV cached (default)' : 'KS_DRAFT_CACHE=0'} | ${f(median(xs.map((x) => x.ttft)))} | ` +
    `${f(median(xs.map((x) => x.total)))} | ${f(median(xs.map((x) => x.tps)), 1)} | ${f(median(xs.map((x) => x.draftPrefill)))} | ` +
    `${xs[0].cached}/${xs[0].prompt} | ${f(median(xs.map((x) => x.accepted)))}/${f(median(xs.map((x) => x.drafted)))} |`;
};
const md = ['| server | TTFT ms | whole reply ms | decode tok/s after the first token | prompt tokens the draft model decoded | target cached/prompt | drafts kept/verified |',
  '|---|--:|--:|--:|--:|--:|--:|', row('cache'), row('no-cache')].join('\n') +
  `\n\nMedians of ${ROUNDS} rounds; the returning turn's replies the same on both: ${same} of ${ROUNDS}.\n`;
process.stdout.write(md);
if (OUT) {
  mkdirSync(OUT, { recursive: true });
  writeFileSync(path.join(OUT, 'draft_cache.md'), md);
}
