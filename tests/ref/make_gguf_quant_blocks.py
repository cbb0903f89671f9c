#!/usr/bin/env python3
"""Golden file of GGUF block dequantisation: tests/golden/gguf_quant_blocks.txt.

For every GGML block type dsq reads (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS) it draws random blocks for a
[N_ROWS, K] weight (numpy PCG64, seed 1234: every quant bit uniformly
random; the fp16 scale fields d / dmin / m replaced by random finite values
of both signs) and dequantises them with gguf-py's numpy twins of ggml's
dequantize_row_* (gguf.quants.dequantize), which share no code with dsq.
tests/unit/test_gguf_quant.c repacks the same bytes with
dsq_quant_from_gguf and requires every dequantised weight to equal the
golden float32 bit for bit, then multiplies with them on every ISA level.

usage: make_gguf_quant_blocks.py OUT   (needs tests/ref/requirements-model.txt)
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

N_ROWS, K, SEED = 2, 512, 1234

# byte offsets of the fp16 fields of each block (ggml-common.h structs)
FP16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
    T.Q6_K: [208], T.IQ4_NL: [0], T.IQ4_XS: [0],
}


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    rng = np.random.Generator(np.random.PCG64(SEED))
    out = [
        "# format_version: 1",
        "# GGUF block dequantisation: random blocks per type and gguf-py's dequantize",
        "# regenerate: .venv/bin/python tests/ref/make_gguf_quant_blocks.py "
        "tests/golden/gguf_quant_blocks.txt",
        f"# tools: gguf-py {getattr(gguf, '__version__', '0.19.0')}, numpy {np.__version__}",
        "# tolerance: 0 (values are float32 bit patterns; dsq must match them exactly)",
        f"# per type: 'type NAME n {N_ROWS} k {K}', 'bytes HEX' (the tensor data),",
        "# 'values' then n*k float32 bit patterns as 8 hex digits (row-major)",
    ]
    for qt, fields in FP16_FIELDS.items():
        be, bb = GGML_QUANT_SIZES[qt]
        nblk = N_ROWS * K // be
        raw = rng.integers(0, 256, size=(nblk, bb), dtype=np.uint8)
        for b in range(nblk):
            for off in fields:
                mag = rng.uniform(2.0 ** -12, 2.0 ** -4)
                h = np.array([mag * rng.choice([-1.0, 1.0])], dtype=np.float16)
                raw[b, off:off + 2] = np.frombuffer(h.tobytes(), dtype=np.uint8)
        data = raw.reshape(-1)
        vals = gguf.quants.dequantize(data.reshape(N_ROWS, -1), qt)
        vals = np.asarray(vals, dtype=np.float32).reshape(N_ROWS, K)
        assert np.all(np.isfinite(vals)), qt.name
        out.append(f"type {qt.name} n {N_ROWS} k {K}")
        out.append("bytes " + data.tobytes().hex())
        bits = vals.reshape(-1).view(np.uint32)
        out.append("values " + " ".join(f"{v:08x}" for v in bits))
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
