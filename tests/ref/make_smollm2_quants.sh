#!/bin/sh
# GGUFs of SmolLM2-135M-Instruct in every GGML type llama-quantize writes
# for llama models, made the way users get them: llama.cpp's own
# llama-quantize (the pinned llama.cpp of build_llama_tools.sh, portable
# build) run on an F16 GGUF (tests/ref/make_f16_gguf.py: the Q4_1 test
# model dequantized by gguf-py). The test command makes them; they are never
# committed. A sha256 manifest pins them: with --check every file must equal
# the one the committed goldens (tests/golden/smollm2_quants/) were made
# from, byte for byte.
#
# usage: tests/ref/make_smollm2_quants.sh OUT_DIR --check MANIFEST
#        tests/ref/make_smollm2_quants.sh OUT_DIR --manifest MANIFEST  (write it)
# env:   PYTHON (default .venv/bin/python: numpy + gguf of
#        tests/ref/requirements-model.txt), and build_llama_tools.sh's.
# Files already there whose sha256 matches the manifest are kept, so a second
# run costs only the checksums. Prints one line per file.
#
# SmolLM2's hidden size 576 is not a multiple of 256, so llama-quantize
# stores the k-quant types only where a row is whole super-blocks (ffn_down,
# k = 1536) and falls back elsewhere (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K ->
# Q8_0, Q2_K/Q3_K/IQ4_XS -> IQ4_NL): each file mixes several types. --pure
# (one type on every tensor) is only possible for the 32-weight block types
# here (llama-quantize aborts on a k-quant row of 576); the Q2_K ftype puts
# no Q2_K on this model at all (ffn_down gets Q3_K), so Q2_K-down forces it
# there with --tensor-type. Together they cover every type on every tensor
# shape where llama.cpp itself can store it (Q5_0-pure and IQ4_NL-pure also
# hold the token embedding / tied output in those types). The k-quant types
# on every tensor role come from llama-k256 (256-wide rows, random weights),
# quantized --pure into each of them.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:?usage: $0 OUT_DIR --check|--manifest MANIFEST}
MODE=${2:?usage: $0 OUT_DIR --check|--manifest MANIFEST}
MANIFEST=${3:?usage: $0 OUT_DIR --check|--manifest MANIFEST}
PY=${PYTHON:-$ROOT/.venv/bin/python}
SRC=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
BASE=SmolLM2-135M-Instruct
# name  llama-quantize arguments (type after the files; --pure before them)
VARIANTS="Q4_K_M:Q4_K_M Q5_K_M:Q5_K_M Q6_K:Q6_K Q5_0:Q5_0 Q5_1:Q5_1 Q3_K_M:Q3_K_M
Q2_K:Q2_K IQ4_XS:IQ4_XS IQ4_NL:IQ4_NL Q8_0:Q8_0 Q2_K-down:--tensor-type,ffn_down=q2_k,Q2_K
Q5_0-pure:--pure,Q5_0 IQ4_NL-pure:--pure,IQ4_NL"

# a tiny random llama with 256-wide rows (tests/ref/make_llama_k256_gguf.py):
# --pure puts each k-quant type on every tensor, embedding and output too
K256=llama-k256
K256_VARIANTS="Q2_K:Q2_K Q3_K:Q3_K_S Q4_K:Q4_K_S Q5_K:Q5_K_S Q6_K:Q6_K IQ4_XS:IQ4_XS"

case $MODE in --check|--manifest) ;; *) echo "$0: mode must be --check or --manifest" >&2; exit 2 ;; esac
[ -f "$SRC" ] || { echo "$0: $SRC missing (scripts/fetch-model smollm2-135m-instruct)" >&2; exit 1; }
mkdir -p "$OUT"

want() { # expected sha256 of file name $1 (empty if unknown)
    [ -f "$MANIFEST" ] && awk -v f="$1" '$2 == f { print $1 }' "$MANIFEST" || true
}
have() { sha256sum "$1" | cut -d' ' -f1; }
fresh() { # file $1 exists and matches the manifest (check mode)
    [ "$MODE" = --check ] && [ -f "$OUT/$1" ] && [ "$(have "$OUT/$1")" = "$(want "$1")" ]
}

F16=$BASE.F16.gguf
if ! fresh "$F16"; then
    "$PY" "$ROOT/tests/ref/make_f16_gguf.py" "$SRC" "$OUT/$F16.tmp" >/dev/null
    mv "$OUT/$F16.tmp" "$OUT/$F16"
fi
QUANTIZE=
for v in $VARIANTS; do
    name=${v%%:*}
    fresh "$BASE.$name.gguf" && continue
    if [ -z "$QUANTIZE" ]; then
        QUANTIZE=$(LLAMA_PORTABLE=1 "$ROOT/tests/ref/build_llama_tools.sh" llama-quantize | tail -n 1)
    fi
    args=$(echo "${v#*:}" | tr ',' ' ')
    type=${args##* }
    opts=${args% *}
    [ "$opts" = "$args" ] && opts=
    # shellcheck disable=SC2086
    "$QUANTIZE" $opts "$OUT/$F16" "$OUT/$BASE.$name.gguf.tmp" "$type" 2 \
        >"$OUT/$BASE.$name.log" 2>&1 || { tail -n 20 "$OUT/$BASE.$name.log" >&2; exit 1; }
    mv "$OUT/$BASE.$name.gguf.tmp" "$OUT/$BASE.$name.gguf"
done

KF16=$K256.F16.gguf
if ! fresh "$KF16"; then
    "$PY" "$ROOT/tests/ref/make_llama_k256_gguf.py" "$OUT/$KF16"
fi
for v in $K256_VARIANTS; do
    name=${v%%:*}
    fresh "$K256.$name.gguf" && continue
    if [ -z "$QUANTIZE" ]; then
        QUANTIZE=$(LLAMA_PORTABLE=1 "$ROOT/tests/ref/build_llama_tools.sh" llama-quantize | tail -n 1)
    fi
    "$QUANTIZE" --pure "$OUT/$KF16" "$OUT/$K256.$name.gguf.tmp" "${v#*:}" 2 \
        >"$OUT/$K256.$name.log" 2>&1 || { tail -n 20 "$OUT/$K256.$name.log" >&2; exit 1; }
    mv "$OUT/$K256.$name.gguf.tmp" "$OUT/$K256.$name.gguf"
done
all_files() {
    echo "$F16"
    for v in $VARIANTS; do echo "$BASE.${v%%:*}.gguf"; done
    echo "$KF16"
    for v in $K256_VARIANTS; do echo "$K256.${v%%:*}.gguf"; done
}

if [ "$MODE" = --manifest ]; then
    : >"$MANIFEST.tmp"
    for f in $(all_files); do
        echo "$(have "$OUT/$f")  $f" >>"$MANIFEST.tmp"
    done
    mv "$MANIFEST.tmp" "$MANIFEST"
    echo "wrote $MANIFEST"
    exit 0
fi
bad=0
for f in $(all_files); do
    w=$(want "$f")
    h=$(have "$OUT/$f")
    if [ -z "$w" ]; then
        echo "$f: not in $MANIFEST" >&2; bad=1
    elif [ "$h" != "$w" ]; then
        echo "$f: sha256 $h, the goldens were made from $w" >&2; bad=1
    else
        echo "ok $f"
    fi
done
exit $bad
