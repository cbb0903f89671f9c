/* The tool-call grammar (grammar.h, dsq_grammar_gbnf_for_tool_calls):
 * sentences are calls in the model's own syntax (Hermes' <tool_call> JSON
 * or DeepSeek's markers, as its chat template writes them), each naming
 * one of the request's functions, with arguments valid against that
 * function's parameters schema.
 *
 * Every function's arguments are made by the schema converter
 * (grammar_schema.c, dsq__schema_args_expr) in one conversion, so their
 * rules share one numbering and one copy of the base rules; a $ref
 * resolves inside the function's own parameters. This file adds the call
 * syntax around them and never reads a schema. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

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
    conv_t *c = dsq__conv_create(err, err_len);
    sbuf_t calls = {0};
    int rc = c ? DSQ_OK : DSQ_ENOMEM, n = 0, i = 0;
    while (!rc && i < n_fns) {
        const char *nm = fns[i].name;
        i++;
        if (!nm || (name && strcmp(name, nm)))
            continue;
        char path[64];
        snprintf(path, sizeof(path), "/tools/%d/function/parameters", i - 1);
        sbuf_t args = {0};
        rc = dsq__schema_args_expr(c, fns[i - 1].parameters_json, path, &args);
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
        const sbuf_t *rules = dsq__conv_rules(c);
        dsq__sb_add(&out, rules->p ? rules->p : "", rules->n);
        dsq__sb_str(&out, dsq__schema_base_rules);
        if (out.oom || calls.oom || rules->oom)
            rc = DSQ_ENOMEM;
        else if (out.n > DSQ_GRAMMAR_MAX_SOURCE) {
            snprintf(err, err_len, "the tools' grammar would be larger than %u bytes",
                     DSQ_GRAMMAR_MAX_SOURCE);
            rc = DSQ_ERANGE;
        }
    }
    free(calls.p);
    dsq__conv_destroy(c);
    if (rc) {
        if (rc == DSQ_ENOMEM)
            snprintf(err, err_len, "out of memory");
        free(out.p);
        return rc;
    }
    *gbnf = out.p;
    return DSQ_OK;
}
