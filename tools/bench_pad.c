/* dsq-bench pad: fit the padding cost model (engine/serve/padding.h) on this
 * machine.
 *
 * What a CUDA-graph replay of bucket B costs for a real batch of b decode
 * rows is one forward step of B rows of which B - b are padding: dummy
 * decode tokens the model computes and whose logits are discarded. This
 * measures exactly that on the CPU backend over a grid of (b, B): every
 * bucket B of --buckets, and for each bucket every b <= B among the
 * buckets and the midpoints between consecutive buckets (3, 6, 12, ...);
 * plus (b, b) for the midpoints, the unpadded (ragged, eager) time.
 *
 * Real rows decode at position --context (default 128) over a shared
 * prefilled context (one sequence prefilled once; every real row's block
 * table points at its blocks, plus one private block for the new token),
 * as a decode batch of long-running sequences does. Padding rows decode at
 * position 0 in a private block, as a graph's padding slots do: they cost
 * the matmuls and the lm_head, almost no attention. Every row's logits are
 * computed (a graph replays the whole step).
 *
 * Timing: --reps passes over the whole grid (cells in a fixed order, so
 * load drift spreads over all cells), one untimed warm-up pass first; the
 * cell's time is its best pass (the machine is shared; the minimum is the
 * least disturbed). The fit (dsq_pad_fit) then gives base(b) and k; eager
 * is the measured t(b, b). Prints the table with the model's prediction and
 * residual per cell, the constants, R² and residuals, and writes the JSON
 * to --out (default: dsq_pad_default_path("cpu")). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/common/error.h"
#include "kernels.h"
#include "engine/kv/kv_cache.h"
#include "engine/loader/loader.h"
#include "engine/model/model.h"
#include "engine/serve/padding.h"

#define MAX_CELLS 512

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* "1,2,4" -> sorted distinct sizes; 0 or DSQ_EINVAL */
static int parse_buckets(const char *s, int *out, int *n)
{
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1024 || (*end && *end != ',') || *n == DSQ_PAD_MAX_POINTS)
            return DSQ_EINVAL;
        out[(*n)++] = (int)v;
        s = *end ? end + 1 : end;
    }
    qsort(out, (size_t)*n, sizeof(*out), cmp_int);
    int m = 0;
    for (int i = 0; i < *n; i++)
        if (m == 0 || out[m - 1] != out[i])
            out[m++] = out[i];
    *n = m;
    return *n > 0 ? 0 : DSQ_EINVAL;
}

static void machine_name(char *buf, size_t len)
{
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ' || *c == '\t')
                    c++;
                snprintf(buf, len, "%s", c);
                buf[strcspn(buf, "\n")] = '\0';
            }
            break;
        }
    }
    if (f)
        fclose(f);
}

typedef struct cell {
    int b, bucket;
    double best_s;
} cell_t;

/* the forward-step fixture: arrays for the largest bucket */
typedef struct fixture {
    dsq_model_t *model;
    dsq_kv_cache_t *kv;
    int ctx, block_size, max_blocks, max_rows;
    int32_t *ids, *pos, *row_seq, *slot, *tables, *logit_rows;
    int32_t *own;                 /* [max_rows] private block per row */
    int32_t *shared;              /* [ctx / block_size] context blocks */
    float *logits;
} fixture_t;

/* One step of bucket rows, b of them real. */
static int step(fixture_t *fx, int b, int bucket)
{
    const int nb_ctx = fx->ctx / fx->block_size;
    for (int i = 0; i < bucket; i++) {
        int32_t *t = fx->tables + (size_t)i * (size_t)fx->max_blocks;
        if (i < b) {
            memcpy(t, fx->shared, (size_t)nb_ctx * sizeof(*t));
            t[nb_ctx] = fx->own[i];
            fx->pos[i] = fx->ctx;
        } else {
            for (int j = 0; j < fx->max_blocks; j++)
                t[j] = fx->own[i];
            fx->pos[i] = 0;
        }
        fx->row_seq[i] = i;
        fx->slot[i] = fx->own[i] * fx->block_size;
        fx->logit_rows[i] = i;
    }
    dsq_batch_t bt = {
        .n_tokens = bucket, .tokens = fx->ids, .pos = fx->pos, .row_seq = fx->row_seq,
        .slot = fx->slot, .n_seqs = bucket, .block_tables = fx->tables,
        .max_blocks = fx->max_blocks, .n_logits = bucket, .logit_rows = fx->logit_rows,
    };
    return dsq_model_forward(fx->model, fx->kv, &bt, fx->logits);
}

/* Prefill the shared context once (one sequence, one step). */
static int prefill(fixture_t *fx, dsq_block_table_t *ctx_bt)
{
    int n = fx->ctx;
    int rc = dsq_kv_seq_reserve(fx->kv, ctx_bt, n);
    int32_t *pos = malloc((size_t)n * sizeof(*pos));
    int32_t *rs = calloc((size_t)n, sizeof(*rs));
    int32_t *slot = malloc((size_t)n * sizeof(*slot));
    int32_t *ids = malloc((size_t)n * sizeof(*ids));
    if (!pos || !rs || !slot || !ids)
        rc = rc ? rc : DSQ_ENOMEM;
    for (int i = 0; rc == 0 && i < n; i++) {
        pos[i] = i;
        slot[i] = dsq_kv_slot(fx->kv, ctx_bt, i);
        ids[i] = fx->ids[i % fx->max_rows];
    }
    if (rc == 0) {
        int32_t last = n - 1;
        dsq_batch_t b = {
            .n_tokens = n, .tokens = ids, .pos = pos, .row_seq = rs, .slot = slot,
            .n_seqs = 1, .block_tables = ctx_bt->ids, .max_blocks = (int)ctx_bt->n,
            .n_logits = 1, .logit_rows = &last,
        };
        rc = dsq_model_forward(fx->model, fx->kv, &b, fx->logits);
    }
    free(pos);
    free(rs);
    free(slot);
    free(ids);
    return rc;
}

int dsq__bench_pad(int argc, char **argv);
int dsq__bench_pad(int argc, char **argv)
{
    const char *path = NULL, *out = NULL, *bucket_list = "1,2,4,8,16,32,64";
    int threads = 0, reps = 3, ctx = 128;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--model") == 0 && i + 1 < argc)
            path = argv[++i];
        else if (strcmp(argv[i], "--out") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "--buckets") == 0 && i + 1 < argc)
            bucket_list = argv[++i];
        else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--context") == 0 && i + 1 < argc)
            ctx = atoi(argv[++i]);
        else {
            fprintf(stderr, "dsq-bench pad: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    int bk[DSQ_PAD_MAX_POINTS], n_bk = 0;
    if (!path || reps < 1 || reps > 1000 || ctx < 16 || ctx > 65536 ||
        parse_buckets(bucket_list, bk, &n_bk) != 0 || n_bk < 2) {
        fprintf(stderr, "usage: dsq-bench pad --model PATH [--out FILE] "
                        "[--buckets 1,2,4,8,16,32,64] [--threads N] [--reps 3] "
                        "[--context 128]\n"
                        "  buckets: 2 to %d distinct sizes in 1..1024; context: 16..65536 tokens\n",
                DSQ_PAD_MAX_POINTS);
        return 2;
    }
    if (threads > 0 && dsq_cpu_set_threads(threads) != 0) {
        fprintf(stderr, "dsq-bench pad: bad --threads %d\n", threads);
        return 2;
    }
    char def[4096];
    if (!out) {
        if (dsq_pad_default_path("cpu", def, sizeof(def)) != 0) {
            fprintf(stderr, "dsq-bench pad: neither XDG_CACHE_HOME nor HOME is set; "
                            "pass --out FILE\n");
            return 2;
        }
        out = def;
    }

    /* grid: batch sizes = buckets and midpoints between consecutive ones */
    int gb[2 * DSQ_PAD_MAX_POINTS], n_gb = 0;
    for (int i = 0; i < n_bk; i++) {
        gb[n_gb++] = bk[i];
        int mid = i + 1 < n_bk ? (bk[i] + bk[i + 1]) / 2 : 0;
        if (mid > bk[i] && (i + 1 >= n_bk || mid < bk[i + 1]))
            gb[n_gb++] = mid;
    }
    if (n_gb > DSQ_PAD_MAX_POINTS)
        n_gb = DSQ_PAD_MAX_POINTS;     /* parse_buckets allows 64 buckets: keep the first */
    cell_t *cells = calloc(MAX_CELLS, sizeof(*cells));
    int n_cells = 0;
    for (int i = 0; cells && i < n_gb; i++) {
        bool is_bucket = false;
        for (int j = 0; j < n_bk; j++) {
            is_bucket = is_bucket || bk[j] == gb[i];
            if (bk[j] >= gb[i] && n_cells < MAX_CELLS)
                cells[n_cells++] = (cell_t){gb[i], bk[j], INFINITY};
        }
        if (!is_bucket && n_cells < MAX_CELLS)
            cells[n_cells++] = (cell_t){gb[i], gb[i], INFINITY};
    }

    char err[512] = "";
    int rc = 1;
    fixture_t fx;
    memset(&fx, 0, sizeof(fx));
    dsq_block_table_t ctx_bt;
    dsq_block_table_init(&ctx_bt);
    dsq_block_table_t *own_bt = NULL;
    dsq_pad_sample_t *samples = NULL;
    dsq_pad_model_t *pm = calloc(1, sizeof(*pm));
    dsq_model_file_t *f = dsq_model_file_open(path, NULL, err, sizeof(err));
    if (f)
        fx.model = dsq_model_create(f, &(dsq_model_opts_t){0}, err, sizeof(err));
    fx.block_size = 16;
    fx.ctx = (ctx + fx.block_size - 1) / fx.block_size * fx.block_size;
    fx.max_rows = bk[n_bk - 1];
    fx.max_blocks = fx.ctx / fx.block_size + 1;
    if (fx.model) {
        const dsq_model_config_t *c = dsq_model_config(fx.model);
        int kv_heads, kv_dim;
        bool has_v;
        dsq_model_kv_shape(fx.model, &kv_heads, &kv_dim, &has_v);
        if (fx.ctx + 1 > c->n_ctx_train && c->n_ctx_train > 0) {
            snprintf(err, sizeof(err), "--context %d exceeds the model's %lld positions",
                     fx.ctx, (long long)c->n_ctx_train);
        } else {
            fx.kv = dsq_kv_create_ex((int)c->n_layer, kv_heads, kv_dim, fx.block_size,
                                     fx.max_blocks + fx.max_rows + 1, DSQ_KV_F16, has_v, err,
                                     sizeof(err));
        }
        size_t r = (size_t)fx.max_rows;
        fx.ids = malloc(r * sizeof(int32_t));
        fx.pos = malloc(r * sizeof(int32_t));
        fx.row_seq = malloc(r * sizeof(int32_t));
        fx.slot = malloc(r * sizeof(int32_t));
        fx.logit_rows = malloc(r * sizeof(int32_t));
        fx.own = malloc(r * sizeof(int32_t));
        fx.tables = malloc(r * (size_t)fx.max_blocks * sizeof(int32_t));
        fx.logits = malloc(r * (size_t)c->n_vocab * sizeof(float));
        own_bt = calloc(r, sizeof(*own_bt));
        samples = malloc((size_t)MAX_CELLS * sizeof(*samples));
        uint32_t seed = 42;
        for (int i = 0; fx.ids && i < fx.max_rows; i++) {
            seed = seed * 1664525u + 1013904223u;
            fx.ids[i] = (int32_t)((seed >> 8) % (uint32_t)c->n_vocab);
        }
    }
    if (!fx.model || !fx.kv || !fx.ids || !fx.pos || !fx.row_seq || !fx.slot ||
        !fx.logit_rows || !fx.own || !fx.tables || !fx.logits || !own_bt || !samples ||
        !cells || !pm) {
        fprintf(stderr, "dsq-bench pad: %s\n", err[0] ? err : "out of memory");
        goto out;
    }
    for (int i = 0; i < fx.max_rows; i++) {
        dsq_block_table_init(&own_bt[i]);
        if (dsq_kv_seq_reserve(fx.kv, &own_bt[i], fx.block_size) != 0) {
            fprintf(stderr, "dsq-bench pad: KV cache too small\n");
            goto out;
        }
        fx.own[i] = own_bt[i].ids[0];
    }
    if (prefill(&fx, &ctx_bt) != 0) {
        fprintf(stderr, "dsq-bench pad: context prefill failed\n");
        goto out;
    }
    fx.shared = ctx_bt.ids;

    printf("# dsq-bench pad: model %s, isa %s, threads %d, context %d, reps %d, %d cells\n",
           path, dsq_cpu_isa(), dsq_cpu_get_threads(), fx.ctx, reps, n_cells);
    fflush(stdout);
    double t_start = now_s();
    for (int r = -1; r < reps; r++) {               /* r = -1: warm-up */
        for (int i = 0; i < n_cells; i++) {
            double t0 = now_s();
            if (step(&fx, cells[i].b, cells[i].bucket) != 0) {
                fprintf(stderr, "dsq-bench pad: forward failed (b=%d bucket=%d)\n",
                        cells[i].b, cells[i].bucket);
                goto out;
            }
            double el = now_s() - t0;
            if (r >= 0 && el < cells[i].best_s)
                cells[i].best_s = el;
        }
    }
    double wall = now_s() - t_start;

    for (int i = 0; i < n_cells; i++)
        samples[i] = (dsq_pad_sample_t){cells[i].b, cells[i].bucket, cells[i].best_s * 1e6};
    if (dsq_pad_fit(samples, n_cells, pm, err, sizeof(err)) != 0) {
        fprintf(stderr, "dsq-bench pad: %s\n", err);
        goto out;
    }
    /* eager: the unpadded (ragged) time at every grid batch size */
    for (int i = 0; i < n_cells; i++)
        if (cells[i].b == cells[i].bucket && pm->n_eager < DSQ_PAD_MAX_POINTS)
            pm->eager[pm->n_eager++] = (dsq_pad_point_t){cells[i].b, cells[i].best_s * 1e6};
    for (int i = 1; i < pm->n_eager; i++)      /* insertion sort by b */
        for (int j = i; j > 0 && pm->eager[j - 1].b > pm->eager[j].b; j--) {
            dsq_pad_point_t t = pm->eager[j];
            pm->eager[j] = pm->eager[j - 1];
            pm->eager[j - 1] = t;
        }
    snprintf(pm->backend, sizeof(pm->backend), "cpu");
    machine_name(pm->machine, sizeof(pm->machine));
    const char *slash = strrchr(path, '/');
    snprintf(pm->model_name, sizeof(pm->model_name), "%s", slash ? slash + 1 : path);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(pm->date, sizeof(pm->date), "%Y-%m-%dT%H:%M:%SZ", &tm);
    pm->threads = dsq_cpu_get_threads();
    pm->context = fx.ctx;

    printf("#    b  bucket  pad_ratio  measured_ms  model_ms  residual_ms\n");
    for (int i = 0; i < n_cells; i++) {
        double model_us = 0;
        dsq_pad_cost(pm, cells[i].b, cells[i].bucket, &model_us);
        printf("%6d  %6d  %9.3f  %11.3f  %8.3f  %+11.3f\n", cells[i].b, cells[i].bucket,
               (double)(cells[i].bucket - cells[i].b) / cells[i].bucket,
               cells[i].best_s * 1e3, model_us * 1e-3, cells[i].best_s * 1e3 - model_us * 1e-3);
    }
    printf("# fit: t(b, B) = base(b) + k * ((B - b) / B)^%.1f, least squares over %d cells "
           "(%.1f s of measuring)\n", pm->exponent, pm->fit.n_samples, wall);
    printf("# k = %.3f ms\n# base(b) ms:", pm->k_us * 1e-3);
    for (int i = 0; i < pm->n_base; i++)
        printf(" %d:%.3f", pm->base[i].b, pm->base[i].us * 1e-3);
    printf("\n# R2 = %.4f, R2 of the padding term (within batch size) = %.4f, "
           "rms residual = %.3f ms, max |residual| = %.3f ms\n",
           pm->fit.r2, pm->fit.r2_pad, pm->fit.rms_us * 1e-3, pm->fit.max_abs_us * 1e-3);
    if (pm->fit.n_base_clamped > 0)
        printf("# warning: %d fitted base(b) values were negative and are stored as 0: the "
               "model does not describe these measurements well\n", pm->fit.n_base_clamped);
    if (dsq_pad_model_save(pm, out, err, sizeof(err)) != 0) {
        fprintf(stderr, "dsq-bench pad: %s\n", err);
        goto out;
    }
    printf("# wrote %s\n", out);
    rc = 0;
out:
    for (int i = 0; own_bt && i < fx.max_rows; i++) {
        if (fx.kv)
            dsq_kv_seq_free(fx.kv, &own_bt[i]);
        dsq_block_table_deinit(&own_bt[i]);
    }
    if (fx.kv)
        dsq_kv_seq_free(fx.kv, &ctx_bt);
    dsq_block_table_deinit(&ctx_bt);
    free(own_bt);
    free(samples);
    free(cells);
    free(pm);
    free(fx.ids);
    free(fx.pos);
    free(fx.row_seq);
    free(fx.slot);
    free(fx.logit_rows);
    free(fx.own);
    free(fx.tables);
    free(fx.logits);
    dsq_kv_destroy(fx.kv);
    dsq_model_destroy(fx.model);
    dsq_model_file_close(f);
    return rc;
}
