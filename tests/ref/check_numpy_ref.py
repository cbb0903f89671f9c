#!/usr/bin/env python3
"""Cross-check of the tiny-model golden files with a second, plain numpy forward.

Owns no output. It regenerates the tiny Qwen2 and DeepSeek models (numpy +
safetensors), runs a float64 forward written here from the model definitions
(Qwen2: GQA + NeoX RoPE + QKV bias + SwiGLU; DeepSeek-V2/V3: MLA with decoupled
interleaved RoPE, YaRN frequencies and mscale from DeepSeek's own description,
softmax/sigmoid gates, group-limited routing, shared experts) and compares with
tests/golden/*_logits.txt. If transformers ever changes behaviour, or one of
its ports deviates from the original model, this disagrees before a C test
is blamed.

  python3 tests/ref/check_numpy_ref.py [--models-root models]
Exit status 0 when every file agrees within 1e-4 * max(1, |ref|).
"""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_qwen2_tiny  # noqa: E402
import make_deepseek2_tiny  # noqa: E402

TOL = 1e-4


def read_golden(path):
    g = {"logits": {}}
    with open(path, encoding="ascii") as f:
        for line in f:
            if line.startswith("#"):
                continue
            key, _, val = line.rstrip("\n").partition(": ")
            if key == "logits":
                parts = val.split()
                g["logits"][int(parts[0])] = np.array([float(v) for v in parts[1:]])
            elif key in ("prompt_ids", "output_ids"):
                g[key] = [int(v) for v in val.split()]
    return g


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def mlp(t, p, x):
    return (silu(x @ t[p + "gate_proj.weight"].T) * (x @ t[p + "up_proj.weight"].T)) @ t[p + "down_proj.weight"].T


def causal_softmax(s):
    n = s.shape[-1]
    s = s + np.triu(np.full((n, n), -np.inf), 1)
    s = s - s.max(-1, keepdims=True)
    e = np.exp(s)
    return e / e.sum(-1, keepdims=True)


def qwen2_forward(c, t, ids):
    t = {k: v.astype(np.float64) for k, v in t.items()}
    n, H, KV = len(ids), c["num_attention_heads"], c["num_key_value_heads"]
    hd = c["hidden_size"] // H
    eps = c["rms_norm_eps"]
    pos = np.arange(n)[:, None]
    inv = c["rope_theta"] ** (-np.arange(0, hd, 2) / hd)
    ang = pos * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):  # NeoX: pairs (i, i + hd/2); x [n, heads, hd]
        a, b = x[..., :hd // 2], x[..., hd // 2:]
        return np.concatenate([a * cos[:, None] - b * sin[:, None], b * cos[:, None] + a * sin[:, None]], -1)

    x = t["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rmsnorm(x, t[p + "input_layernorm.weight"], eps)
        q = (h @ t[p + "self_attn.q_proj.weight"].T + t[p + "self_attn.q_proj.bias"]).reshape(n, H, hd)
        k = (h @ t[p + "self_attn.k_proj.weight"].T + t[p + "self_attn.k_proj.bias"]).reshape(n, KV, hd)
        v = (h @ t[p + "self_attn.v_proj.weight"].T + t[p + "self_attn.v_proj.bias"]).reshape(n, KV, hd)
        q, k = rope(q), rope(k)
        o = np.zeros((n, H, hd))
        for hh in range(H):
            kv = hh // (H // KV)
            a = causal_softmax(q[:, hh] @ k[:, kv].T / math.sqrt(hd))
            o[:, hh] = a @ v[:, kv]
        x = x + o.reshape(n, H * hd) @ t[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, t[p + "post_attention_layernorm.weight"], eps)
        x = x + mlp(t, p + "mlp.", h)
    x = rmsnorm(x, t["model.norm.weight"], eps)
    return x @ t["lm_head.weight"].T


def yarn_inv_freq(c, d):
    base = c["rope_theta"]
    freqs = 1.0 / base ** (np.arange(0, d, 2) / d)
    rs = c.get("rope_scaling")
    scale = 1.0
    if rs:
        factor, orig = rs["factor"], rs["original_max_position_embeddings"]

        def corr_dim(num_rot):
            return d * math.log(orig / (num_rot * 2 * math.pi)) / (2 * math.log(base))
        low = max(math.floor(corr_dim(rs["beta_fast"])), 0)
        high = min(math.ceil(corr_dim(rs["beta_slow"])), d - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
        mscale = 0.1 * rs["mscale_all_dim"] * math.log(factor) + 1.0
        scale = mscale * mscale
    return freqs, scale


def deepseek_forward(c, t, ids):
    t = {k: v.astype(np.float64) for k, v in t.items()}
    n, H = len(ids), c["num_attention_heads"]
    dn, dr, dv, kvl = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    eps = c["rms_norm_eps"]
    inv, mscale2 = yarn_inv_freq(c, dr)
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)
    sm_scale = (dn + dr) ** -0.5 * mscale2

    def rope(x):  # interleaved pairs (2i, 2i+1); x [n, heads, dr]
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos[:, None] - b * sin[:, None]
        out[..., 1::2] = b * cos[:, None] + a * sin[:, None]
        return out

    x = t["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % i
        a = p + "self_attn."
        h = rmsnorm(x, t[p + "input_layernorm.weight"], eps)
        if c["q_lora_rank"] is None:
            q = h @ t[a + "q_proj.weight"].T
        else:
            q = rmsnorm(h @ t[a + "q_a_proj.weight"].T, t[a + "q_a_layernorm.weight"], eps) @ t[a + "q_b_proj.weight"].T
        q = q.reshape(n, H, dn + dr)
        ckv = h @ t[a + "kv_a_proj_with_mqa.weight"].T
        k_pe = rope(ckv[:, None, kvl:])[:, 0]
        kv = (rmsnorm(ckv[:, :kvl], t[a + "kv_a_layernorm.weight"], eps) @ t[a + "kv_b_proj.weight"].T).reshape(n, H, dn + dv)
        q_pe = rope(q[..., dn:])
        o = np.zeros((n, H, dv))
        for hh in range(H):
            s = q[:, hh, :dn] @ kv[:, hh, :dn].T + q_pe[:, hh] @ k_pe.T
            o[:, hh] = causal_softmax(s * sm_scale) @ kv[:, hh, dn:]
        x = x + o.reshape(n, H * dv) @ t[a + "o_proj.weight"].T
        h = rmsnorm(x, t[p + "post_attention_layernorm.weight"], eps)
        if i < c["first_k_dense_replace"]:
            x = x + mlp(t, p + "mlp.", h)
            continue
        ne, k, ng, tg = c["n_routed_experts"], c["num_experts_per_tok"], c["n_group"], c["topk_group"]
        logits = h @ t[p + "mlp.gate.weight"].T
        if c["scoring_func"] == "sigmoid":
            scores = 1.0 / (1.0 + np.exp(-logits))
            choice = scores + t[p + "mlp.gate.e_score_correction_bias"]
        else:
            e = np.exp(logits - logits.max(-1, keepdims=True))
            scores = e / e.sum(-1, keepdims=True)
            choice = scores
        y = mlp(t, p + "mlp.shared_experts.", h)
        for r in range(n):
            ch = choice[r].copy()
            if c["topk_method"] in ("group_limited_greedy", "noaux_tc"):
                grp = ch.reshape(ng, ne // ng)
                gs = np.sort(grp, -1)[:, -2:].sum(-1) if c["topk_method"] == "noaux_tc" else grp.max(-1)
                keep = np.zeros(ng, bool)
                keep[np.argsort(-gs, kind="stable")[:tg]] = True
                ch = np.where(np.repeat(keep, ne // ng), ch, -np.inf)
            sel = np.argsort(-ch, kind="stable")[:k]
            w = scores[r, sel]
            if c["norm_topk_prob"]:
                w = w / (w.sum() + 1e-20)
            w = w * c["routed_scaling_factor"]
            for e_id, we in zip(sel, w):
                y[r] += we * mlp(t, p + "mlp.experts.%d." % e_id, h[r:r + 1])[0]
        x = x + y
    x = rmsnorm(x, t["model.norm.weight"], eps)
    return x @ t["lm_head.weight"].T


def check(name, forward, c, tensors, golden_path):
    g = read_golden(golden_path)
    seq = g["prompt_ids"] + g["output_ids"]
    logits = forward(c, tensors, seq)
    n = len(g["prompt_ids"])
    worst = 0.0
    for pidx, ref in g["logits"].items():
        worst = max(worst, float(np.max(np.abs(logits[pidx] - ref) / np.maximum(1.0, np.abs(ref)))))
    # greedy: argmax at position n-1+j must be output_ids[j]
    greedy = [int(np.argmax(logits[n - 1 + j])) for j in range(len(g["output_ids"]))]
    ok = worst <= TOL and greedy == g["output_ids"]
    print("%-9s %s  max rel logit err %.3g, greedy %s" % (
        name, "OK  " if ok else "FAIL", worst, "same" if greedy == g["output_ids"] else greedy))
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models-root", default="models")
    ap.add_argument("--golden-dir", default="tests/golden")
    args = ap.parse_args()
    ok = True
    t = make_qwen2_tiny.make_tensors()
    ok &= check("qwen2", qwen2_forward, make_qwen2_tiny.CONFIG, t,
                os.path.join(args.golden_dir, "qwen2_tiny_logits.txt"))
    for name in sorted(make_deepseek2_tiny.VARIANTS):
        c = make_deepseek2_tiny.VARIANTS[name]
        t = make_deepseek2_tiny.make_tensors(name, c)
        ok &= check(name, deepseek_forward, c, t,
                    os.path.join(args.golden_dir, "deepseek2_tiny_%s_logits.txt" % name))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
