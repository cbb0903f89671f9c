#!/bin/sh
# Build llama.cpp's llama-bench from the llama.cpp sources vendored in the
# llama-cpp-python sdist (the same llama.cpp the golden files come from) and
# run it on a GGUF, as the reference for `dsq-bench cpu` (docs/benchmarks.md).
#
# usage: tests/ref/run_llama_bench.sh [MODEL] [llama-bench args...]
#   MODEL defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf; the default
#   args are -p 512 -n 128 -t 1,2 (prompt processing of 512 tokens and
#   generation of 128, on 1 and 2 threads).
# env:
#   LLAMA_BENCH_DIR   build folder (default: build-llama-bench in the repo
#                     root, git-ignored by the /build*/ rule)
#   LLAMA_CPP_SDIST   a local llama_cpp_python-0.3.16.tar.gz to use instead
#                     of `pip download`
#   JOBS              parallel compile jobs (default 2)
# The build is native (-DGGML_NATIVE=ON, i.e. -march=native, as a user who
# builds llama.cpp for their own box gets) with llama.cpp's defaults
# otherwise (OpenMP thread pool, Release). It is done once; later runs reuse it.
set -eu
VERSION=0.3.16
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${LLAMA_BENCH_DIR:-$ROOT/build-llama-bench}
MODEL=${1:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ $# -gt 0 ] && shift
BIN=$DIR/llama.cpp-build/bin/llama-bench
mkdir -p "$DIR"

if [ ! -x "$BIN" ]; then
    SDIST=$DIR/llama_cpp_python-$VERSION.tar.gz
    if [ ! -f "$SDIST" ]; then
        if [ -n "${LLAMA_CPP_SDIST:-}" ]; then
            cp "$LLAMA_CPP_SDIST" "$SDIST"
        else
            python3 -m pip download --no-deps --no-binary :all: \
                "llama-cpp-python==$VERSION" -d "$DIR"
        fi
    fi
    if [ ! -d "$DIR/llama_cpp_python-$VERSION" ]; then
        tar -xzf "$SDIST" -C "$DIR"
    fi
    cmake -S "$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp" \
          -B "$DIR/llama.cpp-build" \
          -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_BUILD_TOOLS=ON \
          -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
          -DBUILD_SHARED_LIBS=OFF >"$DIR/cmake-configure.log" 2>&1
    cmake --build "$DIR/llama.cpp-build" --target llama-bench -j "${JOBS:-2}" \
          >"$DIR/cmake-build.log" 2>&1
fi

if [ ! -f "$MODEL" ]; then
    echo "run_llama_bench.sh: model $MODEL not found" >&2
    exit 1
fi
if [ $# -eq 0 ]; then
    set -- -p 512 -n 128 -t 1,2
fi
exec "$BIN" -m "$MODEL" "$@"
