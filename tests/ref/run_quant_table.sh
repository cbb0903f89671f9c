#!/bin/sh
# Regenerate docs/quantization.md's SmolLM2 table in one run: FP16, dsq's
# RTN / AWQ / GPTQ at groups 32 and 128, and llama.cpp's own Q4_0 and
# Q4_K_M (llama-quantize + llama-perplexity), all from the same F16 GGUF and
# scored on the same held-out text.
#
#  1. F16 GGUF: models/SmolLM2-135M-Instruct.Q4_1.gguf dequantized by
#     make_f16_gguf.py (gguf-py, pinned in requirements-quant.txt, in a venv
#     under $WORK);
#  2. llama-quantize / llama-perplexity built by build_llama_tools.sh (the
#     llama.cpp vendored in the llama-cpp-python 0.3.16 sdist);
#  3. dsq-quantize from the F16 GGUF, calibration text GPL-2;
#  4. perplexity on GPL-3 (Debian base-files, see docs/quantization.md):
#     every row through dsq-perplexity --llama-cpp-protocol (llama.cpp's
#     chunking: non-overlapping ctx chunks, second half scored) with KL
#     against the F16 model, and the F16 / Q4_0 / Q4_K_M rows also through
#     llama-perplexity itself, so the two tools' numbers can be compared.
#
# usage: tests/ref/run_quant_table.sh     (from anywhere; ~1 h on 2 cores)
# env: DSQ_BUILD  dsq build folder with tools/ (default: build)
#      WORK       scratch folder (default: build-quant-table, git-ignored)
#      TOKENS     held-out tokens scored: a multiple of 512 (default 2048)
#      SAMPLES    calibration samples of 256 tokens (default 4; --force)
#      GROUPS     group sizes (default "32 128")
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
B=${DSQ_BUILD:-build}/tools
W=${WORK:-build-quant-table}
TOKENS=${TOKENS:-2048}
SAMPLES=${SAMPLES:-4}
GROUPS=${GROUPS:-32 128}
CALIB=/usr/share/common-licenses/GPL-2
HELD=/usr/share/common-licenses/GPL-3
SRC=models/SmolLM2-135M-Instruct.Q4_1.gguf
CHUNKS=$((TOKENS / 512))
for f in "$CALIB" "$HELD" "$SRC" "$B/dsq-quantize" "$B/dsq-perplexity"; do
    [ -e "$f" ] || { echo "run_quant_table.sh: missing $f" >&2; exit 1; }
done
mkdir -p "$W"
export DSQ_LOG_LEVEL=warn OMP_WAIT_POLICY=passive

if [ ! -x "$W/venv/bin/python" ]; then
    python3 -m venv "$W/venv"
    "$W/venv/bin/python" -m pip install -q -r tests/ref/requirements-quant.txt
fi
F16=$W/smollm2-f16.gguf
[ -f "$F16" ] || "$W/venv/bin/python" tests/ref/make_f16_gguf.py "$SRC" "$F16"

TOOLS=$(tests/ref/build_llama_tools.sh llama-quantize llama-perplexity)
LQ=$(echo "$TOOLS" | sed -n 1p)
LP=$(echo "$TOOLS" | sed -n 2p)

row() {   # name, model dir/file, extra dsq-perplexity args
    name=$1; m=$2; shift 2
    r=$("$B/dsq-perplexity" --model "$m" --text "$HELD" --max-tokens "$TOKENS" \
        --llama-cpp-protocol --ref-model "$F16" "$@" | tail -1)
    echo "$name $r" >> "$W/rows.txt"
    echo "$name $r"
}
lrow() {  # name, gguf
    p=$("$LP" -m "$2" -f "$HELD" -c 512 --chunks "$CHUNKS" -t "$(nproc)" 2>&1 |
        sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p')
    echo "$1 llama-perplexity ppl=$p" >> "$W/rows.txt"
    echo "$1 llama-perplexity ppl=$p"
}

: > "$W/rows.txt"
{ date -u; lscpu | grep 'Model name'; uptime; } > "$W/env.txt"
row fp16 "$F16"
lrow fp16 "$F16"
for q in Q4_0 Q4_K_M; do
    "$LQ" "$F16" "$W/smollm2-$q.gguf" "$q" > "$W/llama-quantize-$q.log" 2>&1
    row "llama.cpp-$q" "$W/smollm2-$q.gguf"
    lrow "llama.cpp-$q" "$W/smollm2-$q.gguf"
done
for g in $GROUPS; do
    for m in rtn awq gptq; do
        o=$W/dsq-$m-$g
        "$B/dsq-quantize" --model "$F16" --out "$o" --method "$m" --group-size "$g" \
            --calib "$CALIB" --calib-samples "$SAMPLES" --calib-seq-len 256 --force \
            > "$o.log" 2>&1
        row "dsq-$m-g$g" "$o" --tokenizer "$F16"
    done
done
cat "$W/env.txt" "$W/rows.txt"
