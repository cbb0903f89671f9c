#!/usr/bin/env python3
"""A tiny random-weight llama F16 GGUF whose every matrix row is a whole
number of 256-weight super-blocks, so llama-quantize --pure can store the
k-quant types (Q2_K..Q6_K, IQ4_XS) on every tensor: token embedding,
output, attention and FFN (SmolLM2's 576-wide rows cannot hold them; see
tests/ref/make_smollm2_quants.sh, which quantizes this file too).

2 layers, n_embd 256, 4 heads of 64 (2 KV heads: GQA), n_ff 512, vocab 512,
untied output; numpy PCG64 seed 11, normals scaled per matrix, norms F32
near 1. Metadata: llama.* keys of the GGUF spec; no tokenizer (the checks
feed token ids: tokenizer.ggml.model is llama.cpp's "no_vocab"). Needs numpy + gguf (tests/ref/requirements-model.txt).

  .venv/bin/python tests/ref/make_llama_k256_gguf.py OUT.gguf
"""
import os
import sys

import numpy as np
import gguf

D, L, H, HKV, FF, V, CTX = 256, 2, 4, 2, 512, 512, 512
HD = D // H


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    rng = np.random.Generator(np.random.PCG64(11))

    def mat(n, k, scale):
        return (rng.standard_normal((n, k)) * scale).astype(np.float32)

    def norm():
        return (1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32)

    t = {"token_embd.weight": mat(V, D, 1.0), "output_norm.weight": norm(),
         "output.weight": mat(V, D, 0.1)}
    for l in range(L):
        p = "blk.%d." % l
        t[p + "attn_norm.weight"] = norm()
        t[p + "attn_q.weight"] = mat(H * HD, D, 0.12)
        t[p + "attn_k.weight"] = mat(HKV * HD, D, 0.12)
        t[p + "attn_v.weight"] = mat(HKV * HD, D, 0.12)
        t[p + "attn_output.weight"] = mat(D, H * HD, 0.12)
        t[p + "ffn_norm.weight"] = norm()
        t[p + "ffn_gate.weight"] = mat(FF, D, 0.12)
        t[p + "ffn_up.weight"] = mat(FF, D, 0.12)
        t[p + "ffn_down.weight"] = mat(D, FF, 0.09)
    w = gguf.GGUFWriter(None, "llama")
    for name, data in t.items():
        if data.ndim == 1:
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data.astype(np.float16))
    w.add_name("llama-k256")
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
    # llama.cpp's "no vocabulary" model (LLAMA_VOCAB_TYPE_NONE): it loads
    # and evaluates token ids without a tokenizer
    w.add_tokenizer_model("no_vocab")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tmp = out + ".tmp"
    w.write_header_to_file(path=tmp)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
