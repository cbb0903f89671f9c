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
#  3. dsq-quantize from the F16 GGUF, calibration text GPL-2 (TEXT=gpl) or
#     chapters I-VI of Alice's Adventures in Wonderland (TEXT=alice:
#     prep_alice.py on the pinned brotli 1.2.1 sdist from PyPI);
#  4. perplexity on GPL-3 (Debian base-files, see docs/quantization.md) or
#     on Alice chapters VII-XII:
#     every row through dsq-perplexity --llama-cpp-protocol (llama.cpp's
#     chunking: non-overlapping ctx chunks, second half scored) with KL
#     against the F16 model, and the F16 / Q4_0 / Q4_K_M rows also through
#     llama-perplexity itself, so the two tools' numbers can be compared;
#  5. every dsq-perplexity row dumps its per-token NLLs ($WORK/NAME.nll) and
#     tests/ref/paired_nll.py compares AWQ and GPTQ with RTN (and every
#     quantized row with F16) per group: mean dNLL, batch-means SE, z.
# Wall seconds of each step and the load average after it go to
# $WORK/times.txt; everything is summarised at the end.
#
# usage: tests/ref/run_quant_table.sh     (from anywhere; 18 min on 2 loaded
#        cores with a release build, see docs/quantization.md)
# env: DSQ_BUILD  dsq build folder with tools/ (default: build)
#      WORK       scratch folder (default: build-quant-table, git-ignored)
#      TOKENS     held-out tokens scored: a multiple of 512 (default 2048)
#      SAMPLES    calibration samples of 256 tokens (default 4; --force)
#      GROUPS     group sizes (default "32 128"; under bash, whose GROUPS is
#                 the user's group ids, use QGROUPS)
#      BLOCK      paired_nll.py batch-means block in tokens (default 128)
#      TEXT       gpl (default: GPL-2 / GPL-3) or alice (chapters I-VI /
#                 VII-XII, see tests/ref/prep_alice.py)
#      REUSE      1: keep dsq-quantize outputs already in $WORK (e.g. to
#                 rescore them with a larger TOKENS); default 0 requantizes
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
B=${DSQ_BUILD:-build}/tools
W=${WORK:-build-quant-table}
TOKENS=${TOKENS:-2048}
SAMPLES=${SAMPLES:-4}
# shellcheck disable=SC3028 # GROUPS is this script's own variable under sh
QGROUPS=${QGROUPS:-${GROUPS:-32 128}}
BLOCK=${BLOCK:-128}
REUSE=${REUSE:-0}
T0=$(date +%s)
TEXT=${TEXT:-gpl}
case $TEXT in
    gpl) CALIB=/usr/share/common-licenses/GPL-2; HELD=/usr/share/common-licenses/GPL-3 ;;
    alice) CALIB=$W/text/alice-calib.txt; HELD=$W/text/alice-heldout.txt ;;
    *) echo "run_quant_table.sh: TEXT is gpl or alice, not '$TEXT'" >&2; exit 1 ;;
esac
SRC=models/SmolLM2-135M-Instruct.Q4_1.gguf
CHUNKS=$((TOKENS / 512))
for g in $QGROUPS; do
    case $g in
        *[!0-9]*|'') echo "run_quant_table.sh: bad group size '$g'" >&2; exit 1 ;;
    esac
    [ "$g" -ge 8 ] || { echo "run_quant_table.sh: bad group size '$g'" >&2; exit 1; }
done
for f in "$SRC" "$B/dsq-quantize" "$B/dsq-perplexity"; do
    [ -e "$f" ] || { echo "run_quant_table.sh: missing $f" >&2; exit 1; }
done
mkdir -p "$W"
: > "$W/paired.txt"
# no OMP_WAIT_POLICY here: llama-quantize / llama-perplexity run
# at llama.cpp's own OpenMP defaults (the figures are quality, not speed)
export DSQ_LOG_LEVEL=warn

if [ ! -x "$W/venv/bin/python" ]; then
    python3 -m venv "$W/venv"
    "$W/venv/bin/python" -m pip install -q -r tests/ref/requirements-quant.txt
fi
if [ "$TEXT" = alice ]; then
    tests/ref/fetch_alice.sh "$W/venv/bin/python" "$W/text"
fi
for f in "$CALIB" "$HELD"; do
    [ -e "$f" ] || { echo "run_quant_table.sh: missing $f" >&2; exit 1; }
done
F16=$W/smollm2-f16.gguf
[ -f "$F16" ] || "$W/venv/bin/python" tests/ref/make_f16_gguf.py "$SRC" "$F16"

TOOLS=$(tests/ref/build_llama_tools.sh llama-quantize llama-perplexity)
LQ=$(echo "$TOOLS" | sed -n 1p)
LP=$(echo "$TOOLS" | sed -n 2p)

timed() { # what: wall seconds since the last call and the load average
    t=$(date +%s)
    echo "$1 wall_s=$((t - T0)) load=$(cut -d' ' -f1-3 /proc/loadavg)" >> "$W/times.txt"
    T0=$t
}
row() {   # name, model dir/file, extra dsq-perplexity args
    name=$1; m=$2; shift 2
    if ! "$B/dsq-perplexity" --model "$m" --text "$HELD" --max-tokens "$TOKENS" \
            --llama-cpp-protocol --ref-model "$F16" --dump-nll "$W/$name.nll" "$@" \
            > "$W/$name.ppl" 2> "$W/$name.err"; then
        rm -f "$W/$name.nll"
        r="dsq-perplexity failed: $(tail -1 "$W/$name.err")"
        echo "$name $r" >> "$W/rows.txt"
        echo "$name $r" >&2
        timed "perplexity $name (failed)"
        # llama.cpp's files may hold types dsq does not read (its Q4_K_M
        # falls back to Q5_0 / Q8_0 where a row is not a multiple of 256):
        # recorded, not fatal. A dsq row that fails stops the run.
        case $name in llama.cpp-*) return 0 ;; esac
        exit 1
    fi
    r=$(tail -1 "$W/$name.ppl")
    echo "$name $r" >> "$W/rows.txt"
    echo "$name $r"
    timed "perplexity $name"
}
lrow() {  # name, gguf
    p=$("$LP" -m "$2" -f "$HELD" -c 512 --chunks "$CHUNKS" -t "$(nproc)" 2>&1 |
        tee "$W/$1-llama-perplexity.log" |
        sed -n 's/.*Final estimate: PPL = \([0-9.]*\( +\/- [0-9.]*\)\{0,1\}\).*/\1/p')
    [ -n "$p" ] || { echo "run_quant_table.sh: llama-perplexity failed, see $W/$1-llama-perplexity.log" >&2; exit 1; }
    echo "$1 llama-perplexity ppl=$p" >> "$W/rows.txt"
    echo "$1 llama-perplexity ppl=$p"
    timed "llama-perplexity $1"
}

: > "$W/rows.txt"
: > "$W/times.txt"
timed "setup (venv, F16 GGUF, llama.cpp tools)"
{ date -u; lscpu | grep 'Model name'; uptime; echo "text=$TEXT calib=$CALIB held=$HELD samples=$SAMPLES tokens=$TOKENS"; } > "$W/env.txt"
row fp16 "$F16"
lrow fp16 "$F16"
for g in $QGROUPS; do
    for m in rtn awq gptq; do
        o=$W/dsq-$m-$g
        if [ "$REUSE" != 1 ] || [ ! -f "$o/model.safetensors" ]; then
            "$B/dsq-quantize" --model "$F16" --out "$o" --method "$m" --group-size "$g" \
                --calib "$CALIB" --calib-samples "$SAMPLES" --calib-seq-len 256 --force \
                > "$o.log" 2>&1
        fi
        timed "dsq-quantize $m g$g"
        row "dsq-$m-g$g" "$o" --tokenizer "$F16"
    done
    {
        echo "paired (block $BLOCK), base dsq-rtn-g$g:"
        python3 tests/ref/paired_nll.py --block "$BLOCK" "$W/dsq-rtn-g$g.nll" \
            "$W/dsq-awq-g$g.nll" "$W/dsq-gptq-g$g.nll"
        echo "paired (block $BLOCK), base fp16:"
        python3 tests/ref/paired_nll.py --block "$BLOCK" "$W/fp16.nll" \
            "$W/dsq-rtn-g$g.nll" "$W/dsq-awq-g$g.nll" "$W/dsq-gptq-g$g.nll"
    } >> "$W/paired.txt"
done
# llama.cpp's rows last: the dsq rows are the ones the AWQ/GPTQ <= RTN
# criterion needs.
for q in Q4_0 Q4_K_M; do
    "$LQ" "$F16" "$W/smollm2-$q.gguf" "$q" > "$W/llama-quantize-$q.log" 2>&1
    timed "llama-quantize $q"
    row "llama.cpp-$q" "$W/smollm2-$q.gguf"
    lrow "llama.cpp-$q" "$W/smollm2-$q.gguf"
done
L=""
for q in Q4_0 Q4_K_M; do
    [ -f "$W/llama.cpp-$q.nll" ] && L="$L $W/llama.cpp-$q.nll"
done
if [ -n "$L" ]; then
    { echo "paired (block $BLOCK), base fp16, llama.cpp rows:"
      # shellcheck disable=SC2086 # $L is a list of paths without spaces
      python3 tests/ref/paired_nll.py --block "$BLOCK" "$W/fp16.nll" $L; } >> "$W/paired.txt"
fi
uptime >> "$W/env.txt"
cat "$W/env.txt" "$W/rows.txt" "$W/times.txt" "$W/paired.txt"
