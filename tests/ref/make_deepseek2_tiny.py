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

  v3_mtp      v3's weights exactly plus DeepSeek-V3's multi-token prediction
              module (num_nextn_predict_layers 1) as layer 3, named as the V3
              checkpoint names layer 61: embed_tokens, enorm, hnorm, eh_proj,
              a MoE decoder layer, shared_head.norm / shared_head.head (own
              random values, so a test can tell them from the main ones).
              Its golden (tests/golden/deepseek2_tiny_v3_mtp_logits.txt) is
              the MTP module's logits, not the main model's (v3's golden is):
              transformers has no MTP module, so the reference builds it from
              transformers' DeepseekV3DecoderLayer and RMSNorm as vLLM's
              deepseek_mtp.py wires it (mtp_golden below)

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

VARIANTS["v3_mtp"] = dict(VARIANTS["v3"], num_nextn_predict_layers=1)
# variants that are another one's weights plus an MTP module
MTP_OF = {"v3_mtp": "v3"}

# Per-variant seed: picked (by trying a few) so that neither the greedy
# continuation nor any expert choice is a near-tie (see min_gap, route_min_margin).
SEEDS = {"v2_lite": 20240600, "v2_group": 20240604, "v3": 20240600}
MTP_SEED = 20240700

CLS = {"deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}


def make_tensors(name, c):
    g = WeightGen(SEEDS[name] + zlib.crc32(name.encode()) % 1000)
    h = c["hidden_size"]
    g.normal("model.embed_tokens.weight", (VOCAB, h), 1.0)
    for i in range(c["num_hidden_layers"]):
        decoder_layer(g, c, i)
    g.uniform("model.norm.weight", (h,), 0.8, 1.2)
    g.normal("lm_head.weight", (VOCAB, h), 2.0 / math.sqrt(h))
    return g.tensors


def decoder_layer(g, c, i):
    """The tensors of decoder layer i (dense below first_k_dense_replace, else MoE)."""
    h = c["hidden_size"]
    nh = c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    kvl = c["kv_lora_rank"]
    ql = c["q_lora_rank"]

    def mlp(prefix, inter):
        g.normal(prefix + "gate_proj.weight", (inter, h), 1.0 / math.sqrt(h))
        g.normal(prefix + "up_proj.weight", (inter, h), 1.0 / math.sqrt(h))
        g.normal(prefix + "down_proj.weight", (h, inter), 1.0 / math.sqrt(inter))

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


def mtp_tensors(c):
    """DeepSeek-V3's MTP module as layer num_hidden_layers, with the V3
    checkpoint's names (model.layers.61.* there)."""
    g = WeightGen(MTP_SEED)
    h = c["hidden_size"]
    i = c["num_hidden_layers"]
    p = "model.layers.%d." % i
    g.normal(p + "embed_tokens.weight", (VOCAB, h), 1.0)
    g.uniform(p + "enorm.weight", (h,), 0.8, 1.2)
    g.uniform(p + "hnorm.weight", (h,), 0.8, 1.2)
    g.normal(p + "eh_proj.weight", (h, 2 * h), 1.0 / math.sqrt(2 * h))
    decoder_layer(g, c, i)
    g.uniform(p + "shared_head.norm.weight", (h,), 0.8, 1.2)
    g.normal(p + "shared_head.head.weight", (VOCAB, h), 2.0 / math.sqrt(h))
    return g.tensors


def mtp_golden(base_dir, c, tensors, gpath, digest):
    """The MTP module's logits over v3's prompt and greedy continuation.

    Semantics (vLLM's vllm/model_executor/models/deepseek_mtp.py, the
    implementation DeepSeek-V3's MTP is served with; the paper's eq. 21-23,
    arXiv:2412.19437): at position i (0 <= i < T-1) the input is
    eh_proj([enorm(E(t_{i+1})); hnorm(h_i)]), E the module's own embedding
    (zero at position 0, as vLLM masks it), h_i the main model's final hidden
    state after its final norm; one decoder layer (MLA + MoE, with its own KV
    over positions 0..i); then shared_head.norm and shared_head.head give
    logits for t_{i+2}. Built from transformers' own DeepseekV3DecoderLayer,
    DeepseekV3RMSNorm and rotary embedding; the main model is transformers'
    DeepseekV3ForCausalLM on v3's directory (the same main weights)."""
    import numpy as np
    import torch
    import transformers
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mdv3
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    model, info = transformers.DeepseekV3ForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:
        raise SystemExit("transformers did not load the weights as written: %s" % bad)
    model.eval()
    cfg = model.config
    ids = list(PROMPT_IDS)
    with torch.no_grad():
        for _ in range(N_NEW):
            row = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
            ids.append(int(torch.argmax(row)))
        out = model.model(torch.tensor([ids]), use_cache=False)
        hn = out.last_hidden_state[0]           # after model.norm: [T, d]
    T, d = len(ids), c["hidden_size"]
    L = c["num_hidden_layers"]
    p = "model.layers.%d." % L
    t = {k: torch.from_numpy(v) for k, v in tensors.items()}
    layer = mdv3.DeepseekV3DecoderLayer(cfg, layer_idx=L)
    sd = {k[len(p):]: v for k, v in t.items() if k.startswith(p) and not k[len(p):].startswith(
        ("embed_tokens", "enorm", "hnorm", "eh_proj", "shared_head"))}
    layer.load_state_dict(sd, strict=True)
    layer.eval()

    def rms(w):
        n = mdv3.DeepseekV3RMSNorm(d, eps=cfg.rms_norm_eps)
        n.weight.data.copy_(w)
        return n
    enorm, hnorm, snorm = rms(t[p + "enorm.weight"]), rms(t[p + "hnorm.weight"]), rms(
        t[p + "shared_head.norm.weight"])
    gate_in = {}
    hook = layer.mlp.gate.register_forward_hook(
        lambda _m, inp, _o: gate_in.__setitem__("x", inp[0].detach().numpy().reshape(-1, d)))
    with torch.no_grad():
        n = T - 1
        emb = t[p + "embed_tokens.weight"][torch.tensor(ids[1:])]
        emb[0] = 0
        x = torch.cat([enorm(emb), hnorm(hn[:n])], -1) @ t[p + "eh_proj.weight"].T
        pos = torch.arange(n)[None]
        pe = model.model.rotary_emb(x[None], pos)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        y = layer(x[None], attention_mask=mask, position_ids=pos, position_embeddings=pe)
        y = y[0] if isinstance(y, tuple) else y
        logits = (snorm(y[0]) @ t[p + "shared_head.head.weight"].T).numpy()
    hook.remove()
    gaps = [float(np.sort(r)[-1] - np.sort(r)[-2]) for r in logits]
    margin = route_margin(c, tensors, p + "mlp.gate", gate_in["x"])
    with open(gpath, "w", encoding="ascii", newline="\n") as f:
        f.write("# dsq golden file, format_version: 1\n")
        f.write("# what: the multi-token prediction module of the tiny DeepSeek-V3 'v3_mtp'"
                " (v3's weights + layer %d), FP32 logits at every position of v3's prompt and"
                " greedy continuation\n" % L)
        f.write("# regenerate: tests/ref/.venv/bin/python tests/ref/make_deepseek2_tiny.py"
                " --golden models/deepseek2-tiny --only v3_mtp (writes v3 first)\n")
        f.write("# tools: transformers %s, torch %s, numpy %s\n" % (
            transformers.__version__, torch.__version__, np.__version__))
        f.write("# reference: mtp_golden in tests/ref/make_deepseek2_tiny.py (transformers'"
                " DeepseekV3DecoderLayer, RMSNorm, rotary embedding; torch CPU float32, eager)\n")
        f.write("# tolerance: mtp_logits: |a-b| <= 1e-4 * max(1, |b|) for an FP32"
                " implementation\n")
        f.write("# format: 'ids: <T ids>' (prompt + greedy continuation); 'mtp_logits: <i>"
                " <n_vocab floats>' for i in 0..T-2, the module's logits for ids[i+2] from"
                " (h_i, ids[i+1]); 'min_gap' the smallest top-2 margin of those rows;"
                " 'route_min_margin' as in deepseek2_tiny_v3_logits.txt, for the module's gate\n")
        f.write("model_sha256: %s\n" % digest)
        f.write("n_vocab: %d\n" % VOCAB)
        f.write("ids: %s\n" % " ".join(str(i) for i in ids))
        for i in range(T - 1):
            f.write("mtp_logits: %d %s\n" % (i, " ".join("%.9g" % float(v) for v in logits[i])))
        f.write("min_gap: %.9g\n" % min(gaps))
        f.write("route_min_margin: %s %.9g\n" % (p + "mlp.gate", margin))
    return min(gaps), margin


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
        base = MTP_OF.get(name)
        tensors = make_tensors(base or name, VARIANTS[base or name])
        if base:
            tensors.update(mtp_tensors(c))
        digest = write_model(out_dir, c, tensors)
        print("wrote %s (model.safetensors sha256 %s)" % (out_dir, digest))
        if not args.golden:
            continue
        if base:
            gpath = os.path.join(args.golden_dir, "deepseek2_tiny_%s_logits.txt" % name)
            base_dir = os.path.join(args.out_root, base)
            write_model(base_dir, VARIANTS[base], make_tensors(base, VARIANTS[base]))
            gap, margin = mtp_golden(base_dir, c, tensors, gpath, digest)
            print("golden: %s min_gap=%.4g route_min_margin=%.4g" % (gpath, gap, margin))
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
