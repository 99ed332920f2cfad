# shellcheck shell=bash
# lib.sh — sourced first by the CLI tests (tests/cli/test_*.sh): strict mode
# without -e (a failing check must not end the test), $BIN, a private $tmp
# removed at exit together with the server in $spid (if a test started one),
# and check NAME CMD... which prints ok/FAIL and counts failures in $fails.
set -uo pipefail
BIN=${KS_BIN:?KS_BIN not set}
tmp=$(mktemp -d)
spid=
cleanup() {
    if [ -n "$spid" ]; then kill -KILL "$spid" 2>/dev/null; wait "$spid" 2>/dev/null; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
fails=0
check() { # name, condition...
    local name=$1; shift
    if "$@"; then echo "ok   - $name"; else echo "FAIL - $name"; fails=$((fails + 1)); fi
}
