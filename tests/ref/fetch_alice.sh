#!/bin/sh
# Fetch the brotli 1.2.1 source distribution from PyPI (pinned by hash) and
# cut Alice's Adventures in Wonderland out of it into a calibration part
# (chapters I-VI) and a held-out part (chapters VII-XII): see
# tests/ref/prep_alice.py for the source, licence and normalisation.
#
# usage: tests/ref/fetch_alice.sh PYTHON OUTDIR
#   PYTHON  a python with pip (a venv's bin/python)
#   OUTDIR  gets sdist/brotli-1.2.1.tar.gz, alice-calib.txt, alice-heldout.txt
# Idempotent: an existing, checksum-valid archive is not downloaded again
# (one with another checksum is removed and downloaded again).
set -eu
[ $# -eq 2 ] || { echo "usage: fetch_alice.sh PYTHON OUTDIR" >&2; exit 2; }
PY=$1; OUT=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SUM=02b2f7b5a83485efe448a44ddf7983def05c3bb1dcf917d4f7154070260e13de
SDIST=$OUT/sdist/brotli-1.2.1.tar.gz
mkdir -p "$OUT/sdist"
if [ -f "$SDIST" ] && ! echo "$SUM  $SDIST" | sha256sum -c --status; then
    echo "fetch_alice.sh: $SDIST has another checksum; downloading it again" >&2
    rm -f "$SDIST"
fi
if [ ! -f "$SDIST" ]; then
    # --no-binary: the wheels do not carry tests/testdata.
    printf 'brotli==1.2.1 --hash=sha256:%s\n' "$SUM" > "$OUT/sdist/req.txt"
    "$PY" -m pip download -q --no-deps --no-binary :all: --require-hashes \
        -r "$OUT/sdist/req.txt" -d "$OUT/sdist"
fi
python3 "$ROOT/tests/ref/prep_alice.py" "$SDIST" "$OUT"
