#!/usr/bin/env bash
# Run HERE (network: the package index). Writes benchmarks/gpu/bundle/ (git-ignored), the files a GPU
# machine without network needs beside the project tree, in parts that fit one transfer each:
#   src/     llama-cpp-python 0.3.36's sdist, its vendored llama.cpp trimmed to what a CPU or CUDA
#            build compiles (no models/, docs, tests, examples or other backends), as one .tar.xz
#   wheels/  the pure-Python packages the machine lacks (gguf, diskcache, platformdirs)
#   part1/ part2/ part3/  the demo model in three pieces, and demo.sha256 (in part1)
# Usage: benchmarks/gpu/make_bundle.sh   (PYTHON: the project's venv python by default)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B="$ROOT/benchmarks/gpu/bundle"
PY=${PYTHON:-$ROOT/.venv/bin/python}
VER=0.3.36
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rm -rf "$B"
mkdir -p "$B/src" "$B/wheels" "$B/part1" "$B/part2" "$B/part3"

echo "1/3 llama-cpp-python $VER, trimmed"
"$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VER" -d "$work"
tar -xzf "$work/llama_cpp_python-$VER.tar.gz" -C "$work"
S="$work/llama_cpp_python-$VER"
L="$S/vendor/llama.cpp"
rm -rf "$S"/{.git,docs,tests,examples,docker} \
    "$L"/{models,docs,tests,examples,media,benches,scripts,gguf-py,conversion,pocs,grammars,prompts,requirements,licenses,.github,.devops}
for d in "$L"/tools/*/; do [ "$(basename "$d")" = mtmd ] || rm -rf "$d"; done  # (mtmd: built by default)
rm -rf "$L"/tools/mtmd/test-*
for d in "$L"/ggml/src/ggml-*/; do
    case "$(basename "$d")" in ggml-cpu|ggml-cuda) ;; *) rm -rf "$d" ;; esac
done
tar -cJf "$B/src/llama-cpp-python-$VER-trimmed.tar.xz" -C "$work" "llama_cpp_python-$VER"

echo "2/3 wheels"
"$PY" -m pip download -q --no-deps --only-binary :all: -d "$B/wheels" gguf==0.19.0 diskcache==5.6.3 platformdirs==4.14.9

echo "3/3 the demo model"
model=$("$PY" -c "from mtp_cli.demo import demo_model; print(demo_model())")
(cd "$(dirname "$model")" && sha256sum "$(basename "$model")") | awk '{print $1"  demo.gguf"}' > "$B/part1/demo.sha256"
size=$(stat -c %s "$model")
chunk=$(( (size + 2) / 3 ))
split -b "$chunk" -d -a 1 "$model" "$work/demo.gguf.part"
for i in 1 2 3; do mv "$work/demo.gguf.part$((i - 1))" "$B/part$i/"; done

echo "bundle in $B:"
tree_mb=$(cd "$ROOT" && git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
for t in "src wheels part1" "part2" "part3"; do
    n=$tree_mb
    for p in $t; do n=$(( n + $(du -sb "$B/$p" | cut -f1) )); done
    printf '  transfer with %-18s %5.1f MB (the project tree %.1f MB included)\n' "$t:" "$(echo "$n / 1000000" | bc -l)" "$(echo "$tree_mb / 1000000" | bc -l)"
done
