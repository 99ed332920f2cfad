#!/usr/bin/env bash
# CLI tests of `kvstash chat`: a piped session prints the stats lines and
# reuses the history; bad input gives a clear message and a non-zero exit.
. "$(dirname "$0")/lib.sh"
MODEL=${KS_TINY_MODEL:?KS_TINY_MODEL not set}

# 1. A 3-turn piped session: exit 0, 3 stats lines, turn 2 and 3 cached > 0.
printf 'hello there\nhow are you\ntell me more\n' | "$BIN" chat --threads 1 -m "$MODEL" --max-tokens 8 --system "Be brief." \
    >"$tmp/out" 2>"$tmp/err"
rc=$?
check "piped session exits 0" test $rc -eq 0
check "three prompt stats lines" test "$(grep -c '^prompt: .* tokens | cached: .* | new: .* tok/s | TTFT: .* ms$' "$tmp/err")" -eq 3
check "three output stats lines" test "$(grep -c '^output: .* tokens | .* tok/s$' "$tmp/err")" -eq 3
cached=$(grep '^prompt:' "$tmp/err" | sed -n 's/.*cached: \([0-9]*\).*/\1/p' | tr '\n' ' ')
read -r c1 c2 c3 <<<"$cached"
check "turn 1 cold (cached=$c1)" test "$c1" -eq 0
check "turn 2 reuses history (cached=$c2)" test "$c2" -gt 0
check "turn 3 reuses more (cached=$c3 > $c2)" test "$c3" -gt "$c2"

# 2. --no-cache: every turn cold.
printf 'hello there\nhow are you\n' | "$BIN" chat --threads 1 -m "$MODEL" --max-tokens 8 --no-cache >/dev/null 2>"$tmp/err2"
check "--no-cache keeps cached at 0" test "$(grep -c 'cached: 0 ' "$tmp/err2")" -eq 2

# 3. Same greedy replies with and without the cache.
printf 'one\ntwo\nthree\n' | "$BIN" chat --threads 1 -m "$MODEL" --max-tokens 12 >"$tmp/a" 2>/dev/null
printf 'one\ntwo\nthree\n' | "$BIN" chat --threads 1 -m "$MODEL" --max-tokens 12 --no-cache >"$tmp/b" 2>/dev/null
check "cached replies equal uncached replies" cmp -s "$tmp/a" "$tmp/b"

# 4. Bad input.
"$BIN" chat --threads 1 -m /nonexistent/model.gguf </dev/null >/dev/null 2>"$tmp/e1"; rc=$?
check "missing model: non-zero exit ($rc)" test $rc -ne 0
check "missing model: message names the file" grep -q "/nonexistent/model.gguf" "$tmp/e1"
echo "this is not a model" >"$tmp/notgguf.gguf"
"$BIN" chat --threads 1 -m "$tmp/notgguf.gguf" </dev/null >/dev/null 2>"$tmp/e2"; rc=$?
check "non-GGUF file: non-zero exit ($rc)" test $rc -ne 0
check "non-GGUF file: clear message" grep -q "not a GGUF file" "$tmp/e2"
printf 'hello\n\nworld\n' | "$BIN" chat --threads 1 -m "$MODEL" --max-tokens 4 >/dev/null 2>"$tmp/e3"; rc=$?
check "empty message: non-zero exit ($rc)" test $rc -ne 0
check "empty message: clear message" grep -q "empty message" "$tmp/e3"
check "empty message: the session went on (2 replies)" test "$(grep -c '^prompt:' "$tmp/e3")" -eq 2
long=$(head -c 3000 /dev/zero | tr '\0' 'a' | sed 's/aaaaa/aaaa /g')
printf 'hi\n%s\nbye\n' "$long" | "$BIN" chat --threads 1 -m "$MODEL" --ctx 256 --max-tokens 8 >/dev/null 2>"$tmp/e4"; rc=$?
check "message longer than the context: non-zero exit ($rc)" test $rc -ne 0
check "message longer than the context: clear message" grep -q "message too long" "$tmp/e4"
check "message longer than the context: session went on" test "$(grep -c '^prompt:' "$tmp/e4")" -eq 2
"$BIN" chat --threads 1 --max-tokens abc -m "$MODEL" </dev/null >/dev/null 2>"$tmp/e5"; rc=$?
check "bad flag value: exit 2 ($rc)" test $rc -eq 2
check "bad flag value: names the flag" grep -q -- "--max-tokens" "$tmp/e5"
# Regression: the flags went through (int)strtol / strtof, so 2^32 + 1 was
# taken as 1 and NaN passed every range check. One parser now (src/cli/cli.c).
bad=(--max-tokens 4294967297 --ctx 99999999999999999999 --temp nan --top-p 0.5x --batch "")
for ((i = 0; i < ${#bad[@]}; i += 2)); do
    flag=${bad[i]} val=${bad[i + 1]}
    "$BIN" chat --threads 1 -m "$MODEL" "$flag" "$val" </dev/null >/dev/null 2>"$tmp/e5"; rc=$?
    check "bad flag value $flag '$val': exit 2 ($rc)" test $rc -eq 2
    check "bad flag value $flag '$val': names the flag and its range" grep -q -- "$flag must be .* in \[" "$tmp/e5"
done

# 5. Overflow: a small context keeps going and reports dropped turns.
printf 'first message here\nsecond message here\nthird message here\nfourth message here\nfifth message here\nsixth one\n' |
    "$BIN" chat --threads 1 -m "$MODEL" --ctx 128 --max-tokens 16 --system "Keep me." >/dev/null 2>"$tmp/e6"; rc=$?
check "overflow: exit 0 ($rc)" test $rc -eq 0
check "overflow: dropped turns reported" grep -q "dropped: .* oldest messages" "$tmp/e6"

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
