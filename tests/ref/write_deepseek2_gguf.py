#!/usr/bin/env python3
"""Write the tiny DeepSeek-V2/V3 GGUFs with numpy + gguf-py only (no torch).

Owns: the torch-free twin of convert_deepseek2_gguf.py. For every variant
directory IN_ROOT/<name>/ (made by make_deepseek2_tiny.py) it writes
OUT_ROOT/<name>.<type>.gguf for type f32, f16 and q8_0, plus
OUT_ROOT/v2_lite.kvb.f32.gguf (one attn_kv_b tensor instead of
attn_k_b + attn_v_b), and with --check MANIFEST verifies them against the
manifest made from llama.cpp's own converter output
(tests/golden/deepseek2_tiny_gguf_manifest.json, see gguf_manifest.py).

Why built this way: llama.cpp's convert_hf_to_gguf.py is the reference (dsq
must read what llama.cpp users have), but it needs torch + transformers, a
multi-GB install that CI should not pay on every clean clone. So the reference
runs at dev time and its output is recorded as sha256 digests; this script
rebuilds the same bytes from the layout that converter produces, written down
here from its output (GGUF spec: github.com/ggml-org/ggml docs/gguf.md):
  - tensors in the safetensors key order; routed experts stacked into one
    3-D tensor per projection [n_expert, out, in] (emitted down, gate, up
    once a layer's last expert arrives); kv_b_proj [n_head*(nope+v), rank]
    split per head into attn_k_b = k part transposed [n_head, rank, nope] and
    attn_v_b [n_head, v, rank] (or kept whole as attn_kv_b with --legacy);
  - types: F32 for 1-D tensors, norms, ffn_gate_inp and biases; otherwise the
    requested type, Q8_0 falling back to F16 when a row is not a multiple of
    32 (q_b with q_lora_rank 24, k_b with nope 16); quantization by
    gguf.quants (the same numpy code the converter calls);
  - metadata keys in the converter's order, including its quirks: head_count_kv
    is 1 (MLA as MQA), key_length/value_length sit where the generic
    head_dim keys were first written, general.name/version/size_label come
    from gguf.Metadata and gguf.size_label; the vocabulary is the 512-token
    one of convert_deepseek2_gguf.tiny_vocab.
Writer: gguf.GGUFWriter (alignment 32), gguf pinned in
tests/ref/requirements-model.txt.

  .venv/bin/python tests/ref/write_deepseek2_gguf.py [IN_ROOT [OUT_ROOT]] \
      [--check MANIFEST]
Exit status 1 with the file/tensor/key named when the check fails.
"""
import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
from safetensors import safe_open

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf  # noqa: E402
from convert_deepseek2_gguf import TYPES, VARIANTS, tiny_vocab  # noqa: E402
import gguf_manifest  # noqa: E402

QT = gguf.GGMLQuantizationType
FILE_TYPE = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}
OUT_QTYPE = {"f32": QT.F32, "f16": QT.F16, "q8_0": QT.Q8_0}

# HF name (after "model.layers.N.") -> GGUF name (after "blk.N.")
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "mlp.gate.e_score_correction_bias": "exp_probs_b.bias",
    "mlp.shared_experts.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_experts.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_experts.down_proj.weight": "ffn_down_shexp.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_a_proj.weight": "attn_q_a.weight",
    "self_attn.q_a_layernorm.weight": "attn_q_a_norm.weight",
    "self_attn.q_b_proj.weight": "attn_q_b.weight",
    "self_attn.kv_a_proj_with_mqa.weight": "attn_kv_a_mqa.weight",
    "self_attn.kv_a_layernorm.weight": "attn_kv_a_norm.weight",
    "self_attn.kv_b_proj.weight": "attn_kv_b.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
}
TOP_NAMES = {
    "lm_head.weight": "output.weight",
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
}


def gguf_tensors(model_dir, cfg, legacy_kv_b):
    """Yield (gguf_name, float32 array in HF/numpy layout) in the converter's order."""
    n_exp = cfg["n_routed_experts"]
    n_head = cfg["num_attention_heads"]
    nope, v_dim = cfg["qk_nope_head_dim"], cfg["v_head_dim"]
    pending = {}                                     # layer -> {hf name: array}
    with safe_open(os.path.join(model_dir, "model.safetensors"), framework="np") as st:
        for name in st.keys():
            data = st.get_tensor(name).astype(np.float32, copy=False)
            if name in TOP_NAMES:
                yield TOP_NAMES[name], data
                continue
            parts = name.split(".")
            if parts[:2] != ["model", "layers"] or not parts[2].isdecimal():
                raise ValueError("%s: unknown tensor %s" % (model_dir, name))
            bid, rest = int(parts[2]), ".".join(parts[3:])
            if bid >= cfg["num_hidden_layers"]:
                continue                             # multi-token-prediction layers
            blk = "blk.%d." % bid
            if rest.startswith("mlp.experts."):
                got = pending.setdefault(bid, {})
                got[rest] = data
                if len(got) < 3 * n_exp:
                    continue
                for w in ("down", "gate", "up"):
                    stack = np.stack([got.pop("mlp.experts.%d.%s_proj.weight" % (e, w))
                                      for e in range(n_exp)])
                    yield blk + "ffn_%s_exps.weight" % w, stack
                if got:
                    raise ValueError("%s: unexpected expert tensors %s" % (model_dir, sorted(got)))
                continue
            if rest not in LAYER_NAMES:
                raise ValueError("%s: unknown tensor %s" % (model_dir, name))
            if rest == "self_attn.kv_b_proj.weight" and not legacy_kv_b:
                rank = data.shape[-1]
                if data.shape[0] != n_head * (nope + v_dim):
                    raise ValueError("%s: %s has shape %s" % (model_dir, name, data.shape))
                kv = data.reshape(n_head, nope + v_dim, rank)
                yield blk + "attn_k_b.weight", np.ascontiguousarray(kv[:, :nope, :].transpose(0, 2, 1))
                yield blk + "attn_v_b.weight", np.ascontiguousarray(kv[:, nope:, :])
                continue
            yield blk + LAYER_NAMES[rest], data
    if any(pending.values()):
        raise ValueError("%s: incomplete experts in layers %s" % (model_dir, sorted(pending)))


def tensor_qtype(name, data, outtype):
    if data.ndim <= 1 or name.endswith("_norm.weight") or name.endswith("ffn_gate_inp.weight") \
            or not name.endswith(".weight"):
        return QT.F32
    qt = OUT_QTYPE[outtype]
    if qt == QT.Q8_0 and data.shape[-1] % gguf.GGML_QUANT_SIZES[QT.Q8_0][0] != 0:
        return QT.F16                                # the converter's fallback
    return qt


def write(model_dir, outfile, outtype, legacy_kv_b):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    w = gguf.GGUFWriter(None, "deepseek2")
    for name, data in gguf_tensors(model_dir, cfg, legacy_kv_b):
        qt = tensor_qtype(name, data, outtype)
        w.add_tensor(name, gguf.quants.quantize(data, qt), raw_dtype=qt)

    total, shared, expert, n_exp = w.get_total_parameter_count()
    meta = gguf.Metadata.load(None, Path(model_dir), None, total)
    if meta.name is None:
        meta.name = Path(model_dir).name
    if meta.size_label is None and total > 0:
        meta.size_label = gguf.size_label(total, shared, expert, n_exp)
    w.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(w)

    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(1)                           # MLA is written as MQA
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    w.add_key_length(cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
    w.add_value_length(cfg["kv_lora_rank"])
    w.add_file_type(FILE_TYPE[outtype])
    w.add_leading_dense_block_count(cfg["first_k_dense_replace"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("q_lora_rank") is not None:
        w.add_q_lora_rank(cfg["q_lora_rank"])
    w.add_kv_lora_rank(cfg["kv_lora_rank"])
    w.add_key_length_mla(cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"])
    w.add_value_length_mla(cfg["v_head_dim"])
    w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_expert_count(cfg["n_routed_experts"])
    w.add_expert_shared_count(cfg["n_shared_experts"])
    w.add_expert_weights_scale(cfg["routed_scaling_factor"])
    w.add_expert_weights_norm(cfg["norm_topk_prob"])
    gating = {"sigmoid": gguf.ExpertGatingFuncType.SIGMOID,
              "softmax": gguf.ExpertGatingFuncType.SOFTMAX}
    if cfg["scoring_func"] not in gating:
        raise ValueError("%s: scoring_func %r" % (model_dir, cfg["scoring_func"]))
    w.add_expert_gating_func(gating[cfg["scoring_func"]])
    w.add_rope_dimension_count(cfg["qk_rope_head_dim"])
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) == "yarn" and "factor" in rs:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_log_mul(0.1 * rs["mscale_all_dim"])
    if (cfg.get("n_group") or 1) > 1:
        w.add_uint32("deepseek2.expert_group_count", cfg["n_group"])
        w.add_uint32("deepseek2.expert_group_used_count", cfg.get("topk_group") or 1)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    tokens, toktypes, merges = tiny_vocab(cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(toktypes)
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg.get("bos_token_id", 1))
    w.add_eos_token_id(cfg.get("eos_token_id", 2))
    w.add_add_bos_token(False)

    tmp = outfile + ".tmp"                           # readers never see a half-written file
    w.write_header_to_file(path=tmp)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, outfile)


def gguf_version():
    """gguf-py's version: the pyproject.toml of a source tree on sys.path, else the installed one."""
    tree = os.path.join(os.path.dirname(os.path.dirname(gguf.__file__)), "pyproject.toml")
    if os.path.isfile(tree):
        with open(tree, encoding="utf-8") as f:
            for line in f:
                if line.startswith("version"):
                    return line.split("=", 1)[1].strip().strip('"')
    from importlib.metadata import version
    return version("gguf")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("in_root", nargs="?", default="models/deepseek2-tiny")
    ap.add_argument("out_root", nargs="?", default="models/deepseek2-tiny-gguf")
    ap.add_argument("--check", metavar="MANIFEST", default=None,
                    help="verify the written files against this manifest")
    args = ap.parse_args()
    os.makedirs(args.out_root, exist_ok=True)
    jobs = [(v, t, False) for v in VARIANTS for t in TYPES] + [("v2_lite", "f32", True)]
    for variant, outtype, legacy in jobs:
        model_dir = os.path.join(args.in_root, variant)
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            sys.exit("write_deepseek2_gguf: %s missing; run tests/ref/make_deepseek2_tiny.py first"
                     % os.path.join(model_dir, "config.json"))
        out = os.path.join(args.out_root, "%s.%s%s.gguf" % (variant, "kvb." if legacy else "",
                                                           outtype))
        write(model_dir, out, outtype, legacy)
        print("wrote %s (gguf-py %s)" % (out, gguf_version()))
    if args.check:
        errors = gguf_manifest.check(args.check, args.out_root)
        for e in errors:
            print("write_deepseek2_gguf: MISMATCH %s" % e, file=sys.stderr)
        if errors:
            sys.exit(1)
        print("manifest %s: all files match" % args.check)


if __name__ == "__main__":
    main()
