#!/usr/bin/env python3
"""Dequantize a GGUF (e.g. SmolLM2-135M-Instruct.Q4_1.gguf) to an F16 GGUF.

The quantization table (docs/quantization.md, run_quant_table.sh) starts
every row from the same F16 weights: dsq-quantize and llama-quantize both
read the file this writes, and dsq-perplexity / llama-perplexity score it
as the "FP16" row. Uses the gguf package (gguf-py, pinned in
requirements-quant.txt): every key/value is copied verbatim, quantized
matrices are dequantized with gguf.quants.dequantize and stored as F16;
F32 / F16 tensors (norms) are copied unchanged.

usage: make_f16_gguf.py SRC.gguf DST.gguf
"""
import sys

import numpy as np
import gguf


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = f.types[0]
        sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        val = f.contents()
        if name == "general.file_type":
            val = int(gguf.LlamaFileType.MOSTLY_F16)
        w.add_key_value(name, val, vtype, sub_type=sub)
    for t in r.tensors:
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            data = np.array(t.data)
        else:
            data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float16)
        w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{dst}: {len(r.tensors)} tensors, {len(r.fields)} fields", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
