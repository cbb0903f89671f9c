#!/usr/bin/env python3
"""Calibration and held-out text for docs/quantization.md: Alice's
Adventures in Wonderland, split by chapter.

Source: the PyPI package `brotli` 1.2.1, source distribution
`brotli-1.2.1.tar.gz` (MIT licence for the package), file
`brotli-1.2.1/tests/testdata/alice29.txt`: Lewis Carroll's text (1865,
public domain), Project Gutenberg's "Millennium Fulcrum Edition 2.9", the
file of the Canterbury compression corpus. Both the archive and the file
are pinned by SHA-256 below; any other bytes are refused.

The file is ASCII with CRLF line ends, hard-wrapped at ~65 columns with
two-space paragraph indents, opens quotations with a backtick, and ends
with a DOS end-of-file byte (0x1a) after "THE END"; that byte is kept (it
ends the held-out part's last line, "THE END \\x1a"). The
normalisation is the same for both parts and changes no word: CRLF -> LF,
each paragraph (lines up to a blank line) joined into one line with single
spaces, leading/trailing blanks and runs of spaces removed, "`" -> "'".

Split: calibration = chapters I-VI (from the line "CHAPTER I" up to the
line before "CHAPTER VII"), held-out = chapters VII-XII (from "CHAPTER
VII" to the end). The title block before chapter I is dropped. The two
parts share no line; dsq-quantize reads only the first, dsq-perplexity
scores only the second (run_quant_stories.sh FIT_T=1 also reads the first
to choose a softmax temperature). Their SHA-256 are pinned too, so a
changed normalisation cannot slip into a table unnoticed.

usage: prep_alice.py BROTLI_SDIST.tar.gz OUTDIR
       writes OUTDIR/alice-calib.txt and OUTDIR/alice-heldout.txt
Python standard library only.
"""
import hashlib
import os
import re
import sys
import tarfile

SDIST_SHA256 = "02b2f7b5a83485efe448a44ddf7983def05c3bb1dcf917d4f7154070260e13de"
MEMBER = "brotli-1.2.1/tests/testdata/alice29.txt"
MEMBER_SHA256 = "7467306ee0feed4971260f3c87421154a05be571d944e9cb021a5713700c38f0"
CALIB_SHA256 = "f41eea36a11153683c507ab29d3dd5b429c2feabc75122c35f6cdb10357e0973"
HELD_SHA256 = "93ae0fd07f4d6b6d943b7cdf6c9c3d3d5fef5f33d3c0ca04e71e49877485ebee"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def paragraphs(lines):
    out, cur = [], []
    for line in lines:
        s = line.strip()
        if s:
            cur.append(s)
        elif cur:
            out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def normalise(lines):
    paras = [re.sub(r" +", " ", p.replace("`", "'")) for p in paragraphs(lines)]
    return ("\n".join(paras) + "\n").encode("ascii")


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: prep_alice.py BROTLI_SDIST.tar.gz OUTDIR\n")
        return 2
    try:
        return run(argv[1], argv[2])
    except (OSError, tarfile.TarError, KeyError, UnicodeDecodeError) as e:
        sys.stderr.write(f"prep_alice.py: {e}\n")
        return 1


def run(sdist, outdir):
    with open(sdist, "rb") as f:
        blob = f.read()
    if sha256(blob) != SDIST_SHA256:
        sys.stderr.write(f"prep_alice.py: {sdist}: sha256 {sha256(blob)}, want {SDIST_SHA256}\n")
        return 1
    with tarfile.open(sdist, "r:gz") as tar:
        raw = tar.extractfile(MEMBER).read()
    if sha256(raw) != MEMBER_SHA256:
        sys.stderr.write(f"prep_alice.py: {MEMBER}: sha256 {sha256(raw)}, want {MEMBER_SHA256}\n")
        return 1
    lines = raw.decode("ascii").replace("\r\n", "\n").split("\n")
    heads = [i for i, l in enumerate(lines) if re.fullmatch(r"\s*CHAPTER [IVX]+\s*", l)]
    if len(heads) != 12:
        sys.stderr.write(f"prep_alice.py: found {len(heads)} chapter headings, want 12\n")
        return 1
    parts = {
        "alice-calib.txt": (normalise(lines[heads[0]:heads[6]]), CALIB_SHA256),
        "alice-heldout.txt": (normalise(lines[heads[6]:]), HELD_SHA256),
    }
    os.makedirs(outdir, exist_ok=True)
    for name, (data, want) in parts.items():
        if sha256(data) != want:
            sys.stderr.write(f"prep_alice.py: {name}: sha256 {sha256(data)}, want {want}\n")
            return 1
        with open(os.path.join(outdir, name), "wb") as f:
            f.write(data)
        print(f"{name} bytes={len(data)} sha256={sha256(data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
