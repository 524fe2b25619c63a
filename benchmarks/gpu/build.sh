#!/usr/bin/env bash
# Run THERE, on the GPU machine (and here with --cpu, to test the same steps): builds llama-cpp-python
# 0.3.36 from the bundle's trimmed sources into benchmarks/gpu/build/site, with CUDA for this GPU's own
# architecture (--cpu: a CPU build), without build isolation or an index (the machine's python3 needs
# scikit-build-core, cmake and ninja; nvcc for CUDA); the bundle's wheels go beside it. Prints the
# build time, then `mtp-cli --version` from the result.
# Usage: benchmarks/gpu/build.sh [--cpu]      (PYTHON: python3 by default)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B="$ROOT/benchmarks/gpu/bundle"
W="$ROOT/benchmarks/gpu/build"
PY=${PYTHON:-python3}
cuda=1
[ "${1:-}" = --cpu ] && cuda=0
rm -rf "$W"
mkdir -p "$W/site"
tar -xJf "$B"/src/llama-cpp-python-*-trimmed.tar.xz -C "$W"
args="-DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF"
if [ "$cuda" = 1 ]; then
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')
    args="$args -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=$arch"
    echo "CUDA build for sm_$arch ($(nvcc --version | tail -1))"
fi
export CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
t0=$(date +%s)
"$PY" -m pip install -q --no-deps --no-build-isolation --no-index --target "$W/site" "$W"/llama_cpp_python-*/
"$PY" -m pip install -q --no-deps --no-index --target "$W/site" "$B"/wheels/*.whl
echo "built in $(( $(date +%s) - t0 )) s ($CMAKE_BUILD_PARALLEL_LEVEL jobs, CMAKE_ARGS=$CMAKE_ARGS)"
PYTHONPATH="$W/site:$ROOT" "$PY" -m mtp_cli --version
