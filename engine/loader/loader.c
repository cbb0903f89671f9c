/* Loader front door: format detection, canonical tensor names, tokenizer and
 * chat template, load progress.
 *
 * Each format has its own reader (gguf.c, safetensors.c, llama2c.c) that
 * validates its file and hands out views into a read-only mapping; this file
 * only decides which reader to use, copies the views into one table under
 * canonical GGUF names (so the model code sees one naming), indexes that
 * table by name, and checks the few things that need both config and
 * tensors. Nothing is copied or converted here: repacking into kernel
 * layouts is the model's job.
 */
#include "loader.h"
#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "engine/io/llama2c.h"
#include "engine/common/log.h"
#include "engine/io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_JSON_BYTES (64u * 1024u * 1024u)

struct dsq_model_file {
    char *path;
    const char *format;
    dsq_model_config_t config;
    dsq_gguf_t *gguf;
    dsq_gguf_t *tok_gguf;          /* tokenizer override given as a .gguf */
    dsq_llama2c_t *l2c;
    dsq_safetensors_t **shards;
    int n_shards;
    int n_tensors;
    dsq_tensor_t *tensors;         /* views; names below or reader-owned */
    char **owned_names;            /* safetensors canonical names, or NULL */
    const dsq_tensor_t **sorted;
    dsq_tokenizer_t *tok;
    char *chat_template;
};

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

static char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (p)
        snprintf(p, n, "%s/%s", dir, name);
    return p;
}

/* Read a whole (small) file; NULL + err on failure. */
static char *read_text(const char *path, size_t *len, char *err, size_t err_len)
{
    char *buf = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) {
        dsq_error_set(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0)
        n = ftell(f);
    if (n < 0 || (unsigned long)n > MAX_JSON_BYTES || fseek(f, 0, SEEK_SET) != 0) {
        dsq_error_set(err, err_len, "%s: unreadable or larger than %u bytes", path, MAX_JSON_BYTES);
        goto undo_f;
    }
    buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        dsq_error_set(err, err_len, "%s: read failed", path);
        free(buf);
        buf = NULL;
        goto undo_f;
    }
    buf[n] = '\0';
    *len = (size_t)n;
undo_f:
    fclose(f);
    return buf;
}

/* ---- canonical names ---- */

static const struct {
    const char *hf, *gguf;
} layer_map[] = {
    {"input_layernorm", "attn_norm"},
    {"post_attention_layernorm", "ffn_norm"},
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"self_attn.q_a_proj", "attn_q_a"},
    {"self_attn.q_a_layernorm", "attn_q_a_norm"},
    {"self_attn.q_b_proj", "attn_q_b"},
    {"self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"},
    {"self_attn.kv_a_layernorm", "attn_kv_a_norm"},
    {"self_attn.kv_b_proj", "attn_kv_b"},
    {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
    {"mlp.gate", "ffn_gate_inp"},
    {"mlp.shared_experts.gate_proj", "ffn_gate_shexp"},
    {"mlp.shared_experts.up_proj", "ffn_up_shexp"},
    {"mlp.shared_experts.down_proj", "ffn_down_shexp"},
    /* DeepSeek-V3's multi-token prediction module (layer n_layer; llama.cpp
     * names these blk.N.nextn.*) */
    {"embed_tokens", "nextn.embed_tokens"},
    {"enorm", "nextn.enorm"},
    {"hnorm", "nextn.hnorm"},
    {"eh_proj", "nextn.eh_proj"},
    {"shared_head.norm", "nextn.shared_head_norm"},
    {"shared_head.head", "nextn.shared_head_head"},
};

static const char *const suffixes[] = {"weight", "bias", "qweight", "qzeros",
                                       "scales", "g_idx"};

static bool known_suffix(const char *s)
{
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++)
        if (strcmp(s, suffixes[i]) == 0)
            return true;
    return false;
}

/* Parse a decimal index at *p (no sign, no leading junk); advances *p. */
static bool parse_index(const char **p, long *out)
{
    const char *s = *p;
    long v = 0;
    if (*s < '0' || *s > '9')
        return false;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (*s - '0');
        if (v > 1000000)
            return false;
        s++;
    }
    *out = v;
    *p = s;
    return true;
}

static int put_name(char *out, size_t out_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int put_name(char *out, size_t out_len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, out_len, fmt, ap);
    va_end(ap);
    return (n < 0 || (size_t)n >= out_len) ? DSQ_ERANGE : DSQ_OK;
}

int dsq_loader_canonical_name(const char *hf, char *out, size_t out_len)
{
    static const struct {
        const char *hf, *gguf;
    } top[] = {
        {"model.embed_tokens.weight", "token_embd.weight"},
        {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"},
    };
    if (!hf || !out || out_len == 0)
        return DSQ_EINVAL;
    for (size_t i = 0; i < sizeof(top) / sizeof(top[0]); i++)
        if (strcmp(hf, top[i].hf) == 0)
            return put_name(out, out_len, "%s", top[i].gguf);
    const char *pre = "model.layers.";
    if (strncmp(hf, pre, strlen(pre)) != 0)
        return DSQ_ENOTFOUND;
    const char *p = hf + strlen(pre);
    long layer;
    if (!parse_index(&p, &layer) || *p != '.')
        return DSQ_ENOTFOUND;
    p++;
    const char *dot = strrchr(p, '.');
    if (!dot)
        return DSQ_ENOTFOUND;
    size_t mlen = (size_t)(dot - p);
    const char *suffix = dot + 1;
    /* routed experts: mlp.experts.E.{gate,up,down}_proj.<suffix> */
    const char *ex = "mlp.experts.";
    if (strncmp(p, ex, strlen(ex)) == 0) {
        const char *q = p + strlen(ex);
        long e;
        if (!parse_index(&q, &e) || *q != '.' || !known_suffix(suffix))
            return DSQ_ENOTFOUND;
        q++;
        size_t plen = (size_t)(dot - q);
        const char *which = NULL;
        if (plen == 9 && strncmp(q, "gate_proj", 9) == 0) which = "gate";
        else if (plen == 7 && strncmp(q, "up_proj", 7) == 0) which = "up";
        else if (plen == 9 && strncmp(q, "down_proj", 9) == 0) which = "down";
        if (!which)
            return DSQ_ENOTFOUND;
        return put_name(out, out_len, "blk.%ld.ffn_%s.%ld.%s", layer, which, e, suffix);
    }
    for (size_t i = 0; i < sizeof(layer_map) / sizeof(layer_map[0]); i++) {
        if (strlen(layer_map[i].hf) != mlen || strncmp(p, layer_map[i].hf, mlen) != 0)
            continue;
        if (strcmp(layer_map[i].gguf, "ffn_gate_inp") == 0
            && strcmp(suffix, "e_score_correction_bias") == 0)
            return put_name(out, out_len, "blk.%ld.exp_probs_b.bias", layer);
        if (!known_suffix(suffix))
            return DSQ_ENOTFOUND;
        return put_name(out, out_len, "blk.%ld.%s.%s", layer, layer_map[i].gguf, suffix);
    }
    return DSQ_ENOTFOUND;
}

/* ---- table, index, progress ---- */

static int cmp_tensor(const void *a, const void *b)
{
    const dsq_tensor_t *x = *(const dsq_tensor_t *const *)a;
    const dsq_tensor_t *y = *(const dsq_tensor_t *const *)b;
    return strcmp(x->name, y->name);
}

static int alloc_table(dsq_model_file_t *f, int n, bool own_names)
{
    f->tensors = calloc(n ? (size_t)n : 1, sizeof(*f->tensors));
    f->sorted = calloc(n ? (size_t)n : 1, sizeof(*f->sorted));
    if (own_names)
        f->owned_names = calloc(n ? (size_t)n : 1, sizeof(*f->owned_names));
    return (!f->tensors || !f->sorted || (own_names && !f->owned_names))
               ? DSQ_ENOMEM : DSQ_OK;
}

static int index_table(dsq_model_file_t *f, char *err, size_t err_len)
{
    for (int i = 0; i < f->n_tensors; i++)
        f->sorted[i] = &f->tensors[i];
    qsort(f->sorted, (size_t)f->n_tensors, sizeof(*f->sorted), cmp_tensor);
    for (int i = 1; i < f->n_tensors; i++) {
        if (strcmp(f->sorted[i - 1]->name, f->sorted[i]->name) == 0) {
            dsq_error_set(err, err_len, "%s: tensor '%s' appears twice", f->path, f->sorted[i]->name);
            return DSQ_EFORMAT;
        }
    }
    return DSQ_OK;
}

/* Ask the kernel to start reading every tensor, reporting progress: a
 * rewritten line on a terminal, else one log line per 10%. */
static void prefetch_with_progress(const dsq_model_file_t *f)
{
    size_t total = 0, done = 0;
    for (int i = 0; i < f->n_tensors; i++)
        total += f->tensors[i].n_bytes;
    bool tty = isatty(STDERR_FILENO) == 1;
    long page = sysconf(_SC_PAGESIZE);
    int last = -1;
    for (int i = 0; i < f->n_tensors; i++) {
        const dsq_tensor_t *t = &f->tensors[i];
        if (t->n_bytes > 0 && page > 0) {
            uintptr_t a = (uintptr_t)t->data & ~((uintptr_t)page - 1);
            size_t len = (size_t)((uintptr_t)t->data - a) + t->n_bytes;
            (void)madvise((void *)a, len, MADV_WILLNEED);
        }
        done += t->n_bytes;
        int pct = total ? (int)((double)done * 100.0 / (double)total) : 100;
        if (tty && pct != last) {
            fprintf(stderr, "\rloading %s: %d/%d tensors, %.1f/%.1f MiB (%d%%)",
                    f->path, i + 1, f->n_tensors, (double)done / 1048576.0,
                    (double)total / 1048576.0, pct);
            last = pct;
        } else if (!tty && (last < 0 || pct / 10 > last / 10)) {
            dsq_log(DSQ_LOG_INFO, "load file=%s format=%s tensors=%d/%d bytes=%zu/%zu pct=%d",
                    f->path, f->format, i + 1, f->n_tensors, done, total, pct);
            last = pct;
        }
    }
    if (tty && f->n_tensors > 0)
        fputc('\n', stderr);
}

/* ---- tokenizer and chat template ---- */

static int open_tokenizer_override(dsq_model_file_t *f, const char *tp,
                                   char *err, size_t err_len)
{
    char terr[512] = "";
    if (ends_with(tp, ".gguf")) {
        f->tok_gguf = dsq_gguf_open(tp, terr, sizeof(terr));
        if (f->tok_gguf) {
            f->tok = dsq_tokenizer_from_gguf(f->tok_gguf, terr, sizeof(terr));
            if (f->tok && !f->chat_template) {
                size_t n;
                const char *ct = dsq_gguf_get_str(f->tok_gguf, "tokenizer.chat_template", &n);
                if (ct)
                    f->chat_template = strndup(ct, n);
            }
        }
    } else if (is_dir(tp) || ends_with(tp, ".json")) {
        f->tok = dsq_tokenizer_from_hf(tp, terr, sizeof(terr));
    } else {
        f->tok = dsq_tokenizer_from_llama2c(tp, terr, sizeof(terr));
    }
    if (!f->tok) {
        dsq_error_set(err, err_len, "%s: tokenizer: %s", tp, terr);
        return DSQ_EFORMAT;
    }
    return DSQ_OK;
}

/* chat_template from tokenizer_config.json (string, or a list of
 * {name, template} where "default" wins) or chat_template.jinja. */
static void hf_chat_template(dsq_model_file_t *f, const char *dir)
{
    char e[256];
    size_t len;
    char *p = join(dir, "tokenizer_config.json");
    char *txt = p && is_file(p) ? read_text(p, &len, e, sizeof(e)) : NULL;
    cJSON *root = txt ? cJSON_ParseWithLength(txt, len) : NULL;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(root, "chat_template");
    if (cJSON_IsString(ct)) {
        f->chat_template = strdup(ct->valuestring);
    } else if (cJSON_IsArray(ct)) {
        const cJSON *it;
        const char *first = NULL, *def = NULL;
        cJSON_ArrayForEach(it, ct) {
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(it, "name");
            const cJSON *tm = cJSON_GetObjectItemCaseSensitive(it, "template");
            if (!cJSON_IsString(tm))
                continue;
            if (!first)
                first = tm->valuestring;
            if (cJSON_IsString(nm) && strcmp(nm->valuestring, "default") == 0)
                def = tm->valuestring;
        }
        if (def || first)
            f->chat_template = strdup(def ? def : first);
    }
    cJSON_Delete(root);
    free(txt);
    free(p);
    if (!f->chat_template) {
        p = join(dir, "chat_template.jinja");
        if (p && is_file(p))
            f->chat_template = read_text(p, &len, e, sizeof(e));
        free(p);
    }
}

/* ---- deepseek2 GGUF: llama.cpp's stacked tensors as per-slice views ----
 *
 * llama.cpp's converter (convert_hf_to_gguf.py, DeepseekV2Model) stacks the
 * routed experts of a layer into one 3-D tensor per projection,
 * blk.N.ffn_{gate,up,down}_exps.weight with ne = [k, n, n_expert], and
 * (since the MLA absorption change, mid 2025) splits kv_b_proj per head into
 * blk.N.attn_k_b.weight ne = [qk_nope, kv_lora_rank, n_head] (W_UK_h^T) and
 * blk.N.attn_v_b.weight ne = [kv_lora_rank, v_head_dim, n_head] (W_UV_h).
 * Every slice along ne[2] is a contiguous 2-D matrix, so the loader exposes
 * it as its own view (no copy): blk.N.ffn_gate.E.weight (the name the
 * safetensors path uses), blk.N.attn_k_b.H.weight, blk.N.attn_v_b.H.weight.
 * The stacked tensor itself is not listed. */

/* Whether name is a stacked deepseek2 tensor; if so and out is given, writes
 * the slice-name prefix ("blk.N.ffn_gate") to out. */
static bool ds2_stacked(const char *name, char *out, size_t out_len)
{
    static const struct { const char *from, *to; } map[] = {
        {"ffn_gate_exps.weight", "ffn_gate"}, {"ffn_up_exps.weight", "ffn_up"},
        {"ffn_down_exps.weight", "ffn_down"}, {"attn_k_b.weight", "attn_k_b"},
        {"attn_v_b.weight", "attn_v_b"},
    };
    if (strncmp(name, "blk.", 4) != 0)
        return false;
    const char *dot = strchr(name + 4, '.');
    if (!dot || dot == name + 4)
        return false;
    for (const char *p = name + 4; p < dot; p++)
        if (*p < '0' || *p > '9')
            return false;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++) {
        if (strcmp(dot + 1, map[i].from) != 0)
            continue;
        if (out)
            snprintf(out, out_len, "%.*s.%s", (int)(dot - name), name, map[i].to);
        return true;
    }
    return false;
}

/* Append the slices of t (if it is a stacked deepseek2 tensor) to f's table. */
static int ds2_add_split(dsq_model_file_t *f, const dsq_tensor_t *t, char *err,
                         size_t err_len)
{
    char prefix[128];
    if (!ds2_stacked(t->name, prefix, sizeof(prefix)))
        return DSQ_OK;
    int64_t ns = t->ne[2];
    if (t->n_dims != 3 || ns <= 0 || t->ne[3] != 1 || t->n_bytes % (size_t)ns != 0) {
        dsq_error_set(err, err_len, "%s: tensor '%s' must be 3-D [k, n, slices] with equal slices",
                f->path, t->name);
        return DSQ_EFORMAT;
    }
    size_t slice = t->n_bytes / (size_t)ns;
    for (int64_t e = 0; e < ns; e++) {
        char name[160];
        snprintf(name, sizeof(name), "%s.%lld.weight", prefix, (long long)e);
        char *owned = strdup(name);
        if (!owned) {
            dsq_error_set(err, err_len, "%s: out of memory", f->path);
            return DSQ_ENOMEM;
        }
        dsq_tensor_t v = *t;
        v.name = owned;
        v.n_dims = 2;
        v.ne[2] = 1;
        v.data = (const uint8_t *)t->data + (size_t)e * slice;
        v.n_bytes = slice;
        f->owned_names[f->n_tensors] = owned;
        f->tensors[f->n_tensors++] = v;
    }
    return DSQ_OK;
}

/* ---- formats ---- */

static int open_gguf(dsq_model_file_t *f, bool want_tok, char *err,
                     size_t err_len)
{
    char cerr[512] = "";
    f->format = "gguf";
    f->gguf = dsq_gguf_open(f->path, err, err_len);
    if (!f->gguf)
        return DSQ_EFORMAT;
    int rc = dsq_model_config_from_gguf(f->gguf, &f->config, cerr, sizeof(cerr));
    if (rc != DSQ_OK) {
        dsq_error_set(err, err_len, "%s", cerr);
        return rc;
    }
    int n = dsq_gguf_n_tensors(f->gguf);
    int64_t extra = 0;
    bool ds2 = f->config.arch == DSQ_ARCH_DEEPSEEK2;
    for (int i = 0; ds2 && i < n; i++) {
        const dsq_tensor_t *t = dsq_gguf_tensor(f->gguf, i);
        if (ds2_stacked(t->name, NULL, 0) && t->ne[2] > 0)
            extra += t->ne[2] - 1;
    }
    if (extra > INT32_MAX / 2 - n) {
        dsq_error_set(err, err_len, "%s: too many stacked expert/head slices", f->path);
        return DSQ_EFORMAT;
    }
    if (alloc_table(f, n + (int)extra, ds2) != DSQ_OK) {
        dsq_error_set(err, err_len, "%s: out of memory", f->path);
        return DSQ_ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        const dsq_tensor_t *t = dsq_gguf_tensor(f->gguf, i);
        rc = ds2 ? ds2_add_split(f, t, err, err_len) : DSQ_OK;
        if (rc != DSQ_OK)
            return rc;
        if (!ds2 || !ds2_stacked(t->name, NULL, 0))
            f->tensors[f->n_tensors++] = *t;
    }
    size_t tl;
    const char *ct = dsq_gguf_get_str(f->gguf, "tokenizer.chat_template", &tl);
    if (ct && !(f->chat_template = strndup(ct, tl))) {
        dsq_error_set(err, err_len, "%s: out of memory", f->path);
        return DSQ_ENOMEM;
    }
    size_t ml = 0;
    const char *tm = dsq_gguf_get_str(f->gguf, "tokenizer.ggml.model", &ml);
    /* llama.cpp's "no_vocab" (LLAMA_VOCAB_TYPE_NONE): a model without a
     * tokenizer, fed token ids, as a GGUF with no tokenizer keys at all */
    const bool no_vocab = tm && ml == 8 && memcmp(tm, "no_vocab", 8) == 0;
    if (want_tok && !no_vocab && dsq_gguf_find_key(f->gguf, "tokenizer.ggml.model") >= 0) {
        f->tok = dsq_tokenizer_from_gguf(f->gguf, cerr, sizeof(cerr));
        if (!f->tok) {
            dsq_error_set(err, err_len, "%s: tokenizer: %s", f->path, cerr);
            return DSQ_EFORMAT;
        }
    }
    return DSQ_OK;
}

/* Load tok<n_vocab>.bin or tokenizer.bin from dir into f->tok when one is
 * there (llama2.c's convention; dsq-quantize copies it into its output
 * directory). A file that does not parse is a warning, not an error. */
static void find_llama2c_tokenizer(dsq_model_file_t *f, const char *d)
{
    char name[64];
    snprintf(name, sizeof(name), "tok%lld.bin", (long long)f->config.n_vocab);
    char *cand[2] = {join(d, name), join(d, "tokenizer.bin")};
    for (int i = 0; i < 2 && !f->tok; i++) {
        if (cand[i] && is_file(cand[i])) {
            char terr[512];
            f->tok = dsq_tokenizer_from_llama2c(cand[i], terr, sizeof(terr));
            if (!f->tok)
                dsq_log(DSQ_LOG_WARN, "load file=%s tokenizer=%s error=\"%s\"", f->path,
                        cand[i], terr);
        }
    }
    free(cand[0]);
    free(cand[1]);
}

static int open_llama2c(dsq_model_file_t *f, const char *tokenizer_path,
                        char *err, size_t err_len)
{
    f->format = "llama2c";
    f->l2c = dsq_llama2c_open(f->path, err, err_len);
    if (!f->l2c)
        return DSQ_EFORMAT;
    f->config = *dsq_llama2c_config(f->l2c);
    int n = dsq_llama2c_n_tensors(f->l2c);
    if (alloc_table(f, n, false) != DSQ_OK) {
        dsq_error_set(err, err_len, "%s: out of memory", f->path);
        return DSQ_ENOMEM;
    }
    for (int i = 0; i < n; i++)
        f->tensors[i] = *dsq_llama2c_tensor(f->l2c, i);
    f->n_tensors = n;
    if (!tokenizer_path) {
        /* llama2.c convention: tok<vocab>.bin or tokenizer.bin beside it */
        char *dir = strdup(f->path);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        find_llama2c_tokenizer(f, slash ? (*slash = '\0', dir) : ".");
        free(dir);
    }
    return DSQ_OK;
}

/* Open the shard list of model.safetensors.index.json (weight_map) and
 * check that every mapped tensor is in the shard it is mapped to. */
static int open_index(dsq_model_file_t *f, const char *dir, const char *index,
                      char *err, size_t err_len)
{
    size_t len;
    int rc = DSQ_OK;
    char *txt = read_text(index, &len, err, err_len);
    if (!txt)
        return DSQ_EIO;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    const cJSON *e;
    if (!cJSON_IsObject(wm)) {
        dsq_error_set(err, err_len, "%s: weight_map missing or not an object", index);
        rc = DSQ_EFORMAT;
        goto undo_json;
    }
    int n = cJSON_GetArraySize(wm);
    f->shards = calloc(n ? (size_t)n : 1, sizeof(*f->shards));
    char **names = calloc(n ? (size_t)n : 1, sizeof(*names));
    if (!f->shards || !names) {
        free(names);
        dsq_error_set(err, err_len, "%s: out of memory", index);
        rc = DSQ_ENOMEM;
        goto undo_json;
    }
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e) || strchr(e->valuestring, '/')
            || strcmp(e->valuestring, "..") == 0 || e->valuestring[0] == '\0') {
            dsq_error_set(err, err_len, "%s: weight_map['%s']: not a plain file name", index, e->string);
            rc = DSQ_EFORMAT;
            break;
        }
        int s;
        for (s = 0; s < f->n_shards; s++)
            if (strcmp(names[s], e->valuestring) == 0)
                break;
        if (s == f->n_shards) {
            char *p = join(dir, e->valuestring);
            names[s] = e->valuestring;
            f->shards[s] = p ? dsq_safetensors_open(p, err, err_len) : NULL;
            free(p);
            if (!f->shards[s]) {
                rc = DSQ_EFORMAT;
                break;
            }
            f->n_shards++;
        }
        if (!dsq_safetensors_find(f->shards[s], e->string)) {
            dsq_error_set(err, err_len, "%s: tensor '%s' mapped to %s but not found there",
                    index, e->string, e->valuestring);
            rc = DSQ_EFORMAT;
            break;
        }
    }
    free(names);
undo_json:
    cJSON_Delete(root);
    free(txt);
    return rc;
}

static int open_hf(dsq_model_file_t *f, const char *dir, const char *single,
                   const char *tokenizer_path, char *err, size_t err_len)
{
    size_t len;
    char cerr[512] = "";
    int rc = DSQ_OK;
    f->format = "safetensors";
    char *cfg_path = join(dir, "config.json");
    char *idx = join(dir, "model.safetensors.index.json");
    char *one = single ? strdup(single) : join(dir, "model.safetensors");
    char *txt = NULL;
    if (!cfg_path || !idx || !one) {
        dsq_error_set(err, err_len, "%s: out of memory", dir);
        rc = DSQ_ENOMEM;
        goto undo;
    }
    txt = read_text(cfg_path, &len, err, err_len);
    if (!txt) {
        rc = DSQ_ENOTFOUND;
        goto undo;
    }
    rc = dsq_model_config_from_hf_json(txt, len, &f->config, cerr, sizeof(cerr));
    if (rc != DSQ_OK) {
        dsq_error_set(err, err_len, "%s: %s", cfg_path, cerr);
        goto undo;
    }
    if (!single && is_file(idx)) {
        rc = open_index(f, dir, idx, err, err_len);
    } else if (is_file(one)) {
        f->shards = calloc(1, sizeof(*f->shards));
        if (f->shards && (f->shards[0] = dsq_safetensors_open(one, err, err_len)))
            f->n_shards = 1;
        rc = f->n_shards ? DSQ_OK : DSQ_EFORMAT;
    } else {
        dsq_error_set(err, err_len, "%s: no model.safetensors or model.safetensors.index.json", dir);
        rc = DSQ_ENOTFOUND;
    }
    if (rc != DSQ_OK)
        goto undo;
    int total = 0;
    for (int s = 0; s < f->n_shards; s++)
        total += dsq_safetensors_n_tensors(f->shards[s]);
    if (alloc_table(f, total, true) != DSQ_OK) {
        dsq_error_set(err, err_len, "%s: out of memory", dir);
        rc = DSQ_ENOMEM;
        goto undo;
    }
    int n_skipped = 0;
    for (int s = 0; s < f->n_shards; s++) {
        for (int i = 0; i < dsq_safetensors_n_tensors(f->shards[s]); i++) {
            const dsq_tensor_t *t = dsq_safetensors_tensor(f->shards[s], i);
            char name[256];
            int nr = dsq_loader_canonical_name(t->name, name, sizeof(name));
            if (nr != DSQ_OK) {
                n_skipped++;
                dsq_log(DSQ_LOG_DEBUG, "load file=%s skip_tensor=%s", dsq_safetensors_path(f->shards[s]), t->name);
                continue;
            }
            char *owned = strdup(name);
            if (!owned) {
                dsq_error_set(err, err_len, "%s: out of memory", dir);
                rc = DSQ_ENOMEM;
                goto undo;
            }
            f->owned_names[f->n_tensors] = owned;
            f->tensors[f->n_tensors] = *t;
            f->tensors[f->n_tensors].name = owned;
            f->n_tensors++;
        }
    }
    if (n_skipped)
        dsq_log(DSQ_LOG_WARN, "load dir=%s skipped_tensors=%d (names outside the canonical map)", dir, n_skipped);
    if (tokenizer_path == NULL) {
        char *tj = join(dir, "tokenizer.json");
        if (tj && is_file(tj)) {
            f->tok = dsq_tokenizer_from_hf(dir, cerr, sizeof(cerr));
            if (!f->tok) {
                dsq_error_set(err, err_len, "%s: tokenizer: %s", tj, cerr);
                rc = DSQ_EFORMAT;
            }
        } else {
            /* users: a directory dsq-quantize made from a llama2.c model
             * holds its tok<n>.bin */
            find_llama2c_tokenizer(f, dir);
        }
        free(tj);
    }
    hf_chat_template(f, dir);
undo:
    free(txt);
    free(cfg_path);
    free(idx);
    free(one);
    return rc;
}

/* Checks that need both config and tensors. */
static int check_tensors(dsq_model_file_t *f, char *err, size_t err_len)
{
    const dsq_model_config_t *c = &f->config;
    const dsq_tensor_t *te = dsq_model_file_find(f, "token_embd.weight");
    if (f->n_tensors == 0)
        return DSQ_OK;  /* vocab-only GGUF: nothing to check */
    if (!te) {
        dsq_error_set(err, err_len, "%s: tensor 'token_embd.weight' missing", f->path);
        return DSQ_EFORMAT;
    }
    if (te->ne[0] != c->n_embd || te->ne[1] != c->n_vocab) {
        dsq_error_set(err, err_len, "%s: tensor 'token_embd.weight' is [%lld, %lld], config says [n_embd=%lld, n_vocab=%lld]",
                f->path, (long long)te->ne[0], (long long)te->ne[1], (long long)c->n_embd,
                (long long)c->n_vocab);
        return DSQ_EFORMAT;
    }
    if (!c->tie_word_embeddings && !dsq_model_file_find(f, "output.weight")) {
        dsq_error_set(err, err_len, "%s: tensor 'output.weight' missing (tie_word_embeddings is false)", f->path);
        return DSQ_EFORMAT;
    }
    return DSQ_OK;
}

dsq_model_file_t *dsq_model_file_open(const char *path,
                                      const char *tokenizer_path, char *err,
                                      size_t err_len)
{
    int rc;
    if (!path) {
        dsq_error_set(err, err_len, "(null): no model path");
        return NULL;
    }
    dsq_model_file_t *f = calloc(1, sizeof(*f));
    if (!f || !(f->path = strdup(path))) {
        dsq_error_set(err, err_len, "%s: out of memory", path);
        free(f);
        return NULL;
    }
    if (is_dir(path)) {
        rc = open_hf(f, path, NULL, tokenizer_path, err, err_len);
    } else if (ends_with(path, ".safetensors")) {
        char *dir = strdup(path);
        char *slash = dir ? strrchr(dir, '/') : NULL;
        const char *d = slash ? (*slash = '\0', dir) : ".";
        rc = dir ? open_hf(f, d, path, tokenizer_path, err, err_len) : DSQ_ENOMEM;
        free(dir);
    } else {
        char magic[4] = {0};
        FILE *fp = fopen(path, "rb");
        if (!fp) {
            dsq_error_set(err, err_len, "%s: cannot open: %s", path, strerror(errno));
            rc = DSQ_EIO;
            goto undo_f;
        }
        size_t got = fread(magic, 1, 4, fp);
        fclose(fp);
        if (got == 4 && memcmp(magic, "GGUF", 4) == 0)
            rc = open_gguf(f, tokenizer_path == NULL, err, err_len);
        else if (ends_with(path, ".gguf"))
            rc = open_gguf(f, tokenizer_path == NULL, err, err_len);  /* gives the bad-magic error */
        else if (ends_with(path, ".bin"))
            rc = open_llama2c(f, tokenizer_path, err, err_len);
        else {
            dsq_error_set(err, err_len, "%s: unknown model format (expected .gguf, .bin (llama2.c), "
                    ".safetensors or a Hugging Face directory)", path);
            rc = DSQ_EUNSUPPORTED;
        }
    }
    if (rc == DSQ_OK)
        rc = index_table(f, err, err_len);
    if (rc == DSQ_OK)
        rc = check_tensors(f, err, err_len);
    if (rc == DSQ_OK && tokenizer_path) {
        dsq_tokenizer_destroy(f->tok);
        f->tok = NULL;
        rc = open_tokenizer_override(f, tokenizer_path, err, err_len);
    }
    if (rc != DSQ_OK)
        goto undo_f;
    prefetch_with_progress(f);
    return f;
undo_f:
    dsq_model_file_close(f);
    return NULL;
}

void dsq_model_file_close(dsq_model_file_t *f)
{
    if (!f)
        return;
    dsq_tokenizer_destroy(f->tok);
    if (f->owned_names)
        for (int i = 0; i < f->n_tensors; i++)
            free(f->owned_names[i]);
    free(f->owned_names);
    free(f->tensors);
    free(f->sorted);
    for (int s = 0; s < f->n_shards; s++)
        dsq_safetensors_close(f->shards[s]);
    free(f->shards);
    dsq_gguf_close(f->gguf);
    dsq_gguf_close(f->tok_gguf);
    dsq_llama2c_close(f->l2c);
    free(f->chat_template);
    free(f->path);
    free(f);
}

const char *dsq_model_file_format(const dsq_model_file_t *f) { return f->format; }
const char *dsq_model_file_path(const dsq_model_file_t *f) { return f->path; }

const dsq_model_config_t *dsq_model_file_config(const dsq_model_file_t *f)
{
    return &f->config;
}

int dsq_model_file_n_tensors(const dsq_model_file_t *f) { return f->n_tensors; }

const dsq_tensor_t *dsq_model_file_tensor(const dsq_model_file_t *f, int i)
{
    return (i >= 0 && i < f->n_tensors) ? &f->tensors[i] : NULL;
}

const dsq_tensor_t *dsq_model_file_find(const dsq_model_file_t *f,
                                        const char *name)
{
    if (!f || !name || f->n_tensors == 0)
        return NULL;
    dsq_tensor_t probe = {.name = name};
    const dsq_tensor_t *pp = &probe;
    const dsq_tensor_t **hit = bsearch(&pp, f->sorted, (size_t)f->n_tensors,
                                       sizeof(*f->sorted), cmp_tensor);
    return hit ? *hit : NULL;
}

const dsq_tokenizer_t *dsq_model_file_tokenizer(const dsq_model_file_t *f)
{
    return f->tok;
}

const char *dsq_model_file_chat_template(const dsq_model_file_t *f)
{
    return f->chat_template;
}

const struct dsq_gguf *dsq_model_file_gguf(const dsq_model_file_t *f)
{
    return f->gguf;
}
