#!/bin/sh
# The real-size CPU table of docs/benchmarks.md in one run: dsq-bench cpu
# beside llama.cpp's llama-bench on DeepSeek-Coder-6.7B-shaped files (Q4_0,
# Q4_K_M, Q5_K_M, Q8_0) and a DeepSeek-V2-Lite-shaped Q4_0 file, prefill of
# 512 tokens and 32 decoded tokens, per thread count and file dsq then
# llama.cpp back to back, each at its own defaults (no OMP_* variables are
# set here). dsq-bench's --bandwidth probe runs before and after each decode,
# so every row carries the memory's ceiling measured the same minute.
#
# The files hold random weights: `dsq-bench write-model --shape 6.7b|v2-lite`
# writes the Q4_0 files, `llama-quantize --allow-requantize` the other types
# from the 6.7B one. They are written once into the cache (never into git):
# about 27 GiB in all.
#
# usage: tests/ref/run_realsize_bench.sh [BUILDDIR]   (default build-release)
# env:   THREADS (default "2 1"), FILES (default "q4_0 q4_k_m q5_k_m q8_0
#        v2-lite-q4_0"), REPS (default 1, both tools' repetitions),
#        CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/dsq),
#        LLAMA_CPP_VERSION (the peer's llama-cpp-python release, 0.3.36)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-$ROOT/build-release}
C=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dsq}
REPS=${REPS:-1}
[ -x "$B/tools/dsq-bench" ] || { echo "run_realsize_bench.sh: missing $B/tools/dsq-bench" >&2; exit 1; }
BIN=$(LLAMA_CPP_VERSION=${LLAMA_CPP_VERSION:-0.3.36} \
    "$ROOT/tests/ref/build_llama_tools.sh" llama-bench llama-quantize)
LB=$(echo "$BIN" | sed -n 1p)
LQ=$(echo "$BIN" | sed -n 2p)
mkdir -p "$C"

# file NAME: the path of the cached file, written when missing
file() {
    case $1 in
        v2-lite-q4_0) f=$C/ds-v2-lite-q4_0.gguf ;;
        *) f=$C/ds-coder-6.7b-$1.gguf ;;
    esac
    if [ ! -e "$f" ]; then
        case $1 in
            v2-lite-q4_0) "$B/tools/dsq-bench" write-model --shape v2-lite "$f.tmp" >&2 ;;
            q4_0) "$B/tools/dsq-bench" write-model --shape 6.7b "$f.tmp" >&2 ;;
            *) "$LQ" --allow-requantize "$(file q4_0)" "$f.tmp" \
                   "$(echo "$1" | tr '[:lower:]' '[:upper:]')" >/dev/null 2>&1 ;;
        esac
        mv "$f.tmp" "$f"
    fi
    echo "$f"
}

FILES=${FILES:-q4_0 q4_k_m q5_k_m q8_0 v2-lite-q4_0}
for v in $FILES; do file "$v" >/dev/null; done
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), dsq $(git -C "$ROOT" rev-parse --short HEAD)," \
     "$(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
for t in ${THREADS:-2 1}; do
    for v in $FILES; do
        f=$(file "$v")
        echo "=== t$t $v dsq $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
        "$B/tools/dsq-bench" cpu --model "$f" --threads "$t" --prompt-tokens 512 \
            --gen-tokens 32 --reps "$REPS" --bandwidth 2>&1 | grep -Ev '^ *$| level=' || true
        echo "=== t$t $v llama.cpp $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
        "$LB" -m "$f" -p 512 -n 32 -t "$t" -r "$REPS" 2>&1 | grep -E 'pp512|tg32' || true
    done
done
