"""Shared helpers of the tiny random-weight reference models (Qwen2, DeepSeek).

Owns: the deterministic weight generator (numpy PCG64, no torch RNG), the
safetensors/config writer, and the golden-file writer used with transformers.

Why built this way: the C tests regenerate the weights themselves before
running (weights are never committed), so generation must need only numpy and
safetensors (tests/ref/requirements-model.txt) and must give the same bytes on
every machine: float64 normals from numpy's Generator(PCG64(seed)) cast to
float32, tensors drawn in one fixed order. The sha256 of model.safetensors is
printed and written into the golden file so a consumer can tell a stale or
different model from a numeric bug. Nothing here imports torch/transformers;
golden() imports them lazily.
"""
import hashlib
import json
import os
import platform

import numpy as np

FORMAT_VERSION = 1


class WeightGen:
    """Draws named tensors in call order from one PCG64 stream."""

    def __init__(self, seed):
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.tensors = {}

    def normal(self, name, shape, std, mean=0.0):
        x = self.rng.standard_normal(size=shape, dtype=np.float64) * std + mean
        self.tensors[name] = np.ascontiguousarray(x.astype(np.float32))
        return self.tensors[name]

    def uniform(self, name, shape, lo, hi):
        x = self.rng.random(size=shape, dtype=np.float64) * (hi - lo) + lo
        self.tensors[name] = np.ascontiguousarray(x.astype(np.float32))
        return self.tensors[name]


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_model(out_dir, config, tensors):
    """Writes config.json + model.safetensors; returns the safetensors sha256."""
    from safetensors.numpy import save_file
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="ascii", newline="\n") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    path = os.path.join(out_dir, "model.safetensors")
    # sorted keys: the safetensors header is then independent of dict order
    save_file({k: tensors[k] for k in sorted(tensors)}, path, metadata={"format": "pt"})
    return sha256_file(path)


def fmt(x):
    return "%.9g" % float(x)


def golden(model_dir, model_cls_name, prompt_ids, n_new, out_path, regen_cmd, what,
           model_sha256, tolerance_lines, extra_lines=(), record_routing=False,
           route_margin_fn=None):
    """Loads model_dir with transformers (FP32, CPU, eager attention) and writes
    the logits of every prompt position plus a greedy continuation."""
    import torch
    import transformers
    import safetensors

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    cls = getattr(transformers, model_cls_name)
    model, info = cls.from_pretrained(model_dir, dtype=torch.float32,
                                      attn_implementation="eager", output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    if bad:  # a misnamed tensor would be silently re-initialized by torch
        raise SystemExit("transformers did not load the weights as written: %s" % bad)
    model.eval()
    ids = list(prompt_ids)
    routing = []  # (layer name, topk ids [n_pos, k], topk weights [n_pos, k])
    hooks = []
    last_input, first_done = {}, set()
    if record_routing:
        def hook(name):
            def fn(_mod, inp, out):
                idx, w = out
                x = inp[0].detach().float().numpy().reshape(-1, inp[0].shape[-1]).copy()
                last_input[name] = x
                if name not in first_done:
                    first_done.add(name)
                    routing.append((name, idx.detach().numpy().copy(),
                                    w.detach().float().numpy().copy()))
            return fn
        for name, mod in model.named_modules():
            if name.endswith("mlp.gate"):
                hooks.append(mod.register_forward_hook(hook(name)))
    with torch.no_grad():
        logits = model(torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0]
        logits = logits.to(torch.float32).numpy()
        # greedy: full recompute each step (no KV cache involved in the reference)
        seq = list(ids)
        out, tops = [], []
        for _ in range(n_new):
            row = model(torch.tensor([seq], dtype=torch.long), use_cache=False).logits[0, -1]
            row = row.to(torch.float32).numpy()
            order = np.argsort(-row, kind="stable")[:2]
            nxt = int(np.argmax(row))
            out.append(nxt)
            tops.append([(int(i), float(row[i])) for i in order])
            seq.append(nxt)
    for h in hooks:
        h.remove()
    n_pos, n_vocab = logits.shape
    with open(out_path, "w", encoding="ascii", newline="\n") as f:
        f.write("# dsq golden file, format_version: %d\n" % FORMAT_VERSION)
        f.write("# what: %s\n" % what)
        f.write("# regenerate: %s\n" % regen_cmd)
        f.write("# tools: transformers %s, torch %s, numpy %s, safetensors %s, python %s, %s\n" % (
            transformers.__version__, torch.__version__, np.__version__,
            safetensors.__version__, platform.python_version(), platform.machine()))
        f.write("# reference: %s, torch CPU, float32, attn_implementation=eager, one thread\n"
                % model_cls_name)
        for line in tolerance_lines:
            f.write("# tolerance: %s\n" % line)
        for line in extra_lines:
            f.write("# %s\n" % line)
        f.write("# format: 'key: value' lines; 'logits: <p> <n_vocab floats>' per position p"
                " (logits predicting the token after prompt_ids[p]); 'top2' has one item"
                " 'id1:logit1,id2:logit2' per greedy step\n")
        f.write("# greedy: argmax of the last position's logits, appended, full recompute;"
                " EOS is not a stop\n")
        f.write("model_sha256: %s\n" % model_sha256)
        f.write("n_vocab: %d\n" % n_vocab)
        f.write("n_positions: %d\n" % n_pos)
        f.write("prompt_ids: %s\n" % " ".join(str(i) for i in ids))
        for p in range(n_pos):
            f.write("logits: %d %s\n" % (p, " ".join(fmt(v) for v in logits[p])))
        f.write("output_ids: %s\n" % " ".join(str(i) for i in out))
        f.write("top2: %s\n" % " ".join("%d:%s,%d:%s" % (a[0], fmt(a[1]), b[0], fmt(b[1]))
                                         for a, b in tops))
        f.write("min_gap: %s\n" % fmt(min(a[1] - b[1] for a, b in tops)))
        for name, idx, w in routing:
            # per prompt position: expert ids in ascending order with their weights
            # (the gate's final weights, routed_scaling_factor included)
            for p in range(idx.shape[0]):
                order = np.argsort(idx[p], kind="stable")
                f.write("route: %s %d %s\n" % (name, p, " ".join(
                    "%d:%s" % (int(idx[p][k]), fmt(w[p][k])) for k in order)))
        if route_margin_fn is not None:
            # over all positions of the last greedy forward (prompt + continuation)
            for name in sorted(last_input):
                f.write("route_min_margin: %s %s\n" % (name, fmt(route_margin_fn(name, last_input[name]))))
    return out, tops, logits
