# TAP helpers the e2e shell tests source (POSIX sh): counters n (tests so
# far) and fail (1 once one failed), which the caller sets to 0 first and
# ends with `echo "1..$n"; exit $fail`.

# ok NAME: one passing test
ok() { n=$((n + 1)); echo "ok $n - $1"; }

# not_ok NAME [DIAG...]: one failing test, each DIAG line as a "# " comment
not_ok() {
  n=$((n + 1)); echo "not ok $n - $1"; fail=1
  shift
  for _tap_l in "$@"; do printf '%s\n' "$_tap_l" | sed 's/^/# /'; done
}

# check NAME STATUS [DIAG...]: ok when STATUS is 0, else not_ok with DIAG
# (its own variable names: a caller's $name or $st stay as they were)
check() {
  _tap_name=$1; _tap_st=$2; shift 2
  if [ "$_tap_st" -eq 0 ]; then ok "$_tap_name"; else not_ok "$_tap_name" "$@"; fi
}

# free_port: a TCP port on 127.0.0.1 nothing listens on now
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
