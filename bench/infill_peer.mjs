#!/usr/bin/env node
// infill_peer.mjs — an editor's fill-in-the-middle requests (llama.vim,
// llama.vscode: POST /infill) on each server: a suggestion per keystroke
// while the user types into a file, with the same other files sent as
// context each time. No npm dependencies. Not a test: it prints a markdown
// table.
//
// usage: node bench/infill_peer.mjs URL [URL ...] --name LABEL ...
//   --rounds N       files typed into, each with new content (default 3)
//   --steps N        suggestions per file (default 10: the cursor moves on a line each)
//   --files N        other files in input_extra (default 3)   --file-lines N (default 60)
//   --n-predict N    tokens per suggestion (default 32)
//   --out DIR        write DIR/infill_peer.{md,csv}
// Method: for every step every server in turn (rotating who goes first) gets
// the same request (greedy, cache_prompt true); client-side time to the whole
// reply, the server's timings (prompt_n: tokens prefilled, prompt_ms,
// predicted_per_second). The first step of a round is cold (new files); the
// others follow the cursor. At each round's end, the last request again with
// cache_prompt false: "exact" counts the rounds whose cached reply is that
// uncached one.
import { writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs, median, rng, WORDS, now } from './peer_lib.mjs';

const { opt, lists, rest, die } = parseArgs('infill_peer', process.argv.slice(2), ['name']);
const urls = rest.map((u) => u.replace(/\/+$/, ''));
const num = (k, d, min = 0) => {
  if (opt[k] === undefined) return d;
  const v = Number(opt[k]);
  if (!Number.isInteger(v) || v < min) die(`--${k} wants an integer >= ${min}`);
  return v;
};
const ROUNDS = num('rounds', 3, 1), STEPS = num('steps', 10, 2), FILES = num('files', 3, 0);
const LINES = num('file-lines', 60, 1), NP = num('n-predict', 32, 1);
if (!urls.length || lists.name.length !== urls.length) die('usage: node bench/infill_peer.mjs URL ... --name L ... [options]');

// Code-like text from the bench vocabulary's words: functions of a few lines.
function code(seed, lines) {
  const r = rng(seed);
  const w = () => WORDS[Math.floor(r() * WORDS.length)];
  const out = [];
  while (out.length < lines) {
    out.push(`def ${w()}_${w()}(${w()}, ${w()}):`);
    for (let k = 1 + Math.floor(r() * 4); k > 0; k--) out.push(`    ${w()} = ${w()}(${w()}) + ${w()}`);
    out.push(`    return ${w()}`, '');
  }
  return out.slice(0, lines).join('\n') + '\n';
}

async function infill(url, body) {
  const t0 = now();
  const res = await fetch(`${url}/infill`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  const j = await res.json();
  const ms = now() - t0;
  if (res.status !== 200) throw new Error(`${url}/infill: ${res.status} ${JSON.stringify(j).slice(0, 300)}`);
  return { ms, j };
}

const rows = urls.map(() => ({ cold: [], warm: [], prefilled: [], warmPrefilled: [], tps: [], exact: 0, ends: 0 }));
const csv = ['server,round,step,ms,prompt_n,prompt_tokens,prompt_ms,predicted_per_second'];
for (let round = 0; round < ROUNDS; round++) {
  const extra = [];
  for (let f = 0; f < FILES; f++) extra.push({ filename: `lib${f}.py`, text: code(1000 * round + f + 1, LINES) });
  const file = code(1000 * round + 999, 2 * LINES).split('\n');
  const at = Math.floor(file.length / 2); // the cursor's first line
  let last = null;
  for (let step = 0; step < STEPS; step++) {
    // the cursor a line further each step: what was typed joins the prefix
    const cut = at + step;
    const body = {
      input_extra: extra, input_prefix: file.slice(0, cut).join('\n') + '\n    ',
      input_suffix: '\n' + file.slice(cut + 1).join('\n'), n_predict: NP, temperature: 0, cache_prompt: true,
    };
    last = body;
    for (let k = 0; k < urls.length; k++) {
      const i = (k + step + round) % urls.length;
      const { ms, j } = await infill(urls[i], body);
      const t = j.timings ?? {};
      (step === 0 ? rows[i].cold : rows[i].warm).push(ms);
      rows[i].prefilled.push(t.prompt_n);
      if (step > 0) rows[i].warmPrefilled.push(t.prompt_n);
      rows[i].tps.push(t.predicted_per_second);
      rows[i].last = j.content;
      csv.push([lists.name[i], round, step, ms.toFixed(1), t.prompt_n, j.tokens_evaluated, t.prompt_ms?.toFixed(1),
        t.predicted_per_second?.toFixed(1)].map((x) => JSON.stringify(x ?? '')).join(','));
    }
  }
  for (let i = 0; i < urls.length; i++) {
    const { j } = await infill(urls[i], { ...last, cache_prompt: false });
    rows[i].ends++;
    if (j.content === rows[i].last) rows[i].exact++;
  }
  process.stderr.write(`infill_peer: round ${round + 1}/${ROUNDS} done\n`);
}

const f1 = (x) => (Number.isFinite(x) ? x.toFixed(1) : '-');
const base = median(rows[urls.length - 1].warm);
const lines = [
  `infill_peer: ${ROUNDS} files × ${STEPS} suggestions of ${NP} tokens, ${FILES} other files of ${LINES} lines each`,
  '',
  '| server | first suggestion of a file, ms | later suggestions, ms (median) | vs the last server | tokens prefilled per later suggestion (median) | decode tok/s (median) | cached reply = uncached |',
  '|---|---|---|---|---|---|---|',
];
for (let i = 0; i < urls.length; i++) {
  const r = rows[i];
  lines.push(`| ${lists.name[i]} | ${f1(median(r.cold))} | ${f1(median(r.warm))} | ${(median(r.warm) / base).toFixed(2)}× | ` +
    `${f1(median(r.warmPrefilled))} | ${f1(median(r.tps))} | ${r.exact} of ${r.ends} |`);
}
const md = lines.join('\n') + '\n';
process.stdout.write(md);
if (opt.out) {
  writeFileSync(path.join(opt.out, 'infill_peer.md'), md);
  writeFileSync(path.join(opt.out, 'infill_peer.csv'), csv.join('\n') + '\n');
}
