#!/usr/bin/env bash
# peer.sh — llama.cpp's own `llama-server`, built from the very llama.cpp source
# kvstash is pinned to, as a benchmark peer: the same workloads can be sent to
# it and to `kvstash serve` (bench/decode_peer.sh). Benchmarks only: never part
# of the product, never built by `make build`, `make test` or `make run`.
#
# usage: bench/peer.sh [build]
#            build llama-server once into build/peer (a stamp makes a second run
#            a no-op); prints the binary's path and how long the build took
#        bench/peer.sh path
#            print the binary's path (building it first when needed)
#        bench/peer.sh version
#            print llama-server's version line
#        bench/peer.sh serve MODEL PORT [llama-server args...]
#            run llama-server in the foreground on 127.0.0.1:PORT with settings
#            matching kvstash's benchmark servers (below); extra args go last,
#            so they override (e.g. `--flash-attn off`, `--no-cache-prompt`)
# Environment (defaults in brackets): THREADS [2] (-t and -tb)  SLOTS [2] (-np)
#   CTX [4096] (context per slot, as kvstash's --ctx: llama-server gets
#   -c SLOTS*CTX; with -np given, its KV cache is not unified and each slot
#   gets its own CTX, as in kvstash)
#   PEER_GPU [none]  cuda: the CUDA recipe below instead (build/peer-cuda)
#
# The CUDA recipe (PEER_GPU=cuda, for bench/gpu/): llama-server of the same
# source with loadable backends (-DGGML_BACKEND_DL=ON -DBUILD_SHARED_LIBS=ON),
# its CPU parts only, for a portable x86-64 level (haswell: AVX2, FMA, F16C,
# BMI2; the GPU machine's Xeon and this AMD machine both run it), and an
# unversioned SONAME (libggml-base.so) — and no CUDA of its own: it loads the
# very CUDA module setup built (build/deps/cuda/, the same source and flags),
# copied next to it as libggml-cuda.so, where ggml_backend_load_all() looks.
# That module's NEEDED libggml-base.so is then this build's, so there is no
# second 35-minute CUDA build. The binary and its libraries are in
# build/peer-cuda/build/bin (RUNPATH $ORIGIN); the CUDA module is copied there
# by `PEER_GPU=cuda bench/peer.sh build` when it exists (else later, by
# bench/gpu/package.sh). `serve` there passes -ngl 99 (what the benchmarks
# compare with: llama-server's GPU users' usual flag).
#
# Source: the git bundle package/llama/gitRelease.bundle inside the npm tarball
# build/deps/dl/node-llama-cpp-3.22.1.tgz that scripts/setup.sh fetches (the
# package spec and its sha512 are read from setup.sh, so both stay pinned to
# the same release). The tarball is fetched (npm pack) and checked here when it
# is missing. Build: CMake, Release, ggml native for this CPU, static (no
# shared library that could mix with kvstash's), no web UI assets (nothing is
# downloaded at build time), no OpenSSL, OpenMP off (ggml's own thread pool,
# as in the prebuilt ggml kvstash links). Layout:
#   build/peer/src             the checked-out source
#   build/peer/build           the CMake tree; the binary is build/peer/build/bin/llama-server
#   build/peer/build.log       the configure + build log
#   build/peer/.ok-COMMIT-r1   the stamp (holds the build time in seconds)
#
# Server settings for benchmarks: `serve` passes -t/-tb THREADS, -np SLOTS,
# -c SLOTS*CTX, --no-webui, --host 127.0.0.1; everything else stays at
# llama-server's defaults, notably --flash-attn auto, which turns flash
# attention on for the CPU (kvstash's default is off: pass `--flash-attn off`
# to compare like with like; the flag takes on|off|auto), prompt caching on
# (cache_prompt, plus its RAM prompt cache, --cache-ram 8192 MiB), Jinja chat
# templates on, and a warm-up decode at start.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEER_GPU=${PEER_GPU:-none}
case $PEER_GPU in none) PEER=$ROOT/build/peer ;; cuda) PEER=$ROOT/build/peer-cuda ;;
*) echo "peer: PEER_GPU must be none or cuda, got '$PEER_GPU'" >&2; exit 2 ;; esac
SRC=$PEER/src
BLD=$PEER/build
BIN=$BLD/bin/llama-server
DL=$ROOT/build/deps/dl
RECIPE=r1 # bump when the build recipe below changes
[ "$PEER_GPU" = cuda ] && RECIPE=cuda-r1

say() { echo "peer: $*" >&2; }

# The pinned source package, as scripts/setup.sh names and checks it.
pinned() { # $1 = SRC_PKG | SRC_SHA512
    local v
    v=$(sed -n "s/^$1=//p" "$ROOT/scripts/setup.sh" | head -n 1)
    [ -n "$v" ] || { say "no $1= line in scripts/setup.sh"; exit 1; }
    echo "$v"
}

# The source tarball: present and intact, else fetched with npm pack and checked
# against the sha512 setup.sh pins (the same steps as setup.sh's fetch).
source_tarball() {
    local spec want tgz got
    spec=$(pinned SRC_PKG)
    want=$(pinned SRC_SHA512)
    tgz=$DL/node-llama-cpp-${spec##*@}.tgz
    if [ -f "$tgz" ] && [ "$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)" = "$want" ]; then
        echo "$tgz"
        return
    fi
    command -v npm >/dev/null || { say "npm is required to fetch $spec"; exit 1; }
    say "fetching $spec"
    mkdir -p "$DL"
    rm -f "$tgz"
    tgz=$(cd "$DL" && npm pack --silent "$spec" 2>/dev/null | tail -n 1)
    if [ -z "$tgz" ] || [ ! -f "$DL/$tgz" ]; then
        say "npm pack $spec failed"
        exit 1
    fi
    got=$(openssl dgst -sha512 -binary "$DL/$tgz" | base64 -w0)
    if [ "$got" != "$want" ]; then
        say "integrity mismatch for $spec: got sha512-$got"
        rm -f "$DL/$tgz"
        exit 1
    fi
    echo "$DL/$tgz"
}

stamp() { # the stamp's path, or nothing
    local f
    for f in "$PEER"/.ok-*-"$RECIPE"; do [ -f "$f" ] && echo "$f" && return; done
    return 0
}

built() { [ -n "$(stamp)" ] && [ -x "$BIN" ]; }

build() {
    if built; then
        say "llama-server is built: $BIN (the build took $(cat "$(stamp)") s)"
        [ "$PEER_GPU" = cuda ] && [ ! -f "$BLD/bin/libggml-cuda.so" ] && cuda_module
        return 0
    fi
    for tool in cmake make g++ git openssl; do
        command -v $tool >/dev/null || { say "$tool is missing (scripts/setup.sh installs it)"; exit 1; }
    done
    local tgz t0 commit secs log=$PEER/build.log
    tgz=$(source_tarball)
    rm -rf "$PEER" && mkdir -p "$PEER/x"
    tar xzf "$tgz" -C "$PEER/x" package/llama/gitRelease.bundle
    # A real clone (with .git) so that llama.cpp's build-info records the commit.
    git clone -q "$PEER/x/package/llama/gitRelease.bundle" "$SRC" 2>/dev/null
    rm -rf "$PEER/x"
    commit=$(git -C "$SRC" rev-parse --short HEAD)
    say "building llama-server from llama.cpp $commit (minutes on 2 cores; log: $log)"
    t0=$(date +%s)
    local recipe=(-DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON)
    local targets=(llama-server)
    if [ "$PEER_GPU" = cuda ]; then
        # loadable backends, CPU for haswell, no CUDA: the CUDA module comes from setup
        recipe=(-DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_CUDA=OFF
            -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_F16C=ON -DGGML_FMA=ON -DGGML_AVX2=ON -DGGML_BMI2=ON
            -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON -DCMAKE_BUILD_RPATH='$ORIGIN')
        targets=(llama-server ggml-cpu)
    fi
    if ! { cmake -S "$SRC" -B "$BLD" -DCMAKE_BUILD_TYPE=Release \
        "${recipe[@]}" -DGGML_OPENMP=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF &&
        nice cmake --build "$BLD" --target "${targets[@]}" -j "$(nproc)"; } >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        say "building llama-server failed (log: $log)"
        exit 1
    fi
    secs=$(($(date +%s) - t0))
    echo "$secs" >"$PEER/.ok-$commit-$RECIPE"
    say "llama-server built in $secs s: $BIN"
    [ "$PEER_GPU" = cuda ] && cuda_module
    return 0
}

# The CUDA recipe: setup's CUDA module (build/deps/cuda, the same source)
# next to llama-server as libggml-cuda.so, after checking that what it needs
# (NEEDED) is what this build provides (SONAME).
cuda_module() {
    local mod want have
    mod=$(find "$ROOT/build/deps/cuda/build" -name libggml-cuda.so -type f 2>/dev/null | head -n 1)
    if [ -z "$mod" ]; then
        say "no CUDA module in build/deps/cuda yet (KS_GPU=cuda scripts/setup.sh builds it): llama-server runs on the CPU until it is copied in"
        return 0
    fi
    want=$(readelf -d "$mod" | sed -n 's/.*NEEDED.*\[\(libggml[^]]*\)\].*/\1/p' | sort | tr '\n' ' ')
    have=$(for f in "$BLD"/bin/libggml*.so; do readelf -d "$f" | sed -n 's/.*SONAME.*\[\(.*\)\].*/\1/p'; done | sort | tr '\n' ' ')
    for n in $want; do
        case " $have " in *" $n "*) ;; *) say "the CUDA module needs $n, which this build does not provide ($have)"; exit 1 ;; esac
    done
    cp "$mod" "$BLD/bin/libggml-cuda.so"
    say "CUDA module $mod copied to $BLD/bin/libggml-cuda.so (needs: $want)"
}

version() { "$BIN" --version 2>&1 | grep -m1 '^version' || true; }

cmd=${1:-build}
# bench/run_all.sh runs every bench/*.sh with the same arguments (none, or
# KVSTASH_BIN [MODEL]): there, this script just makes sure llama-server is built.
case $cmd in build | path | version | serve) ;; *) [ -e "$cmd" ] && cmd=build ;; esac
case $cmd in
build)
    build
    echo "$BIN"
    ;;
path)
    built || build
    echo "$BIN"
    ;;
version)
    built || build
    version
    ;;
serve)
    [ $# -ge 3 ] || { echo "usage: bench/peer.sh serve MODEL PORT [llama-server args...]" >&2; exit 2; }
    model=$2 port=$3
    shift 3
    [ -f "$model" ] || { say "no model at $model"; exit 1; }
    built || build
    THREADS=${THREADS:-2} SLOTS=${SLOTS:-2} CTX=${CTX:-4096}
    say "llama-server $(version)"
    gpu=()
    [ "$PEER_GPU" = cuda ] && gpu=(-ngl 99)
    args=(-m "$model" --host 127.0.0.1 --port "$port" -t "$THREADS" -tb "$THREADS"
        -np "$SLOTS" -c $((SLOTS * CTX)) --no-webui "${gpu[@]}" "$@")
    say "\$ $BIN ${args[*]}"
    exec "$BIN" "${args[@]}"
    ;;
*)
    echo "usage: bench/peer.sh build|path|version|serve MODEL PORT [llama-server args...]" >&2
    exit 2
    ;;
esac
