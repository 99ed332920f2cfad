#!/usr/bin/env bash
# spec_bound.sh — the most any n-gram drafter could speed up the bench model's
# greedy replies on this machine (bench/spec_bound.mjs: method): the cost of a
# verification step by its rows (build/bench_verify_rows, measured first, one
# process alone), then the replies' repetition against it.
#
# usage: bench/spec_bound.sh [KVSTASH_BIN [MODEL.gguf]]
# Environment (defaults in brackets): THREADS [2]  PROMPTS [8]  MAX_TOKENS [256]  REPS [20]
# Writes bench/out/spec_bound.md (with the row costs above the table).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare spec_bound.sh "$@"
VR=$ROOT/build/bench_verify_rows
[ -x "$VR" ] || { echo "spec_bound.sh: no $VR (make build)" >&2; exit 1; }
rows=$("$VR" "$MODEL" "$THREADS" 512 "${REPS:-20}")
echo "$rows" >&2
# "| 2 | 31.45 | 1.52x |" -> "2:1.52"
costs=$(echo "$rows" | awk -F'|' '$2 ~ /[0-9]/ { gsub(/[ x]/, "", $4); gsub(/ /, "", $2); printf "%s%s:%s", sep, $2, $4; sep="," }')
node "$ROOT/bench/spec_bound.mjs" --bin "$BIN" --model "$MODEL" --costs "$costs" --threads "$THREADS" \
    --prompts "${PROMPTS:-8}" --max-tokens "${MAX_TOKENS:-256}" --out "$OUT"
{ echo; echo "row costs (bench_verify_rows $MODEL $THREADS 512):"; echo "$rows"; } >>"$OUT/spec_bound.md"
