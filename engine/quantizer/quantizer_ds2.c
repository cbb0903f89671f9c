/* dsq-quantize for DeepSeek-V2/V3 sources (Hugging Face directories):
 * RTN only (the calibration tap for AWQ/GPTQ lives in the llama/qwen2
 * graph), with the default or the deepseek-moe recipe
 * (dsq_quantizer_recipe_select), written as one AutoGPTQ v1 checkpoint that
 * mixes bit widths per module:
 *   - 4-bit linears: dsq_quantizer_quantize (RTN, group g, asym unless
 *     --sym, z >= 1) packed by dsq_quantizer_pack_gptq, g_idx = r / g;
 *   - 8-bit linears: dsq_quant_int8_channel (s = amax/127 rounded up to
 *     fp16, q in -127..127) packed by dsq_quantizer_pack_gptq8, per output
 *     channel (group_size -1, g_idx all 0, z = 128);
 *   - router, norms, embeddings, lm_head, biases and linears the packing
 *     cannot hold (n or k not a multiple of 8 / 4) in the source dtype.
 * config.json is the source's with quantization_config replaced: the global
 * scheme is the 4-bit one and GPTQModel's `dynamic` per-module overrides
 * (regex keys, "+:" positive with {bits, group_size, sym, desc_act}, "-:"
 * negative = not quantized; read by GPTQModel and vLLM's gptq /
 * gptq_marlin configs) declare the 8-bit classes and the unpacked modules.
 * Why a separate path: the llama path (quantizer_run.c) is built around
 * seven linears per layer and the calibration forward pass; MLA + MoE
 * layers have a different and data-dependent module list. */
#include "quantizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/common/error.h"
#include "kernels.h"
#include "engine/loader/loader.h"
#include "engine/io/model_config.h"
#include "engine/model/quant.h"

typedef struct ds2q {
    const dsq_qrun_opts_t *o;
    const dsq_model_file_t *f;
    dsq_st_writer_t *wr;
    int g;
    int n4, n8, n_kept;
    cJSON *neg;                     /* array of HF module names kept unpacked */
    bool cls8[3];                   /* attention, shared experts, dense FFN   */
    char *err;
    size_t err_len;
} ds2q_t;

static int ferr(ds2q_t *q, int rc, const char *fmt, const char *a, const char *b)
{
    snprintf(q->err, q->err_len, fmt, a, b);
    return rc;
}

/* Copy a tensor in its own dtype under its HF name. */
static int put_raw(ds2q_t *q, const char *hf, const dsq_tensor_t *t)
{
    if (t->type != DSQ_TYPE_F32 && t->type != DSQ_TYPE_F16 && t->type != DSQ_TYPE_BF16)
        return ferr(q, DSQ_EUNSUPPORTED, "quantize: %s: type %s (F32/F16/BF16 sources only)",
                    hf, dsq_type_name(t->type));
    int64_t shape[4];
    for (int i = 0; i < t->n_dims; i++)
        shape[i] = t->ne[t->n_dims - 1 - i];
    int rc = dsq_st_writer_add(q->wr, hf, t->type, t->n_dims, shape, t->data, t->n_bytes);
    return rc ? ferr(q, rc, "quantize: cannot add %s%s", hf, "") : DSQ_OK;
}

static int put_i32(ds2q_t *q, const char *base, const char *suf, int n_dims,
                   const int64_t *shape, const void *data, dsq_type_t ty)
{
    char name[256];
    snprintf(name, sizeof(name), "%s.%s", base, suf);
    size_t n = 1;
    for (int i = 0; i < n_dims; i++)
        n *= (size_t)shape[i];
    int rc = dsq_st_writer_add(q->wr, name, ty, n_dims, shape, data,
                               n * (ty == DSQ_TYPE_F16 ? 2 : 4));
    return rc ? ferr(q, rc, "quantize: cannot add %s%s", name, "") : DSQ_OK;
}

static int pack4(ds2q_t *q, const char *base, const dsq_tensor_t *t, bool sym)
{
    const int64_t k = t->ne[0], n = t->ne[1], g = q->g, nb = (k + g - 1) / g;
    dsq_weight_t src;
    void *copy = NULL;
    int rc = dsq_quant_from_gguf(t, &src, &copy, q->err, q->err_len);
    if (rc)
        return rc;
    float *w = malloc((size_t)(n * k) * sizeof(*w));
    uint8_t *qq = malloc((size_t)(n * k));
    uint16_t *sc = malloc((size_t)(n * nb) * 2), *sc2 = malloc((size_t)(n * nb) * 2);
    uint8_t *zr = malloc((size_t)(n * nb));
    int32_t *qw = malloc((size_t)(k / 8 * n) * 4), *qz = malloc((size_t)(nb * n / 8) * 4);
    int32_t *gi = malloc((size_t)k * 4);
    if (!w || !qq || !sc || !sc2 || !zr || !qw || !qz || !gi)
        rc = DSQ_ENOMEM;
    for (int64_t r = 0; r < n && !rc; r++)
        rc = dsq_weight_dequant_row(&src, r, w + r * k);
    dsq_qopts_t qo = {.group_size = (int)g, .sym = sym, .zero_min1 = true};
    if (!rc)
        rc = dsq_quantizer_quantize(w, n, k, NULL, 0, &qo, qq, sc, zr);
    if (!rc)
        rc = dsq_quantizer_pack_gptq(qq, sc, zr, n, k, nb, qw, qz, sc2);
    for (int64_t j = 0; j < k && !rc; j++)
        gi[j] = (int32_t)(j / g);
    int64_t s1[2] = {k / 8, n}, s2[2] = {nb, n / 8}, s3[2] = {nb, n}, s4[1] = {k};
    if (!rc) rc = put_i32(q, base, "qweight", 2, s1, qw, DSQ_TYPE_I32);
    if (!rc) rc = put_i32(q, base, "qzeros", 2, s2, qz, DSQ_TYPE_I32);
    if (!rc) rc = put_i32(q, base, "scales", 2, s3, sc2, DSQ_TYPE_F16);
    if (!rc) rc = put_i32(q, base, "g_idx", 1, s4, gi, DSQ_TYPE_I32);
    if (rc == DSQ_ENOMEM)
        snprintf(q->err, q->err_len, "quantize: out of memory (%s)", base);
    else if (rc && !q->err[0])
        snprintf(q->err, q->err_len, "quantize: %s: 4-bit packing failed (%d)", base, rc);
    free(copy);
    free(w);
    free(qq);
    free(sc);
    free(sc2);
    free(zr);
    free(qw);
    free(qz);
    free(gi);
    return rc;
}

int dsq__qwrite_gptq8(dsq_st_writer_t *wr, const char *base, const dsq_tensor_t *t,
                      char *err, size_t err_len)
{
    const int64_t k = t->ne[0], n = t->ne[1];
    dsq_weight_t w8;
    void *st = NULL;
    int rc = dsq_quant_int8_channel(t, &w8, &st, err, err_len);
    if (rc)
        return rc;
    int32_t *qw = malloc((size_t)(k / 4 * n) * 4), *qz = malloc((size_t)(n / 4) * 4);
    uint16_t *sc = malloc((size_t)n * 2);
    int32_t *gi = calloc((size_t)k, 4);
    rc = qw && qz && sc && gi ? dsq_quantizer_pack_gptq8(w8.data, w8.scales, n, k, qw, qz, sc)
                              : DSQ_ENOMEM;
    const struct { const char *sfx; int nd; int64_t s[2]; const void *d; dsq_type_t ty; } parts[4] = {
        {"qweight", 2, {k / 4, n}, qw, DSQ_TYPE_I32},
        {"qzeros", 2, {1, n / 4}, qz, DSQ_TYPE_I32},
        {"scales", 2, {1, n}, sc, DSQ_TYPE_F16},
        {"g_idx", 1, {k, 1}, gi, DSQ_TYPE_I32},
    };
    for (int i = 0; i < 4 && !rc; i++) {
        char name[256];
        snprintf(name, sizeof(name), "%s.%s", base, parts[i].sfx);
        size_t cnt = (size_t)(parts[i].s[0] * (parts[i].nd == 2 ? parts[i].s[1] : 1));
        rc = dsq_st_writer_add(wr, name, parts[i].ty, parts[i].nd, parts[i].s, parts[i].d,
                               cnt * (parts[i].ty == DSQ_TYPE_F16 ? 2 : 4));
        if (rc)
            snprintf(err, err_len, "quantize: cannot add %s (%d)", name, rc);
    }
    if (rc == DSQ_ENOMEM)
        snprintf(err, err_len, "quantize: out of memory (%s)", base);
    free(st);
    free(qw);
    free(qz);
    free(sc);
    free(gi);
    return rc;
}

/* One tensor by HF name. linear: base name of a Linear (".weight" and an
 * optional ".bias" follow); cls: 0 attention, 1 shared expert, 2 dense
 * FFN, -1 other. */
static int put(ds2q_t *q, const char *hf, bool linear, bool required, int cls)
{
    char name[256], canon[256];
    snprintf(name, sizeof(name), linear ? "%s.weight" : "%s", hf);
    if (dsq_loader_canonical_name(name, canon, sizeof(canon)))
        return ferr(q, DSQ_EFORMAT, "quantize: no canonical name for %s%s", name, "");
    const dsq_tensor_t *t = dsq_model_file_find(q->f, canon);
    if (!t)
        return required ? ferr(q, DSQ_EFORMAT, "quantize: tensor %s missing in %s", name,
                               q->o->model) : DSQ_OK;
    if (!linear)
        return put_raw(q, name, t);
    char bn[256], bc[256];
    snprintf(bn, sizeof(bn), "%s.bias", hf);
    if (!dsq_loader_canonical_name(bn, bc, sizeof(bc))) {
        const dsq_tensor_t *b = dsq_model_file_find(q->f, bc);
        int rc = b ? put_raw(q, bn, b) : DSQ_OK;
        if (rc)
            return rc;
    }
    if (t->n_dims != 2)
        return ferr(q, DSQ_EFORMAT, "quantize: %s is not 2-D%s", name, "");
    dsq_qscheme_t s = dsq_quantizer_recipe_select(q->o->recipe, canon, 4, q->g, q->o->sym);
    const int64_t k = t->ne[0], n = t->ne[1];
    if (s.bits == 4 && n % 8 == 0 && k % 8 == 0) {
        q->n4++;
        return pack4(q, hf, t, s.sym);
    }
    if (s.bits == 8 && n % 4 == 0 && k % 4 == 0) {
        q->n8++;
        if (cls >= 0)
            q->cls8[cls] = true;
        return dsq__qwrite_gptq8(q->wr, hf, t, q->err, q->err_len);
    }
    if (s.bits) {
        /* packing cannot hold it: GPTQModel "-:" (not quantized) entry */
        char re[300];
        size_t j = 0;
        re[j++] = '^';
        for (const char *p = hf; *p && j + 3 < sizeof(re); p++) {
            if (*p == '.')
                re[j++] = '\\';
            re[j++] = *p;
        }
        re[j++] = '$';
        re[j] = '\0';
        cJSON_AddItemToArray(q->neg, cJSON_CreateString(re));
        q->n_kept++;
    }
    return put_raw(q, name, t);
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (n >= 0 && n < (64l << 20) && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
        if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        } else {
            buf[n] = '\0';
            *len = (size_t)n;
        }
    }
    fclose(f);
    return buf;
}

static int write_text(const char *path, const char *txt, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return DSQ_EIO;
    int rc = fwrite(txt, 1, len, f) == len ? DSQ_OK : DSQ_EIO;
    if (fclose(f) != 0)
        rc = DSQ_EIO;
    return rc;
}

static cJSON *override8(void)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "bits", 8);
    cJSON_AddNumberToObject(o, "group_size", -1);
    cJSON_AddBoolToObject(o, "sym", true);
    cJSON_AddBoolToObject(o, "desc_act", false);
    return o;
}

int dsq__quantizer_run_ds2(const dsq_qrun_opts_t *o, const dsq_model_file_t *f, int g,
                           char *err, size_t err_len)
{
    const dsq_model_config_t *c = dsq_model_file_config(f);
    struct stat sb;
    char path[4096];
    int rc = DSQ_OK;
    if (stat(o->model, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        snprintf(err, err_len, "quantize: deepseek2 source %s: give the Hugging Face "
                 "directory (its config.json is carried over); GGUF deepseek2 sources are "
                 "not supported", o->model);
        return DSQ_EUNSUPPORTED;
    }
    snprintf(path, sizeof(path), "%s/config.json", o->model);
    size_t len = 0;
    char *txt = slurp(path, &len);
    cJSON *cfg = txt ? cJSON_ParseWithLength(txt, len) : NULL;
    free(txt);
    if (!cfg) {
        snprintf(err, err_len, "quantize: cannot read or parse %s", path);
        return DSQ_EFORMAT;
    }
    ds2q_t q = {.o = o, .f = f, .g = g, .err = err, .err_len = err_len,
                .wr = dsq_st_writer_create(), .neg = cJSON_CreateArray()};
    if (err_len)
        err[0] = '\0';
    if (!q.wr || !q.neg) {
        rc = DSQ_ENOMEM;
        snprintf(err, err_len, "quantize: out of memory");
        goto undo;
    }
    rc = put(&q, "model.embed_tokens.weight", false, true, -1);
    if (!rc) rc = put(&q, "model.norm.weight", false, true, -1);
    if (!rc) rc = put(&q, "lm_head.weight", false, false, -1);
    const int64_t freq = c->moe_layer_freq > 0 ? c->moe_layer_freq : 1;
    for (int64_t l = 0; l < c->n_layer && !rc; l++) {
        char p[128], nm[192];
        snprintf(p, sizeof(p), "model.layers.%lld", (long long)l);
#define PUT(suffix, lin, req, cls)                                   \
        do {                                                         \
            snprintf(nm, sizeof(nm), "%s.%s", p, suffix);            \
            if (!rc) rc = put(&q, nm, lin, req, cls);                \
        } while (0)
        PUT("input_layernorm.weight", false, true, -1);
        PUT("post_attention_layernorm.weight", false, true, -1);
        if (c->q_lora_rank > 0) {
            PUT("self_attn.q_a_proj", true, true, 0);
            PUT("self_attn.q_a_layernorm.weight", false, true, -1);
            PUT("self_attn.q_b_proj", true, true, 0);
        } else {
            PUT("self_attn.q_proj", true, true, 0);
        }
        PUT("self_attn.kv_a_proj_with_mqa", true, true, 0);
        PUT("self_attn.kv_a_layernorm.weight", false, true, -1);
        PUT("self_attn.kv_b_proj", true, true, 0);
        PUT("self_attn.o_proj", true, true, 0);
        bool moe = c->n_routed_experts > 0 && l >= c->first_k_dense_replace && l % freq == 0;
        if (!moe) {
            PUT("mlp.gate_proj", true, true, 2);
            PUT("mlp.up_proj", true, true, 2);
            PUT("mlp.down_proj", true, true, 2);
            continue;
        }
        PUT("mlp.gate.weight", false, true, -1);
        PUT("mlp.gate.e_score_correction_bias", false, false, -1);
        if (c->n_shared_experts > 0) {
            PUT("mlp.shared_experts.gate_proj", true, true, 1);
            PUT("mlp.shared_experts.up_proj", true, true, 1);
            PUT("mlp.shared_experts.down_proj", true, true, 1);
        }
        for (int64_t e = 0; e < c->n_routed_experts && !rc; e++) {
            const char *which[3] = {"gate_proj", "up_proj", "down_proj"};
            for (int i = 0; i < 3 && !rc; i++) {
                snprintf(nm, sizeof(nm), "%s.mlp.experts.%lld.%s", p, (long long)e, which[i]);
                rc = put(&q, nm, true, true, -1);
            }
        }
#undef PUT
    }
    if (rc)
        goto undo;
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST) {
        snprintf(err, err_len, "quantize: cannot create %s: %s", o->out_dir, strerror(errno));
        rc = DSQ_EIO;
        goto undo;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors", o->out_dir);
    const char *md[] = {"format", "pt", "quantized_by", "dsq-quantize", NULL, NULL};
    rc = dsq_st_writer_save(q.wr, path, md, err, err_len);
    if (rc)
        goto undo;
    /* config.json: the source's, with our quantization_config */
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
    cJSON *qc = cJSON_AddObjectToObject(cfg, "quantization_config");
    cJSON_AddStringToObject(qc, "quant_method", "gptq");
    cJSON_AddNumberToObject(qc, "bits", 4);
    cJSON_AddNumberToObject(qc, "group_size", g);
    cJSON_AddBoolToObject(qc, "desc_act", false);
    bool sym4 = o->recipe == DSQ_QRECIPE_DEFAULT && o->sym;
    cJSON_AddBoolToObject(qc, "sym", sym4);
    cJSON_AddBoolToObject(qc, "lm_head", false);
    cJSON_AddStringToObject(qc, "checkpoint_format", "gptq");
    cJSON *dyn = cJSON_AddObjectToObject(qc, "dynamic");
    cJSON *it;
    cJSON_ArrayForEach(it, q.neg) {
        char key[320];
        snprintf(key, sizeof(key), "-:%s", it->valuestring);
        cJSON_AddItemToObject(dyn, key, cJSON_CreateObject());
    }
    if (q.cls8[0])
        cJSON_AddItemToObject(dyn, "+:^model\\.layers\\.\\d+\\.self_attn\\.", override8());
    if (q.cls8[1])
        cJSON_AddItemToObject(dyn, "+:^model\\.layers\\.\\d+\\.mlp\\.shared_experts\\.",
                              override8());
    if (q.cls8[2])
        cJSON_AddItemToObject(dyn, "+:^model\\.layers\\.\\d+\\.mlp\\.(gate|up|down)_proj$",
                              override8());
    cJSON_AddStringToObject(qc, "dsq_method", "rtn");
    cJSON_AddStringToObject(qc, "dsq_recipe",
                            o->recipe == DSQ_QRECIPE_DEEPSEEK_MOE ? "deepseek-moe" : "default");
    char *out = cJSON_Print(cfg);
    snprintf(path, sizeof(path), "%s/config.json", o->out_dir);
    rc = out ? write_text(path, out, strlen(out)) : DSQ_ENOMEM;
    free(out);
    if (rc) {
        snprintf(err, err_len, "quantize: cannot write %s", path);
        goto undo;
    }
    /* tokenizer files, when the source has them */
    const char *tok[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                         "generation_config.json", "chat_template.jinja"};
    for (size_t i = 0; i < sizeof(tok) / sizeof(tok[0]) && !rc; i++) {
        snprintf(path, sizeof(path), "%s/%s", o->model, tok[i]);
        size_t tl = 0;
        char *tt = slurp(path, &tl);
        if (!tt)
            continue;
        snprintf(path, sizeof(path), "%s/%s", o->out_dir, tok[i]);
        rc = write_text(path, tt, tl);
        free(tt);
        if (rc)
            snprintf(err, err_len, "quantize: cannot write %s", path);
    }
    if (!rc && !o->quiet)
        printf("quantize: method=rtn arch=deepseek2 recipe=%s group_size=%d layers=%lld "
               "int4=%d int8=%d unpacked=%d out=%s\n",
               o->recipe == DSQ_QRECIPE_DEEPSEEK_MOE ? "deepseek-moe" : "default", g,
               (long long)c->n_layer, q.n4, q.n8, q.n_kept, o->out_dir);
undo:
    cJSON_Delete(cfg);
    cJSON_Delete(q.neg);
    dsq_st_writer_destroy(q.wr);
    return rc;
}
