#!/usr/bin/env bash
# decode_peer.sh — single-stream decode speed over HTTP: `kvstash serve` beside
# llama.cpp's own `llama-server` built from the same pinned llama.cpp source
# (bench/peer.sh), or any OpenAI-compatible servers given by URL. Streamed,
# greedy, max_tokens fixed with ignore_eos so every reply has the same length;
# tok/s from client-side arrival times of the first and last content token, and
# the servers' own timings.predicted_per_second (bench/decode_peer.mjs: method).
# With two servers every round visits both, rotating who goes first.
#
# usage: bench/decode_peer.sh [KVSTASH_BIN [MODEL.gguf]]
#   KVSTASH_BIN  default build/kvstash (this script builds nothing of kvstash;
#                llama-server is built by bench/peer.sh when missing)
#   MODEL        default build/models/bench.gguf, generated with
#                `kvstash mkmodel --preset bench --seed 1` when missing
# Environment (defaults in brackets):
#   URLS         comma-separated base URLs of running servers: measure them and
#                start nothing (e.g. URLS=http://127.0.0.1:8080,http://127.0.0.1:8081)
#   SERVERS [kvstash,llama-server]  which servers to start when URLS is unset:
#                kvstash (default flags), kvstash-no-exact (--no-exact),
#                kvstash-prebuilt (KS_GGML_CPU=prebuilt: the npm CPU variants, so
#                exactness by pair decoding), kvstash-no-repack (--no-repack),
#                llama-server (its defaults: flash attention auto = on for the
#                CPU), llama-server-fa-off, llama-server-no-repack
#                (started by bench/peer_lib.sh)
#   THREADS [2]  SLOTS [2]  CTX [4096] (context per slot) — of every server started
#   KS_ARGS []   more `kvstash serve` flags (e.g. --no-exact, --flash-attn)
#   PEER_ARGS []  more llama-server flags
#   ROUNDS [5]  MAX_TOKENS [128]  PROMPT_WORDS [32]
#   GAP_MS [0]   wait before each request (decode_peer.mjs --gap-ms)
# Writes bench/out/decode_peer.{md,csv} and the servers' logs
# bench/out/decode_peer-*.log; prints the markdown table.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROUNDS=${ROUNDS:-5} MAX_TOKENS=${MAX_TOKENS:-128} PROMPT_WORDS=${PROMPT_WORDS:-32} GAP_MS=${GAP_MS:-0}
THREADS=${THREADS:-2} SLOTS=${SLOTS:-2} CTX=${CTX:-4096}
SERVERS=${SERVERS:-kvstash,llama-server}
KS_ARGS=${KS_ARGS:-} PEER_ARGS=${PEER_ARGS:-}
OUT=$ROOT/bench/out
MEASURE=(node "$ROOT/bench/decode_peer.mjs" --rounds "$ROUNDS" --max-tokens "$MAX_TOKENS" --prompt-words "$PROMPT_WORDS" --gap-ms "$GAP_MS" --out "$OUT")
command -v node >/dev/null 2>&1 || { echo "decode_peer.sh: node is required" >&2; exit 1; }
mkdir -p "$OUT"

if [ -n "${URLS:-}" ]; then
    IFS=, read -r -a urls <<<"$URLS"
    echo "\$ ${MEASURE[*]} ${urls[*]}" >&2
    exec "${MEASURE[@]}" "${urls[@]}"
fi

# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare decode_peer.sh "$@"

# shellcheck source=bench/peer_lib.sh
. "$ROOT/bench/peer_lib.sh"
peer_start_servers decode_peer.sh decode_peer # sets urls, names (--name LABEL pairs), keys

echo "\$ ${MEASURE[*]} ${names[*]} ${urls[*]}" >&2
"${MEASURE[@]}" "${names[@]}" "${urls[@]}"
echo >&2 "decode_peer.sh: THREADS=$THREADS SLOTS=$SLOTS CTX=$CTX; table in $OUT/decode_peer.md"
