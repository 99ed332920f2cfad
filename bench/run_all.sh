#!/usr/bin/env bash
# run_all.sh — runs every benchmark script bench/*.sh (except this one), in
# name order, with the same arguments (usually none: each script has its
# defaults). Goes on after a failure; exits 1 if any script failed.
# Results: bench/out/, docs/img/; copy the tables into docs/BENCHMARKS.md.
set -uo pipefail

DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
failed=()
for script in "$DIR"/*.sh; do
    name=$(basename "$script")
    case $name in run_all.sh | lib.sh | *_lib.sh) continue ;; esac
    echo "=== $name ($(date -u '+%Y-%m-%d %H:%M:%S UTC'))"
    if ! bash "$script" "$@"; then
        echo "=== $name FAILED" >&2
        failed+=("$name")
    fi
    echo
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "run_all.sh: failed: ${failed[*]}" >&2
    exit 1
fi
