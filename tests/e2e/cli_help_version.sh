#!/bin/sh
# Every executable answers --help and --version with exit 0 and some output.
# TAP output.
set -u
n=0; fail=0
for var in DSQD DSQ_RUN DSQ_INSPECT DSQ_TOKENIZE DSQ_BENCH DSQ_QUANTIZE_BIN DSQ_PERPLEXITY; do
  eval bin=\$$var
  for flag in --help --version; do
    n=$((n + 1))
    out=$("$bin" "$flag" 2>&1); rc=$?
    if [ $rc -eq 0 ] && [ -n "$out" ]; then
      echo "ok $n - $(basename "$bin") $flag"
    else
      echo "not ok $n - $(basename "$bin") $flag (rc=$rc)"; fail=1
    fi
  done
done
echo "1..$n"
exit $fail
