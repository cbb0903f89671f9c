#!/usr/bin/env python3
"""Fetch the official JSON-Schema-Test-Suite (draft 2020-12, the required
tests; MIT license) as the jsonschema 4.26.0 sdist on PyPI ships it, into
DIR (default models/jsonschema-suite, git-ignored): one file per keyword,
each a list of {"description", "schema", "tests": [{"data", "valid"}]}.

tests/unit/test_grammar_schema.c checks every schema dsq accepts against
the suite's verdicts; tests/e2e/test_schema.py generates from them.

Usage: tests/ref/fetch_schema_suite.py [DIR]. Exit 1 on a download or
checksum failure. Prints DIR.
"""
import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile

PKG = "jsonschema==4.26.0"
SDIST = "jsonschema-4.26.0.tar.gz"
SHA256 = "0c26707e2efad8aa1bfc5b7ce170f3fccc2e4918ff85989ba9ffa9facb2be326"
PREFIX = "jsonschema-4.26.0/json/"
SUITE = PREFIX + "tests/draft2020-12/"


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "models/jsonschema-suite"
    stamp = os.path.join(out, ".sha256")
    if os.path.exists(stamp) and open(stamp).read().strip() == SHA256:
        print(out)
        return
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                            "--no-binary=:all:", "--disable-pip-version-check", "-d", tmp,
                            PKG], capture_output=True, text=True)
        path = os.path.join(tmp, SDIST)
        if r.returncode != 0 or not os.path.exists(path):
            sys.exit(f"fetch_schema_suite: pip download {PKG} failed: {r.stderr.strip()[-400:]}")
        with open(path, "rb") as f:
            got = hashlib.sha256(f.read()).hexdigest()
        if got != SHA256:
            sys.exit(f"fetch_schema_suite: {SDIST} sha256 {got}, expected {SHA256}")
        os.makedirs(out, exist_ok=True)
        n = 0
        with tarfile.open(path) as t:
            for m in t.getmembers():
                name = m.name
                keep = (name.startswith(SUITE) and name.endswith(".json") and
                        "/" not in name[len(SUITE):]) or name == PREFIX + "LICENSE"
                if keep and m.isfile():
                    data = t.extractfile(m).read()
                    with open(os.path.join(out, os.path.basename(name)), "wb") as f:
                        f.write(data)
                    n += name.endswith(".json")
        if n < 40:
            sys.exit(f"fetch_schema_suite: only {n} suite files in {SDIST}")
    with open(stamp, "w") as f:
        f.write(SHA256 + "\n")
    print(out)


if __name__ == "__main__":
    main()
