/* Tool-call parsers (tool_calls.h): the DeepSeek and Hermes formats. */
#include "tool_calls.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"

#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END   "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN  "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END    "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP         "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"
#define HM_BEGIN       "<tool_call>"
#define HM_END         "</tool_call>"

static const char *find(const char *s, const char *end, const char *pat)
{
    size_t n = strlen(pat);
    if ((size_t)(end - s) < n)
        return NULL;
    for (const char *p = s; p + n <= end; p++)
        if (*p == pat[0] && !memcmp(p, pat, n))
            return p;
    return NULL;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

static void trim(const char **a, const char **b)
{
    while (*a < *b && is_ws(**a))
        (*a)++;
    while (*b > *a && is_ws((*b)[-1]))
        (*b)--;
}

static char *dup_range(const char *a, const char *b)
{
    char *s = malloc((size_t)(b - a) + 1);
    if (s) {
        memcpy(s, a, (size_t)(b - a));
        s[b - a] = 0;
    }
    return s;
}

/* a..b is exactly one JSON object (whitespace around it allowed) */
static bool is_json_object(const char *a, const char *b)
{
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(a, (size_t)(b - a), &end, false);
    bool ok = j && cJSON_IsObject(j);
    cJSON_Delete(j);
    if (!ok)
        return false;
    while (end < b && is_ws(*end))
        end++;
    return end == b;
}

/* In the JSON object text a..b, the raw span of the value of top-level key
 * `key` (the object is already known to be valid JSON). */
static bool raw_value(const char *a, const char *b, const char *key, const char **va,
                      const char **vb)
{
    int depth = 0;
    size_t kl = strlen(key);
    for (const char *p = a; p < b; p++) {
        if (*p == '"') {
            const char *s = ++p;
            while (p < b && *p != '"')
                p += *p == '\\' ? 2 : 1;
            if (p >= b)
                return false;
            const char *q = p + 1;
            while (q < b && is_ws(*q))
                q++;
            if (depth == 1 && q < b && *q == ':' && (size_t)(p - s) == kl &&
                !memcmp(s, key, kl)) {
                q++;
                while (q < b && is_ws(*q))
                    q++;
                /* the value: up to the comma or brace that closes it */
                const char *v = q;
                int d = 0;
                for (; q < b; q++) {
                    if (*q == '"') {
                        q++;
                        while (q < b && *q != '"')
                            q += *q == '\\' ? 2 : 1;
                    } else if (*q == '{' || *q == '[') {
                        d++;
                    } else if (*q == '}' || *q == ']') {
                        if (d == 0)
                            break;
                        d--;
                    } else if (*q == ',' && d == 0) {
                        break;
                    }
                }
                *va = v;
                *vb = q;
                trim(va, vb);
                return true;
            }
        } else if (*p == '{' || *p == '[') {
            depth++;
        } else if (*p == '}' || *p == ']') {
            depth--;
        }
    }
    return false;
}

typedef struct acc {
    dsq_tool_call_t *calls;
    int n, cap;
    bool oom;
} acc_t;

static void add_call(acc_t *c, const char *na, const char *nb, const char *aa, const char *ab)
{
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 4;
        dsq_tool_call_t *p = realloc(c->calls, (size_t)cap * sizeof(*p));
        if (!p) {
            c->oom = true;
            return;
        }
        c->calls = p;
        c->cap = cap;
    }
    char *n = dup_range(na, nb), *a = dup_range(aa, ab);
    if (!n || !a) {
        free(n);
        free(a);
        c->oom = true;
        return;
    }
    c->calls[c->n++] = (dsq_tool_call_t){n, a};
}

/* DeepSeek: calls from p on; returns where the last one ended, or NULL
 * when malformed. */
static const char *parse_deepseek(const char *p, const char *end, acc_t *c)
{
    const char *last = NULL;
    for (;;) {
        const char *cb = find(p, end, DS_CALL_BEGIN);
        if (!cb)
            break;
        /* between calls only whitespace (or the calls_begin marker) */
        const char *gap_a = p, *gap_b = cb;
        const char *mb = find(gap_a, gap_b, DS_CALLS_BEGIN);
        if (mb)
            gap_a = mb + strlen(DS_CALLS_BEGIN);
        trim(&gap_a, &gap_b);
        if (last && gap_a != gap_b)
            return NULL;
        const char *h = cb + strlen(DS_CALL_BEGIN);
        const char *ce = find(h, end, DS_CALL_END);
        const char *sep = find(h, ce ? ce : end, DS_SEP);
        if (!ce || !sep)
            return NULL;
        const char *x = h, *xe = sep;
        trim(&x, &xe);
        const char *body = sep + strlen(DS_SEP), *be = ce;
        const char *na, *nb, *aa, *ab;
        if ((size_t)(xe - x) == 8 && !memcmp(x, "function", 8)) {
            /* V2.5 / V3: NAME \n ```json \n ARGS \n ``` */
            const char *nl = memchr(body, '\n', (size_t)(be - body));
            if (!nl)
                return NULL;
            na = body;
            nb = nl;
            aa = nl + 1;
            ab = be;
            trim(&aa, &ab);
            if ((size_t)(ab - aa) >= 7 && !memcmp(aa, "```json", 7))
                aa += 7;
            else if ((size_t)(ab - aa) >= 3 && !memcmp(aa, "```", 3))
                aa += 3;
            if (ab - aa >= 3 && !memcmp(ab - 3, "```", 3))
                ab -= 3;
        } else {
            /* V3.1: NAME <sep> ARGS */
            na = x;
            nb = xe;
            aa = body;
            ab = be;
        }
        trim(&na, &nb);
        trim(&aa, &ab);
        if (na == nb || !is_json_object(aa, ab))
            return NULL;
        add_call(c, na, nb, aa, ab);
        p = last = ce + strlen(DS_CALL_END);
    }
    if (!last)
        return NULL;
    const char *q = last;
    while (q < end && is_ws(*q))
        q++;
    if ((size_t)(end - q) >= strlen(DS_CALLS_END) && !memcmp(q, DS_CALLS_END, strlen(DS_CALLS_END)))
        last = q + strlen(DS_CALLS_END);
    return last;
}

static const char *parse_hermes(const char *p, const char *end, acc_t *c)
{
    const char *last = NULL;
    for (;;) {
        const char *b = find(p, end, HM_BEGIN);
        if (!b)
            break;
        const char *g = p, *ge = b;
        trim(&g, &ge);
        if (last && g != ge)
            return NULL;
        const char *body = b + strlen(HM_BEGIN);
        const char *e = find(body, end, HM_END);
        if (!e)
            return NULL;
        const char *ja = body, *jb = e;
        trim(&ja, &jb);
        if (!is_json_object(ja, jb))
            return NULL;
        cJSON *o = cJSON_ParseWithLength(ja, (size_t)(jb - ja));
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(o, "name");
        const cJSON *ar = cJSON_GetObjectItemCaseSensitive(o, "arguments");
        bool ok = cJSON_IsString(nm) && nm->valuestring[0] && ar &&
                  (cJSON_IsObject(ar) || cJSON_IsString(ar));
        const char *aa = NULL, *ab = NULL;
        char *name = ok ? strdup(nm->valuestring) : NULL;
        char *sarg = NULL;
        if (ok && cJSON_IsString(ar)) {
            /* arguments given as a JSON string holding the object */
            sarg = strdup(ar->valuestring);
            ok = sarg && is_json_object(sarg, sarg + strlen(sarg));
            if (ok) {
                aa = sarg;
                ab = sarg + strlen(sarg);
                trim(&aa, &ab);
            }
        } else if (ok) {
            ok = raw_value(ja, jb, "arguments", &aa, &ab);
        }
        cJSON_Delete(o);
        if (ok && name)
            add_call(c, name, name + strlen(name), aa, ab);
        free(name);
        free(sarg);
        if (!ok)
            return NULL;
        p = last = e + strlen(HM_END);
    }
    return last;
}

static void free_calls(acc_t *c)
{
    for (int i = 0; i < c->n; i++) {
        free(c->calls[i].name);
        free(c->calls[i].arguments);
    }
    free(c->calls);
    memset(c, 0, sizeof(*c));
}

int dsq_tool_calls_parse(dsq_tool_parser_t p, const char *text, size_t len,
                         dsq_tool_parse_t *out)
{
    memset(out, 0, sizeof(*out));
    if (p != DSQ_TOOL_PARSER_NONE && p != DSQ_TOOL_PARSER_DEEPSEEK &&
        p != DSQ_TOOL_PARSER_HERMES)
        return DSQ_EINVAL;
    const char *end = text + len, *start = NULL, *stop = NULL;
    acc_t c = {0};
    if (p == DSQ_TOOL_PARSER_DEEPSEEK) {
        const char *a = find(text, end, DS_CALLS_BEGIN), *b = find(text, end, DS_CALL_BEGIN);
        start = a && (!b || a < b) ? a : b;
        if (start)
            stop = parse_deepseek(start, end, &c);
    } else if (p == DSQ_TOOL_PARSER_HERMES) {
        start = find(text, end, HM_BEGIN);
        if (start)
            stop = parse_hermes(start, end, &c);
    }
    if (c.oom) {
        free_calls(&c);
        return DSQ_ENOMEM;
    }
    if (!stop || c.n == 0) {
        /* no call, or a malformed one: everything is content */
        free_calls(&c);
        out->content = dup_range(text, end);
        out->content_len = len;
        return out->content ? DSQ_OK : DSQ_ENOMEM;
    }
    /* content: the text before the calls, and what follows them unless
     * it is only whitespace */
    const char *ca = text, *cb = start;
    while (cb > ca && is_ws(cb[-1]))
        cb--;
    const char *ta = stop, *tb = end;
    trim(&ta, &tb);
    size_t n = (size_t)(cb - ca) + (ta < tb ? (size_t)(tb - ta) + (cb > ca) : 0);
    out->content = malloc(n + 1);
    if (!out->content) {
        free_calls(&c);
        return DSQ_ENOMEM;
    }
    memcpy(out->content, ca, (size_t)(cb - ca));
    size_t k = (size_t)(cb - ca);
    if (ta < tb) {
        if (k)
            out->content[k++] = '\n';
        memcpy(out->content + k, ta, (size_t)(tb - ta));
        k += (size_t)(tb - ta);
    }
    out->content[k] = 0;
    out->content_len = k;
    out->calls = c.calls;
    out->n_calls = c.n;
    return DSQ_OK;
}

int dsq_tool_calls_parse_cut(dsq_tool_parser_t p, const char *text, size_t len,
                             dsq_tool_parse_t *out)
{
    const char *begin = p == DSQ_TOOL_PARSER_DEEPSEEK ? DS_CALL_BEGIN : HM_BEGIN;
    const char *endm = p == DSQ_TOOL_PARSER_DEEPSEEK ? DS_CALL_END : HM_END;
    const char *end = text + len, *last = NULL;
    size_t bl = strlen(begin);
    /* the last begin marker, and whether an end marker follows it */
    for (const char *q = text; p != DSQ_TOOL_PARSER_NONE && (q = find(q, end, begin));
         q += bl)
        last = q;
    if (last && !find(last + bl, end, endm)) {
        len = (size_t)(last - text);
    } else if (p != DSQ_TOOL_PARSER_NONE) {
        /* cut inside a begin marker: its first bytes end the text */
        for (size_t k = bl - 1; k > 0; k--)
            if (len >= k && !memcmp(end - k, begin, k)) {
                len -= k;
                break;
            }
    }
    return dsq_tool_calls_parse(p, text, len, out);
}

void dsq_tool_parse_free(dsq_tool_parse_t *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n_calls; i++) {
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    free(r->content);
    memset(r, 0, sizeof(*r));
}

dsq_tool_parser_t dsq_tool_parser_detect(const char *tmpl)
{
    if (!tmpl)
        return DSQ_TOOL_PARSER_NONE;
    if (strstr(tmpl, DS_CALL_BEGIN))
        return DSQ_TOOL_PARSER_DEEPSEEK;
    if (strstr(tmpl, HM_BEGIN))
        return DSQ_TOOL_PARSER_HERMES;
    return DSQ_TOOL_PARSER_NONE;
}

int dsq_tool_parser_from_name(const char *name, dsq_tool_parser_t *out)
{
    static const struct {
        const char *name;
        dsq_tool_parser_t p;
    } t[] = {{"deepseek", DSQ_TOOL_PARSER_DEEPSEEK}, {"deepseek_v3", DSQ_TOOL_PARSER_DEEPSEEK},
             {"deepseek_v31", DSQ_TOOL_PARSER_DEEPSEEK}, {"hermes", DSQ_TOOL_PARSER_HERMES},
             {"qwen", DSQ_TOOL_PARSER_HERMES}, {"none", DSQ_TOOL_PARSER_NONE}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        if (!strcmp(name, t[i].name)) {
            *out = t[i].p;
            return DSQ_OK;
        }
    }
    return DSQ_EINVAL;
}

size_t dsq_tool_calls_safe_prefix(dsq_tool_parser_t p, const char *text, size_t len)
{
    const char *const *marks;
    static const char *const ds[] = {DS_CALLS_BEGIN, DS_CALL_BEGIN, NULL};
    static const char *const hm[] = {HM_BEGIN, NULL};
    if (p == DSQ_TOOL_PARSER_DEEPSEEK)
        marks = ds;
    else if (p == DSQ_TOOL_PARSER_HERMES)
        marks = hm;
    else
        return len;
    size_t best = len;
    for (int m = 0; marks[m]; m++) {
        const char *f = find(text, text + len, marks[m]);
        if (f && (size_t)(f - text) < best)
            best = (size_t)(f - text);
        /* a suffix of text that is a proper prefix of the marker */
        size_t ml = strlen(marks[m]);
        for (size_t k = ml - 1; k > 0; k--) {
            if (k <= len && !memcmp(text + len - k, marks[m], k)) {
                if (len - k < best)
                    best = len - k;
                break;
            }
        }
    }
    return best;
}
