#!/usr/bin/env bash
# models_peer.sh — two models behind one server, one loaded at a time
# (--models-max 1): kvstash beside llama-server's router mode of the same
# pinned source (bench/models_peer.mjs: method). The models: the bench model
# (A) and the bench-q4k model (B), linked into a models directory.
#
# usage: bench/models_peer.sh [KVSTASH_BIN]
# Environment (defaults in brackets): THREADS [2]  CTX [4096]  ROUNDS [3]
#   SYS_WORDS [1200]  MSG_WORDS [60]  MAX_TOKENS [32]
# Writes bench/out/models_peer.{md,csv}.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export THREADS=${THREADS:-2}
# shellcheck source=bench/lib.sh
. "$ROOT/bench/lib.sh"
bench_prepare models_peer.sh "${1:-}" "$ROOT/build/models/bench.gguf"
bench_models models_peer.sh "$ROOT/build/models/bench-q4k.gguf"
PEER=$("$ROOT/bench/peer.sh" path)
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
ln -s "$ROOT/build/models/bench.gguf" "$DIR/bench.gguf"
ln -s "$ROOT/build/models/bench-q4k.gguf" "$DIR/bench-q4k.gguf"
node "$ROOT/bench/models_peer.mjs" --kvstash "$BIN" --peer "$PEER" --dir "$DIR" --a bench --b bench-q4k \
    --threads "$THREADS" --ctx "${CTX:-4096}" --rounds "${ROUNDS:-3}" --sys-words "${SYS_WORDS:-1200}" \
    --msg-words "${MSG_WORDS:-60}" --max-tokens "${MAX_TOKENS:-32}" --out "$OUT"
