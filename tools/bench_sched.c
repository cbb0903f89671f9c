/* dsq-bench sched: scheduler overhead per step.
 *
 * Drives engine/serve/scheduler.c and the KV block manager exactly as the engine
 * does for a steady decode load of N running sequences (default 256): every
 * step plans the batch (block reservation, copy-on-write check, batch
 * arrays), commits it and appends one token per sequence; finished
 * sequences are replaced by new arrivals whose prompts go through chunked
 * prefill, so admission and block allocation stay on the measured path. No
 * forward pass runs: the time is the scheduler's own. Prints microseconds
 * per step (mean, p50, p99). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/kv/kv_cache.h"
#include "engine/serve/scheduler.h"

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct bseq {
    dsq_seq_t s;
    int left;            /* tokens still to generate */
} bseq_t;

static void seq_reset(bseq_t *b, uint64_t order, uint32_t *rng)
{
    dsq_seq_t *s = &b->s;
    *rng = *rng * 1664525u + 1013904223u;
    int n_prompt = 64 + (int)((*rng >> 8) % 448);
    s->order = order;
    s->n_tokens = s->n_prompt = n_prompt;
    s->n_computed = 0;
    s->n_preempted = 0;
    if (s->cap_tokens < n_prompt + 512) {
        s->cap_tokens = n_prompt + 512;
        s->tokens = realloc(s->tokens, (size_t)s->cap_tokens * sizeof(int32_t));
    }
    for (int i = 0; i < n_prompt; i++)
        s->tokens[i] = i;
    b->left = 64 + (int)((*rng >> 16) % 448);
}

int dsq__bench_sched(int argc, char **argv);
int dsq__bench_sched(int argc, char **argv)
{
    int n_seqs = 256, steps = 20000, block_size = 16;
    for (int i = 0; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--seqs"))
            n_seqs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else {
            fprintf(stderr, "dsq-bench sched: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    if (n_seqs < 1 || steps < 1) {
        fprintf(stderr, "dsq-bench sched: --seqs and --steps must be >= 1\n");
        return 2;
    }
    char err[256];
    /* enough blocks for every sequence at its longest (1024 tokens) */
    int64_t n_blocks = (int64_t)n_seqs * (1024 / block_size + 1);
    dsq_kv_cache_t *kv = dsq_kv_create(1, 1, 8, block_size, n_blocks, DSQ_KV_F16, err,
                                       sizeof(err));
    dsq_sched_opts_t so = {.max_num_seqs = n_seqs, .max_num_batched_tokens = n_seqs + 2048};
    dsq_sched_t *s = kv ? dsq_sched_create(kv, &so) : NULL;
    bseq_t *seqs = calloc((size_t)n_seqs, sizeof(*seqs));
    double *t = malloc((size_t)steps * sizeof(*t));
    if (!kv || !s || !seqs || !t) {
        fprintf(stderr, "dsq-bench sched: %s\n", kv ? "out of memory" : err);
        return 1;
    }
    uint32_t rng = 1;
    uint64_t order = 0;
    for (int i = 0; i < n_seqs; i++) {
        dsq_block_table_init(&seqs[i].s.bt);
        seqs[i].s.owner = &seqs[i];
        seq_reset(&seqs[i], order++, &rng);
        dsq_sched_add(s, &seqs[i].s);
    }
    long tokens = 0, n_running_sum = 0;
    for (int st = 0; st < steps; st++) {
        dsq_sched_out_t out;
        double t0 = now_us();
        if (dsq_sched_step(s, &out) != 0) {
            fprintf(stderr, "dsq-bench sched: step failed\n");
            return 1;
        }
        dsq_sched_commit(s, &out);
        t[st] = now_us() - t0;
        tokens += out.n_tokens;
        n_running_sum += dsq_sched_n_running(s);
        for (int i = 0; i < out.n_logits; i++) {
            bseq_t *b = out.logit_seqs[i]->owner;
            b->s.tokens[b->s.n_tokens++] = 7;
            if (--b->left <= 0 || b->s.n_tokens >= b->s.cap_tokens - 1) {
                dsq_sched_remove(s, &b->s);
                seq_reset(b, order++, &rng);
                dsq_sched_add(s, &b->s);
            }
        }
    }
    double sum = 0;
    for (int i = 0; i < steps; i++)
        sum += t[i];
    qsort(t, (size_t)steps, sizeof(*t), cmp_d);
    printf("sched: %d sequences, %d steps, mean running %.1f, %.1f tokens/step\n", n_seqs,
           steps, (double)n_running_sum / steps, (double)tokens / steps);
    printf("sched: step overhead mean %.2f us, p50 %.2f us, p99 %.2f us\n", sum / steps,
           t[steps / 2], t[(int)(steps * 0.99)]);
    for (int i = 0; i < n_seqs; i++) {
        dsq_sched_remove(s, &seqs[i].s);
        dsq_block_table_deinit(&seqs[i].s.bt);
        free(seqs[i].s.tokens);
    }
    free(seqs);
    free(t);
    dsq_sched_destroy(s);
    dsq_kv_destroy(kv);
    return 0;
}
