/* dsq-bench tokenize: encode throughput of a tokenizer (MB/s, tokens/s).
 *
 * The text is real and reproducible offline: it is assembled at run time
 * from files that Debian packages install, never downloaded and never
 * stored in the repository:
 *   english   the licence texts of base-files (/usr/share/common-licenses:
 *             GPL-3, LGPL-2.1, Apache-2.0, MPL-2.0, GFDL-1.3, Artistic);
 *   cjk+code  the translated messages (msgstr) of the zh_CN and ja gettext
 *             catalogues of coreutils, libc-l10n and bash
 *             (coreutils.mo, libc.mo, bash.mo under
 *             /usr/share/locale/{zh_CN,ja}/LC_MESSAGES), interleaved
 *             in ~8 KB blocks with C headers from libc6-dev, libuv1-dev,
 *             libpcre2-dev and libcjson-dev (/usr/include).
 * Each corpus is repeated up to --mb megabytes (default 2; the tokenizers
 * keep no cache, so repetition does not flatter them). Missing files are
 * reported and skipped; an empty corpus is an error. --text FILE measures
 * that file instead.
 *
 * The corpus is encoded in chunks of at most 64 KiB cut at a newline (the
 * size of a long prompt), as plain text (no special-token parsing, no BOS),
 * pass after pass until --seconds (default 1) have elapsed. Before timing,
 * one untimed pass checks decode(encode(chunk)) == chunk and reports it.
 * Rates use 1 MB = 1e6 bytes of input text; wall and process-CPU times
 * are both printed, since the build machine is shared.
 *
 * .mo layout (GNU gettext manual, "The Format of GNU MO Files"): u32 magic
 * 0x950412de (file byte order), u32 revision, u32 N, u32 offset of the
 * original-string table, u32 offset of the translation table; each table
 * holds N (u32 length, u32 offset) pairs. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "engine/common/log.h"
#include "engine/text/tokenizer.h"

int dsq__bench_tokenize(int argc, char **argv);

typedef struct buf {
    char *p;
    size_t n, cap;
} buf_t;

static int buf_add(buf_t *b, const char *s, size_t n)
{
    int rc = 0;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 65536;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            rc = DSQ_ENOMEM;
            goto out;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
out:
    return rc;
}

static double now_s(clockid_t clk)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Whole file into *b (appended). Returns 0 or a DSQ_E* code. */
static int read_file(const char *path, buf_t *b)
{
    int rc = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        rc = DSQ_EIO;
        goto out;
    }
    char tmp[65536];
    size_t r;
    while (rc == 0 && (r = fread(tmp, 1, sizeof(tmp), f)) > 0)
        rc = buf_add(b, tmp, r);
    if (rc == 0 && ferror(f))
        rc = DSQ_EIO;
    fclose(f);
out:
    return rc;
}

static uint32_t rd32(const unsigned char *p, bool swap)
{
    uint32_t v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    if (swap)
        v = (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
    return v;
}

/* Append every non-empty translation of a .mo file, one per line (plural
 * forms are NUL-separated in the file: they become lines too). The header
 * entry (empty msgid) is skipped. */
static int add_mo(const char *path, buf_t *out)
{
    buf_t f = { 0 };
    int rc = read_file(path, &f);
    if (rc != 0)
        goto out;
    const unsigned char *d = (const unsigned char *)f.p;
    if (f.n < 20) {
        rc = DSQ_EFORMAT;
        goto out;
    }
    bool swap;
    if (rd32(d, false) == 0x950412deu)
        swap = false;
    else if (rd32(d, true) == 0x950412deu)
        swap = true;
    else {
        rc = DSQ_EFORMAT;
        goto out;
    }
    uint32_t n = rd32(d + 8, swap), oo = rd32(d + 12, swap), to = rd32(d + 16, swap);
    if (oo > f.n || to > f.n || n > (f.n - oo) / 8 || n > (f.n - to) / 8) {
        rc = DSQ_EFORMAT;
        goto out;
    }
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        uint32_t ol = rd32(d + oo + 8 * i, swap);
        uint32_t len = rd32(d + to + 8 * i, swap), off = rd32(d + to + 8 * i + 4, swap);
        if (ol == 0 || len == 0)
            continue;   /* header entry, or untranslated */
        if (off > f.n || len > f.n - off) {
            rc = DSQ_EFORMAT;
            break;
        }
        for (uint32_t k = 0; k < len && rc == 0; k++) {
            char c = d[off + k] ? (char)d[off + k] : '\n';
            rc = buf_add(out, &c, 1);
        }
        if (rc == 0)
            rc = buf_add(out, "\n", 1);
    }
out:
    free(f.p);
    return rc;
}

/* Repeat src until dst holds at least want bytes (whole copies). */
static int repeat_to(const buf_t *src, size_t want, buf_t *dst)
{
    int rc = 0;
    while (rc == 0 && dst->n < want)
        rc = buf_add(dst, src->p, src->n);
    return rc;
}

static const char *const english_files[] = {
    "/usr/share/common-licenses/GPL-3",
    "/usr/share/common-licenses/LGPL-2.1",
    "/usr/share/common-licenses/Apache-2.0",
    "/usr/share/common-licenses/MPL-2.0",
    "/usr/share/common-licenses/GFDL-1.3",
    "/usr/share/common-licenses/Artistic",
};
static const char *const mo_files[] = {
    "/usr/share/locale/zh_CN/LC_MESSAGES/coreutils.mo",
    "/usr/share/locale/ja/LC_MESSAGES/coreutils.mo",
    "/usr/share/locale/zh_CN/LC_MESSAGES/libc.mo",
    "/usr/share/locale/ja/LC_MESSAGES/libc.mo",
    "/usr/share/locale/zh_CN/LC_MESSAGES/bash.mo",
    "/usr/share/locale/ja/LC_MESSAGES/bash.mo",
};
static const char *const code_files[] = {
    "/usr/include/stdio.h",
    "/usr/include/stdlib.h",
    "/usr/include/string.h",
    "/usr/include/unistd.h",
    "/usr/include/pthread.h",
    "/usr/include/uv.h",
    "/usr/include/pcre2.h",
    "/usr/include/cjson/cJSON.h",
};
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* Length of the prefix of s[0..n) that ends at the last newline at or
 * before max bytes (or max itself when there is none). */
static size_t cut_at_newline(const char *s, size_t n, size_t max)
{
    if (n <= max)
        return n;
    for (size_t k = max; k > max / 2; k--)
        if (s[k - 1] == '\n')
            return k;
    return max;
}

static int build_english(buf_t *uniq)
{
    int rc = 0;
    for (size_t i = 0; i < N_OF(english_files) && rc != DSQ_ENOMEM; i++) {
        rc = read_file(english_files[i], uniq);
        if (rc == DSQ_EIO)
            fprintf(stderr, "dsq-bench: skipping missing %s\n", english_files[i]);
    }
    return rc == DSQ_ENOMEM ? rc : 0;
}

static int build_cjk_code(buf_t *uniq)
{
    int rc = 0;
    buf_t cjk = { 0 }, code = { 0 };
    for (size_t i = 0; i < N_OF(mo_files) && rc != DSQ_ENOMEM; i++) {
        rc = add_mo(mo_files[i], &cjk);
        if (rc != 0 && rc != DSQ_ENOMEM)
            fprintf(stderr, "dsq-bench: skipping %s (%s)\n", mo_files[i], dsq_strerror(rc));
    }
    for (size_t i = 0; i < N_OF(code_files) && rc != DSQ_ENOMEM; i++) {
        rc = read_file(code_files[i], &code);
        if (rc == DSQ_EIO)
            fprintf(stderr, "dsq-bench: skipping missing %s\n", code_files[i]);
    }
    if (rc == DSQ_ENOMEM)
        goto out;
    rc = 0;
    /* interleave ~8 KB blocks, cut at newlines */
    size_t a = 0, b = 0;
    while (rc == 0 && (a < cjk.n || b < code.n)) {
        size_t k = cut_at_newline(cjk.p + a, cjk.n - a, 8192);
        if (k)
            rc = buf_add(uniq, cjk.p + a, k);
        a += k;
        k = cut_at_newline(code.p + b, code.n - b, 8192);
        if (rc == 0 && k)
            rc = buf_add(uniq, code.p + b, k);
        b += k;
    }
out:
    free(cjk.p);
    free(code.p);
    return rc;
}

static dsq_tokenizer_t *open_tokenizer(const char *path, char *err, size_t err_len)
{
    struct stat st;
    size_t n = strlen(path);
    dsq_tokenizer_t *t = NULL;
    if ((stat(path, &st) == 0 && S_ISDIR(st.st_mode)) ||
        (n >= 5 && strcmp(path + n - 5, ".json") == 0)) {
        t = dsq_tokenizer_from_hf(path, err, err_len);
    } else if (n >= 4 && strcmp(path + n - 4, ".bin") == 0) {
        t = dsq_tokenizer_from_llama2c(path, err, err_len);
    } else {
        dsq_gguf_t *g = dsq_gguf_open(path, err, err_len);
        if (g) {
            t = dsq_tokenizer_from_gguf(g, err, err_len);
            dsq_gguf_close(g);
        }
    }
    return t;
}

/* Encode text in chunks, pass after pass, for at least min_s seconds.
 * Prints one result line. Returns 0 or a DSQ_E* code. */
static int measure(const dsq_tokenizer_t *t, const char *name, const char *text,
                   size_t len, double min_s)
{
    int rc = 0;
    size_t n_tokens = 0, n_chunks = 0, n_high = 0, bad_rt = 0;
    /* untimed pass: tokens per pass and the round-trip check */
    for (size_t off = 0; off < len && rc == 0;) {
        size_t k = cut_at_newline(text + off, len - off, 65536);
        int32_t *ids = NULL;
        size_t n = 0;
        char *back = NULL;
        size_t bl = 0;
        rc = dsq_tokenizer_encode(t, text + off, k, 0, &ids, &n);
        if (rc == 0)
            rc = dsq_tokenizer_decode(t, ids, n, false, &back, &bl);
        if (rc == 0 && (bl != k || memcmp(back, text + off, k) != 0))
            bad_rt++;
        free(back);
        free(ids);
        n_tokens += n;
        n_chunks++;
        off += k;
    }
    for (size_t i = 0; i < len; i++)
        n_high += (unsigned char)text[i] >= 0x80;
    if (rc != 0)
        goto out;
    int passes = 0;
    double w0 = now_s(CLOCK_MONOTONIC), c0 = now_s(CLOCK_PROCESS_CPUTIME_ID), wall = 0.0;
    do {
        for (size_t off = 0; off < len && rc == 0;) {
            size_t k = cut_at_newline(text + off, len - off, 65536);
            int32_t *ids = NULL;
            size_t n = 0;
            rc = dsq_tokenizer_encode(t, text + off, k, 0, &ids, &n);
            free(ids);
            off += k;
        }
        passes++;
        wall = now_s(CLOCK_MONOTONIC) - w0;
    } while (rc == 0 && wall < min_s);
    double cpu = now_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    if (rc != 0)
        goto out;
    double bytes = (double)len * passes, toks = (double)n_tokens * passes;
    printf("%-9s %8.2f MB  %8zu tok  %5.2f B/tok  %4.1f%% non-ASCII  %3d pass  "
           "wall %7.2f MB/s %9.0f tok/s | cpu %7.2f MB/s %9.0f tok/s  roundtrip %s (%zu/%zu chunks)\n",
           name, (double)len * 1e-6, n_tokens, n_tokens ? (double)len / (double)n_tokens : 0.0,
           len ? 100.0 * (double)n_high / (double)len : 0.0, passes,
           bytes / wall * 1e-6, toks / wall, bytes / cpu * 1e-6, toks / cpu,
           bad_rt ? "DIFF" : "ok", n_chunks - bad_rt, n_chunks);
    fflush(stdout);
out:
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsq-bench tokenize --model PATH [--text FILE] [--mb N] [--seconds S]\n"
            "  --model PATH  .gguf (vocab-only is fine), HF directory or tokenizer.json,\n"
            "                or llama2.c tok*.bin\n"
            "  --text FILE   measure this file instead of the built-in corpora\n"
            "  --mb N        size of each built-in corpus in MB (default 2)\n"
            "  --seconds S   minimum timed seconds per corpus (default 1)\n"
            "Built-in corpora, from files Debian packages install: english =\n"
            "/usr/share/common-licenses/{GPL-3,LGPL-2.1,Apache-2.0,MPL-2.0,GFDL-1.3,Artistic};\n"
            "cjk+code = msgstrs of /usr/share/locale/{zh_CN,ja}/LC_MESSAGES/{coreutils,libc,bash}.mo\n"
            "interleaved with /usr/include/{stdio,stdlib,string,unistd,pthread,uv,pcre2}.h and\n"
            "cjson/cJSON.h. Plain-text encode (no BOS, no special tokens), 64 KiB chunks.\n");
}

int dsq__bench_tokenize(int argc, char **argv)
{
    int ret = 1;
    const char *model = NULL, *text_path = NULL;
    double mb = 2.0, min_s = 1.0;
    buf_t uniq = { 0 }, corpus = { 0 };
    dsq_tokenizer_t *t = NULL;
    for (int i = 0; i < argc; i++) {
        bool has = i + 1 < argc;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            ret = 0;
            goto out;
        } else if (has && (strcmp(argv[i], "--model") == 0 || strcmp(argv[i], "--tokenizer") == 0)) {
            model = argv[++i];
        } else if (has && strcmp(argv[i], "--text") == 0) {
            text_path = argv[++i];
        } else if (has && strcmp(argv[i], "--mb") == 0) {
            mb = atof(argv[++i]);
        } else if (has && strcmp(argv[i], "--seconds") == 0) {
            min_s = atof(argv[++i]);
        } else {
            fprintf(stderr, "dsq-bench tokenize: bad argument '%s'\n", argv[i]);
            usage(stderr);
            ret = 2;
            goto out;
        }
    }
    if (!model || !(mb > 0.0 && mb <= 1024.0) || !(min_s >= 0.0)) {
        usage(stderr);
        ret = 2;
        goto out;
    }
    char err[256] = "";
    dsq_log_set_level("warn");
    t = open_tokenizer(model, err, sizeof(err));
    if (!t) {
        if (strstr(err, model))   /* the readers already name the file */
            fprintf(stderr, "dsq-bench: %s\n", err);
        else
            fprintf(stderr, "dsq-bench: %s: %s\n", model, err);
        goto out;
    }
    printf("# tokenize: model=%s kind=%s n_vocab=%d; 1 MB = 1e6 bytes\n", model,
           dsq_tokenizer_kind(t) == DSQ_TOKENIZER_SPM ? "spm" : "bpe",
           (int)dsq_tokenizer_n_vocab(t));
    int rc = 0;
    if (text_path) {
        rc = read_file(text_path, &corpus);
        if (rc != 0) {
            fprintf(stderr, "dsq-bench: %s: %s\n", text_path, dsq_strerror(rc));
            goto out;
        }
        rc = measure(t, "file", corpus.p ? corpus.p : "", corpus.n, min_s);
    } else {
        size_t want = (size_t)(mb * 1e6);
        for (int c = 0; c < 2 && rc == 0; c++) {
            const char *name = c == 0 ? "english" : "cjk+code";
            uniq.n = 0;
            corpus.n = 0;
            rc = c == 0 ? build_english(&uniq) : build_cjk_code(&uniq);
            if (rc == 0 && uniq.n == 0) {
                fprintf(stderr, "dsq-bench: no source file for the %s corpus is installed\n", name);
                rc = DSQ_ENOTFOUND;
            }
            if (rc == 0)
                rc = repeat_to(&uniq, want, &corpus);
            if (rc == 0)   /* trim the last copy back to about want bytes */
                corpus.n = cut_at_newline(corpus.p, corpus.n, want);
            if (rc == 0)
                rc = measure(t, name, corpus.p, corpus.n, min_s);
        }
    }
    if (rc != 0) {
        fprintf(stderr, "dsq-bench: tokenize: %s\n", dsq_strerror(rc));
        goto out;
    }
    ret = 0;
out:
    dsq_tokenizer_destroy(t);
    free(uniq.p);
    free(corpus.p);
    return ret;
}
