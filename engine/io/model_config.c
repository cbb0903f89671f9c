/* Architecture config from the three places a model can describe itself:
 * GGUF metadata, a Hugging Face config.json, and a llama2.c header.
 *
 * All three fill the same dsq_model_config_t starting from one set of
 * defaults and end in one consistency check (check_config), so the model code
 * never has to know which format a number came from. Field names and
 * defaults follow transformers' LlamaConfig / Qwen2Config / DeepseekV2Config
 * and the GGUF key names llama.cpp writes (ggml docs/gguf.md).
 */
#include "model_config.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "gguf.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void copy_str(char *dst, size_t cap, const char *src, size_t len)
{
    if (len >= cap)
        len = cap - 1;
    memcpy(dst, src, len);
    dst[len] = '\0';
}

const char *dsq_arch_name(dsq_arch_t arch)
{
    switch (arch) {
    case DSQ_ARCH_LLAMA: return "llama";
    case DSQ_ARCH_QWEN2: return "qwen2";
    case DSQ_ARCH_DEEPSEEK2: return "deepseek2";
    default: return "unknown";
    }
}

void dsq_model_config_defaults(dsq_model_config_t *c)
{
    memset(c, 0, sizeof(*c));
    c->rms_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->rope_factor = 1.0;
    c->yarn_beta_fast = 32.0;
    c->yarn_beta_slow = 1.0;
    c->yarn_mscale = 1.0;
    c->yarn_mscale_all_dim = 0.0;
    c->rope_low_freq_factor = 1.0;
    c->rope_high_freq_factor = 4.0;
    c->moe_layer_freq = 1;
    c->routed_scaling_factor = 1.0;
    c->n_group = 1;
    c->topk_group = 1;
    snprintf(c->topk_method, sizeof(c->topk_method), "greedy");
    snprintf(c->scoring_func, sizeof(c->scoring_func), "softmax");
    c->bos_token_id = -1;
    c->eos_token_id = -1;
    c->pad_token_id = -1;
}

/* The keys a format keeps the context length and special ids under, for
 * messages; NULL where the format has no such key. */
typedef struct cfg_keys {
    const char *ctx, *bos, *eos, *pad;
} cfg_keys_t;

/* -1 is "none"; anything else must name a row of the embedding */
static int check_token_id(int64_t id, int64_t n_vocab, const char *src,
                          const char *key, int index, char *err, size_t err_len)
{
    char idx[24] = "";
    if (id == -1 || (id >= 0 && id < n_vocab))
        return DSQ_OK;
    if (index >= 0)
        snprintf(idx, sizeof(idx), "[%d]", index);
    dsq_error_set(err, err_len, "%s: %s%s = %lld is not a token id (vocab size %lld; -1 means none)",
            src, key, idx, (long long)id, (long long)n_vocab);
    return DSQ_EFORMAT;
}

/* Shared sanity check; src names the file/format and k the keys for the
 * message. */
static int check_config(dsq_model_config_t *c, const char *src,
                        const cfg_keys_t *k, char *err, size_t err_len)
{
    const char *bad = NULL;
    if (c->n_embd <= 0) bad = "hidden size (embedding_length)";
    else if (c->n_layer <= 0) bad = "layer count (block_count)";
    else if (c->n_head <= 0) bad = "attention head count";
    else if (c->n_head_kv <= 0 || c->n_head % c->n_head_kv != 0)
        bad = "kv head count (must divide the head count)";
    else if (c->head_dim <= 0) bad = "head_dim";
    else if (c->n_vocab <= 0) bad = "vocab size";
    else if (c->rope_dim < 0 || c->rope_dim > c->head_dim) bad = "rope dimension";
    else if (!(c->rms_eps > 0) || !(c->rope_theta > 0)) bad = "rms_eps/rope_theta";
    else if (c->n_ff < 0) bad = "feed_forward_length";
    else if (c->arch == DSQ_ARCH_DEEPSEEK2
             && (c->kv_lora_rank <= 0 || c->qk_rope_head_dim <= 0
                 || c->v_head_dim <= 0 || c->qk_nope_head_dim < 0))
        bad = "MLA dims (kv_lora_rank, qk_rope_head_dim, v_head_dim)";
    else if (c->n_routed_experts > 0
             && (c->n_experts_per_tok <= 0
                 || c->n_experts_per_tok > c->n_routed_experts))
        bad = "experts per token";
    if (bad) {
        dsq_error_set(err, err_len, "%s: missing or invalid %s", src, bad);
        return DSQ_EFORMAT;
    }
    if (c->n_ctx_train < 1 || c->n_ctx_train > DSQ_MODEL_CTX_MAX) {
        dsq_error_set(err, err_len, "%s: %s = %lld is out of range (1 to %d tokens)", src, k->ctx,
                (long long)c->n_ctx_train, DSQ_MODEL_CTX_MAX);
        return DSQ_EFORMAT;
    }
    const struct { const char *key; int64_t id; } ids[] = {
        {k->bos, c->bos_token_id}, {k->eos, c->eos_token_id}, {k->pad, c->pad_token_id},
    };
    int rc = DSQ_OK;
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]) && rc == DSQ_OK; i++)
        if (ids[i].key)
            rc = check_token_id(ids[i].id, c->n_vocab, src, ids[i].key, -1, err, err_len);
    return rc;
}

/* A file without a context length: the default, said once per load. */
static int64_t ctx_default(const char *src, const char *key)
{
    dsq_log(DSQ_LOG_WARN, "load file=%s %s=missing n_ctx_train=%d (default)", src, key,
            DSQ_MODEL_CTX_DEFAULT);
    return DSQ_MODEL_CTX_DEFAULT;
}

/* ---- GGUF ---- */

static int64_t gi(const dsq_gguf_t *g, const char *arch, const char *key,
                  int64_t def)
{
    char k[160];
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    return dsq_gguf_get_int(g, k, def);
}

static double gf(const dsq_gguf_t *g, const char *arch, const char *key,
                 double def)
{
    char k[160];
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    return dsq_gguf_get_float(g, k, def);
}

/* Head counts may be per-layer arrays in some GGUFs: take the first entry. */
static int64_t gi_or_first(const dsq_gguf_t *g, const char *arch,
                           const char *key, int64_t def)
{
    char k[160];
    snprintf(k, sizeof(k), "%s.%s", arch, key);
    dsq_gguf_vtype_t et;
    int64_t n = dsq_gguf_arr_n(g, k, &et);
    if (n > 0 && (et == DSQ_GGUF_U32 || et == DSQ_GGUF_I32)) {
        int32_t v;
        memcpy(&v, dsq_gguf_arr_data(g, k), 4);
        return v;
    }
    return dsq_gguf_get_int(g, k, def);
}

int dsq_model_config_from_gguf(const dsq_gguf_t *g, dsq_model_config_t *out,
                               char *err, size_t err_len)
{
    dsq_model_config_t c;
    dsq_model_config_defaults(&c);
    const char *path = dsq_gguf_path(g);
    size_t alen = 0;
    const char *a = dsq_gguf_get_str(g, "general.architecture", &alen);
    char arch[32];
    if (!a) {
        dsq_error_set(err, err_len, "%s: general.architecture missing", path);
        return DSQ_EFORMAT;
    }
    copy_str(arch, sizeof(arch), a, alen);
    if (strcmp(arch, "llama") == 0) c.arch = DSQ_ARCH_LLAMA;
    else if (strcmp(arch, "qwen2") == 0) c.arch = DSQ_ARCH_QWEN2;
    else if (strcmp(arch, "deepseek2") == 0) c.arch = DSQ_ARCH_DEEPSEEK2;
    else {
        dsq_error_set(err, err_len, "%s: general.architecture '%s' not supported (llama, qwen2, deepseek2)",
                path, arch);
        return DSQ_EUNSUPPORTED;
    }
    size_t nlen = 0;
    const char *name = dsq_gguf_get_str(g, "general.name", &nlen);
    if (name)
        copy_str(c.name, sizeof(c.name), name, nlen);

    c.n_layer = gi(g, arch, "block_count", 0);
    c.n_embd = gi(g, arch, "embedding_length", 0);
    c.n_ff = gi(g, arch, "feed_forward_length", 0);
    c.n_head = gi_or_first(g, arch, "attention.head_count", 0);
    c.n_head_kv = gi_or_first(g, arch, "attention.head_count_kv", c.n_head);
    c.head_dim = gi(g, arch, "attention.key_length",
                    c.n_head > 0 ? c.n_embd / c.n_head : 0);
    char ctx_key[64];
    snprintf(ctx_key, sizeof(ctx_key), "%s.context_length", arch);
    c.n_ctx_train = dsq_gguf_find_key(g, ctx_key) >= 0 ? dsq_gguf_get_int(g, ctx_key, 0)
                                                       : ctx_default(path, ctx_key);
    c.rms_eps = gf(g, arch, "attention.layer_norm_rms_epsilon", 1e-5);
    c.rope_theta = gf(g, arch, "rope.freq_base", 10000.0);
    c.rope_dim = gi(g, arch, "rope.dimension_count", c.head_dim);

    c.n_vocab = gi(g, arch, "vocab_size", -1);
    if (c.n_vocab < 0)
        c.n_vocab = dsq_gguf_arr_n(g, "tokenizer.ggml.tokens", NULL);
    if (c.n_vocab < 0) {
        const dsq_tensor_t *te = dsq_gguf_find_tensor(g, "token_embd.weight");
        c.n_vocab = te ? te->ne[1] : 0;
    }

    char key[160];
    snprintf(key, sizeof(key), "%s.rope.scaling.type", arch);
    size_t slen = 0;
    const char *st = dsq_gguf_get_str(g, key, &slen);
    double factor = gf(g, arch, "rope.scaling.factor", 0.0);
    if (factor == 0.0) {
        /* older converters: rope.scale_linear */
        double lin = gf(g, arch, "rope.scale_linear", 0.0);
        if (lin > 0.0 && lin != 1.0) {
            c.rope_scaling = DSQ_ROPE_SCALING_LINEAR;
            c.rope_factor = lin;
        }
    }
    if (st) {
        char stype[32];
        copy_str(stype, sizeof(stype), st, slen);
        if (strcmp(stype, "linear") == 0) c.rope_scaling = DSQ_ROPE_SCALING_LINEAR;
        else if (strcmp(stype, "yarn") == 0) c.rope_scaling = DSQ_ROPE_SCALING_YARN;
        else if (strcmp(stype, "none") != 0) {
            dsq_error_set(err, err_len, "%s: %s '%s' not supported (none, linear, yarn)", path, key, stype);
            return DSQ_EUNSUPPORTED;
        }
        if (c.rope_scaling != DSQ_ROPE_SCALING_NONE && factor > 0.0)
            c.rope_factor = factor;
    }
    c.rope_orig_ctx = gi(g, arch, "rope.scaling.original_context_length", 0);
    c.yarn_beta_fast = gf(g, arch, "rope.scaling.yarn_beta_fast", 32.0);
    c.yarn_beta_slow = gf(g, arch, "rope.scaling.yarn_beta_slow", 1.0);
    double log_mul = gf(g, arch, "rope.scaling.yarn_log_multiplier", 0.0);
    if (log_mul > 0.0) {
        c.yarn_mscale_all_dim = log_mul / 0.1;
        c.yarn_mscale = c.yarn_mscale_all_dim;
    }

    c.bos_token_id = dsq_gguf_get_int(g, "tokenizer.ggml.bos_token_id", -1);
    c.eos_token_id = dsq_gguf_get_int(g, "tokenizer.ggml.eos_token_id", -1);
    c.pad_token_id = dsq_gguf_get_int(g, "tokenizer.ggml.padding_token_id", -1);
    c.tie_word_embeddings = dsq_gguf_find_tensor(g, "output.weight") == NULL;
    c.attn_qkv_bias = c.arch == DSQ_ARCH_QWEN2
                      || dsq_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    c.rope_neox = c.arch == DSQ_ARCH_QWEN2;

    if (c.arch == DSQ_ARCH_DEEPSEEK2) {
        c.q_lora_rank = gi(g, arch, "attention.q_lora_rank", 0);
        c.kv_lora_rank = gi(g, arch, "attention.kv_lora_rank", 0);
        int64_t klen = gi(g, arch, "attention.key_length_mla",
                          gi(g, arch, "attention.key_length", 0));
        c.v_head_dim = gi(g, arch, "attention.value_length_mla",
                          gi(g, arch, "attention.value_length", 0));
        c.qk_rope_head_dim = c.rope_dim;
        c.qk_nope_head_dim = klen - c.rope_dim;
        c.head_dim = klen;
        c.n_routed_experts = gi(g, arch, "expert_count", 0);
        c.n_shared_experts = gi(g, arch, "expert_shared_count", 0);
        c.n_experts_per_tok = gi(g, arch, "expert_used_count", 0);
        c.moe_intermediate_size = gi(g, arch, "expert_feed_forward_length", 0);
        c.first_k_dense_replace = gi(g, arch, "leading_dense_block_count", 0);
        c.routed_scaling_factor = gf(g, arch, "expert_weights_scale", 1.0);
        snprintf(key, sizeof(key), "%s.expert_weights_norm", arch);
        c.norm_topk_prob = dsq_gguf_get_bool(g, key, false);
        c.n_group = gi(g, arch, "expert_group_count", 1);
        c.topk_group = gi(g, arch, "expert_group_used_count", 1);
        if (gi(g, arch, "expert_gating_func", 1) == 2) {
            snprintf(c.scoring_func, sizeof(c.scoring_func), "sigmoid");
            snprintf(c.topk_method, sizeof(c.topk_method), "noaux_tc");
        } else if (c.n_group > 1) {
            /* softmax gate with expert groups: DeepSeek-V2's
             * group_limited_greedy (GGUF has no topk_method key) */
            snprintf(c.topk_method, sizeof(c.topk_method), "group_limited_greedy");
        }
    }
    const cfg_keys_t keys = {ctx_key, "tokenizer.ggml.bos_token_id",
                             "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id"};
    int rc = check_config(&c, path, &keys, err, err_len);
    if (rc == DSQ_OK)
        *out = c;
    return rc;
}

/* ---- Hugging Face config.json ---- */

typedef struct jctx {
    const cJSON *root;
    const char *bad;     /* first field with a wrong type */
} jctx_t;

static int64_t ji(jctx_t *j, const cJSON *obj, const char *key, int64_t def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return def;
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) > 0)
        v = cJSON_GetArrayItem(v, 0);   /* e.g. eos_token_id: [a, b] */
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)
        || fabs(v->valuedouble) > 9.0e15) {
        if (!j->bad)
            j->bad = key;
        return def;
    }
    return (int64_t)v->valuedouble;
}

static double jf(jctx_t *j, const cJSON *obj, const char *key, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return def;
    if (!cJSON_IsNumber(v)) {
        if (!j->bad)
            j->bad = key;
        return def;
    }
    return v->valuedouble;
}

static bool jb(jctx_t *j, const cJSON *obj, const char *key, bool def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v))
        return def;
    if (cJSON_IsBool(v))
        return cJSON_IsTrue(v);
    if (cJSON_IsNumber(v))
        return v->valuedouble != 0.0;
    if (!j->bad)
        j->bad = key;
    return def;
}

static const char *js(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int hf_rope_scaling(jctx_t *j, const cJSON *rs, dsq_model_config_t *c,
                           char *err, size_t err_len)
{
    if (!rs || cJSON_IsNull(rs))
        return DSQ_OK;
    if (!cJSON_IsObject(rs)) {
        dsq_error_set(err, err_len, "config.json: rope_scaling must be an object or null");
        return DSQ_EFORMAT;
    }
    const char *t = js(rs, "rope_type");
    if (!t)
        t = js(rs, "type");
    if (!t || strcmp(t, "default") == 0)
        return DSQ_OK;
    if (strcmp(t, "linear") == 0) c->rope_scaling = DSQ_ROPE_SCALING_LINEAR;
    else if (strcmp(t, "dynamic") == 0) c->rope_scaling = DSQ_ROPE_SCALING_DYNAMIC;
    else if (strcmp(t, "yarn") == 0) c->rope_scaling = DSQ_ROPE_SCALING_YARN;
    else if (strcmp(t, "llama3") == 0) c->rope_scaling = DSQ_ROPE_SCALING_LLAMA3;
    else {
        dsq_error_set(err, err_len, "config.json: rope_scaling type '%s' not supported (linear, dynamic, yarn, llama3)", t);
        return DSQ_EUNSUPPORTED;
    }
    c->rope_factor = jf(j, rs, "factor", 1.0);
    c->rope_orig_ctx = ji(j, rs, "original_max_position_embeddings", 0);
    c->yarn_beta_fast = jf(j, rs, "beta_fast", 32.0);
    c->yarn_beta_slow = jf(j, rs, "beta_slow", 1.0);
    c->yarn_mscale = jf(j, rs, "mscale", 1.0);
    c->yarn_mscale_all_dim = jf(j, rs, "mscale_all_dim", 0.0);
    c->rope_low_freq_factor = jf(j, rs, "low_freq_factor", 1.0);
    c->rope_high_freq_factor = jf(j, rs, "high_freq_factor", 4.0);
    if (!(c->rope_factor > 0.0)) {
        dsq_error_set(err, err_len, "config.json: rope_scaling.factor must be > 0");
        return DSQ_EFORMAT;
    }
    return DSQ_OK;
}

static int hf_quant(jctx_t *j, const cJSON *q, dsq_model_config_t *c,
                    char *err, size_t err_len)
{
    if (!q || cJSON_IsNull(q))
        return DSQ_OK;
    const char *m = js(q, "quant_method");
    if (!cJSON_IsObject(q) || !m) {
        dsq_error_set(err, err_len, "config.json: quantization_config.quant_method missing");
        return DSQ_EFORMAT;
    }
    if (strcmp(m, "awq") == 0) {
        c->ckpt_quant = DSQ_CKPT_QUANT_AWQ;
        c->ckpt_bits = (int)ji(j, q, "bits", ji(j, q, "w_bit", 4));
        c->ckpt_group_size = (int)ji(j, q, "group_size", ji(j, q, "q_group_size", 128));
        c->ckpt_zero_point = jb(j, q, "zero_point", true);
        c->ckpt_desc_act = false;
        const char *v = js(q, "version");
        if (v && strcasecmp(v, "gemm") != 0) {
            dsq_error_set(err, err_len, "config.json: quantization_config.version '%s' not supported (awq gemm only)", v);
            return DSQ_EUNSUPPORTED;
        }
    } else if (strcmp(m, "gptq") == 0) {
        c->ckpt_quant = DSQ_CKPT_QUANT_GPTQ;
        c->ckpt_bits = (int)ji(j, q, "bits", 4);
        c->ckpt_group_size = (int)ji(j, q, "group_size", 128);
        c->ckpt_desc_act = jb(j, q, "desc_act", false);
        c->ckpt_zero_point = !jb(j, q, "sym", true);
    } else {
        dsq_error_set(err, err_len, "config.json: quantization_config.quant_method '%s' not supported (awq, gptq)", m);
        return DSQ_EUNSUPPORTED;
    }
    if (c->ckpt_bits != 4) {
        dsq_error_set(err, err_len, "config.json: quantization_config.bits %d not supported (4)", c->ckpt_bits);
        return DSQ_EUNSUPPORTED;
    }
    if (c->ckpt_group_size != -1 && c->ckpt_group_size <= 0) {
        dsq_error_set(err, err_len, "config.json: quantization_config.group_size %d invalid", c->ckpt_group_size);
        return DSQ_EFORMAT;
    }
    return DSQ_OK;
}

static const cfg_keys_t hf_keys = {"max_position_embeddings", "bos_token_id",
                                   "eos_token_id", "pad_token_id"};

/* An id given as a list (eos_token_id: [a, b], as generation configs and
 * some config.json files write it): ji kept the first, every one must be
 * a token id. */
static int hf_check_id_lists(const cJSON *root, int64_t n_vocab, const cfg_keys_t *k,
                             char *err, size_t err_len)
{
    const char *const keys[] = {k->bos, k->eos, k->pad};
    int rc = DSQ_OK;
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]) && rc == DSQ_OK; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i]), *e;
        int n = 0;
        if (!cJSON_IsArray(v))
            continue;
        cJSON_ArrayForEach(e, v) {
            if (rc != DSQ_OK)
                break;
            if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble)
                || fabs(e->valuedouble) > 9.0e15) {
                dsq_error_set(err, err_len, "config.json: %s[%d] is not an integer", keys[i], n);
                rc = DSQ_EFORMAT;
            } else {
                rc = check_token_id((int64_t)e->valuedouble, n_vocab, "config.json", keys[i], n,
                                    err, err_len);
            }
            n++;
        }
    }
    return rc;
}

static dsq_arch_t hf_arch(const cJSON *root)
{
    const char *mt = js(root, "model_type");
    if (mt) {
        if (strcmp(mt, "llama") == 0) return DSQ_ARCH_LLAMA;
        if (strcmp(mt, "qwen2") == 0) return DSQ_ARCH_QWEN2;
        if (strcmp(mt, "deepseek_v2") == 0 || strcmp(mt, "deepseek_v3") == 0)
            return DSQ_ARCH_DEEPSEEK2;
        return DSQ_ARCH_UNKNOWN;
    }
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
    const char *a = cJSON_IsString(a0) ? a0->valuestring : "";
    if (strcmp(a, "LlamaForCausalLM") == 0) return DSQ_ARCH_LLAMA;
    if (strcmp(a, "Qwen2ForCausalLM") == 0) return DSQ_ARCH_QWEN2;
    if (strcmp(a, "DeepseekV2ForCausalLM") == 0
        || strcmp(a, "DeepseekV3ForCausalLM") == 0)
        return DSQ_ARCH_DEEPSEEK2;
    return DSQ_ARCH_UNKNOWN;
}

int dsq_model_config_from_hf_json(const char *json_text, size_t len,
                                  dsq_model_config_t *out, char *err,
                                  size_t err_len)
{
    int rc = DSQ_OK;
    dsq_model_config_t c;
    dsq_model_config_defaults(&c);
    cJSON *root = json_text ? cJSON_ParseWithLength(json_text, len) : NULL;
    if (!cJSON_IsObject(root)) {
        dsq_error_set(err, err_len, "config.json: not a JSON object");
        rc = DSQ_EFORMAT;
        goto undo_json;
    }
    jctx_t j = {root, NULL};
    c.arch = hf_arch(root);
    if (c.arch == DSQ_ARCH_UNKNOWN) {
        const char *mt = js(root, "model_type");
        dsq_error_set(err, err_len, "config.json: model_type '%s' not supported (llama, qwen2, deepseek_v2)",
                mt ? mt : "(missing)");
        rc = DSQ_EUNSUPPORTED;
        goto undo_json;
    }
    const char *name = js(root, "_name_or_path");
    if (name)
        copy_str(c.name, sizeof(c.name), name, strlen(name));
    c.n_vocab = ji(&j, root, "vocab_size", 0);
    c.n_embd = ji(&j, root, "hidden_size", 0);
    c.n_layer = ji(&j, root, "num_hidden_layers", 0);
    c.n_head = ji(&j, root, "num_attention_heads", 0);
    c.n_head_kv = ji(&j, root, "num_key_value_heads", c.n_head);
    c.head_dim = ji(&j, root, "head_dim", c.n_head > 0 ? c.n_embd / c.n_head : 0);
    c.n_ff = ji(&j, root, "intermediate_size", 0);
    c.n_ctx_train = ji(&j, root, "max_position_embeddings", INT64_MIN);
    if (c.n_ctx_train == INT64_MIN)
        c.n_ctx_train = ctx_default("config.json", "max_position_embeddings");
    c.rms_eps = jf(&j, root, "rms_norm_eps", 1e-6);
    c.tie_word_embeddings = jb(&j, root, "tie_word_embeddings", false);
    c.rope_theta = jf(&j, root, "rope_theta", 10000.0);
    c.bos_token_id = ji(&j, root, "bos_token_id", -1);
    c.eos_token_id = ji(&j, root, "eos_token_id", -1);
    c.pad_token_id = ji(&j, root, "pad_token_id", -1);
    c.attn_qkv_bias = c.arch == DSQ_ARCH_QWEN2 || jb(&j, root, "attention_bias", false);
    c.rope_neox = c.arch != DSQ_ARCH_DEEPSEEK2;
    c.rope_dim = c.head_dim;

    if (c.arch == DSQ_ARCH_DEEPSEEK2) {
        c.q_lora_rank = ji(&j, root, "q_lora_rank", 0);
        c.kv_lora_rank = ji(&j, root, "kv_lora_rank", 0);
        c.qk_nope_head_dim = ji(&j, root, "qk_nope_head_dim", 0);
        c.qk_rope_head_dim = ji(&j, root, "qk_rope_head_dim", 0);
        c.v_head_dim = ji(&j, root, "v_head_dim", 0);
        c.head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim;
        c.rope_dim = c.qk_rope_head_dim;
        c.first_k_dense_replace = ji(&j, root, "first_k_dense_replace", 0);
        c.n_nextn_layers = ji(&j, root, "num_nextn_predict_layers", 0);
        c.moe_layer_freq = ji(&j, root, "moe_layer_freq", 1);
        c.n_routed_experts = ji(&j, root, "n_routed_experts", 0);
        c.n_shared_experts = ji(&j, root, "n_shared_experts", 0);
        c.n_experts_per_tok = ji(&j, root, "num_experts_per_tok", 0);
        c.moe_intermediate_size = ji(&j, root, "moe_intermediate_size", 0);
        c.norm_topk_prob = jb(&j, root, "norm_topk_prob", false);
        c.routed_scaling_factor = jf(&j, root, "routed_scaling_factor", 1.0);
        c.n_group = ji(&j, root, "n_group", 1);
        c.topk_group = ji(&j, root, "topk_group", 1);
        const char *tm = js(root, "topk_method");
        if (tm)
            copy_str(c.topk_method, sizeof(c.topk_method), tm, strlen(tm));
        const char *sf = js(root, "scoring_func");
        if (sf)
            copy_str(c.scoring_func, sizeof(c.scoring_func), sf, strlen(sf));
    }
    rc = hf_rope_scaling(&j, cJSON_GetObjectItemCaseSensitive(root, "rope_scaling"),
                         &c, err, err_len);
    if (rc == DSQ_OK)
        rc = hf_quant(&j, cJSON_GetObjectItemCaseSensitive(root, "quantization_config"),
                      &c, err, err_len);
    if (rc == DSQ_OK && j.bad) {
        dsq_error_set(err, err_len, "config.json: field '%s' has the wrong type", j.bad);
        rc = DSQ_EFORMAT;
    }
    if (rc == DSQ_OK)
        rc = check_config(&c, "config.json", &hf_keys, err, err_len);
    if (rc == DSQ_OK)
        rc = hf_check_id_lists(root, c.n_vocab, &hf_keys, err, err_len);
    if (rc == DSQ_OK)
        *out = c;
undo_json:
    cJSON_Delete(root);
    return rc;
}

/* ---- llama2.c ---- */

int dsq_model_config_from_llama2c(const int32_t hdr[7], dsq_model_config_t *out,
                                  char *err, size_t err_len)
{
    static const char *const names[7] = {"dim", "hidden_dim", "n_layers",
        "n_heads", "n_kv_heads", "vocab_size", "seq_len"};
    for (int i = 0; i < 7; i++) {
        if (hdr[i] == 0 || (i != 5 && hdr[i] < 0) || hdr[i] == INT32_MIN) {
            dsq_error_set(err, err_len, "llama2.c header: %s = %d invalid", names[i], hdr[i]);
            return DSQ_EFORMAT;
        }
    }
    dsq_model_config_t c;
    dsq_model_config_defaults(&c);
    c.arch = DSQ_ARCH_LLAMA;
    c.n_embd = hdr[0];
    c.n_ff = hdr[1];
    c.n_layer = hdr[2];
    c.n_head = hdr[3];
    c.n_head_kv = hdr[4];
    c.n_vocab = hdr[5] < 0 ? -(int64_t)hdr[5] : hdr[5];
    c.tie_word_embeddings = hdr[5] > 0;
    c.n_ctx_train = hdr[6];
    c.head_dim = c.n_embd / c.n_head;
    c.rope_dim = c.head_dim;
    c.rms_eps = 1e-5;
    c.rope_theta = 10000.0;
    c.rope_neox = false;
    if (c.n_embd % c.n_head != 0) {
        dsq_error_set(err, err_len, "llama2.c header: dim %d not a multiple of n_heads %d", hdr[0], hdr[3]);
        return DSQ_EFORMAT;
    }
    const cfg_keys_t keys = {"seq_len", NULL, NULL, NULL};
    int rc = check_config(&c, "llama2.c header", &keys, err, err_len);
    if (rc == DSQ_OK)
        *out = c;
    return rc;
}
