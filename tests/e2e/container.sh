#!/bin/bash
# End-to-end check of the container image (deploy/container/build) on
# SmolLM2-135M (TAP): the image builds from Debian packages with this
# build's dsqd (the CUDA image when it links the CUDA runtime: served on
# the CPU without a GPU); a container of it (non-root, model mounted read-only)
# becomes healthy, and its health check passes; a greedy completion from it
# equals the one the same dsqd gives outside the container; SIGTERM (podman
# stop) drains: a request already running finishes whole and the container
# exits 0. Podman works on a storage folder of its own (vfs, runc, cgroupfs:
# what runs in the most restricted places), removed at the end.
# Skips (TAP "1..0 # SKIP") when podman or mmdebstrap is missing, when the
# host is not Debian (the image reuses the host's dsqd, built against the
# same Debian release), or when this machine cannot run a container at all.
# Environment (tests/e2e/meson.build): DSQD, DSQ_MODELS_DIR, DSQ_SOURCE_ROOT.
set -u
n=0; fail=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dsq-e2e-ctr.XXXXXX")
name=dsq-e2e-$$
tag=localhost/dsqd-e2e:$$
hostpid=
skip() { echo "1..0 # SKIP $1"; exit 0; }
cleanup() {
  if [ -n "$hostpid" ]; then kill "$hostpid" 2>/dev/null; wait "$hostpid" 2>/dev/null; fi
  # only what this test made, in its own storage: never `podman system
  # reset`, which also clears the host's shared podman state
  if [ -n "${podman:-}" ]; then
    $podman rm -af -t 0 >/dev/null 2>&1
    $podman rmi -af >/dev/null 2>&1
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
. "$(dirname "$0")/tap.sh"
wait_health() { # url, seconds: 0 once /health answers 200
  local i
  for i in $(seq 1 "$2"); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1/health")" = 200 ] && return 0
    sleep 1
  done
  return 1
}
complete() { # url, max_tokens: the body of a greedy completion
  curl -s --max-time 300 "$1/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"m\", \"prompt\": \"The capital of France is\", \"max_tokens\": $2, \"temperature\": 0}"
}

command -v podman >/dev/null || skip "podman not installed (scripts/setup installs it)"
command -v mmdebstrap >/dev/null || skip "mmdebstrap not installed (scripts/setup installs it)"
# shellcheck disable=SC1091
suite=$(. /etc/os-release 2>/dev/null; [ "${ID:-}" = debian ] && echo "${VERSION_CODENAME:-}")
[ -n "$suite" ] || skip "the host is not Debian: the image test reuses the host's dsqd"
gguf=$DSQ_MODELS_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
for f in "$gguf" "$DSQD"; do
  [ -f "$f" ] || { echo "not ok 1 - input file present: $f"; echo "1..1"; exit 1; }
done

# everything podman keeps (images, containers, its tmp and network state)
# inside $tmp, so the host's own podman is never touched
cat >"$tmp/containers.conf" <<EOF
[containers]
default_ulimits = []
[engine]
tmp_dir = "$tmp/libpod-tmp"
volume_path = "$tmp/volumes"
[network]
network_config_dir = "$tmp/net"
EOF
export CONTAINERS_CONF=$tmp/containers.conf
podman="podman --root $tmp/storage --runroot $tmp/run --storage-driver vfs --cgroup-manager cgroupfs --runtime runc"
export PODMAN=$podman

# Can this machine run a container at all? A root of the host's own
# /usr/bin/true and the libraries it loads, imported and run.
mkdir -p "$tmp/probe"
probe_files=$( { echo /usr/bin/true; ldd /usr/bin/true | grep -oE '/[^ ]+'; } | sort -u)
# shellcheck disable=SC2086
tar -chf "$tmp/probe.tar" $probe_files 2>/dev/null
if ! perr=$($podman import "$tmp/probe.tar" "localhost/dsq-e2e-probe:$$" 2>&1 >/dev/null) ||
   ! perr=$($podman run --rm --network host --no-healthcheck "localhost/dsq-e2e-probe:$$" /usr/bin/true 2>&1); then
  skip "this machine cannot run containers: $(printf '%s' "$perr" | tail -n 1)"
fi

# 1. the image
# a dsqd built with CUDA (nvcc present) makes the CUDA image (its runtime
# libraries from NVIDIA's wheels); without a GPU dsqd serves on the CPU there
kind=
readelf -d "$DSQD" | grep -q 'NEEDED.*libcudart' && kind=--cuda
if blog=$("$DSQ_SOURCE_ROOT/deploy/container/build" $kind --dsqd "$DSQD" --suite "$suite" --tag "$tag" 2>&1); then
  ok "deploy/container/build: $(printf '%s\n' "$blog" | grep '^build: localhost' | tail -n 1)"
else
  not_ok "deploy/container/build" "$(printf '%s\n' "$blog" | tail -n 20)"
  echo "1..$n"; exit 1
fi
user=$($podman image inspect --format '{{.Config.User}}' "$tag" 2>&1)
[ "$user" = 10001:10001 ]; check "the image runs as 10001:10001 (got $user)" $?

# 2. a container of it, and the same dsqd outside for the reference
port=$(free_port)
$podman run -d --name "$name" --network host -v "$DSQ_MODELS_DIR:/models:ro" \
  -e DSQ_HOST=127.0.0.1 -e DSQ_PORT="$port" "$tag" \
  --model /models/SmolLM2-135M-Instruct.Q4_1.gguf --served-model-name m >"$tmp/run.out" 2>&1
st=$?
url=http://127.0.0.1:$port
if [ $st -eq 0 ] && wait_health "$url" 120; then
  ok "the container serves: /health 200 on $url"
else
  not_ok "the container serves" "$(cat "$tmp/run.out")" "$($podman logs "$name" 2>&1 | tail -n 20)"
  echo "1..$n"; exit 1
fi
cpid=$($podman inspect --format '{{.State.Pid}}' "$name")
uid=$(ps -o uid= -p "$cpid" | tr -d ' ')
[ "$uid" = 10001 ]; check "dsqd in the container runs as uid 10001 (got $uid)" $?
hc=$($podman healthcheck run "$name" 2>&1); st=$?
check "podman healthcheck run: healthy" $st "$hc"

hport=$(free_port)
"$DSQD" --host 127.0.0.1 --port "$hport" --model "$gguf" --served-model-name m 2>"$tmp/host.log" &
hostpid=$!
if wait_health "http://127.0.0.1:$hport" 120; then
  got=$(complete "$url" 16 | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>&1)
  want=$(complete "http://127.0.0.1:$hport" 16 | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])' 2>&1)
  [ -n "$want" ] && [ "$got" = "$want" ]
  check "greedy completion from the container equals dsqd's outside it" $? "container: $got" "host: $want"
else
  not_ok "the host dsqd serves" "$(tail -n 20 "$tmp/host.log")"
fi

# 3. SIGTERM drains: a request streaming when the stop comes finishes
# whole (all its tokens, then [DONE]), then dsqd exits 0
curl -sN --max-time 300 "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "m", "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": true,
       "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}' \
  >"$tmp/long.sse" 2>&1 &
req=$!
for _ in $(seq 1 100); do grep -q '^data: {' "$tmp/long.sse" 2>/dev/null && break; sleep 0.1; done
$podman stop -t 60 "$name" >/dev/null 2>&1
wait "$req"
res=$(python3 - "$tmp/long.sse" <<'PY'
import json, sys
lines = [l[6:] for l in open(sys.argv[1]) if l.startswith("data: ")]
usage = [json.loads(l)["usage"] for l in lines[:-1] if json.loads(l).get("usage")]
reasons = [c["finish_reason"] for l in lines[:-1] for c in json.loads(l)["choices"] if c.get("finish_reason")]
print(lines[-1].strip() if lines else "-", usage[-1]["completion_tokens"] if usage else "-", reasons)
PY
)
drained=$($podman logs "$name" 2>&1 | grep -o 'event=draining signal=15 inflight=[0-9]*')
[ "$res" = "[DONE] 400 ['length']" ] && [ "$drained" = "event=draining signal=15 inflight=1" ]
check "podman stop while a request streams: it finishes whole ($res; $drained)" $? \
  "$(tail -c 300 "$tmp/long.sse")" "$($podman logs "$name" 2>&1 | tail -n 5)"
code=$($podman inspect --format '{{.State.ExitCode}}' "$name" 2>&1)
[ "$code" = 0 ]; check "the container exited 0 after SIGTERM (got $code)" $? "$($podman logs "$name" 2>&1 | tail -n 5)"

echo "1..$n"
exit $fail
