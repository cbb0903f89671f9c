#!/usr/bin/env python3
"""Tiny random-weight llama in GPTQ format with act-order (desc_act), and its golden logits.

Mode (a), default: write config.json + model.safetensors to OUT_DIR (default
models/gptq-tiny/, git-ignored): a LlamaForCausalLM whose seven linear layers
per block are GPTQ-packed 4-bit weights with a non-trivial g_idx. Needs only
numpy + safetensors (tests/ref/requirements-model.txt); the C tests run this
before they load the model. Prints the sha256 of model.safetensors.
Mode (b), --golden: dequantize every packed linear from the written tensors
with the GPTQ formula, W[c][r] = (q[r][c] - z[g_idx[r]][c]) * s[g_idx[r]][c],
save that as a plain FP32 checkpoint in a temporary directory, run
transformers' LlamaForCausalLM on it (torch CPU, float32) and write
tests/golden/gptq_tiny_logits.txt (needs tests/ref/requirements-golden.txt).

The format, as published by AutoGPTQ (v1 "gptq" checkpoint format, read the
same way by AutoGPTQ, ExLlama and vLLM's gptq kernels):
  qweight int32 [k/8][n]: input rows 8j..8j+7 of column c, row 8j+i in bits 4i..4i+3
  qzeros  int32 [groups][n/8]: column 8j+i in bits 4i..; stored value z - 1
          (masked to 4 bits, so z = stored + 1 on reading: z = 0 reads back as 16)
  scales  fp16 [groups][n]
  g_idx   int32 [k]: the group of each input row
Act-order: GPTQ quantizes the input rows in a permuted order (descending
Hessian diagonal) and groups are runs of group_size rows of THAT order, so
g_idx[perm[j]] = j // group_size. Inputs sharing one Hessian (q/k/v: the
attention norm's output; gate/up: the FFN norm's output) share one order, as
in a real checkpoint; o_proj and down_proj get their own. Here the order is
a random permutation (no calibration data) and each group is quantized by
round-to-nearest asymmetric min/max (GPTQ's error-feedback update changes
the values, not the format). Embeddings and lm_head stay FP32, as GPTQ
leaves them.

  python3 tests/ref/make_gptq_tiny.py [OUT_DIR]
  tests/ref/.venv/bin/python tests/ref/make_gptq_tiny.py --golden [OUT_DIR]
"""
import argparse
import math
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_common import WeightGen, write_model, golden  # noqa: E402

SEED = 20261130
HIDDEN = 128
INTER = 256
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
VOCAB = 512
GROUP = 32
PROMPT_IDS = [1, 17, 300, 42, 511, 0, 256, 99, 7, 128, 64, 450, 3, 222, 381, 15]
N_NEW = 16

BASE_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
QUANT_CONFIG = {
    "quant_method": "gptq",
    "bits": 4,
    "group_size": GROUP,
    "desc_act": True,
    "sym": False,
    "checkpoint_format": "gptq",
}


def quantize_gptq(w, perm):
    """w: float32 [n][k] (HF layout, n outputs), perm: int [k] quantization order.
    Returns the packed qweight, qzeros, scales, g_idx."""
    n, k = w.shape
    groups = k // GROUP
    g_idx = np.empty(k, dtype=np.int32)
    g_idx[perm] = np.arange(k, dtype=np.int32) // GROUP
    q = np.zeros((k, n), dtype=np.uint32)          # [input row][column]
    scales = np.zeros((groups, n), dtype=np.float16)
    zeros = np.zeros((groups, n), dtype=np.uint32)
    for g in range(groups):
        rows = perm[g * GROUP:(g + 1) * GROUP]
        blk = w[:, rows].astype(np.float64)          # [n][GROUP]
        lo = np.minimum(blk.min(axis=1), 0.0)
        hi = np.maximum(blk.max(axis=1), 0.0)
        s = ((hi - lo) / 15.0).astype(np.float16)
        s = np.where(s == 0, np.float16(1e-3), s)
        sd = s.astype(np.float64)
        z = np.clip(np.round(-lo / sd), 0, 15).astype(np.uint32)
        qq = np.clip(np.round(blk / sd[:, None]) + z[:, None], 0, 15).astype(np.uint32)
        q[rows, :] = qq.T
        scales[g] = s
        zeros[g] = z
    qweight = np.zeros((k // 8, n), dtype=np.uint32)
    for i in range(8):
        qweight |= q[i::8, :] << np.uint32(4 * i)
    stored = (zeros - 1) & 0xF                       # v1 offset, wraps z = 0 to 15
    qzeros = np.zeros((groups, n // 8), dtype=np.uint32)
    for i in range(8):
        qzeros |= stored[:, i::8] << np.uint32(4 * i)
    return qweight.view(np.int32), qzeros.view(np.int32), scales, g_idx


def dequantize_gptq(qweight, qzeros, scales, g_idx):
    """The GPTQ formula on the packed tensors: float32 [n][k]."""
    qw = qweight.view(np.uint32)
    k, n = qw.shape[0] * 8, qw.shape[1]
    q = np.zeros((k, n), dtype=np.int64)
    for i in range(8):
        q[i::8, :] = (qw >> np.uint32(4 * i)) & 0xF
    qz = qzeros.view(np.uint32)
    z = np.zeros((qz.shape[0], n), dtype=np.int64)
    for i in range(8):
        z[:, i::8] = ((qz >> np.uint32(4 * i)) & 0xF) + 1
    s = scales.astype(np.float64)
    w = (q - z[g_idx, :]) * s[g_idx, :]              # [k][n], exact in float64
    return np.ascontiguousarray(w.T.astype(np.float32))


LINEARS = [("self_attn.q_proj", HEADS * HEAD_DIM, HIDDEN, "attn"),
           ("self_attn.k_proj", KV_HEADS * HEAD_DIM, HIDDEN, "attn"),
           ("self_attn.v_proj", KV_HEADS * HEAD_DIM, HIDDEN, "attn"),
           ("self_attn.o_proj", HIDDEN, HEADS * HEAD_DIM, "o"),
           ("mlp.gate_proj", INTER, HIDDEN, "ffn"),
           ("mlp.up_proj", INTER, HIDDEN, "ffn"),
           ("mlp.down_proj", HIDDEN, INTER, "down")]


def make_tensors():
    g = WeightGen(SEED)
    g.normal("model.embed_tokens.weight", (VOCAB, HIDDEN), 1.0)
    out = {}
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        g.uniform(p + "input_layernorm.weight", (HIDDEN,), 0.8, 1.2)
        g.uniform(p + "post_attention_layernorm.weight", (HIDDEN,), 0.8, 1.2)
        perms = {}
        for name, n, k, site in LINEARS:
            w = g.normal(p + name + ".weight", (n, k), 1.0 / math.sqrt(k))
            if site not in perms:
                perms[site] = g.rng.permutation(k)
            del g.tensors[p + name + ".weight"]
            qw, qz, sc, gi = quantize_gptq(w, perms[site])
            out[p + name + ".qweight"] = qw
            out[p + name + ".qzeros"] = qz
            out[p + name + ".scales"] = sc
            out[p + name + ".g_idx"] = gi
    g.uniform("model.norm.weight", (HIDDEN,), 0.8, 1.2)
    g.normal("lm_head.weight", (VOCAB, HIDDEN), 2.0 / math.sqrt(HIDDEN))
    out.update(g.tensors)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default="models/gptq-tiny")
    ap.add_argument("--golden", action="store_true",
                    help="also write the golden logits with transformers")
    ap.add_argument("--golden-out", default="tests/golden/gptq_tiny_logits.txt")
    args = ap.parse_args()
    tensors = make_tensors()
    config = dict(BASE_CONFIG, quantization_config=QUANT_CONFIG)
    digest = write_model(args.out_dir, config, tensors)
    print("wrote %s (model.safetensors sha256 %s)" % (args.out_dir, digest))
    if not args.golden:
        return
    dense = {}
    for name, t in tensors.items():
        if name.endswith(".qweight"):
            b = name[:-len(".qweight")]
            gi = tensors[b + ".g_idx"]
            if np.all(gi == np.arange(gi.size) // GROUP):
                raise SystemExit("%s: g_idx is the identity: act-order not exercised" % b)
            dense[b + ".weight"] = dequantize_gptq(t, tensors[b + ".qzeros"],
                                                   tensors[b + ".scales"], gi)
        elif not name.endswith((".qzeros", ".scales", ".g_idx")):
            dense[name] = t
    with tempfile.TemporaryDirectory() as tmp:
        write_model(tmp, BASE_CONFIG, dense)
        out, tops, _ = golden(
            tmp, "LlamaForCausalLM", PROMPT_IDS, N_NEW, args.golden_out,
            "tests/ref/.venv/bin/python tests/ref/make_gptq_tiny.py --golden models/gptq-tiny",
            "tiny random-weight llama (hidden %d, inter %d, %d layers, %d heads, %d kv heads,"
            " vocab %d) with GPTQ 4-bit act-order linears (group %d, desc_act, asym, v1 zeros),"
            " logits of a 16-token prompt from the GPTQ-formula dequantized weights in FP32,"
            " and a greedy continuation of %d tokens"
            % (HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB, GROUP, N_NEW),
            digest,
            ["logits: |a-b| <= 1e-3 * max(1, |b|) for dsq with --activation-dtype fp32",
             "output_ids: exact (min_gap below tells the smallest top-2 margin)"],
            ["model: regenerate first with: python3 tests/ref/make_gptq_tiny.py models/gptq-tiny"
             " (numpy + safetensors only); its model.safetensors must have model_sha256"])
    print("golden: %s output_ids=%s min_gap=%.4g" % (
        args.golden_out, out, min(a[1] - b[1] for a, b in tops)))


if __name__ == "__main__":
    main()
