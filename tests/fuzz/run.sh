#!/usr/bin/env bash
# run.sh — runs each libFuzzer target of tests/fuzz/ for a bounded time.
#
#   tests/fuzz/run.sh BUILD_DIR [TARGET...]      (make fuzz runs it)
#
# BUILD_DIR holds the fuzz_<target> programs (CMake -DKS_FUZZ=ON, clang,
# ASan + UBSan). Each target runs for $FUZZ_SECONDS (default 60) on one core
# from a working corpus in BUILD_DIR/fuzz/<target>/corpus, seeded from the
# committed tests/fuzz/corpus/<target>/ and tests/fuzz/regress/<target>/
# (which are only read: new inputs land in the working corpus, kept between
# runs). A crash, leak, sanitizer report or failed property stops the target
# and its input is saved as BUILD_DIR/fuzz/<target>/crash-*; the script then
# fails. To keep a finding: fix the bug, then commit the input to
# tests/fuzz/regress/<target>/ under a name that says what it found (every
# build replays it: ctest fuzz_replay_<target>).
#
# Prints one line per target (executions, rate, corpus, coverage), also
# written to BUILD_DIR/fuzz/summary.txt. FUZZ_ARGS adds libFuzzer flags.
set -uo pipefail

top=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:?usage: run.sh BUILD_DIR [TARGET...]}
shift
targets=${*:-api kvfile config textstream}
seconds=${FUZZ_SECONDS:-60}
build=$(cd "$build" && pwd)
out=$build/fuzz
mkdir -p "$out"
summary=$out/summary.txt
: >"$summary"

# libFuzzer's own leak check runs with ASan's; the LSan suppressions are the
# ones of make test-asan (third-party code only).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:allocator_may_return_null=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$top/tests/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export KS_TEMPLATES_DIR=${KS_TEMPLATES_DIR:-$top/build/deps/common/templates}
export GGML_NO_BACKTRACE=1

max_len() { # inputs beyond these sizes add little but time
    case $1 in api) echo 8192 ;; kvfile) echo 4096 ;; config) echo 4096 ;; *) echo 2048 ;; esac
}

failed=0
printf '%-11s %8s %12s %9s %7s %7s\n' target seconds executions exec/s corpus cov | tee -a "$summary"
for t in $targets; do
    bin=$build/fuzz_$t
    [ -x "$bin" ] || { echo "run.sh: $bin not built (cmake -DKS_FUZZ=ON)" >&2; failed=1; continue; }
    work=$out/$t
    mkdir -p "$work/corpus"
    seeds=("$top/tests/fuzz/corpus/$t")
    [ -d "$top/tests/fuzz/regress/$t" ] && seeds+=("$top/tests/fuzz/regress/$t")
    dict=()
    [ -f "$top/tests/fuzz/$t.dict" ] && dict=("-dict=$top/tests/fuzz/$t.dict")
    log=$work/log.txt
    # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
    "$bin" -max_total_time="$seconds" -max_len="$(max_len "$t")" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$work/" "${dict[@]}" ${FUZZ_ARGS:-} \
        "$work/corpus" "${seeds[@]}" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
    corpus=$(find "$work/corpus" -type f | wc -l)
    printf '%-11s %8s %12s %9s %7s %7s\n' "$t" "$seconds" "${execs:-?}" "${rate:-?}" "$corpus" "${cov:-?}" |
        tee -a "$summary"
    if [ $rc -ne 0 ]; then
        failed=1
        echo "run.sh: fuzz_$t failed (exit $rc); the end of $log:" >&2
        tail -n 40 "$log" >&2
        ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* 2>/dev/null >&2
    fi
done
exit $failed
