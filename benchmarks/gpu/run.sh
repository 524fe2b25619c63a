#!/usr/bin/env bash
# Run THERE after build.sh (and here with -ngl 0 after build.sh --cpu): reassembles the demo model from
# the bundle's three parts (its sha256 checked), then benchmarks/gpu/gpu_check.py with -ngl: the cost
# model, bench, tune --no-save, acceptance on the evaluation prompts. The JSON goes to $OUT (the device
# tool's folder that comes back; benchmarks/gpu/build/ when unset), the table to stdout.
# Usage: benchmarks/gpu/run.sh [-ngl N] [--quick]      (PYTHON: python3 by default)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B="$ROOT/benchmarks/gpu/bundle"
W="$ROOT/benchmarks/gpu/build"
PY=${PYTHON:-python3}
ngl=99
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        -ngl) ngl=$2; shift 2 ;;
        --quick) extra+=(--quick); shift ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -d "$W/site/llama_cpp" ] || { echo "run build.sh first ($W/site has no llama_cpp)" >&2; exit 2; }
model="$W/demo.gguf"
cat "$B"/part1/demo.gguf.part0 "$B"/part2/demo.gguf.part1 "$B"/part3/demo.gguf.part2 > "$model"
(cd "$W" && sha256sum -c "$B/part1/demo.sha256")
out=${OUT:-$W}
export PYTHONPATH="$W/site:$ROOT" PYTHONUNBUFFERED=1
# (tune's profiles and the demo cache go to the build folder, not the machine's home)
export XDG_CONFIG_HOME="$W/config" MTP_CLI_CACHE="$W/cache"
"$PY" -m mtp_cli --version
"$PY" "$ROOT/benchmarks/gpu/gpu_check.py" -m "$model" -ngl "$ngl" --out "$out/gpu_results_ngl$ngl.json" "${extra[@]}"
