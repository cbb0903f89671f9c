#!/usr/bin/env python3
"""Tiny random-weight llama GGUFs in F16, Q4_0 and Q4_1, for the CUDA-vs-CPU
model checks (tests/gpu/test_cuda_model.c) of the formats users download.

Writes OUT_DIR/llama-tiny.{f16,q4_0,q4_1}.gguf (default models/llama-tiny-gguf,
git-ignored) from one set of random weights (numpy, seed 7): 2 layers,
n_embd 64, 4 heads of 16 (2 KV heads: GQA), n_ff 128, vocab 256 (every
matrix row a multiple of 32, so every matrix takes the file's type, as
llama-quantize would give a model of such shapes), norms F32. Quantization
is gguf-py's (gguf.quants.quantize: the numpy twin of ggml's Q4_0/Q4_1
reference quantizers, so the files hold what llama.cpp writes, not dsq's
packing). Metadata: llama.* keys of the GGUF spec
(github.com/ggml-org/ggml docs/gguf.md); no tokenizer (the checks feed
token ids). Needs numpy + gguf (tests/ref/requirements-model.txt, in .venv).
Prints one line per file with its sha256.

  .venv/bin/python tests/ref/make_llama_tiny_gguf.py [OUT_DIR]
"""
import hashlib
import os
import sys

import numpy as np
import gguf

D, L, H, HKV, FF, V, CTX = 64, 2, 4, 2, 128, 256, 256
HD = D // H


def weights():
    rng = np.random.default_rng(7)

    def mat(n, k, scale):
        return (rng.standard_normal((n, k)) * scale).astype(np.float32)

    t = {"token_embd.weight": mat(V, D, 1.0),
         "output_norm.weight": (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32),
         "output.weight": mat(V, D, 0.2)}
    for l in range(L):
        p = "blk.%d." % l
        t[p + "attn_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32)
        t[p + "attn_q.weight"] = mat(H * HD, D, 0.25)
        t[p + "attn_k.weight"] = mat(HKV * HD, D, 0.25)
        t[p + "attn_v.weight"] = mat(HKV * HD, D, 0.25)
        t[p + "attn_output.weight"] = mat(D, H * HD, 0.25)
        t[p + "ffn_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32)
        t[p + "ffn_gate.weight"] = mat(FF, D, 0.25)
        t[p + "ffn_up.weight"] = mat(FF, D, 0.25)
        t[p + "ffn_down.weight"] = mat(D, FF, 0.18)
    return t


QTYPES = {"f16": (gguf.GGMLQuantizationType.F16, gguf.LlamaFileType.MOSTLY_F16),
          "q4_0": (gguf.GGMLQuantizationType.Q4_0, gguf.LlamaFileType.MOSTLY_Q4_0),
          "q4_1": (gguf.GGMLQuantizationType.Q4_1, gguf.LlamaFileType.MOSTLY_Q4_1)}


def write(path, tensors, kind):
    qt, ft = QTYPES[kind]
    w = gguf.GGUFWriter(None, "llama")
    for name, data in tensors.items():
        t = gguf.GGMLQuantizationType.F32 if data.ndim == 1 else qt
        w.add_tensor(name, gguf.quants.quantize(data, t), raw_dtype=t)
    w.add_name("llama-tiny-" + kind)
    w.add_block_count(L)
    w.add_context_length(CTX)
    w.add_embedding_length(D)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HD)
    w.add_vocab_size(V)
    w.add_file_type(ft)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tmp = path + ".tmp"                 # readers never see a half-written file
    w.write_header_to_file(path=tmp)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, path)
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "models/llama-tiny-gguf"
    os.makedirs(out, exist_ok=True)
    t = weights()
    for kind in QTYPES:
        path = os.path.join(out, "llama-tiny.%s.gguf" % kind)
        print("wrote %s sha256=%s" % (path, write(path, t, kind)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
