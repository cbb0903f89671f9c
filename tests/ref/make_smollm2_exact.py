#!/usr/bin/env python3
"""Exact (float64) reference logits of SmolLM2-135M-Instruct Q4_1.

An independent reference for dsq's forward pass: the GGUF weights are
dequantized with the `gguf` package's own reference dequantizer (the format's
definition: w = d*q + m for Q4_1, d*q for Q8_0), and the llama forward pass
(RMSNorm, adjacent-pair RoPE as GGUF llama uses, GQA attention, SwiGLU, tied
lm_head) is evaluated in float64 with numpy, with no activation quantization
and no fp16 rounding anywhere. llama.cpp's own Q4_1 x Q8_1 kernels and fp16
attention move these logits by up to ~0.6 on this model (see
docs/benchmarks.md), which is why the 1e-2 relative check
is made against this exact reference, and llama.cpp's logits are checked
with a tolerance derived from its own distance to it.

Writes tests/golden/smollm2_logits_exact.txt in the same block format as
smollm2_logits.txt (pos / argmax / top32 / subset), for the same prompt ids.

usage: python3 tests/ref/make_smollm2_exact.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf
requirements: tests/ref/requirements-exact.txt (numpy, gguf)
"""
import argparse
import hashlib
import sys

import gguf
import numpy as np

PROMPT_IDS = [504, 2365, 6354, 16438, 27003, 690, 260, 23790]  # as in smollm2_logits.txt
STRIDE, COUNT = 48, 1024


def exact_logits(model, ids):
    """float64 logits [len(ids), n_vocab] of the llama GGUF `model` for ids
    (one causal batch from position 0), weights dequantized by gguf-py."""
    r = gguf.GGUFReader(model)
    T = {t.name: t for t in r.tensors}

    def W(name):
        t = T[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)

    def kv(key):
        return r.fields[key].contents()

    d = int(kv("llama.embedding_length"))
    L = int(kv("llama.block_count"))
    nh = int(kv("llama.attention.head_count"))
    nkv = int(kv("llama.attention.head_count_kv"))
    eps = float(kv("llama.attention.layer_norm_rms_epsilon"))
    theta = float(kv("llama.rope.freq_base"))
    hd = d // nh
    n = len(ids)
    emb = W("token_embd.weight")
    out_w = W("output.weight") if "output.weight" in T else emb
    x = emb[ids]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(v):
        a_, b_ = v[..., 0::2], v[..., 1::2]
        out = np.empty_like(v)
        out[..., 0::2] = a_ * cos[:, None, :] - b_ * sin[:, None, :]
        out[..., 1::2] = a_ * sin[:, None, :] + b_ * cos[:, None, :]
        return out

    def rms(v, w):
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w

    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(L):
        p = f"blk.{l}."
        h = rms(x, W(p + "attn_norm.weight"))
        q = rope((h @ W(p + "attn_q.weight").T).reshape(n, nh, hd))
        k = rope((h @ W(p + "attn_k.weight").T).reshape(n, nkv, hd))
        v = (h @ W(p + "attn_v.weight").T).reshape(n, nkv, hd)
        att = np.zeros((n, nh, hd))
        for hh in range(nh):
            g = hh // (nh // nkv)
            s = q[:, hh, :] @ k[:, g, :].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att[:, hh, :] = s @ v[:, g, :]
        x = x + att.reshape(n, -1) @ W(p + "attn_output.weight").T
        h = rms(x, W(p + "ffn_norm.weight"))
        gt = h @ W(p + "ffn_gate.weight").T
        up = h @ W(p + "ffn_up.weight").T
        x = x + (gt / (1 + np.exp(-gt)) * up) @ W(p + "ffn_down.weight").T
    return rms(x, W("output_norm.weight")) @ out_w.T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", default="tests/golden/smollm2_logits_exact.txt")
    a = ap.parse_args()
    ids = PROMPT_IDS
    n = len(ids)
    lg = exact_logits(a.model, ids)

    sha = hashlib.sha256(open(a.model, "rb").read()).hexdigest()
    with open(a.out, "w") as f:
        f.write("# dsq golden file, format_version: 1\n")
        f.write("# what: SmolLM2-135M-Instruct Q4_1 logits, exact float64 forward of the dequantized weights\n")
        f.write("# regenerate: python3 tests/ref/make_smollm2_exact.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf\n")
        f.write(f"# model: {a.model.split('/')[-1]} (sha256 {sha})\n")
        f.write(f"# tools: numpy {np.__version__}, gguf {getattr(gguf, '__version__', '0.19.0')}, python {sys.version.split()[0]}\n")
        f.write("# tolerance: |ours - exact| <= 1e-2 * max|exact logit at that position| (int8 activations and fp16 KV in dsq)\n")
        f.write("# format: as smollm2_logits.txt: prompt_ids, then per position pos/argmax/top32/subset\n")
        f.write("prompt_ids: " + " ".join(map(str, ids)) + "\n")
        f.write(f"n_positions: {n}\nsubset_stride: {STRIDE}\nsubset_count: {COUNT}\n")
        for p in range(n):
            row = lg[p]
            top = np.argsort(-row, kind="stable")[:32]
            f.write(f"pos: {p}\nargmax: {top[0]} {row[top[0]]:.9g}\n")
            f.write("top32: " + " ".join(f"{i}:{row[i]:.9g}" for i in top) + "\n")
            f.write("subset: " + " ".join(f"{row[i * STRIDE]:.9g}" for i in range(COUNT)) + "\n")


if __name__ == "__main__":
    main()
