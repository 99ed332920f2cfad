#!/usr/bin/env bash
# setup.sh — install what kvstash needs to build, only what is missing.
#
#   1. Debian -dev packages (apt-get), only when a package is not installed;
#      clang with libFuzzer for make fuzz.
#   2. llama.cpp v0.5.0 from two npm registry packages, fetched with `npm pack`,
#      checked against pinned sha512 integrity hashes and laid out as a prefix:
#        $DEPS/llama/lib      prebuilt shared libraries (+ link-time symlinks)
#        $DEPS/llama/include  llama.h and ggml's public headers, taken from the
#                             llama.cpp git bundle of the same release
#   3. llama.cpp's common library (chat templates, tool calls, JSON schema →
#      grammar), built from the same release's source: scripts/setup_common.sh.
#   3b. llama.cpp's mtmd library (images and audio for --mmproj), from the same
#      source: scripts/setup_mtmd.sh.
#   4. ggml's CPU backend with kvstash's batch-invariant patch: setup_cpu.sh.
#   5. GPU backends (CUDA, Vulkan) as KS_GPU asks (default auto: CUDA only
#      where nvcc and an NVIDIA GPU are both present): setup_gpu.sh.
#   Nothing third-party is committed; $DEPS lives in the build tree (git-ignored).
#
# Usage: scripts/setup.sh [DEPS_DIR]   (default: build/deps)
# Idempotent: a second run with everything present does nothing and prints nothing.
set -euo pipefail

top=$(cd "$(dirname "$0")/.." && pwd)
DEPS=${1:-$top/build/deps}
LLAMA=$DEPS/llama
STAMP=$LLAMA/.ok-v0.5.0

# clang and its runtime libraries (libFuzzer, the sanitizers' runtimes) are for make fuzz;
# redis-server for the tests of the redis tier (they start their own, never the system's).
# chromium for the one browser test (tests/e2e/cors_browser.test.mjs: a chat UI on another origin).
DEB_PKGS="libmicrohttpd-dev libjansson-dev libyaml-dev libssl-dev libxxhash-dev libcmocka-dev libhiredis-dev libcurl4-openssl-dev redis-server pkg-config
    cmake make g++ git openssl clang libclang-rt-dev chromium"
BIN_PKG=@node-llama-cpp/linux-x64@3.22.1
BIN_SHA512=5uCCDNqWCNfaAm8aR/Uzxbo4HBpKgNF91kCHPepKhgMgV2OAmatoefbOlMihsqCiH2Od35E/eUHQCFbfRBJuOg==
SRC_PKG=node-llama-cpp@3.22.1
SRC_SHA512=bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw==

say() { echo "setup: $*" >&2; }

# --- 1. Debian packages ---------------------------------------------------
missing=""
for p in $DEB_PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    say "installing Debian packages:$missing"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi

# --- 2. llama.cpp from npm ------------------------------------------------
dl=$DEPS/dl
fetch() { # $1 = name@version, $2 = expected sha512 (base64); prints the tarball path
    local spec=$1 want=$2 tgz
    command -v npm >/dev/null || { say "npm is required to fetch llama.cpp (apt-get install npm)"; exit 1; }
    mkdir -p "$dl"
    tgz=$(cd "$dl" && npm pack --silent "$spec" 2>/dev/null | tail -n 1)
    [ -n "$tgz" ] && [ -f "$dl/$tgz" ] || { say "npm pack $spec failed"; exit 1; }
    local got
    got=$(openssl dgst -sha512 -binary "$dl/$tgz" | base64 -w0)
    if [ "$got" != "$want" ]; then
        say "integrity mismatch for $spec: got sha512-$got"; rm -f "$dl/$tgz"; exit 1
    fi
    echo "$dl/$tgz"
}
fetch_llama() { # the prebuilt libraries and the public headers
    say "fetching llama.cpp v0.5.0 ($BIN_PKG, $SRC_PKG)"
    bin_tgz=$(fetch "$BIN_PKG" "$BIN_SHA512")
    src_tgz=$(fetch "$SRC_PKG" "$SRC_SHA512")

    rm -rf "$LLAMA.tmp" && mkdir -p "$LLAMA.tmp/lib" "$LLAMA.tmp/include" "$LLAMA.tmp/x"
    tar xzf "$bin_tgz" -C "$LLAMA.tmp/x" package/bins/linux-x64
    for f in "$LLAMA.tmp"/x/package/bins/linux-x64/*.so; do
        # libllama-common.so is C++ without an ABI promise: stage 3 builds it from source.
        case $(basename "$f") in libllama-common.so) continue ;; esac
        cp "$f" "$LLAMA.tmp/lib/"
    done
    ln -s libllama.v0.5.0.so "$LLAMA.tmp/lib/libllama.so"
    ln -s libggml.v0.5.0.so "$LLAMA.tmp/lib/libggml.so"

    tar xzf "$src_tgz" -C "$LLAMA.tmp/x" package/llama/gitRelease.bundle
    git clone -q --no-checkout "$LLAMA.tmp/x/package/llama/gitRelease.bundle" "$LLAMA.tmp/x/src"
    git -C "$LLAMA.tmp/x/src" archive HEAD include/llama.h ggml/include | tar x -C "$LLAMA.tmp/x"
    cp "$LLAMA.tmp/x/include/llama.h" "$LLAMA.tmp/x"/ggml/include/*.h "$LLAMA.tmp/include/"
    rm -rf "$LLAMA.tmp/x"

    rm -rf "$LLAMA" && mv "$LLAMA.tmp" "$LLAMA"
    touch "$STAMP"
    say "llama.cpp ready in $LLAMA"
}
[ -f "$STAMP" ] || fetch_llama

# pinned_source DIR PATH...: the given paths of the pinned llama.cpp source
# (the git bundle inside the $SRC_PKG tarball, checked again and fetched anew
# if absent or altered) extracted into DIR; sets SRC_COMMIT (short hash) and
# SRC_N_COMMITS. Used by the stages that build parts of llama.cpp from source.
pinned_source() {
    local out=$1 x src_tgz=$DEPS/dl/node-llama-cpp-3.22.1.tgz
    shift
    if [ ! -f "$src_tgz" ] ||
        [ "$(openssl dgst -sha512 -binary "$src_tgz" | base64 -w0)" != "$SRC_SHA512" ]; then
        rm -f "$src_tgz"
        src_tgz=$(fetch "$SRC_PKG" "$SRC_SHA512")
    fi
    x=$(mktemp -d "$DEPS/src.XXXXXX")
    tar xzf "$src_tgz" -C "$x" package/llama/gitRelease.bundle
    git clone -q --no-checkout "$x/package/llama/gitRelease.bundle" "$x/git"
    mkdir -p "$out"
    git -C "$x/git" archive HEAD "$@" | tar x -C "$out"
    SRC_COMMIT=$(git -C "$x/git" rev-parse --short HEAD)
    SRC_N_COMMITS=$(git -C "$x/git" rev-list --count HEAD)
    rm -rf "$x"
}

# --- 3. llama.cpp's common library, from source ----------------------------
# shellcheck source=scripts/setup_common.sh
. "$top/scripts/setup_common.sh"

# --- 3b. llama.cpp's multimodal library (mtmd), from source -----------------
# shellcheck source=scripts/setup_mtmd.sh
. "$top/scripts/setup_mtmd.sh"

# --- 4. ggml's CPU backend with the batch-invariant patch, from source -----
# shellcheck source=scripts/setup_cpu.sh
. "$top/scripts/setup_cpu.sh"

# --- 5. GPU backends ---------------------------------------------------------
# shellcheck source=scripts/setup_gpu.sh
. "$top/scripts/setup_gpu.sh"
