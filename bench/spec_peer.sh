#!/usr/bin/env bash
# spec_peer.sh — speculative decoding in kvstash and in llama.cpp's own
# llama-server (built from the same pinned source by bench/peer.sh), each
# beside itself without speculation: decode speed and whether a reply with
# speculation is the reply without it (bench/spec_peer.mjs: method). Two runs:
# greedy replies (random weights fall into repeating text, where n-grams hit)
# and sampled ones at temperature 1 (drafts rejected: what speculation costs
# when it does not pay).
#
# usage: bench/spec_peer.sh [KVSTASH_BIN [MODEL.gguf]]
# Environment (defaults in brackets):
#   KS_SPEC_ARGS [--spec-type ngram-simple]   PEER_SPEC_ARGS [--spec-type ngram-simple
#   --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 8] (kvstash's defaults, spelled out)
#   SERVERS [kvstash-no-spec,kvstash-spec,llama-server,llama-server-spec]
#   THREADS [2]  SLOTS [1]  CTX [4096]  PROMPTS [4]  MAX_TOKENS [256]  GAP_MS [500]
# Writes bench/out/spec_peer-{greedy,sampled}.{md,csv} and the servers' logs.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PROMPTS=${PROMPTS:-4} MAX_TOKENS=${MAX_TOKENS:-256} GAP_MS=${GAP_MS:-500}
export THREADS=${THREADS:-2} SLOTS=${SLOTS:-1} CTX=${CTX:-4096}
export SERVERS=${SERVERS:-kvstash-no-spec,kvstash-spec,llama-server,llama-server-spec}
OUT=$ROOT/bench/out
mkdir -p "$OUT"

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare spec_peer.sh "$@"
# shellcheck source=bench/peer_lib.sh
. "$ROOT/bench/peer_lib.sh"
peer_start_servers spec_peer.sh spec_peer

fam=() spec=()
for k in "${keys[@]}"; do
    case $k in kvstash*) fam+=(--family kvstash) ;; *) fam+=(--family llama-server) ;; esac
    case $k in *-no-spec) spec+=(--spec 0) ;; *-spec) spec+=(--spec 1) ;; *) spec+=(--spec 0) ;; esac
done
for temp in 0 1; do
    node "$ROOT/bench/spec_peer.mjs" "${urls[@]}" "${names[@]}" "${fam[@]}" "${spec[@]}" --prompts "$PROMPTS" \
        --max-tokens "$MAX_TOKENS" --temperature "$temp" --gap-ms "$GAP_MS" --out "$OUT"
done
echo >&2 "spec_peer.sh: THREADS=$THREADS SLOTS=$SLOTS; tables in $OUT/spec_peer-{greedy,sampled}.md"
