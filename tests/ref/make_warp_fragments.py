#!/usr/bin/env python3
"""Golden per-lane registers for the Ampere warp-level PTX the GPU simulator
is taught (tests/gpu/cudasim-8-ampere-warp.patch), from the PTX ISA's own
tables, written here independently of the simulator's code:

- mma.sync.aligned m16n8k16 / m16n8k8 (.row.col, f16 and bf16 inputs, f32
  and f16 accumulators, .dtype = .ctype as ptxas requires) and m16n8k32 (s8 / u8 inputs, s32 accumulators,
  with and without .satfinite): "Matrix Fragments for mma.m16n8k16 with
  floating point type", "... mma.m16n8k8", "... mma.m16n8k32" (groupID =
  %laneid >> 2, threadID_in_group = %laneid % 4). Inputs are drawn so every
  product and sum is exact in float64 (f16: k * 2^e, |k| <= 1024, e in
  -18..-4, subnormals included; bf16: |k| <= 128, e in -16..-4; f32 C:
  multiples of 2^-24), so D is the FP64 product A @ B + C rounded once to
  the destination type (numpy's float64 -> float16 / float32 conversions,
  round to nearest even). A GPU rounds inside its accumulation too; a run
  on one compares with a tolerance, the simulator must match exactly.
- ldmatrix.sync.aligned.m8n8.x1/.x2/.x4 with and without .trans: lane
  8m + r gives the address of row r of matrix m; lane l receives
  (row l/4, columns 2(l%4), 2(l%4)+1) of each matrix, transposed with
  .trans.
- cp.async.ca / .cg shared.global of 4, 8, 16 bytes with a src-size:
  bytes from src-size on are zero.
- lop3.b32 with immLut = F(0xF0, 0xCC, 0xAA).

usage: make_warp_fragments.py OUT (tests/golden/warp_fragments.txt)
Needs numpy only. Deterministic (seeded).
"""
import sys

import numpy as np

rng = np.random.default_rng(20261206)
LANES = 32


def f16_values(shape):
    k = rng.integers(-1024, 1025, size=shape)
    e = rng.integers(-18, -3, size=shape)
    return (k * np.exp2(e)).astype(np.float16)   # exact


def bf16_bits(x):
    """float64 values exact in bfloat16 -> their 16-bit patterns"""
    return (np.asarray(x, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint32)


def bf16_values(shape):
    k = rng.integers(-128, 129, size=shape)
    e = rng.integers(-16, -3, size=shape)
    v = k * np.exp2(e)
    assert np.all(bf16_bits(v) << 16 == np.asarray(v, np.float32).view(np.uint32))
    return v


def f32_values(shape):
    return (rng.integers(-(1 << 20), (1 << 20) + 1, size=shape) * 2.0 ** -24).astype(np.float32)


def half_bits(v):
    return np.asarray(v, dtype=np.float16).view(np.uint16).astype(np.uint32)


def f32_bits(v):
    return np.asarray(v, dtype=np.float32).view(np.uint32).astype(np.uint32)


def pack(elems, per_reg, bits):
    """elems[lane][i] (unsigned bit patterns) -> registers, element i of a
    register at bits (i % per_reg) * bits: 'low to high' in the ISA"""
    regs = np.zeros((LANES, elems.shape[1] // per_reg), dtype=np.uint64)
    for i in range(elems.shape[1]):
        regs[:, i // per_reg] |= (elems[:, i].astype(np.uint64) & ((1 << bits) - 1)) << (bits * (i % per_reg))
    return regs.astype(np.uint32)


# ---- the ISA's fragment tables: element i of a lane -> (row, col) ----
def a_map(kind, k, lane, i):
    g, t = lane >> 2, lane % 4
    if kind == "int":                      # m16n8k32 .s8/.u8, a0..a15
        row = g if (i < 4 or 8 <= i < 12) else g + 8
        col = t * 4 + (i & 3) + (16 if i >= 8 else 0)
    elif k == 16:                          # m16n8k16 .f16/.bf16, a0..a7
        row = g if (i < 2 or 4 <= i < 6) else g + 8
        col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
    else:                                  # m16n8k8 .f16, a0..a3
        row = g if i < 2 else g + 8
        col = t * 2 + (i & 1)
    return row, col


def b_map(kind, k, lane, i):
    g, t = lane >> 2, lane % 4
    if kind == "int":                      # b0..b7
        row = t * 4 + (i & 3) + (16 if i >= 4 else 0)
    elif k == 16:                          # b0..b3
        row = t * 2 + (i & 1) + (8 if i >= 2 else 0)
    else:                                  # b0, b1
        row = t * 2 + i
    return row, g


def c_map(lane, i):                        # c0..c3 of every shape here
    g, t = lane >> 2, lane % 4
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


def mma_case(out, k, dtype, atype, btype, ctype, sat=False):
    kind = "int" if atype in ("s8", "u8") else "fp"
    m, n = 16, 8
    if kind == "int":
        lo = {"s8": -128, "u8": 0}
        A = rng.integers(lo[atype], lo[atype] + 256, size=(m, k))
        B = rng.integers(lo[btype], lo[btype] + 256, size=(k, n))
        if sat:   # sums past the int32 range both ways
            C = rng.choice([2**31 - 5000, -2**31 + 5000], size=(m, n)) + rng.integers(-100, 100, size=(m, n))
        else:
            C = rng.integers(-(1 << 30), 1 << 30, size=(m, n))
        D = C.astype(object) + A.astype(object).dot(B.astype(object))
        if sat:
            D = np.clip(D, -2**31, 2**31 - 1)
        Dw = np.array([[int(x) & 0xffffffff for x in r] for r in D], dtype=np.uint64)
        ae = lambda v: np.uint32(int(v) & 0xff)
        ce = lambda v: np.uint32(int(v) & 0xffffffff)
        a_bits, c_bits, d_bits = 8, 32, 32
        aper = 4
    else:
        A = f16_values((m, k)).astype(np.float64) if atype == "f16" else bf16_values((m, k))
        B = f16_values((k, n)).astype(np.float64) if btype == "f16" else bf16_values((k, n))
        C = (f32_values((m, n)) if ctype == "f32" else f16_values((m, n))).astype(np.float64)
        exact = A @ B + C                                   # exact: see above
        Dv = exact.astype(np.float32) if dtype == "f32" else exact.astype(np.float16)
        conv = half_bits if atype == "f16" else bf16_bits
        ae = lambda v: np.uint32(conv(np.array([v]))[0])
        ce = (lambda v: np.uint32(f32_bits(np.array([v], np.float32))[0])) if ctype == "f32" \
            else (lambda v: np.uint32(half_bits(np.array([v]))[0]))
        Dw = (f32_bits(Dv) if dtype == "f32" else half_bits(Dv)).astype(np.uint64)
        a_bits, c_bits = 16, 32 if ctype == "f32" else 16
        d_bits = 32 if dtype == "f32" else 16
        aper = 2
    na, nb = m * k // LANES, k * n // LANES
    ea = np.zeros((LANES, na), dtype=np.uint32)
    eb = np.zeros((LANES, nb), dtype=np.uint32)
    ec = np.zeros((LANES, 4), dtype=np.uint32)
    ed = np.zeros((LANES, 4), dtype=np.uint32)
    for lane in range(LANES):
        for i in range(na):
            ea[lane, i] = ae(A[a_map(kind, k, lane, i)])
        for i in range(nb):
            eb[lane, i] = ae(B[b_map(kind, k, lane, i)])
        for i in range(4):
            ec[lane, i] = ce(C[c_map(lane, i)])
            ed[lane, i] = np.uint32(Dw[c_map(lane, i)])
    ra, rb = pack(ea, aper, a_bits), pack(eb, aper, a_bits)
    rc = pack(ec, 32 // c_bits, c_bits)
    rd = pack(ed, 32 // d_bits, d_bits)
    name = "mma.m16n8k%d%s.%s.%s.%s.%s" % (k, ".satfinite" if sat else "", dtype, atype, btype, ctype)
    out.append("case %s %d %d %d %d" % (name, ra.shape[1], rb.shape[1], rc.shape[1], rd.shape[1]))
    for lane in range(LANES):
        ins = list(ra[lane]) + list(rb[lane]) + list(rc[lane])
        out.append(" ".join("%08x" % w for w in ins) + " | " + " ".join("%08x" % w for w in rd[lane]))


def ldmatrix_case(out, num, trans):
    # shared image: 32 slots of 8 b16; lane L points at slot slot[L]
    mem = rng.integers(0, 1 << 16, size=(32, 8)).astype(np.uint32)
    slot = rng.permutation(32)
    out.append("case ldmatrix.x%d%s %d" % (num, ".trans" if trans else "", num))
    out.append("mem " + " ".join("%08x" % (mem[s, 2 * j] | mem[s, 2 * j + 1] << 16)
                                 for s in range(32) for j in range(4)))
    for lane in range(LANES):
        regs = []
        for mtx in range(num):
            rows = mem[[slot[8 * mtx + r] for r in range(8)]]     # the 8x8 matrix
            if trans:
                rows = rows.T
            r, c = lane // 4, 2 * (lane % 4)
            regs.append(int(rows[r, c]) | int(rows[r, c + 1]) << 16)
        out.append("%08x | " % slot[lane] + " ".join("%08x" % w for w in regs))


def cp_async_case(out, cache, size):
    # global image: 32 lanes x 16 bytes; lane L copies its 16-byte slot
    # src[L] into its own shared slot L (pre-filled with 0xA5)
    gmem = rng.integers(0, 256, size=(32, 16)).astype(np.uint8)
    src = rng.permutation(32)
    out.append("case cp.async.%s.%d" % (cache, size))
    out.append("mem " + " ".join("%08x" % int.from_bytes(bytes(gmem[s, 4 * j:4 * j + 4]), "little")
                                 for s in range(32) for j in range(4)))
    for lane in range(LANES):
        ss = int(rng.integers(0, size + 1)) if lane % 3 else size
        sh = np.full(16, 0xA5, dtype=np.uint8)
        sh[:size] = 0
        sh[:ss] = gmem[src[lane], :ss]
        words = [int.from_bytes(bytes(sh[4 * j:4 * j + 4]), "little") for j in range(4)]
        out.append("%08x %08x | " % (src[lane], ss) + " ".join("%08x" % w for w in words))


def lop3_case(out, lut):
    out.append("case lop3.%02x" % lut)
    for lane in range(LANES):
        a, b, c = (int(x) for x in rng.integers(0, 1 << 32, size=3))
        d = 0
        for bit in range(32):
            ia, ib, ic = a >> bit & 1, b >> bit & 1, c >> bit & 1
            # the truth table row of (a, b, c), as F(0xF0, 0xCC, 0xAA) builds it
            d |= (lut >> (ia * 4 + ib * 2 + ic) & 1) << bit
        out.append("%08x %08x %08x | %08x" % (a, b, c, d))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = ["# per-lane registers: inputs | expected outputs (hex); tests/ref/make_warp_fragments.py"]
    for d in ("f32", "f16"):   # ptxas wants .dtype == .ctype for these shapes
        mma_case(out, 16, d, "f16", "f16", d)
        mma_case(out, 8, d, "f16", "f16", d)
    mma_case(out, 16, "f32", "bf16", "bf16", "f32")
    for a in ("s8", "u8"):
        for b in ("s8", "u8"):
            mma_case(out, 32, "s32", a, b, "s32")
    mma_case(out, 32, "s32", "s8", "s8", "s32", sat=True)
    mma_case(out, 32, "s32", "u8", "u8", "s32", sat=True)
    for num in (1, 2, 4):
        for trans in (False, True):
            ldmatrix_case(out, num, trans)
    for cache, size in (("ca", 4), ("ca", 8), ("ca", 16), ("cg", 16)):
        cp_async_case(out, cache, size)
    for lut in (0xF0, 0xCC, 0xAA, 0x96, 0xE8, 0xF8, 0x6A, 0x1E, 0x00, 0xFF):
        lop3_case(out, lut)
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
