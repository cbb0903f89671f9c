#!/usr/bin/env python3
"""Golden perplexity of SmolLM2-135M-Instruct (Q4_1 GGUF) on the GPL-3 text,
scored with llama.cpp's llama-perplexity protocol over llama.cpp's logits.

Owns tests/golden/smollm2_perplexity.txt, read by tests/e2e/test_perplexity.py
(dsq-perplexity --llama-cpp-protocol --max-tokens 1024).

The protocol (llama.cpp tools/perplexity/perplexity.cpp, perplexity()) is
re-implemented here in Python, not taken from dsq: the text is tokenized by
llama.cpp with add_special = true (BOS only if the vocab's add_bos_token says
so), cut into n = tokens / ctx non-overlapping chunks of ctx tokens; each chunk
is a fresh sequence whose first token is replaced by BOS when the vocab adds
one; logits rows ctx/2 .. ctx-2 score tokens ctx/2+1 .. ctx-1 of the chunk.
Only the first MAX_TOKENS tokens are used (dsq's --max-tokens; llama-perplexity
--chunks 2 gives the same chunks). The log-softmax is done here in float64
numpy on llama.cpp's raw float32 logits, at T = 1 and at T = 1.5
(softmax(logits / T)); the predictive entropy -sum p log p likewise.

The text is Debian base-files' /usr/share/common-licenses/GPL-3: present on
every Debian/Ubuntu box (and in CI), read, never copied into the repo.

With --llama-perplexity BIN the real llama-perplexity binary (built by
tests/ref/build_llama_tools.sh llama-perplexity) is run with the same model,
text and ctx on 2 chunks and its "Final estimate: PPL" is written into the
header as a cross-check of this Python protocol (refuses to write when they
disagree by more than 1e-3 relative).

Regenerate (from the repo root, venv from tests/ref/README.md):
  tests/ref/.venv/bin/python tests/ref/make_perplexity_golden.py \
      --llama-perplexity build-llama-bench/llama.cpp-build/bin/llama-perplexity
"""
import argparse
import hashlib
import os
import platform
import re
import subprocess
import sys
import tempfile

import numpy as np
import llama_cpp
from llama_cpp import Llama

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_common import sha256_file as sha256  # noqa: E402

FORMAT_VERSION = 1
N_CTX = 512
MAX_TOKENS = 1024            # two chunks of N_CTX
N_PER_TOKEN = 64             # per-token NLL lines for the first scored tokens
TEMPERATURES = (1.0, 1.5)
TEXT = "/usr/share/common-licenses/GPL-3"


def ids_sha256(ids):
    """sha256 of the ids as little-endian int32 (what the e2e test recomputes)."""
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


def score(logits, targets, temperature):
    """Per-row NLL of targets and predictive entropy (nats, float64) of
    softmax(logits / temperature); logits [rows][vocab]."""
    z = np.asarray(logits, dtype=np.float64) / temperature
    mx = z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z - mx).sum(axis=1, keepdims=True)) + mx
    lsm = z - lse
    nll = -lsm[np.arange(len(targets)), targets]
    ent = -(np.exp(lsm) * lsm).sum(axis=1)
    return nll, ent


def run_llama_perplexity(binary, model, text, chunks, tmpdir):
    """Run llama-perplexity on the same chunks, saving its log-probabilities
    (--kl-divergence-base: header, the tokens, then per scored row a float
    scale, a float min log-prob and uint16 codes, perplexity.cpp log_softmax())
    and return (final PPL, its +/-, tokens, per-token NLL decoded from the
    codes: quantization step <= 16/65535 nats)."""
    base = os.path.join(tmpdir, "llama_logits.bin")
    cmd = [binary, "-m", model, "-f", text, "-c", str(N_CTX), "--chunks", str(chunks),
           "-t", "2", "-b", str(N_CTX), "--kl-divergence-base", base]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", out.stdout + out.stderr)
    if not m:
        sys.exit("llama-perplexity printed no 'Final estimate: PPL'")
    with open(base, "rb") as f:
        b = f.read()
    if b[:8] != b"_logits_":
        sys.exit(f"{base}: not a llama-perplexity logits file")
    n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(b[8:20], dtype="<i4"))
    off = 20
    toks = np.frombuffer(b[off:off + 4 * n_chunk * n_ctx], dtype="<i4")
    off += 4 * n_chunk * n_ctx
    nv = 2 * ((n_vocab + 1) // 2) + 4
    first = n_ctx // 2
    nll = []
    for c in range(n_chunk):
        for i in range(n_ctx - 1 - first):
            row = np.frombuffer(b[off:off + 2 * nv], dtype="<u2")
            off += 2 * nv
            scale, min_lp = np.frombuffer(row[:4].tobytes(), dtype="<f4")
            code = int(row[4 + toks[c * n_ctx + first + i + 1]])
            nll.append(-(float(min_lp) + float(scale) * code))
    return float(m.group(1)), float(m.group(2)), toks, np.array(nll)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--text", default=TEXT)
    ap.add_argument("--out", default="tests/golden/smollm2_perplexity.txt")
    ap.add_argument("--llama-perplexity", default=None,
                    help="path of llama.cpp's llama-perplexity for the cross-check")
    ap.add_argument("--dump-nll", default=None,
                    help="also write every scored token's NLL at T=1 and T=1.5 (2 columns)")
    a = ap.parse_args()

    llm = Llama(model_path=a.model, n_ctx=N_CTX, n_batch=N_CTX, n_threads=1,
                logits_all=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    bos = llm.token_bos()
    with open(a.text, "rb") as f:
        text = f.read()
    # add_bos=True here is llama.cpp's add_special: BOS/EOS only as the vocab says
    all_ids = llm.tokenize(text, add_bos=True, special=False)
    ids = all_ids[:MAX_TOKENS]
    n_chunk = len(ids) // N_CTX
    if n_chunk < 1:
        sys.exit(f"{a.text}: {len(ids)} tokens, fewer than one chunk of {N_CTX}")
    first = N_CTX // 2

    per_t = {t: ([], []) for t in TEMPERATURES}
    for c in range(n_chunk):
        chunk = list(ids[c * N_CTX:(c + 1) * N_CTX])
        if add_bos:
            chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        rows = np.array(llm.scores[first:N_CTX - 1], dtype=np.float32)
        targets = np.array(ids[c * N_CTX + first + 1:(c + 1) * N_CTX])
        assert rows.shape[0] == len(targets) == N_CTX - 1 - first
        for t in TEMPERATURES:
            nll, ent = score(rows, targets, t)
            per_t[t][0].append(nll)
            per_t[t][1].append(ent)
    res = {t: (np.concatenate(v[0]), np.concatenate(v[1])) for t, v in per_t.items()}
    nll1, ent1 = res[1.0]
    nll15, ent15 = res[1.5]
    ppl = float(np.exp(nll1.mean()))

    if a.dump_nll:
        np.savetxt(a.dump_nll, np.stack([nll1, nll15], axis=1), fmt="%.6f")
    cross = ["not run (give --llama-perplexity BIN)"]
    if a.llama_perplexity:
        with tempfile.TemporaryDirectory() as tmp:
            lp, lp_err, l_toks, l_nll = run_llama_perplexity(
                a.llama_perplexity, a.model, a.text, n_chunk, tmp)
        if list(l_toks) != list(ids[:n_chunk * N_CTX]):
            sys.exit("llama-perplexity tokenized the text differently")
        if len(l_nll) != len(nll1):
            sys.exit(f"llama-perplexity scored {len(l_nll)} tokens, this script {len(nll1)}")
        d = np.abs(l_nll - nll1)
        shifted = np.abs(l_nll[1:] - nll1[:-1]).mean()
        # a different build of llama.cpp (native -march=native AVX-512 vs the
        # wheel's AVX2) moves single NLLs by up to ~0.4 nats (activation rounding
        # to Q8_1 along other code paths; measured mean |diff| 0.062), the mean
        # NLL by ~0.008; a protocol error (rows off by one, BOS, chunking) moves
        # the mean |diff| to nats (shifted by one position: 3.0)
        if d.mean() > 0.15 or abs(l_nll.mean() - nll1.mean()) > 0.03:
            sys.exit(f"llama-perplexity disagrees: mean |dNLL| {d.mean():.4f}, "
                     f"mean NLL {l_nll.mean():.5f} vs {nll1.mean():.5f}")
        cross = [
            f"llama-perplexity -m {os.path.basename(a.model)} -f GPL-3 -c {N_CTX} "
            f"--chunks {n_chunk} -t 2 -b {N_CTX} (tests/ref/build_llama_tools.sh, native "
            f"build): Final estimate: PPL = {lp:.4f} +/- {lp_err:.5f}; this script "
            f"{ppl:.4f}",
            f"  same {n_chunk * N_CTX} tokens; its per-token NLL (--kl-divergence-base, "
            f"decoded) vs this script over {len(d)} scored tokens: mean NLL "
            f"{l_nll.mean():.5f} vs {nll1.mean():.5f}, mean |diff| {d.mean():.4f}, max "
            f"{d.max():.3f}; shifted one position: mean |diff| {shifted:.3f}",
        ]

    lines = [
        f"# dsq golden file, format_version: {FORMAT_VERSION}",
        "# what: SmolLM2-135M-Instruct Q4_1 perplexity on GPL-3 with llama.cpp's "
        "llama-perplexity protocol (ctx 512, first 2 chunks, second half of each scored), "
        "over llama.cpp's logits",
        "# regenerate: tests/ref/.venv/bin/python tests/ref/make_perplexity_golden.py "
        "--llama-perplexity build-llama-bench/llama.cpp-build/bin/llama-perplexity",
        f"# model: {os.path.basename(a.model)} (sha256 {sha256(a.model)})",
        f"# text: /usr/share/common-licenses/GPL-3 from Debian base-files "
        f"({len(text)} bytes, sha256 {sha256(a.text)})",
        f"# tools: llama-cpp-python {llama_cpp.__version__}, numpy {np.__version__}, "
        f"python {platform.python_version()}, {platform.machine()}",
        f"# llama.cpp settings: CPU, n_threads=1, n_ctx={N_CTX}, n_batch={N_CTX}, "
        "logits_all=True, one fresh sequence per chunk; log-softmax and entropy in "
        "float64 numpy",
        *(f"# cross-check: {c}" if i == 0 else f"# {c}" for i, c in enumerate(cross)),
        "# tolerance (tests/e2e/test_perplexity.py has the measurements): token counts "
        "and ids exact; mean NLL and entropy 0.02 nats; per-token NLL of the first "
        f"{N_PER_TOKEN}: mean |diff| 0.15, max 0.8",
        "# format: key: value; nll_t1_first / nll_t1.5_first: the NLL (nats) of the first "
        f"{N_PER_TOKEN} scored tokens (chunk 0, tokens {first + 1}..{first + N_PER_TOKEN})",
        f"add_bos: {int(add_bos)}",
        f"text_tokens: {len(all_ids)}",
        f"ids_sha256_{MAX_TOKENS}: {ids_sha256(ids)}",
        f"ctx: {N_CTX}",
        f"max_tokens: {MAX_TOKENS}",
        f"chunks: {n_chunk}",
        f"scored_tokens: {len(nll1)}",
        f"ppl: {ppl:.6f}",
        f"nll: {nll1.mean():.6f}",
        f"entropy: {ent1.mean():.6f}",
        f"ppl_t1.5: {float(np.exp(nll15.mean())):.6f}",
        f"nll_t1.5: {nll15.mean():.6f}",
        f"entropy_t1.5: {ent15.mean():.6f}",
        "nll_t1_first: " + " ".join(f"{x:.6f}" for x in nll1[:N_PER_TOKEN]),
        "nll_t1.5_first: " + " ".join(f"{x:.6f}" for x in nll15[:N_PER_TOKEN]),
    ]
    with open(a.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {a.out}: {len(all_ids)} text tokens, {len(nll1)} scored, ppl {ppl:.4f}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
