#!/usr/bin/env python3
"""clients.py — the benchmark clients of bench/gpu/run.sh, in Python's standard
library (the GPU machine has python3 and no node).

They are ports of the node clients the CPU benchmarks use, with the same
workloads and the same method, so that the GPU numbers compare with those:
  turns   bench/turns_peer.mjs: one multi-turn conversation sent side by side to
          every server (each keeps its own history of its own greedy replies),
          streamed, TTFT at the first content chunk; the same seeded words
          (peer_lib.mjs's mulberry32 and word list, checked equal).
  decode  bench/decode_peer.mjs: single-stream decode, ignore_eos, client tok/s
          = (content chunks - 1) / (last chunk - first chunk).
  exact   cached == uncached (issue 26): per server, C conversations of T turns
          of greedy replies of N tokens; every turn is sent with cache_prompt
          true (and its reply goes into the history), then the same messages
          again with cache_prompt false; the turn counts as equal when both
          replies are the same text.
Each writes a markdown table to stdout and, with --out PREFIX, PREFIX.md and
PREFIX.json. Not a test: nothing fails on a number.

usage: clients.py turns  URL... [--name N ...] [--turns 10] [--sys-words 300] [--msg-words 60] [--max-tokens 32]
       clients.py decode URL... [--name N ...] [--rounds 5] [--max-tokens 128] [--prompt-words 32]
       clients.py exact  URL... [--name N ...] [--convs 3] [--turns 6] [--max-tokens 128]
       clients.py restart URL --phase prep|warm|resume|resume-warm --state FILE [--turns 6] [--sys-words] [--msg-words]
       clients.py subagents URL... [--name N ...] [--agents 6] [--rounds 4] [--sys-words] [--msg-words]
       (all: --out PREFIX, --deadline UNIX_SECONDS: stop starting requests after it)
"""
import argparse
import http.client
import json
import sys
import time
import urllib.parse

# peer_lib.mjs's WORDS, in the same order (every word one token of the bench model).
WORDS = ('water river mountain city tree house school music paper story friend family animal country '
         'world people ocean island garden morning night light color sound road street town car boat plane ship '
         'horse bird dog fish food book letter song game rock fire wind rain snow sun moon star earth field farm '
         'plant wood stone gold king war money power machine system problem question answer example idea science '
         'language number word sentence picture travel remember learn study teach listen watch build carry follow '
         'change begin start open close walk run draw paint write read think feel talk sing play help small large '
         'great little old young new good best better early late long short high low deep warm cold hot dark clear '
         'quick slow simple special common north south east west between together always often never after before '
         'during toward against through under above near about because while until since every several enough many').split(' ')

M32 = 0xffffffff


def _imul(a, b):
    return (a * b) & M32


def rng(seed):
    """peer_lib.mjs's mulberry32, bit for bit (unsigned 32-bit arithmetic)."""
    state = [((seed & M32) ^ 0x9e3779b9) & M32]

    def nxt():
        state[0] = (state[0] + 0x6d2b79f5) & M32
        t = state[0]
        t = _imul(t ^ (t >> 15), t | 1)
        t ^= (t + _imul(t ^ (t >> 7), t | 61)) & M32
        return ((t ^ (t >> 14)) & M32) / 4294967296.0
    return nxt


def words(n, seed, lst=WORDS):
    r = rng(seed)
    return ' '.join(lst[int(r() * len(lst))] for _ in range(n))


def median(xs):
    v = sorted(x for x in xs if x == x)
    if not v:
        return float('nan')
    h = len(v) // 2
    return v[h] if len(v) % 2 else (v[h - 1] + v[h]) / 2


DEADLINE = [float('inf')]


class Late(Exception):
    pass


def stream_chat(url, body, timeout=300):
    """POST url/v1/chat/completions with stream; returns dict(ttft, total, times, text, finish, usage, timings, cache).
    Times in ms (perf_counter)."""
    if time.time() > DEADLINE[0]:
        raise Late('deadline passed')
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    payload = dict(body, stream=True, stream_options={'include_usage': True})
    t0 = time.perf_counter()
    conn.request('POST', '/v1/chat/completions', json.dumps(payload), {'Content-Type': 'application/json'})
    res = conn.getresponse()
    if res.status != 200:
        raise RuntimeError(f'{url}: HTTP {res.status} {res.read()[:400]!r}')
    out = dict(ttft=float('nan'), times=[], text='', finish=None, usage=None, timings=None, cache=None)
    while True:
        line = res.readline()
        if not line:
            break
        t = time.perf_counter()
        line = line.strip()
        if not line.startswith(b'data:'):
            continue
        d = line[5:].strip()
        if d == b'[DONE]':
            continue
        j = json.loads(d)
        if j.get('error'):
            raise RuntimeError(f'{url}: stream error {j["error"]}')
        ch = (j.get('choices') or [None])[0]
        piece = (ch.get('delta') or {}).get('content') if ch else None
        if out['ttft'] != out['ttft'] and (piece or (ch and ch.get('finish_reason'))):
            out['ttft'] = (t - t0) * 1000
        if piece:
            out['times'].append(t * 1000)
            out['text'] += piece
        if ch and ch.get('finish_reason'):
            out['finish'] = ch['finish_reason']
        for k in ('usage', 'timings', 'cache'):
            if j.get(k):
                out[k] = j[k]
    out['total'] = (time.perf_counter() - t0) * 1000
    conn.close()
    return out


def post(url, path, body, timeout=300):
    if time.time() > DEADLINE[0]:
        raise Late('deadline passed')
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    conn.request('POST', path, json.dumps(body), {'Content-Type': 'application/json'})
    res = conn.getresponse()
    data = res.read()
    conn.close()
    if res.status != 200:
        raise RuntimeError(f'{url}{path}: HTTP {res.status} {data[:400]!r}')
    return json.loads(data)


def f(x, d=0):
    return '–' if x != x or x is None else f'{x:.{d}f}'


def fr(x):
    return '–' if x != x else f'{x:.2f}×'


def cached_of(r):
    tm = r.get('timings') or {}
    if isinstance(tm.get('cache_n'), int):
        return tm['cache_n']
    us = r.get('usage') or {}
    return (us.get('prompt_tokens_details') or {}).get('cached_tokens', float('nan'))


def write(prefix, text, data):
    sys.stdout.write(text)
    if prefix:
        with open(prefix + '.md', 'w') as fh:
            fh.write(text)
        with open(prefix + '.json', 'w') as fh:
            json.dump(data, fh, indent=1)


# ------------------------------------------------------------------ turns
def cmd_turns(a, urls, names):
    n = len(urls)
    for u in urls:  # warm-up, as turns_peer.mjs
        stream_chat(u, {'messages': [{'role': 'user', 'content': words(40, 77)}], 'max_tokens': 2,
                        'temperature': 0})
    system = words(a.sys_words, 500)
    convs = [[{'role': 'system', 'content': system}] if a.sys_words > 0 else [] for _ in urls]
    res = [[] for _ in urls]
    differ = 0
    done = 0
    stopped = ''
    try:
        for t in range(1, a.turns + 1):
            user = words(a.msg_words, 10000 + t)
            for k in range(n):
                s = (t - 1 + k) % n
                convs[s].append({'role': 'user', 'content': user})
                x = stream_chat(urls[s], {'messages': convs[s], 'max_tokens': a.max_tokens, 'temperature': 0,
                                          'cache_prompt': True})
                convs[s].append({'role': 'assistant', 'content': x['text']})
                us = x['usage'] or {}
                tm = x['timings'] or {}
                prompt = us.get('prompt_tokens', float('nan'))
                c = cached_of(x)
                res[s].append(dict(ttft=x['ttft'], total=x['total'], prompt=prompt, cached=c,
                                   new=tm.get('prompt_n', prompt - c if c == c else float('nan')),
                                   prompt_ms=tm.get('prompt_ms', float('nan')),
                                   completion=us.get('completion_tokens', float('nan')), text=x['text']))
            texts = [res[s][t - 1]['text'] for s in range(n)]
            differ += any(tx != texts[0] for tx in texts)
            done = t
            sys.stderr.write(f'turn {t}: ' + '; '.join(
                f'{names[s]} {f(res[s][t - 1]["ttft"])} ms (prompt {res[s][t - 1]["prompt"]}, cached '
                f'{res[s][t - 1]["cached"]})' for s in range(n)) + '\n')
    except (Late, RuntimeError, OSError) as e:
        stopped = f'Stopped after {done} turns: {e}'[:600]
        sys.stderr.write(f'turns: {stopped}\n')
    hdr = ['turn', 'prompt tok']
    for s in range(n):
        hdr += [f'{names[s]} TTFT ms', f'{names[s]} cached/new']
        if s:
            hdr.append(f'{names[0]}/{names[s]}')
    rows = []
    for t in range(done):
        row = [str(t + 1), ' / '.join(f(res[s][t]['prompt']) for s in range(n))]
        for s in range(n):
            x = res[s][t]
            row += [f(x['ttft']), f'{f(x["cached"])}/{f(x["new"])}']
            if s:
                row.append(fr(res[0][t]['ttft'] / x['ttft']))
        rows.append(row)
    lines = ['| ' + ' | '.join(hdr) + ' |', '|' + '|'.join('--:' for _ in hdr) + '|']
    lines += ['| ' + ' | '.join(r) + ' |' for r in rows]
    last = res[0][done - 1] if done else None
    lines += ['', f'One conversation of {done} turns (of {a.turns}): a {a.sys_words}-word system prompt, '
              f'{a.msg_words}-word user messages, replies of at most {a.max_tokens} tokens (greedy, streamed, '
              f'cache_prompt), grown to {f(last["prompt"] + last["completion"]) if last else "–"} tokens. Every server '
              f'keeps its own history; turn t goes to every server before t+1, rotating who goes first; TTFT '
              f'client-side to the first content chunk (method of bench/turns_peer.mjs). Turns whose replies differ '
              f'between servers: {differ} of {done}.', '']
    if stopped:
        lines += [f'**{stopped}**', '']
    summary = {}
    lo = a.summary_from
    for s in range(1, n):
        later = [res[0][t]['ttft'] / res[s][t]['ttft'] for t in range(lo - 1, done)]
        m0 = median([res[0][t]['ttft'] for t in range(lo - 1, done)])
        ms = median([res[s][t]['ttft'] for t in range(lo - 1, done)])
        summary[names[s]] = dict(median_ratio=median(later), median_ttft_first=m0, median_ttft_other=ms)
        lines.append(f'**{names[0]} TTFT / {names[s]} TTFT**, turns {lo}–{done}: median {fr(median(later))}; '
                     f'median TTFT {names[0]} {f(m0, 1)} ms, {names[s]} {f(ms, 1)} ms; turn 1 (cold) '
                     f'{fr(res[0][0]["ttft"] / res[s][0]["ttft"]) if done else "–"}.')
    write(a.out, '\n'.join(lines) + '\n', dict(names=names, urls=urls, turns=res, summary=summary, differ=differ))


# ------------------------------------------------------------------ decode
def cmd_decode(a, urls, names):
    n = len(urls)
    for u in urls:
        stream_chat(u, {'messages': [{'role': 'user', 'content': words(a.prompt_words, 1)}], 'max_tokens': 8,
                        'temperature': 0, 'ignore_eos': True})
    res = [[] for _ in urls]
    stopped = ''
    try:
        for r in range(a.rounds):
            content = words(a.prompt_words, 1000 + r)
            for k in range(n):
                s = (r + k) % n
                x = stream_chat(urls[s], {'messages': [{'role': 'user', 'content': content}],
                                          'max_tokens': a.max_tokens, 'temperature': 0, 'ignore_eos': True})
                tm = x['times']
                chunks = len(tm)
                ntok = (x['usage'] or {}).get('completion_tokens', chunks)
                steps = chunks - 1 if chunks == ntok else ntok - 1
                dt = (tm[-1] - tm[0]) / 1000 if chunks > 1 else float('nan')
                res[s].append(dict(tps=steps / dt if dt == dt and dt > 0 else float('nan'), ttft=x['ttft'],
                                   server_tps=(x['timings'] or {}).get('predicted_per_second', float('nan')),
                                   chunks=chunks, tokens=ntok))
    except (Late, RuntimeError, OSError) as e:
        stopped = f'Stopped: {e}'[:600]
        sys.stderr.write(f'decode: {stopped}\n')
    lines = ['| server | client tok/s (median) | min | max | server tok/s | TTFT ms | rounds |',
             '|---|--:|--:|--:|--:|--:|--:|']
    summary = {}
    for s in range(n):
        v = [x['tps'] for x in res[s]]
        summary[names[s]] = median(v)
        lines.append(f'| {names[s]} | {f(median(v), 1)} | {f(min(v) if v else float("nan"), 1)} | '
                     f'{f(max(v) if v else float("nan"), 1)} | {f(median([x["server_tps"] for x in res[s]]), 1)} | '
                     f'{f(median([x["ttft"] for x in res[s]]), 1)} | {len(v)} |')
    if n > 1 and summary[names[1]] == summary[names[1]]:
        lines += ['', f'**{names[0]} / {names[1]}** decode: {fr(summary[names[0]] / summary[names[1]])}.']
    lines += ['', f'Single stream, {a.max_tokens} tokens per request (ignore_eos, greedy, streamed), a '
              f'{a.prompt_words}-word prompt; client tok/s = (content chunks - 1) / (last - first chunk) '
              f'(method of bench/decode_peer.mjs).']
    if stopped:
        lines += ['', f'**{stopped}**']
    write(a.out, '\n'.join(lines) + '\n', dict(names=names, urls=urls, rounds=res, summary=summary))


# ------------------------------------------------------------------ exact
def cmd_exact(a, urls, names):
    out = {}
    lines = ['| server | cached == uncached (turns) | first differing turns |', '|---|--:|---|']
    for s, u in enumerate(urls):
        same, total, diffs = 0, 0, []
        try:
            for c in range(a.convs):
                msgs = [{'role': 'system', 'content': words(60, 900 + c)}]
                for t in range(a.turns):
                    msgs.append({'role': 'user', 'content': words(40, 2000 + 100 * c + t)})
                    body = {'messages': msgs, 'max_tokens': a.max_tokens, 'temperature': 0}
                    r1 = post(u, '/v1/chat/completions', dict(body, cache_prompt=True))
                    r2 = post(u, '/v1/chat/completions', dict(body, cache_prompt=False))
                    t1 = r1['choices'][0]['message'].get('content') or ''
                    t2 = r2['choices'][0]['message'].get('content') or ''
                    total += 1
                    if t1 == t2:
                        same += 1
                    else:
                        k = next((i for i, (x, y) in enumerate(zip(t1, t2)) if x != y), min(len(t1), len(t2)))
                        diffs.append(f'c{c + 1}t{t + 1}@{k}ch')
                    msgs.append({'role': 'assistant', 'content': t1})
        except (Late, RuntimeError, OSError) as e:
            diffs.append(f'stopped: {e}'[:300])
            sys.stderr.write(f'exact: {names[s]}: {e}\n')
        out[names[s]] = dict(same=same, total=total, diffs=diffs)
        lines.append(f'| {names[s]} | {same}/{total} | {", ".join(diffs[:6]) or "–"} |')
    lines += ['', f'{a.convs} conversations × {a.turns} turns, greedy replies of at most {a.max_tokens} tokens; each '
              'turn sent with cache_prompt true (its reply goes into the history), then again with cache_prompt '
              'false; equal = the same reply text. cCtT@K: conversation C, turn T, first difference at character K.']
    write(a.out, '\n'.join(lines) + '\n', dict(names=names, urls=urls, results=out))


# ------------------------------------------------------------------ restart
def conv_turn(url, msgs, a):
    x = stream_chat(url, {'messages': msgs, 'max_tokens': a.max_tokens, 'temperature': 0, 'cache_prompt': True})
    us = x['usage'] or {}
    return dict(ttft=x['ttft'], prompt=us.get('prompt_tokens', float('nan')), cached=cached_of(x),
                cache=x['cache'], text=x['text'])


def cmd_restart(a, urls, names):
    """The first request after a restart against the same turn in a warm
    process, on one kvstash. phase prep: turns 1..T-1 (the long conversation's
    shape), the conversation kept in --state; the process is then stopped and
    a new one started on the same --cache-dir. phase resume: turn T, the first
    request of the new process (it restores what the store kept). phase warm
    (a third process, no store needed): turns 1..T, the reference turn T."""
    url = urls[0]
    system = words(a.sys_words, 500)
    msgs = [{'role': 'system', 'content': system}]
    if a.phase in ('prep', 'warm'):
        stream_chat(url, {'messages': [{'role': 'user', 'content': words(40, 77)}], 'max_tokens': 2,
                          'temperature': 0})
        last = a.turns - 1 if a.phase == 'prep' else a.turns
        rows = []
        for t in range(1, last + 1):
            msgs.append({'role': 'user', 'content': words(a.msg_words, 10000 + t)})
            x = conv_turn(url, msgs, a)
            rows.append(x)
            sys.stderr.write(f'{a.phase} turn {t}: {f(x["ttft"])} ms, prompt {x["prompt"]}, cached {x["cached"]}\n')
            msgs.append({'role': 'assistant', 'content': x['text']})
        st = {}
        try:
            with open(a.state) as fh:
                st = json.load(fh)
        except OSError:
            pass
        st['msgs' if a.phase == 'prep' else 'warm'] = msgs if a.phase == 'prep' else rows[-1]
        with open(a.state, 'w') as fh:
            json.dump(st, fh)
        return
    with open(a.state) as fh:
        st = json.load(fh)
    msgs = st['msgs'] + [{'role': 'user', 'content': words(a.msg_words, 10000 + a.turns)}]
    x = conv_turn(url, msgs, a)
    st['restarted-warm-slots' if a.phase == 'resume-warm' else 'restarted'] = x
    with open(a.state, 'w') as fh:
        json.dump(st, fh)
    warm = st.get('warm')
    if not warm:
        return
    lines = ['| process | turn | prompt tok | cached | TTFT ms | cache |', '|---|--:|--:|--:|--:|---|',
             f'| warm (the same process since turn 1) | {a.turns} | {warm["prompt"]} | {warm["cached"]} | '
             f'{f(warm["ttft"], 1)} | {(warm["cache"] or {}).get("mode", "–")} |']
    got = [(k, st[k]) for k in ('restarted', 'restarted-warm-slots') if k in st]
    for k, y in got:
        c = y['cache'] or {}
        how = 'restarted (its first request)' if k == 'restarted' else 'restarted with --warm-slots all'
        lines.append(f'| {how} | {a.turns} | {y["prompt"]} | {y["cached"]} | {f(y["ttft"], 1)} | '
                     f'{c.get("mode", "–")} {c.get("tier", "")} restore {f(c.get("restore_ms", float("nan")), 1)} ms |')
    lines.append('')
    for k, y in got:
        lines.append(f'**{k} / warm** TTFT of turn {a.turns}: {fr(y["ttft"] / warm["ttft"])}; replies '
                     f'{"equal" if y["text"] == warm["text"] else "differ"}.')
    lines += ['',
             f'A conversation of {a.turns} turns ({a.sys_words}-word system prompt, {a.msg_words}-word user '
             f'messages, greedy replies of at most {a.max_tokens} tokens) on kvstash with --cache-dir: turns '
             f'1-{a.turns - 1} in one process, stopped with SIGTERM, turn {a.turns} in a new one on the same '
             f'directories (with --warm-slots all: a new one on a copy of them taken before the first '
             f'resumed; it puts the stored conversation into a slot before it serves); the reference is turn '
             f'{a.turns} in a process that ran all {a.turns}.']
    write(a.out, '\n'.join(lines) + '\n', dict(warm=warm, **dict(got)))


# ------------------------------------------------------------------ spec
def cmd_spec(a, urls, names):
    """Speculative decoding on kvstash (its default, n-gram drafts) against the
    same server without drafts for the request ("speculative.n_max": 0):
    decode speed and whether each reply is the reply without drafts; greedy,
    then sampled at temperature 1 with a seed (drafts rejected: what
    speculation costs when it does not pay). spec_peer.mjs's prompts."""
    url = urls[0]
    stream_chat(url, {'messages': [{'role': 'user', 'content': words(20, 1)}], 'max_tokens': 8, 'temperature': 0})
    out, lines, stopped = {}, [], ''
    lines += ['| replies | with drafts, tok/s (median) | without | ratio | drafted / accepted per reply (median) '
              '| the same reply |', '|---|--:|--:|--:|--:|--:|']
    for temp in (0, 1):
        on, off, drafted, kept, same = [], [], [], [], 0
        try:
            for p in range(a.prompts):
                msgs = [{'role': 'system', 'content': words(120, 1000 + p)},
                        {'role': 'user', 'content': words(40, 2000 + p)}]
                body = {'messages': msgs, 'max_tokens': a.max_tokens, 'temperature': temp, 'ignore_eos': True,
                        'seed': 42 + p, 'cache_prompt': False}
                got = {}
                for k in ((0, 1) if p % 2 == 0 else (1, 0)):
                    x = stream_chat(url, body if k == 0 else dict(body, **{'speculative.n_max': 0}))
                    tm = x['times']
                    ntok = (x['usage'] or {}).get('completion_tokens', len(tm))
                    dt = (tm[-1] - tm[0]) / 1000 if len(tm) > 1 else float('nan')
                    got[k] = dict(tps=(ntok - 1) / dt if dt == dt and dt > 0 else float('nan'), text=x['text'],
                                  t=x['timings'] or {})
                on.append(got[0]['tps'])
                off.append(got[1]['tps'])
                drafted.append(got[0]['t'].get('draft_n', 0))
                kept.append(got[0]['t'].get('draft_n_accepted', 0))
                same += got[0]['text'] == got[1]['text']
        except (Late, RuntimeError, OSError) as e:
            stopped = f'Stopped: {e}'[:600]
            sys.stderr.write(f'spec: {stopped}\n')
        key = 'greedy' if temp == 0 else 'sampled'
        out[key] = dict(on=on, off=off, drafted=drafted, accepted=kept, same=same)
        lines.append(f'| {key} ({len(on)}) | {f(median(on), 1)} | {f(median(off), 1)} | '
                     f'{fr(median(on) / median(off)) if off else "–"} | {f(median(drafted))} / {f(median(kept))} | '
                     f'{same}/{len(on)} |')
        if stopped:
            break
    lines += ['', f'{names[0]}: {a.prompts} prompts (a 120-word system prompt, a 40-word message), {a.max_tokens}-token '
              'replies (ignore_eos, no cache), each with the server\'s speculation and with "speculative.n_max": 0, '
              'the order alternating; tok/s = (tokens - 1) / (last - first content chunk).']
    if stopped:
        lines += ['', f'**{stopped}**']
    write(a.out, '\n'.join(lines) + '\n', out)


# ------------------------------------------------------------------ behind
def cmd_behind(a, urls, names):
    """A request right behind a finished one against one sent after a pause:
    one long conversation (the long step's shape), its turns sent alternately
    at once after the previous reply and after --pause-s seconds; TTFT of
    each kind (the server's work between requests — a finish save copying
    the state off the device — shows in the first kind only)."""
    url = urls[0]
    msgs = [{'role': 'system', 'content': words(a.sys_words, 700)}]
    rows, stopped = [], ''
    try:
        for t in range(1, a.turns + 1):
            msgs.append({'role': 'user', 'content': words(a.msg_words, 20000 + t)})
            kind = 'first' if t == 1 else ('behind' if t % 2 == 0 else 'pause')
            if kind == 'pause':
                time.sleep(a.pause_s)
            x = conv_turn(url, msgs, a)
            rows.append(dict(turn=t, kind=kind, ttft=x['ttft'], prompt=x['prompt'], cached=x['cached']))
            sys.stderr.write(f'behind turn {t} ({kind}): {f(x["ttft"])} ms, prompt {x["prompt"]}, cached {x["cached"]}\n')
            msgs.append({'role': 'assistant', 'content': x['text']})
    except (Late, RuntimeError, OSError) as e:
        stopped = f'Stopped: {e}'[:600]
        sys.stderr.write(f'behind: {stopped}\n')
    b = [r['ttft'] for r in rows if r['kind'] == 'behind' and r['turn'] >= 3]
    pz = [r['ttft'] for r in rows if r['kind'] == 'pause' and r['turn'] >= 3]
    lines = ['| turn | sent | prompt tok | cached | TTFT ms |', '|--:|---|--:|--:|--:|']
    lines += [f'| {r["turn"]} | {r["kind"]} | {r["prompt"]} | {r["cached"]} | {f(r["ttft"], 1)} |' for r in rows]
    lines += ['', f'**right behind / after a {a.pause_s:g} s pause** (median TTFT, turns 3+): '
              f'{f(median(b), 1)} / {f(median(pz), 1)} ms = {fr(median(b) / median(pz)) if b and pz else "–"}.',
              '', f'{names[0]}: one conversation ({a.sys_words}-word system prompt, {a.msg_words}-word messages, '
              f'{a.max_tokens}-token greedy replies); even turns sent as soon as the previous reply ended, odd ones '
              f'after {a.pause_s:g} s.']
    if stopped:
        lines += ['', f'**{stopped}**']
    write(a.out, '\n'.join(lines) + '\n', dict(rows=rows))


# ------------------------------------------------------------------ sub-agents
def cmd_subagents(a, urls, names):
    """A sub-agents on few slots: A conversations sharing a system prompt, one
    turn each in turn, R rounds; every server gets the same requests (each its
    own histories). TTFT of rounds 2..R, median per server."""
    n = len(urls)
    system = words(a.sys_words, 500)
    convs = [[[{'role': 'system', 'content': system}] for _ in range(a.agents)] for _ in urls]
    res = [[] for _ in urls]
    stopped = ''
    try:
        for r in range(1, a.rounds + 1):
            for g in range(a.agents):
                user = words(a.msg_words, 20000 + 100 * g + r)
                for k in range(n):
                    s = (r + g + k) % n
                    msgs = convs[s][g]
                    msgs.append({'role': 'user', 'content': user})
                    x = conv_turn(urls[s], msgs, a)
                    msgs.append({'role': 'assistant', 'content': x['text']})
                    res[s].append(dict(round=r, agent=g, **{k2: x[k2] for k2 in ('ttft', 'prompt', 'cached')},
                                       mode=(x['cache'] or {}).get('mode')))
            sys.stderr.write(f'round {r}: ' + '; '.join(
                f'{names[s]} median {f(median([q["ttft"] for q in res[s] if q["round"] == r]))} ms'
                for s in range(n)) + '\n')
    except (Late, RuntimeError, OSError) as e:
        stopped = f'Stopped: {e}'[:600]
    lines = ['| server | TTFT ms, rounds 2+ (median) | min | max | prompt tok (median) | cached (median) |',
             '|---|--:|--:|--:|--:|--:|']
    summary = {}
    for s in range(n):
        later = [q for q in res[s] if q['round'] >= 2]
        v = [q['ttft'] for q in later]
        summary[names[s]] = median(v)
        lines.append(f'| {names[s]} | {f(median(v), 1)} | {f(min(v) if v else float("nan"), 1)} | '
                     f'{f(max(v) if v else float("nan"), 1)} | {f(median([q["prompt"] for q in later]))} | '
                     f'{f(median([q["cached"] for q in later]))} |')
    if n > 1:
        lines += ['', f'**{names[0]} / {names[1]}** TTFT, rounds 2+: {fr(summary[names[0]] / summary[names[1]])}.']
    lines += ['', f'{a.agents} sub-agents on the servers\' slots, {a.rounds} rounds of one turn each, a shared '
              f'{a.sys_words}-word system prompt, {a.msg_words}-word messages, greedy replies of at most '
              f'{a.max_tokens} tokens; every server gets the same requests in the same order.']
    if stopped:
        lines += ['', f'**{stopped}**']
    write(a.out, '\n'.join(lines) + '\n', dict(names=names, urls=urls, res=res, summary=summary))


def main():
    p = argparse.ArgumentParser(prog='clients.py')
    p.add_argument('cmd', choices=['turns', 'decode', 'exact', 'restart', 'subagents', 'spec', 'behind', 'words'])
    p.add_argument('urls', nargs='*')
    p.add_argument('--name', action='append', default=[])
    p.add_argument('--out')
    p.add_argument('--deadline', type=float, default=float('inf'))
    p.add_argument('--turns', type=int)
    p.add_argument('--sys-words', type=int, default=300)
    p.add_argument('--msg-words', type=int, default=60)
    p.add_argument('--max-tokens', type=int)
    p.add_argument('--summary-from', type=int, default=2, help='turns: the summary median starts at this turn')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--prompt-words', type=int, default=32)
    p.add_argument('--convs', type=int, default=3)
    p.add_argument('--phase', choices=['prep', 'resume', 'resume-warm', 'warm'], default='prep')
    p.add_argument('--state', help='restart: the conversation between the phases (a JSON file)')
    p.add_argument('--agents', type=int, default=6)
    p.add_argument('--prompts', type=int, default=6)
    p.add_argument('--pause-s', type=float, default=3.0)
    a = p.parse_args()
    DEADLINE[0] = a.deadline
    if a.cmd == 'words':  # for checking the generator against peer_lib.mjs
        print(words(int(a.urls[0]), int(a.urls[1])))
        return
    urls = [u.rstrip('/') for u in a.urls]
    names = a.name or [f's{i + 1}' for i in range(len(urls))]
    if len(names) != len(urls):
        p.error('--name: one per URL')
    # each command and the defaults of the options it leaves unset
    run, defaults = {
        'turns': (cmd_turns, dict(turns=10, max_tokens=32)),
        'decode': (cmd_decode, dict(max_tokens=128)),
        'restart': (cmd_restart, dict(turns=6, max_tokens=32)),
        'spec': (cmd_spec, dict(max_tokens=256)),
        'behind': (cmd_behind, dict(turns=9, max_tokens=32)),
        'subagents': (cmd_subagents, dict(rounds=4, max_tokens=32)),
        'exact': (cmd_exact, dict(turns=6, max_tokens=128)),
    }[a.cmd]
    for k, v in defaults.items():
        setattr(a, k, getattr(a, k) or v)
    run(a, urls, names)

if __name__ == '__main__':
    main()
