#!/usr/bin/env bash
# server_multiturn.sh — multi-turn conversations (issue 3): cache on vs --no-cache-prompt, per-turn TTFT vs the floor.
# Over real HTTP against `kvstash serve` (bench/http_bench.mjs multiturn); docs/BENCHMARKS.md.
#
# usage: bench/server_multiturn.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
# Environment (defaults in brackets): THREADS [2] (--threads of every server)
#   CONVS [4] TURNS [8] MSG_WORDS [60] SYS_WORDS [150] MAX_TOKENS [32] SLOTS [4]
# Writes bench/out/server_multiturn.{md,csv}, the servers' logs bench/out/server_multiturn-*.log and
# docs/img/server_multiturn.png; prints the markdown tables.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bench/lib.sh"
bench_prepare server_multiturn.sh "$@"

CONVS=${CONVS:-4}; TURNS=${TURNS:-8}; MSG_WORDS=${MSG_WORDS:-60}; SYS_WORDS=${SYS_WORDS:-150}
MAX_TOKENS=${MAX_TOKENS:-32}; SLOTS=${SLOTS:-4}
SETTINGS="CONVS=$CONVS TURNS=$TURNS MSG_WORDS=$MSG_WORDS SYS_WORDS=$SYS_WORDS MAX_TOKENS=$MAX_TOKENS SLOTS=$SLOTS"
ARGS=(--convs "$CONVS" --turns "$TURNS" --msg-words "$MSG_WORDS" --sys-words "$SYS_WORDS" --max-tokens "$MAX_TOKENS" --slots "$SLOTS")
CMD=(node "$ROOT/bench/http_bench.mjs" multiturn --bin "$BIN" --model "$MODEL" --out "$OUT" --threads "$THREADS" "${ARGS[@]}")
echo "\$ ${CMD[*]}" >&2
# The tables name the command that made them: this script with its settings.
export KS_BENCH_CMD="THREADS=$THREADS $SETTINGS bench/server_multiturn.sh"
"${CMD[@]}"

gnuplot -e "csv='$OUT/server_multiturn.csv'; out='$IMG/server_multiturn.png'; subtitle='$(basename "$MODEL"), $CONVS conversations x $TURNS turns round-robin, $MSG_WORDS-word messages, $MAX_TOKENS-token replies, $SLOTS slots, $THREADS threads, medians'" \
    "$ROOT/bench/plot_server_multiturn.gp"
echo >&2 "server_multiturn.sh: tables in $OUT/server_multiturn.md, plot in $IMG/server_multiturn.png"
