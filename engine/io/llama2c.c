/* llama2.c legacy checkpoint reader.
 *
 * The format has no magic and no tensor table, so the whole layout is
 * computed from the header (with overflow checks) and the file size must
 * match it exactly; that is the only integrity check the format allows.
 * Weights are exposed under canonical GGUF names so the model code sees one
 * naming for every format. Layout: karpathy/llama2.c run.c
 * memory_map_weights() and tests/data/SOURCES.md section 1.
 */
#include "llama2c.h"
#include "engine/common/error.h"
#include "mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct dsq_llama2c {
    const uint8_t *base;
    size_t size;
    dsq_model_config_t config;
    int n_tensors;
    dsq_tensor_t *tensors;
    char *names;          /* one block holding every name */
};

#define NAME_LEN 48

/* Add tensor i: a 1-D or 2-D F32 view at float offset off. */
static void add(dsq_llama2c_t *m, const char *name, int64_t ne0, int64_t ne1,
                uint64_t off)
{
    dsq_tensor_t *t = &m->tensors[m->n_tensors];
    char *nm = m->names + (size_t)m->n_tensors * NAME_LEN;
    snprintf(nm, NAME_LEN, "%s", name);
    t->name = nm;
    t->type = DSQ_TYPE_F32;
    t->n_dims = ne1 > 1 ? 2 : 1;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = t->ne[3] = 1;
    t->data = m->base + 28 + off * 4;
    t->n_bytes = (size_t)(ne0 * ne1) * 4;
    m->n_tensors++;
}

static uint64_t mul_chk(uint64_t a, uint64_t b, uint64_t c, bool *ovf)
{
    uint64_t r;
    if (__builtin_mul_overflow(a, b, &r) || __builtin_mul_overflow(r, c, &r))
        *ovf = true;
    return r;
}

static uint64_t add_chk(uint64_t a, uint64_t b, bool *ovf)
{
    uint64_t r;
    if (__builtin_add_overflow(a, b, &r))
        *ovf = true;
    return r;
}

static int build(dsq_llama2c_t *m, const char *path, char *err, size_t err_len)
{
    int32_t hdr[7];
    char cerr[256] = "";
    if (m->size < 28) {
        dsq_error_set(err, err_len, "%s: not a llama2.c checkpoint (shorter than the 28-byte header)", path);
        return DSQ_EFORMAT;
    }
    memcpy(hdr, m->base, sizeof(hdr));
    int rc = dsq_model_config_from_llama2c(hdr, &m->config, cerr, sizeof(cerr));
    if (rc != DSQ_OK) {
        dsq_error_set(err, err_len, "%s: %s", path, cerr);
        return rc;
    }
    const dsq_model_config_t *c = &m->config;
    /* header fields are up to 2^31 each: every product is checked */
    bool ovf = false;
    uint64_t dim = (uint64_t)c->n_embd, hid = (uint64_t)c->n_ff;
    uint64_t L = (uint64_t)c->n_layer, V = (uint64_t)c->n_vocab;
    uint64_t kv = dim / (uint64_t)c->n_head * (uint64_t)c->n_head_kv;
    uint64_t hs = (uint64_t)c->head_dim, seq = (uint64_t)c->n_ctx_train;
    uint64_t o_emb = 0;
    uint64_t o_att = add_chk(o_emb, mul_chk(V, dim, 1, &ovf), &ovf);
    uint64_t o_wq = add_chk(o_att, mul_chk(L, dim, 1, &ovf), &ovf);
    uint64_t o_wk = add_chk(o_wq, mul_chk(L, dim, dim, &ovf), &ovf);
    uint64_t o_wv = add_chk(o_wk, mul_chk(L, kv, dim, &ovf), &ovf);
    uint64_t o_wo = add_chk(o_wv, mul_chk(L, kv, dim, &ovf), &ovf);
    uint64_t o_ffn = add_chk(o_wo, mul_chk(L, dim, dim, &ovf), &ovf);
    uint64_t o_w1 = add_chk(o_ffn, mul_chk(L, dim, 1, &ovf), &ovf);
    uint64_t o_w2 = add_chk(o_w1, mul_chk(L, hid, dim, &ovf), &ovf);
    uint64_t o_w3 = add_chk(o_w2, mul_chk(L, dim, hid, &ovf), &ovf);
    uint64_t o_fin = add_chk(o_w3, mul_chk(L, hid, dim, &ovf), &ovf);
    uint64_t o_cis = add_chk(o_fin, dim, &ovf);
    uint64_t o_cls = add_chk(o_cis, mul_chk(seq, hs / 2, 2, &ovf), &ovf);
    uint64_t n_floats = add_chk(o_cls, c->tie_word_embeddings ? 0 : mul_chk(V, dim, 1, &ovf), &ovf);
    if (ovf || n_floats > (uint64_t)1 << 60)
        n_floats = (uint64_t)1 << 60;
    uint64_t want = 28 + n_floats * 4;
    if (ovf || (uint64_t)m->size != want) {
        dsq_error_set(err, err_len, "%s: llama2.c checkpoint is %zu bytes, header "
                "(dim=%lld hidden_dim=%lld n_layers=%lld n_heads=%lld n_kv_heads=%lld vocab_size=%d seq_len=%lld) "
                "needs %llu", path, m->size, (long long)c->n_embd, (long long)c->n_ff,
                (long long)c->n_layer, (long long)c->n_head, (long long)c->n_head_kv, hdr[5],
                (long long)c->n_ctx_train, (unsigned long long)want);
        return DSQ_EFORMAT;
    }
    size_t n = 3 + 9 * (size_t)L + 1;
    m->tensors = calloc(n, sizeof(*m->tensors));
    m->names = calloc(n, NAME_LEN);
    if (!m->tensors || !m->names) {
        dsq_error_set(err, err_len, "%s: out of memory", path);
        return DSQ_ENOMEM;
    }
    char nm[NAME_LEN];
    add(m, "token_embd.weight", (int64_t)dim, (int64_t)V, o_emb);
    for (uint64_t l = 0; l < L; l++) {
        snprintf(nm, sizeof(nm), "blk.%llu.attn_norm.weight", (unsigned long long)l);
        add(m, nm, (int64_t)dim, 1, o_att + l * dim);
        snprintf(nm, sizeof(nm), "blk.%llu.attn_q.weight", (unsigned long long)l);
        add(m, nm, (int64_t)dim, (int64_t)dim, o_wq + l * dim * dim);
        snprintf(nm, sizeof(nm), "blk.%llu.attn_k.weight", (unsigned long long)l);
        add(m, nm, (int64_t)dim, (int64_t)kv, o_wk + l * kv * dim);
        snprintf(nm, sizeof(nm), "blk.%llu.attn_v.weight", (unsigned long long)l);
        add(m, nm, (int64_t)dim, (int64_t)kv, o_wv + l * kv * dim);
        snprintf(nm, sizeof(nm), "blk.%llu.attn_output.weight", (unsigned long long)l);
        add(m, nm, (int64_t)dim, (int64_t)dim, o_wo + l * dim * dim);
        snprintf(nm, sizeof(nm), "blk.%llu.ffn_norm.weight", (unsigned long long)l);
        add(m, nm, (int64_t)dim, 1, o_ffn + l * dim);
        snprintf(nm, sizeof(nm), "blk.%llu.ffn_gate.weight", (unsigned long long)l);
        add(m, nm, (int64_t)dim, (int64_t)hid, o_w1 + l * hid * dim);
        snprintf(nm, sizeof(nm), "blk.%llu.ffn_down.weight", (unsigned long long)l);
        add(m, nm, (int64_t)hid, (int64_t)dim, o_w2 + l * dim * hid);
        snprintf(nm, sizeof(nm), "blk.%llu.ffn_up.weight", (unsigned long long)l);
        add(m, nm, (int64_t)dim, (int64_t)hid, o_w3 + l * hid * dim);
    }
    add(m, "output_norm.weight", (int64_t)dim, 1, o_fin);
    if (!c->tie_word_embeddings)
        add(m, "output.weight", (int64_t)dim, (int64_t)V, o_cls);
    snprintf(m->config.name, sizeof(m->config.name), "llama2.c");
    return DSQ_OK;
}

void dsq_llama2c_close(dsq_llama2c_t *m)
{
    if (!m)
        return;
    if (m->base)
        munmap((void *)m->base, m->size);
    free(m->tensors);
    free(m->names);
    free(m);
}

dsq_llama2c_t *dsq_llama2c_open(const char *path, char *err, size_t err_len)
{
    void *map;
    size_t size;
    if (dsq__map_file(path, 28, "not a llama2.c checkpoint (shorter than its 28-byte header)",
                      &map, &size, err, err_len) != DSQ_OK)
        return NULL;
    dsq_llama2c_t *m = calloc(1, sizeof(*m));
    if (!m) {
        dsq_error_set(err, err_len, "%s: out of memory", path);
        munmap(map, size);
        return NULL;
    }
    m->base = map;
    m->size = size;
    if (build(m, path, err, err_len) != DSQ_OK) {
        dsq_llama2c_close(m);
        m = NULL;
    }
    return m;
}

const dsq_model_config_t *dsq_llama2c_config(const dsq_llama2c_t *m)
{
    return &m->config;
}

int dsq_llama2c_n_tensors(const dsq_llama2c_t *m) { return m->n_tensors; }

const dsq_tensor_t *dsq_llama2c_tensor(const dsq_llama2c_t *m, int i)
{
    return (i >= 0 && i < m->n_tensors) ? &m->tensors[i] : NULL;
}
