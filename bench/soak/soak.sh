#!/usr/bin/env bash
# soak.sh — the soak test of kvstash serve (bench/soak/soak.mjs): 64 streaming
# clients for 5 minutes on the tiny model, loopback only. One command:
#
#   bench/soak/soak.sh [--duration S] [--clients N] [...]   (options: soak.mjs)
#
# Builds nothing: it runs build/kvstash ($KS_BIN), generating
# build/models/tiny.gguf when missing. Writes bench/out/soak.{md,json},
# soak_rss.csv and the servers' logs; exits 1 when the server misbehaved.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
command -v node >/dev/null || { echo "soak.sh: node is required" >&2; exit 1; }
exec node "$root/bench/soak/soak.mjs" "$@"
