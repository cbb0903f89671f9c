#!/bin/sh
# dsq-bench cpu against llama.cpp's llama-bench on the llama-quantize-made
# SmolLM2 GGUFs (tests/ref/make_smollm2_quants.sh), interleaved: for each
# round, thread count and file, dsq then llama.cpp, back to back, each at
# its own defaults (no OMP_* variables are set here). docs/benchmarks.md,
# "GGUF types".
#
# usage: tests/ref/run_gguf_bench.sh [BUILD_DIR]   (default: build)
# env:   ROUNDS (default "A B"), THREADS (default "1 2"),
#        FILES (default "Q4_K_M Q5_K_M Q6_K Q8_0"),
#        LLAMA_CPP_VERSION (the peer's llama-cpp-python release, 0.3.36)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-$ROOT/build}
Q=$ROOT/models/smollm2-quants
# the peer: the newest llama-cpp-python release's llama.cpp
LB=$(LLAMA_CPP_VERSION=${LLAMA_CPP_VERSION:-0.3.36} \
    "$ROOT/tests/ref/build_llama_tools.sh" llama-bench | tail -n 1)
for round in ${ROUNDS:-A B}; do
  for t in ${THREADS:-1 2}; do
    for v in ${FILES:-Q4_K_M Q5_K_M Q6_K Q8_0}; do
      f=$Q/SmolLM2-135M-Instruct.$v.gguf
      echo "=== $round t$t $v dsq $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
      "$B/tools/dsq-bench" cpu --model "$f" --threads "$t" --reps 3 --prompt-tokens 512 \
          --gen-tokens 128 2>&1 | grep -E '^(pp|tg)'
      echo "=== $round t$t $v llama $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
      "$LB" -m "$f" -p 512 -n 128 -t "$t" -r 3 2>&1 | grep -E 'pp512|tg128'
    done
  done
done
