#!/usr/bin/env python3
"""Golden prompt logprobs for SmolLM2-135M-Instruct (Q4_1 GGUF) from llama.cpp.

Owns tests/golden/smollm2_prompt_logprobs.txt: for one fixed prompt (token ids
as llama.cpp tokenizes it), the log-softmax of llama.cpp's logits at every
prompt position p < n-1, reported as the logprob of prompt token p+1 and the
top 5 alternatives. tests/e2e/test_api_gaps.py sends these ids to dsqd with
echo + logprobs + max_tokens 0 (the classic scoring call) and compares.

Why llama.cpp: an implementation independent of dsq. logits_all=True makes
llama.cpp keep the logits of every position of the one batch; the
log-softmax is done here in float64 numpy on those raw logits.

Regenerate (from the repo root, venv from tests/ref/README.md):
  tests/ref/.venv/bin/python tests/ref/make_smollm2_prompt_logprobs.py
"""
import argparse
import hashlib
import os
import platform
import sys

import numpy as np
import llama_cpp
from llama_cpp import Llama

FORMAT_VERSION = 1
N_CTX = 512
TOPK = 5
PROMPT = ("Once upon a time, in a small village at the edge of a great forest, there "
          "lived an old clockmaker named Elias. Every morning he opened the shutters "
          "of his little shop.")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="tests/golden/smollm2_prompt_logprobs.txt")
    a = ap.parse_args()
    llm = Llama(model_path=a.model, n_ctx=N_CTX, n_batch=N_CTX, n_threads=1,
                logits_all=True, verbose=False)
    ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=False)
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)], dtype=np.float64)
    lse = np.log(np.exp(logits - logits.max(axis=1, keepdims=True)).sum(axis=1)) \
        + logits.max(axis=1)
    lsm = logits - lse[:, None]
    lines = [
        f"# dsq golden file, format_version: {FORMAT_VERSION}",
        "# what: SmolLM2-135M-Instruct Q4_1 prompt logprobs (log-softmax of llama.cpp's raw "
        "logits at every prompt position) of one prompt",
        "# regenerate: tests/ref/.venv/bin/python tests/ref/make_smollm2_prompt_logprobs.py",
        f"# model: {os.path.basename(a.model)} (sha256 {sha256(a.model)})",
        f"# tools: llama-cpp-python {llama_cpp.__version__}, numpy {np.__version__}, "
        f"python {platform.python_version()}, {platform.machine()}",
        f"# llama.cpp settings: CPU, n_threads=1, n_ctx={N_CTX}, n_batch={N_CTX}, "
        "logits_all=True, one batch; log-softmax in float64 numpy",
        "# format: 'prompt_ids: ...', then per position p = 0..n-2 a line",
        f"#   pos <p> <id of prompt token p+1> <its logprob> then top{TOPK} 'id:logprob'",
        f"prompt_text: {PROMPT}",
        "prompt_ids: " + " ".join(str(t) for t in ids),
    ]
    for p in range(len(ids) - 1):
        top = np.argsort(-lsm[p], kind="stable")[:TOPK]
        lines.append(f"pos {p} {ids[p + 1]} {lsm[p, ids[p + 1]]:.6f} "
                     + " ".join(f"{int(t)}:{lsm[p, t]:.6f}" for t in top))
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.out}: {len(ids)} prompt ids", file=sys.stderr)


if __name__ == "__main__":
    main()
