/* Engine start-up and shutdown: the device the model runs on, the memory
 * plan that sizes the KV cache before any weight is loaded (the same plan
 * `dsqd --plan` prints, dsq_engine_plan), then the model, the KV cache,
 * the scheduler and the admission policy, and last the engine thread
 * (engine.c). Start-up returns a running engine or undoes everything it
 * made, with the reason in err: there is no half-started engine. Also the
 * read-only model facts the server asks for.
 */
#include "engine_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "dsq_config.h"
#include "engine/backend/backend.h"
#include "engine/common/clock.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/io/model_config.h"
#include "engine/kv/kv_cache.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"
#include "engine/text/grammar.h"
#include "kernels.h"
#include "admission.h"
#include "padding.h"
#include "planner.h"
#include "sampler.h"
#include "scheduler.h"

/* KV element type: explicit, or "auto" = FP32 for FP32 models (the token
 * embedding's type stands for the model's storage type), FP16 otherwise;
 * on a device backend FP16 for those too (CUDA has no F32 KV ops). */
static dsq_kv_dtype_t kv_dtype_for(const dsq_engine_opts_t *opts, const dsq_model_file_t *f,
                                   bool device)
{
    _Static_assert((int)DSQ_ENGINE_KV_F16 == (int)DSQ_KV_F16 &&
                   (int)DSQ_ENGINE_KV_INT8 == (int)DSQ_KV_INT8 &&
                   (int)DSQ_ENGINE_KV_F32 == (int)DSQ_KV_F32,
                   "engine.h names the kernels' KV types by value");
    if (opts->kv_cache_dtype == DSQ_ENGINE_KV_INT8)
        return DSQ_KV_INT8;
    if (opts->kv_cache_dtype == DSQ_ENGINE_KV_F32)
        return DSQ_KV_F32;
    if (opts->kv_cache_dtype == DSQ_ENGINE_KV_AUTO && f && !device) {
        const dsq_tensor_t *t = dsq_model_file_find(f, "token_embd.weight");
        if (t && t->type == DSQ_TYPE_F32)
            return DSQ_KV_F32;
    }
    return DSQ_KV_F16;
}

/* The backend opts->device names (engine.h). *owned: the caller destroys
 * it. NULL + err when it cannot be had. */
static dsq_backend_t *open_device(const dsq_engine_opts_t *opts, dsq_arch_t arch,
                                  bool *owned, char *err, size_t err_len)
{
    const char *dev = opts->device && *opts->device ? opts->device : "cpu";
    char why[256] = "";
    dsq_backend_t *be = NULL;
    *owned = false;
    if (strcmp(dev, "cpu") && strcmp(dev, "cuda") && strcmp(dev, "auto")) {
        snprintf(err, err_len, "unknown device \"%s\" (auto, cpu or cuda)", dev);
        return NULL;
    }
    if (!strcmp(dev, "auto") && dsq_model_arch_host_only(arch))
        snprintf(why, sizeof(why), "the %s graph runs on the CPU backend only",
                 dsq_arch_name(arch));
    else if (!strcmp(dev, "cuda") || (!strcmp(dev, "auto") && DSQ_HAVE_CUDA)) {
        be = dsq_backend_create(DSQ_BACKEND_CUDA, why, sizeof(why));
        if (!be && !strcmp(dev, "cuda")) {
            snprintf(err, err_len, "--device cuda: %s", why);
            return NULL;
        }
        *owned = be != NULL;
    }
    if (!be)
        be = dsq_backend_cpu();
    char desc[256];
    dsq_backend_describe(be, desc, sizeof(desc));
    if (why[0])
        dsq_log(DSQ_LOG_INFO, "event=device requested=%s backend=%s desc=\"%s\" "
                "cuda_unavailable=\"%s\"", dev, dsq_backend_name(be), desc, why);
    else
        dsq_log(DSQ_LOG_INFO, "event=device requested=%s backend=%s desc=\"%s\"", dev,
                dsq_backend_name(be), desc);
    return be;
}

/* Device plans, as vLLM's gpu_memory_utilization: the fraction of the
 * device's total memory this server may use, counting what was in use
 * before its first allocation (its own CUDA context, other processes):
 *   budget = min(total x utilization - (total - free), free).
 * dsq's engine uses no cuBLAS, so no cuBLAS workspace is subtracted. */
static int device_budget(dsq_backend_t *be, const dsq_engine_opts_t *opts,
                         dsq_plan_opts_t *po, char *desc, size_t desc_len, char *err,
                         size_t err_len)
{
    size_t fr = 0, tot = 0;
    int rc = dsq_backend_mem_info(be, &fr, &tot);
    if (rc) {
        snprintf(err, err_len, "%s: cannot read the device's memory (%s)",
                 dsq_backend_name(be), dsq_strerror(rc));
        return rc;
    }
    double util = opts->gpu_memory_utilization > 0 ? opts->gpu_memory_utilization : 0.9;
    int64_t budget = (int64_t)((double)tot * util) - (int64_t)(tot - fr);
    if (budget > (int64_t)fr)
        budget = (int64_t)fr;
    if (budget <= 0) {
        snprintf(err, err_len, "%s: --gpu-memory-utilization %g of the device's %zu bytes "
                 "leaves nothing once the %zu bytes already in use (CUDA context, other "
                 "processes) are counted: raise it", dsq_backend_name(be), util, tot,
                 tot - fr);
        return DSQ_ENOMEM;
    }
    dsq_backend_describe(be, desc, desc_len);
    po->device = true;
    po->device_desc = desc;
    po->device_total_bytes = (int64_t)tot;
    po->device_free_bytes = (int64_t)fr;
    po->gpu_memory_utilization = util;
    if (po->budget_bytes <= 0 || po->budget_bytes > budget)
        po->budget_bytes = budget;
    return DSQ_OK;
}

/* Whether the model load moves weights into their interleaved twins on
 * this backend (model_weights.c): the planner counts the twins' bytes. */
static bool host_interleaves(const dsq_engine_opts_t *opts, dsq_backend_t *be)
{
    return dsq_backend_is_host(be) &&
           dsq_cpu_has_x8(opts->activation_dtype == DSQ_ENGINE_ACT_F32 ? DSQ_ACT_F32
                                                                       : DSQ_ACT_INT8);
}

static void plan_opts_from(const dsq_engine_opts_t *opts, dsq_plan_opts_t *po)
{
    memset(po, 0, sizeof(*po));
    po->block_size = opts->block_size;
    po->max_model_len = opts->max_model_len;
    po->max_num_seqs = opts->max_num_seqs;
    po->max_num_batched_tokens = opts->max_num_batched_tokens;
    po->budget_bytes = opts->memory_limit_bytes;
    po->kv_cache_bytes = opts->kv_cache_memory_bytes;
    po->quantize = opts->quantize;
    po->group_size = opts->quant_group_size;
    po->mtp = opts->spec_mtp;
    if (opts->spec_k > 0)
        po->spec_rows = opts->spec_k * (opts->spec_max_batch > 0 ? opts->spec_max_batch
                                                                 : DSQ__SPEC_MAX_BATCH);
}

/* Speculative decoding options: defaults applied into o, or a reason. */
static int spec_opts(dsq_engine_opts_t *o, char *err, size_t err_len)
{
    if (o->spec_k < 0 || o->spec_k > DSQ_SPEC_MAX_K || o->spec_ngram_min < 0 ||
        o->spec_ngram_max < 0 || o->spec_max_batch < 0) {
        snprintf(err, err_len, "speculative decoding: draft tokens must be 0..%d and the "
                 "n-gram sizes and batch limit >= 0", DSQ_SPEC_MAX_K);
        return DSQ_EINVAL;
    }
    if (o->spec_ngram_min == 0)
        o->spec_ngram_min = o->spec_ngram_max > 0 && o->spec_ngram_max < 2 ? o->spec_ngram_max
                                                                           : 2;
    if (o->spec_ngram_max == 0)
        o->spec_ngram_max = o->spec_ngram_min > 4 ? o->spec_ngram_min : 4;
    if (o->spec_k > 0 && o->spec_ngram_min > o->spec_ngram_max) {
        snprintf(err, err_len, "speculative decoding: n-gram min %d > max %d",
                 o->spec_ngram_min, o->spec_ngram_max);
        return DSQ_EINVAL;
    }
    if (o->spec_max_batch == 0)
        o->spec_max_batch = DSQ__SPEC_MAX_BATCH;
    if (o->draft_model_path && !*o->draft_model_path)
        o->draft_model_path = NULL;
    if (o->spec_mtp && o->draft_model_path) {
        snprintf(err, err_len, "speculative decoding: the MTP module and a draft model are "
                 "two proposers: use one");
        return DSQ_EINVAL;
    }
    if (o->spec_mtp && o->spec_k == 0)
        o->spec_k = 1;     /* one module, one draft a step */
    if (o->draft_model_path && o->spec_k == 0) {
        snprintf(err, err_len, "speculative decoding: a draft model needs a draft length "
                 "(1..%d)", DSQ_SPEC_MAX_K);
        return DSQ_EINVAL;
    }
    if (o->draft_kv_tokens < 0) {
        snprintf(err, err_len, "speculative decoding: the draft KV cache's tokens must be >= 0");
        return DSQ_EINVAL;
    }
    return DSQ_OK;
}

/* Tokens per catch-up pass of the draft model (draft.h max_chunk): its
 * workspace is planned for this many rows. */
#define DRAFT_CHUNK 256

/* The draft model's KV capacity in tokens: opts' or every speculating
 * sequence at full length (mml: the target's max_model_len). */
static int64_t draft_kv_tokens(const dsq_engine_opts_t *o, int mml)
{
    if (o->draft_kv_tokens > 0)
        return o->draft_kv_tokens;
    return (int64_t)o->spec_max_batch * (mml + DSQ_SPEC_MAX_K);
}

/* The draft model's line of the plan: the bytes its weights, KV cache and
 * workspace take, planned from its file's tensor table as the model's
 * are (no weight loaded), and its KV element type into *kvt (may be
 * NULL). 0 without a draft model. */
static int draft_plan_bytes(const dsq_engine_opts_t *o, dsq_backend_t *be, int mml,
                            int64_t *bytes, dsq_kv_dtype_t *kvt, char *err, size_t err_len)
{
    *bytes = 0;
    if (!o->draft_model_path)
        return DSQ_OK;
    char why[512];
    dsq_model_file_t *f = dsq_model_file_open(o->draft_model_path, NULL, why, sizeof(why));
    if (!f && o->tokenizer_path)
        f = dsq_model_file_open(o->draft_model_path, o->tokenizer_path, why, sizeof(why));
    if (!f) {
        snprintf(err, err_len, "--draft-model: %s", why);
        return DSQ_EIO;
    }
    int n_t = dsq_model_file_n_tensors(f), rc;
    const dsq_tensor_t **tv = calloc((size_t)(n_t > 0 ? n_t : 1), sizeof(*tv));
    if (!tv) {
        dsq_model_file_close(f);
        snprintf(err, err_len, "out of memory");
        return DSQ_ENOMEM;
    }
    for (int i = 0; i < n_t; i++)
        tv[i] = dsq_model_file_tensor(f, i);
    const dsq_model_config_t *c = dsq_model_file_config(f);
    dsq_plan_opts_t po = {
        .block_size = o->block_size, .max_model_len = mml, .max_num_seqs = o->spec_max_batch,
        .max_num_batched_tokens = DRAFT_CHUNK, .budget_bytes = INT64_MAX / 4,
        .quantize = o->quantize, .group_size = o->quant_group_size,
        .kv_dtype = kv_dtype_for(o, f, !dsq_backend_is_host(be)),
        .host_x8 = host_interleaves(o, be), .device = !dsq_backend_is_host(be)};
    dsq_ftype_t act;
    rc = dsq_model_act_type(f, o->dtype, !po.device, &act, why, sizeof(why));
    po.act_bytes = (int)dsq_ftype_size(act);
    po.kv_cache_bytes = draft_kv_tokens(o, mml) * dsq_plan_kv_bytes_per_token(c, po.kv_dtype);
    dsq_plan_t p;
    if (!rc)
        rc = dsq_plan_compute(c, tv, n_t, &po, &p, why, sizeof(why));
    if (rc)
        snprintf(err, err_len, "--draft-model %.300s: %s", o->draft_model_path, why);
    else
        *bytes = p.weight_bytes + p.workspace_bytes + p.overhead_bytes + p.kv_budget_bytes;
    if (kvt)
        *kvt = po.kv_dtype;
    free(tv);
    dsq_model_file_close(f);
    return rc;
}

/* The target's max_model_len as the planner will choose it. */
static int planned_max_model_len(const dsq_engine_opts_t *o, const dsq_model_config_t *c)
{
    if (o->max_model_len > 0)
        return o->max_model_len;
    return c->n_ctx_train > 0 ? (int)c->n_ctx_train : DSQ_MODEL_CTX_DEFAULT;
}

/* Step 1 of dsq_engine_create: the model file, the backend it runs on and
 * its tokenizer. Each step leaves what it made in e, for create's one
 * clean-up, and returns 0 or a DSQ_E* with the reason in err. */
static int open_model(dsq_engine_t *e, const dsq_engine_opts_t *opts, char *err,
                      size_t err_len)
{
    e->file = dsq_model_file_open(opts->model_path, opts->tokenizer_path, err, err_len);
    if (!e->file)
        return DSQ_EIO;
    e->be = open_device(opts, dsq_model_file_config(e->file)->arch, &e->be_owned, err,
                        err_len);
    if (!e->be)
        return DSQ_EUNSUPPORTED;
    e->tok = dsq_model_file_tokenizer(e->file);
    if (!e->tok) {
        snprintf(err, err_len, "%s: no tokenizer in the model file; pass --tokenizer",
                 opts->model_path);
        return DSQ_ENOTFOUND;
    }
    return DSQ_OK;
}

/* Step 2: plan memory from the config and the tensor table before
 * loading: *plan (max_model_len, KV blocks, the figures logged later) and
 * *kvt, the KV element type. A plan that cannot hold one sequence of
 * max_model_len fails with the planner's reason, which names the flags. */
static int plan_memory(dsq_engine_t *e, const dsq_engine_opts_t *opts, dsq_plan_t *plan,
                       dsq_kv_dtype_t *kvt, char *err, size_t err_len)
{
    const bool device = !dsq_backend_is_host(e->be);
    char desc[256];
    int rc = DSQ_OK;
    const dsq_model_config_t *fc = dsq_model_file_config(e->file);
    int n_t = dsq_model_file_n_tensors(e->file);
    const dsq_tensor_t **tv = calloc((size_t)(n_t > 0 ? n_t : 1), sizeof(*tv));
    if (!tv) {
        snprintf(err, err_len, "out of memory");
        return DSQ_ENOMEM;
    }
    for (int i = 0; i < n_t; i++)
        tv[i] = dsq_model_file_tensor(e->file, i);
    *kvt = kv_dtype_for(opts, e->file, device);
    if (device && *kvt == DSQ_KV_F32) {
        snprintf(err, err_len, "--kv-cache-dtype fp32 is not supported on %s (fp16 or int8)",
                 dsq_backend_name(e->be));
        rc = DSQ_EUNSUPPORTED;
        goto free_tv;
    }
    dsq_plan_opts_t po;
    plan_opts_from(opts, &po);
    po.kv_dtype = *kvt;
    po.host_x8 = host_interleaves(opts, e->be);
    dsq_ftype_t act;
    if ((rc = dsq_model_act_type(e->file, opts->dtype, !device, &act, err, err_len)))
        goto free_tv;
    po.act_bytes = (int)dsq_ftype_size(act);
    if (device && (rc = device_budget(e->be, opts, &po, desc, sizeof(desc), err, err_len)))
        goto free_tv;
    if ((rc = draft_plan_bytes(&e->o, e->be, planned_max_model_len(opts, fc), &po.draft_bytes,
                               &e->draft_kvt, err, err_len)))
        goto free_tv;
    rc = dsq_plan_compute(fc, tv, n_t, &po, plan, err, err_len);
    if (rc)
        goto free_tv;        /* DSQ_ERANGE: err is the planner's, naming the flags */
    e->max_model_len = plan->max_model_len;
    {
        char advice[640];
        if (dsq_plan_fit_advice(plan, advice, sizeof(advice))) {
            snprintf(err, err_len, "memory plan: %s", advice);
            rc = DSQ_ERANGE;
            goto free_tv;
        }
    }
    dsq_log(DSQ_LOG_INFO, "event=kv_budget bytes=%lld blocks=%lld source=\"%s\"",
            (long long)plan->kv_budget_bytes, (long long)plan->num_blocks,
            plan->kv_budget_source ? plan->kv_budget_source : "");
free_tv:
    free(tv);
    return rc;
}

/* Step 3: the weights, in the backend's layout, and the padding cost
 * model; logs the plan's weight bytes beside the measured ones. */
static int load_model(dsq_engine_t *e, const dsq_engine_opts_t *opts, const dsq_plan_t *plan,
                      char *err, size_t err_len)
{
    dsq_model_opts_t mo = {.quantize = opts->quantize, .group_size = opts->quant_group_size,
                           .activation_dtype = opts->activation_dtype == DSQ_ENGINE_ACT_F32
                                               ? DSQ_ACT_F32 : DSQ_ACT_INT8,
                           .backend = e->be, .mtp = opts->spec_mtp, .dtype = opts->dtype};
    e->model = dsq_model_create(e->file, &mo, err, err_len);
    if (!e->model)
        return DSQ_EFORMAT;
    if (opts->spec_mtp && dsq_model_n_mtp(e->model) == 0) {
        snprintf(err, err_len, "--speculative-mtp: %s has no multi-token prediction module "
                 "(DeepSeek-V3 Hugging Face checkpoints carry one after the last layer, "
                 "num_nextn_predict_layers; GGUF conversions drop it)", opts->model_path);
        return DSQ_EUNSUPPORTED;
    }
    /* the CPU backend runs ragged batches, so the padding model is only
     * loaded and logged here; the CUDA-graph path will plan with it. */
    int rc = dsq_pad_model_open(opts->padding_model_path, "cpu", &e->pad_model, err, err_len);
    if (rc != 0)
        return rc;
    const dsq_model_config_t *c = dsq_model_config(e->model);
    e->n_vocab = (int)c->n_vocab;
    dsq_log(DSQ_LOG_INFO, "event=memory_plan weight_bytes_predicted=%lld "
            "weight_bytes_measured=%zu coarse_estimate_bytes=%lld kv_blocks=%lld "
            "kv_tokens=%lld kv_bytes_per_token=%lld workspace_bytes=%lld activations=%s",
            (long long)plan->weight_bytes, dsq_model_weight_bytes(e->model),
            (long long)plan->coarse_estimate_bytes, (long long)plan->num_blocks,
            (long long)plan->max_tokens, (long long)plan->kv_bytes_per_token,
            (long long)plan->workspace_bytes, dsq_ftype_name(dsq_model_act(e->model)));
    return DSQ_OK;
}

/* Step 3b: speculation's draft model, on the model's backend, with its
 * own KV cache (draft.h). */
static int load_draft(dsq_engine_t *e, const dsq_plan_t *plan, char *err, size_t err_len)
{
    const dsq_engine_opts_t *o = &e->o;
    if (!o->draft_model_path || o->spec_k == 0)
        return DSQ_OK;
    dsq_draft_opts_t dop = {
        .path = o->draft_model_path, .tokenizer_path = o->tokenizer_path,
        .target_tok = e->tok, .target_n_vocab = e->n_vocab,
        .model = {.quantize = o->quantize, .group_size = o->quant_group_size,
                  .activation_dtype = o->activation_dtype == DSQ_ENGINE_ACT_F32
                                      ? DSQ_ACT_F32 : DSQ_ACT_INT8,
                  .backend = e->be, .dtype = o->dtype},
        .block_size = plan->block_size, .kv_tokens = draft_kv_tokens(o, plan->max_model_len),
        .n_states = 2 * o->spec_max_batch, .max_chunk = DRAFT_CHUNK,
        .kv_dtype = e->draft_kvt};     /* the plan's: its own file's type */
    e->draft = dsq_draft_create(&dop, err, err_len);
    if (!e->draft)
        return DSQ_EINVAL;
    dsq_draft_info_t di;
    dsq_draft_info(e->draft, &di);
    dsq_log(DSQ_LOG_INFO, "event=draft_ready path=\"%s\" weight_bytes=%zu kv_blocks=%lld "
            "kv_tokens=%lld planned_bytes=%lld", o->draft_model_path, di.weight_bytes,
            (long long)di.kv_blocks, (long long)dop.kv_tokens, (long long)plan->draft_bytes);
    return DSQ_OK;
}

/* Step 4: the KV cache, the plan's blocks of kvt in the backend's memory
 * (the host's prefaulted when asked); on a device the plan is logged
 * beside what was allocated (event=device_memory, stats.device_*). */
static int create_kv_cache(dsq_engine_t *e, const dsq_engine_opts_t *opts,
                           const dsq_plan_t *plan, dsq_kv_dtype_t kvt, char *err,
                           size_t err_len)
{
    const bool device = !dsq_backend_is_host(e->be);
    /* the model says what its cache holds (MLA: one latent + rope key
     * vector per token, no V), matching dsq_plan_kv_bytes_per_token. */
    int kv_heads, kv_dim;
    bool kv_has_v;
    dsq_model_kv_shape(e->model, &kv_heads, &kv_dim, &kv_has_v);
    e->kv = dsq_kv_create_on(e->be, dsq_model_kv_layers(e->model), kv_heads, kv_dim,
                             plan->block_size,
                             plan->num_blocks, kvt, kv_has_v, err, err_len);
    if (!e->kv)
        return DSQ_ENOMEM;
    if (opts->kv_prefault && !device) {
        double t0 = dsq_clock_now_s();
        size_t b = dsq_kv_prefault(e->kv);
        dsq_log(DSQ_LOG_INFO, "event=kv_prefault bytes=%zu ms=%.0f", b, 1e3 * (dsq_clock_now_s() - t0));
    }
    if (device) {
        /* the plan's figures beside what was allocated so far; the step
         * buffers are allocated as steps need them (up to the workspace
         * and device buffers of the plan) */
        int64_t predicted = plan->weight_bytes + plan->num_blocks * plan->block_bytes +
                            plan->workspace_bytes + plan->overhead_bytes;
        size_t allocated = dsq_backend_allocated_bytes(e->be);
        e->stats.device_planned_bytes = predicted;
        e->stats.device_budget_bytes = plan->budget_bytes;
        e->stats.device_allocated_bytes = (int64_t)allocated;
        e->stats.device_peak_bytes = (int64_t)dsq_backend_peak_bytes(e->be);
        dsq_log(allocated > (size_t)predicted ? DSQ_LOG_WARN : DSQ_LOG_INFO,
                "event=device_memory backend=%s planned_bytes=%lld weight_bytes_planned=%lld "
                "kv_bytes_planned=%lld allocated_bytes=%zu kv_bytes=%zu budget_bytes=%lld",
                dsq_backend_name(e->be), (long long)predicted, (long long)plan->weight_bytes,
                (long long)(plan->num_blocks * plan->block_bytes), allocated,
                dsq_kv_storage_bytes(e->kv), (long long)plan->budget_bytes);
    }
    if (opts->enable_prefix_caching && dsq_kv_set_prefix_caching(e->kv, true) != DSQ_OK) {
        snprintf(err, err_len, "prefix caching: out of memory for %lld blocks",
                 (long long)plan->num_blocks);
        return DSQ_ENOMEM;
    }
    return DSQ_OK;
}

/* Step 5: the scheduler over the KV cache, the admission policy, the
 * sampler and the row the sampler may change (logits_fork). */
static int create_scheduler(dsq_engine_t *e, const dsq_engine_opts_t *opts, char *err,
                            size_t err_len)
{
    dsq_sched_opts_t so = {
        .max_num_seqs = opts->max_num_seqs > 0 ? opts->max_num_seqs : 256,
        .max_num_batched_tokens = opts->max_num_batched_tokens > 0 ?
                                  opts->max_num_batched_tokens : 2048,
        .max_prefill_tokens_with_decode = opts->max_prefill_tokens_with_decode,
        .admission_defer_steps = opts->admission_defer_steps == 0 ?
                                 DSQ_ENGINE_ADMISSION_DEFER_STEPS :
                                 opts->admission_defer_steps < 0 ? 0 :
                                 opts->admission_defer_steps,
    };
    /* prompt-logprob rows per step: the logits rows the memory
     * planner sizes the workspace for (min(max_num_seqs, batched tokens)) */
    so.max_prompt_logit_rows = so.max_num_seqs < so.max_num_batched_tokens
                                   ? so.max_num_seqs : so.max_num_batched_tokens;
    e->sched = dsq_sched_create(e->kv, &so);
    atomic_init(&e->n_free_slots, so.max_num_seqs);
    {
        /* admission (admission.h): bounded by max_num_seqs and the KV plan */
        dsq_admission_opts_t ao = {
            .kind = opts->admission_policy == DSQ_ADMISSION_ADAPTIVE ? DSQ_ADMISSION_ADAPTIVE
                                                                    : DSQ_ADMISSION_STATIC,
            .target_ttft_ms = opts->target_ttft_ms, .target_itl_ms = opts->target_itl_ms,
            .max_limit = so.max_num_seqs};
        e->kv_tokens = dsq_kv_n_blocks(e->kv) * (int64_t)dsq_kv_block_size(e->kv);
        if (!(e->adm = dsq_admission_create(&ao, err, err_len)))
            return DSQ_EINVAL;
    }
    e->sampler = dsq_sampler_create(e->n_vocab);
    e->logits_fork = malloc((size_t)e->n_vocab * sizeof(float));
    if (!e->sched || !e->sampler || !e->logits_fork) {
        snprintf(err, err_len, "out of memory");
        return DSQ_ENOMEM;
    }
    return DSQ_OK;
}

dsq_engine_t *dsq_engine_create(const dsq_engine_opts_t *opts, char *err,
                                size_t err_len)
{
    dsq_engine_t *e = calloc(1, sizeof(*e));
    if (!e) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    e->o = *opts;
    if (spec_opts(&e->o, err, err_len)) {
        free(e);
        return NULL;
    }
    pthread_mutex_init(&e->mu, NULL);
    atomic_init(&e->n_waiting, 0);
    if (opts->n_threads > 0)
        dsq_backend_set_host_threads(opts->n_threads);
    double t0 = dsq_clock_now_s();
    dsq_plan_t plan;
    dsq_kv_dtype_t kvt = DSQ_KV_F16;
    if (open_model(e, opts, err, err_len) ||
        plan_memory(e, opts, &plan, &kvt, err, err_len) ||
        load_model(e, opts, &plan, err, err_len) ||
        load_draft(e, &plan, err, err_len) ||
        create_kv_cache(e, opts, &plan, kvt, err, err_len) ||
        create_scheduler(e, opts, err, err_len) ||
        dsq__engine_start_thread(e, opts, err, err_len))
        goto fail;
    const dsq_model_config_t *c = dsq_model_config(e->model);
    int block_size = plan.block_size;
    int64_t n_blocks = plan.num_blocks;
    size_t per_tok = (size_t)plan.kv_bytes_per_token;
    e->stats.kv_block_bytes = (int64_t)per_tok * block_size;
    e->stats.spec_k = e->o.spec_k;
    dsq__update_stats(e);
    dsq_log(DSQ_LOG_INFO, "event=engine_ready arch=%s n_layer=%lld n_vocab=%d "
            "weights_bytes=%zu kv_blocks=%lld block_size=%d kv_bytes_per_token=%zu "
            "max_model_len=%d backend=%s threads=%d isa=%s load_ms=%.0f",
            dsq_arch_name(c->arch), (long long)c->n_layer, e->n_vocab,
            dsq_model_weight_bytes(e->model), (long long)n_blocks, block_size, per_tok,
            e->max_model_len, dsq_backend_name(e->be), dsq_backend_host_threads(),
            dsq_backend_host_isa(),
            (dsq_clock_now_s() - t0) * 1000.0);
    return e;
fail:
    dsq_admission_destroy(e->adm);
    dsq_sched_destroy(e->sched);
    dsq_sampler_destroy(e->sampler);
    free(e->logits_fork);
    dsq_kv_destroy(e->kv);
    dsq_draft_destroy(e->draft);
    dsq_model_destroy(e->model);
    if (e->be_owned)
        dsq_backend_destroy(e->be);
    dsq_pad_model_destroy(e->pad_model);
    dsq_model_file_close(e->file);
    pthread_mutex_destroy(&e->mu);
    free(e);
    return NULL;
}

/* config.json alone (no weights): read it directly. */
static int config_only(const char *dir, dsq_model_config_t *c, char *err, size_t err_len)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "%.400s: cannot open", path);
        return DSQ_EIO;
    }
    char *buf = malloc(1 << 20);
    size_t n = buf ? fread(buf, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (!buf)
        return DSQ_ENOMEM;
    int rc = dsq_model_config_from_hf_json(buf, n, c, err, err_len);
    free(buf);
    return rc;
}

int dsq_engine_plan(const dsq_engine_opts_t *opts, bool json, char **out, char *err,
                    size_t err_len)
{
    dsq_model_config_t cfg;
    const dsq_model_config_t *c = &cfg;
    const dsq_tensor_t **tv = NULL;
    int n_t = 0, rc;
    dsq_backend_t *be = NULL;
    bool be_owned = false;
    char desc[256];
    *out = NULL;
    dsq_model_file_t *f = dsq_model_file_open(opts->model_path, opts->tokenizer_path, err,
                                              err_len);
    if (f) {
        c = dsq_model_file_config(f);
        n_t = dsq_model_file_n_tensors(f);
        tv = calloc((size_t)(n_t > 0 ? n_t : 1), sizeof(*tv));
        if (!tv) {
            rc = DSQ_ENOMEM;
            goto done;
        }
        for (int i = 0; i < n_t; i++)
            tv[i] = dsq_model_file_tensor(f, i);
    } else {
        char err2[512];
        rc = config_only(opts->model_path, &cfg, err2, sizeof(err2));
        if (rc)
            goto done;    /* keep the loader's message: it says more */
    }
    dsq_plan_opts_t po;
    plan_opts_from(opts, &po);
    be = open_device(opts, c->arch, &be_owned, err, err_len);
    if (!be) {
        rc = DSQ_EUNSUPPORTED;
        goto done;
    }
    po.kv_dtype = kv_dtype_for(opts, f, !dsq_backend_is_host(be));
    po.host_x8 = host_interleaves(opts, be);
    if (!dsq_backend_is_host(be) &&
        (rc = device_budget(be, opts, &po, desc, sizeof(desc), err, err_len)))
        goto done;
    {
        dsq_engine_opts_t so = *opts;
        if ((rc = spec_opts(&so, err, err_len)) ||
            (rc = draft_plan_bytes(&so, be, planned_max_model_len(opts, c), &po.draft_bytes,
                                   NULL, err, err_len)))
            goto done;
    }
    dsq_plan_t plan;
    rc = dsq_plan_compute(c, tv, n_t, &po, &plan, err, err_len);
    if (rc == DSQ_OK || rc == DSQ_ERANGE) {
        if (rc == DSQ_OK && dsq_plan_fit_advice(&plan, err, err_len))
            rc = DSQ_ERANGE;
        *out = json ? dsq_plan_format_json(&plan, c) : dsq_plan_format_table(&plan, c);
        if (!*out)
            rc = DSQ_ENOMEM;
    }
done:
    if (be_owned)
        dsq_backend_destroy(be);
    free(tv);
    dsq_model_file_close(f);
    return rc;
}

void dsq_engine_destroy(dsq_engine_t *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    pthread_mutex_unlock(&e->mu);
    uv_async_send(&e->async);
    pthread_join(e->thread, NULL);
    dsq__mask_worker_stop(e);
    free(e->mw.jobs);
    uv_loop_close(&e->loop);
    /* Requests submitted after the loop drained: release them. */
    for (int i = 0; i < e->subq_n; i++)
        dsq_req_unref(e->subq[i]);
    free(e->subq);
    free(e->pend);                 /* held back: emptied by abort_all */
    dsq_admission_destroy(e->adm);
    dsq_sched_destroy(e->sched);
    dsq_sampler_destroy(e->sampler);
    dsq_grammar_vocab_free(e->gvocab);
    free(e->gmask);
    free(e->tmask);
    free(e->logits);
    free(e->seq_dec);
    free(e->logits_fork);
    free(e->lrows);
    free(e->xpos);
    free(e->xseq);
    free(e->mtp.tokens);
    free(e->mtp.pos);
    free(e->mtp.row_seq);
    free(e->mtp.slot);
    free(e->mtp.lrows);
    free(e->mtp.lseq);
    free(e->mtp.h);
    free(e->mtp.logits);
    dsq_kv_destroy(e->kv);
    dsq_draft_destroy(e->draft);
    dsq_model_destroy(e->model);
    if (e->be_owned)
        dsq_backend_destroy(e->be);
    dsq_pad_model_destroy(e->pad_model);
    dsq_model_file_close(e->file);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

const dsq_model_config_t *dsq_engine_config(const dsq_engine_t *e)
{
    return dsq_model_config(e->model);
}

const dsq_tokenizer_t *dsq_engine_tokenizer(const dsq_engine_t *e) { return e->tok; }
/* the model's chat template, for the server's /v1/chat/completions */
const char *dsq_engine_chat_template(const dsq_engine_t *e)
{
    return dsq_model_file_chat_template(e->file);
}
int dsq_engine_max_model_len(const dsq_engine_t *e) { return e->max_model_len; }

int dsq_engine_max_waiting(const dsq_engine_t *e)
{
    return e->o.max_waiting_requests > 0 ? e->o.max_waiting_requests : 1024;
}

int dsq_engine_max_queued(const dsq_engine_t *e)
{
    return dsq_engine_max_waiting(e) + (e->o.max_num_seqs > 0 ? e->o.max_num_seqs : 256);
}
