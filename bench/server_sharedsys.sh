#!/usr/bin/env bash
# server_sharedsys.sh — one long system prompt shared by several users (issue 4): plain prefix reuse, --spc, --spc --imc, and --spc --imc + store vs --no-cache-prompt.
# Over real HTTP against `kvstash serve` (bench/http_bench.mjs sharedsys); docs/BENCHMARKS.md.
#
# usage: bench/server_sharedsys.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
# Environment (defaults in brackets): THREADS [2] (--threads of every server)
#   USERS [6] TURNS [2] MSG_WORDS [60] SYS_WORDS [800] MAX_TOKENS [16] SLOTS [3]
#   STORE [1]  0 leaves out the server with a persistent store
# Writes bench/out/server_sharedsys.{md,csv}, the servers' logs bench/out/server_sharedsys-*.log and
# docs/img/server_sharedsys.png; prints the markdown tables.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bench/lib.sh"
bench_prepare server_sharedsys.sh "$@"

USERS=${USERS:-6}; TURNS=${TURNS:-2}; MSG_WORDS=${MSG_WORDS:-60}; SYS_WORDS=${SYS_WORDS:-800}
MAX_TOKENS=${MAX_TOKENS:-16}; SLOTS=${SLOTS:-3}; STORE=${STORE:-1}
SETTINGS="USERS=$USERS TURNS=$TURNS MSG_WORDS=$MSG_WORDS SYS_WORDS=$SYS_WORDS MAX_TOKENS=$MAX_TOKENS SLOTS=$SLOTS STORE=$STORE"
ARGS=(--users "$USERS" --turns "$TURNS" --msg-words "$MSG_WORDS" --sys-words "$SYS_WORDS" --max-tokens "$MAX_TOKENS" --slots "$SLOTS" --store "$STORE")
CMD=(node "$ROOT/bench/http_bench.mjs" sharedsys --bin "$BIN" --model "$MODEL" --out "$OUT" --threads "$THREADS" "${ARGS[@]}")
echo "\$ ${CMD[*]}" >&2
# The tables name the command that made them: this script with its settings.
export KS_BENCH_CMD="THREADS=$THREADS $SETTINGS bench/server_sharedsys.sh"
"${CMD[@]}"

NCOL=$(($(head -1 "$OUT/server_sharedsys.csv" | awk -F, "{print NF}") - 1)) # the last column is the floor at depth
gnuplot -e "csv='$OUT/server_sharedsys.csv'; out='$IMG/server_sharedsys.png'; ncol=$NCOL; ttl='kvstash serve: shared system prompt, median time to first token per turn'; subtitle='$USERS users, one $SYS_WORDS-word system prompt, $SLOTS slots, $MSG_WORDS-word messages, $THREADS threads'" \
    "$ROOT/bench/plot_server_turns.gp"
echo >&2 "server_sharedsys.sh: tables in $OUT/server_sharedsys.md, plot in $IMG/server_sharedsys.png"
