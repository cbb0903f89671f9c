#!/usr/bin/env python3
"""Reference block digests for tests/unit/test_prefix_cache.c.

The prefix cache names a full KV block by SHA-256(parent digest || the
block's token ids as little-endian int32), 32 zero bytes standing in for
the parent of the first block (engine/kv/kv_cache.h). This script computes the
same digests with Python's hashlib, independently of the C code, for
block_size 4; the test embeds its output.

Run: python3 tests/ref/make_prefix_hash.py
"""
import hashlib
import struct


def block_hash(parent, tokens):
    data = (parent or bytes(32)) + b"".join(struct.pack("<i", t) for t in tokens)
    return hashlib.sha256(data).digest()


def main():
    a = block_hash(None, [1, 2, 3, 4])
    b = block_hash(a, [5, 6, 7, 8])
    c = block_hash(None, [5, 6, 7, 8])
    d = block_hash(None, [-1, 70000, 0, 2**31 - 1])
    for name, h in (("A [1,2,3,4]", a), ("B A|[5,6,7,8]", b),
                    ("C [5,6,7,8]", c), ("D [-1,70000,0,2^31-1]", d)):
        print(f"{name}: {h.hex()}")


if __name__ == "__main__":
    main()
