#!/bin/sh
# End-to-end checks of `dsq-bench serve` (tools/bench_serve.c) against a real
# dsqd on SmolLM2-135M (TAP output): the driver mode that starts dsqd itself,
# the --url mode against a daemon started here, the report's shape (JSON and
# the markdown table), that every request succeeded with exactly the
# requested number of tokens, and the failure paths (bad options, a server
# that refuses every request, nothing listening). Timings are never asserted,
# only their internal consistency (p50 <= p99, TTFT <= end to end).
# Environment (set by tests/e2e/meson.build): DSQ_BENCH, DSQD, DSQ_MODELS_DIR.
# A missing binary or model file is a failure.
set -u
n=0; fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsq-e2e-serve.XXXXXX")
pid=
cleanup() {
  if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

. "$(dirname "$0")/tap.sh"

gguf=$DSQ_MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
for f in "$gguf" "$DSQ_BENCH" "$DSQD"; do
  if [ ! -f "$f" ]; then not_ok "input file present: $f" "missing $f"; fi
done
if [ $fail -ne 0 ]; then echo "1..$n"; exit 1; fi

# validate JSON report $1: one target labelled $2, $3 requests all succeeded,
# prompt/output token totals $4/$5
check_report() {
  python3 - "$@" <<'EOF'
import json, math, sys
path, label, n_req, n_in, n_out = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
j = json.load(open(path))
assert j["config"]["requests"] == n_req, j["config"]
(t,) = j["targets"]
assert t["label"] == label, t["label"]
assert t["url"].startswith("http://127.0.0.1:"), t["url"]
assert (t["requests"], t["succeeded"], t["failed"]) == (n_req, n_req, 0), t
assert t["first_error"] is None, t["first_error"]
assert t["prompt_tokens"] == n_in, (t["prompt_tokens"], n_in)
assert t["output_tokens"] == n_out, (t["output_tokens"], n_out)
# every token arrived in some text chunk, at most one chunk per token
assert 0 < t["text_chunks"] <= n_out, t["text_chunks"]
assert t["duration_s"] > 0
assert math.isclose(t["request_throughput"], n_req / t["duration_s"], rel_tol=1e-6)
assert math.isclose(t["output_tok_s"], n_out / t["duration_s"], rel_tol=1e-6)
for k in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
    p = t[k]
    assert 0 <= p["p50"] <= p["p99"], (k, p)
assert t["ttft_ms"]["p50"] <= t["e2e_ms"]["p99"]
assert t["e2e_ms"]["p99"] <= t["duration_s"] * 1e3 * (1 + 1e-9)
EOF
}

# ---- driver mode: dsq-bench starts and stops dsqd itself ----
# mix 16:8,40:5 over 6 requests: 3 of each -> prompt 3*16+3*40, output 3*8+3*5
"$DSQ_BENCH" serve --dsqd "$DSQD" --model "$gguf" --threads 1 --clients 3 \
  --requests 6 --mix 16:8,40:5 --json --log-dir "$tmp" >"$tmp/drv.json" 2>"$tmp/drv.err"
rc=$?
check "driver mode exits 0" $rc "rc=$rc" "$(cat "$tmp/drv.err")" "$(cat "$tmp"/dsq-bench-serve-dsqd-*.log 2>/dev/null | tail -20)"
check_report "$tmp/drv.json" dsqd 6 168 39 >"$tmp/chk" 2>&1
check "driver mode report: 6/6 ok, 168 prompt and 39 output tokens" $? "$(cat "$tmp/chk")" "$(cat "$tmp/drv.json")"
# its own dsqd only (other e2e tests run theirs in parallel): by its port
drv_port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["targets"][0]["url"].rsplit(":",1)[1])' "$tmp/drv.json" 2>/dev/null)
left=$(ps -eo pid=,args= | grep -F -- "--port ${drv_port:-none} " | grep -F "$DSQD" | grep -v grep)
[ -z "$left" ]
check "driver mode stopped its dsqd" $? "$left"

# ---- --url mode against a daemon started here ----
port=$(free_port)
"$DSQD" --model "$gguf" --host 127.0.0.1 --port "$port" --threads 1 \
  --kv-cache-memory 256MiB --log-level warn >"$tmp/dsqd.log" 2>&1 &
pid=$!
up=1
for _ in $(seq 1 600); do
  if curl -sf --noproxy '*' "http://127.0.0.1:$port/health" >/dev/null 2>&1; then up=0; break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
check "dsqd up on 127.0.0.1:$port" $up "$(tail -20 "$tmp/dsqd.log")"

"$DSQ_BENCH" serve --url "http://127.0.0.1:$port/" --clients 2 --requests 4 \
  --prompt-len 20 --max-tokens 6 --seed 7 >"$tmp/url.txt" 2>"$tmp/url.err"
rc=$?
check "--url mode exits 0" $rc "rc=$rc" "$(cat "$tmp/url.err")"
# the markdown table: header, rule, one row "| url1 | 4/4 | ..." with 14 cells
python3 - "$tmp/url.txt" >"$tmp/chk" 2>&1 <<'EOF'
import sys
rows = [l for l in open(sys.argv[1]) if l.startswith("|")]
assert len(rows) == 3, rows
cells = [c.strip() for c in rows[2].strip().strip("|").split("|")]
assert len(cells) == 14, cells
assert cells[0] == "url1" and cells[1] == "4/4", cells
assert cells[13] != "nan" and float(cells[13]) >= 1.0, cells
for c in cells[2:]:
    float(c)
EOF
check "--url mode table: one row, 4/4 ok, numeric cells" $? "$(cat "$tmp/chk")" "$(cat "$tmp/url.txt")"

"$DSQ_BENCH" serve --url "http://127.0.0.1:$port" --clients 2 --requests 4 \
  --prompt-len 20 --max-tokens 6 --seed 7 --json >"$tmp/url.json" 2>"$tmp/url.err"
rc=$?
check "--url --json exits 0" $rc "rc=$rc" "$(cat "$tmp/url.err")"
check_report "$tmp/url.json" url1 4 80 24 >"$tmp/chk" 2>&1
check "--url --json report: 4/4 ok, 80 prompt and 24 output tokens" $? "$(cat "$tmp/chk")" "$(cat "$tmp/url.json")"

# every request refused (prompt longer than SmolLM2's 8192-token context):
# reported as failures with the server's reason, exit status 1, no hang
timeout 120 "$DSQ_BENCH" serve --url "http://127.0.0.1:$port" --clients 2 --requests 3 \
  --prompt-len 9000 --max-tokens 4 --warmup 0 --json >"$tmp/bad.json" 2>"$tmp/bad.err"
rc=$?
[ $rc -eq 1 ]
check "refused requests: exit status 1" $? "rc=$rc" "$(cat "$tmp/bad.err")"
python3 -c '
import json, sys
(t,) = json.load(open(sys.argv[1]))["targets"]
assert (t["requests"], t["succeeded"], t["failed"]) == (3, 0, 3), t
assert "HTTP 400" in t["first_error"], t["first_error"]
assert t["ttft_ms"]["p50"] is None, t["ttft_ms"]
' "$tmp/bad.json" >"$tmp/chk" 2>&1
check "refused requests: 3 failed, first_error HTTP 400" $? "$(cat "$tmp/chk")" "$(cat "$tmp/bad.json")"

kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=

# ---- nothing listening: connection refused is a failure, not a hang ----
port=$(free_port)
timeout 60 "$DSQ_BENCH" serve --url "http://127.0.0.1:$port" --model-name m \
  --clients 2 --requests 2 --warmup 0 >"$tmp/dead.txt" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "| url1 | 0/2 |" "$tmp/dead.txt"
check "connection refused: 0/2 ok, exit status 1" $? "rc=$rc" "$(cat "$tmp/dead.txt")"

# ---- bad options: exit status 2 with a message, no request sent ----
for args in "--clients 0 --url http://127.0.0.1:1" "--mix 16:x --url http://127.0.0.1:1" \
            "--prompt-len" "" "--url ftp://x" "--dsqd $DSQD" \
            "--dsqd $tmp/nonexistent --model $gguf" "--bogus 1"; do
  # shellcheck disable=SC2086
  "$DSQ_BENCH" serve $args >"$tmp/o" 2>"$tmp/e"; rc=$?
  [ $rc -eq 2 ] && [ -s "$tmp/e" ]
  check "bad options '$args': exit 2 with a message" $? "rc=$rc" "$(cat "$tmp/e")"
done

# ---- dsq-bench grammar: every grammar source runs and reports the mask cost ----
src=${DSQ_SOURCE_ROOT:-.}
for g in "" "--json-object" "--grammar $src/tools/grammars/person.gbnf" \
         "--json-schema $src/tools/grammars/person.schema.json"; do
  # shellcheck disable=SC2086
  "$DSQ_BENCH" grammar --model "$gguf" --tokens 60 $g >"$tmp/o" 2>"$tmp/e"; rc=$?
  [ $rc -eq 0 ] && grep -q "vocab 49152" "$tmp/o" && grep -q "mask per token: mean" "$tmp/o"
  check "dsq-bench grammar ${g:-(built in)}: a report" $? "rc=$rc" "$(cat "$tmp/o" "$tmp/e")"
done
printf '{"type": "object", "patternProperties": {}}' >"$tmp/bad.schema.json"
"$DSQ_BENCH" grammar --model "$gguf" --json-schema "$tmp/bad.schema.json" >"$tmp/o" 2>"$tmp/e"; rc=$?
[ $rc -eq 1 ] && grep -q "'patternProperties' is not supported" "$tmp/e"
check "dsq-bench grammar: an unsupported schema is exit 1 naming the keyword" $? "rc=$rc" \
  "$(cat "$tmp/e")"

# ---- serve --grammar / --json-schema: a plain and a constrained row of the
# same load, every constrained request still makes exactly T tokens ----
for g in "--grammar $src/tools/grammars/person_stream.gbnf:dsqd+grammar" \
         "--json-schema $src/tools/grammars/person_stream.schema.json:dsqd+schema"; do
  opt=${g%:*}; label=${g##*:}
  # shellcheck disable=SC2086
  "$DSQ_BENCH" serve --dsqd "$DSQD" --model "$gguf" --threads 1 --clients 2 --requests 4 \
    --prompt-len 8 --max-tokens 12 --json $opt >"$tmp/c.json" 2>"$tmp/c.err"; rc=$?
  python3 - "$tmp/c.json" "$label" <<'EOF' >"$tmp/chk" 2>&1
import json, sys
t = json.load(open(sys.argv[1]))["targets"]
assert [x["label"] for x in t] == ["dsqd", sys.argv[2]], [x["label"] for x in t]
for x in t:
    assert (x["succeeded"], x["failed"], x["output_tokens"]) == (4, 0, 48), x
EOF
  check "serve ${opt%% *}: plain and constrained rows, 4/4 requests of 12 tokens each" $? \
    "rc=$rc" "$(cat "$tmp/chk" "$tmp/c.err")"
done
"$DSQ_BENCH" serve --dsqd "$DSQD" --model "$gguf" --grammar "$src/tools/grammars/person.gbnf" \
  --json-schema "$src/tools/grammars/person.schema.json" >"$tmp/o" 2>"$tmp/e"; rc=$?
[ $rc -eq 2 ] && grep -q "not both" "$tmp/e"
check "serve --grammar with --json-schema: exit 2" $? "rc=$rc" "$(cat "$tmp/e")"

# ---- serve --open-loop: Poisson arrivals; against an adaptive dsqd far over
# its rate, the excess is counted as refused (503 + Retry-After), not as
# failures, and the run still exits 0; a slow rate is all served ----
port=$(free_port)
"$DSQD" --model "$gguf" --port "$port" --threads 1 --max-num-seqs 4 \
  --admission-policy adaptive --target-ttft-ms 400 >"$tmp/adm.log" 2>&1 &
pid=$!
up=1
for _ in $(seq 1 300); do
  if curl -sf --noproxy '*' "http://127.0.0.1:$port/health" >/dev/null 2>&1; then up=0; break; fi
  sleep 0.1
done
check "adaptive dsqd up" $up "$(cat "$tmp/adm.log")"
timeout 300 "$DSQ_BENCH" serve --url "http://127.0.0.1:$port" --clients 4 --requests 40 \
  --prompt-len 16 --max-tokens 32 --warmup 0 --open-loop 200 --seed 3 --json \
  >"$tmp/ol.json" 2>"$tmp/ol.err"
rc=$?
check "--open-loop 200 against adaptive: exit 0" $rc "rc=$rc" "$(cat "$tmp/ol.err")"
python3 - "$tmp/ol.json" <<'EOF2' >"$tmp/chk" 2>&1
import json, sys
j = json.load(open(sys.argv[1]))
assert j["config"]["open_loop_rate"] == 200, j["config"]
(t,) = j["targets"]
assert t["requests"] == 40 and t["failed"] == 0, t
assert t["succeeded"] >= 1 and t["refused"] >= 1, t
assert t["succeeded"] + t["refused"] == 40, t
assert t["output_tokens"] == 32 * t["succeeded"], t
r = t["refuse_ms"]
assert r["p50"] is not None and r["p50"] <= r["p99"], r
assert t["offered_rate"] > 20, t["offered_rate"]
EOF2
check "--open-loop report: served + refused = 40, refusals timed" $? "$(cat "$tmp/chk")" \
  "$(cat "$tmp/ol.json")"
timeout 300 "$DSQ_BENCH" serve --url "http://127.0.0.1:$port" --clients 4 --requests 4 \
  --prompt-len 16 --max-tokens 4 --warmup 0 --open-loop 2 --seed 4 --json \
  >"$tmp/ol2.json" 2>"$tmp/ol2.err"
rc=$?
python3 -c '
import json, sys
(t,) = json.load(open(sys.argv[1]))["targets"]
assert (t["succeeded"], t["refused"], t["failed"]) == (4, 0, 0), t
' "$tmp/ol2.json" >"$tmp/chk" 2>&1
check "--open-loop 2: every request served" $? "rc=$rc" "$(cat "$tmp/chk" "$tmp/ol2.err")"
"$DSQ_BENCH" serve --url "http://127.0.0.1:$port" --open-loop 0 >"$tmp/o" 2>"$tmp/e"; rc=$?
[ $rc -eq 2 ] && grep -q "open-loop" "$tmp/e"
check "--open-loop 0: exit 2 with a message" $? "rc=$rc" "$(cat "$tmp/e")"
kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=

# ---- serve --prompt-file: text prompts; a speculating dsqd's drafts are
# read from its /metrics and reported (scored >= kept > 0 on prompts whose
# answer copies them); a bad file is exit 2 naming the line ----
"$DSQ_BENCH" serve --dsqd "$DSQD" --model "$gguf" --threads 1 --clients 1 --requests 2 \
  --max-tokens 24 --warmup 0 --prompt-file "$src/tools/prompts/rewrite.jsonl" \
  --dsqd-arg --speculative-ngram --dsqd-arg 8 --json --log-dir "$tmp" \
  >"$tmp/pf.json" 2>"$tmp/pf.err"
rc=$?
python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))
(t,) = j["targets"]
assert (t["succeeded"], t["failed"]) == (2, 0), t
assert t["output_tokens"] == 48, t
assert t["prompt_tokens"] > 200, t          # the servers usage, not --prompt-len
assert 0 < t["draft_accepted"] <= t["draft_tokens"], t
' "$tmp/pf.json" >"$tmp/chk" 2>&1
check "serve --prompt-file with a speculating dsqd: 2/2, drafts reported" $? "rc=$rc" \
  "$(cat "$tmp/chk" "$tmp/pf.err")"
printf '"fine"\n{"not": "a string"}\n' >"$tmp/bad.jsonl"
"$DSQ_BENCH" serve --url http://127.0.0.1:1 --prompt-file "$tmp/bad.jsonl" >"$tmp/o" 2>"$tmp/e"
rc=$?
[ $rc -eq 2 ] && grep -q "bad.jsonl:2: not a JSON string" "$tmp/e"
check "serve --prompt-file with a non-string line: exit 2 naming it" $? "rc=$rc" "$(cat "$tmp/e")"

echo "1..$n"
exit $fail
