#!/usr/bin/env bash
# restart_tokcache.sh — the first request of a restarted process with and
# without the tokenization cache (docs/BENCHMARKS.md, "Tokenizing in pieces"):
# one process answers a long conversation (SYS_WORDS-word system prompt, three
# short turns) with the persistent store, then REPEAT times each: a new process
# with --warm-slots all (which seeds the tokenization cache from the slots'
# token lists) answers the conversation's next turn twice, and another with
# KS_TOKCACHE=0 does the same. Prints the client time of each request and the
# server's render + tokenize phase (its debug line "prompt ... ms").
#
# usage: bench/restart_tokcache.sh [KVSTASH_BIN [MODEL.gguf]]
#   defaults build/kvstash, build/models/tiny-agent.gguf (made with
#   `kvstash mkmodel --preset tiny-agent` when missing: the model costs little,
#   so what is measured is the request's cost outside it)
# Environment: SYS_WORDS [8500]  REPEAT [3]  PORT [18195]  CTX [65536]  KEEP [] (1: keep the logs)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${1:-$ROOT/build/kvstash}
MODEL=${2:-$ROOT/build/models/tiny-agent.gguf}
SYS_WORDS=${SYS_WORDS:-8500} REPEAT=${REPEAT:-3} PORT=${PORT:-18195} CTX=${CTX:-65536}
[ -f "$MODEL" ] || "$BIN" mkmodel --preset tiny-agent "$MODEL"
WORK=$(mktemp -d /tmp/kvstash-restart-tokcache.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; if [ -n "${KEEP:-}" ]; then echo "logs: $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT
serve() { # $1 = log name, then flags
    local log=$WORK/$1.log
    shift
    "$BIN" serve -m "$MODEL" --port "$PORT" --slots 1 --ctx "$CTX" --threads 2 --config "$WORK/store.yaml" \
        --log debug "$@" >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 1200); do
        curl -s -o /dev/null "http://127.0.0.1:$PORT/health" && return
        sleep 0.1
    done
    echo "restart_tokcache: the server did not start (log: $log)" >&2
    exit 1
}
stop() { kill "$pid"; wait "$pid" 2>/dev/null || true; pid=; sleep 1; }
ask() { node "$ROOT/bench/restart_tokcache.mjs" "$PORT" "$SYS_WORDS" "$@"; }
phase() { sed -n 's/.*; prompt \([0-9.]*\) ms, grammar.*/\1/p' "$WORK/$1.log" | tr '\n' ' '; }

# the store of this run alone: its own disk and shm directories (the default shm
# tier is shared by every kvstash process of the user, earlier runs' included)
printf 'store:\n  enabled: true\n  cache_dir: %s\n  shm_dir: %s\n' "$WORK/disk" "$WORK/shm" >"$WORK/store.yaml"
serve prep
ask prep
stop
for k in $(seq 1 "$REPEAT"); do
    serve "cache$k" --warm-slots all
    a=$(ask turn) b=$(ask turn)
    stop
    KS_TOKCACHE=0 serve "whole$k" --warm-slots all
    c=$(ask turn) d=$(ask turn)
    stop
    echo "restart $k: tokenization cache: first $a ms, second $b ms (render + tokenize $(phase "cache$k")ms);" \
        "KS_TOKCACHE=0: first $c ms, second $d ms (render + tokenize $(phase "whole$k")ms)"
done
