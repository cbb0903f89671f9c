#!/bin/sh
# End-to-end checks of dsq-inspect, dsq-tokenize and dsq-run on real model
# files (TAP output). Expected values come from outside dsq: the SmolLM2
# GGUF's own header (272 tensors, vocab 49152, token_embd.weight in Q8_0),
# llama.cpp's tokenizer test vectors (.inp/.out) and the llama2.c greedy
# reference of stories260K (see $DSQ_TEST_DATA/SOURCES.md).
# Environment (set by tests/e2e/meson.build): DSQ_INSPECT, DSQ_TOKENIZE,
# DSQ_RUN, DSQ_QUANTIZE_BIN, DSQ_BENCH, DSQ_TEST_DATA, DSQ_MODELS_DIR. A missing input file is a failure.
set -u
n=0; fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsq-e2e.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM

. "$(dirname "$0")/tap.sh"

gguf=$DSQ_MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
s260=$DSQ_TEST_DATA/models/stories260K
vocab=$DSQ_TEST_DATA/vocab/llama.cpp
coder=$vocab/ggml-vocab-deepseek-coder.gguf
cfg=$DSQ_TEST_DATA/configs/hf/deepseek-coder-1.3b-instruct/config.json
for f in "$gguf" "$s260/stories260K.bin" "$s260/tok512.bin" \
         "$s260/stories260K.greedy-reference.txt" "$coder" "$coder.inp" \
         "$coder.out" "$cfg"; do
  if [ ! -f "$f" ]; then
    not_ok "input file present: $f" "missing test input $f"
  fi
done
if [ $fail -ne 0 ]; then echo "1..$n"; exit 1; fi

# ---- dsq-inspect on the SmolLM2 GGUF ----
out=$("$DSQ_INSPECT" "$gguf" 2>"$tmp/err"); rc=$?
check "inspect gguf exits 0" $rc "rc=$rc" "$(cat "$tmp/err")"
printf '%s\n' "$out" | grep -Eq '^architecture: +llama( |$)'
check "inspect gguf: architecture llama" $? "$out"
printf '%s\n' "$out" | grep -Eq '^tensors: +272,'
check "inspect gguf: 272 tensors" $? "$out"
printf '%s\n' "$out" | grep -Eq 'vocab=49152( |$)'
check "inspect gguf: vocab 49152" $? "$out"
printf '%s\n' "$out" | grep -Eq '^chat template: +yes'
check "inspect gguf: chat template present" $? "$out"

"$DSQ_INSPECT" "$gguf" --json > "$tmp/j" 2>"$tmp/err"; rc=$?
check "inspect --json exits 0" $rc "rc=$rc" "$(cat "$tmp/err")"
python3 -c 'import json,sys; json.load(sys.stdin)' < "$tmp/j" 2>"$tmp/err"
check "inspect --json parses as JSON" $? "$(cat "$tmp/err")"
python3 -c '
import json, sys
j = json.load(sys.stdin)
assert j["architecture"] == "llama", j["architecture"]
assert j["n_tensors"] == 272, j["n_tensors"]
assert j["config"]["n_vocab"] == 49152, j["config"]["n_vocab"]
assert j["chat_template"] is True, j["chat_template"]
' < "$tmp/j" 2>"$tmp/err"
check "inspect --json: llama, 272 tensors, vocab 49152, chat template" $? "$(cat "$tmp/err")"

out=$("$DSQ_INSPECT" "$gguf" --tensors 2>"$tmp/err"); rc=$?
check "inspect --tensors exits 0" $rc "rc=$rc" "$(cat "$tmp/err")"
printf '%s\n' "$out" | grep -Eq '^token_embd\.weight .*Q8_0'
check "inspect --tensors: token_embd.weight is Q8_0" $? \
  "$(printf '%s\n' "$out" | grep token_embd || echo 'no token_embd.weight line')"

# ---- dsq-inspect on stories260K (llama2.c) with its tokenizer ----
out=$("$DSQ_INSPECT" "$s260/stories260K.bin" --tokenizer "$s260/tok512.bin" 2>"$tmp/err"); rc=$?
check "inspect stories260K --tokenizer exits 0" $rc "rc=$rc" "$(cat "$tmp/err")"
printf '%s\n' "$out" | grep -Eq '^tokenizer: +spm, vocab 512$'
check "inspect stories260K: spm tokenizer, vocab 512" $? "$out"
printf '%s\n' "$out" | grep -Eq 'layers=5 embd=64 '
check "inspect stories260K: 5 layers, dim 64" $? "$out"

# ---- dsq-inspect on a vocab-only GGUF ----
out=$("$DSQ_INSPECT" "$coder" 2>"$tmp/err"); rc=$?
check "inspect vocab-only gguf exits 0" $rc "rc=$rc" "$(cat "$tmp/err")"
printf '%s\n' "$out" | grep -Eq '^tokenizer: +bpe, vocab 32256$'
check "inspect vocab-only gguf: bpe, vocab 32256" $? "$out"
printf '%s\n' "$out" | grep -Eq '^tensors: +0,'
check "inspect vocab-only gguf: 0 tensors" $? "$out"

# ---- bad files: exit 1, exactly one line on stderr, naming the file ----
: > "$tmp/empty.gguf"
printf 'XXXX\003\000\000\000\000\000\000\000\000\000\000\000' > "$tmp/magic.gguf"
head -c 200000 "$gguf" > "$tmp/trunc.gguf"
mkdir "$tmp/st" "$tmp/nocfg"
cp "$cfg" "$tmp/st/config.json"
printf '\020\000\000\000\000\000\000\000this is not JSON' > "$tmp/st/model.safetensors"
printf '{}' > "$tmp/nocfg/tokenizer.json"
for bad in "$tmp/empty.gguf" "$tmp/magic.gguf" "$tmp/trunc.gguf" \
           "$tmp/st/model.safetensors" "$tmp/nocfg"; do
  "$DSQ_INSPECT" "$bad" > /dev/null 2>"$tmp/err"; rc=$?
  lines=$(wc -l < "$tmp/err")
  named=1; grep -qF "$bad" "$tmp/err" && named=0
  [ $rc -eq 1 ] && [ "$lines" -eq 1 ] && [ $named -eq 0 ]
  check "inspect bad file $(basename "$bad"): exit 1, one stderr line naming it" $? \
    "rc=$rc lines=$lines" "$(cat "$tmp/err")"
done

# ---- files that parse but are wrong: exit 1, one line naming key and value ----
# (docs/models.md): a config.json with max_position_embeddings 0, and the
# deepseek-coder vocab with tokenizer.ggml.bos_token_id (u32, its stored
# form) patched to 32256, its vocabulary size.
mkdir "$tmp/ctx0"
sed 's/"max_position_embeddings": *[0-9]*/"max_position_embeddings": 0/' "$cfg" \
  > "$tmp/ctx0/config.json"
python3 - "$coder" "$tmp/bos.gguf" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
k = b"tokenizer.ggml.bos_token_id"
at = b.index(struct.pack("<Q", len(k)) + k) + 8 + len(k)
assert struct.unpack_from("<I", b, at)[0] == 4   # u32
struct.pack_into("<I", b, at + 4, 32256)
open(sys.argv[2], "wb").write(b)
PY
for c in "$tmp/ctx0|max_position_embeddings = 0 " \
         "$tmp/bos.gguf|tokenizer.ggml.bos_token_id = 32256 "; do
  bad=${c%%|*}; want=${c#*|}
  "$DSQ_INSPECT" "$bad" > /dev/null 2>"$tmp/err"; rc=$?
  lines=$(wc -l < "$tmp/err")
  named=1; grep -qF "$bad" "$tmp/err" && grep -qF "$want" "$tmp/err" && named=0
  [ $rc -eq 1 ] && [ "$lines" -eq 1 ] && [ $named -eq 0 ]
  check "inspect $(basename "$bad"): exit 1, one stderr line with '$want'" $? \
    "rc=$rc lines=$lines" "$(cat "$tmp/err")"
done

# ---- bad usage: exit 2 ----
"$DSQ_INSPECT" > /dev/null 2>&1; rc=$?
check "inspect without PATH: exit 2" $([ $rc -eq 2 ]; echo $?) "rc=$rc"
"$DSQ_INSPECT" "$gguf" --no-such-flag > /dev/null 2>&1; rc=$?
check "inspect unknown flag: exit 2" $([ $rc -eq 2 ]; echo $?) "rc=$rc"
"$DSQ_INSPECT" "$gguf" --tokenizer > /dev/null 2>&1; rc=$?
check "inspect --tokenizer without value: exit 2" $([ $rc -eq 2 ]; echo $?) "rc=$rc"

# ---- dsq-tokenize: llama.cpp vectors (deepseek-coder), case 0 and 1 ----
# .inp holds the strings separated by "\n__ggml_vocab_test__\n"; line k of
# .out holds the ids of string k (no BOS).
for k in 0 1 17; do
  awk -v k="$k" 'BEGIN { i = 0; first = 1 }
    $0 == "__ggml_vocab_test__" { if (i == k) { printf "%s", buf; exit } i++; buf = ""; first = 1; next }
    { buf = first ? $0 : buf "\n" $0; first = 0 }' "$coder.inp" > "$tmp/in$k"
  want=$(sed -n "$((k + 1))p" "$coder.out" | tr -s ' ' | sed 's/^ //; s/ $//')
  got=$("$DSQ_TOKENIZE" --model "$coder" < "$tmp/in$k" 2>"$tmp/err" | tr -s ' ' | sed 's/^ //; s/ $//')
  [ -n "$want" ] && [ "$got" = "$want" ]
  check "tokenize deepseek-coder vector $k matches llama.cpp" $? \
    "input: $(cat "$tmp/in$k")" "want: $want" "got:  $got" "$(cat "$tmp/err")"
done

# ---- dsq-tokenize --decode round trip ----
printf 'def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)  # 斐波那契 ✓\n' > "$tmp/rt"
"$DSQ_TOKENIZE" --model "$coder" < "$tmp/rt" > "$tmp/rt.ids" 2>"$tmp/err" &&
  "$DSQ_TOKENIZE" --model "$coder" --decode < "$tmp/rt.ids" > "$tmp/rt.back" 2>>"$tmp/err" &&
  cmp -s "$tmp/rt" "$tmp/rt.back"
check "tokenize --decode round-trips text (deepseek-coder)" $? \
  "ids: $(cat "$tmp/rt.ids")" "back: $(cat "$tmp/rt.back" 2>/dev/null)" "$(cat "$tmp/err")"

# ---- dsq-tokenize on tok512: the prompt ids of the greedy reference ----
ref=$s260/stories260K.greedy-reference.txt
want=$(awk '/^PROMPT .Once upon a time. / { f = 1; next } f && /^PROMPT_IDS / { sub(/^PROMPT_IDS /, ""); print; exit }' "$ref")
got=$(printf 'Once upon a time' | "$DSQ_TOKENIZE" --model "$s260/tok512.bin" --bos 2>"$tmp/err")
[ -n "$want" ] && [ "$got" = "$want" ]
check "tokenize tok512 --bos 'Once upon a time' = reference PROMPT_IDS" $? \
  "want: $want" "got:  $got" "$(cat "$tmp/err")"

# dsq-run sizes its KV cache from free memory (GBs even for this 512-token
# model); meson's MALLOC_PERTURB_ would make glibc fill all of it. Unset it.
unset MALLOC_PERTURB_

# ---- dsq-run --ids on stories260K: greedy ids equal the reference ----
"$DSQ_RUN" --ids --model "$s260/stories260K.bin" --tokenizer "$s260/tok512.bin" \
  --prompt "Once upon a time" -n 59 > "$tmp/run" 2>"$tmp/err"; rc=$?
check "run stories260K exits 0" $rc "rc=$rc" "$(cat "$tmp/err")"
grep -qx 'prompt: 1 403 407 261 378' "$tmp/run"
check "run --ids prints 'prompt: 1 403 407 261 378'" $? "$(cat "$tmp/run")"
# reference OUTPUT_IDS = 4 prompt ids (after BOS), then the generated ones
gen=$(awk '/^PROMPT .Once upon a time. / { f = 1; next } f && /^OUTPUT_IDS / { for (i = 6; i <= NF; i++) printf "%s%s", $i, (i < NF ? " " : ""); exit }' "$ref")
want32=$(printf '%s\n' "$gen" | cut -d' ' -f1-32)
got32=$(sed -n 's/^output: //p' "$tmp/run" | cut -d' ' -f1-32)
[ -n "$want32" ] && [ "$got32" = "$want32" ]
check "run --ids: first 32 generated ids equal the llama2.c greedy reference" $? \
  "want: $want32" "got:  $got32"

# ---- loading progress: a rewritten line on a terminal, else log lines ----
# Not a terminal: with DSQ_LOG_LEVEL=info the loader logs one line per 10 %
# step (at most one per decade, percentages rising, the last one 100) and
# never writes a carriage return.
DSQ_LOG_LEVEL=info "$DSQ_INSPECT" "$gguf" > /dev/null 2>"$tmp/log"; rc=$?
pcts=$(sed -n 's/.* load file=.* pct=\([0-9]*\)$/\1/p' "$tmp/log" | tr '\n' ' ')
printf '%s\n' "$pcts" | awk -v rc=$rc '{
    if (rc != 0 || NF < 2 || NF > 11 || $NF != 100) exit 1
    for (i = 2; i <= NF; i++) if (int($i / 10) <= int($(i - 1) / 10)) exit 1
  }' && ! grep -q "$(printf '\r')" "$tmp/log"
check "inspect, stderr not a terminal: one load log line per 10% (pct: $pcts)" $? \
  "rc=$rc" "$(head -c 2000 "$tmp/log")"
# A terminal (script(1) from util-linux gives the command a pty): the bar is
# redrawn with \r and reaches 100%.
if command -v script > /dev/null 2>&1; then
  script -qec "\"$DSQ_INSPECT\" \"$gguf\"" /dev/null > "$tmp/tty" 2>&1; rc=$?
  grep -q "$(printf '\r')loading .*272/272 tensors.*(100%)" "$tmp/tty"
  check "inspect on a terminal draws the loading bar to 100%" $? \
    "rc=$rc" "$(head -c 600 "$tmp/tty" | od -c | head -8)"
  script -qec "\"$DSQ_RUN\" --model \"$s260/stories260K.bin\" --tokenizer \"$s260/tok512.bin\" --prompt Once -n 3" \
    /dev/null > "$tmp/tty" 2>&1; rc=$?
  grep -q "$(printf '\r')loading .*47/47 tensors.*(100%)" "$tmp/tty"
  check "run on a terminal draws the loading bar to 100%" $? \
    "rc=$rc" "$(head -c 600 "$tmp/tty" | od -c | head -8)"
else
  not_ok "script(1) (util-linux) is installed, to test on a terminal" "missing program: script"
fi

# ---- dsq-quantize copies the llama2.c tokenizer, or says the output has none ----
mkdir -p "$tmp/l2c"
cp "$s260/stories260K.bin" "$tmp/l2c/"
"$DSQ_QUANTIZE_BIN" --model "$tmp/l2c/stories260K.bin" --out "$tmp/q-notok" --method rtn \
  > "$tmp/q.out" 2> "$tmp/q.err"; rc=$?
[ $rc -eq 0 ] && [ -f "$tmp/q-notok/model.safetensors" ] && [ ! -e "$tmp/q-notok/tok512.bin" ] &&
  grep -q "warning: no tokenizer file in .*q-notok has none" "$tmp/q.err"
check "quantize without a tokenizer next to the model warns that the output has none" $? \
  "rc=$rc" "$(cat "$tmp/q.err")"
cp "$s260/tok512.bin" "$tmp/l2c/"
"$DSQ_QUANTIZE_BIN" --model "$tmp/l2c/stories260K.bin" --out "$tmp/q-tok" --method rtn \
  > "$tmp/q.out" 2> "$tmp/q.err"; rc=$?
[ $rc -eq 0 ] && cmp -s "$s260/tok512.bin" "$tmp/q-tok/tok512.bin" && ! grep -q warning "$tmp/q.err"
check "quantize copies tok512.bin found next to the model, no warning" $? \
  "rc=$rc" "$(cat "$tmp/q.err")"
# users: that directory's own tok512.bin is found (no --tokenizer), and the
# text is what the source model with its tokenizer says
"$DSQ_RUN" --model "$tmp/q-tok" --prompt "Once upon a time" -n 12 > "$tmp/qrun.out" 2> "$tmp/qrun.err"; rc=$?
"$DSQ_RUN" --model "$tmp/q-tok" --tokenizer "$s260/tok512.bin" --prompt "Once upon a time" -n 12 \
  > "$tmp/qrun2.out" 2>/dev/null
[ $rc -eq 0 ] && [ -s "$tmp/qrun.out" ] && cmp -s "$tmp/qrun.out" "$tmp/qrun2.out"
check "a quantized llama2.c directory loads its own tok512.bin" $? \
  "rc=$rc" "$(tail -3 "$tmp/qrun.err")"

# ---- dsq-bench on every architecture: a deepseek2 file in llama.cpp's
# converter layout, written by dsq-bench write-model, runs a prefill and
# decode steps (its MLA cache is not the llama shape) ----
"$DSQ_BENCH" write-model --shape v2-quick "$tmp/v2q.gguf" > "$tmp/wm.out" 2>&1; rc=$?
"$DSQ_INSPECT" "$tmp/v2q.gguf" > "$tmp/v2q.txt" 2>&1
[ $rc -eq 0 ] && grep -q "architecture: *deepseek2" "$tmp/v2q.txt" &&
  grep -q "experts=4+1 shared, top-2" "$tmp/v2q.txt"
check "write-model v2-quick: a deepseek2 GGUF with 4+1 experts" $? "rc=$rc" \
  "$(cat "$tmp/wm.out" "$tmp/v2q.txt" | tail -5)"
"$DSQ_BENCH" cpu --model "$tmp/v2q.gguf" --prompt-tokens 16 --gen-tokens 4 --reps 1 \
  > "$tmp/bc.out" 2> "$tmp/bc.err"; rc=$?
[ $rc -eq 0 ] && grep -q "^pp  *16 " "$tmp/bc.out" && grep -q "^tg  *4 " "$tmp/bc.out"
check "dsq-bench cpu prefills and decodes a deepseek2 model" $? "rc=$rc" \
  "$(tail -3 "$tmp/bc.err")"

echo "1..$n"
exit $fail
