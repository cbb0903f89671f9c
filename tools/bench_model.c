/* Model files of real models' shapes with random weights, written on
 * demand for benchmarks (never committed): GGUF v3 (github.com/ggml-org/
 * ggml docs/gguf.md) that dsqd, dsq-bench cpu and llama.cpp all load.
 *
 *   6.7b     llama, DeepSeek-Coder-6.7B's config.json: 32 layers, n_embd
 *            4096, 32 heads of 128 (MHA), n_ff 11008, vocab 32256, RoPE
 *            base 100000. 3.8 GB.
 *   v2-lite  deepseek2, DeepSeek-V2-Lite's config.json: 27 layers, n_embd
 *            2048, MLA (16 heads, kv_lora 512, nope 128, rope 64, v 128, no
 *            q_lora), 64 routed experts of 1408 (6 used) + 2 shared, the
 *            first layer dense (10944), vocab 102400; llama.cpp's converter
 *            layout (split attn_k_b / attn_v_b, stacked *_exps). 8.9 GB.
 *   quick    a 2-layer llama of 64 (the GPU simulator's smoke test).
 *   v2-quick a 2-layer deepseek2 of 64 (one dense layer, one of 4 experts):
 *            the writer's own test.
 * Every matrix is Q4_0 (ggml's block of 32: fp16 d, 16 bytes of nibbles,
 * w = (q - 8) d) with uniform random nibbles and d = 0.22 / sqrt(k)
 * (unit-variance products: timing does not depend on values, outputs stay
 * finite); norms F32 near 1; a llama (SPM) vocabulary of <unk>, <s>, </s>,
 * the 256 byte tokens and placeholder pieces. */
#include "dsq_config.h"

#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/io/tensor.h"

const char *dsq__bench_model_name(const char *shape);
int dsq__bench_model_vocab(const char *shape);
int dsq__bench_model_write(const char *shape, const char *path);
int dsq__bench_write_model_main(int argc, char **argv);

/* A model's shape. deepseek2 only: the MLA and MoE fields (llama.cpp's
 * deepseek2.* keys). */
typedef struct shape {
    const char *key;             /* --shape */
    const char *arch;            /* "llama" or "deepseek2" */
    int n_layer, n_embd, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    double rope_theta;
    const char *name;
    int kv_lora, qk_nope, qk_rope, v_dim;
    int n_expert, n_expert_used, n_shared, n_ff_exp, n_dense;
} shape_t;

static const shape_t SHAPES[] = {
    /* deepseek-coder-6.7b-base config.json */
    {"6.7b", "llama", 32, 4096, 32, 32, 11008, 32256, 16384, 100000.0,
     "deepseek-coder-6.7b shapes (random Q4_0)", 0, 0, 0, 0, 0, 0, 0, 0, 0},
    {"quick", "llama", 2, 64, 4, 2, 128, 320, 512, 10000.0,
     "tiny llama (random Q4_0)", 0, 0, 0, 0, 0, 0, 0, 0, 0},
    /* DeepSeek-V2-Lite config.json: 27 layers, MLA without q_lora (kv_lora
     * 512, nope 128, rope 64, v 128, 16 heads), 64 routed experts of 1408,
     * 6 used, 2 shared, the first layer dense (10944) */
    {"v2-lite", "deepseek2", 27, 2048, 16, 1, 10944, 102400, 4096, 10000.0,
     "deepseek-v2-lite shapes (random Q4_0)", 512, 128, 64, 128, 64, 6, 2, 1408, 1},
    {"v2-quick", "deepseek2", 2, 64, 4, 1, 64, 320, 256, 10000.0,
     "tiny deepseek2 (random Q4_0)", 64, 32, 32, 32, 4, 2, 1, 32, 1},
};

enum { GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6, GGUF_BOOL = 7, GGUF_STR = 8,
       GGUF_ARR = 9 };

typedef struct wr {
    FILE *f;
    uint64_t rng;
    int err;
} wr_t;

static void put(wr_t *w, const void *p, size_t n)
{
    if (!w->err && fwrite(p, 1, n, w->f) != n)
        w->err = errno ? errno : EIO;
}
static void put_u32(wr_t *w, uint32_t v) { put(w, &v, 4); }
static void put_u64(wr_t *w, uint64_t v) { put(w, &v, 8); }
static void put_str(wr_t *w, const char *s)
{
    put_u64(w, strlen(s));
    put(w, s, strlen(s));
}
static void kv_u32(wr_t *w, const char *k, uint32_t v)
{
    put_str(w, k);
    put_u32(w, GGUF_U32);
    put_u32(w, v);
}
static void kv_f32(wr_t *w, const char *k, float v)
{
    put_str(w, k);
    put_u32(w, GGUF_F32);
    put(w, &v, 4);
}
static void kv_str(wr_t *w, const char *k, const char *v)
{
    put_str(w, k);
    put_u32(w, GGUF_STR);
    put_str(w, v);
}
static void kv_bool(wr_t *w, const char *k, bool v)
{
    uint8_t b = v;
    put_str(w, k);
    put_u32(w, GGUF_BOOL);
    put(w, &b, 1);
}

static uint64_t next64(wr_t *w)
{
    w->rng ^= w->rng << 13;
    w->rng ^= w->rng >> 7;
    w->rng ^= w->rng << 17;
    return w->rng;
}

typedef struct tdesc {
    char name[64];
    dsq_type_t type;
    int64_t ne0, ne1, ne2;       /* ne1 = 1 for vectors, ne2 = 1 unless stacked */
    size_t bytes, offset;
} tdesc_t;

#define ALIGN 32u

static size_t pad_to(size_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }

static int add_t3(tdesc_t *t, int *n, size_t *off, const char *name, dsq_type_t type,
                  int64_t ne0, int64_t ne1, int64_t ne2)
{
    tdesc_t *d = &t[(*n)++];
    snprintf(d->name, sizeof(d->name), "%s", name);
    d->type = type;
    d->ne0 = ne0;
    d->ne1 = ne1;
    d->ne2 = ne2;
    if (dsq_type_bytes(type, ne0 * ne1 * ne2, &d->bytes))
        return DSQ_EINVAL;
    d->offset = *off;
    *off = pad_to(*off + d->bytes);
    return 0;
}

static int add_t(tdesc_t *t, int *n, size_t *off, const char *name, dsq_type_t type,
                 int64_t ne0, int64_t ne1)
{
    return add_t3(t, n, off, name, type, ne0, ne1, 1);
}

/* Tensor data: Q4_0 blocks with random nibbles and d = 0.22/sqrt(ne0), or
 * F32 norms near 1. Written in 1 MiB chunks. */
static void write_data(wr_t *w, const tdesc_t *d)
{
    enum { CHUNK = 1 << 20 };
    static uint8_t buf[CHUNK];
    if (d->type == DSQ_TYPE_F32) {
        for (int64_t i = 0; i < d->ne0 * d->ne1 * d->ne2; i++) {
            float v = 1.0f + (float)((int)(next64(w) >> 40) % 201 - 100) * 1e-3f;
            put(w, &v, 4);
        }
    } else {
        const uint16_t dh = dsq_fp32_to_fp16(0.22f / sqrtf((float)d->ne0));
        const size_t blk = 18, per = CHUNK / blk;
        size_t n_blk = d->bytes / blk;
        while (n_blk && !w->err) {
            size_t m = n_blk < per ? n_blk : per;
            for (size_t b = 0; b < m; b++) {
                uint8_t *p = buf + b * blk;
                memcpy(p, &dh, 2);
                uint64_t r0 = next64(w), r1 = next64(w);
                memcpy(p + 2, &r0, 8);
                memcpy(p + 10, &r1, 8);
            }
            put(w, buf, m * blk);
            n_blk -= m;
        }
    }
    static const uint8_t zeros[ALIGN];
    put(w, zeros, pad_to(d->bytes) - d->bytes);
}

/* llama: every matrix Q4_0, norms F32. */
static int llama_tensors(const shape_t *s, tdesc_t *t, int *n, size_t *off)
{
    int rc = 0;
    const int64_t d = s->n_embd, hd = s->n_embd / s->n_head, kvd = hd * s->n_head_kv;
    rc |= add_t(t, n, off, "token_embd.weight", DSQ_TYPE_Q4_0, d, s->n_vocab);
    rc |= add_t(t, n, off, "output_norm.weight", DSQ_TYPE_F32, d, 1);
    rc |= add_t(t, n, off, "output.weight", DSQ_TYPE_Q4_0, d, s->n_vocab);
    for (int l = 0; l < s->n_layer && !rc; l++) {
        char nm[64];
#define T(suffix, type, a, b)                                            \
        snprintf(nm, sizeof(nm), "blk.%d." suffix, l);                   \
        rc |= add_t(t, n, off, nm, type, a, b)
        T("attn_norm.weight", DSQ_TYPE_F32, d, 1);
        T("attn_q.weight", DSQ_TYPE_Q4_0, d, d);
        T("attn_k.weight", DSQ_TYPE_Q4_0, d, kvd);
        T("attn_v.weight", DSQ_TYPE_Q4_0, d, kvd);
        T("attn_output.weight", DSQ_TYPE_Q4_0, d, d);
        T("ffn_norm.weight", DSQ_TYPE_F32, d, 1);
        T("ffn_gate.weight", DSQ_TYPE_Q4_0, d, s->n_ff);
        T("ffn_up.weight", DSQ_TYPE_Q4_0, d, s->n_ff);
        T("ffn_down.weight", DSQ_TYPE_Q4_0, s->n_ff, d);
#undef T
    }
    return rc;
}

/* deepseek2 in llama.cpp's converter layout (convert_hf_to_gguf.py, the
 * split attn_k_b / attn_v_b form and stacked *_exps experts, as
 * tests/ref/write_deepseek2_gguf.py writes the tiny ones): matrices Q4_0,
 * norms and the router F32. */
static int ds2_tensors(const shape_t *s, tdesc_t *t, int *n, size_t *off)
{
    int rc = 0;
    const int64_t d = s->n_embd, H = s->n_head, dn = s->qk_nope, dr = s->qk_rope;
    const int64_t kvl = s->kv_lora, dv = s->v_dim, E = s->n_expert;
    rc |= add_t(t, n, off, "token_embd.weight", DSQ_TYPE_Q4_0, d, s->n_vocab);
    rc |= add_t(t, n, off, "output_norm.weight", DSQ_TYPE_F32, d, 1);
    rc |= add_t(t, n, off, "output.weight", DSQ_TYPE_Q4_0, d, s->n_vocab);
    for (int l = 0; l < s->n_layer && !rc; l++) {
        char nm[64];
#define T3(suffix, type, a, b, c)                                        \
        snprintf(nm, sizeof(nm), "blk.%d." suffix, l);                   \
        rc |= add_t3(t, n, off, nm, type, a, b, c)
        T3("attn_norm.weight", DSQ_TYPE_F32, d, 1, 1);
        T3("attn_q.weight", DSQ_TYPE_Q4_0, d, H * (dn + dr), 1);
        T3("attn_kv_a_mqa.weight", DSQ_TYPE_Q4_0, d, kvl + dr, 1);
        T3("attn_kv_a_norm.weight", DSQ_TYPE_F32, kvl, 1, 1);
        T3("attn_k_b.weight", DSQ_TYPE_Q4_0, dn, kvl, H);
        T3("attn_v_b.weight", DSQ_TYPE_Q4_0, kvl, dv, H);
        T3("attn_output.weight", DSQ_TYPE_Q4_0, H * dv, d, 1);
        T3("ffn_norm.weight", DSQ_TYPE_F32, d, 1, 1);
        if (l < s->n_dense) {
            T3("ffn_gate.weight", DSQ_TYPE_Q4_0, d, s->n_ff, 1);
            T3("ffn_up.weight", DSQ_TYPE_Q4_0, d, s->n_ff, 1);
            T3("ffn_down.weight", DSQ_TYPE_Q4_0, s->n_ff, d, 1);
        } else {
            const int64_t fe = s->n_ff_exp, fs = s->n_ff_exp * s->n_shared;
            T3("ffn_gate_inp.weight", DSQ_TYPE_F32, d, E, 1);
            T3("ffn_gate_exps.weight", DSQ_TYPE_Q4_0, d, fe, E);
            T3("ffn_up_exps.weight", DSQ_TYPE_Q4_0, d, fe, E);
            T3("ffn_down_exps.weight", DSQ_TYPE_Q4_0, fe, d, E);
            T3("ffn_gate_shexp.weight", DSQ_TYPE_Q4_0, d, fs, 1);
            T3("ffn_up_shexp.weight", DSQ_TYPE_Q4_0, d, fs, 1);
            T3("ffn_down_shexp.weight", DSQ_TYPE_Q4_0, fs, d, 1);
        }
#undef T3
    }
    return rc;
}

/* Write the model to path. Returns 0 or an errno-style code. */
static int write_model(const char *path, const shape_t *s)
{
    const bool ds2 = strcmp(s->arch, "deepseek2") == 0;
    const int nt_max = 3 + 16 * s->n_layer;
    tdesc_t *t = calloc((size_t)nt_max, sizeof(*t));
    if (!t)
        return DSQ_ENOMEM;
    int n = 0, rc = 0;
    size_t off = 0;
    rc = ds2 ? ds2_tensors(s, t, &n, &off) : llama_tensors(s, t, &n, &off);
    if (rc) {
        free(t);
        return DSQ_EINVAL;
    }
    wr_t w = {.f = fopen(path, "wb"), .rng = 0x2545f4914f6cdd1dull};
    if (!w.f) {
        free(t);
        return errno ? errno : EIO;
    }
    setvbuf(w.f, NULL, _IOFBF, 1 << 22);
    put(&w, "GGUF", 4);
    put_u32(&w, 3);
    put_u64(&w, (uint64_t)n);
    put_u64(&w, ds2 ? 34 : 17);                        /* KV pairs below */
    char k[96];
#define KEY(name) (snprintf(k, sizeof(k), "%s." name, s->arch), k)
    kv_str(&w, "general.architecture", s->arch);
    kv_str(&w, "general.name", s->name);
    kv_u32(&w, "general.alignment", ALIGN);
    kv_u32(&w, KEY("block_count"), (uint32_t)s->n_layer);
    kv_u32(&w, KEY("context_length"), (uint32_t)s->n_ctx);
    kv_u32(&w, KEY("embedding_length"), (uint32_t)s->n_embd);
    kv_u32(&w, KEY("feed_forward_length"), (uint32_t)s->n_ff);
    kv_u32(&w, KEY("attention.head_count"), (uint32_t)s->n_head);
    kv_u32(&w, KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    kv_f32(&w, KEY("rope.freq_base"), (float)s->rope_theta);
    kv_f32(&w, KEY("attention.layer_norm_rms_epsilon"), 1e-6f);
    if (ds2) {
        /* the converter's MLA convention: the cache row is the latent and
         * the rope key (key_length), the per-head key and value of the
         * expanded form are *_mla */
        kv_u32(&w, KEY("attention.key_length"), (uint32_t)(s->kv_lora + s->qk_rope));
        kv_u32(&w, KEY("attention.value_length"), (uint32_t)s->kv_lora);
        kv_u32(&w, KEY("attention.key_length_mla"), (uint32_t)(s->qk_nope + s->qk_rope));
        kv_u32(&w, KEY("attention.value_length_mla"), (uint32_t)s->v_dim);
        kv_u32(&w, KEY("attention.kv_lora_rank"), (uint32_t)s->kv_lora);
        kv_u32(&w, KEY("rope.dimension_count"), (uint32_t)s->qk_rope);
        kv_u32(&w, KEY("leading_dense_block_count"), (uint32_t)s->n_dense);
        kv_u32(&w, KEY("expert_count"), (uint32_t)s->n_expert);
        kv_u32(&w, KEY("expert_used_count"), (uint32_t)s->n_expert_used);
        kv_u32(&w, KEY("expert_shared_count"), (uint32_t)s->n_shared);
        kv_u32(&w, KEY("expert_feed_forward_length"), (uint32_t)s->n_ff_exp);
        kv_f32(&w, KEY("expert_weights_scale"), 1.0f);
        kv_bool(&w, KEY("expert_weights_norm"), false);
        kv_u32(&w, KEY("expert_gating_func"), 1);          /* softmax */
        kv_u32(&w, KEY("vocab_size"), (uint32_t)s->n_vocab);
        kv_u32(&w, "general.quantization_version", 2);
        kv_u32(&w, "general.file_type", 2);                 /* MOSTLY_Q4_0 */
    }
#undef KEY
    kv_str(&w, "tokenizer.ggml.model", "llama");
    kv_u32(&w, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(&w, "tokenizer.ggml.eos_token_id", 2);
    kv_bool(&w, "tokenizer.ggml.add_bos_token", true);
    /* the vocabulary: <unk> <s> </s>, <0x00>..<0xFF>, then "▁t<i>" */
    put_str(&w, "tokenizer.ggml.tokens");
    put_u32(&w, GGUF_ARR);
    put_u32(&w, GGUF_STR);
    put_u64(&w, (uint64_t)s->n_vocab);
    for (int i = 0; i < s->n_vocab; i++) {
        char tok[32];
        if (i < 3)
            snprintf(tok, sizeof(tok), "%s", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
        else if (i < 259)
            snprintf(tok, sizeof(tok), "<0x%02X>", i - 3);
        else
            snprintf(tok, sizeof(tok), "\xe2\x96\x81t%d", i);
        put_str(&w, tok);
    }
    put_str(&w, "tokenizer.ggml.token_type");
    put_u32(&w, GGUF_ARR);
    put_u32(&w, GGUF_I32);
    put_u64(&w, (uint64_t)s->n_vocab);
    for (int i = 0; i < s->n_vocab; i++)
        put_u32(&w, i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);
    for (int i = 0; i < n; i++) {
        put_str(&w, t[i].name);
        const uint32_t dims = t[i].ne2 > 1 ? 3 : t[i].ne1 > 1 ? 2 : 1;
        put_u32(&w, dims);
        put_u64(&w, (uint64_t)t[i].ne0);
        if (dims > 1)
            put_u64(&w, (uint64_t)t[i].ne1);
        if (dims > 2)
            put_u64(&w, (uint64_t)t[i].ne2);
        put_u32(&w, (uint32_t)t[i].type);
        put_u64(&w, t[i].offset);
    }
    long pos = ftell(w.f);
    static const uint8_t zeros[ALIGN];
    if (pos < 0)
        w.err = EIO;
    else
        put(&w, zeros, pad_to((size_t)pos) - (size_t)pos);
    for (int i = 0; i < n && !w.err; i++)
        write_data(&w, &t[i]);
    if (fclose(w.f) && !w.err)
        w.err = errno ? errno : EIO;
    free(t);
    return w.err;
}

const char *dsq__bench_model_name(const char *shape)
{
    for (size_t i = 0; i < sizeof(SHAPES) / sizeof(SHAPES[0]); i++)
        if (strcmp(shape, SHAPES[i].key) == 0)
            return SHAPES[i].name;
    return NULL;
}

int dsq__bench_model_vocab(const char *shape)
{
    for (size_t i = 0; i < sizeof(SHAPES) / sizeof(SHAPES[0]); i++)
        if (strcmp(shape, SHAPES[i].key) == 0)
            return SHAPES[i].n_vocab;
    return 0;
}

int dsq__bench_model_write(const char *shape, const char *path)
{
    for (size_t i = 0; i < sizeof(SHAPES) / sizeof(SHAPES[0]); i++)
        if (strcmp(shape, SHAPES[i].key) == 0)
            return write_model(path, &SHAPES[i]);
    return DSQ_EINVAL;
}

/* dsq-bench write-model --shape S PATH (and dsq-bench gpu --write-model):
 * one model file, for dsqd, dsq-bench cpu or a peer. */
int dsq__bench_write_model_main(int argc, char **argv)
{
    const char *shape = "6.7b", *path = NULL;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--shape") == 0 && i + 1 < argc)
            shape = argv[++i];
        else if (!path && argv[i][0] != '-')
            path = argv[i];
        else {
            fprintf(stderr, "dsq-bench write-model: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!path || !dsq__bench_model_name(shape)) {
        fprintf(stderr, "usage: dsq-bench write-model [--shape 6.7b|v2-lite|quick|v2-quick] PATH\n");
        return 2;
    }
    int rc = dsq__bench_model_write(shape, path);
    if (rc) {
        fprintf(stderr, "dsq-bench write-model: cannot write %s: %s\n", path,
                rc > 0 ? strerror(rc) : dsq_strerror(rc));
        unlink(path);
        return 1;
    }
    return 0;
}
