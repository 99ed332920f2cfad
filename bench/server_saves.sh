#!/usr/bin/env bash
# server_saves.sh — save overhead: concurrent requests with the persistent store's saves on vs no store.
# Over real HTTP against `kvstash serve` (bench/http_bench.mjs saves); docs/BENCHMARKS.md.
#
# usage: bench/server_saves.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
# Environment (defaults in brackets): THREADS [2] (--threads of every server)
#   ROUNDS [3] CONCURRENCY [4] TURNS [4] SYS_WORDS [400] MSG_WORDS [60] MAX_TOKENS [16]
# Writes bench/out/server_saves.{md,csv}, the servers' logs bench/out/server_saves-*.log and
# docs/img/server_saves.png; prints the markdown tables.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bench/lib.sh"
bench_prepare server_saves.sh "$@"

ROUNDS=${ROUNDS:-3}; CONCURRENCY=${CONCURRENCY:-4}; TURNS=${TURNS:-4}; SYS_WORDS=${SYS_WORDS:-400}
MSG_WORDS=${MSG_WORDS:-60}; MAX_TOKENS=${MAX_TOKENS:-16}
SETTINGS="ROUNDS=$ROUNDS CONCURRENCY=$CONCURRENCY TURNS=$TURNS SYS_WORDS=$SYS_WORDS MSG_WORDS=$MSG_WORDS MAX_TOKENS=$MAX_TOKENS"
ARGS=(--rounds "$ROUNDS" --concurrency "$CONCURRENCY" --turns "$TURNS" --sys-words "$SYS_WORDS" --msg-words "$MSG_WORDS" --max-tokens "$MAX_TOKENS")
CMD=(node "$ROOT/bench/http_bench.mjs" saves --bin "$BIN" --model "$MODEL" --out "$OUT" --threads "$THREADS" "${ARGS[@]}")
echo "\$ ${CMD[*]}" >&2
# The tables name the command that made them: this script with its settings.
export KS_BENCH_CMD="THREADS=$THREADS $SETTINGS bench/server_saves.sh"
"${CMD[@]}"

gnuplot -e "csv='$OUT/server_saves_summary.csv'; out='$IMG/server_saves.png'; subtitle='$CONCURRENCY concurrent requests on $CONCURRENCY slots, $ROUNDS rounds, $(basename "$MODEL"), $THREADS threads'" \
    "$ROOT/bench/plot_server_saves.gp"
echo >&2 "server_saves.sh: tables in $OUT/server_saves.md, plot in $IMG/server_saves.png"
