/* tests for engine/text/chat_template.c + engine/text/jinja.c.
 *
 * Goldens (tests/golden/chat_templates/, made by tests/ref/make_chat_golden.py
 * with transformers' own renderer): every real template from the test data
 * renders every recorded conversation byte for byte, and fails where
 * transformers failed. The template text is read from $DSQ_TEST_DATA (or the
 * SmolLM2 GGUF in $DSQ_MODELS_DIR) and its SHA-256 checked against the
 * golden's. snippets.json covers expressions, filters, tests and whitespace
 * control the same way. The rest are hostile inputs (limits, deep nesting,
 * unterminated tags, mutated templates) that must give errors, not crashes
 * or hangs, and a concurrent-render check. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "engine/text/chat_template.h"
#include "engine/common/error.h"
#include "engine/io/gguf.h"
#include "server/json_print.h"

/* v as the JSON text the renderer takes, printed as dsqd prints it
 * (malloc'd; NULL for NULL). */
static char *json_text(const cJSON *v)
{
    char *t = v ? dsq_json_print(v) : NULL;
    if (v && !t)
        fail_msg("out of memory printing JSON");
    return t;
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long k = ftell(f);
        if (k >= 0 && fseek(f, 0, SEEK_SET) == 0) {
            buf = malloc((size_t)k + 1);
            if (buf) {
                *n = fread(buf, 1, (size_t)k, f);
                buf[*n] = 0;
            }
        }
    }
    fclose(f);
    return buf;
}

static char *env_path(const char *env, const char *rel)
{
    const char *root = getenv(env);
    if (!root)
        fail_msg("environment variable %s is not set (meson sets it)", env);
    size_t n = strlen(root) + strlen(rel) + 2;
    char *p = malloc(n);
    assert_non_null(p);
    snprintf(p, n, "%s/%s", root, rel);
    return p;
}

/* golden files open with '#' comment lines, then one JSON document */
static cJSON *load_golden(const char *name)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "tests/golden/chat_templates/%s", name);
    char *path = env_path("DSQ_SOURCE_ROOT", rel);
    size_t n = 0;
    char *txt = slurp(path, &n);
    if (!txt)
        fail_msg("missing golden file %s", path);
    char *p = txt;
    while (*p == '#') {
        char *nl = strchr(p, '\n');
        p = nl ? nl + 1 : p + strlen(p);
    }
    cJSON *j = cJSON_Parse(p);
    if (!j)
        fail_msg("golden file %s is not valid JSON after its header", path);
    free(txt);
    free(path);
    return j;
}

static void sha256_hex(const char *p, size_t n, char out[65])
{
    unsigned char md[32];
    unsigned int md_n = 0;
    assert_int_equal(EVP_Digest(p, n, md, &md_n, EVP_sha256(), NULL), 1);
    for (unsigned i = 0; i < 32; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* template text for a golden's "template" object; caller frees */
static char *load_template(const cJSON *tdesc, size_t *len)
{
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(tdesc, "source"));
    const char *rel = cJSON_GetStringValue(cJSON_GetObjectItem(tdesc, "path"));
    assert_non_null(kind);
    assert_non_null(rel);
    char *out = NULL;
    if (strcmp(kind, "file") == 0) {
        char *path = env_path("DSQ_TEST_DATA", rel);
        out = slurp(path, len);
        if (!out)
            fail_msg("missing test data file %s", path);
        free(path);
    } else if (strcmp(kind, "tokenizer_config") == 0) {
        char *path = env_path("DSQ_TEST_DATA", rel);
        size_t n;
        char *txt = slurp(path, &n);
        if (!txt)
            fail_msg("missing test data file %s", path);
        cJSON *j = cJSON_Parse(txt);
        const char *s = cJSON_GetStringValue(cJSON_GetObjectItem(j, "chat_template"));
        if (!s)
            fail_msg("%s has no string chat_template", path);
        *len = strlen(s);
        out = strdup(s);
        cJSON_Delete(j);
        free(txt);
        free(path);
    } else if (strcmp(kind, "gguf") == 0) {
        char *path = env_path("DSQ_MODELS_DIR", rel);
        char err[256];
        dsq_gguf_t *g = dsq_gguf_open(path, err, sizeof(err));
        if (!g)
            fail_msg("cannot open model %s: %s", path, err);
        size_t n = 0;
        const char *s = dsq_gguf_get_str(g, "tokenizer.chat_template", &n);
        if (!s)
            fail_msg("%s has no tokenizer.chat_template", path);
        out = malloc(n + 1);
        assert_non_null(out);
        memcpy(out, s, n);
        out[n] = 0;
        *len = n;
        dsq_gguf_close(g);
        free(path);
    } else {
        fail_msg("unknown template source %s", kind);
    }
    assert_non_null(out);
    return out;
}

static void report_diff(const char *name, const char *want, size_t want_n,
                        const char *got, size_t got_n)
{
    size_t i = 0;
    while (i < want_n && i < got_n && want[i] == got[i])
        i++;
    size_t from = i > 40 ? i - 40 : 0;
    print_error("case %s: first difference at byte %zu (want %zu bytes, got %zu)\n"
                "  want: ...%.*s\n  got:  ...%.*s\n", name, i, want_n, got_n,
                (int)(want_n - from > 80 ? 80 : want_n - from), want + from,
                (int)(got_n - from > 80 ? 80 : got_n - from), got + from);
}

/* Render one case; returns true when it matched the golden. */
static bool check_case(const dsq_chat_template_t *t, const char *name,
                       const cJSON *msgs, const cJSON *tools, bool agp,
                       const char *bos, const char *eos, const cJSON *extra,
                       const cJSON *expected, const cJSON *error)
{
    char *out = NULL;
    size_t out_n = 0;
    char err[512];
    char *mj = json_text(msgs), *tj = json_text(cJSON_IsNull(tools) ? NULL : tools);
    char *ej = json_text(extra);
    int rc = dsq_chat_template_render(t, mj, tj, agp, bos, eos, ej, &out, &out_n, err,
                                      sizeof(err));
    free(mj);
    free(tj);
    free(ej);
    bool ok;
    if (expected) {
        const char *want = cJSON_GetStringValue(expected);
        assert_non_null(want);
        ok = rc == 0 && out_n == strlen(want) && memcmp(out, want, out_n) == 0;
        if (rc != 0)
            print_error("case %s: render failed (%d): %s\n", name, rc, err);
        else if (!ok)
            report_diff(name, want, strlen(want), out, out_n);
    } else {
        ok = rc != 0 && out == NULL && err[0] != 0;
        if (!ok)
            print_error("case %s: transformers raised \"%s\", we rendered instead\n",
                        name, cJSON_GetStringValue(error));
    }
    free(out);
    return ok;
}

static void run_golden(const char *file)
{
    cJSON *g = load_golden(file);
    const cJSON *tdesc = cJSON_GetObjectItem(g, "template");
    size_t len = 0;
    char *src = load_template(tdesc, &len);
    char hex[65];
    sha256_hex(src, len, hex);
    const char *want_sha = cJSON_GetStringValue(cJSON_GetObjectItem(tdesc, "sha256"));
    if (!want_sha || strcmp(hex, want_sha) != 0)
        fail_msg("%s: template text changed (sha256 %s, golden has %s): regenerate the golden",
                 file, hex, want_sha ? want_sha : "none");
    char err[512];
    dsq_chat_template_t *t = dsq_chat_template_create(src, len, err, sizeof(err));
    if (!t)
        fail_msg("%s: template does not load: %s", file, err);
    const char *bos = cJSON_GetStringValue(cJSON_GetObjectItem(g, "bos_token"));
    const char *eos = cJSON_GetStringValue(cJSON_GetObjectItem(g, "eos_token"));
    int n = 0, bad = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(c, "name"));
        n++;
        if (!check_case(t, name, cJSON_GetObjectItem(c, "messages"),
                        cJSON_GetObjectItem(c, "tools"),
                        cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                        bos, eos, cJSON_GetObjectItem(c, "extra"),
                        cJSON_GetObjectItem(c, "expected"), cJSON_GetObjectItem(c, "error")))
            bad++;
    }
    print_message("# %s: %d/%d cases match transformers\n", file, n - bad, n);
    dsq_chat_template_destroy(t);
    free(src);
    cJSON_Delete(g);
    assert_true(n > 0);
    assert_int_equal(bad, 0);
}

static void test_golden_qwen25(void **s) { (void)s; run_golden("qwen2.5-7b-instruct.json"); }
static void test_golden_r1_distill(void **s) { (void)s; run_golden("deepseek-r1-distill-qwen-32b.json"); }
static void test_golden_llama_cpp_r1(void **s) { (void)s; run_golden("llama-cpp-deepseek-r1.json"); }
static void test_golden_deepseek_v3(void **s) { (void)s; run_golden("deepseek-v3.json"); }
static void test_golden_qwen3(void **s) { (void)s; run_golden("qwen3.json"); }
static void test_golden_smollm2(void **s) { (void)s; run_golden("smollm2-135m-instruct.json"); }

static void test_snippets(void **state)
{
    (void)state;
    cJSON *g = load_golden("snippets.json");
    const cJSON *ctx = cJSON_GetObjectItem(g, "context");
    const char *bos = cJSON_GetStringValue(cJSON_GetObjectItem(ctx, "bos_token"));
    const char *eos = cJSON_GetStringValue(cJSON_GetObjectItem(ctx, "eos_token"));
    int n = 0, bad = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
        const char *src = cJSON_GetStringValue(cJSON_GetObjectItem(c, "template"));
        const cJSON *expected = cJSON_GetObjectItem(c, "expected");
        char err[512], name[64];
        snprintf(name, sizeof(name), "snippet %d", n);
        n++;
        dsq_chat_template_t *t = dsq_chat_template_create(src, strlen(src), err, sizeof(err));
        if (!t) {
            if (expected) {
                print_error("%s: does not load: %s\n  template: %s\n", name, err, src);
                bad++;
            }
            continue;
        }
        if (!check_case(t, name, cJSON_GetObjectItem(ctx, "messages"),
                        cJSON_GetObjectItem(ctx, "tools"),
                        cJSON_IsTrue(cJSON_GetObjectItem(ctx, "add_generation_prompt")),
                        bos, eos, cJSON_GetObjectItem(ctx, "extra"), expected,
                        cJSON_GetObjectItem(c, "error"))) {
            print_error("  template: %s\n", src);
            bad++;
        }
        dsq_chat_template_destroy(t);
    }
    print_message("# snippets: %d/%d match jinja2\n", n - bad, n);
    cJSON_Delete(g);
    assert_true(n > 0);
    assert_int_equal(bad, 0);
}

/* ---- hand-written checks ---- */
static cJSON *one_user(const char *content)
{
    cJSON *m = cJSON_CreateArray();
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", content);
    cJSON_AddItemToArray(m, u);
    return m;
}

/* render src with one user message; returns rc, output in *out (may be NULL) */
static int render_src(const char *src, char **out, char *err, size_t err_len)
{
    dsq_chat_template_t *t = dsq_chat_template_create(src, strlen(src), err, err_len);
    if (!t)
        return 1;
    cJSON *m = one_user("hello");
    char *mj = json_text(m);
    size_t n;
    int rc = dsq_chat_template_render(t, mj, NULL, true, "<s>", NULL, NULL, out, &n,
                                      err, err_len);
    free(mj);
    cJSON_Delete(m);
    dsq_chat_template_destroy(t);
    return rc;
}

static void expect_load_error(const char *src, const char *needle)
{
    char err[256];
    dsq_chat_template_t *t = dsq_chat_template_create(src, strlen(src), err, sizeof(err));
    if (t)
        fail_msg("template loaded but should not: %s", src);
    if (!strstr(err, needle))
        fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
}

static void expect_render_error(const char *src, int code, const char *needle)
{
    char err[256] = "";
    char *out = NULL;
    int rc = render_src(src, &out, err, sizeof(err));
    if (rc == 1)
        fail_msg("template did not load: %s", err);
    if (rc != code)
        fail_msg("rc %d, want %d (err \"%s\") for %.80s", rc, code, err, src);
    assert_null(out);
    if (!strstr(err, needle))
        fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
}

static void test_load_errors(void **state)
{
    (void)state;
    expect_load_error("{{ x | wordwrap }}", "unsupported filter 'wordwrap'");
    expect_load_error("line1\n{{ x is fancy }}", "line 2");
    expect_load_error("{% if x %}abc", "never closed");
    expect_load_error("{% for x in y %}", "endfor");
    expect_load_error("{{ x ", "unterminated");
    expect_load_error("{# open comment", "unterminated comment");
    expect_load_error("{{ 'abc }}", "unterminated string");
    expect_load_error("{% include 'x' %}", "unsupported construct 'include'");
    expect_load_error("{% endif %}", "unexpected 'endif'");
    expect_load_error("{{ a ! b }}", "unexpected character");
    expect_load_error("{{ 99999999999999999999 }}", "too large");
    /* deep nesting: parentheses and blocks */
    size_t n = 5000;
    char *deep = malloc(2 * n + 16);
    assert_non_null(deep);
    memcpy(deep, "{{ ", 3);
    memset(deep + 3, '(', n);
    deep[3 + n] = '1';
    memset(deep + 4 + n, ')', n);
    strcpy(deep + 4 + 2 * n, " }}");
    expect_load_error(deep, "nesting");
    free(deep);
    char *blocks = malloc(n * 20 + 16);
    assert_non_null(blocks);
    blocks[0] = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++)
        o += (size_t)sprintf(blocks + o, "{%% if x %%}");
    expect_load_error(blocks, "nesting");
    free(blocks);
    char err[64];
    assert_null(dsq_chat_template_create(NULL, 0, err, sizeof(err)));
}

static void test_render_errors(void **state)
{
    (void)state;
    expect_render_error("{{ raise_exception('Only user and assistant roles') }}",
                        DSQ_EINVAL, "Only user and assistant roles");
    expect_render_error("{{ nothing.here }}", DSQ_EINVAL, "'nothing' is undefined");
    expect_render_error("{{ messages[0].content + 1 }}", DSQ_EINVAL, "unsupported operand");
    expect_render_error("{{ 1 // 0 }}", DSQ_EINVAL, "division by zero");
    expect_render_error("{{ nope() }}", DSQ_EINVAL, "undefined");
    /* limits */
    expect_render_error("{% for i in range(100000000000) %}{% endfor %}", DSQ_ERANGE, "step limit");
    expect_render_error("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
                        "{% endfor %}{% endfor %}{% endfor %}", DSQ_ERANGE, "limit");
    expect_render_error("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", DSQ_ERANGE, "deeper");
    expect_render_error("{% set ns = namespace(s='xy') %}{% for i in range(60) %}"
                        "{% set ns.s = ns.s + ns.s %}{% endfor %}", DSQ_ERANGE, "");
    expect_render_error("{{ 'ab' * 100000000000 }}", DSQ_ERANGE, "too long");
    expect_render_error("{{ 2 ** 200 }}", DSQ_ERANGE, "overflow");
    expect_render_error("{% for i in range(500000) %}{{ 'abcdefghijklmnopqrstuvwxyz0123456789' }}{% endfor %}",
                        DSQ_ERANGE, "limit");
    /* bad arguments */
    dsq_chat_template_t *t = dsq_chat_template_create("x", 1, NULL, 0);
    assert_non_null(t);
    char *out = (char *)1;
    size_t n;
    char err[128];
    cJSON *obj = cJSON_CreateObject();
    char *oj = json_text(obj);
    assert_int_equal(dsq_chat_template_render(t, oj, NULL, false, NULL, NULL, NULL, &out, &n,
                                              err, sizeof(err)), DSQ_EINVAL);
    assert_null(out);
    assert_int_equal(dsq_chat_template_render(t, NULL, NULL, false, NULL, NULL, NULL, &out, &n,
                                              err, sizeof(err)), DSQ_EINVAL);
    free(oj);
    cJSON_Delete(obj);
    dsq_chat_template_destroy(t);
    dsq_chat_template_destroy(NULL);
}

static void test_basic_render(void **state)
{
    (void)state;
    char err[256], *out = NULL;
    /* trim_blocks + lstrip_blocks + "-" markers, a trailing newline dropped */
    assert_int_equal(render_src("{{ bos_token }}\n  {% for m in messages %}\n"
                                "[{{ m.role|upper }}] {{- ' ' ~ m['content'] }}\n"
                                "  {% endfor %}\n{% if add_generation_prompt %}GEN{% endif %}\n",
                                &out, err, sizeof(err)), 0);
    assert_string_equal(out, "<s>\n[USER] hello\nGEN");
    free(out);
    assert_int_equal(render_src("{{ eos_token is defined }} {{ tools is none }} {{ 7 // 2 }}"
                                " {{ '%d'|length }} {{ 1.0 }} {{ [1, 'a']|tojson }}",
                                &out, err, sizeof(err)), 0);
    assert_string_equal(out, "False True 3 2 1.0 [1, \"a\"]");
    free(out);
}

/* random byte mutations of a real template: any outcome but a crash/hang */
static void test_mutations(void **state)
{
    (void)state;
    char *path = env_path("DSQ_TEST_DATA", "tokenizers/chat_templates/llama-cpp-deepseek-r1.jinja");
    size_t n = 0;
    char *src = slurp(path, &n);
    if (!src)
        fail_msg("missing test data file %s", path);
    const char alphabet[] = "{}%#-+()[]'\"|.,:~=<>!*/ \nabcdefinorst0123456789_\\";
    cJSON *m = one_user("hi");
    char *mj = json_text(m);
    uint64_t seed = 0x9E3779B97F4A7C15ull;
    int loaded = 0;
    char *buf = malloc(n + 1);
    assert_non_null(buf);
    for (int it = 0; it < 400; it++) {
        memcpy(buf, src, n);
        int k = 1 + it % 6;
        for (int j = 0; j < k; j++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(seed >> 33) % n;
            buf[pos] = alphabet[(seed >> 13) % (sizeof(alphabet) - 1)];
        }
        char err[256];
        dsq_chat_template_t *t = dsq_chat_template_create(buf, n, err, sizeof(err));
        if (!t)
            continue;
        loaded++;
        char *out = NULL;
        size_t on;
        int rc = dsq_chat_template_render(t, mj, NULL, true, "<s>", "</s>", NULL, &out, &on,
                                          err, sizeof(err));
        assert_true(rc == 0 ? out != NULL : out == NULL);
        free(out);
        dsq_chat_template_destroy(t);
    }
    print_message("# mutations: %d/400 still loaded\n", loaded);
    free(mj);
    cJSON_Delete(m);
    free(buf);
    free(src);
    free(path);
}

typedef struct {
    const dsq_chat_template_t *t;
    const char *want;
    int bad;
} thr_arg_t;

static void *render_thread(void *p)
{
    thr_arg_t *a = p;
    cJSON *m = one_user("concurrent ✓");
    char *mj = json_text(m);
    for (int i = 0; i < 200; i++) {
        char *out = NULL, err[128];
        size_t n;
        if (dsq_chat_template_render(a->t, mj, NULL, true, NULL, NULL, NULL, &out, &n, err,
                                     sizeof(err)) != 0 || strcmp(out, a->want) != 0)
            a->bad++;
        free(out);
    }
    free(mj);
    cJSON_Delete(m);
    return NULL;
}

static void test_threads(void **state)
{
    (void)state;
    const char *src = "{% set ns = namespace(k=0) %}{% for m in messages %}"
                      "{% set ns.k = ns.k + 1 %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ ns.k }}";
    dsq_chat_template_t *t = dsq_chat_template_create(src, strlen(src), NULL, 0);
    assert_non_null(t);
    thr_arg_t args[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg_t){t, "<user>concurrent ✓1", 0};
        assert_int_equal(pthread_create(&th[i], NULL, render_thread, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    dsq_chat_template_destroy(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_qwen25),
        cmocka_unit_test(test_golden_r1_distill),
        cmocka_unit_test(test_golden_llama_cpp_r1),
        cmocka_unit_test(test_golden_deepseek_v3),
        cmocka_unit_test(test_golden_qwen3),
        cmocka_unit_test(test_golden_smollm2),
        cmocka_unit_test(test_snippets),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_render_errors),
        cmocka_unit_test(test_basic_render),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
