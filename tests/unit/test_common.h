/* Helpers shared by the cmocka unit tests: test-data paths, "required test
 * file missing" checks, id-list parsing and the small logit comparisons the
 * model tests use. Header-only (static inline) so every test includes it
 * without extra build wiring; include it after <cmocka.h>. Test code only:
 * on a missing file or allocation failure these fail the running test. */
#ifndef DSQ_TEST_COMMON_H
#define DSQ_TEST_COMMON_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole file at path, NUL-terminated, malloc'd (the caller frees);
 * *len (unless NULL) gets its size in bytes. Fails the test if it cannot be read. */
static inline char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!b)
        fail_msg("cannot read %s", path);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    b[n] = '\0';
    if (len)
        *len = (size_t)n;
    return b;
}

/* "$env/rel", or "def/rel" when env is unset (env: DSQ_TEST_DATA,
 * DSQ_MODELS_DIR or DSQ_SOURCE_ROOT, set by tests/meson.build). Returns a
 * malloc'd string the caller frees; fails the test if allocation fails. */
static inline char *path_join(const char *env, const char *def, const char *rel)
{
    const char *root = getenv(env);
    if (!root)
        root = def;
    size_t n = strlen(root) + strlen(rel) + 2;
    char *p = malloc(n);
    if (!p) {
        fail_msg("out of memory joining %s/%s", root, rel);
        exit(1);    /* not reached: fail_msg does not return (gcc can't tell) */
    }
    snprintf(p, n, "%s/%s", root, rel);
    return p;
}

/* What a missing test file's failure says: where each kind of file comes
 * from (tests/data/SOURCES.md lists every file). */
#define DSQ_TEST_DATA_HINT                                                    \
    "committed under tests/data; fetched by scripts/fetch-test-data "       \
    "(tests/data/FETCHED); models by scripts/fetch-model and tests/ref "    \
    "(scripts/test runs them all)"

/* "$env/rel" (env: DSQ_TEST_DATA or DSQ_MODELS_DIR, set by tests/meson.build),
 * malloc'd (the caller frees). Fails the test when env is unset or the file
 * cannot be read, saying where such files come from. */
static inline char *data_path(const char *env, const char *rel)
{
    const char *dir = getenv(env);
    if (!dir)
        fail_msg("environment variable %s is not set (run through meson test)", env);
    char *p = path_join(env, "", rel);
    FILE *f = fopen(p, "rb");
    if (!f)
        fail_msg("missing test file %s (%s)", p, DSQ_TEST_DATA_HINT);
    fclose(f);
    return p;
}

/* Fails the test naming p (and hint, e.g. the script that makes the file,
 * when not NULL) when p cannot be opened for reading. */
static inline void require_file_hint(const char *p, const char *hint)
{
    FILE *f = fopen(p, "rb");
    if (!f) {
        if (hint)
            fail_msg("required test file missing: %s (%s)", p, hint);
        fail_msg("required test file missing: %s (%s)", p, DSQ_TEST_DATA_HINT);
    }
    fclose(f);
}

/* require_file_hint without a hint. */
static inline void require_file(const char *p)
{
    require_file_hint(p, NULL);
}

/* $DSQ_TEST_DATA/models/stories260K/stories260K.bin and tok512.bin (the
 * llama2.c TinyStories 260K model and its tokenizer, see
 * $DSQ_TEST_DATA/SOURCES.md) into *model and *tok, both required (the test
 * fails naming a missing one); the caller frees both. */
static inline void stories260k_paths(char **model, char **tok)
{
    *model = path_join("DSQ_TEST_DATA", "tests/data", "models/stories260K/stories260K.bin");
    *tok = path_join("DSQ_TEST_DATA", "tests/data", "models/stories260K/tok512.bin");
    require_file(*model);
    require_file(*tok);
}

/* Whitespace-separated decimal ids of s into out[0..cap); returns how many
 * were read (stops at the first non-number or at cap). */
static inline int parse_ids(const char *s, int32_t *out, int cap)
{
    int n = 0;
    char *end;
    while (n < cap) {
        long v = strtol(s, &end, 10);
        if (end == s)
            break;
        out[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

/* Index of the largest of x[0..n) (first one on ties); n >= 1. */
static inline int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

/* max over i < n of |a[i] - ref[i]| / max(1, |ref[i]|), in double. */
static inline double max_rel(const float *a, const float *ref, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - ref[i]) / fmax(1.0, fabs((double)ref[i]));
        worst = e > worst ? e : worst;
    }
    return worst;
}

#endif
