#!/usr/bin/env python3
"""transformers reference logits of SmolLM2-135M-Instruct Q4_1 (fp32).

The golden for dsq's fp32-activation path (--activation-dtype fp32): Hugging
Face transformers loads the GGUF itself (`from_pretrained(dir,
gguf_file=...)`, which dequantizes Q4_1/Q8_0 to fp32 through the `gguf`
package and maps the tensors back to the HF Llama layout) and runs its own
LlamaForCausalLM forward in fp32 on the CPU. No code is shared with dsq.

As a check of the reference itself, the logits are compared with the
float64 numpy forward of tests/ref/make_smollm2_exact.py
(tests/golden/smollm2_logits_exact.txt, same prompt and ids); the script
stops with an error when they disagree by more than 1e-3 of the
position's largest |logit| (fp32 vs fp64 evaluation of the same weights
agrees to ~1e-5).

Writes tests/golden/smollm2_logits_transformers.txt in the block format of
smollm2_logits.txt (pos / argmax / top32 / subset of ids 0, 48, 96, ...).

usage: tests/ref/.venv/bin/python tests/ref/make_smollm2_transformers.py \
           --model models/SmolLM2-135M-Instruct.Q4_1.gguf
requirements: tests/ref/requirements-transformers-gguf.txt
"""
import argparse
import hashlib
import os
import sys

import gguf
import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

PROMPT_IDS = [504, 2365, 6354, 16438, 27003, 690, 260, 23790]  # as in smollm2_logits.txt
STRIDE, COUNT = 48, 1024


def read_exact(path):
    """subset rows of a golden file: {pos: np.array(1024)}"""
    rows, p = {}, None
    with open(path) as f:
        for line in f:
            if line.startswith("pos:"):
                p = int(line.split()[1])
            elif line.startswith("subset:"):
                rows[p] = np.array([float(v) for v in line.split()[1:]])
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--exact", default="tests/golden/smollm2_logits_exact.txt")
    ap.add_argument("--out", default="tests/golden/smollm2_logits_transformers.txt")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    d, name = os.path.split(os.path.abspath(a.model))
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        lg = model(torch.tensor([PROMPT_IDS])).logits[0].double().numpy()
    n = len(PROMPT_IDS)

    exact = read_exact(a.exact)
    worst = 0.0
    for p in range(n):
        sub = lg[p, ::STRIDE][:COUNT]
        rel = np.abs(sub - exact[p]).max() / np.abs(exact[p]).max()
        worst = max(worst, rel)
    print(f"transformers vs numpy float64: worst max|d|/max|ref| over {n} positions = {worst:.2e}")
    if worst > 1e-3:
        sys.exit("transformers and the numpy exact reference disagree: not writing a golden")

    sha = hashlib.sha256(open(a.model, "rb").read()).hexdigest()
    with open(a.out, "w") as f:
        f.write("# dsq golden file, format_version: 1\n")
        f.write("# what: SmolLM2-135M-Instruct Q4_1 logits, transformers fp32 forward of the GGUF "
                "(dequantized by transformers' own GGUF loader)\n")
        f.write("# regenerate: tests/ref/.venv/bin/python tests/ref/make_smollm2_transformers.py "
                "--model models/SmolLM2-135M-Instruct.Q4_1.gguf\n")
        f.write(f"# model: {name} (sha256 {sha})\n")
        f.write(f"# tools: torch {torch.__version__}, transformers {transformers.__version__}, "
                f"gguf {getattr(gguf, '__version__', '0.19.0')}, numpy {np.__version__}, "
                f"python {sys.version.split()[0]}\n")
        f.write(f"# cross-check: max|transformers - numpy float64 exact| / max|exact| per position "
                f"<= {worst:.2e} (tests/golden/smollm2_logits_exact.txt)\n")
        f.write("# tolerance: dsq --activation-dtype fp32: max|d| <= 1e-2 * max|ref| per position "
                "and relative L2 <= 1e-2 over the listed ids\n")
        f.write("# format: as smollm2_logits.txt: prompt_ids, then per position pos/argmax/top32/subset\n")
        f.write("prompt_ids: " + " ".join(map(str, PROMPT_IDS)) + "\n")
        f.write(f"n_positions: {n}\nsubset_stride: {STRIDE}\nsubset_count: {COUNT}\n")
        for p in range(n):
            row = lg[p]
            top = np.argsort(-row, kind="stable")[:32]
            f.write(f"pos: {p}\nargmax: {top[0]} {row[top[0]]:.9g}\n")
            f.write("top32: " + " ".join(f"{i}:{row[i]:.9g}" for i in top) + "\n")
            f.write("subset: " + " ".join(f"{row[i * STRIDE]:.9g}" for i in range(COUNT)) + "\n")


if __name__ == "__main__":
    main()
