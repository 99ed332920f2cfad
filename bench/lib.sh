# lib.sh — the common start of the bench/*.sh scripts: binary and model (the
# bench model is generated when missing), node (for the server_*.sh scripts,
# which drive HTTP from node) and gnuplot, output dirs.
# Usage (after setting ROOT): . "$ROOT/bench/lib.sh"; bench_prepare NAME.sh "$@"
# Sets BIN, MODEL, THREADS, OUT, IMG.

bench_prepare() {
    local name=$1
    shift
    BIN=${1:-$ROOT/build/kvstash}
    MODEL=${2:-$ROOT/build/models/bench.gguf}
    THREADS=${THREADS:-2}
    OUT=$ROOT/bench/out
    IMG=$ROOT/docs/img

    if [ ! -x "$BIN" ]; then
        echo "$name: no kvstash binary at $BIN (build it first: make build)" >&2
        exit 1
    fi
    if [ ! -f "$MODEL" ]; then
        echo "$name: generating the bench model at $MODEL" >&2
        mkdir -p "$(dirname "$MODEL")"
        # build/models/bench-*.gguf: that preset (bench-q4k, bench-target, ...); else the bench model
        local preset=bench
        case $(basename "$MODEL" .gguf) in bench-*) preset=$(basename "$MODEL" .gguf) ;; esac
        "$BIN" mkmodel --preset "$preset" --seed 1 "$MODEL"
    fi
    case $name in
    server_*) command -v node >/dev/null 2>&1 || { echo "$name: node is required" >&2; exit 1; } ;;
    esac
    if ! command -v gnuplot >/dev/null 2>&1; then
        echo "$name: gnuplot missing; installing gnuplot-nox" >&2
        apt-get install -y gnuplot-nox >/dev/null || { apt-get update >/dev/null && apt-get install -y gnuplot-nox >/dev/null; }
    fi
    mkdir -p "$OUT" "$IMG"
}
