/* Reasoning-content parsers: split a model's output into the reasoning
 * part (OpenAI-style `reasoning_content`, as vLLM's --reasoning-parser
 * reports it) and the answer (`content`).
 *
 * deepseek_r1 (DeepSeek-R1 and the R1-Distill models): the text between
 * "<think>" and "</think>" is reasoning, everything else content. The
 * R1-Distill templates open "<think>" in the prompt itself, so the parser
 * starts inside the reasoning block when the rendered prompt ends inside
 * one (dsq_reasoning_prompt_in_think), and then everything before the
 * first "</think>" is reasoning. The tags themselves appear in neither
 * part.
 *
 * Streaming: text arrives in arbitrary pieces and a tag may be split
 * across pieces ("</th" + "ink>"), so a piece's tail that could still
 * become a tag is held back until the next piece (or dsq_reasoning_flush)
 * decides. At most strlen("</think>") - 1 bytes are ever held.
 * Pure code, no allocation beyond the caller's outputs: unit-tested in
 * tests/unit/test_reasoning.c. */
#ifndef DSQ_SERVER_REASONING_H
#define DSQ_SERVER_REASONING_H

#include <stdbool.h>
#include <stddef.h>

/* deepseek_r1's tags (also what the engine counts and, at a reasoning
 * budget's end, writes: completions.c). */
#define DSQ_REASONING_OPEN "<think>"
#define DSQ_REASONING_CLOSE "</think>"

/* Parser state of one choice. Caller-provided storage (_init). */
typedef struct dsq_reasoning {
    bool in_think;               /* inside <think> ... </think>            */
    size_t n_hold;               /* bytes held back (a possible tag prefix) */
    char hold[16];
} dsq_reasoning_t;

/* Output of one feed: two malloc'd NUL-terminated deltas (either may be
 * empty, never NULL after a successful call), owned by the caller, who
 * frees them with dsq_reasoning_delta_free. */
typedef struct dsq_reasoning_delta {
    char *reasoning;
    size_t reasoning_len;
    char *content;
    size_t content_len;
} dsq_reasoning_delta_t;

/* Start a parser; in_think: the prompt already opened a reasoning block. */
void dsq_reasoning_init(dsq_reasoning_t *r, bool in_think);

/* True when the rendered prompt text[0..len) ends inside an open
 * "<think>" block (its last "<think>" comes after its last "</think>"). */
bool dsq_reasoning_prompt_in_think(const char *text, size_t len);

/* Feed the next piece text[0..len) of the output. Fills *out with what
 * became final. Returns 0 or DSQ_ENOMEM (then *out is empty and freed). */
int dsq_reasoning_feed(dsq_reasoning_t *r, const char *text, size_t len,
                       dsq_reasoning_delta_t *out);

/* End of output: release the held bytes as text of the current part.
 * Returns 0 or DSQ_ENOMEM. */
int dsq_reasoning_flush(dsq_reasoning_t *r, dsq_reasoning_delta_t *out);

/* Free the deltas' strings and zero *d. NULL is a no-op. */
void dsq_reasoning_delta_free(dsq_reasoning_delta_t *d);

#endif
