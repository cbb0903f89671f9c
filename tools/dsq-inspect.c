/* dsq-inspect: print what a model file holds, through the same loader the
 * daemon uses (so "inspect says OK" means "dsqd can open it").
 *
 * Usage: dsq-inspect PATH [--tokenizer P] [--tensors] [--json]
 * Exit 0 on success, 1 when the model cannot be opened (one line on stderr),
 * 2 on bad usage. Output is a human summary or, with --json, one JSON object
 * built with cJSON.
 */
#include "dsq_config.h"
#include "engine/loader/loader.h"
#include "engine/common/log.h"
#include "engine/io/model_config.h"
#include "engine/io/tensor.h"
#include "engine/model/quant.h"
#include "engine/text/tokenizer.h"

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dsq-inspect PATH [--tokenizer P] [--tensors] [--json]\n"
            "       dsq-inspect --help | --version\n"
            "\n"
            "PATH is a .gguf file, a Hugging Face directory (config.json +\n"
            "safetensors), a .safetensors file or a llama2.c .bin checkpoint.\n"
            "  --tokenizer P  tokenizer file or directory (llama2.c tok*.bin,\n"
            "                 tokenizer.json or its directory, a .gguf)\n"
            "  --tensors      list every tensor: name, shape, dtype, bytes\n"
            "  --json         print one JSON object instead of text\n"
            "Exit status: 0 ok, 1 the model could not be opened, 2 bad usage.\n");
}

static const char *rope_scaling_name(dsq_rope_scaling_t s)
{
    switch (s) {
    case DSQ_ROPE_SCALING_LINEAR: return "linear";
    case DSQ_ROPE_SCALING_DYNAMIC: return "dynamic";
    case DSQ_ROPE_SCALING_YARN: return "yarn";
    case DSQ_ROPE_SCALING_LLAMA3: return "llama3";
    default: return "none";
    }
}

static const char *ckpt_quant_name(dsq_ckpt_quant_t q)
{
    switch (q) {
    case DSQ_CKPT_QUANT_AWQ: return "awq";
    case DSQ_CKPT_QUANT_GPTQ: return "gptq";
    default: return "none";
    }
}

static int64_t n_elems(const dsq_tensor_t *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++)
        n *= t->ne[d];
    return n;
}

/* Token text with control bytes escaped, into buf. */
static const char *token_text(const dsq_tokenizer_t *tok, int32_t id,
                              char *buf, size_t cap)
{
    size_t len = 0, o = 0;
    const char *s = id >= 0 ? dsq_tokenizer_token_str(tok, id, &len) : NULL;
    if (!s)
        return "";
    for (size_t i = 0; i < len && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == '"' || c == '\\')
            o += (size_t)snprintf(buf + o, cap - o, c == '"' ? "\\\"" : c == '\\' ? "\\\\"
                                  : c == '\n' ? "\\n" : "\\x%02x", c);
        else
            buf[o++] = (char)c;
    }
    buf[o] = '\0';
    return buf;
}

typedef struct summary {
    int64_t n_params;
    size_t n_bytes;
    int hist[DSQ_TYPE_COUNT_];
    int64_t params[DSQ_TYPE_COUNT_];   /* elements per type */
    size_t bytes[DSQ_TYPE_COUNT_];     /* file bytes per type */
    const char *unread;                /* first tensor of a type dsq does not read */
} summary_t;

/* What dsq makes of a block type at load (engine/model/quant.h). */
static const char *type_use(dsq_type_t t)
{
    if (dsq_type_block_elems(t) <= 1)
        return "";
    if (!dsq_quant_gguf_readable(t))
        return "NOT READ by dsq";
    switch (t) {
    case DSQ_TYPE_Q8_0: return "read as is";
    case DSQ_TYPE_Q5_0: case DSQ_TYPE_Q5_1: case DSQ_TYPE_Q5_K: case DSQ_TYPE_Q6_K:
        return "repacked exactly to INT8G";
    default: return "repacked exactly to INT4";
    }
}

static void summarize(const dsq_model_file_t *f, summary_t *s)
{
    memset(s, 0, sizeof(*s));
    for (int i = 0; i < dsq_model_file_n_tensors(f); i++) {
        const dsq_tensor_t *t = dsq_model_file_tensor(f, i);
        s->n_params += n_elems(t);
        s->n_bytes += t->n_bytes;
        if ((int)t->type >= 0 && (int)t->type < DSQ_TYPE_COUNT_) {
            s->hist[t->type]++;
            s->params[t->type] += n_elems(t);
            s->bytes[t->type] += t->n_bytes;
        }
        if (!s->unread && dsq_type_block_elems(t->type) > 1 &&
            !dsq_quant_gguf_readable(t->type))
            s->unread = t->name;
    }
}

static void print_text(const dsq_model_file_t *f, bool tensors)
{
    const dsq_model_config_t *c = dsq_model_file_config(f);
    const dsq_tokenizer_t *tok = dsq_model_file_tokenizer(f);
    const char *ct = dsq_model_file_chat_template(f);
    summary_t s;
    char b1[256], b2[256];
    summarize(f, &s);
    printf("file:             %s\n", dsq_model_file_path(f));
    printf("format:           %s\n", dsq_model_file_format(f));
    printf("architecture:     %s%s%s%s\n", dsq_arch_name(c->arch), c->name[0] ? " (" : "",
           c->name, c->name[0] ? ")" : "");
    printf("parameters:       %lld (%.2f M)\n", (long long)s.n_params, (double)s.n_params / 1e6);
    printf("tensors:          %d, %.2f MiB:", dsq_model_file_n_tensors(f), (double)s.n_bytes / 1048576.0);
    for (int t = 0; t < DSQ_TYPE_COUNT_; t++)
        if (s.hist[t])
            printf(" %s=%d", dsq_type_name((dsq_type_t)t), s.hist[t]);
    printf("\n");
    for (int t = 0; t < DSQ_TYPE_COUNT_; t++)
        if (s.hist[t])
            printf("  %-8s %5d tensors %12lld params (%5.1f %%) %10.2f MiB  %s\n",
                   dsq_type_name((dsq_type_t)t), s.hist[t], (long long)s.params[t],
                   s.n_params ? 100.0 * (double)s.params[t] / (double)s.n_params : 0.0,
                   (double)s.bytes[t] / 1048576.0, type_use((dsq_type_t)t));
    if (s.unread)
        printf("readable:         no: tensor %s has a type dsq does not read\n", s.unread);
    printf("shape:            layers=%lld embd=%lld ff=%lld heads=%lld kv_heads=%lld head_dim=%lld vocab=%lld\n",
           (long long)c->n_layer, (long long)c->n_embd, (long long)c->n_ff, (long long)c->n_head,
           (long long)c->n_head_kv, (long long)c->head_dim, (long long)c->n_vocab);
    if (c->arch == DSQ_ARCH_DEEPSEEK2)
        printf("mla/moe:          q_lora=%lld kv_lora=%lld qk_nope=%lld qk_rope=%lld v=%lld experts=%lld+%lld shared, top-%lld, dense_layers=%lld\n",
               (long long)c->q_lora_rank, (long long)c->kv_lora_rank, (long long)c->qk_nope_head_dim,
               (long long)c->qk_rope_head_dim, (long long)c->v_head_dim, (long long)c->n_routed_experts,
               (long long)c->n_shared_experts, (long long)c->n_experts_per_tok,
               (long long)c->first_k_dense_replace);
    printf("context length:   %lld\n", (long long)c->n_ctx_train);
    printf("rope:             theta=%g dim=%lld pairing=%s scaling=%s", c->rope_theta,
           (long long)c->rope_dim, c->rope_neox ? "neox" : "adjacent", rope_scaling_name(c->rope_scaling));
    if (c->rope_scaling != DSQ_ROPE_SCALING_NONE)
        printf(" factor=%g orig_ctx=%lld", c->rope_factor, (long long)c->rope_orig_ctx);
    printf("\n");
    printf("rms_eps:          %g\n", c->rms_eps);
    printf("tied embeddings:  %s\n", c->tie_word_embeddings ? "yes" : "no");
    printf("checkpoint quant: %s", ckpt_quant_name(c->ckpt_quant));
    if (c->ckpt_quant != DSQ_CKPT_QUANT_NONE)
        printf(" bits=%d group_size=%d zero_point=%s desc_act=%s", c->ckpt_bits, c->ckpt_group_size,
               c->ckpt_zero_point ? "yes" : "no", c->ckpt_desc_act ? "yes" : "no");
    printf("\n");
    if (tok) {
        printf("tokenizer:        %s, vocab %d\n",
               dsq_tokenizer_kind(tok) == DSQ_TOKENIZER_BPE ? "bpe" : "spm", dsq_tokenizer_n_vocab(tok));
        printf("bos:              %d \"%s\"\n", dsq_tokenizer_bos(tok),
               token_text(tok, dsq_tokenizer_bos(tok), b1, sizeof(b1)));
        printf("eos:              %d \"%s\"\n", dsq_tokenizer_eos(tok),
               token_text(tok, dsq_tokenizer_eos(tok), b2, sizeof(b2)));
    } else {
        printf("tokenizer:        none\n");
    }
    printf("chat template:    %s", ct ? "yes" : "no");
    if (ct)
        printf(" (%zu bytes)", strlen(ct));
    printf("\n");
    if (tensors) {
        printf("\n%-48s %-28s %-6s %s\n", "name", "shape (ne0, ne1, ...)", "dtype", "bytes");
        for (int i = 0; i < dsq_model_file_n_tensors(f); i++) {
            const dsq_tensor_t *t = dsq_model_file_tensor(f, i);
            char shape[96];
            size_t o = 0;
            for (int d = 0; d < t->n_dims; d++)
                o += (size_t)snprintf(shape + o, sizeof(shape) - o, "%s%lld", d ? ", " : "[",
                                      (long long)t->ne[d]);
            snprintf(shape + o, sizeof(shape) - o, "]");
            printf("%-48s %-28s %-6s %zu\n", t->name, shape, dsq_type_name(t->type), t->n_bytes);
        }
    }
}

static cJSON *token_json(const dsq_tokenizer_t *tok, int32_t id)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", id);
    size_t len = 0;
    const char *s = id >= 0 ? dsq_tokenizer_token_str(tok, id, &len) : NULL;
    char *z = s ? strndup(s, len) : NULL;
    if (z)
        cJSON_AddStringToObject(o, "text", z);
    else
        cJSON_AddNullToObject(o, "text");
    free(z);
    return o;
}

static int print_json(const dsq_model_file_t *f, bool tensors)
{
    const dsq_model_config_t *c = dsq_model_file_config(f);
    const dsq_tokenizer_t *tok = dsq_model_file_tokenizer(f);
    const char *ct = dsq_model_file_chat_template(f);
    summary_t s;
    summarize(f, &s);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "path", dsq_model_file_path(f));
    cJSON_AddStringToObject(root, "format", dsq_model_file_format(f));
    cJSON_AddStringToObject(root, "architecture", dsq_arch_name(c->arch));
    cJSON_AddStringToObject(root, "name", c->name);
    cJSON_AddNumberToObject(root, "n_params", (double)s.n_params);
    cJSON_AddNumberToObject(root, "n_tensors", dsq_model_file_n_tensors(f));
    cJSON_AddNumberToObject(root, "tensor_bytes", (double)s.n_bytes);
    cJSON *hist = cJSON_AddObjectToObject(root, "dtypes");
    for (int t = 0; t < DSQ_TYPE_COUNT_; t++)
        if (s.hist[t])
            cJSON_AddNumberToObject(hist, dsq_type_name((dsq_type_t)t), s.hist[t]);
    cJSON *by = cJSON_AddObjectToObject(root, "dtype_stats");
    for (int t = 0; t < DSQ_TYPE_COUNT_; t++) {
        if (!s.hist[t])
            continue;
        cJSON *o = cJSON_AddObjectToObject(by, dsq_type_name((dsq_type_t)t));
        cJSON_AddNumberToObject(o, "tensors", s.hist[t]);
        cJSON_AddNumberToObject(o, "params", (double)s.params[t]);
        cJSON_AddNumberToObject(o, "bytes", (double)s.bytes[t]);
        cJSON_AddBoolToObject(o, "read", dsq_type_block_elems((dsq_type_t)t) <= 1 ||
                                         dsq_quant_gguf_readable((dsq_type_t)t));
    }
    if (s.unread)
        cJSON_AddStringToObject(root, "unreadable_tensor", s.unread);
    cJSON *cfg = cJSON_AddObjectToObject(root, "config");
    cJSON_AddNumberToObject(cfg, "n_layer", (double)c->n_layer);
    cJSON_AddNumberToObject(cfg, "n_embd", (double)c->n_embd);
    cJSON_AddNumberToObject(cfg, "n_ff", (double)c->n_ff);
    cJSON_AddNumberToObject(cfg, "n_head", (double)c->n_head);
    cJSON_AddNumberToObject(cfg, "n_head_kv", (double)c->n_head_kv);
    cJSON_AddNumberToObject(cfg, "head_dim", (double)c->head_dim);
    cJSON_AddNumberToObject(cfg, "n_vocab", (double)c->n_vocab);
    cJSON_AddNumberToObject(cfg, "context_length", (double)c->n_ctx_train);
    cJSON_AddNumberToObject(cfg, "rms_eps", c->rms_eps);
    cJSON_AddBoolToObject(cfg, "tie_word_embeddings", c->tie_word_embeddings);
    cJSON_AddBoolToObject(cfg, "attn_qkv_bias", c->attn_qkv_bias);
    if (c->arch == DSQ_ARCH_DEEPSEEK2) {
        cJSON_AddNumberToObject(cfg, "q_lora_rank", (double)c->q_lora_rank);
        cJSON_AddNumberToObject(cfg, "kv_lora_rank", (double)c->kv_lora_rank);
        cJSON_AddNumberToObject(cfg, "qk_nope_head_dim", (double)c->qk_nope_head_dim);
        cJSON_AddNumberToObject(cfg, "qk_rope_head_dim", (double)c->qk_rope_head_dim);
        cJSON_AddNumberToObject(cfg, "v_head_dim", (double)c->v_head_dim);
        cJSON_AddNumberToObject(cfg, "n_routed_experts", (double)c->n_routed_experts);
        cJSON_AddNumberToObject(cfg, "n_shared_experts", (double)c->n_shared_experts);
        cJSON_AddNumberToObject(cfg, "n_experts_per_tok", (double)c->n_experts_per_tok);
        cJSON_AddNumberToObject(cfg, "first_k_dense_replace", (double)c->first_k_dense_replace);
    }
    cJSON *rope = cJSON_AddObjectToObject(root, "rope");
    cJSON_AddNumberToObject(rope, "theta", c->rope_theta);
    cJSON_AddNumberToObject(rope, "dim", (double)c->rope_dim);
    cJSON_AddStringToObject(rope, "pairing", c->rope_neox ? "neox" : "adjacent");
    cJSON_AddStringToObject(rope, "scaling", rope_scaling_name(c->rope_scaling));
    cJSON_AddNumberToObject(rope, "factor", c->rope_factor);
    cJSON_AddNumberToObject(rope, "original_context_length", (double)c->rope_orig_ctx);
    cJSON *q = cJSON_AddObjectToObject(root, "checkpoint_quant");
    cJSON_AddStringToObject(q, "method", ckpt_quant_name(c->ckpt_quant));
    if (c->ckpt_quant != DSQ_CKPT_QUANT_NONE) {
        cJSON_AddNumberToObject(q, "bits", c->ckpt_bits);
        cJSON_AddNumberToObject(q, "group_size", c->ckpt_group_size);
        cJSON_AddBoolToObject(q, "zero_point", c->ckpt_zero_point);
        cJSON_AddBoolToObject(q, "desc_act", c->ckpt_desc_act);
    }
    if (tok) {
        cJSON *tj = cJSON_AddObjectToObject(root, "tokenizer");
        cJSON_AddStringToObject(tj, "kind", dsq_tokenizer_kind(tok) == DSQ_TOKENIZER_BPE ? "bpe" : "spm");
        cJSON_AddNumberToObject(tj, "n_vocab", dsq_tokenizer_n_vocab(tok));
        cJSON_AddItemToObject(tj, "bos", token_json(tok, dsq_tokenizer_bos(tok)));
        cJSON_AddItemToObject(tj, "eos", token_json(tok, dsq_tokenizer_eos(tok)));
    } else {
        cJSON_AddNullToObject(root, "tokenizer");
    }
    cJSON_AddBoolToObject(root, "chat_template", ct != NULL);
    if (tensors) {
        cJSON *arr = cJSON_AddArrayToObject(root, "tensors");
        for (int i = 0; i < dsq_model_file_n_tensors(f); i++) {
            const dsq_tensor_t *t = dsq_model_file_tensor(f, i);
            cJSON *o = cJSON_CreateObject();
            cJSON_AddStringToObject(o, "name", t->name);
            cJSON *shape = cJSON_AddArrayToObject(o, "ne");
            for (int d = 0; d < t->n_dims; d++)
                cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->ne[d]));
            cJSON_AddStringToObject(o, "dtype", dsq_type_name(t->type));
            cJSON_AddNumberToObject(o, "bytes", (double)t->n_bytes);
            cJSON_AddItemToArray(arr, o);
        }
    }
    char *txt = cJSON_Print(root);
    int rc = txt ? 0 : 1;
    if (txt)
        printf("%s\n", txt);
    free(txt);
    cJSON_Delete(root);
    return rc;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *tok_path = NULL;
    bool tensors = false, json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--version") == 0) {
            printf("dsq-inspect %s\n", DSQ_VERSION);
            return 0;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--tensors") == 0) {
            tensors = true;
        } else if (strcmp(a, "--json") == 0) {
            json = true;
        } else if (strcmp(a, "--tokenizer") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dsq-inspect: --tokenizer needs a path\n");
                return 2;
            }
            tok_path = argv[++i];
        } else if (strncmp(a, "--tokenizer=", 12) == 0) {
            tok_path = a + 12;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "dsq-inspect: unknown option '%s' (see --help)\n", a);
            return 2;
        } else if (path) {
            fprintf(stderr, "dsq-inspect: more than one PATH (see --help)\n");
            return 2;
        } else {
            path = a;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    if (!getenv("DSQ_LOG_LEVEL"))
        dsq_log_threshold = DSQ_LOG_ERROR;  /* keep stderr to the one error line */
    char err[1024] = "";
    dsq_model_file_t *f = dsq_model_file_open(path, tok_path, err, sizeof(err));
    if (!f) {
        fprintf(stderr, "dsq-inspect: %s\n", err);
        return 1;
    }
    int rc = 0;
    if (json)
        rc = print_json(f, tensors);
    else
        print_text(f, tensors);
    dsq_model_file_close(f);
    return rc;
}
