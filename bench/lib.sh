# lib.sh — the common start of the bench/*.sh scripts: binary and model (the
# bench model is generated when missing), node (for the server_*.sh scripts,
# which drive HTTP from node) and gnuplot, output dirs.
# Usage (after setting ROOT): . "$ROOT/bench/lib.sh"; bench_prepare NAME.sh "$@"
# Sets BIN, MODEL, THREADS, OUT, IMG. A script of several models then calls
# bench_models NAME.sh MODEL... for the others.

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
    bench_models "$name" "$MODEL"
    case $name in
    server_*) command -v node >/dev/null 2>&1 || { echo "$name: node is required" >&2; exit 1; } ;;
    esac
    if ! command -v gnuplot >/dev/null 2>&1; then
        echo "$name: gnuplot missing; installing gnuplot-nox" >&2
        apt-get install -y gnuplot-nox >/dev/null || { apt-get update >/dev/null && apt-get install -y gnuplot-nox >/dev/null; }
    fi
    mkdir -p "$OUT" "$IMG"
}

# bench_models NAME.sh MODEL...: writes each missing model with $BIN (set by
# bench_prepare): build/models/bench-*.gguf with that preset (bench-q4k,
# bench-target, ...; a name ending in -fim: the preset before it, with the
# fill-in-the-middle tokens, mkmodel --fim), any other path the bench model.
bench_models() {
    local name=$1 m preset fim
    shift
    for m in "$@"; do
        [ -f "$m" ] && continue
        echo "$name: generating the bench model at $m" >&2
        mkdir -p "$(dirname "$m")"
        preset=bench fim=()
        case $(basename "$m" .gguf) in bench-*) preset=$(basename "$m" .gguf) ;; esac
        case $preset in *-fim) preset=${preset%-fim} fim=(--fim) ;; esac
        "$BIN" mkmodel --preset "$preset" --seed 1 "${fim[@]}" "$m"
    done
}
