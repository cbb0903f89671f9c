#!/usr/bin/env python3
"""Paired comparison of two models' per-token NLL on the same text.

Input: files written by `dsq-perplexity --dump-nll` (one NLL in nats per
scored token, same text, ctx, stride/protocol, hence the same tokens in
the same order). Prints, for each file after the first (the base), the
mean NLL difference (file - base) in nats/token and its standard error by
batch means over contiguous blocks of --block tokens (neighbouring tokens'
NLLs are correlated, so a per-token SE would be too small), the resulting
z score, and the perplexity ratio exp(mean diff).

usage: paired_nll.py [--block 256] BASE.nll OTHER.nll...
"""
import math
import sys


def load(path):
    with open(path, encoding="ascii") as f:
        return [float(x) for x in f if x.strip()]


def main(argv):
    block = 256
    if len(argv) > 2 and argv[1] == "--block":
        block = int(argv[2])
        argv = argv[:1] + argv[3:]
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    base = load(argv[1])
    for path in argv[2:]:
        other = load(path)
        if len(other) != len(base):
            print(f"{path}: {len(other)} tokens, base has {len(base)}", file=sys.stderr)
            return 1
        d = [o - b for o, b in zip(other, base)]
        n_b = len(d) // block
        if n_b < 2:
            print(f"{path}: fewer than 2 blocks of {block} tokens", file=sys.stderr)
            return 1
        means = [sum(d[i * block:(i + 1) * block]) / block for i in range(n_b)]
        mu = sum(d) / len(d)
        mb = sum(means) / n_b
        var = sum((m - mb) ** 2 for m in means) / (n_b - 1)
        se = math.sqrt(var / n_b)
        z = mu / se if se > 0 else float("inf")
        print(f"{path} - {argv[1]}: mean dNLL {mu:+.5f} nats/token, SE {se:.5f} "
              f"({n_b} blocks of {block}), z {z:+.2f}, ppl ratio {math.exp(mu):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
