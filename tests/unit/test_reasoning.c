/* tests for server/reasoning.c: the deepseek_r1 <think> splitter, whole and
 * streamed in every possible split (tags cut across pieces). Expected
 * values are written out by hand from the rule in reasoning.h (vLLM's
 * DeepSeek-R1 parser: text inside <think>...</think> is reasoning, the
 * tags are dropped). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "server/reasoning.h"

typedef struct {
    const char *out;
    bool in_think;               /* prompt opened <think>                 */
    const char *reasoning;
    const char *content;
} case_t;

static const case_t cases[] = {
    {"Paris.", false, "", "Paris."},
    {"<think>\nThe user asks.\n</think>\n\nParis.", false,
     "\nThe user asks.\n", "\n\nParis."},
    {"\nThe user asks.\n</think>\n\nParis.", true, "\nThe user asks.\n",
     "\n\nParis."},
    {"still thinking", true, "still thinking", ""},
    {"a < b <th </thin x</think>done <", true, "a < b <th </thin x", "done <"},
    {"no tags but <thin", false, "", "no tags but <thin"},
    {"x<think>y</think>z<think>w", false, "yw", "xz"},
    {"</think>", true, "", ""},
    {"", true, "", ""},
    {"caf\xc3\xa9 </think>\xe4\xb8\xad", true, "caf\xc3\xa9 ", "\xe4\xb8\xad"},
};

typedef struct {
    char r[256], c[256];
    size_t nr, nc;
} acc_t;

static void take(acc_t *a, dsq_reasoning_delta_t *d)
{
    assert_non_null(d->reasoning);
    assert_non_null(d->content);
    assert_int_equal(strlen(d->reasoning), d->reasoning_len);
    assert_int_equal(strlen(d->content), d->content_len);
    assert_true(a->nr + d->reasoning_len < sizeof(a->r));
    assert_true(a->nc + d->content_len < sizeof(a->c));
    memcpy(a->r + a->nr, d->reasoning, d->reasoning_len);
    a->nr += d->reasoning_len;
    memcpy(a->c + a->nc, d->content, d->content_len);
    a->nc += d->content_len;
    a->r[a->nr] = a->c[a->nc] = '\0';
    dsq_reasoning_delta_free(d);
}

/* Feed out in pieces cut at cut1 <= cut2, then flush. */
static void run(const case_t *k, size_t cut1, size_t cut2, acc_t *a)
{
    dsq_reasoning_t r;
    dsq_reasoning_delta_t d;
    size_t n = strlen(k->out);
    size_t cuts[4] = {0, cut1, cut2, n};
    memset(a, 0, sizeof(*a));
    dsq_reasoning_init(&r, k->in_think);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(dsq_reasoning_feed(&r, k->out + cuts[i],
                                            cuts[i + 1] - cuts[i], &d), DSQ_OK);
        take(a, &d);
        assert_true(r.n_hold < strlen("</think>"));
    }
    assert_int_equal(dsq_reasoning_flush(&r, &d), DSQ_OK);
    take(a, &d);
}

static void test_whole(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        acc_t a;
        size_t n = strlen(cases[i].out);
        run(&cases[i], n, n, &a);
        if (strcmp(a.r, cases[i].reasoning) || strcmp(a.c, cases[i].content))
            fail_msg("case %zu: reasoning '%s' content '%s'", i, a.r, a.c);
    }
}

/* Every way to cut the output in three pieces gives the same split. */
static void test_streamed_every_split(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = strlen(cases[i].out);
        for (size_t c1 = 0; c1 <= n; c1++)
            for (size_t c2 = c1; c2 <= n; c2++) {
                acc_t a;
                run(&cases[i], c1, c2, &a);
                if (strcmp(a.r, cases[i].reasoning) ||
                    strcmp(a.c, cases[i].content))
                    fail_msg("case %zu cut %zu/%zu: reasoning '%s' content '%s'",
                             i, c1, c2, a.r, a.c);
            }
    }
}

/* Byte-at-a-time streaming: a held tag prefix is released as soon as it
 * cannot be a tag any more (no waiting for the flush). */
static void test_hold_back(void **state)
{
    dsq_reasoning_t r;
    dsq_reasoning_delta_t d;
    (void)state;
    dsq_reasoning_init(&r, true);
    assert_int_equal(dsq_reasoning_feed(&r, "ab</thi", 7, &d), DSQ_OK);
    assert_string_equal(d.reasoning, "ab");
    assert_string_equal(d.content, "");
    dsq_reasoning_delta_free(&d);
    assert_int_equal(dsq_reasoning_feed(&r, "s", 1, &d), DSQ_OK);
    assert_string_equal(d.reasoning, "</this");
    dsq_reasoning_delta_free(&d);
    assert_int_equal(dsq_reasoning_feed(&r, "</", 2, &d), DSQ_OK);
    assert_string_equal(d.reasoning, "");
    dsq_reasoning_delta_free(&d);
    assert_int_equal(dsq_reasoning_feed(&r, "think>A", 7, &d), DSQ_OK);
    assert_string_equal(d.reasoning, "");
    assert_string_equal(d.content, "A");
    assert_false(r.in_think);
    dsq_reasoning_delta_free(&d);
    dsq_reasoning_delta_free(NULL);
}

static void test_prompt_in_think(void **state)
{
    (void)state;
#define P(s) s, strlen(s)
    assert_true(dsq_reasoning_prompt_in_think(P("<\xef\xbd\x9c" "Assistant\xef\xbd\x9c><think>\n")));
    assert_false(dsq_reasoning_prompt_in_think(P("<think>x</think>answer")));
    assert_true(dsq_reasoning_prompt_in_think(P("<think>a</think>b<think>")));
    assert_false(dsq_reasoning_prompt_in_think(P("<|im_start|>assistant\n")));
    assert_false(dsq_reasoning_prompt_in_think(P("")));
#undef P
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole),
        cmocka_unit_test(test_streamed_every_split),
        cmocka_unit_test(test_hold_back),
        cmocka_unit_test(test_prompt_in_think),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
