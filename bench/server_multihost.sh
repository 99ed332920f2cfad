#!/usr/bin/env bash
# server_multihost.sh — several hosts, one cache (issue 14): N kvstash servers with their own
# local tiers behind a round-robin client, with and without a shared Redis tier, against one host.
# Over real HTTP (bench/multihost.mjs); docs/BENCHMARKS.md "Many hosts, one cache".
#
# usage: bench/server_multihost.sh [KVSTASH_BIN [MODEL.gguf]]
# Environment (defaults in brackets): THREADS [2] HOSTS [2] CONVS [20] TURNS [5]
#   SYS_WORDS [400] MSG_WORDS [40] MAX_TOKENS [16] GAP_MS [500] (a pause before each measured
#   request: multihost.mjs --gap-ms); needs redis-server (scripts/setup.sh).
# Writes bench/out/multihost.{md,csv}, multihost_rows.json, the servers' logs
# bench/out/multihost-*.log and docs/img/server_multihost.png; prints the table.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$ROOT/bench/lib.sh"
bench_prepare server_multihost.sh "$@"
command -v redis-server >/dev/null || { echo "server_multihost.sh: redis-server is required (scripts/setup.sh)" >&2; exit 1; }

HOSTS=${HOSTS:-2}; CONVS=${CONVS:-20}; TURNS=${TURNS:-5}; SYS_WORDS=${SYS_WORDS:-400}; MSG_WORDS=${MSG_WORDS:-40}
MAX_TOKENS=${MAX_TOKENS:-16}; GAP_MS=${GAP_MS:-500}
CMD=(node "$ROOT/bench/multihost.mjs" --bin "$BIN" --model "$MODEL" --out "$OUT" --threads "$THREADS" --hosts "$HOSTS"
     --convs "$CONVS" --turns "$TURNS" --sys-words "$SYS_WORDS" --msg-words "$MSG_WORDS" --max-tokens "$MAX_TOKENS"
     --gap-ms "$GAP_MS")
echo "\$ ${CMD[*]}" >&2
"${CMD[@]}"

gnuplot -e "csv='$OUT/multihost.csv'; out='$IMG/server_multihost.png'; subtitle='$(basename "$MODEL"), $HOSTS hosts, $CONVS conversations, $THREADS threads, median per turn'" \
    "$ROOT/bench/plot_server_multihost.gp"
echo >&2 "server_multihost.sh: table in $OUT/multihost.md, plot in $IMG/server_multihost.png"
