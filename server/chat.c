/* Chat template selection, rendering and prompt tokenization for dsqd (see
 * chat.h). Owns the compiled template and the BOS/EOS strings; everything
 * is read-only after create, so connection threads share it unlocked. */
#include "server/chat.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/chat_template.h"
#include "engine/text/grammar.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "server/json_print.h"

#define MAX_TEMPLATE_BYTES (4u << 20)

struct dsq_chat {
    dsq_chat_template_t *t;      /* NULL: no template                      */
    const dsq_tokenizer_t *tok;
    char *bos, *eos;             /* token text, or NULL when none          */
    char *source;                /* the template's text, or NULL           */
    bool reasoning;
    dsq_tool_parser_t tool_parser;   /* --tool-call-parser */
};

static char *read_all(const char *path, size_t *len, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0;
    if (!f) {
        snprintf(err, err_len, "--chat-template %s: %s", path, strerror(errno));
        return NULL;
    }
    buf = malloc(MAX_TEMPLATE_BYTES + 1);
    if (buf)
        n = fread(buf, 1, MAX_TEMPLATE_BYTES + 1, f);
    if (!buf || ferror(f) || n > MAX_TEMPLATE_BYTES) {
        snprintf(err, err_len, "--chat-template %s: %s", path,
                 !buf ? "out of memory"
                      : ferror(f) ? "read error" : "larger than 4 MiB");
        free(buf);
        buf = NULL;
    } else {
        buf[n] = '\0';
        *len = n;
    }
    fclose(f);
    return buf;
}

static char *token_text(const dsq_tokenizer_t *tok, int32_t id)
{
    size_t len = 0;
    const char *s = id >= 0 ? dsq_tokenizer_token_str(tok, id, &len) : NULL;
    return s ? strndup(s, len) : NULL;
}

dsq_chat_t *dsq_chat_create(const char *template_path,
                            const char *model_template,
                            const dsq_tokenizer_t *tok,
                            const char *reasoning_parser, const char *tool_parser,
                            char *err, size_t err_len)
{
    dsq_chat_t *c = calloc(1, sizeof(*c));
    char *src = NULL, why[400] = "";
    size_t len = 0;
    const char *origin = "--chat-template";

    if (!c) {
        snprintf(err, err_len, "out of memory");
        return NULL;
    }
    c->tok = tok;
    if (reasoning_parser && *reasoning_parser &&
        strcmp(reasoning_parser, "none")) {
        if (strcmp(reasoning_parser, "deepseek_r1")) {
            snprintf(err, err_len, "--reasoning-parser %.100s: unknown parser "
                     "(known: none, deepseek_r1)", reasoning_parser);
            goto fail;
        }
        c->reasoning = true;
    }
    if (template_path) {
        if (!(src = read_all(template_path, &len, err, err_len)))
            goto fail;
    } else if (model_template) {
        origin = "the model's chat template";
        len = strlen(model_template);
    }
    if (src || model_template) {
        c->t = dsq_chat_template_create(src ? src : model_template, len, why,
                                        sizeof(why));
        if (!c->t) {
            snprintf(err, err_len, "%s%s%s does not compile: %s (pass a "
                     "working one with --chat-template FILE)", origin,
                     template_path ? " " : "",
                     template_path ? template_path : "", why);
            goto fail;
        }
    }
    c->bos = token_text(tok, dsq_tokenizer_bos(tok));
    c->eos = token_text(tok, dsq_tokenizer_eos(tok));
    if (src || model_template) {
        c->source = src ? src : strdup(model_template);
        src = NULL;
        if (!c->source) {
            snprintf(err, err_len, "out of memory");
            goto fail;
        }
    }
    /* the tool-call syntax, named or from the template; a template that
     * shows none gets Hermes' <tool_call> JSON (what a constrained call
     * is then written in) */
    if (!tool_parser || !*tool_parser || !strcmp(tool_parser, "auto")) {
        c->tool_parser = dsq_tool_parser_detect(c->source);
        if (c->tool_parser == DSQ_TOOL_PARSER_NONE)
            c->tool_parser = DSQ_TOOL_PARSER_HERMES;
    } else if (dsq_tool_parser_from_name(tool_parser, &c->tool_parser)) {
        snprintf(err, err_len, "--tool-call-parser %.100s: unknown parser (known: auto, "
                 "deepseek, deepseek_v3, deepseek_v31, hermes, qwen, none)", tool_parser);
        goto fail;
    }
    dsq_log(DSQ_LOG_INFO, "event=chat_template source=%s reasoning_parser=%s "
            "tool_call_parser=%s",
            template_path ? "file" : model_template ? "model" : "none",
            c->reasoning ? "deepseek_r1" : "none",
            c->tool_parser == DSQ_TOOL_PARSER_DEEPSEEK ? "deepseek"
            : c->tool_parser == DSQ_TOOL_PARSER_HERMES ? "hermes" : "none");
    free(src);
    return c;
fail:
    free(src);
    dsq_chat_destroy(c);
    return NULL;
}

void dsq_chat_destroy(dsq_chat_t *c)
{
    if (!c)
        return;
    dsq_chat_template_destroy(c->t);
    free(c->bos);
    free(c->eos);
    free(c->source);
    free(c);
}

const char *dsq_chat_template_source(const dsq_chat_t *c)
{
    return c ? c->source : NULL;
}

const char *dsq_chat_bos_text(const dsq_chat_t *c) { return c ? c->bos : NULL; }
const char *dsq_chat_eos_text(const dsq_chat_t *c) { return c ? c->eos : NULL; }

dsq_tool_parser_t dsq_chat_tool_parser(const dsq_chat_t *c)
{
    return c ? c->tool_parser : DSQ_TOOL_PARSER_NONE;
}

bool dsq_chat_has_reasoning(const dsq_chat_t *c)
{
    return c && c->reasoning;
}

int dsq_chat_gbnf_for_tool_calls(const cJSON *tools, const char *name,
                                 dsq_tool_parser_t format, bool parallel, char **gbnf,
                                 char *err, size_t err_len)
{
    const cJSON *t;
    dsq_tool_fn_t *fns = NULL;
    int n = 0, k = 0, rc = DSQ_OK;
    *gbnf = NULL;
    cJSON_ArrayForEach(t, tools)
        n++;
    if (n && !(fns = calloc((size_t)n, sizeof(*fns))))
        rc = DSQ_ENOMEM;
    /* one entry per tools[k], a named function or not, so that the
     * engine's /tools/N pointers count as the request does */
    for (t = fns ? tools->child : NULL; t; t = t->next, k++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        fns[k].name = cJSON_IsString(nm) ? nm->valuestring : NULL;
        if (params && !(fns[k].parameters_json = dsq_json_print(params)))
            rc = DSQ_ENOMEM;
    }
    if (rc)
        snprintf(err, err_len, "out of memory");
    else
        rc = dsq_grammar_gbnf_for_tool_calls(fns, n, name, format, parallel, gbnf, err,
                                             err_len);
    for (k = 0; fns && k < n; k++)
        free((char *)fns[k].parameters_json);
    free(fns);
    return rc;
}

/* A copy of messages for a template that wants the other convention of
 * an assistant tool-call turn, or NULL when nothing would change (or out of
 * memory; the caller then reports the first failure). objects: each
 * tool_calls[].function.arguments string that parses as a JSON object
 * becomes that object (transformers' convention, which Qwen2.5's template
 * writes with tojson); empty: a null or absent assistant content becomes
 * "" (templates that add content to a string, like SmolLM2's). */
static cJSON *messages_variant(const cJSON *messages, bool objects, bool empty)
{
    cJSON *copy = cJSON_Duplicate(messages, 1), *m;
    bool changed = false;
    if (!copy)
        return NULL;
    cJSON_ArrayForEach(m, copy) {
        const char *role = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "role"));
        cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content"), *tc;
        if (!role || strcmp(role, "assistant"))
            continue;
        if (empty && (!content || cJSON_IsNull(content))) {
            cJSON *e = cJSON_CreateString("");
            /* ReplaceItemInObject names the new item; ViaPointer would not */
            if (!e || (content ? !cJSON_ReplaceItemInObjectCaseSensitive(m, "content", e)
                               : !cJSON_AddItemToObject(m, "content", e))) {
                cJSON_Delete(e);
                goto fail;
            }
            changed = true;
        }
        if (!objects)
            continue;
        cJSON_ArrayForEach(tc, cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
            cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments"), *obj;
            if (!cJSON_IsString(args))
                continue;
            obj = cJSON_Parse(args->valuestring);
            if (!cJSON_IsObject(obj) ||
                !cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", obj)) {
                cJSON_Delete(obj);
                continue;
            }
            changed = true;
        }
    }
    if (changed)
        return copy;
fail:
    cJSON_Delete(copy);
    return NULL;
}

int dsq_chat_render(const dsq_chat_t *c, const cJSON *messages,
                    const cJSON *tools, bool add_generation_prompt, char **out,
                    size_t *out_len, dsq_api_error_t *err)
{
    /* the tries, in order: arguments as objects, then as sent; each with
     * content as sent, then with "" for a null assistant content */
    static const bool objects[4] = {true, false, true, false};
    static const bool empty[4] = {false, false, true, true};
    char why[400] = "", why_next[400];
    int rc = DSQ_EINVAL;
    *out = NULL;
    if (!c || !c->t)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                 "this model has no chat template; start "
                                 "dsqd with --chat-template FILE (a Jinja2 "
                                 "chat template, e.g. the chat_template of "
                                 "the model's tokenizer_config.json), or use "
                                 "/v1/completions");
    /* Chat templates disagree on an assistant tool-call turn: transformers
     * passes arguments as a dict and Qwen2.5 writes it with tojson, while
     * DeepSeek-V3 adds the arguments string to text and needs content null
     * to see the turn; SmolLM2 adds content to a string. vLLM always
     * parses the arguments and maps null content to ""; that breaks
     * DeepSeek's template, so dsq tries each convention until one renders
     * and reports the failure of the messages as sent. */
    /* the engine takes JSON text: the tools once, each try's messages */
    char *tools_json = tools ? dsq_json_print(tools) : NULL;
    if (tools && !tools_json)
        rc = DSQ_ENOMEM;
    for (int i = 0; rc != DSQ_ENOMEM && i < 4; i++) {
        cJSON *variant = NULL;
        char *messages_json = NULL;
        if (objects[i] || empty[i]) {
            variant = messages_variant(messages, objects[i], empty[i]);
            if (!variant)
                continue;
        }
        const cJSON *m = variant ? variant : messages;
        if (m && !(messages_json = dsq_json_print(m)))
            rc = DSQ_ENOMEM;
        else
            rc = dsq_chat_template_render(c->t, messages_json, tools_json,
                                          add_generation_prompt, c->bos, c->eos, NULL, out,
                                          out_len, variant ? why_next : why,
                                          variant ? sizeof(why_next) : sizeof(why));
        free(messages_json);
        cJSON_Delete(variant);
        if (!rc || rc == DSQ_ENOMEM)
            break;
    }
    free(tools_json);
    if (rc == DSQ_ENOMEM)
        return dsq_api_error_set(err, DSQ_APIERR_INTERNAL, NULL, "out of memory");
    if (rc)
        return dsq_api_error_set(err, DSQ_APIERR_INVALID_REQUEST, "messages",
                                 "the chat template failed on these "
                                 "messages: %s", why);
    return DSQ_OK;
}

int dsq_chat_tokenize(const dsq_chat_t *c, const char *text, size_t len,
                      bool add_special, int32_t **ids, size_t *n_ids)
{
    unsigned flags = DSQ_TOK_PARSE_SPECIAL;
    size_t bl = c && c->bos ? strlen(c->bos) : 0;
    if (!c)
        return DSQ_EINVAL;
    if (add_special && dsq_tokenizer_add_bos(c->tok) &&
        !(bl && len >= bl && !memcmp(text, c->bos, bl)))
        flags |= DSQ_TOK_ADD_BOS;
    return dsq_tokenizer_encode(c->tok, text, len, flags, ids, n_ids);
}
