/* dsq-perplexity: the quality meter for quantised models.
 *
 * Perplexity over a text with a sliding window (the transformers "perplexity
 * of fixed-length models" recipe): windows of ctx tokens advance by stride;
 * each window is a fresh sequence and scores only the tokens not scored by
 * the previous window (the first window scores all but its first token), so
 * every token after the first is scored once with at least ctx - stride
 * tokens of context (except early ones). PPL = exp(mean NLL).
 * With --ref-model R the same windows run through R and the mean
 * KL(P_ref || P_model) over the scored tokens is reported (nats).
 * Both models must share the tokenizer (the text is tokenized with M's).
 *
 * --llama-cpp-protocol scores like llama.cpp's llama-perplexity (tools/
 * perplexity/perplexity.cpp, perplexity()): the text is tokenized with BOS
 * only if the vocab asks for it (add_bos_token), cut into n = tokens / ctx
 * non-overlapping chunks of ctx tokens (the tail is dropped); each chunk is
 * a fresh sequence whose first token is replaced by BOS when the vocab adds
 * one, and only its second half is scored: tokens ctx/2 + 1 .. ctx - 1,
 * from the logits of rows ctx/2 .. ctx - 2. --stride is ignored. So dsq and
 * llama.cpp numbers on the same model and text are directly comparable.
 *
 * Also printed: the mean predictive entropy H = -sum_v p_v log p_v of the
 * scored positions. Mean NLL is the cross-entropy of the model against the
 * text; NLL - H > 0 means the model is more confident than it is right on
 * this text (miscalibrated), in which case perturbations that flatten its
 * distributions, quantization noise included, can lower the perplexity.
 * --temperature T scores softmax(logits / T) to measure that directly. */
#include "dsq_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "kernels.h"
#include "engine/kv/kv_cache.h"
#include "engine/loader/loader.h"
#include "engine/common/log.h"
#include "engine/model/model.h"
#include "engine/text/tokenizer.h"

typedef struct runner {
    dsq_model_file_t *f;
    dsq_model_t *m;
    dsq_kv_cache_t *kv;
    int64_t n_vocab;
} runner_t;

static int runner_open(runner_t *r, const char *path, const char *tok, int ctx, char *err,
                       size_t err_len)
{
    memset(r, 0, sizeof(*r));
    r->f = dsq_model_file_open(path, tok, err, err_len);
    if (!r->f)
        return DSQ_ENOTFOUND;
    dsq_model_opts_t mo = {0};
    r->m = dsq_model_create(r->f, &mo, err, err_len);
    if (!r->m)
        return DSQ_EFORMAT;
    const dsq_model_config_t *c = dsq_model_config(r->m);
    r->n_vocab = c->n_vocab;
    r->kv = dsq_kv_create((int)c->n_layer, (int)c->n_head_kv, (int)c->head_dim, 16,
                          (ctx + 15) / 16 + 1, DSQ_KV_F16, err, err_len);
    return r->kv ? DSQ_OK : DSQ_ENOMEM;
}

static void runner_close(runner_t *r)
{
    dsq_kv_destroy(r->kv);
    dsq_model_destroy(r->m);
    dsq_model_file_close(r->f);
}

/* logits of rows [first, n) of the window tok[0..n) into out [(n-first)][vocab] */
static int run_window(runner_t *r, const int32_t *tok, int n, int first, float *out)
{
    dsq_block_table_t bt;
    dsq_block_table_init(&bt);
    int rc = dsq_kv_seq_reserve(r->kv, &bt, n);
    int32_t *pos = malloc((size_t)n * sizeof(*pos));
    int32_t *rs = calloc((size_t)n, sizeof(*rs));
    int32_t *slot = malloc((size_t)n * sizeof(*slot));
    int32_t *rows = malloc((size_t)n * sizeof(*rows));
    if (!rc && (!pos || !rs || !slot || !rows))
        rc = DSQ_ENOMEM;
    if (!rc) {
        for (int i = 0; i < n; i++) {
            pos[i] = i;
            slot[i] = dsq_kv_slot(r->kv, &bt, i);
            rows[i] = i;
        }
        dsq_batch_t b = {.n_tokens = n, .tokens = tok, .pos = pos, .row_seq = rs,
                         .slot = slot, .n_seqs = 1, .block_tables = bt.ids,
                         .max_blocks = bt.n, .n_logits = n - first,
                         .logit_rows = rows + first};
        rc = dsq_model_forward(r->m, r->kv, &b, out);
    }
    free(pos);
    free(rs);
    free(slot);
    free(rows);
    dsq_kv_seq_free(r->kv, &bt);
    dsq_block_table_deinit(&bt);
    return rc;
}

/* log-softmax in place */
static void log_softmax(float *x, int64_t n)
{
    float mx = x[0];
    for (int64_t i = 1; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += exp((double)x[i] - mx);
    float lse = mx + (float)log(s);
    for (int64_t i = 0; i < n; i++)
        x[i] -= lse;
}

/* Running sums over the scored tokens. */
typedef struct {
    double nll;     /* sum of -log p(target), nats */
    double kl;      /* sum of KL(P_ref || P_model), nats (with a ref model) */
    double ent;     /* sum of the model's predictive entropy, nats */
    long n;         /* scored tokens */
    double inv_t;   /* 1 / --temperature: logits are divided by T first */
    FILE *dump;     /* --dump-nll, or NULL */
} score_t;

/* Score one position: p = the model's logits row (n_vocab floats,
 * overwritten with log-probabilities at temperature T), q = the reference
 * model's logits row for the same position or NULL (overwritten with its
 * log-probabilities, never tempered), target = the next token's id. */
static void score_row(score_t *s, float *p, float *q, int64_t n_vocab, int32_t target)
{
    if (s->inv_t != 1.0)
        for (int64_t v = 0; v < n_vocab; v++)
            p[v] = (float)(p[v] * s->inv_t);
    log_softmax(p, n_vocab);
    s->nll -= p[target];
    if (s->dump)
        fprintf(s->dump, "%.6f\n", -(double)p[target]);
    double h = 0;
    for (int64_t v = 0; v < n_vocab; v++)
        h -= exp((double)p[v]) * p[v];
    s->ent += h;
    if (q) {
        log_softmax(q, n_vocab);
        double k = 0;
        for (int64_t v = 0; v < n_vocab; v++)
            k += exp((double)q[v]) * ((double)q[v] - p[v]);
        s->kl += k;
    }
    s->n++;
}

/* Parse an integer option value in [lo, hi]; on failure a one-line message
 * naming the option goes to stderr and -1 is returned. */
static int parse_long(const char *opt, const char *v, long lo, long hi, long *out)
{
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "dsq-perplexity: %s wants an integer in [%ld, %ld], not '%s'\n", opt,
                lo, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
"usage: dsq-perplexity --model M --text FILE [--tokenizer PATH] [--ctx 512]\n"
"         [--stride ctx/2] [--max-tokens N] [--ref-model R] [--ref-tokenizer PATH]\n"
"         [--llama-cpp-protocol] [--dump-nll FILE] [--temperature T]\n"
"         [--help] [--version]\n"
"--dump-nll: one line per scored token, its NLL in nats (paired comparisons).\n"
"--llama-cpp-protocol: non-overlapping ctx chunks, second half scored, as\n"
"llama.cpp's llama-perplexity.\n"
"--temperature T: score softmax(logits / T) (default 1; a calibration check:\n"
"a model overconfident on the text scores better at some T > 1). Applies to\n"
"M only: kl compares R at T = 1 with M at T.\n"
"Prints ppl (sliding window, each token scored once), the mean NLL and the\n"
"mean predictive entropy (nats; nll - entropy > 0: overconfident on this\n"
"text) and, with --ref-model, the mean KL(P_ref || P_model) in nats over the\n"
"scored tokens.\n");
}

int main(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *tok = NULL, *ref = NULL, *ref_tok = NULL;
    int ctx = 512, stride = 0;      /* stride 0: not given, ctx / 2 */
    long max_tokens = 0, lv = 0;
    bool llama_protocol = false;
    const char *dump = NULL;
    FILE *df = NULL;
    double temperature = 1.0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--llama-cpp-protocol") == 0) {
            llama_protocol = true;
            continue;
        }
        if (strcmp(a, "--version") == 0) {
            printf("dsq-perplexity %s\n", DSQ_VERSION);
            return 0;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "dsq-perplexity: unknown option or missing value: %s\n", a);
            return 2;
        }
        i++;
        if (strcmp(a, "--model") == 0) model = v;
        else if (strcmp(a, "--text") == 0) text = v;
        else if (strcmp(a, "--tokenizer") == 0) tok = v;
        else if (strcmp(a, "--ref-model") == 0) ref = v;
        else if (strcmp(a, "--ref-tokenizer") == 0) ref_tok = v;
        else if (strcmp(a, "--ctx") == 0) {
            if (parse_long(a, v, 2, 1L << 20, &lv))
                return 2;
            ctx = (int)lv;
        } else if (strcmp(a, "--stride") == 0) {
            if (parse_long(a, v, 1, 1L << 20, &lv))
                return 2;
            stride = (int)lv;
        } else if (strcmp(a, "--max-tokens") == 0) {
            if (parse_long(a, v, 0, 1L << 40, &max_tokens))
                return 2;
        }
        else if (strcmp(a, "--dump-nll") == 0) dump = v;
        else if (strcmp(a, "--temperature") == 0) {
            char *end = NULL;
            temperature = strtod(v, &end);
            if (!end || *end || !(temperature >= 0.01 && temperature <= 100)) {
                fprintf(stderr, "dsq-perplexity: --temperature wants a number in "
                        "[0.01, 100], not '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "dsq-perplexity: unknown option %s (see --help)\n", a);
            return 2;
        }
    }
    if (!model || !text) {
        fprintf(stderr, "dsq-perplexity: --model and --text are required (see --help)\n");
        return 2;
    }
    if (stride == 0)
        stride = ctx / 2;
    if (stride > ctx && !llama_protocol) {
        fprintf(stderr, "dsq-perplexity: --stride %d is larger than --ctx %d\n", stride, ctx);
        return 2;
    }
    dsq_log_set_level(getenv("DSQ_LOG_LEVEL") ? getenv("DSQ_LOG_LEVEL") : "warn");
    char err[1024] = "";
    runner_t rm, rr;
    bool have_ref = false;
    int rc = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *lg = NULL, *lr = NULL;
    char *buf = NULL;
    if (runner_open(&rm, model, tok, ctx, err, sizeof(err))) {
        fprintf(stderr, "dsq-perplexity: %s\n", err);
        goto undo_m;
    }
    if (ref) {
        if (runner_open(&rr, ref, ref_tok ? ref_tok : tok, ctx, err, sizeof(err))) {
            fprintf(stderr, "dsq-perplexity: ref: %s\n", err);
            runner_close(&rr);
            goto undo_m;
        }
        have_ref = true;
        if (rr.n_vocab != rm.n_vocab) {
            fprintf(stderr, "dsq-perplexity: vocab sizes differ (%lld vs %lld)\n",
                    (long long)rm.n_vocab, (long long)rr.n_vocab);
            goto undo;
        }
    }
    const dsq_tokenizer_t *tk = dsq_model_file_tokenizer(rm.f);
    if (!tk) {
        fprintf(stderr, "dsq-perplexity: %s has no tokenizer (give --tokenizer)\n", model);
        goto undo;
    }
    FILE *fp = fopen(text, "rb");
    long len = -1;
    if (fp && fseek(fp, 0, SEEK_END) == 0 && (len = ftell(fp)) >= 0 &&
        fseek(fp, 0, SEEK_SET) == 0 && (buf = malloc((size_t)len + 1)) &&
        fread(buf, 1, (size_t)len, fp) == (size_t)len) {
        buf[len] = '\0';
    } else {
        free(buf);
        buf = NULL;
    }
    if (fp)
        fclose(fp);
    if (!buf) {
        fprintf(stderr, "dsq-perplexity: cannot read %s\n", text);
        goto undo;
    }
    const bool add_bos = !llama_protocol || dsq_tokenizer_add_bos(tk);
    if (dsq_tokenizer_encode(tk, buf, (size_t)len, add_bos ? DSQ_TOK_ADD_BOS : 0, &ids,
                             &n_ids)) {
        fprintf(stderr, "dsq-perplexity: tokenizing %s failed\n", text);
        goto undo;
    }
    if (max_tokens > 0 && n_ids > (size_t)max_tokens)
        n_ids = (size_t)max_tokens;
    if (n_ids < 2) {
        fprintf(stderr, "dsq-perplexity: %s has fewer than 2 tokens\n", text);
        goto undo;
    }
    if (dump && !(df = fopen(dump, "w"))) {
        fprintf(stderr, "dsq-perplexity: cannot write %s\n", dump);
        goto undo;
    }
    lg = malloc((size_t)ctx * (size_t)rm.n_vocab * sizeof(*lg));
    lr = have_ref ? malloc((size_t)ctx * (size_t)rm.n_vocab * sizeof(*lr)) : NULL;
    if (!lg || (have_ref && !lr)) {
        fprintf(stderr, "dsq-perplexity: out of memory for the logits of --ctx %d\n", ctx);
        goto undo;
    }
    score_t sc = {.inv_t = 1.0 / temperature, .dump = df};
    size_t prev_end = 1;            /* tokens [1, prev_end) already scored */
    if (llama_protocol) {
        const int32_t bos = dsq_tokenizer_bos(tk);
        const size_t n_chunk = n_ids / (size_t)ctx;
        const int first = ctx / 2;
        int32_t *chunk = malloc((size_t)ctx * sizeof(*chunk));
        if (!chunk || n_chunk == 0 || ctx < 3) {
            if (!chunk)
                fprintf(stderr, "dsq-perplexity: out of memory\n");
            else if (ctx < 3)
                fprintf(stderr, "dsq-perplexity: --llama-cpp-protocol scores nothing with "
                        "--ctx %d (needs 3 or more)\n", ctx);
            else
                fprintf(stderr, "dsq-perplexity: %s: %zu tokens, shorter than one --ctx "
                        "chunk of %d\n", text, n_ids, ctx);
            free(chunk);
            goto undo;
        }
        for (size_t c = 0; c < n_chunk; c++) {
            memcpy(chunk, ids + c * (size_t)ctx, (size_t)ctx * sizeof(*chunk));
            if (add_bos && bos >= 0)
                chunk[0] = bos;
            if (run_window(&rm, chunk, ctx - 1, first, lg) ||
                (have_ref && run_window(&rr, chunk, ctx - 1, first, lr))) {
                fprintf(stderr, "dsq-perplexity: forward pass failed\n");
                free(chunk);
                goto undo;
            }
            for (int row = first; row < ctx - 1; row++) {
                const size_t off = (size_t)(row - first) * (size_t)rm.n_vocab;
                score_row(&sc, lg + off, have_ref ? lr + off : NULL, rm.n_vocab,
                          ids[c * (size_t)ctx + (size_t)row + 1]);
            }
        }
        free(chunk);
        prev_end = n_ids;           /* skip the sliding window below */
    }
    for (size_t begin = 0; prev_end < n_ids; begin += (size_t)stride) {
        size_t end = begin + (size_t)ctx < n_ids ? begin + (size_t)ctx : n_ids;
        if (end <= prev_end)
            continue;
        int n = (int)(end - begin);
        /* predicting token j needs the logits of row j - 1 */
        int first = (int)(prev_end - 1 - begin);
        if (run_window(&rm, ids + begin, n - 1, first, lg) ||
            (have_ref && run_window(&rr, ids + begin, n - 1, first, lr))) {
            fprintf(stderr, "dsq-perplexity: forward pass failed\n");
            goto undo;
        }
        for (int row = first; row < n - 1; row++) {
            const size_t off = (size_t)(row - first) * (size_t)rm.n_vocab;
            score_row(&sc, lg + off, have_ref ? lr + off : NULL, rm.n_vocab,
                      ids[begin + (size_t)row + 1]);
        }
        prev_end = end;
        if (end == n_ids)
            break;
    }
    printf("ppl=%.4f nll=%.5f entropy=%.5f tokens=%ld ctx=%d %s=%d", exp(sc.nll / sc.n),
           sc.nll / sc.n, sc.ent / sc.n, sc.n, ctx,
           llama_protocol ? "llama_cpp_chunks" : "stride",
           llama_protocol ? (int)(n_ids / (size_t)ctx) : stride);
    if (temperature != 1.0)
        printf(" temperature=%g", temperature);
    if (have_ref)
        printf(" kl=%.6f", sc.kl / sc.n);
    printf(" model=%s\n", model);
    rc = 0;
undo:
    if (df && fclose(df) != 0 && rc == 0) {
        fprintf(stderr, "dsq-perplexity: writing %s failed\n", dump);
        rc = 1;
    }
    if (have_ref)
        runner_close(&rr);
undo_m:
    runner_close(&rm);
    free(ids);
    free(lg);
    free(lr);
    free(buf);
    return rc;
}
