#!/usr/bin/env python3
"""Golden for 8-bit per-channel GPTQ packing (tests/unit/test_quant_recipe.c).

Independent numpy implementation of the published AutoGPTQ v1 format at
bits = 8 (AutoGPTQ QuantLinear.pack; the dequantisation GPTQModel, vLLM's
gptq kernels and transformers/optimum use):

  qweight int32 [k*bits/32][n]: word (i, c) holds input rows
          i*32/bits .. (i+1)*32/bits - 1 of column c, row j in bits
          bits*(j - i*32/bits) .. (low bits first);
  qzeros  int32 [groups][n*bits/32]: same packing along columns, value z - 1;
  scales  fp16 [groups][n];  g_idx int32 [k] (group of each row);
  W[c][r] = scales[g][c] * (q[r][c] - (qzeros_stored[g][c] + 1)),
  g = g_idx[r]; per channel (group_size -1): one group, g_idx all 0.

The matrix is quantised with dsq's INT8 rule (engine/model/quant.c
dsq_quant_int8_channel): s = amax/127 rounded UP to fp16, q = round half
even (w / s) clipped to [-127, 127], stored unsigned q + 128 with z = 128.
The C test checks that dsq (a) repacks these words into exactly the values
`deq` below and (b) packs the same matrix into exactly these words.

With --check DIR it instead reads a dsq-quantize output directory
(model.safetensors, parsed here with json + numpy), dequantises every
qweight by the formula above (4- and 8-bit, bit width from the shape) and,
given --source SRC (the F32 source directory), reports the largest error
relative to each element's half-step s/2: <= 1.02 (the 4-bit RTN scale is
range/15 rounded to the NEAREST fp16, so a range may overshoot 15 steps by
up to 15 x 2^-11 relative; 8-bit scales are rounded up, exactly <= 1).

Usage: python3 tests/ref/make_gptq8_golden.py > tests/golden/gptq8_packing.txt
       python3 tests/ref/make_gptq8_golden.py --check OUT --source SRC
Needs only numpy.
"""
import argparse
import json
import struct
import sys

import numpy as np


def fp16_up(x):
    h = np.float16(x)
    if np.float32(h) < np.float32(x):
        h = np.nextafter(h, np.float16(np.inf))
    return h


def pack_rows(q, bits):
    """q uint [k][n] -> int32 [k*bits/32][n] (AutoGPTQ pack order)."""
    per = 32 // bits
    k, n = q.shape
    out = np.zeros((k // per, n), dtype=np.uint32)
    for i in range(k // per):
        for j in range(per):
            out[i] |= q[i * per + j].astype(np.uint32) << np.uint32(bits * j)
    return out.view(np.int32)


def pack_cols(z, bits):
    """z uint [g][n] -> int32 [g][n*bits/32]."""
    per = 32 // bits
    g, n = z.shape
    out = np.zeros((g, n // per), dtype=np.uint32)
    for i in range(n // per):
        for j in range(per):
            out[:, i] |= z[:, i * per + j].astype(np.uint32) << np.uint32(bits * j)
    return out.view(np.int32)


def unpack_rows(qw, bits):
    per = 32 // bits
    u = qw.view(np.uint32)
    rows = [(u >> np.uint32(bits * j)) & np.uint32((1 << bits) - 1) for j in range(per)]
    return np.stack(rows, axis=1).reshape(u.shape[0] * per, u.shape[1]).astype(np.int64)


def unpack_cols(qz, bits):
    per = 32 // bits
    u = qz.view(np.uint32)
    cols = [(u >> np.uint32(bits * j)) & np.uint32((1 << bits) - 1) for j in range(per)]
    return np.stack(cols, axis=2).reshape(u.shape[0], u.shape[1] * per).astype(np.int64)


def dequant(qw, qz, sc, g_idx, bits):
    q = unpack_rows(qw, bits)                 # [k][n]
    z = unpack_cols(qz, bits) + 1             # [g][n]
    s = sc.astype(np.float32)                 # [g][n]
    return ((q - z[g_idx]).astype(np.float32) * s[g_idx]).T   # [n][k]


def golden():
    n, k = 8, 32
    rng = np.random.default_rng(20261130)
    w = (rng.standard_normal((n, k)) * rng.uniform(0.01, 3.0, (n, 1))).astype(np.float32)
    w[3, 5] = 0.0
    s = np.array([fp16_up(np.float32(np.abs(r).max() / np.float32(127.0))) for r in w])
    q = np.clip(np.rint(w / s.astype(np.float32)[:, None]), -127, 127).astype(np.int64)
    qu = (q + 128).T.astype(np.uint32)        # [k][n]
    qw = pack_rows(qu, 8)
    qz = pack_cols(np.full((1, n), 127, dtype=np.uint32), 8)
    sc = s.astype(np.float16).reshape(1, n)
    deq = dequant(qw, qz, sc, np.zeros(k, dtype=np.int64), 8)
    out = ["# dsq golden: 8-bit per-channel GPTQ v1 packing, by tests/ref/make_gptq8_golden.py",
           "# numpy %s" % np.__version__, "%d %d" % (n, k)]
    out.append("qweight " + " ".join(str(int(v)) for v in qw.ravel()))
    out.append("qzeros " + " ".join(str(int(v)) for v in qz.ravel()))
    out.append("scales " + " ".join(str(int(v)) for v in sc.view(np.uint16).ravel()))
    out.append("deq " + " ".join("%.9g" % v for v in deq.ravel()))
    out.append("w " + " ".join("%.9g" % v for v in w.ravel()))
    print("\n".join(out))


def read_st(path):
    with open(path, "rb") as f:
        (hl,) = struct.unpack("<Q", f.read(8))
        hdr = json.loads(f.read(hl))
        base = 8 + hl
        data = f.read()
    dt = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "BF16": np.uint16}
    out = {}
    for name, e in hdr.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype=dt[e["dtype"]]).reshape(e["shape"])
    del base
    return out


def check(out_dir, src_dir):
    t = read_st(out_dir + "/model.safetensors")
    src = read_st(src_dir + "/model.safetensors") if src_dir else {}
    worst, count = 0.0, {4: 0, 8: 0}
    for name in sorted(t):
        if not name.endswith(".qweight"):
            continue
        base = name[: -len(".qweight")]
        qw, qz, sc, gi = (t[base + s] for s in (".qweight", ".qzeros", ".scales", ".g_idx"))
        k, n = gi.shape[0], qw.shape[1]
        bits = 32 * qw.shape[0] // k
        count[bits] += 1
        w = dequant(qw, qz, sc, gi.astype(np.int64), bits)
        if base + ".weight" in src:
            ref = src[base + ".weight"].astype(np.float32)
            half = sc.astype(np.float32)[gi.astype(np.int64)].T / 2   # [n][k]
            err = np.abs(w - ref) / np.maximum(half, 1e-30)
            worst = max(worst, float(err.max()))
    print("4-bit tensors %d, 8-bit tensors %d, max |w_deq - w| / (s/2) = %.4f"
          % (count[4], count[8], worst))
    return 0 if worst <= 1.02 else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--check")
    ap.add_argument("--source")
    a = ap.parse_args()
    if a.check:
        sys.exit(check(a.check, a.source))
    golden()
