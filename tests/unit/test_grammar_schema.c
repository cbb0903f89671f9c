/* tests for engine/text/grammar_schema.c and grammar_regex.c: JSON
 * Schema and regexes turned into GBNF, compiled and matched (grammar.h).
 *
 *  - Against independent references: tests/golden/schema_cases.jsonl
 *    (tests/ref/make_schema_golden.py) gives, per schema, instances
 *    Python's jsonschema (Draft 2020-12, FormatChecker) found valid that
 *    the grammar must accept ("ok"), and others with jsonschema's verdict:
 *    any of them the grammar accepts must be valid (the grammar may be
 *    narrower than the schema, never wider). Per regex, strings with
 *    re.fullmatch's verdict, which the grammar must equal exactly.
 *  - The official JSON-Schema-Test-Suite (draft 2020-12, fetched by
 *    tests/ref/fetch_schema_suite.py into $DSQ_MODELS_DIR/jsonschema-suite):
 *    every schema is either refused with DSQ_EUNSUPPORTED / DSQ_EINVAL or
 *    compiles, and then no instance the suite calls invalid is accepted
 *    and at least the instances in the grammar's own form (compact, keys in
 *    the schema's order) that it calls valid are counted.
 *  - Unsupported keywords and malformed schemas or regexes: the error code
 *    and a message naming the keyword and where it is.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "engine/text/grammar.h"
#include "test_common.h"

static bool sentence(const dsq_grammar_t *g, const char *s)
{
    dsq_grammar_matcher_t *m = dsq_grammar_matcher_create(g);
    assert_non_null(m);
    bool ok = dsq_grammar_matcher_accept_bytes(m, s, strlen(s)) == DSQ_OK &&
              dsq_grammar_matcher_can_end(m);
    dsq_grammar_matcher_free(m);
    return ok;
}

static dsq_grammar_t *compile_gbnf(char *gbnf, const char *what)
{
    char err[256];
    dsq_grammar_t *g = NULL;
    int rc = dsq_grammar_from_gbnf(gbnf, strlen(gbnf), NULL, &g, err, sizeof(err));
    if (rc)
        fail_msg("%s: the GBNF did not compile: %s\n%s", what, err, gbnf);
    free(gbnf);
    return g;
}

static char *exact_json(const cJSON *v);

static void test_golden(void **state)
{
    (void)state;
    char *path = path_join("DSQ_SOURCE_ROOT", ".", "tests/golden/schema_cases.jsonl");
    char *text = read_all(path, NULL);
    free(path);
    int n_schemas = 0, n_regexes = 0, n_ok = 0, n_other = 0, n_rejected_invalid = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#')
            continue;
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        char err[256] = "", *gbnf = NULL;
        const cJSON *schema = cJSON_GetObjectItem(o, "schema");
        if (schema) {
            char *stxt = cJSON_PrintUnformatted(schema);
            char *sj = exact_json(schema);
            int rc = dsq_grammar_gbnf_from_json_schema(sj, strlen(sj), &gbnf, err, sizeof(err));
            free(sj);
            if (rc)
                fail_msg("schema %s: %s", stxt, err);
            dsq_grammar_t *g = compile_gbnf(gbnf, stxt);
            const cJSON *t;
            cJSON_ArrayForEach(t, cJSON_GetObjectItem(o, "ok")) {
                if (!sentence(g, t->valuestring))
                    fail_msg("schema %s: valid instance %s rejected", stxt, t->valuestring);
                n_ok++;
            }
            const cJSON *valid = cJSON_GetObjectItem(o, "valid");
            int i = 0;
            cJSON_ArrayForEach(t, cJSON_GetObjectItem(o, "other")) {
                bool v = cJSON_IsTrue(cJSON_GetArrayItem(valid, i++));
                bool acc = sentence(g, t->valuestring);
                if (acc && !v)
                    fail_msg("schema %s: accepts %s, which jsonschema says is invalid", stxt,
                             t->valuestring);
                n_rejected_invalid += !v;
                n_other++;
            }
            dsq_grammar_free(g);
            free(stxt);
            n_schemas++;
        } else {
            const char *rx = cJSON_GetObjectItem(o, "regex")->valuestring;
            int rc = dsq_grammar_gbnf_from_regex(rx, strlen(rx), &gbnf, err, sizeof(err));
            if (rc)
                fail_msg("regex %s: %s", rx, err);
            dsq_grammar_t *g = compile_gbnf(gbnf, rx);
            const cJSON *match = cJSON_GetObjectItem(o, "match");
            int i = 0;
            const cJSON *t;
            cJSON_ArrayForEach(t, cJSON_GetObjectItem(o, "strings")) {
                bool want = cJSON_IsTrue(cJSON_GetArrayItem(match, i++));
                if (sentence(g, t->valuestring) != want)
                    fail_msg("regex /%s/: \"%s\": re.fullmatch says %s", rx, t->valuestring,
                             want ? "match" : "no match");
            }
            dsq_grammar_free(g);
            n_regexes++;
        }
        cJSON_Delete(o);
    }
    free(text);
    print_message("# %d schemas: %d valid instances accepted, %d others (%d invalid, all "
                  "rejected); %d regexes agree with re.fullmatch\n",
                  n_schemas, n_ok, n_other, n_rejected_invalid, n_regexes);
    assert_true(n_schemas >= 30 && n_regexes >= 10 && n_rejected_invalid >= 50);
}

/* v as compact JSON, numbers exact (cJSON's printer rounds doubles that
 * are within an epsilon of a 15-digit form). */
static void print_exact(const cJSON *v, char **buf, size_t *len, size_t *cap)
{
    char tmp[48];
    const char *piece = tmp;
    char *owned = NULL;
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        bool obj = cJSON_IsObject(v);
        print_exact(NULL, buf, len, cap);   /* ensure capacity */
        *len += (size_t)sprintf(*buf + *len, "%c", obj ? '{' : '[');
        int i = 0;
        for (const cJSON *e = v->child; e; e = e->next) {
            if (i++)
                print_exact(NULL, buf, len, cap), *len += (size_t)sprintf(*buf + *len, ",");
            if (obj) {
                cJSON *k = cJSON_CreateString(e->string);
                char *kt = cJSON_PrintUnformatted(k);
                cJSON_Delete(k);
                size_t kl = strlen(kt);
                while (*len + kl + 2 >= *cap)
                    *buf = realloc(*buf, *cap *= 2);
                memcpy(*buf + *len, kt, kl);
                *len += kl;
                (*buf)[(*len)++] = ':';
                (*buf)[*len] = 0;
                free(kt);
            }
            print_exact(e, buf, len, cap);
        }
        print_exact(NULL, buf, len, cap);
        *len += (size_t)sprintf(*buf + *len, "%c", obj ? '}' : ']');
        return;
    }
    if (!v) {
        tmp[0] = 0;
    } else if (cJSON_IsNumber(v)) {
        for (int prec = 15; prec <= 17; prec++) {
            snprintf(tmp, sizeof(tmp), "%.*g", prec, v->valuedouble);
            if (strtod(tmp, NULL) == v->valuedouble)
                break;
        }
    } else {
        piece = owned = cJSON_PrintUnformatted(v);
    }
    size_t pl = strlen(piece);
    while (*len + pl + 8 >= *cap)
        *buf = realloc(*buf, *cap *= 2);
    memcpy(*buf + *len, piece, pl + 1);
    *len += pl;
    free(owned);
}

static char *exact_json(const cJSON *v)
{
    size_t len = 0, cap = 64;
    char *buf = malloc(cap);
    buf[0] = 0;
    print_exact(v, &buf, &len, &cap);
    return buf;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void test_official_suite(void **state)
{
    (void)state;
    char *dir = path_join("DSQ_MODELS_DIR", "models", "jsonschema-suite");
    char *probe = path_join("DSQ_MODELS_DIR", "models", "jsonschema-suite/type.json");
    require_file_hint(probe, "tests/ref/fetch_schema_suite.py (scripts/test runs it)");
    free(probe);
    DIR *d = opendir(dir);
    assert_non_null(d);
    char *names[128];
    int n_files = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n_files < 128) {
        size_t l = strlen(de->d_name);
        if (l > 5 && !strcmp(de->d_name + l - 5, ".json"))
            names[n_files++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n_files, sizeof(names[0]), name_cmp);
    int n_schemas = 0, n_ok = 0, n_refused = 0, n_inst = 0, n_acc = 0, n_rej_invalid = 0;
    for (int fi = 0; fi < n_files; fi++) {
        char path[2048];
        snprintf(path, sizeof(path), "%s/%s", dir, names[fi]);
        char *text = read_all(path, NULL);
        cJSON *groups = cJSON_Parse(text);
        free(text);
        assert_non_null(groups);
        const cJSON *g;
        cJSON_ArrayForEach(g, groups) {
            const cJSON *schema = cJSON_GetObjectItem(g, "schema");
            const char *desc = cJSON_GetObjectItem(g, "description")->valuestring;
            char err[320] = "", *gbnf = NULL;
            n_schemas++;
            char *sj = exact_json(schema);
            int rc = dsq_grammar_gbnf_from_json_schema(sj, strlen(sj), &gbnf, err, sizeof(err));
            free(sj);
            if (rc) {
                if (rc != DSQ_EUNSUPPORTED && rc != DSQ_EINVAL)
                    fail_msg("%s: %s: error %d: %s", names[fi], desc, rc, err);
                n_refused++;
                continue;
            }
            dsq_grammar_t *gr = NULL;
            rc = dsq_grammar_from_gbnf(gbnf, strlen(gbnf), NULL, &gr, err, sizeof(err));
            if (rc)
                fail_msg("%s: %s: the GBNF did not compile: %s\n%s", names[fi], desc, err, gbnf);
            free(gbnf);
            n_ok++;
            const cJSON *t;
            cJSON_ArrayForEach(t, cJSON_GetObjectItem(g, "tests")) {
                char *inst = exact_json(cJSON_GetObjectItem(t, "data"));
                bool valid = cJSON_IsTrue(cJSON_GetObjectItem(t, "valid"));
                bool acc = sentence(gr, inst);
                if (acc && !valid)
                    fail_msg("%s: %s: accepts %s, which the suite calls invalid (\"%s\")",
                             names[fi], desc, inst,
                             cJSON_GetObjectItem(t, "description")->valuestring);
                n_inst++;
                n_acc += acc;
                n_rej_invalid += !valid;
                free(inst);
            }
            dsq_grammar_free(gr);
        }
        cJSON_Delete(groups);
        free(names[fi]);
    }
    free(dir);
    print_message("# official suite: %d files, %d schemas: %d compiled, %d refused; %d instances, "
                  "%d accepted (all valid), %d invalid ones all rejected\n",
                  n_files, n_schemas, n_ok, n_refused, n_inst, n_acc, n_rej_invalid);
    assert_true(n_files >= 40 && n_ok >= 100 && n_acc >= 100);
}

static void test_unsupported_schemas(void **state)
{
    (void)state;
    static const struct {
        const char *schema;
        int rc;
        const char *msg;
    } bad[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"not\":{}}}}",
         DSQ_EUNSUPPORTED, "the keyword 'not' is not supported (at /properties/a)"},
        {"{\"patternProperties\":{}}", DSQ_EUNSUPPORTED, "'patternProperties'"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", DSQ_EUNSUPPORTED, "'uniqueItems'"},
        {"{\"type\":\"array\",\"items\":{\"minimum\":1.5}}", DSQ_EUNSUPPORTED,
         "'minimum' 1.5 on a number"},
        {"{\"type\":\"number\",\"exclusiveMaximum\":3}", DSQ_EUNSUPPORTED, "'exclusiveMaximum'"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", DSQ_EUNSUPPORTED,
         "'format' \"hostname\""},
        {"{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", DSQ_EUNSUPPORTED, "backreferences"},
        {"{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", DSQ_EUNSUPPORTED, "lookaround"},
        {"{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", DSQ_EUNSUPPORTED,
         "minLength/maxLength"},
        {"{\"$ref\":\"https://example.com/s.json\"}", DSQ_EUNSUPPORTED, "'$ref'"},
        {"{\"$ref\":\"#/$defs/missing\"}", DSQ_EUNSUPPORTED, "that exist"},
        {"{\"type\":\"integer\",\"anyOf\":[{\"minimum\":1}]}", DSQ_EUNSUPPORTED,
         "'type' beside 'anyOf'"},
        {"{\"oneOf\":[{\"type\":\"integer\"},{\"type\":\"number\"}]}", DSQ_EUNSUPPORTED,
         "may overlap"},
        {"{\"allOf\":[{\"type\":\"integer\"},{\"minimum\":1}]}", DSQ_EUNSUPPORTED,
         "'allOf' of more than one"},
        {"{\"enum\":[1,2],\"minimum\":2}", DSQ_EUNSUPPORTED, "'minimum' beside 'enum'"},
        {"{\"type\":\"array\",\"maxItems\":5000}", DSQ_EUNSUPPORTED, "'maxItems' above 1024"},
        {"{\"type\":\"integer\",\"minimum\":1e20}", DSQ_EUNSUPPORTED, "beyond +-1e15"},
        {"false", DSQ_EUNSUPPORTED, "no instance is valid"},
        {"{\"type\":\"strin\"}", DSQ_EINVAL, "'type' must be one of"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", DSQ_EINVAL,
         "no integer lies within"},
        {"{\"type\":\"string\",\"minLength\":3,\"maxLength\":2}", DSQ_EINVAL,
         "maxLength 2 is below minLength 3"},
        {"{\"enum\":[]}", DSQ_EINVAL, "non-empty array"},
        {"{\"type\":\"string\",\"enum\":[1,2]}", DSQ_EINVAL, "no 'enum' value"},
        {"{\"properties\":{\"a\":3}}", DSQ_EINVAL, "an object or a boolean (at /properties/a)"},
        {"{\"required\":\"a\"}", DSQ_EINVAL, "'required' must be an array"},
        /* JSON Schema: the items of type and required are unique */
        {"{\"type\":[\"string\",\"string\"]}", DSQ_EINVAL, "'type' lists 'string' twice"},
        {"{\"type\":\"object\",\"required\":[\"a\",\"a\"]}", DSQ_EINVAL,
         "'required' lists 'a' twice (at the root)"},
        {"{\"properties\":{\"a\":{}},\"required\":[\"a\",\"a\"]}", DSQ_EINVAL,
         "'required' lists 'a' twice"},
        /* a required name that additionalProperties false forbids: no
         * instance is valid (the grammar wrote it all the same) */
        {"{\"type\":\"object\",\"required\":[\"zz\"],\"additionalProperties\":false}",
         DSQ_EINVAL, "required property 'zz' is forbidden by additionalProperties: false "
         "(at the root)"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
         "\"required\":[\"a\",\"zz\"],\"additionalProperties\":false}", DSQ_EINVAL,
         "required property 'zz' is forbidden"},
        {"{\"properties\":{\"o\":{\"required\":[\"q\"],\"additionalProperties\":false}}}",
         DSQ_EINVAL, "required property 'q' is forbidden by additionalProperties: false "
         "(at /properties/o)"},
        /* the value of a required name not declared is additionalProperties' */
        {"{\"required\":[\"zz\"],\"additionalProperties\":{\"not\":{}}}", DSQ_EUNSUPPORTED,
         "'not' is not supported (at /additionalProperties)"},
        {"3", DSQ_EINVAL, "an object or a boolean"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cJSON *s = cJSON_Parse(bad[i].schema);
        assert_non_null(s);
        char err[256] = "", *gbnf = NULL;
        int rc = dsq_grammar_gbnf_from_json_schema(bad[i].schema, strlen(bad[i].schema), &gbnf,
                                                   err, sizeof(err));
        if (rc != bad[i].rc || !strstr(err, bad[i].msg))
            fail_msg("%s: got %d \"%s\", want %d with \"%s\"", bad[i].schema, rc, err,
                     bad[i].rc, bad[i].msg);
        assert_null(gbnf);
        cJSON_Delete(s);
    }
    /* a deep nest is refused, not a stack overflow */
    char deep[4096] = "";
    for (int i = 0; i < 200; i++)
        strcat(deep, "{\"items\":");
    strcat(deep, "{}");
    for (int i = 0; i < 200; i++)
        strcat(deep, "}");
    cJSON *s = cJSON_Parse(deep);
    assert_non_null(s);
    char err[256], *gbnf = NULL;
    assert_int_equal(dsq_grammar_gbnf_from_json_schema(deep, strlen(deep), &gbnf, err,
                                                       sizeof(err)),
                     DSQ_ERANGE);
    assert_non_null(strstr(err, "nested deeper"));
    cJSON_Delete(s);
}

static void test_bad_regexes(void **state)
{
    (void)state;
    static const struct {
        const char *re;
        int rc;
        const char *msg;
    } bad[] = {
        {"(ab", DSQ_EINVAL, "unterminated ("},
        {"ab)", DSQ_EINVAL, "unmatched )"},
        {"[ab", DSQ_EINVAL, "unterminated ["},
        {"*a", DSQ_EINVAL, "nothing to repeat"},
        {"a**", DSQ_EINVAL, "quantifier follows"},
        {"[z-a]", DSQ_EINVAL, "out of order"},
        {"a{3,2}", DSQ_EINVAL, "out of order"},
        {"a{2000}", DSQ_ERANGE, "above 1024"},
        {"a\\", DSQ_EINVAL, "trailing backslash"},
        {"\\x4", DSQ_EINVAL, "hex digits"},
        {"(a)\\1", DSQ_EUNSUPPORTED, "backreferences"},
        /* 40 nested groups crashed an HTTP worker (stack) before the limit */
        {"((((((((((((((((((((((((((((((((((((((((a))))))))))))))))))))))))))))))))))))))))",
         DSQ_ERANGE, "nested too deep"},
        {"\\bword", DSQ_EUNSUPPORTED, "anchor"},
        {"a(?!b)", DSQ_EUNSUPPORTED, "lookaround"},
        {"(?i)a", DSQ_EUNSUPPORTED, "inline flags"},
        {"a++", DSQ_EUNSUPPORTED, "possessive"},
        {"a^b", DSQ_EUNSUPPORTED, "only at the start"},
        {"a$b", DSQ_EUNSUPPORTED, "only at the start"},
        {"[[:alpha:]]", DSQ_EUNSUPPORTED, "POSIX"},
        {"\\p{L}", DSQ_EUNSUPPORTED, "\\p"},
        {"\xff", DSQ_EINVAL, "UTF-8"},
        /* Python's re: "multiple repeat", "bad character range" */
        {"a{3}{2}", DSQ_EINVAL, "quantifier follows"},
        {"a*{,2}", DSQ_EINVAL, "quantifier follows"},
        {"[\\d-z]", DSQ_EINVAL, "class shorthand"},
        /* a NUL cannot be generated; dropping it would change the language */
        {"a\\x00b", DSQ_EUNSUPPORTED, "NUL"},
        {"[\\u0000]", DSQ_EUNSUPPORTED, "NUL"},
        /* Python's re: "redefinition of group name", "bad character in
         * group name", "missing group name" */
        {"(?P<x>a)(?P<x>b)", DSQ_EINVAL, "redefinition of group name 'x'"},
        {"(?<x>a)|(?<x>b)", DSQ_EINVAL, "redefinition of group name 'x'"},
        {"(?P<x>(?P<x>a))", DSQ_EINVAL, "redefinition of group name 'x'"},
        {"(?P<1>a)", DSQ_EINVAL, "identifier"},
        {"(?P<>a)", DSQ_EINVAL, "identifier"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "", *gbnf = NULL;
        int rc = dsq_grammar_gbnf_from_regex(bad[i].re, strlen(bad[i].re), &gbnf, err,
                                             sizeof(err));
        if (rc != bad[i].rc || !strstr(err, bad[i].msg))
            fail_msg("/%s/: got %d \"%s\", want %d with \"%s\"", bad[i].re, rc, err, bad[i].rc,
                     bad[i].msg);
        assert_null(gbnf);
    }
}

/* A repetition of what can match the empty string ((a*)*, (a?)+, (a|)*)
 * is a valid regex: it compiles, and its language is re.fullmatch's. The
 * verdicts (one digit per string of strs, 1 = match) were written from
 * Python 3's re.fullmatch. */
static void test_nullable_repetitions(void **state)
{
    (void)state;
    static const char *const strs[] = {"", "a", "b", "c", "x", "ab", "aab", "ba", "abc", "bbc",
                                       "aac", "aaac", "aaaac", "xx", "aabbc", "cc", "abab",
                                       "abcab", "bb"};
    static const struct {
        const char *re, *match;
    } cases[] = {
        {"(a*)*b", "0010011000000000000"},
        {"(a?)+b", "0010011000000000000"},
        {"(a|)*", "1100000000000000000"},
        {"(a*|b)*c", "0001000011111010000"},
        {"((a?)(b?))*", "1110011100000000101"},
        {"(a?){2,3}c", "0001000000110000000"},
        {"(|)*x", "0000100000000000000"},
        {"(a{0})*b", "0010000000000000000"},
        {"(?:a*b*)+", "1110011100000000101"},
        {"((a|)(|b))+c", "0001000011111010000"},
        {"(x?)*", "1000100000000100000"},
        {"(a?b?)?c", "0001000010000000000"},
        {"((a*)?){3}", "1100000000000000000"},
        {"(ab|(c?))+", "1001010010000001110"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[256] = "", *gbnf = NULL;
        int rc = dsq_grammar_gbnf_from_regex(cases[i].re, strlen(cases[i].re), &gbnf, err,
                                             sizeof(err));
        if (rc)
            fail_msg("/%s/: %s", cases[i].re, err);
        dsq_grammar_t *g = compile_gbnf(gbnf, cases[i].re);
        for (size_t k = 0; k < sizeof(strs) / sizeof(strs[0]); k++)
            if (sentence(g, strs[k]) != (cases[i].match[k] == '1'))
                fail_msg("/%s/: \"%s\": re.fullmatch says %s", cases[i].re, strs[k],
                         cases[i].match[k] == '1' ? "match" : "no match");
        dsq_grammar_free(g);
    }
    /* inside a schema too (pattern is a search there: anchored here) */
    const char *stext = "{\"type\":\"string\",\"pattern\":\"^(a|)*$\"}";
    cJSON *s = cJSON_Parse(stext);
    assert_non_null(s);
    char err[256] = "", *gbnf = NULL;
    if (dsq_grammar_gbnf_from_json_schema(stext, strlen(stext), &gbnf, err, sizeof(err)))
        fail_msg("pattern ^(a|)*$: %s", err);
    dsq_grammar_t *g = compile_gbnf(gbnf, "pattern ^(a|)*$");
    assert_true(sentence(g, "\"\""));
    assert_true(sentence(g, "\"aaa\""));
    assert_false(sentence(g, "\"ab\""));
    dsq_grammar_free(g);
    cJSON_Delete(s);
}

/* A required name that properties does not declare is an additional
 * property: its value is one of additionalProperties (any value when that
 * is absent or true). */
static void test_required_undeclared(void **state)
{
    (void)state;
    static const struct {
        const char *schema;
        const char *yes[3], *no[3];
    } cases[] = {
        {"{\"required\":[\"zz\"],\"additionalProperties\":{\"type\":\"integer\"}}",
         {"{\"zz\":1}", "{\"zz\":-20}", NULL}, {"{\"zz\":\"x\"}", "{}", "{\"zz\":1.5}"}},
        {"{\"properties\":{\"a\":{\"type\":\"boolean\"}},\"required\":[\"zz\"],"
         "\"additionalProperties\":{\"type\":\"string\"}}",
         {"{\"a\":true,\"zz\":\"x\"}", "{\"zz\":\"\"}", NULL}, {"{\"zz\":1}", "{\"a\":true}", NULL}},
        {"{\"type\":\"object\",\"required\":[\"zz\"]}", {"{\"zz\":[1]}", "{\"zz\":null}", NULL},
         {"{}", NULL, NULL}},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cJSON *s = cJSON_Parse(cases[i].schema);
        assert_non_null(s);
        char err[256] = "", *gbnf = NULL;
        if (dsq_grammar_gbnf_from_json_schema(cases[i].schema, strlen(cases[i].schema), &gbnf,
                                              err, sizeof(err)))
            fail_msg("%s: %s", cases[i].schema, err);
        dsq_grammar_t *g = compile_gbnf(gbnf, cases[i].schema);
        for (int k = 0; k < 3; k++) {
            if (cases[i].yes[k] && !sentence(g, cases[i].yes[k]))
                fail_msg("%s: valid %s rejected", cases[i].schema, cases[i].yes[k]);
            if (cases[i].no[k] && sentence(g, cases[i].no[k]))
                fail_msg("%s: invalid %s accepted", cases[i].schema, cases[i].no[k]);
        }
        dsq_grammar_free(g);
        cJSON_Delete(s);
    }
}

/* The schema arrives as JSON text: text that is not one JSON value is
 * refused with the byte the parse stopped at; the length bounds the
 * text (no NUL needed), and whitespace may surround the value. */
static void test_schema_text(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        const char *msg;
    } bad[] = {
        {"", "not JSON text (the parse stopped at byte 0)"},
        {"{\"type\":", "not JSON text"},
        {"{\"type\":\"integer\"} x", "not JSON text (the parse stopped at byte 19)"},
        {"{\"type\":\"integer\"}{}", "not JSON text (the parse stopped at byte 18)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[256] = "", *gbnf = NULL;
        int rc = dsq_grammar_gbnf_from_json_schema(bad[i].text, strlen(bad[i].text), &gbnf, err,
                                                   sizeof(err));
        if (rc != DSQ_EINVAL || !strstr(err, bad[i].msg))
            fail_msg("'%s': got %d \"%s\", want %d with \"%s\"", bad[i].text, rc, err,
                     DSQ_EINVAL, bad[i].msg);
        assert_null(gbnf);
    }
    /* 6 bytes of a longer buffer, whitespace around the value */
    char err[256] = "", *gbnf = NULL;
    assert_int_equal(dsq_grammar_gbnf_from_json_schema(" true \"junk", 6, &gbnf, err,
                                                       sizeof(err)), DSQ_OK);
    dsq_grammar_t *g = compile_gbnf(gbnf, "true");
    assert_true(sentence(g, "[1, {\"a\": null}]"));
    dsq_grammar_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),
        cmocka_unit_test(test_official_suite),
        cmocka_unit_test(test_unsupported_schemas),
        cmocka_unit_test(test_bad_regexes),
        cmocka_unit_test(test_nullable_repetitions),
        cmocka_unit_test(test_required_undeclared),
        cmocka_unit_test(test_schema_text),
    };
    return cmocka_run_group_tests_name("grammar_schema", tests, NULL, NULL);
}
