#!/bin/sh
# dsqd beside llama.cpp's llama-server, each at its own defaults
# (llama-server -t T -tb T -np C; continuous batching is its default), and
# llama-server -fa on as a second row (0.3.36's default is auto),
# interleaved by concurrency in one run:
# `dsq-bench serve` streams /v1/completions (128-id prompts, 64 new tokens,
# greedy, ignore_eos) from C clients. Then the same load once more through
# the OpenAI Python SDK (tools/serve_crosscheck.py) against each server, as
# the independent check of dsq-bench serve's own client. Then llama-bench
# beside dsq-bench cpu (pp512 / tg128), the decode step at context depth,
# batched decode (llama-batched-bench beside dsq-bench pad: step time per
# batch size, so the cost of each extra row), and last the machine's own
# ceilings: read bandwidth of L1, L2, L3 and DRAM measured by likwid-bench
# (Debian's likwid; skipped if absent) on working sets that fit each level
# and on one the size of the model's weights. Peers never get our OpenMP
# settings (dsq-bench serve unsets OMP_WAIT_POLICY / GOMP_SPINCOUNT for
# them; this script sets none). Loopback only.
#
# The realsize section serves a DeepSeek-Coder-6.7B-shaped Q4_0 file
# (random weights, `dsq-bench write-model --shape 6.7b`, written once into
# the cache, never into git) the same way at REAL_CLIENTS, with 8 requests
# a round (a 6.7B model on 2 cores makes ~5-8 tokens a second).
#
# usage: tests/ref/run_serve_compare.sh [BUILDDIR] [MODEL]
#   BUILDDIR  a dsq build (default build-release, as scripts/serve builds)
#   MODEL     GGUF both servers load (default the SmolLM2 Q4_1 file)
# env: ROUNDS (default 2), CLIENTS (default "1 4 8 16"), REQUESTS (32),
#      THREADS (2), PY (python with the openai package, default .venv),
#      PARTS (default "serve crosscheck kernels": which sections run;
#      "realsize" adds the 6.7B section), REAL_MODEL (default
#      ${XDG_CACHE_HOME:-$HOME/.cache}/dsq/ds-coder-6.7b-q4_0.gguf, written
#      when missing), REAL_CLIENTS (default 4), LLAMA_CPP_VERSION (the
#      peer's llama-cpp-python release, default 0.3.36)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
B=${1:-$ROOT/build-release}
MODEL=${2:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
ROUNDS=${ROUNDS:-2}
CLIENTS=${CLIENTS:-"1 4 8 16"}
REQUESTS=${REQUESTS:-32}
T=${THREADS:-2}
PY=${PY:-$ROOT/.venv/bin/python}
PARTS=" ${PARTS:-serve crosscheck kernels} "
part() { case "$PARTS" in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
for f in "$B/tools/dsqd" "$B/tools/dsq-bench" "$MODEL"; do
    [ -e "$f" ] || { echo "run_serve_compare.sh: missing $f" >&2; exit 1; }
done
# the peer: the newest llama-cpp-python release's llama.cpp (PyPI's newest
# on 2026-12-05), not the 0.3.16 the golden files pin
BIN=$(LLAMA_CPP_VERSION=${LLAMA_CPP_VERSION:-0.3.36} \
    "$ROOT/tests/ref/build_llama_tools.sh" llama-server llama-bench llama-batched-bench)
LS=$(echo "$BIN" | sed -n 1p)
LB=$(echo "$BIN" | sed -n 2p)
LBB=$(echo "$BIN" | sed -n 3p)
SERVE="$B/tools/dsq-bench serve --model $MODEL --threads $T --requests $REQUESTS --prompt-len 128 --max-tokens 64"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(git -C "$ROOT" rev-parse --short HEAD), $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs"
r=1
part serve || r=$((ROUNDS + 1))
while [ $r -le "$ROUNDS" ]; do
    for c in $CLIENTS; do
        echo "## round $r, C = $c, load $(cut -d' ' -f1-3 /proc/loadavg)"
        $SERVE --clients "$c" --dsqd "$B/tools/dsqd" --llama-server "$LS" || true
        echo "## round $r, C = $c, llama-server -fa, load $(cut -d' ' -f1-3 /proc/loadavg)"
        $SERVE --clients "$c" --llama-server "$LS" --llama-arg -fa --llama-arg on || true
    done
    r=$((r + 1))
done

if part realsize; then
    RM=${REAL_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/dsq/ds-coder-6.7b-q4_0.gguf}
    if [ ! -e "$RM" ]; then
        mkdir -p "$(dirname "$RM")"
        "$B/tools/dsq-bench" write-model --shape 6.7b "$RM.tmp" && mv "$RM.tmp" "$RM"
    fi
    r=1
    while [ $r -le "$ROUNDS" ]; do
        for c in ${REAL_CLIENTS:-4}; do
            echo "## realsize round $r, C = $c, $(basename "$RM"), load $(cut -d' ' -f1-3 /proc/loadavg)"
            "$B/tools/dsq-bench" serve --model "$RM" --threads "$T" --requests 8 \
                --prompt-len 128 --max-tokens 64 --clients "$c" \
                --dsqd "$B/tools/dsqd" --llama-server "$LS" || true
        done
        r=$((r + 1))
    done
fi

# the independent client: one server at a time, dsq-bench serve and the
# OpenAI SDK against it back to back
port=$(( 20000 + $$ % 20000 ))
wait_up() {
    i=0
    while ! curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
        i=$((i + 1)); [ $i -lt 600 ] || return 1; sleep 0.2
    done
}

for srv in $(part crosscheck && echo dsqd llama-server); do
    if [ $srv = dsqd ]; then
        "$B/tools/dsqd" --model "$MODEL" --host 127.0.0.1 --port $port --threads "$T" \
            --max-num-seqs 16 --max-model-len 256 --kv-cache-memory 256MiB --log-level warn \
            >/dev/null 2>&1 &
    else
        env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$LS" -m "$MODEL" --host 127.0.0.1 --port $port \
            -t "$T" -tb "$T" -np 16 -c 4096 --no-webui >/dev/null 2>&1 &
    fi
    pid=$!
    wait_up
    for c in 4 16; do
        echo "## cross-check $srv C = $c, load $(cut -d' ' -f1-3 /proc/loadavg)"
        $B/tools/dsq-bench serve --url "http://127.0.0.1:$port" --clients "$c" \
            --requests "$REQUESTS" --prompt-len 128 --max-tokens 64 | tail -1
        "$PY" "$ROOT/tools/serve_crosscheck.py" "http://127.0.0.1:$port" "$c" "$REQUESTS" 128 64
    done
    kill $pid; wait $pid 2>/dev/null || true
    port=$((port + 1))
done

part kernels || exit 0
echo "## llama-bench / dsq-bench cpu, load $(cut -d' ' -f1-3 /proc/loadavg)"
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$LB" -m "$MODEL" -p 512 -n 128 -t "$T"
"$B/tools/dsq-bench" cpu --model "$MODEL" --threads "$T" --reps 3
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$LB" -m "$MODEL" -p 512 -n 128 -t "$T" -fa 1
echo "## decode step at context 128 / 1024 / 4096, load $(cut -d' ' -f1-3 /proc/loadavg)"
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$LB" -m "$MODEL" -p 0 -n 32 -d 128,1024,4096 -t "$T" -fa 0,1
for ctx in 128 1024 4096; do
    "$B/tools/dsq-bench" pad --model "$MODEL" --buckets 1,2 --context $ctx --threads "$T" --reps 3 \
        --out /dev/null
done

# batched decode: step time per batch size at ~128 tokens of context
# (llama-batched-bench: npl sequences, each its own 128-token prompt, then
# 32 decode steps; dsq-bench pad: b real rows at position 128)
echo "## batched decode, load $(cut -d' ' -f1-3 /proc/loadavg)"
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$LBB" -m "$MODEL" -c 4096 -b 2048 -ub 512 \
    -npp 128 -ntg 32 -npl 1,2,4,8,16 -t "$T" -tb "$T"
"$B/tools/dsq-bench" pad --model "$MODEL" --buckets 1,2,4,8,16 --context 128 --threads "$T" \
    --reps 3 --out /dev/null

# the ceilings: read bandwidth per working set, T threads (likwid-bench
# load_avx: 256-bit loads; its AVX-512 kernels stop with SIGILL in this
# KVM guest)
if command -v likwid-bench >/dev/null 2>&1; then
    MB=$(( $(stat -c %s "$MODEL") / 1000000 ))
    echo "## read bandwidth (likwid-bench load_avx, $T threads), load $(cut -d' ' -f1-3 /proc/loadavg)"
    for w in 32kB 512kB 16MB ${MB}MB 1GB; do
        printf '%s\t' "$w"
        likwid-bench -t load_avx -W "N:$w:$T" 2>&1 | sed -n 's/^MByte\/s:[[:space:]]*//p'
    done
else
    echo "## likwid-bench not installed (apt install likwid): no ceilings"
fi
