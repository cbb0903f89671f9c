/* dsq-tokenize: encode stdin text to token ids, or decode ids to text,
 * with the tokenizer of a GGUF file (vocab-only files work: the GGUF is
 * opened directly, not through the model loader), a Hugging Face
 * directory / tokenizer.json, or a llama2.c tok*.bin. One line of
 * space-separated ids out (or the decoded bytes with --decode). */
#include "dsq_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "engine/text/tokenizer.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dsq-tokenize --model PATH [--special] [--bos] [--decode]\n"
            "  --model PATH  .gguf file (vocab-only is fine), HF directory or\n"
            "                tokenizer.json, or llama2.c tok*.bin\n"
            "                (--tokenizer PATH is the same)\n"
            "  --special     match special-token text (e.g. <|im_end|>)\n"
            "  --bos         prepend BOS\n"
            "  --decode      read ids from stdin, write the text (control\n"
            "                tokens are dropped unless --special)\n"
            "  --help, --version\n"
            "Encodes UTF-8 text from stdin to ids on one line.\n");
}

static bool ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static dsq_tokenizer_t *open_tokenizer(const char *path, char *err,
                                       size_t err_len)
{
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return dsq_tokenizer_from_hf(path, err, err_len);
    if (ends_with(path, ".json"))
        return dsq_tokenizer_from_hf(path, err, err_len);
    if (ends_with(path, ".bin"))
        return dsq_tokenizer_from_llama2c(path, err, err_len);
    dsq_gguf_t *g = dsq_gguf_open(path, err, err_len);
    if (!g) return NULL;
    dsq_tokenizer_t *t = dsq_tokenizer_from_gguf(g, err, err_len);
    dsq_gguf_close(g);
    return t;
}

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                return NULL;
            }
            buf = p;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    const char *model = NULL;
    bool special = false, bos = false, decode = false;
    int rc = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            printf("dsq-tokenize %s\n", DSQ_VERSION);
            return 0;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if ((strcmp(argv[i], "--model") == 0 ||
                    strcmp(argv[i], "--tokenizer") == 0) && i + 1 < argc) {
            model = argv[++i];
        } else if (strcmp(argv[i], "--special") == 0) {
            special = true;
        } else if (strcmp(argv[i], "--bos") == 0) {
            bos = true;
        } else if (strcmp(argv[i], "--decode") == 0) {
            decode = true;
        } else {
            fprintf(stderr, "dsq-tokenize: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "dsq-tokenize: --model PATH is required\n");
        usage(stderr);
        return 2;
    }
    char err[512] = "";
    dsq_tokenizer_t *t = open_tokenizer(model, err, sizeof(err));
    if (!t) {
        fprintf(stderr, "dsq-tokenize: %s\n", err);
        return 1;
    }
    size_t len = 0;
    char *in = read_all(stdin, &len);
    if (!in) {
        fprintf(stderr, "dsq-tokenize: cannot read stdin\n");
        goto out;
    }
    if (decode) {
        size_t n = 0, cap = 256;
        int32_t *ids = malloc(cap * sizeof(*ids));
        char *grown = realloc(in, len + 1);  /* room for a NUL (strtol) */
        if (!grown || !ids) goto out_ids;
        in = grown;
        char *p = in, *end = in + len;
        *end = '\0';
        while (p < end) {
            char *q;
            long v = strtol(p, &q, 10);
            if (q == p) {
                if (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') {
                    p++;
                    continue;
                }
                fprintf(stderr, "dsq-tokenize: not an id at '%.10s'\n", p);
                goto out_ids;
            }
            if (n == cap) {
                int32_t *x = realloc(ids, 2 * cap * sizeof(*ids));
                if (!x) goto out_ids;
                ids = x;
                cap *= 2;
            }
            ids[n++] = (int32_t)v;
            p = q;
        }
        char *text = NULL;
        size_t tl = 0;
        int e = dsq_tokenizer_decode(t, ids, n, !special, &text, &tl);
        if (e) {
            fprintf(stderr, "dsq-tokenize: decode: %s\n", dsq_strerror(e));
        } else {
            fwrite(text, 1, tl, stdout);
            rc = 0;
        }
        free(text);
out_ids:
        free(ids);
    } else {
        int32_t *ids = NULL;
        size_t n = 0;
        unsigned flags = (special ? DSQ_TOK_PARSE_SPECIAL : 0) | (bos ? DSQ_TOK_ADD_BOS : 0);
        int e = dsq_tokenizer_encode(t, in, len, flags, &ids, &n);
        if (e) {
            fprintf(stderr, "dsq-tokenize: encode: %s\n", dsq_strerror(e));
        } else {
            for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
            rc = 0;
        }
        free(ids);
    }
out:
    free(in);
    dsq_tokenizer_destroy(t);
    return rc;
}
