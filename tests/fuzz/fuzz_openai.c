/* libFuzzer target for the OpenAI request parsers (server/openai.c): any
 * bytes as a /v1/completions, /v1/chat/completions, /tokenize or
 * /detokenize body. The parsers must never crash, leak or read out of
 * bounds; every rejection must carry an error kind and a message. Built
 * with clang by tests/fuzz/meson.build (suite fuzz). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "server/openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *body = (const char *)data;
    dsq_openai_limits_t lim = {.served_model_name = "m", .n_vocab = 49152};
    /* api: a small sequence cap, so the prompts x best_of check is hit */
    dsq_openai_limits_t any = {.served_model_name = "m", .n_vocab = 0, .max_seqs = 8};
    for (int pass = 0; pass < 2; pass++) {
        const dsq_openai_limits_t *l = pass ? &any : &lim;
        dsq_completion_req_t r;
        dsq_api_error_t err;
        if (dsq_openai_parse_completion(body, size, l, &r, &err) == 0)
            dsq_completion_req_deinit(&r);
        else if (!err.message[0])
            abort();
        if (dsq_openai_parse_chat(body, size, l, &r, &err) == 0)
            dsq_completion_req_deinit(&r);
        else if (!err.message[0])
            abort();
        dsq_tokenize_req_t t;
        if (dsq_openai_parse_tokenize_req(body, size, l, &t, &err) == 0)
            dsq_tokenize_req_deinit(&t);
        int32_t *ids = NULL;
        int n = 0;
        if (dsq_openai_parse_detokenize(body, size, l, &ids, &n, &err) == 0)
            free(ids);
    }
    return 0;
}
