/* The tool-call grammar (grammar.h, dsq_grammar_gbnf_for_tool_calls):
 * sentences are calls in the model's own syntax (Hermes' <tool_call> JSON
 * or DeepSeek's markers, as its chat template writes them), each naming
 * one of the request's functions, with arguments valid against that
 * function's parameters schema.
 *
 * Every tool's parameters go through the schema converter
 * (grammar_schema.c) in one conv, so their rules share one numbering and
 * one copy of the base rules; a $ref resolves inside the tool's own
 * parameters. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "grammar_gbnf_internal.h"

typedef dsq__sbuf_t sbuf_t;
typedef dsq__conv_t conv_t;

int dsq_grammar_gbnf_for_tool_calls(const dsq_tool_fn_t *fns, int n_fns, const char *name,
                                    dsq_tool_parser_t format, bool parallel, char **gbnf,
                                    char *err, size_t err_len)
{
    *gbnf = NULL;
    if (format != DSQ_TOOL_PARSER_DEEPSEEK && format != DSQ_TOOL_PARSER_HERMES) {
        snprintf(err, err_len, "no tool-call format to constrain to");
        return DSQ_EINVAL;
    }
    conv_t c = {.err = err, .err_len = err_len};
    sbuf_t calls = {0};
    int rc = DSQ_OK, n = 0, i = 0;
    while (i < n_fns) {
        const char *nm = fns[i].name, *pj = fns[i].parameters_json;
        i++;
        if (!nm || (name && strcmp(name, nm)))
            continue;
        size_t bad = 0;
        cJSON *params = pj ? dsq__schema_parse(pj, strlen(pj), &bad) : NULL;
        if (pj && !params) {
            snprintf(err, err_len, "/tools/%d/function/parameters: not JSON text (the parse "
                     "stopped at byte %zu)", i - 1, bad);
            rc = DSQ_EINVAL;
            break;
        }
        /* each tool's parameters on their own: refs resolve inside them.
         * The arguments are an object whatever the schema says of the
         * type (none, or absent parameters: any object) */
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(params, "type");
        if (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "object"))) {
            snprintf(err, err_len, "/tools/%d/function/parameters: the arguments are an "
                     "object, so its \"type\" must be \"object\"", i - 1);
            rc = DSQ_EINVAL;
        }
        /* without "type", a composition, $ref, enum or const could admit
         * values other than an object, which the grammar would then force
         * and the parser refuse: refused here, as OpenAI does */
        static const char *const decides[] = {"anyOf", "oneOf", "allOf", "$ref", "enum",
                                              "const"};
        for (size_t k = 0; !ty && k < sizeof(decides) / sizeof(decides[0]); k++) {
            if (cJSON_GetObjectItemCaseSensitive(params, decides[k])) {
                snprintf(err, err_len, "/tools/%d/function/parameters: the arguments are an "
                         "object, so it needs \"type\": \"object\" (it has '%s' and no "
                         "\"type\")", i - 1, decides[k]);
                rc = DSQ_EINVAL;
                break;
            }
        }
        if (rc) {
            cJSON_Delete(params);
            break;
        }
        cJSON *any = params;
        if (!cJSON_IsObject(params)) {   /* then ty is NULL: only objects have members */
            cJSON_Delete(params);
            any = cJSON_CreateObject();
        }
        if (!any || (!ty && !cJSON_AddStringToObject(any, "type", "object"))) {
            cJSON_Delete(any);
            rc = DSQ_ENOMEM;
            break;
        }
        params = any;
        c.root = params;
        c.n_refs = 0;
        snprintf(c.path, sizeof(c.path), "/tools/%d/function/parameters", i - 1);
        sbuf_t args = {0};
        rc = dsq__schema_expr(&c, params, &args);
        cJSON_Delete(any);
        if (rc) {
            free(args.p);
            break;
        }
        /* the name as the template writes it: a JSON string (Hermes) or
         * bare (DeepSeek) */
        dsq__sb_str(&calls, n ? "| " : "");
        if (format == DSQ_TOOL_PARSER_HERMES) {
            cJSON *ks = cJSON_CreateString(nm);
            char *kt = ks ? cJSON_PrintUnformatted(ks) : NULL;
            cJSON_Delete(ks);
            if (!kt) {
                free(args.p);
                rc = DSQ_ENOMEM;
                break;
            }
            sbuf_t head = {0};
            dsq__sb_str(&head, "<tool_call>\n{\"name\": ");
            dsq__sb_str(&head, kt);
            dsq__sb_str(&head, ", \"arguments\": ");
            free(kt);
            dsq__sb_lit(&calls, head.p ? head.p : "", head.n);
            free(head.p);
            dsq__sb_str(&calls, " ");
            dsq__sb_add(&calls, args.p ? args.p : "", args.n);
            dsq__sb_lit(&calls, "}\n</tool_call>", 14);
        } else {
            sbuf_t head = {0};
            dsq__sb_str(&head, "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81"
                               "begin\xef\xbd\x9c>function<\xef\xbd\x9ctool\xe2\x96\x81"
                               "sep\xef\xbd\x9c>");
            dsq__sb_str(&head, nm);
            dsq__sb_str(&head, "\n```json\n");
            dsq__sb_lit(&calls, head.p ? head.p : "", head.n);
            free(head.p);
            dsq__sb_str(&calls, " ");
            dsq__sb_add(&calls, args.p ? args.p : "", args.n);
            static const char tail[] = "\n```<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81"
                                       "end\xef\xbd\x9c>";
            dsq__sb_lit(&calls, tail, sizeof(tail) - 1);
        }
        dsq__sb_str(&calls, " ");
        free(args.p);
        n++;
    }
    if (!rc && n == 0) {
        snprintf(err, err_len, name ? "no tool named '%.80s' in 'tools'" : "'tools' is empty",
                 name ? name : "");
        rc = DSQ_EINVAL;
    }
    sbuf_t out = {0};
    if (!rc) {
        /* parallel: at most DSQ_GRAMMAR_MAX_TOOL_CALLS calls, so a model
         * that repeats itself still ends */
        char sep[48] = "";
        if (parallel)
            snprintf(sep, sizeof(sep), "( \"\\n\" call ){0,%d}", DSQ_GRAMMAR_MAX_TOOL_CALLS - 1);
        if (format == DSQ_TOOL_PARSER_HERMES)
            dsq__sb_fmt(&out, "root ::= call %s\n", sep);
        else
            dsq__sb_fmt(&out, "root ::= \"<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81"
                              "begin\xef\xbd\x9c>\" call %s \"<\xef\xbd\x9ctool\xe2\x96\x81"
                              "calls\xe2\x96\x81" "end\xef\xbd\x9c>\"\n", sep);
        dsq__sb_str(&out, "call ::= ");
        dsq__sb_add(&out, calls.p, calls.n);
        dsq__sb_str(&out, "\n");
        dsq__sb_add(&out, c.rules.p ? c.rules.p : "", c.rules.n);
        dsq__sb_str(&out, dsq__schema_base_rules);
        if (out.oom || calls.oom || c.rules.oom)
            rc = DSQ_ENOMEM;
        else if (out.n > DSQ_GRAMMAR_MAX_SOURCE) {
            snprintf(err, err_len, "the tools' grammar would be larger than %u bytes",
                     DSQ_GRAMMAR_MAX_SOURCE);
            rc = DSQ_ERANGE;
        }
    }
    free(calls.p);
    free(c.rules.p);
    if (rc) {
        if (rc == DSQ_ENOMEM)
            snprintf(err, err_len, "out of memory");
        free(out.p);
        return rc;
    }
    *gbnf = out.p;
    return DSQ_OK;
}
