#!/bin/sh
# docs/quantization.md's stories260K table in one run: the real FP32
# TinyStories model ($DSQ_TEST_DATA/models/stories260K), dsq's RTN / AWQ /
# GPTQ at groups 32 and 128 (and GPTQ with --desc-act), scored on held-out
# text by dsq-perplexity (sliding window --ctx 512 --stride 256, KL against
# the FP32 model, mean predictive entropy), paired per-token NLL
# differences (paired_nll.py), and the FP32 model at a few softmax
# temperatures (how overconfident the model is on the text).
# With FIT_T=1 also temperature-calibrated perplexity (Guo et al. 2017,
# "On Calibration of Modern Neural Networks", temperature scaling): for each
# model the softmax temperature T in {1.00, 1.05, ..., 1.60} with the least
# NLL on the calibration text is chosen, and the held-out text is scored at
# that T; paired comparisons of those NLLs follow. The held-out text never
# enters the choice of T.
#
# usage: tests/ref/run_quant_stories.sh     (about 7 minutes on 2 cores)
# env: DSQ_BUILD   dsq build folder with tools/ (default: build)
#      DSQ_TEST_DATA  the shared test data (default: tests/data)
#      WORK        scratch folder (default: build-quant-stories, git-ignored)
#      TEXT        alice (default: Alice chapters I-VI / VII-XII, see
#                  tests/ref/prep_alice.py) or gpl (GPL-2 / GPL-3)
#      BLOCK       paired_nll.py block in tokens (default 256)
#      FIT_T       1: temperature-calibrated rows too (about 1 hour more:
#                  13 calibration-text passes per model)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
B=${DSQ_BUILD:-build}/tools
D=${DSQ_TEST_DATA:-tests/data}
W=${WORK:-build-quant-stories}
TEXT=${TEXT:-alice}
BLOCK=${BLOCK:-256}
FIT_T=${FIT_T:-0}
S=$D/models/stories260K
case $TEXT in
    gpl) CALIB=/usr/share/common-licenses/GPL-2; HELD=/usr/share/common-licenses/GPL-3 ;;
    alice) CALIB=$W/text/alice-calib.txt; HELD=$W/text/alice-heldout.txt ;;
    *) echo "run_quant_stories.sh: TEXT is alice or gpl, not '$TEXT'" >&2; exit 1 ;;
esac
for f in "$S/stories260K.bin" "$S/tok512.bin" "$B/dsq-quantize" "$B/dsq-perplexity"; do
    [ -e "$f" ] || { echo "run_quant_stories.sh: missing $f" >&2; exit 1; }
done
mkdir -p "$W"
# no OMP_WAIT_POLICY here: llama-quantize / llama-perplexity run
# at llama.cpp's own OpenMP defaults (the figures are quality, not speed)
export DSQ_LOG_LEVEL=warn
if [ "$TEXT" = alice ]; then
    [ -x "$W/venv/bin/python" ] || python3 -m venv "$W/venv"
    tests/ref/fetch_alice.sh "$W/venv/bin/python" "$W/text"
fi
{ date -u; lscpu | grep 'Model name'; uptime; echo "text=$TEXT calib=$CALIB held=$HELD"; } > "$W/env.txt"
: > "$W/rows.txt"
: > "$W/paired.txt"
ppl() {   # name, model, extra args
    name=$1; m=$2; shift 2
    r=$("$B/dsq-perplexity" --model "$m" --tokenizer "$S/tok512.bin" --text "$HELD" "$@") ||
        { echo "run_quant_stories.sh: dsq-perplexity $name failed" >&2; exit 1; }
    echo "$name $r" | tee -a "$W/rows.txt"
}
ppl fp32 "$S/stories260K.bin" --dump-nll "$W/fp32.nll"
for t in 1.05 1.1 1.2 1.3; do
    ppl "fp32-T$t" "$S/stories260K.bin" --temperature "$t"
done
for g in 32 128; do
    for m in rtn awq gptq gptq-desc-act; do
        o=$W/$m-$g
        case $m in
            gptq-desc-act) a="--method gptq --desc-act" ;;
            *) a="--method $m" ;;
        esac
        # every sample of 512 tokens the calibration text yields (fewer
        # than the bound's 96: --force)
        # shellcheck disable=SC2086 # $a is a list of options
        if ! "$B/dsq-quantize" --model "$S/stories260K.bin" --tokenizer "$S/tok512.bin" \
            --out "$o" $a --group-size "$g" --calib "$CALIB" --calib-seq-len 512 \
            --calib-samples 96 --force > "$o.log" 2>&1; then
            echo "run_quant_stories.sh: dsq-quantize $m g$g failed: $(tail -1 "$o.log") (see $o.log)" >&2
            exit 1
        fi
        ppl "$m-g$g" "$o" --ref-model "$S/stories260K.bin" --dump-nll "$W/$m-$g.nll"
    done
    {
        echo "paired (block $BLOCK), base rtn-g$g:"
        python3 tests/ref/paired_nll.py --block "$BLOCK" "$W/rtn-$g.nll" \
            "$W/awq-$g.nll" "$W/gptq-$g.nll" "$W/gptq-desc-act-$g.nll" "$W/fp32.nll"
        echo "paired (block $BLOCK), base fp32:"
        python3 tests/ref/paired_nll.py --block "$BLOCK" "$W/fp32.nll" \
            "$W/rtn-$g.nll" "$W/awq-$g.nll" "$W/gptq-$g.nll" "$W/gptq-desc-act-$g.nll"
    } >> "$W/paired.txt"
done
fit_t() { # name, model: T with the least NLL on $CALIB, then held-out at T
    name=$1; m=$2; best=; bn=
    for t in 1.00 1.05 1.10 1.15 1.20 1.25 1.30 1.35 1.40 1.45 1.50 1.55 1.60; do
        r=$("$B/dsq-perplexity" --model "$m" --tokenizer "$S/tok512.bin" --text "$CALIB" \
            --temperature "$t") || { echo "run_quant_stories.sh: dsq-perplexity $name T=$t failed" >&2; exit 1; }
        n=$(echo "$r" | sed -n 's/.* nll=\([0-9.]*\) .*/\1/p')
        [ -n "$n" ] || { echo "run_quant_stories.sh: no nll in: $r" >&2; exit 1; }
        if [ -z "$best" ] || awk "BEGIN { exit !($n < $bn) }"; then best=$t; bn=$n; fi
    done
    echo "$name fit on calibration text: T=$best nll=$bn" | tee -a "$W/rows.txt"
    ppl "$name-Tfit" "$m" --temperature "$best" --dump-nll "$W/$name-Tfit.nll"
}
if [ "$FIT_T" = 1 ]; then
    fit_t fp32 "$S/stories260K.bin"
    for g in 32 128; do
        for m in rtn awq gptq gptq-desc-act; do
            fit_t "$m-$g" "$W/$m-$g"
        done
        {
            echo "paired (block $BLOCK), temperature-calibrated, base rtn-$g-Tfit:"
            python3 tests/ref/paired_nll.py --block "$BLOCK" "$W/rtn-$g-Tfit.nll" \
                "$W/awq-$g-Tfit.nll" "$W/gptq-$g-Tfit.nll" "$W/gptq-desc-act-$g-Tfit.nll" \
                "$W/fp32-Tfit.nll"
        } >> "$W/paired.txt"
    done
fi
uptime >> "$W/env.txt"
cat "$W/env.txt" "$W/paired.txt"
