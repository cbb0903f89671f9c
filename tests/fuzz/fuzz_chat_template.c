/* libFuzzer target for engine/text/jinja.c + engine/text/chat_template.c.
 *
 * Input: template text. Everything before the first 0x00 byte is the
 * template; anything after it, if it parses as a JSON array, replaces the
 * default messages. The template is parsed and, when it loads, rendered
 * against messages, tools and extra kwargs shaped like real requests. Any
 * outcome is fine except a crash, a sanitizer report, a leak or a hang: the
 * step/output/memory/depth limits must stop every runaway template.
 *
 * Build (clang only; from the repo root):
 *   clang -g -O1 -std=c17 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
 *     -Iengine tests/fuzz/fuzz_chat_template.c engine/text/jinja.c \
 *     engine/text/jinja_value.c engine/text/jinja_filters.c engine/text/chat_template.c \
 *     -lcjson -lm -o fuzz_chat_template
 * Run, seeded with the real templates:
 *   ./fuzz_chat_template -max_total_time=60 -timeout=10 CORPUS_DIR
 * with CORPUS_DIR holding the .jinja files of
 * $DSQ_TEST_DATA/tokenizers/chat_templates (one template per file).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/text/chat_template.h"

static const char *const default_messages =
    "[{\"role\":\"system\",\"content\":\"sys\"},"
    "{\"role\":\"user\",\"content\":\"Hi \\u00e9 <think>\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>\\nr\\n</think>\\n\\nok\","
    "\"reasoning_content\":\"r\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\","
    "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
    "{\"role\":\"tool\",\"content\":\"42\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"part\"}]}]";
static const char *const tools_json =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}}}}}]";
static const char *const extra_json = "{\"enable_thinking\":false,\"n\":3}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *src = (const char *)data;
    const uint8_t *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - data) : size;
    char err[256];
    dsq_chat_template_t *t = dsq_chat_template_create(src, tlen, err, sizeof(err));
    if (!t)
        return 0;
    cJSON *msgs = NULL;
    if (nul && (size_t)(nul - data) + 1 < size) {
        size_t jn = size - tlen - 1;
        char *j = malloc(jn + 1);
        if (j) {
            memcpy(j, nul + 1, jn);
            j[jn] = 0;
            msgs = cJSON_Parse(j);
            free(j);
        }
        if (msgs && !cJSON_IsArray(msgs)) {
            cJSON_Delete(msgs);
            msgs = NULL;
        }
    }
    /* the renderer takes JSON text: the input's array printed again */
    char *msgs_json = msgs ? cJSON_PrintUnformatted(msgs) : NULL;
    for (int pass = 0; pass < 2; pass++) {
        char *out = NULL;
        size_t out_len = 0;
        int rc = dsq_chat_template_render(t, msgs_json ? msgs_json : default_messages,
                                          pass ? tools_json : NULL, pass == 0,
                                          "<s>", pass ? NULL : "</s>", extra_json, &out,
                                          &out_len, err, sizeof(err));
        if (rc == 0 && (!out || strlen(out) > out_len))
            abort(); /* output must be NUL-terminated at out_len (may hold NULs) */
        free(out);
    }
    free(msgs_json);
    cJSON_Delete(msgs);
    dsq_chat_template_destroy(t);
    return 0;
}
