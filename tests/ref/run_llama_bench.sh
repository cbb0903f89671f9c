#!/bin/sh
# Build llama.cpp's llama-bench from the llama.cpp sources vendored in the
# llama-cpp-python sdist (by default the newest release on PyPI, 0.3.36 on
# 2026-12-05; the golden files pin 0.3.16) and run it on a GGUF, as the
# reference for `dsq-bench cpu` (docs/benchmarks.md).
#
# usage: tests/ref/run_llama_bench.sh [MODEL] [llama-bench args...]
#   MODEL defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf; the default
#   args are -p 512 -n 128 -t 1,2 (prompt processing of 512 tokens and
#   generation of 128, on 1 and 2 threads).
# env:
#   LLAMA_CPP_VERSION the llama-cpp-python release (default 0.3.36)
#   LLAMA_BENCH_DIR   build folder (default: build-llama-bench-VERSION in
#                     the repo root, git-ignored by the /build*/ rule)
#   LLAMA_CPP_SDIST   a local llama_cpp_python-VERSION.tar.gz to use instead
#                     of `pip download`
#   JOBS              parallel compile jobs (default 2)
# The build is native (-DGGML_NATIVE=ON, i.e. -march=native, as a user who
# builds llama.cpp for their own box gets) with llama.cpp's defaults
# otherwise (OpenMP thread pool, Release); tests/ref/build_llama_tools.sh does
# it once, later runs reuse it.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=${1:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ $# -gt 0 ] && shift
# the shared llama.cpp build (configure once, build each tool once)
BIN=$(LLAMA_CPP_VERSION=${LLAMA_CPP_VERSION:-0.3.36} \
    "$ROOT/tests/ref/build_llama_tools.sh" llama-bench)

if [ ! -f "$MODEL" ]; then
    echo "run_llama_bench.sh: model $MODEL not found" >&2
    exit 1
fi
if [ $# -eq 0 ]; then
    set -- -p 512 -n 128 -t 1,2
fi
exec "$BIN" -m "$MODEL" "$@"
