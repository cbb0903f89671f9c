/* Memory planner (see planner.h for the formulas and their sources).
 *
 * Weight bytes are computed with the same byte-size functions the repackers
 * use (dsq_weight_data_bytes / dsq_weight_scale_bytes), from the tensor
 * table alone, so the prediction can be checked against what the model
 * actually allocates. Without a tensor table the architecture's graph lists
 * the tensors its config implies (engine/model/model.h,
 * dsq_model_arch_tensors); what differs between architectures is asked of
 * the model the same way, never branched on here. */
#include "planner.h"

#include "engine/model/model.h"
#include "engine/model/quant.h"

#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/kv/kv_cache.h"

int64_t dsq_plan_default_budget(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    int64_t ram = pages > 0 && psz > 0 ? (int64_t)pages * psz : (int64_t)8 << 30;
    return ram / 2;
}

int64_t dsq_plan_kv_bytes_per_token(const dsq_model_config_t *c, dsq_kv_dtype_t dt)
{
    int n_kv_heads, head_dim;
    bool has_v;
    dsq_model_arch_kv_shape(c, &n_kv_heads, &head_dim, &has_v);
    if (!has_v) {       /* MLA: the latent + rope key vector alone */
        int64_t vals = (int64_t)n_kv_heads * head_dim;
        int64_t per = dt == DSQ_KV_INT8 ? vals + (vals / 64 > 0 ? vals / 64 : 1) * 4
                      : dt == DSQ_KV_F32 ? vals * 4 : vals * 2;
        return c->n_layer * per;
    }
    return c->n_layer *
           (int64_t)dsq_kv_bytes_per_token_layer(n_kv_heads, head_dim, dt);
}

/* blk.N.ffn_{gate,up,down}.E.<suffix>: one routed expert (HF checkpoints,
 * and llama.cpp's stacked *_exps as the loader splits them). */
static bool is_expert_slice(const char *name)
{
    const char *p = strstr(name, ".ffn_");
    if (!p)
        return false;
    p += 5;
    if (!strncmp(p, "gate.", 5)) p += 5;
    else if (!strncmp(p, "up.", 3)) p += 3;
    else if (!strncmp(p, "down.", 5)) p += 5;
    else return false;
    return *p >= '0' && *p <= '9';
}

static int classify(const char *name)
{
    if (strstr(name, "token_embd") || strstr(name, ".nextn.embed_tokens."))
        return DSQ_PLAN_EMBED;
    if (strncmp(name, "output.", 7) == 0 || strstr(name, ".nextn.shared_head_head."))
        return DSQ_PLAN_OUTPUT;
    if (strstr(name, "norm") || strstr(name, ".bias"))
        return DSQ_PLAN_NORM;
    if (strstr(name, "_exps") || strstr(name, "ffn_gate_inp") || strstr(name, "exp_probs") ||
        is_expert_slice(name))
        return DSQ_PLAN_EXPERTS;
    if (strstr(name, "attn"))
        return DSQ_PLAN_ATTN;
    return DSQ_PLAN_FFN;
}

/* Bytes of a linear weight [n, k] in format f (INT4 with zeros unless sym). */
static int64_t lin_bytes(dsq_wformat_t f, int64_t n, int64_t k, int g, bool zeros)
{
    int64_t sc = (int64_t)dsq_weight_scale_bytes(f, n, k, g);
    return (int64_t)dsq_weight_data_bytes(f, n, k, g) + (zeros ? 2 * sc : sc);
}

static bool want_int4(const dsq_plan_opts_t *o)
{
    return o->quantize && strcmp(o->quantize, "int4") == 0;
}

/* k of a GPTQ linear: its g_idx [k] (a sibling of the qweight, looked for
 * next to it first: writers keep a module's tensors together, HF sorts
 * them by name), or 0 when the table has none. */
static int64_t gptq_k(const dsq_tensor_t *const *tv, int n_t, int i)
{
    const char *q = tv[i]->name;
    size_t bl = strlen(q) - strlen(".qweight");
    for (int pass = 0; pass < 2; pass++) {
        int lo = pass ? 0 : (i > 4 ? i - 4 : 0), hi = pass ? n_t : (i + 5 < n_t ? i + 5 : n_t);
        for (int j = lo; j < hi; j++) {
            const char *nm = tv[j]->name;
            if (strncmp(nm, q, bl) == 0 && strcmp(nm + bl, ".g_idx") == 0)
                return tv[j]->ne[0];
        }
    }
    return 0;
}

/* One tensor of the table. gptq_k_: k of a GPTQ qweight (0 unknown). A
 * GPTQ qweight is [k*bits/32][n]: 8-bit ([k/4][n], per-channel, the
 * deepseek-moe recipe's INT8 classes) repacks to DSQ_WFMT_INT8
 * (engine/model/quant.c dsq_quant_from_gptq_tensors), 4-bit to INT4 with zeros;
 * without a g_idx the width is taken to be 4. */
static void add_tensor(dsq_plan_t *p, const dsq_tensor_t *t, const dsq_plan_opts_t *o,
                       const dsq_model_config_t *c, int64_t gptq_k_)
{
    int cls = classify(t->name);
    int64_t ne = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    int64_t bytes = 0;
    const char *dot = strrchr(t->name, '.');
    int g = o->group_size > 0 ? o->group_size : 32;
    if (dot && (!strcmp(dot, ".qzeros") || !strcmp(dot, ".scales") || !strcmp(dot, ".g_idx")))
        return;                                 /* counted with .qweight */
    if (dot && !strcmp(dot, ".qweight")) {
        int64_t n, k;
        if (c->ckpt_quant == DSQ_CKPT_QUANT_AWQ) {   /* [k][n/8] int32 */
            n = t->ne[0] * 8;
            k = t->ne[1];
        } else if (gptq_k_ > 0 && t->ne[1] * 4 == gptq_k_) {   /* GPTQ 8-bit [k/4][n] */
            n = t->ne[0];
            k = gptq_k_;
            bytes = lin_bytes(DSQ_WFMT_INT8, n, k, 0, false);
            p->n_params += n * k;
            p->class_bytes[cls] += bytes;
            return;
        } else {                                     /* GPTQ [k/8][n] */
            n = t->ne[0];
            k = t->ne[1] * 8;
        }
        bytes = lin_bytes(DSQ_WFMT_INT4, n, k, c->ckpt_group_size, true);
        p->n_params += n * k;
        p->class_bytes[cls] += bytes;
        return;
    }
    p->n_params += ne;
    if (t->n_dims == 1 || t->ne[1] == 1) {
        bytes = ne * 4;                         /* norms and biases -> fp32 */
        p->class_bytes[cls] += bytes;
        return;
    }
    int64_t k = t->ne[0], n = ne / k;
    /* the MoE router stays in the file's precision (model_deepseek2.c) */
    bool linear = cls != DSQ_PLAN_EMBED && cls != DSQ_PLAN_OUTPUT &&
                  !strstr(t->name, "ffn_gate_inp");
    size_t native = 0;
    const bool float_src = t->type == DSQ_TYPE_F32 || t->type == DSQ_TYPE_F16 ||
                           t->type == DSQ_TYPE_BF16 || t->type == DSQ_TYPE_Q8_0;
    if (float_src && linear && want_int4(o)) {
        bytes = lin_bytes(DSQ_WFMT_INT4, n, k, g, true);
    } else if (!float_src && dsq_quant_gguf_bytes(t->type, n, k, &native) == DSQ_OK) {
        /* the GGUF's own quantisation, repacked exactly (quant.h): the
         * bytes dsq_quant_from_gguf allocates, or what the host's
         * interleaved twin keeps (every k-quant in its file's bits: Q2_K
         * .. Q6_K in 2 .. 6 bits a weight, Q5_0 / Q5_1 in 5:
         * model_weights.c, kernels.h) */
        bytes = native;
        dsq_weight_t w, x8;
        dsq_weight_bytes_t b8;
        if (o->host_x8 && !strstr(t->name, "attn_kv_b") &&
            dsq_quant_gguf_layout(t->type, n, k, &w) == DSQ_OK && w.zp_mode != DSQ_ZP_LUT &&
            dsq_weight_x8_twin(&w, &x8) == DSQ_OK && dsq_weight_layout(&x8, &b8) == DSQ_OK)
            bytes = b8.total;
    } else if (t->type == DSQ_TYPE_Q8_0) {
        bytes = lin_bytes(DSQ_WFMT_Q8_0, n, k, 32, false);
    } else if (t->type == DSQ_TYPE_F32) {
        bytes = lin_bytes(DSQ_WFMT_F32, n, k, 0, false);
    } else if (float_src) {
        bytes = lin_bytes(DSQ_WFMT_F16, n, k, 0, false);
    } else {
        bytes = t->n_bytes;     /* a type the load refuses (quant.h) */
    }
    p->class_bytes[cls] += bytes;
}

/* The weights the graph builds at load from tensor `name`
 * (dsq_model_arch_built_weights: deepseek2's absorbed MLA copies, per
 * head W_UK_h^T [kv_lora_rank, qk_nope], a transpose of kv_b_proj rows,
 * model_deepseek2.c load_absorbed), F32, or RTN INT4 (group_size, with
 * zeros) with quantize. */
static void add_built(dsq_plan_t *p, const dsq_model_config_t *c, const char *name,
                      const dsq_plan_opts_t *o)
{
    int64_t n = 0, k = 0;
    const int64_t count = dsq_model_arch_built_weights(c, name, &n, &k);
    if (count <= 0)
        return;
    int g = o->group_size > 0 ? o->group_size : 32;
    dsq_wformat_t f = want_int4(o) ? DSQ_WFMT_INT4 : DSQ_WFMT_F32;
    p->class_bytes[DSQ_PLAN_MLA_ABSORBED] += count * lin_bytes(f, n, k, g, want_int4(o));
}

/* Config-only: one linear weight [n, k] of class cls. */
static void add_shape(dsq_plan_t *p, int cls, int64_t n, int64_t k, const dsq_plan_opts_t *o)
{
    int g = o->group_size > 0 ? o->group_size : 32;
    bool linear = cls != DSQ_PLAN_EMBED && cls != DSQ_PLAN_OUTPUT;
    p->n_params += n * k;
    if (k == 1) {
        p->class_bytes[cls] += n * 4;
        return;
    }
    p->class_bytes[cls] += linear && want_int4(o) ? lin_bytes(DSQ_WFMT_INT4, n, k, g, true)
                                                  : lin_bytes(DSQ_WFMT_F16, n, k, 0, false);
}

/* Config-only: the tensors the architecture's graph loads, FP16 linear
 * weights (INT4 with quantize), fp32 vectors and the MoE router in fp32,
 * plus what the graph builds from them. */
typedef struct config_plan {
    dsq_plan_t *p;
    const dsq_model_config_t *c;
    const dsq_plan_opts_t *o;
} config_plan_t;

static void add_config_tensor(void *user, const char *name, int64_t n, int64_t k)
{
    config_plan_t *cp = user;
    if (strstr(name, "ffn_gate_inp")) {         /* the MoE router */
        cp->p->n_params += n * k;
        cp->p->class_bytes[classify(name)] += n * k * 4;
    } else {
        add_shape(cp->p, classify(name), n, k, cp->o);
    }
    add_built(cp->p, cp->c, name, cp->o);
}

static void shapes_from_config(dsq_plan_t *p, const dsq_model_config_t *c,
                               const dsq_plan_opts_t *o)
{
    config_plan_t cp = {p, c, o};
    dsq_model_arch_tensors(c, add_config_tensor, &cp);
}

int dsq_plan_compute(const dsq_model_config_t *c, const dsq_tensor_t *const *tensors,
                     int n_tensors, const dsq_plan_opts_t *o, dsq_plan_t *out,
                     char *err, size_t err_len)
{
    memset(out, 0, sizeof(*out));
    if (c->n_layer <= 0 || c->n_embd <= 0 || c->n_vocab <= 0 || c->n_head <= 0) {
        snprintf(err, err_len, "plan: the config lacks layer/embedding/vocab/head sizes");
        return DSQ_EINVAL;
    }
    if (o->quantize && strcmp(o->quantize, "int4") && strcmp(o->quantize, "none")) {
        snprintf(err, err_len, "plan: --quantize must be int4 or none");
        return DSQ_EINVAL;
    }
    out->block_size = o->block_size > 0 ? o->block_size : 16;
    int64_t ctx = c->n_ctx_train > 0 ? c->n_ctx_train : DSQ_MODEL_CTX_DEFAULT;
    out->max_model_len = o->max_model_len > 0 ? o->max_model_len : (int)ctx;
    /* DeepSeek-V3's MTP module (model.h): loaded only when asked, and
     * then the first one (blk.<n_layer>.*) */
    const int n_mtp = o->mtp && c->n_nextn_layers > 0 ? 1 : 0;
    if (n_tensors > 0) {
        for (int i = 0; i < n_tensors; i++) {
            long blk;
            if (sscanf(tensors[i]->name, "blk.%ld.", &blk) == 1 && blk >= c->n_layer + n_mtp)
                continue;
            const char *dot = strrchr(tensors[i]->name, '.');
            int64_t gk = c->ckpt_quant == DSQ_CKPT_QUANT_GPTQ && dot &&
                         !strcmp(dot, ".qweight") ? gptq_k(tensors, n_tensors, i) : 0;
            add_tensor(out, tensors[i], o, c, gk);
            add_built(out, c, tensors[i]->name, o);
        }
    } else {
        out->weights_from_config = true;
        shapes_from_config(out, c, o);
    }
    for (int i = 0; i < DSQ_PLAN_N_CLASSES; i++)
        out->weight_bytes += out->class_bytes[i];
    out->coarse_estimate_bytes = (int64_t)(1.25 * (double)out->n_params / 2.0);
    out->kv_bytes_per_token = dsq_plan_kv_bytes_per_token(c, o->kv_dtype);
    if (n_mtp && c->n_layer > 0)        /* the module's attention layer */
        out->kv_bytes_per_token += out->kv_bytes_per_token / c->n_layer * n_mtp;
    out->block_bytes = out->kv_bytes_per_token * out->block_size;

    int64_t T = o->max_num_batched_tokens > 0 ? o->max_num_batched_tokens : 2048;
    int64_t S = o->max_num_seqs > 0 ? o->max_num_seqs : 256;
    int64_t d = c->n_embd, qd = c->n_head * c->head_dim, kvd = c->n_head_kv * c->head_dim;
    int64_t ff = c->n_ff > c->moe_intermediate_size ? c->n_ff : c->moe_intermediate_size;
    int64_t rows = (S < T ? S : T) + (o->spec_rows > 0 ? o->spec_rows : 0);
    if (rows > T)
        rows = T;
    /* engine/model/model_llama.c ensure_ws: x and lg fp32, the rest in the
     * activation type */
    const int64_t a = o->act_bytes > 0 ? o->act_bytes : 4;
    out->workspace_bytes = 4 * T * 2 * d + a * T * ((d > qd ? d : qd) + 2 * qd + 2 * kvd + 2 * ff) +
                           4 * rows * c->n_vocab + 17 * c->n_vocab;
    if (n_mtp)       /* the module's input [T][2 d] and the hidden rows kept */
        out->workspace_bytes += 4 * T * 3 * d;
    out->overhead_bytes = 0;   /* CPU backend: no runtime pools */
    if (o->device) {
        /* device buffers besides the workspace (engine/model/model_llama.c): a
         * step's index arrays (tokens, positions, rows, slots, logit rows,
         * block tables cut to the attended width <= max_model_len / bs) and,
         * for GPTQ (act-order possible), one permutation per linear input
         * (<= 4 distinct per layer) and the gathered input */
        int64_t mb = (out->max_model_len + out->block_size - 1) / out->block_size;
        out->overhead_bytes = 4 * (4 * T + rows + S * mb);
        if (c->ckpt_quant == DSQ_CKPT_QUANT_GPTQ) {
            int64_t wide = ff > d ? (ff > qd ? ff : qd) : (d > qd ? d : qd);
            out->overhead_bytes += 4 * c->n_layer * (2 * d + qd + ff) + a * T * wide;
        }
        out->device = true;
        snprintf(out->device_desc, sizeof(out->device_desc), "%s",
                 o->device_desc ? o->device_desc : "device");
        out->device_total_bytes = o->device_total_bytes;
        out->device_free_bytes = o->device_free_bytes;
        out->gpu_memory_utilization = o->gpu_memory_utilization;
    }
    out->budget_bytes = o->budget_bytes > 0 ? o->budget_bytes : dsq_plan_default_budget();
    out->draft_bytes = o->draft_bytes > 0 ? o->draft_bytes : 0;
    if (o->kv_cache_bytes > 0) {
        out->kv_budget_bytes = o->kv_cache_bytes;
        out->kv_budget_source = "--kv-cache-memory";
    } else {
        out->kv_budget_bytes = out->budget_bytes - out->weight_bytes - out->workspace_bytes -
                               out->overhead_bytes - out->draft_bytes;
        out->kv_budget_source = o->device ? "what the device budget leaves"
                                          : "what the memory budget leaves";
    }
    if (o->kv_cache_bytes <= 0 && o->device) {
        /* device: all that is left, up to every sequence at max_model_len */
        int64_t need = S * (int64_t)out->max_model_len * out->kv_bytes_per_token;
        if (need > 0 && out->kv_budget_bytes > need) {
            out->kv_budget_bytes = need;
            out->kv_budget_source = "capped at max_num_seqs x max_model_len tokens (every "
                                    "sequence at full length)";
        }
    } else if (o->kv_cache_bytes <= 0) {
        /* CPU default, as vLLM's CPU backend (VLLM_CPU_KVCACHE_SPACE = 4
         * GiB): never more than 4 GiB, and never more than every sequence
         * at max_model_len could use. */
        int64_t cap = (int64_t)4 << 30;
        const char *why = "capped at 4 GiB, the CPU default (as vLLM's "
                          "VLLM_CPU_KVCACHE_SPACE); --kv-cache-memory sets more";
        int64_t need = S * (int64_t)out->max_model_len * out->kv_bytes_per_token;
        if (need > 0 && need < cap) {
            cap = need;
            why = "capped at max_num_seqs x max_model_len tokens (every sequence at full "
                  "length)";
        }
        if (out->kv_budget_bytes > cap) {
            out->kv_budget_bytes = cap;
            out->kv_budget_source = why;
        }
    }
    if (out->kv_budget_bytes < 0)
        out->kv_budget_bytes = 0;
    out->num_blocks = out->block_bytes > 0 ? out->kv_budget_bytes / out->block_bytes : 0;
    out->max_tokens = out->num_blocks * out->block_size;
    out->max_concurrent_seqs = (double)out->max_tokens / out->max_model_len;
    const char *raise = o->device ? "--gpu-memory-utilization" : "--memory-limit";
    const int64_t fixed = out->weight_bytes + out->workspace_bytes + out->overhead_bytes +
                          out->draft_bytes;
    if (o->kv_cache_bytes <= 0 && fixed > out->budget_bytes) {
        snprintf(err, err_len, "plan: weights (%lld bytes)%s and workspace (%lld bytes) exceed "
                 "the %smemory budget (%lld bytes); raise %s, or use a smaller "
                 "(more quantized) model%s", (long long)(out->weight_bytes + out->draft_bytes),
                 out->draft_bytes ? ", the draft model's weights and KV cache included," : "",
                 (long long)(out->workspace_bytes + out->overhead_bytes),
                 o->device ? "device " : "", (long long)out->budget_bytes, raise,
                 out->draft_bytes ? " (the draft's KV cache holds --speculative-max-batch x "
                                    "(--max-model-len + 16) tokens: lower either)" : "");
        return DSQ_ERANGE;
    }
    if (o->kv_cache_bytes > 0 && fixed + o->kv_cache_bytes > out->budget_bytes) {
        /* users: an explicit KV budget over the limit is an error, not a
         * plan that silently overcommits */
        int64_t left = out->budget_bytes - fixed;
        snprintf(err, err_len, "plan: --kv-cache-memory %lld bytes with the weights (%lld "
                 "bytes) and workspace (%lld bytes) exceeds the %smemory budget (%lld "
                 "bytes); use --kv-cache-memory %lld or less, or raise %s",
                 (long long)o->kv_cache_bytes, (long long)(out->weight_bytes + out->draft_bytes),
                 (long long)(out->workspace_bytes + out->overhead_bytes),
                 o->device ? "device " : "", (long long)out->budget_bytes,
                 (long long)(left > 0 ? left : 0), raise);
        return DSQ_ERANGE;
    }
    return DSQ_OK;
}

bool dsq_plan_fit_advice(const dsq_plan_t *p, char *buf, size_t n)
{
    int64_t need = (p->max_model_len + p->block_size - 1) / p->block_size;
    if (p->num_blocks >= need)
        return false;
    if (p->max_tokens > 0)
        snprintf(buf, n, "one sequence of max_model_len %d needs %lld KV blocks of %d tokens; "
                 "the KV budget (%lld bytes, %s) holds %lld (%lld tokens): use "
                 "--max-model-len %lld or lower, or raise --kv-cache-memory / %s",
                 p->max_model_len, (long long)need, p->block_size,
                 (long long)p->kv_budget_bytes, p->kv_budget_source ? p->kv_budget_source : "",
                 (long long)p->num_blocks, (long long)p->max_tokens, (long long)p->max_tokens,
                 p->device ? "--gpu-memory-utilization" : "--memory-limit");
    else
        snprintf(buf, n, "one sequence of max_model_len %d needs %lld KV blocks of %d tokens; "
                 "the KV budget (%lld bytes, %s) holds none: raise --kv-cache-memory / %s",
                 p->max_model_len, (long long)need, p->block_size,
                 (long long)p->kv_budget_bytes, p->kv_budget_source ? p->kv_budget_source : "",
                 p->device ? "--gpu-memory-utilization" : "--memory-limit");
    return true;
}

static const char *const class_names[DSQ_PLAN_N_CLASSES] = {
    "embedding", "attention", "ffn", "experts", "output", "norms_biases", "mla_absorbed"};

static char *fmt_bytes(char *buf, size_t n, int64_t b)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) {
        v /= 1024;
        i++;
    }
    snprintf(buf, n, "%.2f %s", v, u[i]);
    return buf;
}

char *dsq_plan_format_table(const dsq_plan_t *p, const dsq_model_config_t *c)
{
    size_t cap = 4096;
    char *s = malloc(cap), b1[32], b2[32];
    if (!s)
        return NULL;
    int n = 0;
    n += snprintf(s + n, cap - (size_t)n, "memory plan: %s (%s), weights %s\n",
                  c->name[0] ? c->name : "model", dsq_arch_name(c->arch),
                  p->weights_from_config ? "estimated from config.json shapes" :
                  "exact from the tensor table");
    for (int i = 0; i < DSQ_PLAN_N_CLASSES; i++)
        if (p->class_bytes[i])
            n += snprintf(s + n, cap - (size_t)n, "  weights %-13s %14lld bytes  %s\n",
                          class_names[i], (long long)p->class_bytes[i],
                          fmt_bytes(b1, sizeof(b1), p->class_bytes[i]));
    char b3[32], b4[32];
    n += snprintf(s + n, cap - (size_t)n,
                  "  weights total         %14lld bytes  %s\n"
                  "  coarse 1.25*params/2  %14lld bytes  %s (params %lld; exact/coarse %.3f)\n"
                  "  workspace             %14lld bytes  %s\n"
                  "  budget                %14lld bytes  %s\n",
                  (long long)p->weight_bytes, fmt_bytes(b1, sizeof(b1), p->weight_bytes),
                  (long long)p->coarse_estimate_bytes,
                  fmt_bytes(b2, sizeof(b2), p->coarse_estimate_bytes), (long long)p->n_params,
                  p->coarse_estimate_bytes ? (double)p->weight_bytes / (double)p->coarse_estimate_bytes : 0,
                  (long long)p->workspace_bytes, fmt_bytes(b3, sizeof(b3), p->workspace_bytes),
                  (long long)p->budget_bytes, fmt_bytes(b4, sizeof(b4), p->budget_bytes));
    if (p->draft_bytes)
        n += snprintf(s + n, cap - (size_t)n,
                      "  draft model           %14lld bytes  %s (weights, KV cache, workspace)\n",
                      (long long)p->draft_bytes, fmt_bytes(b1, sizeof(b1), p->draft_bytes));
    if (p->device)
        n += snprintf(s + n, cap - (size_t)n,
                      "  device buffers        %14lld bytes  (index arrays, act-order)\n"
                      "  device                %s\n"
                      "  device memory         %14lld bytes total, %lld free; budget = "
                      "min(total x %.2f, free)\n",
                      (long long)p->overhead_bytes, p->device_desc,
                      (long long)p->device_total_bytes, (long long)p->device_free_bytes,
                      p->gpu_memory_utilization);
    else
        n += snprintf(s + n, cap - (size_t)n, "  device                cpu\n");
    n += snprintf(s + n, cap - (size_t)n,
                  "  KV budget             %14lld bytes  %s (%s)\n"
                  "  KV bytes per token    %14lld\n"
                  "  block bytes           %14lld (%d tokens)\n"
                  "  KV blocks             %14lld\n"
                  "  KV tokens             %14lld\n"
                  "  max_model_len         %14d\n"
                  "  concurrent sequences at max_model_len: %.2f\n",
                  (long long)p->kv_budget_bytes, fmt_bytes(b1, sizeof(b1), p->kv_budget_bytes),
                  p->kv_budget_source ? p->kv_budget_source : "",
                  (long long)p->kv_bytes_per_token, (long long)p->block_bytes, p->block_size,
                  (long long)p->num_blocks, (long long)p->max_tokens, p->max_model_len,
                  p->max_concurrent_seqs);
    return s;
}

char *dsq_plan_format_json(const dsq_plan_t *p, const dsq_model_config_t *c)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "architecture", dsq_arch_name(c->arch));
    cJSON_AddBoolToObject(o, "weights_from_config", p->weights_from_config);
    cJSON_AddNumberToObject(o, "weight_bytes", (double)p->weight_bytes);
    cJSON *w = cJSON_AddObjectToObject(o, "weights_by_class");
    for (int i = 0; w && i < DSQ_PLAN_N_CLASSES; i++)
        cJSON_AddNumberToObject(w, class_names[i], (double)p->class_bytes[i]);
    cJSON_AddNumberToObject(o, "n_params", (double)p->n_params);
    cJSON_AddNumberToObject(o, "coarse_estimate_bytes", (double)p->coarse_estimate_bytes);
    cJSON_AddNumberToObject(o, "kv_bytes_per_token", (double)p->kv_bytes_per_token);
    cJSON_AddNumberToObject(o, "block_size", p->block_size);
    cJSON_AddNumberToObject(o, "block_bytes", (double)p->block_bytes);
    cJSON_AddNumberToObject(o, "workspace_bytes", (double)p->workspace_bytes);
    cJSON_AddNumberToObject(o, "overhead_bytes", (double)p->overhead_bytes);
    cJSON_AddNumberToObject(o, "budget_bytes", (double)p->budget_bytes);
    cJSON_AddNumberToObject(o, "draft_bytes", (double)p->draft_bytes);
    cJSON_AddNumberToObject(o, "kv_budget_bytes", (double)p->kv_budget_bytes);
    cJSON_AddStringToObject(o, "kv_budget_source",
                            p->kv_budget_source ? p->kv_budget_source : "");
    cJSON_AddNumberToObject(o, "num_blocks", (double)p->num_blocks);
    cJSON_AddNumberToObject(o, "max_tokens", (double)p->max_tokens);
    cJSON_AddNumberToObject(o, "max_model_len", p->max_model_len);
    cJSON_AddNumberToObject(o, "max_concurrent_seqs", p->max_concurrent_seqs);
    if (p->device) {
        cJSON *dv = cJSON_AddObjectToObject(o, "device");
        if (dv) {
            cJSON_AddStringToObject(dv, "backend", p->device_desc);
            cJSON_AddNumberToObject(dv, "total_bytes", (double)p->device_total_bytes);
            cJSON_AddNumberToObject(dv, "free_bytes", (double)p->device_free_bytes);
            cJSON_AddNumberToObject(dv, "gpu_memory_utilization", p->gpu_memory_utilization);
        }
    } else {
        cJSON_AddStringToObject(o, "device", "cpu");
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}
