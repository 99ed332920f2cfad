# shellcheck shell=bash
# setup_gpu.sh — stage 5 of scripts/setup.sh, sourced by it (uses its say,
# fetch, pinned_source, $top, $DEPS and $LLAMA).
#
# GPU backends for the engine (src/engine/devices.h), as loadable ggml modules
# next to the prebuilt libllama, each with an .id file naming its build (the
# engine reports it and puts it in its cache keys):
#   $LLAMA/lib/libks-ggml-cuda.so    NVIDIA: ggml's CUDA backend built from the
#                                    pinned source, or the npm prebuilt
#   $LLAMA/lib/libks-ggml-vulkan.so  Vulkan (AMD, Intel, ...): the npm prebuilt
# Which, by KS_GPU (environment; default auto):
#   auto    CUDA when nvcc (CUDA 12 or 13) and an NVIDIA GPU (nvidia-smi) are
#           both here; nothing otherwise. A machine without a GPU (CI) is
#           unaffected: no CUDA build, nothing loaded at run time.
#   cuda    CUDA: built with nvcc when there is one (for the GPUs nvidia-smi
#           lists, or KS_CUDA_ARCHS, e.g. "90a" or "86;90a", when it lists
#           none), else the npm prebuilt @node-llama-cpp/linux-x64-cuda
#           (159 MB, many architectures, needs the CUDA 13 runtime).
#   vulkan  the Vulkan module, plus Debian's libvulkan1 and mesa-vulkan-drivers.
#   none    no GPU backend, and no Vulkan module for the tests either.
# Besides (unless KS_GPU=none) the Vulkan module is always put in
# $DEPS/vulkan/ (24 MB packed, fetched in seconds), where nothing loads it by
# default: the gpu-path tests load it (KS_GPU_MODULES) on Mesa's software
# Vulkan device, so that CI exercises the device code paths without a GPU.
#
# The CUDA build: ggml's CMake project of the pinned source, with
# scripts/patches/ggml-cuda-batch-invariant.patch applied, in $DEPS/cuda/src/ggml, built in $DEPS/cuda/build (kept: an incremental rebuild
# after a kernel patch takes minutes, not the whole build) with the flags
# below. One architecture with every flash-attention kernel took 35-52
# minutes on 2 cores (docs/LLAMA_FACTS.md, "GPU backends"). A tree already
# configured with the same flags and source is adopted, not rebuilt.
# Idempotent: with the stamps present it does nothing and prints nothing.

GPU_VK_PKG=@node-llama-cpp/linux-x64-vulkan@3.22.1
GPU_VK_SHA512=bBxqU+JOcBu1nb5Qj2zcMci+JByT1E8EajHvYodyNfVIPkEhXh+/HMwR1/BT7xP08YK0hks+kM8fglER0P8JEg==
GPU_CUDA_PKG=@node-llama-cpp/linux-x64-cuda@3.22.1
GPU_CUDA_SHA512=8rQCjyNNLZJUFit+YpjwlC4hwkKgOMIkB2wuycKBf8NU2O3ySKbiWZQ8aw9ku2nUTXjSnUIrE6KB88itduTBuA==
GPU_VK_DEBS="libvulkan1 mesa-vulkan-drivers"
GPU_CUDA_PATCH=$top/scripts/patches/ggml-cuda-batch-invariant.patch
GPU_CUDA_REV=3 # the patch's revision, in the module's id and its stamp
GPU_VK_DIR=$DEPS/vulkan
# The CUDA tree by its real path: CMake keys its build on the source and
# build paths, and the same tree reached through a symlinked build/deps (a
# git worktree's) would otherwise be reconfigured and rebuilt whole.
GPU_CUDA_DIR=$(mkdir -p "$DEPS" && cd "$DEPS" && pwd -P)/cuda

gpu_mode=${KS_GPU:-auto}
case $gpu_mode in auto | cuda | vulkan | none) ;; *)
    say "KS_GPU must be auto, cuda, vulkan or none, got '$gpu_mode'"
    exit 1
    ;;
esac

gpu_debs() { # installs the Debian packages named, those missing
    local p missing=""
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    say "installing Debian packages:$missing"
    local SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
}

# gpu_module_from_npm SPEC SHA512 FILE DEST ID: FILE of the npm package's
# bins/ directory installed as DEST (with DEST's .id holding ID), after the
# same checks as setup.sh's fetch.
gpu_module_from_npm() {
    local spec=$1 want=$2 file=$3 dest=$4 id=$5 tgz x
    tgz=$(fetch "$spec" "$want")
    x=$(mktemp -d "$DEPS/gpu.XXXXXX")
    tar xzf "$tgz" -C "$x" --wildcards "package/bins/*/$file"
    local so
    so=$(find "$x" -name "$file" | head -n 1)
    [ -n "$so" ] || { say "$spec has no $file"; rm -rf "$x"; exit 1; }
    # The modules of the prebuilt need libggml-base.so, the SONAME of the
    # prebuilt next to which they go (checked: they load as they are).
    if ! readelf -d "$so" | grep -q 'NEEDED.*\[libggml-base\.so\]'; then
        say "$spec's $file does not link libggml-base.so as the prebuilt names it"
        rm -rf "$x"
        exit 1
    fi
    mkdir -p "$(dirname "$dest")"
    cp "$so" "$dest.tmp" && mv "$dest.tmp" "$dest"
    echo "$id" >"${dest%.so}.id"
    rm -rf "$x" "$tgz"
}

# --- Vulkan: the module for the tests (and for KS_GPU=vulkan) --------------
GPU_VK_STAMP=$GPU_VK_DIR/.ok-3.22.1
if [ "$gpu_mode" != none ] && [ ! -f "$GPU_VK_STAMP" ]; then
    t0=$(date +%s)
    gpu_debs $GPU_VK_DEBS
    gpu_module_from_npm "$GPU_VK_PKG" "$GPU_VK_SHA512" libggml-vulkan.so "$GPU_VK_DIR/libks-ggml-vulkan.so" \
        "node-llama-cpp-3.22.1-vulkan"
    touch "$GPU_VK_STAMP"
    say "Vulkan backend (npm prebuilt) ready in $GPU_VK_DIR ($(($(date +%s) - t0)) s)"
fi
if [ "$gpu_mode" = vulkan ] && ! cmp -s "$GPU_VK_DIR/libks-ggml-vulkan.so" "$LLAMA/lib/libks-ggml-vulkan.so"; then
    cp "$GPU_VK_DIR/libks-ggml-vulkan.so" "$LLAMA/lib/libks-ggml-vulkan.so.tmp"
    mv "$LLAMA/lib/libks-ggml-vulkan.so.tmp" "$LLAMA/lib/libks-ggml-vulkan.so"
    cp "$GPU_VK_DIR/libks-ggml-vulkan.id" "$LLAMA/lib/libks-ggml-vulkan.id"
    say "Vulkan backend installed in $LLAMA/lib: kvstash uses the Vulkan devices it finds (-ngl auto)"
    command -v vulkaninfo >/dev/null && ! vulkaninfo --summary 2>/dev/null | grep -q 'PHYSICAL_DEVICE_TYPE_\(DISCRETE\|INTEGRATED\)_GPU' &&
        say "note: Vulkan lists no GPU here; a software device (llvmpipe) is used only with GGML_VK_VISIBLE_DEVICES=0"
fi

# --- CUDA --------------------------------------------------------------------
gpu_nvcc() { # the nvcc to use (CUDA 12 or 13), or nothing
    local n
    for n in "${CUDACXX:-}" "$(command -v nvcc 2>/dev/null)" /usr/local/cuda/bin/nvcc; do
        [ -n "$n" ] && [ -x "$n" ] || continue
        "$n" --version 2>/dev/null | grep -Eq 'release 1[23]\.' && { echo "$n"; return; }
    done
}

gpu_cuda_archs() { # CMAKE_CUDA_ARCHITECTURES for the GPUs here, or KS_CUDA_ARCHS
    local caps a out=""
    if [ -n "${KS_CUDA_ARCHS:-}" ]; then
        caps=${KS_CUDA_ARCHS//,/;}
        for a in ${caps//;/ }; do out="$out;${a%-real}-real"; done
    else
        caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | sort -u) || caps=""
        for a in $caps; do
            a=${a/./}
            # Architectures with arch-specific features take the "a" target
            # (sm_90a: Hopper's wgmma; ggml names 120a/121a itself).
            case $a in 90 | 100 | 101 | 103 | 120 | 121) a=${a}a ;; esac
            out="$out;$a-real"
        done
    fi
    echo "${out#;}"
}

gpu_has_nvidia() { nvidia-smi -L 2>/dev/null | grep -q '^GPU'; }

gpu_cuda_build() { # $1 = nvcc, $2 = architectures: builds or adopts $GPU_CUDA_DIR/build, installs the module
    local nvcc=$1 archs=$2 src=$GPU_CUDA_DIR/src bld=$GPU_CUDA_DIR/build t0 tag fresh
    local log=$GPU_CUDA_DIR/build.log
    tag=$(echo "$archs" | sed 's/-real//g; s/;/-/g')
    t0=$(date +%s)
    mkdir -p "$GPU_CUDA_DIR"
    # The pinned source, compared with a tree already there (an earlier build,
    # or one started by hand with the same flags): equal trees are adopted.
    fresh=$(mktemp -d "$DEPS/cuda-src.XXXXXX")
    pinned_source "$fresh" ggml
    # As in setup_cpu.sh: llama.cpp's copy of ggml lacks the standalone
    # build's pkg-config template; nothing is installed, so an empty one does.
    : >"$fresh/ggml/ggml.pc.in"
    # kvstash's batch-invariance patch (docs/LLAMA_FACTS.md, "Batch invariance
    # on CUDA"): its kernels run only where GGML_CUDA_KS_INVARIANT is set (the
    # engine sets it in exact mode), the stock ones otherwise.
    if ! (cd "$fresh" && patch -s -p1 <"$GPU_CUDA_PATCH"); then
        rm -rf "$fresh"
        say "the CUDA batch-invariance patch does not apply to this llama.cpp source"
        exit 1
    fi
    if [ -d "$src/ggml" ] && diff -rq "$fresh/ggml" "$src/ggml" >/dev/null 2>&1; then
        rm -rf "$fresh"
    else
        [ -d "$src" ] && say "the CUDA source tree in $src differs from the pinned source: rebuilding from scratch"
        rm -rf "$src" "$bld" && mkdir -p "$src" && mv "$fresh/ggml" "$src/ggml" && rm -rf "$fresh"
    fi
    echo "$SRC_COMMIT" >"$src/.commit"
    # A build still running in that tree (its log has no "rc=" line yet and
    # moves): running ninja beside it would break both.
    if [ -f "$log" ] && ! tail -n 1 "$log" | grep -q '^rc=' &&
        [ $(($(date +%s) - $(stat -c %Y "$log"))) -lt 900 ]; then
        say "a CUDA build is running in $bld (log $log); run setup again when it has finished"
        return 0
    fi
    [ -f "$bld/build.ninja" ] || say "building ggml's CUDA backend for $tag from the pinned source: about 35-50 minutes per architecture on 2 cores (log: $log)"
    # The flags of the build: loadable module, no NCCL, an unversioned SONAME
    # (libggml-base.so, as the prebuilt names it) and no build RPATH, so the
    # module loads next to the prebuilt libraries as it is. A tree configured
    # with them for this source is only built (a no-op when it is complete):
    # configuring it again could change its compile commands, and ninja would
    # then rebuild everything.
    local gen=() v
    command -v ninja >/dev/null && gen=(-G Ninja)
    local flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$archs" -DGGML_CUDA_NCCL=OFF -DGGML_BUILD_TESTS=OFF
        -DGGML_BUILD_EXAMPLES=OFF -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON -DCMAKE_SKIP_BUILD_RPATH=ON
        -DCMAKE_CUDA_COMPILER="$nvcc")
    local configured=0
    if [ -f "$bld/CMakeCache.txt" ] && { [ -f "$bld/build.ninja" ] || [ -f "$bld/Makefile" ]; }; then
        configured=1
        for v in "CMAKE_HOME_DIRECTORY=$src/ggml" "CMAKE_CACHEFILE_DIR=$bld" "CMAKE_CUDA_ARCHITECTURES=$archs" "CMAKE_CUDA_COMPILER=$nvcc" \
            CMAKE_BUILD_TYPE=Release BUILD_SHARED_LIBS=ON GGML_BACKEND_DL=ON GGML_NATIVE=OFF GGML_CUDA=ON \
            GGML_CUDA_NCCL=OFF CMAKE_PLATFORM_NO_VERSIONED_SONAME=ON CMAKE_SKIP_BUILD_RPATH=ON; do
            [ "$(sed -n "s/^${v%%=*}:[A-Z]*=//p" "$bld/CMakeCache.txt")" = "${v#*=}" ] || { configured=0; break; }
        done
    fi
    if ! { { [ $configured = 1 ] || PATH=$(dirname "$nvcc"):$PATH cmake -S "$src/ggml" -B "$bld" "${gen[@]}" \
        "${flags[@]}" >"$GPU_CUDA_DIR/configure.log" 2>&1; } &&
        nice -n 15 cmake --build "$bld" --target ggml-cuda -j "$(nproc)" >>"$log" 2>&1; }; then
        echo "rc=1 secs=$(($(date +%s) - t0))" >>"$log"
        tail -n 30 "$log" >&2
        say "building ggml's CUDA backend failed (log: $log)"
        exit 1
    fi
    # the last line says the build is over (the check above reads it)
    echo "rc=0 secs=$(($(date +%s) - t0))" >>"$log"
    local mod
    mod=$(find "$bld" -name libggml-cuda.so -type f | head -n 1)
    [ -n "$mod" ] || { say "the CUDA build produced no libggml-cuda.so (log: $log)"; exit 1; }
    if ! readelf -d "$mod" | grep -q 'NEEDED.*\[libggml-base\.so\]'; then
        # Only a tree configured without the unversioned SONAME needs this.
        gpu_debs patchelf
        cp "$mod" "$mod.patched" && patchelf --replace-needed libggml-base.so.0 libggml-base.so "$mod.patched"
        mod=$mod.patched
    fi
    # Stripped: 46 MB with symbols, 39.5 MB without; the build tree keeps the full one.
    strip --strip-unneeded -o "$LLAMA/lib/libks-ggml-cuda.so.tmp" "$mod"
    mv "$LLAMA/lib/libks-ggml-cuda.so.tmp" "$LLAMA/lib/libks-ggml-cuda.so"
    echo "kvstash-ggml-cuda-$SRC_COMMIT-sm$tag-inv$GPU_CUDA_REV" >"$LLAMA/lib/libks-ggml-cuda.id"
    touch "$GPU_CUDA_DIR/.ok-$SRC_COMMIT-$tag-inv$GPU_CUDA_REV"
    say "CUDA backend (sm$tag) ready in $LLAMA/lib ($(($(date +%s) - t0)) s)"
}

gpu_want_cuda=0
gpu_nvcc_bin=$(gpu_nvcc)
case $gpu_mode in
cuda) gpu_want_cuda=1 ;;
auto) [ -n "$gpu_nvcc_bin" ] && gpu_has_nvidia && gpu_want_cuda=1 ;;
esac
if [ $gpu_want_cuda = 1 ]; then
    if [ -n "$gpu_nvcc_bin" ]; then
        gpu_archs=$(gpu_cuda_archs)
        if [ -z "$gpu_archs" ]; then
            say "KS_GPU=cuda: nvidia-smi lists no GPU here, so say which to build for: KS_CUDA_ARCHS=90a (H100/H200), 89 (Ada), 86 (Ampere), ..."
            exit 1
        fi
        gpu_tag=$(echo "$gpu_archs" | sed 's/-real//g; s/;/-/g')
        gpu_commit_stamp=$(ls "$GPU_CUDA_DIR"/.ok-*-"$gpu_tag-inv$GPU_CUDA_REV" 2>/dev/null | head -n 1 || true)
        if [ -z "$gpu_commit_stamp" ] || [ ! -f "$LLAMA/lib/libks-ggml-cuda.so" ]; then
            gpu_has_nvidia || say "note: no NVIDIA GPU is visible here (nvidia-smi): the CUDA backend is built for $gpu_tag, and kvstash runs on the CPU until it runs where such a GPU is"
            gpu_cuda_build "$gpu_nvcc_bin" "$gpu_archs"
        fi
    elif [ ! -f "$LLAMA/lib/libks-ggml-cuda.so" ]; then
        say "KS_GPU=cuda without nvcc: fetching the npm prebuilt $GPU_CUDA_PKG (159 MB, needs the CUDA 13 runtime)"
        gpu_module_from_npm "$GPU_CUDA_PKG" "$GPU_CUDA_SHA512" libggml-cuda.so "$LLAMA/lib/libks-ggml-cuda.so" \
            "node-llama-cpp-3.22.1-cuda"
        ldconfig -p 2>/dev/null | grep -q 'libcudart\.so\.13' ||
            say "note: the CUDA 13 runtime (libcudart.so.13, libcublas.so.13) is not installed: kvstash will warn and run on the CPU"
        say "CUDA backend (npm prebuilt) ready in $LLAMA/lib"
    fi
fi
