#!/bin/sh
# Build llama.cpp programs (llama-bench, llama-server, llama-quantize,
# llama-perplexity, ...) from the llama.cpp sources vendored in the
# llama-cpp-python sdist: the same llama.cpp the golden files come from, and
# the reference dsq is measured against (docs/benchmarks.md). One shared
# configure for every target, so the tools agree on build flags; each target
# is compiled once and reused.
#
# usage: tests/ref/build_llama_tools.sh TARGET...
#   e.g. tests/ref/build_llama_tools.sh llama-server llama-quantize
#   Prints the path of each built program, one a line, in the order given.
# env:
#   LLAMA_BENCH_DIR   build folder (default: build-llama-bench in the repo
#                     root, git-ignored by the /build*/ rule)
#   LLAMA_CPP_VERSION the llama-cpp-python release whose llama.cpp to build
#                     (default 0.3.16: the one the golden files and the
#                     quantized test models come from; benchmarks compare
#                     against the newest, e.g. 0.3.36, built in a folder of
#                     its own: build-llama-bench-0.3.36)
#   LLAMA_CPP_SDIST   a local llama_cpp_python-VERSION.tar.gz to use instead
#                     of the download (scripts/pypi-sdist, pinned by sha256
#                     for 0.3.16 and 0.3.36, else LLAMA_CPP_SDIST_SHA256;
#                     the only network access)
#   JOBS              parallel compile jobs (default 2)
#   LLAMA_PORTABLE=1  a portable build instead (-DGGML_NATIVE=OFF, baseline
#                     x86-64 / AArch64, -ffp-contract=off, default folder
#                     build-llama-portable): what tests/ref/make_smollm2_quants.sh
#                     quantizes with, so its files are byte-identical on
#                     every machine (no FMA contraction, no CPU-dependent
#                     code paths in the reference quantizers)
# The build is native (-DGGML_NATIVE=ON, i.e. -march=native, as a user who
# builds llama.cpp for their own box gets) with llama.cpp's defaults
# otherwise (OpenMP thread pool, Release), static, without libcurl.
# Concurrent callers are serialised on a lock file in the build folder, so
# two engineers asking for different targets do not corrupt the tree.
set -eu
VERSION=${LLAMA_CPP_VERSION:-0.3.16}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SUFFIX=
[ "$VERSION" = 0.3.16 ] || SUFFIX=-$VERSION
if [ "${LLAMA_PORTABLE:-}" = 1 ]; then
    DIR=${LLAMA_BENCH_DIR:-$ROOT/build-llama-portable$SUFFIX}
    FLAGS="-DGGML_NATIVE=OFF -DCMAKE_C_FLAGS=-ffp-contract=off -DCMAKE_CXX_FLAGS=-ffp-contract=off"
else
    DIR=${LLAMA_BENCH_DIR:-$ROOT/build-llama-bench$SUFFIX}
    FLAGS="-DGGML_NATIVE=ON"
fi
if [ $# -eq 0 ]; then
    echo "usage: $0 TARGET... (e.g. llama-server llama-bench)" >&2
    exit 2
fi
mkdir -p "$DIR"

build() {
    SDIST=$DIR/llama_cpp_python-$VERSION.tar.gz
    if [ ! -f "$SDIST" ]; then
        if [ -n "${LLAMA_CPP_SDIST:-}" ]; then
            cp "$LLAMA_CPP_SDIST" "$SDIST"
        else
            # the pinned sdist as a plain archive (pip download would
            # install and run its build backend first)
            case "$VERSION" in
                0.3.16) SHA=34ed0f9bd9431af045bb63d9324ae620ad0536653740e9bb163a2e1fcb973be6 ;;
                0.3.36) SHA=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e ;;
                *) SHA=${LLAMA_CPP_SDIST_SHA256:?"no pinned sha256 for llama-cpp-python $VERSION: set LLAMA_CPP_SDIST_SHA256"} ;;
            esac
            "$ROOT/scripts/pypi-sdist" "llama-cpp-python==$VERSION" "$SHA" "$DIR" >/dev/null
        fi
    fi
    if [ ! -d "$DIR/llama_cpp_python-$VERSION" ]; then
        tar -xzf "$SDIST" -C "$DIR"
    fi
    if [ ! -f "$DIR/llama.cpp-build/CMakeCache.txt" ]; then
        cmake -S "$DIR/llama_cpp_python-$VERSION/vendor/llama.cpp" \
              -B "$DIR/llama.cpp-build" \
              -DCMAKE_BUILD_TYPE=Release $FLAGS -DLLAMA_BUILD_TOOLS=ON \
              -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
              -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
              -DBUILD_SHARED_LIBS=OFF >"$DIR/cmake-configure.log" 2>&1
    fi
    for t in "$@"; do
        if [ ! -x "$DIR/llama.cpp-build/bin/$t" ]; then
            echo "build_llama_tools.sh: building $t (log: $DIR/cmake-build-$t.log)" >&2
            if ! cmake --build "$DIR/llama.cpp-build" --target "$t" -j "${JOBS:-2}" \
                    >"$DIR/cmake-build-$t.log" 2>&1; then
                echo "build_llama_tools.sh: building $t failed, see $DIR/cmake-build-$t.log" >&2
                return 1
            fi
        fi
    done
}

# flock(1) (util-linux) serialises builds; without it, build unlocked.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$DIR/.build.lock"
    flock 9
fi
build "$@"
for t in "$@"; do
    echo "$DIR/llama.cpp-build/bin/$t"
done
