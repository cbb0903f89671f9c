#!/bin/sh
# End-to-end checks of `dsq-bench soak` (tools/bench_soak.c) against a real
# dsqd on SmolLM2-135M (TAP output): a short soak in driver mode with tight
# limits (so unread streams are held and aborted and slow connections hit
# their header deadline within seconds) ends with verdict ok: no request of
# the mix failed, no KV block in use, fds and threads back where they
# started. --url mode with --api-key against a dsqd that wants one passes;
# the verdict can fail: without the key every request gets 401 and the soak
# exits 1. Bad usage and a server that is not
# there exit 2. Timings are never asserted.
# Environment (set by tests/e2e/meson.build): DSQ_BENCH, DSQD, DSQ_MODELS_DIR.
set -u
n=0; fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsq-e2e-soak.XXXXXX")
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

# ---- a short soak, driver mode ----
# one client beside one unread stream, so the unread one reaches its 4 KiB
# bound within seconds even on a loaded machine; held 2 s it is aborted, and
# its client finds that out when it reads again after 25 s
"$DSQ_BENCH" soak --dsqd "$DSQD" --model "$gguf" --minutes 0.6 --clients 1 --unread 1 \
  --unread-hold 25 --slow 30 --sample 10 --log "$tmp/soak-dsqd.log" -- \
  --max-undelivered-bytes 4096 --stream-stall-timeout 2 --header-timeout 3 \
  --kv-cache-memory 256MiB >"$tmp/soak.out" 2>"$tmp/soak.err"
rc=$?
check "short soak exits 0" $rc "rc=$rc" "$(cat "$tmp/soak.out" "$tmp/soak.err")" \
  "$(tail -20 "$tmp/soak-dsqd.log")"
grep -q '^verdict: ok$' "$tmp/soak.out"
check "verdict ok" $? "$(tail -12 "$tmp/soak.out")"
grep -q '^| start | 0 |' "$tmp/soak.out" && grep -q '^| end |' "$tmp/soak.out"
check "start and end samples reported" $? "$(cat "$tmp/soak.out")"
python3 - "$tmp/soak.out" >"$tmp/chk" 2>&1 <<'PY'
import re, sys
out = open(sys.argv[1]).read()
rows = {m.group(1): m for m in re.finditer(
    r"^\| (start|end) \| \d+ \| ([\d.]+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|$",
    out, re.M)}
assert set(rows) == {"start", "end"}, out
end = rows["end"]
# KV blocks, running, waiting, held: all 0 once idle
assert [int(end.group(i)) for i in (5, 6, 7, 8)] == [0, 0, 0, 0], end.group(0)
kinds = dict((m.group(1), (int(m.group(2)), int(m.group(3)), int(m.group(4)))) for m in
             re.finditer(r"^\| (\w+) \| (\d+) \| (\d+) \| (\d+) \| \d+ \|$", out, re.M))
for k in ("stream", "abort", "long", "plain", "bad_json"):
    sent, good, bad = kinds[k]
    assert bad == 0, (k, kinds[k])
assert sum(kinds[k][0] for k in kinds) >= 3, kinds
m = re.search(r"unread streams: (\d+) seen aborted by the server, \d+ finished; "
              r"the server counted (\d+) stall aborts", out)
assert m and int(m.group(1)) >= 1 and int(m.group(2)) >= 1, "no unread stream was aborted"
m = re.search(r"slow connections: (\d+) opened, (\d+) closed by the server", out)
assert m and int(m.group(2)) >= 30, "slow connections were not closed at their deadline"
PY
check "report: KV idle at the end, no errors, unread aborted, slow closed" $? "$(cat "$tmp/chk")"

# ---- the verdict can fail: every request refused (401) ----
port=$(free_port)
DSQ_API_KEY=soak-test-key "$DSQD" --model "$gguf" --host 127.0.0.1 --port "$port" \
  --kv-cache-memory 256MiB --log-level warn >"$tmp/dsqd.log" 2>&1 &
pid=$!
up=1
for _ in $(seq 1 150); do
  if curl -sf --noproxy '*' "http://127.0.0.1:$port/health" >/dev/null 2>&1; then up=0; break; fi
  sleep 0.2
done
check "dsqd with an API key up" $up "$(tail -20 "$tmp/dsqd.log")"
# --url mode with the key: as expected, verdict ok
"$DSQ_BENCH" soak --url "http://127.0.0.1:$port" --pid "$pid" --api-key soak-test-key \
  --minutes 0.1 --clients 2 --unread 0 --slow 5 >"$tmp/url.out" 2>&1
rc=$?
check "--url mode with --api-key exits 0" $rc "rc=$rc" "$(tail -15 "$tmp/url.out")"
# without it (the model named, so the soak starts): every request is a 401
"$DSQ_BENCH" soak --url "http://127.0.0.1:$port" --pid "$pid" --model-name x \
  --minutes 0.1 --clients 2 --unread 0 --slow 0 >"$tmp/refused.out" 2>&1
rc=$?
check "soak against a server refusing everything exits 1" "$([ $rc -eq 1 ] && echo 0 || echo 1)" \
  "rc=$rc" "$(tail -15 "$tmp/refused.out")"
grep -q '^verdict: FAILED; [0-9]* errors' "$tmp/refused.out" && grep -q 'first: .*status 401' "$tmp/refused.out"
check "verdict FAILED names the 401" $? "$(tail -6 "$tmp/refused.out")"
kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=

# ---- bad usage and no server: exit 2 ----
for args in "" "--minutes 1" "--url http://127.0.0.1:1 --dsqd $DSQD" "--bogus 1" \
            "--dsqd $DSQD" "--url http://127.0.0.1:1 --minutes 0"; do
  # shellcheck disable=SC2086
  "$DSQ_BENCH" soak $args >"$tmp/bad.out" 2>&1
  rc=$?
  check "soak '$args' exits 2" "$([ $rc -eq 2 ] && echo 0 || echo 1)" "rc=$rc" "$(cat "$tmp/bad.out")"
done
"$DSQ_BENCH" soak --url "http://127.0.0.1:$(free_port)" --minutes 0.1 >"$tmp/none.out" 2>&1
rc=$?
check "soak with nothing listening exits 2" "$([ $rc -eq 2 ] && echo 0 || echo 1)" "rc=$rc" \
  "$(cat "$tmp/none.out")"

echo "1..$n"
exit $fail
