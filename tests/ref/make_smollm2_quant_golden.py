#!/usr/bin/env python3
"""Goldens of the llama-quantize-made SmolLM2 GGUFs: tests/golden/smollm2_quants/.

For every file tests/ref/make_smollm2_quants.sh writes (SmolLM2: Q4_K_M, Q5_K_M,
Q6_K, Q5_0, Q5_1, Q3_K_M, Q2_K, IQ4_XS, IQ4_NL, Q8_0, Q2_K-down,
Q5_0-pure, IQ4_NL-pure; llama-k256 --pure Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
IQ4_XS: fixed token ids, no tokenizer) one golden NAME.txt with two independent references:
  - llama.cpp (llama-cpp-python 0.3.16, the llama.cpp that quantized the
    files, one thread, CPU): the logits of the 8 positions of the prompt of
    smollm2_logits.txt, and 16 greedy tokens of two prompts with the top-2
    gap of every step;
  - exact: the float64 numpy forward of make_smollm2_exact.py on the weights
    dequantized by gguf-py (no activation quantization, no fp16 anywhere).
tests/unit/test_smollm2_quants.c reads them.

usage (repo root; tests/ref/.venv from tests/ref/README.md, llama section):
  tests/ref/.venv/bin/python tests/ref/make_smollm2_quant_golden.py models/smollm2-quants
  (--k256-only: just the llama-k256 goldens)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_smollm2_exact as ex  # noqa: E402
import make_smollm2_golden as lg  # noqa: E402

STRIDE = 384          # logits of ids 0, 384, ... (128 ids for vocab 49152)
N_NEW = 16
GREEDY_PROMPTS = ["short_en", "code", "numbers", "long_en"]
# the 256-wide random llama (make_llama_k256_gguf.py), --pure per k-quant
K256_VARIANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"]
K256_IDS = [1, 17, 42, 300, 511, 8, 99, 256]
K256_GREEDY = [("k256_a", [3, 141, 59, 26]), ("k256_b", [500, 7, 7, 7, 7, 7]),
               ("k256_c", [0, 1, 2, 3, 4, 5, 6, 7, 8, 9])]
VARIANTS = ["Q4_K_M", "Q5_K_M", "Q6_K", "Q5_0", "Q5_1", "Q3_K_M", "Q2_K", "IQ4_XS",
            "IQ4_NL", "Q8_0", "Q2_K-down", "Q5_0-pure", "IQ4_NL-pure"]


def f9(v):
    return "%.9g" % v


def gap(row):
    i = np.argsort(-row, kind="stable")[:2]
    return int(i[0]), float(row[i[0]]), float(row[i[0]] - row[i[1]])


def one(path, out, ids=None, greedy_ids=None):
    """greedy_ids: [(name, prompt ids)] (files without a tokenizer), else the
    GREEDY_PROMPTS of make_smollm2_golden tokenized by llama.cpp."""
    ids = ids or ex.PROMPT_IDS
    exact = ex.exact_logits(path, ids)
    llm = lg.load(path, logits_all=True)
    n_vocab = llm.n_vocab()
    llm.reset()
    llm.eval(ids)
    lc = np.array([llm.scores[p] for p in range(len(ids))], dtype=np.float64)
    subset = list(range(0, n_vocab, STRIDE))
    lines = [
        "# dsq golden file, format_version: 1",
        "# what: %s: llama.cpp and exact float64 logits, llama.cpp greedy" % os.path.basename(path),
        "# regenerate: tests/ref/.venv/bin/python tests/ref/make_smollm2_quant_golden.py "
        "models/smollm2-quants",
        "# model sha256: %s" % lg.sha256(path),
        "# tools: llama-cpp-python %s, numpy %s, python %s" % (
            lg.llama_cpp.__version__, np.__version__, sys.version.split()[0]),
        "# tolerance: see tests/unit/test_smollm2_quants.c (bounds relative to llama.cpp's own"
        " distance from exact, and ~1e-4 of the largest logit for dsq's fp32 path vs exact)",
        "# format: 'key: value' lines; per position pos, llama_argmax/exact_argmax 'id logit gap',"
        " exact_absmax, llama/exact subsets (ids 0, %d, ...); greedy records end with 'end'" % STRIDE,
        "prompt_ids: " + " ".join(map(str, ids)),
        "n_vocab: %d" % n_vocab,
        "subset_stride: %d" % STRIDE,
        "subset_count: %d" % len(subset),
    ]
    for p in range(len(ids)):
        a, b = gap(lc[p]), gap(exact[p])
        lines.append("pos: %d" % p)
        lines.append("llama_argmax: %d %s %s" % (a[0], f9(a[1]), f9(a[2])))
        lines.append("exact_argmax: %d %s %s" % (b[0], f9(b[1]), f9(b[2])))
        lines.append("exact_absmax: %s" % f9(np.abs(exact[p]).max()))
        lines.append("llama_vs_exact: %s" % f9(np.abs(lc[p] - exact[p]).max()))
        lines.append("llama: " + " ".join(f9(lc[p][i]) for i in subset))
        lines.append("exact: " + " ".join(f9(exact[p][i]) for i in subset))
    llm = lg.load(path, logits_all=False)
    lg.N_NEW = N_NEW
    prompts = greedy_ids or [
        (name, llm.tokenize(text.encode("utf-8"), add_bos=True, special=special))
        for name, text, special in lg.PROMPTS if name in GREEDY_PROMPTS]
    for name, pids in prompts:
        outs, tops = lg.greedy(llm, pids)
        close = [k for k, (x, y) in enumerate(tops) if x[1] - y[1] < lg.CLOSE_GAP]
        lines.append("greedy: %s" % name)
        lines.append("prompt_ids: " + " ".join(map(str, pids)))
        lines.append("output_ids: " + " ".join(map(str, outs)))
        lines.append("second_ids: " + " ".join(str(y[0]) for _, y in tops))
        lines.append("gaps: " + " ".join(f9(x[1] - y[1]) for x, y in tops))
        lines.append("first_close_step: %d" % (close[0] if close else N_NEW))
        lines.append("end")
    with open(out, "w", encoding="ascii", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    worst = max(float(np.abs(lc[p] - exact[p]).max() / np.abs(exact[p]).max())
                for p in range(len(ids)))
    print("%s: llama.cpp vs exact worst %.4f of max logit" % (os.path.basename(path), worst),
          file=sys.stderr)


def main():
    args = [a for a in sys.argv[1:] if a != "--k256-only"]
    if len(args) != 1:
        sys.exit(__doc__)
    src = args[0]
    dst = "tests/golden/smollm2_quants"
    os.makedirs(dst, exist_ok=True)
    for v in VARIANTS if "--k256-only" not in sys.argv else []:
        one(os.path.join(src, "SmolLM2-135M-Instruct.%s.gguf" % v), os.path.join(dst, v + ".txt"))
    for v in K256_VARIANTS:
        one(os.path.join(src, "llama-k256.%s.gguf" % v), os.path.join(dst, "k256-%s.txt" % v),
            K256_IDS, K256_GREEDY)


if __name__ == "__main__":
    main()
