#!/usr/bin/env bash
# infill_peer.sh — an editor's fill-in-the-middle requests (POST /infill, as
# llama.vim and llama.vscode send them) on `kvstash serve` and on llama.cpp's
# own llama-server built from the same pinned source (bench/peer.sh), on the
# bench model with Qwen2.5-Coder's FIM tokens (`mkmodel --preset bench --fim`):
# a suggestion per step while the cursor moves through a file, the other
# files sent each time (bench/infill_peer.mjs: method).
#
# usage: bench/infill_peer.sh [KVSTASH_BIN [MODEL.gguf]]
#   MODEL        default build/models/bench-fim.gguf (written when missing)
# Environment (defaults in brackets):
#   SERVERS [kvstash,llama-server]   THREADS [2]  SLOTS [1]  CTX [8192]
#   KS_ARGS []  PEER_ARGS []   ROUNDS [3]  STEPS [10]  FILES [3]  FILE_LINES [60]  N_PREDICT [32]
# Writes bench/out/infill_peer.{md,csv} and the servers' logs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-10} FILES=${FILES:-3} FILE_LINES=${FILE_LINES:-60} N_PREDICT=${N_PREDICT:-32}
export THREADS=${THREADS:-2} SLOTS=${SLOTS:-1} CTX=${CTX:-8192}
export SERVERS=${SERVERS:-kvstash,llama-server}
OUT=$ROOT/bench/out
mkdir -p "$OUT"

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare infill_peer.sh "${1:-$ROOT/build/kvstash}" "${2:-$ROOT/build/models/bench-fim.gguf}"
# shellcheck source=bench/peer_lib.sh
. "$ROOT/bench/peer_lib.sh"
peer_start_servers infill_peer.sh infill_peer

node "$ROOT/bench/infill_peer.mjs" "${urls[@]}" "${names[@]}" --rounds "$ROUNDS" --steps "$STEPS" --files "$FILES" \
    --file-lines "$FILE_LINES" --n-predict "$N_PREDICT" --out "$OUT"
echo >&2 "infill_peer.sh: THREADS=$THREADS SLOTS=$SLOTS CTX=$CTX; table in $OUT/infill_peer.md"
