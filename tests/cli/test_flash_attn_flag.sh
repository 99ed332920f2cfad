#!/usr/bin/env bash
# `--flash-attn [on|off|auto]` of `kvstash serve` and `kvstash chat`: every
# accepted spelling (alone, glued with =, as the next word) gets past the
# flag to the missing model; anything else is refused with exit 2 and a
# message naming the flag and the value, before a model is looked for.
. "$(dirname "$0")/lib.sh"

for cmd in serve chat; do
    for args in "--flash-attn" "--flash-attn=on" "--flash-attn=off" "--flash-attn=auto" \
        "--flash-attn on" "--flash-attn off" "--flash-attn auto"; do
        # shellcheck disable=SC2086 # args is a list of words
        timeout 20 "$BIN" $cmd $args </dev/null >/dev/null 2>"$tmp/e"; rc=$?
        check "$cmd $args accepted (rc $rc: $(head -1 "$tmp/e"))" \
            test $rc -eq 2 -a -n "$(grep 'no model' "$tmp/e")"
    done
    for v in maybe ON 1 ""; do
        timeout 20 "$BIN" $cmd "--flash-attn=$v" </dev/null >/dev/null 2>"$tmp/e"; rc=$?
        check "$cmd --flash-attn='$v' refused (rc $rc: $(head -1 "$tmp/e"))" \
            test $rc -eq 2 -a -n "$(grep -F -- "--flash-attn: '$v' is not on, off or auto" "$tmp/e")" \
            -a -z "$(grep 'no model' "$tmp/e")"
    done
done

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
