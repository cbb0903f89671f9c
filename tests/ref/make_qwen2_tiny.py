#!/usr/bin/env python3
"""Tiny random-weight Qwen2 model (FP32 Hugging Face directory) and its golden logits.

Mode (a), default: write config.json + model.safetensors to OUT_DIR (default
models/qwen2-tiny/, git-ignored). Needs only numpy + safetensors
(tests/ref/requirements-model.txt); the C tests run this before they load the
model. Prints the sha256 of model.safetensors.
Mode (b), --golden: also load the directory with transformers'
Qwen2ForCausalLM (torch CPU, float32) and write tests/golden/qwen2_tiny_logits.txt
(needs tests/ref/requirements-golden.txt).

Why built this way: random weights exercise every term of the Qwen2 block
(QKV bias, GQA, NeoX-style RoPE, RMSNorm, SwiGLU, untied lm_head) at a size
where the full logits fit in a text file; the weights are scaled (~1/sqrt(fan_in),
embeddings N(0,1)) so logits spread over a few units and greedy picks are not
near-ties. No tokenizer: token ids are arbitrary.

  python3 tests/ref/make_qwen2_tiny.py [OUT_DIR]
  tests/ref/.venv/bin/python tests/ref/make_qwen2_tiny.py --golden [OUT_DIR]
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_common import WeightGen, write_model, golden  # noqa: E402

SEED = 20240601
HIDDEN = 64
INTER = 172
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
VOCAB = 512
PROMPT_IDS = [1, 17, 300, 42, 511, 0, 256, 99, 7, 128, 64, 450, 3, 222, 381, 15]
N_NEW = 16

CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": VOCAB,
    "hidden_size": HIDDEN,
    "intermediate_size": INTER,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": LAYERS,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}


def make_tensors():
    g = WeightGen(SEED)
    g.normal("model.embed_tokens.weight", (VOCAB, HIDDEN), 1.0)
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        g.uniform(p + "input_layernorm.weight", (HIDDEN,), 0.8, 1.2)
        s = 1.0 / math.sqrt(HIDDEN)
        g.normal(p + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN), s)
        g.normal(p + "self_attn.q_proj.bias", (HEADS * HEAD_DIM,), 0.5)
        g.normal(p + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), s)
        g.normal(p + "self_attn.k_proj.bias", (KV_HEADS * HEAD_DIM,), 0.5)
        g.normal(p + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), s)
        g.normal(p + "self_attn.v_proj.bias", (KV_HEADS * HEAD_DIM,), 0.5)
        g.normal(p + "self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM),
                 1.0 / math.sqrt(HEADS * HEAD_DIM))
        g.uniform(p + "post_attention_layernorm.weight", (HIDDEN,), 0.8, 1.2)
        g.normal(p + "mlp.gate_proj.weight", (INTER, HIDDEN), s)
        g.normal(p + "mlp.up_proj.weight", (INTER, HIDDEN), s)
        g.normal(p + "mlp.down_proj.weight", (HIDDEN, INTER), 1.0 / math.sqrt(INTER))
    g.uniform("model.norm.weight", (HIDDEN,), 0.8, 1.2)
    g.normal("lm_head.weight", (VOCAB, HIDDEN), 2.0 / math.sqrt(HIDDEN))
    return g.tensors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", nargs="?", default="models/qwen2-tiny")
    ap.add_argument("--golden", action="store_true",
                    help="also write the golden logits with transformers")
    ap.add_argument("--golden-out", default="tests/golden/qwen2_tiny_logits.txt")
    args = ap.parse_args()
    digest = write_model(args.out_dir, CONFIG, make_tensors())
    print("wrote %s (model.safetensors sha256 %s)" % (args.out_dir, digest))
    if args.golden:
        out, tops, _ = golden(
            args.out_dir, "Qwen2ForCausalLM", PROMPT_IDS, N_NEW, args.golden_out,
            "tests/ref/.venv/bin/python tests/ref/make_qwen2_tiny.py --golden models/qwen2-tiny",
            "tiny random-weight Qwen2 (hidden %d, inter %d, %d layers, %d heads, %d kv heads,"
            " vocab %d, QKV bias, untied lm_head), FP32 logits of a 16-token prompt and a"
            " greedy continuation of %d tokens" % (HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, VOCAB, N_NEW),
            digest,
            ["logits: |a-b| <= 1e-4 * max(1, |b|) for an FP32 implementation",
             "output_ids: exact (min_gap below tells the smallest top-2 margin)"],
            ["model: regenerate first with: python3 tests/ref/make_qwen2_tiny.py models/qwen2-tiny"
             " (numpy + safetensors only); its model.safetensors must have model_sha256"])
        print("golden: %s output_ids=%s min_gap=%.4g" % (
            args.golden_out, out, min(a[1] - b[1] for a, b in tops)))


if __name__ == "__main__":
    main()
