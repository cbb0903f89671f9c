#!/usr/bin/env python3
"""Tiny random-weight DeepSeek-V2/V3 models (MLA + MoE, FP32 HF directories) and golden logits.

Variants (each its own directory OUT_ROOT/<name>/ and golden file
tests/golden/deepseek2_tiny_<name>_logits.txt):
  v2_lite     DeepseekV2ForCausalLM, no q_lora_rank (plain q_proj), softmax gate,
              topk_method greedy, 8 experts top-2, 2 shared experts, layer 0 dense
  v2_group    DeepseekV2ForCausalLM, q_lora_rank 24, softmax gate,
              group_limited_greedy (4 groups, top 2 groups), 16 experts top-4,
              routed_scaling_factor 2.0
  v3          DeepseekV3ForCausalLM, q_lora_rank 24, sigmoid gate with
              e_score_correction_bias (noaux_tc: 4 groups scored by their top-2
              sum, top 2 groups), 16 experts top-4, norm_topk_prob, scaling 2.5,
              YaRN rope scaling with mscale_all_dim (as DeepSeek-V3's config)

Mode (a), default: write config.json + model.safetensors of every variant
under OUT_ROOT (default models/deepseek2-tiny/, git-ignored); numpy +
safetensors only (tests/ref/requirements-model.txt).
Mode (b), --golden: also run transformers (torch CPU, float32, eager) and write
the golden files (tests/ref/requirements-golden.txt).

Why built this way: three small configs cover the code paths a DeepSeek
implementation must get right: MLA with and without the q low-rank path,
decoupled RoPE (interleaved pairs, as DeepSeek's checkpoints use), dense first
layer then MoE with shared experts, the three routing rules. The gate inputs
are scaled so expert choices are not near-ties; the golden files also list
the chosen experts per layer and position for debugging. V2 configs keep
norm_topk_prob false and no rope scaling, because transformers' V2 port
ignores both (the original DeepSeek-V2 code does not); V3's correction bias is
kept positive because transformers masks unselected groups with 0 where
DeepSeek's code uses -inf (the same choice while every biased score is > 0).

  python3 tests/ref/make_deepseek2_tiny.py [OUT_ROOT] [--only NAME]
  tests/ref/.venv/bin/python tests/ref/make_deepseek2_tiny.py --golden [OUT_ROOT]
"""
import argparse
import math
import os
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_common import WeightGen, write_model, golden  # noqa: E402

VOCAB = 512
PROMPT_IDS = [1, 17, 300, 42, 511, 0, 256, 99, 7, 128, 64, 450, 3, 222, 381, 15]
N_NEW = 16

BASE = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "use_cache": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
}

VARIANTS = {
    "v2_lite": dict(BASE, **{
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "q_lora_rank": None, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "n_shared_experts": 2, "topk_method": "greedy", "n_group": 1, "topk_group": 1,
        "norm_topk_prob": False, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    }),
    "v2_group": dict(BASE, **{
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "hidden_size": 128, "num_hidden_layers": 2, "intermediate_size": 256,
        "q_lora_rank": 24, "n_routed_experts": 16, "num_experts_per_tok": 4,
        "n_shared_experts": 1, "topk_method": "group_limited_greedy", "n_group": 4,
        "topk_group": 2, "norm_topk_prob": False, "routed_scaling_factor": 2.0,
        "scoring_func": "softmax",
    }),
    "v3": dict(BASE, **{
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "q_lora_rank": 24, "n_routed_experts": 16, "num_experts_per_tok": 4,
        "n_shared_experts": 1, "topk_method": "noaux_tc", "n_group": 4, "topk_group": 2,
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "rope_interleave": True,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    }),
}

# Per-variant seed: picked (by trying a few) so that neither the greedy
# continuation nor any expert choice is a near-tie (see min_gap, route_min_margin).
SEEDS = {"v2_lite": 20240600, "v2_group": 20240604, "v3": 20240600}

CLS = {"deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}


def make_tensors(name, c):
    g = WeightGen(SEEDS[name] + zlib.crc32(name.encode()) % 1000)
    h = c["hidden_size"]
    nh = c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    kvl = c["kv_lora_rank"]
    ql = c["q_lora_rank"]

    def mlp(prefix, inter):
        g.normal(prefix + "gate_proj.weight", (inter, h), 1.0 / math.sqrt(h))
        g.normal(prefix + "up_proj.weight", (inter, h), 1.0 / math.sqrt(h))
        g.normal(prefix + "down_proj.weight", (h, inter), 1.0 / math.sqrt(inter))

    g.normal("model.embed_tokens.weight", (VOCAB, h), 1.0)
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        g.uniform(p + "input_layernorm.weight", (h,), 0.8, 1.2)
        a = p + "self_attn."
        if ql is None:
            g.normal(a + "q_proj.weight", (nh * qk, h), 1.0 / math.sqrt(h))
        else:
            g.normal(a + "q_a_proj.weight", (ql, h), 1.0 / math.sqrt(h))
            g.uniform(a + "q_a_layernorm.weight", (ql,), 0.8, 1.2)
            g.normal(a + "q_b_proj.weight", (nh * qk, ql), 1.0 / math.sqrt(ql))
        g.normal(a + "kv_a_proj_with_mqa.weight", (kvl + c["qk_rope_head_dim"], h), 1.0 / math.sqrt(h))
        g.uniform(a + "kv_a_layernorm.weight", (kvl,), 0.8, 1.2)
        g.normal(a + "kv_b_proj.weight", (nh * (c["qk_nope_head_dim"] + c["v_head_dim"]), kvl),
                 1.0 / math.sqrt(kvl))
        g.normal(a + "o_proj.weight", (h, nh * c["v_head_dim"]), 1.0 / math.sqrt(nh * c["v_head_dim"]))
        g.uniform(p + "post_attention_layernorm.weight", (h,), 0.8, 1.2)
        if i < c["first_k_dense_replace"]:
            mlp(p + "mlp.", c["intermediate_size"])
        else:
            ne = c["n_routed_experts"]
            # gate std 3/sqrt(h): router logits of std ~3 spread the expert scores
            g.normal(p + "mlp.gate.weight", (ne, h), 3.0 / math.sqrt(h))
            if c["model_type"] == "deepseek_v3":
                g.uniform(p + "mlp.gate.e_score_correction_bias", (ne,), 0.0, 0.3)
            for e in range(ne):
                mlp(p + "mlp.experts.%d." % e, c["moe_intermediate_size"])
            mlp(p + "mlp.shared_experts.", c["moe_intermediate_size"] * c["n_shared_experts"])
    g.uniform("model.norm.weight", (h,), 0.8, 1.2)
    g.normal("lm_head.weight", (VOCAB, h), 2.0 / math.sqrt(h))
    return g.tensors


def route_margin(c, tensors, name, x):
    """Smallest score margin, over tokens, between the last chosen and the first
    rejected candidate at each selection stage (groups, then experts), computed
    here in float64 from the gate input x [n_tokens, hidden]. A margin near 0
    means a rounding difference could route a token to another expert."""
    import numpy as np
    w = tensors[name + ".weight"].astype(np.float64)
    logits = x.astype(np.float64) @ w.T
    k, ne = c["num_experts_per_tok"], c["n_routed_experts"]
    ng, tg = c["n_group"], c["topk_group"]
    if c["scoring_func"] == "sigmoid":
        choice = 1.0 / (1.0 + np.exp(-logits)) + tensors[name + ".e_score_correction_bias"]
    else:
        e = np.exp(logits - logits.max(-1, keepdims=True))
        choice = e / e.sum(-1, keepdims=True)
    margins = []
    for row in choice:
        allowed = row
        if c["topk_method"] in ("group_limited_greedy", "noaux_tc"):
            grp = row.reshape(ng, ne // ng)
            if c["topk_method"] == "noaux_tc":
                gs = np.sort(grp, -1)[:, -2:].sum(-1)
            else:
                gs = grp.max(-1)
            o = np.sort(gs)[::-1]
            margins.append(o[tg - 1] - o[tg])
            keep = np.argsort(-gs)[:tg]
            allowed = np.concatenate([grp[gi] for gi in keep])
        o = np.sort(allowed)[::-1]
        margins.append(o[k - 1] - o[k])
    return float(min(margins))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_root", nargs="?", default="models/deepseek2-tiny")
    ap.add_argument("--only", choices=sorted(VARIANTS), default=None)
    ap.add_argument("--golden", action="store_true")
    ap.add_argument("--golden-dir", default="tests/golden")
    args = ap.parse_args()
    for name in sorted(VARIANTS):
        if args.only and name != args.only:
            continue
        c = VARIANTS[name]
        out_dir = os.path.join(args.out_root, name)
        tensors = make_tensors(name, c)
        digest = write_model(out_dir, c, tensors)
        print("wrote %s (model.safetensors sha256 %s)" % (out_dir, digest))
        if not args.golden:
            continue
        gpath = os.path.join(args.golden_dir, "deepseek2_tiny_%s_logits.txt" % name)
        out, tops, _ = golden(
            out_dir, CLS[c["model_type"]], PROMPT_IDS, N_NEW, gpath,
            "tests/ref/.venv/bin/python tests/ref/make_deepseek2_tiny.py --golden"
            " models/deepseek2-tiny --only %s" % name,
            "tiny random-weight %s '%s' (MLA kv_lora_rank %d, q_lora_rank %s, %d layers,"
            " hidden %d, %d routed experts top-%d, %s routing), FP32 logits of a 16-token"
            " prompt and a greedy continuation of %d tokens" % (
                c["architectures"][0], name, c["kv_lora_rank"], c["q_lora_rank"],
                c["num_hidden_layers"], c["hidden_size"], c["n_routed_experts"],
                c["num_experts_per_tok"], c["topk_method"], N_NEW),
            digest,
            ["logits: |a-b| <= 1e-4 * max(1, |b|) for an FP32 implementation",
             "output_ids: exact (min_gap below tells the smallest top-2 margin)",
             "route: expert ids exact"],
            ["model: regenerate first with: python3 tests/ref/make_deepseek2_tiny.py"
             " models/deepseek2-tiny --only %s (numpy + safetensors only); its"
             " model.safetensors must have model_sha256" % name,
             "route lines: 'route: <gate module> <pos> <expert:weight ...>' for the prompt"
             " forward, experts in ascending id order, weight = final gate weight"
             " (after norm_topk_prob and routed_scaling_factor)",
             "route_min_margin lines: per gate, the smallest gap between the last chosen and"
             " the first rejected group/expert score over all positions of the last greedy"
             " forward (prompt + continuation), computed in float64; tiny => fragile routing"],
            record_routing=True,
            route_margin_fn=lambda n, x, c=c, t=tensors: route_margin(c, t, n, x))
        print("golden: %s output_ids=%s min_gap=%.4g" % (
            gpath, out, min(a[1] - b[1] for a, b in tops)))


if __name__ == "__main__":
    main()
