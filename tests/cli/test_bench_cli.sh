#!/usr/bin/env bash
# CLI tests of `kvstash bench floor` (the floor of a cached request at its
# depth, used by bench/http_bench.mjs): one-shot output shape, the stdin line
# protocol (a measurement per line, an error line for a bad one, the process
# goes on), and bad usage (no model, a missing model file, a depth beyond the
# context) with a message and a non-zero exit. Never asserts on time values
# beyond "a positive number".
. "$(dirname "$0")/lib.sh"
MODEL=${KS_TINY_MODEL:?KS_TINY_MODEL not set}
positive() { awk -v x="$1" 'BEGIN { exit !(x + 0 > 0) }'; }

# one-shot, with restore: two numbers per repetition, both positive
out=$("$BIN" bench floor -m "$MODEL" --threads 1 --ctx 512 --depth 64 --new 8 --restore --repeat 2 2>"$tmp/err")
rc=$?
check "one-shot exits 0" [ "$rc" -eq 0 ]
check "one-shot prints one line per repetition" [ "$(printf '%s\n' "$out" | wc -l)" -eq 2 ]
first=$(printf '%s\n' "$out" | head -1)
check "one-shot line is 'prefill_ms restore_ms'" bash -c "[[ '$first' =~ ^[0-9]+\.[0-9]+\ [0-9]+\.[0-9]+$ ]]"
check "prefill time is positive" positive "${first% *}"
check "restore time is positive with --restore" positive "${first#* }"

# without --restore the restore column is 0
out=$("$BIN" bench floor -m "$MODEL" --threads 1 --ctx 512 --depth 64 --new 1)
check "no restore: second column is 0.000" [ "${out#* }" = "0.000" ]

# stdin protocol: ready line, one answer per request, an error line for a bad
# request (and one beyond the context), and the process keeps answering
out=$(printf '16 8 0\nnonsense\n100000 8 1\n32 4 1\n0 1\n' |
      "$BIN" bench floor -m "$MODEL" --threads 1 --ctx 512 --stdin)
rc=$?
check "stdin mode exits 0" [ "$rc" -eq 0 ]
check "stdin mode starts with a ready line" [ "$(printf '%s\n' "$out" | head -1 | cut -d' ' -f1)" = "ready" ]
check "stdin mode answers every line" [ "$(printf '%s\n' "$out" | wc -l)" -eq 6 ]
check "a bad line gets an error line" [ "$(printf '%s\n' "$out" | sed -n 3p | cut -d' ' -f1)" = "error" ]
check "a depth beyond the context gets an error line" [ "$(printf '%s\n' "$out" | sed -n 4p | cut -d' ' -f1)" = "error" ]
check "the process answers after errors" bash -c "[[ '$(printf '%s\n' "$out" | sed -n 5p)' =~ ^[0-9.]+\ [0-9.]+$ ]]"

# bad usage
"$BIN" bench floor --depth 1 --new 1 >/dev/null 2>"$tmp/err"
check "no model: exit 2" [ $? -eq 2 ]
"$BIN" bench floor -m "$tmp/missing.gguf" --depth 1 --new 1 >/dev/null 2>"$tmp/err"
rc=$?
check "missing model: exit 1" [ "$rc" -eq 1 ]
check "missing model: the message names the problem" grep -qi "not found\|no such\|missing" "$tmp/err"
"$BIN" bench floor -m "$MODEL" --ctx 512 --depth 600 --new 8 >/dev/null 2>"$tmp/err"
check "depth beyond the context: non-zero exit" [ $? -ne 0 ]
"$BIN" bench floor -m "$MODEL" --depth x --new 8 >/dev/null 2>"$tmp/err"
check "a bad number: exit 2" [ $? -eq 2 ]
"$BIN" bench nosuch >/dev/null 2>"$tmp/err"
check "unknown benchmark: exit 2" [ $? -eq 2 ]

echo "$fails failure(s)"
[ "$fails" -eq 0 ]
