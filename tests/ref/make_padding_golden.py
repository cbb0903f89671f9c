#!/usr/bin/env python3
"""Golden file for dsq_pad_fit (engine/serve/padding.c): an independent least-squares
solution of the padding cost model t(b, B) = base(b) + k * ((B - b) / B)^1.8
by numpy.linalg.lstsq on the full design matrix [one-hot(b) | pad_ratio^1.8],
on synthetic step times that the model does NOT fit exactly (time linear in
the bucket B plus normal noise, as a CPU measures), so the test exercises the
general least-squares solution, not just exact recovery.

usage: python3 tests/ref/make_padding_golden.py tests/golden/padding_fit.txt
needs: numpy only
"""
import platform
import sys

import numpy as np

BUCKETS = [1, 2, 4, 8, 16, 32, 64]
BATCHES = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]


def main(out_path):
    rng = np.random.Generator(np.random.PCG64(5))
    samples = []
    for b in BATCHES:
        for B in BUCKETS:
            if B >= b:
                samples.append((b, B))
        if b not in BUCKETS:
            samples.append((b, b))
    t = np.array([20000.0 + 13000.0 * B + 500.0 * b for b, B in samples])
    t += rng.normal(0.0, 3000.0, size=len(samples))
    t = np.round(t, 3)                      # what the file stores is the input
    bs = sorted({b for b, _ in samples})
    x = np.array([((B - b) / B) ** 1.8 for b, B in samples])
    a = np.zeros((len(samples), len(bs) + 1))
    for i, (b, _) in enumerate(samples):
        a[i, bs.index(b)] = 1.0
    a[:, -1] = x
    coef, *_ = np.linalg.lstsq(a, t, rcond=None)
    res = t - a @ coef
    ss_res = float(res @ res)
    ss_tot = float(((t - t.mean()) ** 2).sum())
    within = 0.0
    for b in bs:
        sel = np.array([s[0] == b for s in samples])
        within += float(((t[sel] - t[sel].mean()) ** 2).sum())
    with open(out_path, "w") as f:
        f.write("# dsq golden file, format_version: 1\n")
        f.write("# what: least-squares fit of t(b, B) = base(b) + k * ((B - b) / B)^1.8 "
                "over synthetic step times t = 20000 + 13000*B + 500*b + N(0, 3000^2) us\n")
        f.write("# regenerate: python3 tests/ref/make_padding_golden.py "
                "tests/golden/padding_fit.txt\n")
        f.write("# tools: numpy %s, python %s, %s\n"
                % (np.__version__, platform.python_version(), platform.machine()))
        f.write("# reference: numpy.linalg.lstsq on the design matrix "
                "[one-hot(b) | pad_ratio^1.8], float64\n")
        f.write("# tolerance: |a-b| <= 1e-6 * max(1, |b|) (float64 solvers differ in "
                "rounding only)\n")
        f.write("# format: 'sample: b B us' per measurement; 'base: b us' per batch size "
                "(unclamped least-squares value); k_us, r2, r2_pad (1 - SS_res / "
                "SS_within_b), rms_us, max_abs_us\n")
        f.write("n_samples: %d\n" % len(samples))
        for (b, B), v in zip(samples, t):
            f.write("sample: %d %d %.3f\n" % (b, B, v))
        for b, c in zip(bs, coef[:-1]):
            f.write("base: %d %.9f\n" % (b, c))
        f.write("k_us: %.9f\n" % coef[-1])
        f.write("r2: %.12f\n" % (1.0 - ss_res / ss_tot))
        f.write("r2_pad: %.12f\n" % (1.0 - ss_res / within))
        f.write("rms_us: %.9f\n" % np.sqrt(ss_res / len(samples)))
        f.write("max_abs_us: %.9f\n" % np.abs(res).max())


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
