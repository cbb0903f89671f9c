/* JSON text that reads back exactly (see json_print.h for why). A small
 * recursive printer over cJSON's tree: strings escaped as cJSON escapes
 * them, numbers by the shortest round-trip search that the schema
 * converter uses for enum literals (engine/text/grammar_schema.c). */
#include "server/json_print.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct out {
    char *p;
    size_t n, cap;
    bool oom;
} out_t;

static void put(out_t *o, const char *s, size_t n)
{
    if (o->oom)
        return;
    if (o->n + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->n + n + 1)
            cap *= 2;
        char *p = realloc(o->p, cap);
        if (!p) {
            o->oom = true;
            return;
        }
        o->p = p;
        o->cap = cap;
    }
    memcpy(o->p + o->n, s, n);
    o->n += n;
    o->p[o->n] = '\0';
}

/* A JSON string of s: '"', '\\' and control characters escaped, every
 * other byte as it is (cJSON keeps any bytes, and reads them back). */
static void put_string(out_t *o, const char *s)
{
    put(o, "\"", 1);
    for (const char *run = s;; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        put(o, run, (size_t)(s - run));
        if (!c)
            break;
        char esc[8];
        switch (c) {
        case '"': put(o, "\\\"", 2); break;
        case '\\': put(o, "\\\\", 2); break;
        case '\b': put(o, "\\b", 2); break;
        case '\f': put(o, "\\f", 2); break;
        case '\n': put(o, "\\n", 2); break;
        case '\r': put(o, "\\r", 2); break;
        case '\t': put(o, "\\t", 2); break;
        default:
            snprintf(esc, sizeof(esc), "\\u%04x", c);
            put(o, esc, 6);
        }
        run = s + 1;
    }
    put(o, "\"", 1);
}

static void put_number(out_t *o, double d)
{
    char num[40];
    if (isnan(d)) {
        put(o, "null", 4);   /* as cJSON; no parse makes one */
        return;
    }
    if (isinf(d)) {
        put(o, d < 0 ? "-1e999" : "1e999", d < 0 ? 6 : 5);
        return;
    }
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(num, sizeof(num), "%.*g", prec, d);
        if (strtod(num, NULL) == d)
            break;
    }
    put(o, num, strlen(num));
}

static void put_value(out_t *o, const cJSON *v)
{
    if (cJSON_IsObject(v) || cJSON_IsArray(v)) {
        bool obj = cJSON_IsObject(v);
        put(o, obj ? "{" : "[", 1);
        for (const cJSON *e = v->child; e; e = e->next) {
            if (e != v->child)
                put(o, ",", 1);
            if (obj) {
                put_string(o, e->string ? e->string : "");
                put(o, ":", 1);
            }
            put_value(o, e);
        }
        put(o, obj ? "}" : "]", 1);
    } else if (cJSON_IsString(v)) {
        put_string(o, v->valuestring ? v->valuestring : "");
    } else if (cJSON_IsNumber(v)) {
        put_number(o, v->valuedouble);
    } else if (cJSON_IsRaw(v) && v->valuestring) {
        put(o, v->valuestring, strlen(v->valuestring));
    } else if (cJSON_IsBool(v)) {
        put(o, cJSON_IsTrue(v) ? "true" : "false", cJSON_IsTrue(v) ? 4 : 5);
    } else {
        put(o, "null", 4);
    }
}

char *dsq_json_print(const cJSON *v)
{
    out_t o = {0};
    if (!v)
        return NULL;
    put_value(&o, v);
    if (o.oom) {
        free(o.p);
        return NULL;
    }
    return o.p;
}
