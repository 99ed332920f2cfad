#!/usr/bin/env bash
# `make install` gives a usable library: with DESTDIR it stages the header, the
# version header, libkvstash.a, libkvstash.so (+ SONAME links), kvstash.pc,
# the private llama.cpp libraries and bin/kvstash under DESTDIR/PREFIX, with
# nothing pointing back into the build or source tree; libkvstash.so exports
# exactly the KS_API functions of kvstash.h. examples/chat_two_turns.c then
# builds from the install with pkg-config alone (no -I/-L of our trees),
# dynamically and against libkvstash.a, and runs a two-turn conversation on
# the tiny model whose second turn reports cached tokens, with no
# LD_LIBRARY_PATH. Everything is installed inside our own temp dir.
#
# The build directory is KS_BIN's; its CMakeCache.txt says whether it is a
# sanitizer build (KS_SANITIZE=ON: the example is compiled and linked with the
# same -fsanitize flags as libkvstash, by the same compiler) and whether
# llama.cpp is a system package (KS_SYSTEM_LLAMA=ON: nothing private to install).
. "$(dirname "$0")/lib.sh"
MODEL=${KS_TINY_MODEL:?KS_TINY_MODEL not set}
SRC=${KS_SRC:?KS_SRC not set}
build=$(cd "$(dirname "$BIN")" && pwd)
cache_var() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }

[ -f "$build/CMakeCache.txt" ] || { echo "no CMakeCache.txt in $build"; exit 1; }
CC=$(cache_var CMAKE_C_COMPILER)
libdir=$(cache_var CMAKE_INSTALL_LIBDIR)
CFLAGS=(-std=c11 -Wall -Wextra -Werror -pedantic)
if [ "$(cache_var KS_SANITIZE)" = ON ]; then CFLAGS+=(-fsanitize=address,undefined); fi
private_llama=1
if [ "$(cache_var KS_SYSTEM_LLAMA)" = ON ]; then private_llama=0; fi
unset LD_LIBRARY_PATH PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
version=$(sed -n 's/^#define KS_VERSION_STRING "\(.*\)"$/\1/p' "$build/include/kvstash_version.h")
check "the generated version header has a version ($version)" test -n "$version"

# minstall ARGS...: the Makefile's install target on this build directory; -o build
# keeps make from rebuilding (ctest runs while other tests use the binaries).
minstall() {
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory -C "$SRC" -o build \
        install BUILD="$build" "$@" >"$tmp/install.out" 2>&1
}
# is_link PATH TARGET: PATH is a symlink to TARGET.
is_link() { test -L "$1" -a "$(readlink "$1")" = "$2"; }
# exported LIB: the functions LIB's dynamic symbol table defines, sorted.
exported() { nm -D --defined-only "$1" | awk '$2 == "T" {print $3}' | sort; }
# run_example EXE OUT: runs the example on the tiny model, checks it and its
# second turn's n_cached.
run_example() {
    local exe=$1 out=$2 rc cached name
    name=$(basename "$exe")
    "$exe" "$MODEL" 16 >"$out" 2>"$out.err"; rc=$?
    check "$name: exit 0 ($rc)" test $rc -eq 0
    [ $rc -eq 0 ] || cat "$out" "$out.err"
    check "$name: library and headers are $version" grep -qx "libkvstash $version (headers $version)" "$out"
    check "$name: two replies" test "$(grep -c '^assistant:' "$out")" -eq 2
    check "$name: the first turn has nothing cached" grep -Eq '^turn 1: prompt [0-9]+ tokens, cached 0,' "$out"
    cached=$(sed -n 's/^turn 2: prompt [0-9]* tokens, cached \([0-9]*\),.*/\1/p' "$out")
    check "$name: the second turn reports cached tokens (${cached:-none})" test "${cached:-0}" -gt 0
}

# 1. make install DESTDIR=… PREFIX=/usr/local: the staged layout.
stage=$tmp/stage
minstall DESTDIR="$stage" PREFIX=/usr/local; rc=$?
check "make install DESTDIR: exit 0 ($rc)" test $rc -eq 0
[ $rc -eq 0 ] || cat "$tmp/install.out"
root=$stage/usr/local
L=$root/$libdir
check "header installed" test -f "$root/include/kvstash.h"
check "version header installed" test -f "$root/include/kvstash_version.h"
check "header is the source one" cmp -s "$SRC/include/kvstash.h" "$root/include/kvstash.h"
check "static library installed" test -f "$L/libkvstash.a"
check "shared library libkvstash.so.$version" test -f "$L/libkvstash.so.$version"
check "libkvstash.so.${version%%.*} -> libkvstash.so.$version" is_link "$L/libkvstash.so.${version%%.*}" "libkvstash.so.$version"
check "libkvstash.so -> libkvstash.so.${version%%.*}" is_link "$L/libkvstash.so" "libkvstash.so.${version%%.*}"
check "SONAME libkvstash.so.${version%%.*}" \
    grep -q "(SONAME).*\[libkvstash.so.${version%%.*}\]" <(readelf -d "$L/libkvstash.so.$version")
check "kvstash executable installed" test -x "$root/bin/kvstash"
pc=$L/pkgconfig/kvstash.pc
check "kvstash.pc installed" test -f "$pc"
check "kvstash.pc: prefix=/usr/local" grep -qx "prefix=/usr/local" "$pc"
check "kvstash.pc: Version: $version" grep -qx "Version: $version" "$pc"
check "kvstash.pc: Libs -lkvstash" grep -Eq '^Libs: .*-lkvstash( |$)' "$pc"
check "kvstash.pc: no config layer (yaml)" test -z "$(grep -i yaml "$pc")"
if [ $private_llama -eq 1 ]; then
    check "private llama.cpp installed" test -f "$L/kvstash/libllama.so" -a -f "$L/kvstash/libggml-base.so"
    check "with its CPU backends" compgen -G "$L/kvstash/libggml-cpu-*.so" >/dev/null
    # the patched module's .id names its build: without it the engine takes
    # it for revision 1 (flash attention auto off) and keys states wrongly
    if [ -f "$SRC/build/deps/llama/lib/libks-ggml-cpu.so" ]; then
        check "the patched CPU module and its .id installed" test -f "$L/kvstash/libks-ggml-cpu.so" -a \
            -f "$L/kvstash/libks-ggml-cpu.id"
    fi
    check "libkvstash.so RUNPATH \$ORIGIN/kvstash" \
        grep -q '(RUNPATH).*\[\$ORIGIN/kvstash\]' <(readelf -d "$L/libkvstash.so.$version")
fi
# Nothing installed may point back into the build or source tree (binaries
# carry source paths in their debug information, so: their RUNPATHs).
leaks=$(grep -rlF -e "$build" -e "$SRC" "$pc" "$root/include")
check "kvstash.pc and the headers name neither tree (${leaks:-none})" test -z "$leaks"
rpaths=$(readelf -d "$L/libkvstash.so.$version" "$root/bin/kvstash" | grep -E 'R(UN)?PATH')
check "installed RUNPATHs name neither tree" test -z "$(echo "$rpaths" | grep -F -e "$build" -e "$SRC")"

# Exports: exactly the KS_API functions of the header.
exported "$L/libkvstash.so.$version" >"$tmp/exported"
# Function declarations start in column 0, with or without KS_API.
ks_functions() { sed 's/.*[ *]\(ks_[a-z_0-9]*\)($/\1/' | sort; }
grep -oE '^(KS_API )?[a-z_][a-z_0-9 ]*[ *]ks_[a-z_0-9]+\(' "$root/include/kvstash.h" | ks_functions >"$tmp/decl"
grep -oE '^KS_API [^(]*\(' "$root/include/kvstash.h" | ks_functions >"$tmp/api"
check "exports ks_chat_create" grep -qx ks_chat_create "$tmp/exported"
check "does not export ks_sched_create" test -z "$(grep -x ks_sched_create "$tmp/exported")"
check "exports no llama_/ggml_ symbol" test -z "$(grep -E '^(llama|ggml|gguf)_' "$tmp/exported")"
check "the header declares $(wc -l <"$tmp/api") KS_API functions" test "$(wc -l <"$tmp/api")" -ge 10
check "every function kvstash.h declares is KS_API" diff "$tmp/decl" "$tmp/api"
check "exports = the KS_API functions" diff "$tmp/api" "$tmp/exported"
check "exports no data" test -z "$(nm -D --defined-only "$L/libkvstash.so.$version" | awk '$2 ~ /^[BDGRSV]$/')"
# The random-model generator is the CLI's (kvstash mkmodel), not the library's (issue 30).
check "libkvstash.a holds no mkmodel code" test -z "$(nm --defined-only "$L/libkvstash.a" 2>/dev/null | grep -E ' ks_mkmodel_|mkmodel')"

# The example builds from the staged tree with pkg-config alone.
export PKG_CONFIG_SYSROOT_DIR=$stage PKG_CONFIG_LIBDIR=$L/pkgconfig
check "pkg-config --modversion kvstash = $version" test "$(pkg-config --modversion kvstash)" = "$version"
flags=$(pkg-config --cflags --libs kvstash); rc=$?
check "pkg-config --cflags --libs: exit 0 ($rc)" test $rc -eq 0
check "pkg-config flags point into DESTDIR only ($flags)" \
    test -z "$(echo "$flags" | tr ' ' '\n' | grep -E '^-[IL]' | grep -v "^-[IL]$stage/")"
# shellcheck disable=SC2086 # the flags are meant to split
"$CC" "${CFLAGS[@]}" "$SRC/examples/chat_two_turns.c" $flags -o "$tmp/ex_stage" 2>"$tmp/cc.err"; rc=$?
check "example builds against DESTDIR ($rc)" test $rc -eq 0
[ $rc -eq 0 ] || cat "$tmp/cc.err"
# Its RUNPATH is meant for the final prefix: run it with the staged libraries.
LD_LIBRARY_PATH=$L run_example "$tmp/ex_stage" "$tmp/out_stage"
unset PKG_CONFIG_SYSROOT_DIR

# 2. make install PREFIX=$tmp/prefix: build and run from the install, no LD_LIBRARY_PATH.
prefix=$tmp/prefix
minstall PREFIX="$prefix"; rc=$?
check "make install PREFIX: exit 0 ($rc)" test $rc -eq 0
[ $rc -eq 0 ] || cat "$tmp/install.out"
export PKG_CONFIG_LIBDIR=$prefix/$libdir/pkgconfig
check "kvstash.pc: prefix=$prefix" grep -qx "prefix=$prefix" "$PKG_CONFIG_LIBDIR/kvstash.pc"
flags=$(pkg-config --cflags --libs kvstash)
# shellcheck disable=SC2086
"$CC" "${CFLAGS[@]}" "$SRC/examples/chat_two_turns.c" $flags -o "$tmp/ex_dyn" 2>"$tmp/cc.err"; rc=$?
check "example builds (dynamic) ($rc)" test $rc -eq 0
[ $rc -eq 0 ] || cat "$tmp/cc.err"
check "it loads the installed libkvstash" \
    grep -q "libkvstash.so.${version%%.*} => $prefix/$libdir/libkvstash.so" <(ldd "$tmp/ex_dyn")
if [ $private_llama -eq 1 ]; then
    check "and the installed llama.cpp" grep -q "libllama.*=> $prefix/$libdir/kvstash/" <(ldd "$tmp/ex_dyn")
fi
run_example "$tmp/ex_dyn" "$tmp/out_dyn"

# libkvstash.a is self-contained: the same program linked statically against it.
libs=$(pkg-config --static --libs kvstash | sed 's/-lkvstash\b/-l:libkvstash.a/')
# shellcheck disable=SC2086
"$CC" "${CFLAGS[@]}" "$SRC/examples/chat_two_turns.c" $(pkg-config --cflags kvstash) $libs \
    -o "$tmp/ex_static" 2>"$tmp/cc.err"; rc=$?
check "example builds (libkvstash.a) ($rc)" test $rc -eq 0
[ $rc -eq 0 ] || cat "$tmp/cc.err"
check "it does not need libkvstash.so" test -z "$(readelf -d "$tmp/ex_static" | grep 'NEEDED.*libkvstash')"
run_example "$tmp/ex_static" "$tmp/out_static"
check "static and dynamic runs print the same" cmp -s <(grep -v '^turn' "$tmp/out_dyn") \
    <(grep -v '^turn' "$tmp/out_static")

# The installed executable runs from the prefix.
out=$("$prefix/bin/kvstash" --version 2>&1); rc=$?
check "installed kvstash --version: exit 0, $version ($rc: $out)" test $rc -eq 0 -a "$out" = "kvstash $version"

if [ $fails -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
