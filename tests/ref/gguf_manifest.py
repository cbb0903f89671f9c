#!/usr/bin/env python3
"""Digest manifest of GGUF files: make one from reference files, check others against it.

Owns: tests/golden/deepseek2_tiny_gguf_manifest.json's format. Per file: the
sha256 and size of the whole file, the GGUF version and alignment, every
metadata key in file order with its type and value (arrays as element type,
length and the sha256 of their encoded bytes), and every tensor in file order
with its ggml type, shape (ggml order, ne0 first), data offset and the sha256
of its data bytes.

Why built this way: the reference GGUFs come from llama.cpp's converter (torch,
dev time only); CI rebuilds them with write_deepseek2_gguf.py and must prove
the bytes are the same without the reference at hand. A whole-file sha256
proves it; the per-key and per-tensor entries say WHAT differs when it does
not. The parser is our own, standard library only (GGUF v2/v3 layout from
github.com/ggml-org/ggml docs/gguf.md), so the check shares no code with the
gguf-py writer it checks.

  python3 tests/ref/gguf_manifest.py make MANIFEST DIR [--note TEXT]
  python3 tests/ref/gguf_manifest.py check MANIFEST DIR
check exits 1 and prints one line per difference, naming file and key/tensor.
"""
import hashlib
import json
import os
import struct
import sys

FORMAT_VERSION = 1
VALUE_TYPES = {0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"),
               4: ("UINT32", "<I"), 5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<?"),
               8: ("STRING", None), 9: ("ARRAY", None), 10: ("UINT64", "<Q"),
               11: ("INT64", "<q"), 12: ("FLOAT64", "<d")}
# ggml type -> (name, elements per block, bytes per block)
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
              8: ("Q8_0", 32, 34), 12: ("Q4_K", 256, 144), 30: ("BF16", 1, 2)}


class Bad(Exception):
    pass


class Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, n):
        if self.pos + n > len(self.buf):
            raise Bad("truncated at byte %d" % self.pos)
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.unpack("<Q")
        return self.take(n).decode("utf-8")

    def value(self, t):
        """Returns the value (scalars, strings) or a digest dict (arrays)."""
        if t not in VALUE_TYPES:
            raise Bad("unknown value type %d at byte %d" % (t, self.pos))
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.unpack("<I"), self.unpack("<Q")
            start = self.pos
            for _ in range(n):
                self.value(et)
            return {"array": VALUE_TYPES[et][0], "n": n,
                    "sha256": hashlib.sha256(self.buf[start:self.pos]).hexdigest()}
        return self.unpack(VALUE_TYPES[t][1])


def digest(path):
    """Parses one GGUF file into the manifest entry described in the module docstring."""
    with open(path, "rb") as f:
        buf = f.read()
    r = Reader(buf)
    if r.take(4) != b"GGUF":
        raise Bad("not a GGUF file (bad magic)")
    version = r.unpack("<I")
    if version not in (2, 3):
        raise Bad("unsupported GGUF version %d" % version)
    n_tensors, n_kv = r.unpack("<Q"), r.unpack("<Q")
    kv, alignment = [], 32
    for _ in range(n_kv):
        key = r.string()
        t = r.unpack("<I")
        v = r.value(t)
        if key == "general.alignment":
            alignment = v
        kv.append([key, VALUE_TYPES[t][0], v])
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
        t, off = r.unpack("<I"), r.unpack("<Q")
        infos.append((name, dims, t, off))
    data_start = (r.pos + alignment - 1) // alignment * alignment
    tensors = []
    for name, dims, t, off in infos:
        if t not in GGML_TYPES:
            raise Bad("tensor %s: ggml type %d not supported by the manifest" % (name, t))
        tname, blk, bbytes = GGML_TYPES[t]
        n = 1
        for d in dims:
            n *= d
        nbytes = n // blk * bbytes
        lo = data_start + off
        if lo + nbytes > len(buf):
            raise Bad("tensor %s: data past end of file" % name)
        tensors.append([name, tname, dims, off, hashlib.sha256(buf[lo:lo + nbytes]).hexdigest()])
    return {"sha256": hashlib.sha256(buf).hexdigest(), "bytes": len(buf), "version": version,
            "alignment": alignment, "kv": kv, "tensors": tensors}


def make(manifest, directory, note):
    files = sorted(f for f in os.listdir(directory) if f.endswith(".gguf"))
    if not files:
        raise Bad("no .gguf files in %s" % directory)
    out = ["{", '"format_version": %d,' % FORMAT_VERSION, '"note": %s,' % json.dumps(note),
           '"files": {']
    for i, name in enumerate(files):
        d = digest(os.path.join(directory, name))
        out.append("%s: {" % json.dumps(name))
        for k in ("sha256", "bytes", "version", "alignment"):
            out.append("  %s: %s," % (json.dumps(k), json.dumps(d[k])))
        for k in ("kv", "tensors"):
            rows = [json.dumps(row, ensure_ascii=True) for row in d[k]]
            out.append('  "%s": [\n    %s\n  ]%s' % (k, ",\n    ".join(rows),
                                                    "," if k == "kv" else ""))
        out.append("}" + ("," if i + 1 < len(files) else ""))
    out += ["}", "}"]
    with open(manifest, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    return files


def check(manifest, directory):
    """Returns a list of differences (empty when every file matches), one line each."""
    with open(manifest, encoding="utf-8") as f:
        want_all = json.load(f)["files"]
    errors = []
    for name, want in sorted(want_all.items()):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            errors.append("%s: missing" % path)
            continue
        try:
            got = digest(path)
        except (Bad, UnicodeDecodeError) as e:
            errors.append("%s: %s" % (path, e))
            continue
        if got["sha256"] == want["sha256"]:
            continue
        n_before = len(errors)
        for k in ("bytes", "version", "alignment"):
            if got[k] != want[k]:
                errors.append("%s: %s is %s, manifest says %s" % (path, k, got[k], want[k]))
        gkv = {row[0]: row[1:] for row in got["kv"]}
        wkv = {row[0]: row[1:] for row in want["kv"]}
        for key, (t, v) in wkv.items():
            if key not in gkv:
                errors.append("%s: metadata key %s missing" % (path, key))
            elif gkv[key] != [t, v]:
                errors.append("%s: metadata key %s is %s %s, manifest says %s %s"
                              % (path, key, gkv[key][0], json.dumps(gkv[key][1]), t,
                                 json.dumps(v)))
        for key in gkv.keys() - wkv.keys():
            errors.append("%s: unexpected metadata key %s" % (path, key))
        if [r[0] for r in got["kv"]] != [r[0] for r in want["kv"]] and len(errors) == n_before:
            errors.append("%s: metadata keys in a different order" % path)
        gt = {row[0]: row[1:] for row in got["tensors"]}
        wt = {row[0]: row[1:] for row in want["tensors"]}
        for tn, (t, shape, off, sha) in wt.items():
            if tn not in gt:
                errors.append("%s: tensor %s missing" % (path, tn))
                continue
            g = gt[tn]
            if g[0] != t or g[1] != shape:
                errors.append("%s: tensor %s is %s %s, manifest says %s %s"
                              % (path, tn, g[0], g[1], t, shape))
            elif g[3] != sha:
                errors.append("%s: tensor %s data differs (sha256 %s, manifest says %s)"
                              % (path, tn, g[3][:16], sha[:16]))
            elif g[2] != off:
                errors.append("%s: tensor %s at offset %d, manifest says %d"
                              % (path, tn, g[2], off))
        for tn in gt.keys() - wt.keys():
            errors.append("%s: unexpected tensor %s" % (path, tn))
        if [r[0] for r in got["tensors"]] != [r[0] for r in want["tensors"]] \
                and len(errors) == n_before:
            errors.append("%s: tensors in a different order" % path)
        if len(errors) == n_before:
            errors.append("%s: file sha256 %s, manifest says %s (padding or header bytes)"
                          % (path, got["sha256"][:16], want["sha256"][:16]))
    return errors


def main():
    if len(sys.argv) < 4 or sys.argv[1] not in ("make", "check"):
        sys.exit(__doc__.split("\n\n")[-1])
    manifest, directory = sys.argv[2], sys.argv[3]
    try:
        if sys.argv[1] == "make":
            note = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--note" else ""
            for f in make(manifest, directory, note):
                print("manifest: %s" % f)
            return
        errors = check(manifest, directory)
    except (Bad, OSError, ValueError) as e:
        sys.exit("gguf_manifest: %s" % e)
    for e in errors:
        print("gguf_manifest: MISMATCH %s" % e, file=sys.stderr)
    if errors:
        sys.exit(1)
    print("gguf_manifest: %d files match %s" % (len(json.load(open(manifest))["files"]), manifest))


if __name__ == "__main__":
    main()
