/* dsq-bench grammar: what the grammar mask costs per generated token.
 *
 * Loads the tokenizer of --model (a GGUF model or vocab-only file, or a
 * directory with a Hugging Face tokenizer.json) and
 * compiles a grammar: by default a nested object of the shape a JSON
 * schema for a person record compiles to (fixed keys, strings, an
 * integer, a nested address object, an array of strings), or
 * --json-object (the API's json_object grammar), --grammar FILE (GBNF),
 * or --json-schema FILE (a JSON Schema, converted as the API converts
 * response_format json_schema). Then it generates --tokens tokens in walks from the start rule:
 * at each step the allowed-token mask (dsq_grammar_matcher_fill_mask),
 * then one allowed token chosen by a fixed LCG (uniform over the allowed
 * text tokens, so string states see long random tokens, the worst case
 * for the walk), accepted into the matcher; a finished walk restarts with
 * a new matcher on the same grammar (its mask cache stays warm, as for
 * the requests of a server). Reported, in microseconds: mask time per
 * token, split into computed (trie walk) and cached steps, with p50 / p99;
 * accept time per token; the cache hit rate. Single thread. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "engine/text/grammar.h"
#include "engine/text/tokenizer.h"

int dsq__bench_grammar(int argc, char **argv);

static const char NESTED[] =
    "root    ::= \"{\" ws \"\\\"name\\\":\" ws str \",\" ws \"\\\"age\\\":\" ws int \",\" ws\n"
    "            \"\\\"address\\\":\" ws addr \",\" ws \"\\\"tags\\\":\" ws tags ws \"}\"\n"
    "addr    ::= \"{\" ws \"\\\"street\\\":\" ws str \",\" ws \"\\\"city\\\":\" ws str \",\" ws\n"
    "            \"\\\"zip\\\":\" ws str ws \"}\"\n"
    "tags    ::= \"[\" ws ( str ( \",\" ws str )* )? ws \"]\"\n"
    "str     ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt] ){0,48} \"\\\"\"\n"
    "int     ::= \"-\"? ( \"0\" | [1-9] [0-9]{0,8} )\n"
    "ws      ::= [ \\n]{0,2}\n";

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    if (n == 0)
        return 0;
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

int dsq__bench_grammar(int argc, char **argv)
{
    const char *model = NULL, *gfile = NULL, *sfile = NULL;
    bool json_object = false;
    int n_tokens = 2000;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--grammar") && i + 1 < argc)
            gfile = argv[++i];
        else if (!strcmp(argv[i], "--json-schema") && i + 1 < argc)
            sfile = argv[++i];
        else if (!strcmp(argv[i], "--json-object"))
            json_object = true;
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            n_tokens = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: dsq-bench grammar --model GGUF|TOKENIZER_DIR [--grammar FILE | "
                            "--json-schema FILE | --json-object] [--tokens 2000]\n");
            return 2;
        }
    }
    if (!model || n_tokens < 1) {
        fprintf(stderr, "dsq-bench grammar: --model GGUF or tokenizer directory is required (--tokens >= 1)\n");
        return 2;
    }
    char err[512] = "";
    struct stat st;
    dsq_tokenizer_t *t = NULL;
    if (stat(model, &st) == 0 && S_ISDIR(st.st_mode)) {
        t = dsq_tokenizer_from_hf(model, err, sizeof(err));   /* tokenizer.json */
    } else {
        dsq_gguf_t *gg = dsq_gguf_open(model, err, sizeof(err));
        if (!gg) {
            fprintf(stderr, "dsq-bench grammar: %s\n", err);
            return 1;
        }
        t = dsq_tokenizer_from_gguf(gg, err, sizeof(err));
        dsq_gguf_close(gg);
    }
    if (!t) {
        fprintf(stderr, "dsq-bench grammar: %s\n", err);
        return 1;
    }
    char *src = NULL;
    size_t src_len = 0;
    if (gfile || sfile) {
        FILE *f = fopen(gfile ? gfile : sfile, "rb");
        if (!f) {
            fprintf(stderr, "dsq-bench grammar: cannot open %s\n", gfile ? gfile : sfile);
            dsq_tokenizer_destroy(t);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        src = malloc((size_t)n + 1);
        src_len = src ? fread(src, 1, (size_t)n, f) : 0;
        if (src)
            src[src_len] = 0;
        fclose(f);
    }
    if (sfile) {
        /* the schema's GBNF, as server/openai.c makes it */
        char *gbnf = NULL;
        int crc = src ? dsq_grammar_gbnf_from_json_schema(src, src_len, &gbnf, err, sizeof(err))
                      : DSQ_ENOMEM;
        if (!src)
            snprintf(err, sizeof(err), "%s: out of memory", sfile);
        free(src);
        src = gbnf;
        src_len = gbnf ? strlen(gbnf) : 0;
        if (crc) {
            fprintf(stderr, "dsq-bench grammar: %s\n", err);
            dsq_tokenizer_destroy(t);
            return 1;
        }
    }
    dsq_grammar_t *g = NULL;
    int rc = json_object ? dsq_grammar_builtin(DSQ_GRAMMAR_JSON_OBJECT, &g, err, sizeof(err))
           : gfile || sfile ? dsq_grammar_from_gbnf(src, src_len, NULL, &g, err, sizeof(err))
                   : dsq_grammar_from_gbnf(NESTED, strlen(NESTED), NULL, &g, err, sizeof(err));
    free(src);
    if (rc) {
        fprintf(stderr, "dsq-bench grammar: %s\n", err);
        dsq_tokenizer_destroy(t);
        return 1;
    }
    double t0 = now_us();
    dsq_grammar_vocab_t *v = dsq_grammar_vocab_create(t);
    double t_vocab = now_us() - t0;
    int32_t nv = dsq_grammar_vocab_size(v);
    uint32_t *mask = malloc(((size_t)nv + 31) / 32 * sizeof(*mask));
    int32_t *allowed = malloc((size_t)nv * sizeof(*allowed));
    double *cold = malloc((size_t)n_tokens * sizeof(double));
    double *warm = malloc((size_t)n_tokens * sizeof(double));
    double *acc = malloc((size_t)n_tokens * sizeof(double));
    int n_cold = 0, n_warm = 0, n_walks = 0;
    double sum_mask = 0, sum_acc = 0;
    uint64_t seed = 12345;
    dsq_grammar_matcher_t *m = NULL;
    int done = 0;
    while (done < n_tokens) {
        if (!m || dsq_grammar_matcher_done(m)) {
            dsq_grammar_matcher_free(m);
            m = dsq_grammar_matcher_create(g);
            n_walks++;
        }
        bool cached = false;
        double a = now_us();
        int n = dsq_grammar_matcher_fill_mask(m, v, mask, &cached);
        double b = now_us();
        if (n < 0) {
            fprintf(stderr, "dsq-bench grammar: mask failed (%d)\n", n);
            break;
        }
        (cached ? warm : cold)[cached ? n_warm++ : n_cold++] = b - a;
        sum_mask += b - a;
        int k = 0;
        for (int32_t id = 0; id < nv; id++)
            if (((mask[id / 32] >> (id % 32)) & 1u) && !dsq_tokenizer_is_eog(t, id))
                allowed[k++] = id;
        if (k == 0) {                  /* only the end is allowed: next walk */
            dsq_grammar_matcher_free(m);
            m = NULL;
            continue;
        }
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int32_t id = allowed[(seed >> 33) % (uint64_t)k];
        a = now_us();
        rc = dsq_grammar_matcher_accept_token(m, v, id);
        b = now_us();
        if (rc) {
            fprintf(stderr, "dsq-bench grammar: an allowed token was rejected (%d)\n", rc);
            break;
        }
        acc[done++] = b - a;
        sum_acc += b - a;
    }
    printf("# dsq-bench grammar: model %s, vocab %d, grammar %s (%d rules, %d elements), "
           "vocab index built in %.1f ms\n", model, nv,
           json_object ? "json_object" : gfile ? gfile : sfile ? sfile : "nested object (built in)",
           dsq_grammar_n_rules(g), dsq_grammar_n_elements(g), t_vocab / 1e3);
    printf("# %d tokens in %d walks; mask per token: mean %.1f us; computed %d (%.1f%%): p50 "
           "%.1f us, p99 %.1f us; cached %d: p50 %.2f us, p99 %.2f us; accept: mean %.2f us\n",
           done, n_walks, sum_mask / (n_cold + n_warm), n_cold,
           100.0 * n_cold / (n_cold + n_warm), pct(cold, n_cold, 0.5), pct(cold, n_cold, 0.99),
           n_warm, pct(warm, n_warm, 0.5), pct(warm, n_warm, 0.99), sum_acc / (done ? done : 1));
    dsq_grammar_matcher_free(m);
    free(mask);
    free(allowed);
    free(cold);
    free(warm);
    free(acc);
    dsq_grammar_vocab_free(v);
    dsq_grammar_free(g);
    dsq_tokenizer_destroy(t);
    return rc ? 1 : 0;
}
