#!/usr/bin/env bash
# setup_clients.sh — the official client SDKs the end-to-end tests drive the
# server with (openai, @openai/agents, @anthropic-ai/sdk, ai with
# @ai-sdk/openai-compatible) and the coding-agent CLIs (@anthropic-ai/claude-code,
# @openai/codex, opencode-ai), installed from the npm registry from
# tests/e2e/package.json and its lock file, so every machine tests against the
# same versions (integrity hashes pinned). About 1 GB: the CLIs are native
# binaries in platform packages.
#
# Usage: scripts/setup_clients.sh [DIR]   (default: build/e2e-npm)
# Idempotent: nothing is done when DIR already holds this lock file's install.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
DIR=${1:-$top/build/e2e-npm}
SRC=$top/tests/e2e
say() { echo "setup: $*" >&2; }

sum=$(cat "$SRC/package.json" "$SRC/package-lock.json" | sha256sum | cut -c1-16)
STAMP=$DIR/.ok-$sum
[ -f "$STAMP" ] && exit 0

command -v npm >/dev/null || { say "npm is required for the end-to-end tests' clients (apt-get install npm)"; exit 1; }
say "installing the test clients (tests/e2e/package.json) into $DIR"
rm -rf "$DIR.tmp" && mkdir -p "$DIR.tmp"
cp "$SRC/package.json" "$SRC/package-lock.json" "$DIR.tmp/"
# npm install with the lock file, not npm ci: opencode-ai lists optional
# packages for every platform, and npm ci refuses a lock file that lacks the
# ones a registry does not serve (darwin, windows); npm install takes the
# locked versions and integrity hashes all the same and skips those.
(cd "$DIR.tmp" && npm install --no-audit --no-fund --no-save --loglevel=error >/dev/null) ||
    { say "npm install failed"; exit 1; }
touch "$DIR.tmp/.ok-$sum"
rm -rf "$DIR" && mv "$DIR.tmp" "$DIR"
