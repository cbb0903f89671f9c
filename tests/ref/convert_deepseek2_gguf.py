#!/usr/bin/env python3
"""Convert the tiny DeepSeek-V2/V3 HF models to GGUF with llama.cpp's own converter.

For every variant directory IN_ROOT/<name>/ (made by make_deepseek2_tiny.py)
this writes OUT_ROOT/<name>.<type>.gguf for type f32, f16 and q8_0 (the
converter's --outtype; it has no Q4 types), plus OUT_ROOT/v2_lite.kvb.f32.gguf
in the older layout (one attn_kv_b tensor instead of attn_k_b + attn_v_b).

The converter is llama.cpp's convert_hf_to_gguf.py with its gguf-py, both
taken from the llama.cpp vendored in the llama-cpp-python 0.3.16 sdist (the
llama.cpp the other golden files come from). Found at --llama-cpp DIR, else
$LLAMA_BENCH_DIR (default build-llama-bench/) /llama_cpp_python-0.3.16/
vendor/llama.cpp, else the sdist is fetched with `pip download` (or copied
from $LLAMA_CPP_SDIST) and unpacked there, as tests/ref/build_llama_tools.sh
does. Nothing is built.

Why built this way: dsq must read what llama.cpp users actually have, so the
tensors and metadata come from the converter itself, run in-process with
four narrow adjustments, none touching a weight:
  - mistral_common (imported at the converter's top, used only for Mistral
    models) is stubbed when it is not installed;
  - the tiny models have no tokenizer, so DeepseekV2Model.set_vocab writes a
    512-token byte-level "gpt2" vocabulary (3 control tokens, the 256 bytes,
    253 merges) instead of reading one;
  - the converter of this version writes no group-routing keys; for
    n_group > 1 the script adds deepseek2.expert_group_count and
    deepseek2.expert_group_used_count, the keys newer llama.cpp writes;
  - --legacy-kv-b (used for the *.kvb.* file) keeps kv_b_proj whole as
    blk.N.attn_kv_b.weight, the layout of converters before the k_b/v_b
    split, so dsq's support for both layouts is tested.

  tests/ref/.venv/bin/python tests/ref/convert_deepseek2_gguf.py \
      [IN_ROOT [OUT_ROOT]] [--llama-cpp DIR] [--manifest FILE]
--manifest also writes the digest manifest of the files made
(tests/golden/deepseek2_tiny_gguf_manifest.json, format in gguf_manifest.py)
that CI checks the torch-free write_deepseek2_gguf.py against.
Needs tests/ref/requirements-convert.txt (torch, transformers, numpy, pyyaml,
tqdm). Deterministic: two runs give byte-identical files.
"""
import argparse
import os
import subprocess
import sys
import tarfile
import types

VERSION = "0.3.16"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VARIANTS = ("v2_group", "v2_lite", "v3")
TYPES = ("f32", "f16", "q8_0")


def find_llama_cpp(explicit):
    if explicit:
        return explicit
    bench = os.environ.get("LLAMA_BENCH_DIR", os.path.join(ROOT, "build-llama-bench"))
    src = os.path.join(bench, "llama_cpp_python-%s" % VERSION)
    vendored = os.path.join(src, "vendor", "llama.cpp")
    if os.path.isfile(os.path.join(vendored, "convert_hf_to_gguf.py")):
        return vendored
    os.makedirs(bench, exist_ok=True)
    sdist = os.path.join(bench, "llama_cpp_python-%s.tar.gz" % VERSION)
    if not os.path.isfile(sdist):
        if os.environ.get("LLAMA_CPP_SDIST"):
            with open(os.environ["LLAMA_CPP_SDIST"], "rb") as a, open(sdist, "wb") as b:
                b.write(a.read())
        else:
            subprocess.check_call([sys.executable, "-m", "pip", "download", "--no-deps",
                                   "--no-binary", ":all:", "llama-cpp-python==%s" % VERSION,
                                   "-d", bench], stdout=sys.stderr)
    with tarfile.open(sdist) as t:
        t.extractall(bench, filter="data")
    return vendored


def stub_mistral_common():
    try:
        import mistral_common  # noqa: F401
        return
    except ImportError:
        pass
    names = {
        "mistral_common.tokens.tokenizers.base": ["TokenizerVersion"],
        "mistral_common.tokens.tokenizers.multimodal": ["DATASET_MEAN", "DATASET_STD"],
        "mistral_common.tokens.tokenizers.tekken": ["Tekkenizer"],
        "mistral_common.tokens.tokenizers.sentencepiece": ["SentencePieceTokenizer"],
    }
    for mod in ("mistral_common", "mistral_common.tokens", "mistral_common.tokens.tokenizers"):
        sys.modules[mod] = types.ModuleType(mod)
    for mod, attrs in names.items():
        m = types.ModuleType(mod)
        for a in attrs:
            setattr(m, a, None)
        sys.modules[mod] = m


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the "gpt2" GGUF vocabulary's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tiny_vocab(n_vocab):
    """3 control tokens, 256 byte tokens, then merges of two lowercase letters."""
    tokens = ["<|pad|>", "<|begin_of_text|>", "<|end_of_text|>"]
    types_ = [3, 3, 3]                    # gguf.TokenType.CONTROL
    b2u = bytes_to_unicode()
    tokens += [b2u[b] for b in range(256)]
    types_ += [1] * 256                   # NORMAL
    merges = []
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    for a in letters:
        for b in letters:
            if len(tokens) >= n_vocab:
                break
            tokens.append(a + b)
            types_.append(1)
            merges.append("%s %s" % (a, b))
    return tokens[:n_vocab], types_[:n_vocab], merges


def convert(conv, gguf, model_dir, outfile, outtype, legacy_kv_b):
    cls = conv.DeepseekV2Model

    def set_vocab(self):
        tokens, toktypes, merges = tiny_vocab(self.hparams["vocab_size"])
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("default")
        self.gguf_writer.add_token_list(tokens)
        self.gguf_writer.add_token_types(toktypes)
        self.gguf_writer.add_token_merges(merges)
        self.gguf_writer.add_bos_token_id(self.hparams.get("bos_token_id", 1))
        self.gguf_writer.add_eos_token_id(self.hparams.get("eos_token_id", 2))
        self.gguf_writer.add_add_bos_token(False)

    orig_params = cls.set_gguf_parameters
    orig_modify = cls.modify_tensors

    def set_gguf_parameters(self):
        orig_params(self)
        ng = self.hparams.get("n_group") or 1
        if ng > 1:
            arch = gguf.MODEL_ARCH_NAMES[self.model_arch]
            self.gguf_writer.add_uint32("%s.expert_group_count" % arch, ng)
            self.gguf_writer.add_uint32("%s.expert_group_used_count" % arch,
                                        self.hparams.get("topk_group") or 1)

    def modify_tensors(self, data_torch, name, bid):
        if legacy_kv_b and name.endswith("kv_b_proj.weight"):
            return [(self.map_tensor_name(name), data_torch)]
        return orig_modify(self, data_torch, name, bid)

    cls.set_vocab = set_vocab
    cls.set_gguf_parameters = set_gguf_parameters
    cls.modify_tensors = modify_tensors
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", "--outtype", outtype, "--outfile", outfile, model_dir]
    try:
        conv.main()
    finally:
        sys.argv = argv
        cls.set_gguf_parameters = orig_params
        cls.modify_tensors = orig_modify


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("in_root", nargs="?", default="models/deepseek2-tiny")
    ap.add_argument("out_root", nargs="?", default="models/deepseek2-tiny-gguf")
    ap.add_argument("--llama-cpp", default=None, help="llama.cpp source tree")
    ap.add_argument("--manifest", default=None, metavar="FILE",
                    help="also write the digest manifest of the files made (gguf_manifest.py)")
    args = ap.parse_args()
    lcpp = find_llama_cpp(args.llama_cpp)
    import transformers  # noqa: F401  (before the stub: it probes mistral_common)
    stub_mistral_common()
    sys.path.insert(0, lcpp)
    import logging
    import convert_hf_to_gguf as conv
    import gguf
    logging.basicConfig(level=logging.WARNING)   # the converter's own basicConfig is then a no-op
    os.makedirs(args.out_root, exist_ok=True)
    jobs = [(v, t, False) for v in VARIANTS for t in TYPES] + [("v2_lite", "f32", True)]
    for variant, outtype, legacy in jobs:
        model_dir = os.path.join(args.in_root, variant)
        if not os.path.isfile(os.path.join(model_dir, "config.json")):
            sys.exit("convert_deepseek2_gguf: %s missing; run tests/ref/make_deepseek2_tiny.py first"
                     % os.path.join(model_dir, "config.json"))
        out = os.path.join(args.out_root, "%s.%s%s.gguf" % (variant, "kvb." if legacy else "",
                                                           outtype))
        convert(conv, gguf, model_dir, out, outtype, legacy)
        print("wrote %s (llama.cpp %s, gguf-py %s)" % (out, lcpp, gguf.__file__))
    if args.manifest:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gguf_manifest
        note = ("made by tests/ref/convert_deepseek2_gguf.py --manifest from the output of "
                "llama.cpp's convert_hf_to_gguf.py (llama-cpp-python %s sdist, its gguf-py); "
                "CI checks tests/ref/write_deepseek2_gguf.py --check against it" % VERSION)
        gguf_manifest.make(args.manifest, args.out_root, note)
        print("wrote %s" % args.manifest)


if __name__ == "__main__":
    main()
