/* Padding cost model and bucket choice (docs/architecture.md, "Padding
 * cost model"): the cost base + k·pad_ratio^1.8 of running a batch in a
 * larger captured shape.
 *
 * A backend that replays captured CUDA graphs can only run a decode batch
 * in one of a few fixed shapes (buckets, e.g. 1, 2, 4, ... 64 rows). A
 * real batch of b rows then runs in a bucket B >= b, the B - b padding
 * rows are computed and discarded. The seed's dynamic-padding model says
 * what that costs:
 *
 *     t(b, B) = base(b) + k · pad_ratio^1.8,   pad_ratio = (B - b) / B
 *
 * base(b) is a piecewise-linear curve over measured batch sizes, k one
 * constant; both are fitted on the machine by `dsq-bench pad` (linear least
 * squares: with the exponent fixed, the model is linear in base(b_j) and
 * k) and stored as JSON. dsq_pad_choose() turns the model into a plan for
 * one batch: one bucket, several bucket launches (40 -> 32 + 8), or an
 * eager (graph-less) run when the model has an eager curve.
 *
 * The CPU backend runs ragged batches, so there the model is informational
 * (the engine loads and logs it); the CUDA-graph path calls
 * dsq_pad_choose() before each decode replay. Everything here is plain
 * data and functions without hidden state: thread-safe for distinct
 * objects (dsq_pad_default_path reads the environment). */
#ifndef DSQ_PADDING_H
#define DSQ_PADDING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Most points of a base or eager curve. */
#define DSQ_PAD_MAX_POINTS 64
/* Most distinct (bucket, n_real) launch groups in one plan
 * (dsq_pad_choose returns DSQ_ERANGE beyond). */
#define DSQ_PAD_MAX_GROUPS 64
/* Largest real batch dsq_pad_choose plans for (DSQ_ERANGE beyond). */
#define DSQ_PAD_MAX_BATCH 4096
/* Most distinct bucket sizes dsq_pad_choose accepts. */
#define DSQ_PAD_MAX_BUCKETS 64
/* The seed's exponent of pad_ratio. */
#define DSQ_PAD_EXPONENT 1.8

/* One piecewise-linear curve point: batch size (rows) and time (us). */
typedef struct dsq_pad_point {
    int b;
    double us;
} dsq_pad_point_t;

/* Quality of a fit, as dsq_pad_fit reports and the JSON stores it.
 * r2: 1 - SS_res / SS_tot over all samples (SS_tot around their mean);
 * r2_pad: the share of the within-batch-size variance (time differences
 * between buckets for the same b) that the k·pad_ratio^1.8 term explains;
 * rms_us / max_abs_us: residuals in microseconds (of the least-squares
 * solution); n_base_clamped: fitted base(b) values that came out negative
 * and were stored as 0 (a sign that the model does not describe the
 * measurements). */
typedef struct dsq_pad_fit_stats {
    int n_samples;
    int n_base_clamped;
    double r2;
    double r2_pad;
    double rms_us;
    double max_abs_us;
} dsq_pad_fit_stats_t;

/* A fitted model, caller-owned plain data (no pointers; copy freely).
 *   base: [n_base] points with strictly increasing b >= 1, us >= 0 finite.
 *     base(b) interpolates linearly between points; below the first point
 *     it is the first point's value, above the last it extrapolates the
 *     last segment (the last value when there is one point), never < 0.
 *   eager: [n_eager] same rules; n_eager = 0 means "no eager path" (the
 *     plan never runs eagerly).
 *   k_us: the padding coefficient (us), finite; exponent: normally 1.8.
 *   backend ("cpu", "cuda"), machine (CPU or GPU name), date (ISO 8601
 *   UTC), model_name (what was measured), NUL-terminated, may be empty. */
typedef struct dsq_pad_model {
    char backend[16];
    char machine[128];
    char date[32];
    char model_name[128];
    int threads;                       /* CPU threads measured with, 0 = n/a */
    int context;                       /* tokens of context per real row     */
    double exponent;
    double k_us;
    int n_base;
    dsq_pad_point_t base[DSQ_PAD_MAX_POINTS];
    int n_eager;
    dsq_pad_point_t eager[DSQ_PAD_MAX_POINTS];
    dsq_pad_fit_stats_t fit;
} dsq_pad_model_t;

/* One measurement for dsq_pad_fit: real batch b run in bucket B (b <= B),
 * wall time us per step. */
typedef struct dsq_pad_sample {
    int b;
    int bucket;
    double us;
} dsq_pad_sample_t;

/* count identical launches of a plan: bucket rows each (the shape
 * replayed; for the eager run, bucket = n_real = b) carrying n_real real
 * rows each. */
typedef struct dsq_pad_launch {
    int bucket;
    int n_real;
    int count;
} dsq_pad_launch_t;

/* What dsq_pad_choose decided. eager true: one graph-less run of all b
 * rows (n_groups 1, groups[0] = {b, b, 1}). groups: [n_groups], largest
 * bucket first; n_launches = sum of their counts. cost_us: modelled time of
 * the whole plan (sum over launches). n_padded: padding rows in total. */
typedef struct dsq_pad_plan {
    bool eager;
    int n_groups;
    dsq_pad_launch_t groups[DSQ_PAD_MAX_GROUPS];
    int n_launches;
    int n_padded;
    double cost_us;
} dsq_pad_plan_t;

/* Modelled base(b) in us (curve rules above); m must be valid
 * (dsq_pad_model_check). b >= 1. */
double dsq_pad_base(const dsq_pad_model_t *m, int b);

/* Modelled time (us) of real batch b run in bucket B:
 * base(b) + k_us · ((B - b) / B)^exponent.
 * Returns 0, or DSQ_EINVAL when b < 1 or B < b (out untouched). */
int dsq_pad_cost(const dsq_pad_model_t *m, int b, int bucket, double *out_us);

/* Plan real batch b (1 <= b <= DSQ_PAD_MAX_BATCH) over the available
 * buckets ([n_buckets] sizes >= 1, any order, duplicates allowed, at most
 * DSQ_PAD_MAX_BUCKETS distinct): the
 * lowest modelled time among one bucket >= b (the smallest or a larger
 * one), any split of b over several bucket launches (each launch costs
 * dsq_pad_cost of its real rows in its bucket; exact minimum by dynamic
 * programming over the number of rows left), and, when m->n_eager > 0, one
 * eager run costing eager(b). Ties (within 1e-9 relative) go to fewer
 * launches, then fewer padding rows, then the graph plan over the eager
 * one. Time O(b · Σ min(B, b)) over distinct buckets B, memory O(b + Σ
 * min(B, b)); microseconds for b <= 512 and buckets up to 64.
 * Returns 0; DSQ_EINVAL (NULL argument, b < 1, n_buckets < 1, a bucket
 * < 1, more than DSQ_PAD_MAX_BUCKETS distinct buckets), DSQ_ERANGE (b
 * above DSQ_PAD_MAX_BATCH, or the best plan needs more than
 * DSQ_PAD_MAX_GROUPS launch groups), DSQ_ENOMEM. */
int dsq_pad_choose(const dsq_pad_model_t *m, int b, const int *buckets, int n_buckets,
                   dsq_pad_plan_t *plan);

/* Least-squares fit of base(b_j) for every distinct b in the samples and
 * k, with the exponent fixed at DSQ_PAD_EXPONENT (ordinary least squares
 * over design columns one-hot(b) and pad_ratio^1.8: for a given k each
 * base(b_j) is the mean of t - k·x over its samples, and k is the
 * within-group regression slope). Writes out->base (sorted by b),
 * out->k_us, out->exponent, out->fit; leaves the other fields (backend,
 * machine, ...) and eager as they were.
 * Returns 0; DSQ_EINVAL with a reason in err when a sample has b < 1,
 * bucket < b, a non-finite or negative time, there are more than
 * DSQ_PAD_MAX_POINTS distinct b, or no batch size was measured in two
 * buckets with different pad ratios (k not identifiable); DSQ_ENOMEM. */
int dsq_pad_fit(const dsq_pad_sample_t *s, int n, dsq_pad_model_t *out, char *err,
                size_t err_len);

/* Check the invariants listed at dsq_pad_model_t. Returns 0 or
 * DSQ_EFORMAT with the first violation in err. */
int dsq_pad_model_check(const dsq_pad_model_t *m, char *err, size_t err_len);

/* JSON form, format "dsq-padding-model" version 1:
 *   {"format": "dsq-padding-model", "version": 1, "backend": "cpu",
 *    "machine": "...", "date": "2026-11-30T12:00:00Z", "model": "...",
 *    "threads": 2, "context": 128, "exponent": 1.8, "k_us": 123.4,
 *    "base": [[1, 9000.0], [2, 9500.0], ...],
 *    "eager": [[1, 8900.0], ...],                   (optional)
 *    "fit": {"n_samples": 43, "n_base_clamped": 0, "r2": 0.99,
 *            "r2_pad": 0.8, "rms_us": 120.0, "max_abs_us": 400.0}}
 * Parse text[0..len) into *m. Returns 0; DSQ_EFORMAT with the offending
 * key in err for malformed JSON, a wrong format/version, a missing or
 * mistyped key, or values failing dsq_pad_model_check. */
int dsq_pad_model_parse(dsq_pad_model_t *m, const char *text, size_t len, char *err,
                        size_t err_len);
/* Serialize m as above (no validation: see dsq_pad_model_save). Returns a
 * malloc'd NUL-terminated string (caller frees with free()) or NULL when m
 * is NULL or memory runs out. */
char *dsq_pad_model_to_json(const dsq_pad_model_t *m);

/* Read and parse a file (at most 1 MiB). Returns 0; DSQ_ENOTFOUND (no
 * such file), DSQ_EIO (unreadable or too large), DSQ_EFORMAT as
 * dsq_pad_model_parse; err names the path. */
int dsq_pad_model_load(dsq_pad_model_t *m, const char *path, char *err, size_t err_len);
/* Write m to path (creating missing parent directories, mode 0755), via a
 * temporary file renamed into place; a path that exists and is not a
 * regular file (/dev/null, a FIFO) is written in place instead. Returns 0;
 * DSQ_EFORMAT (m fails the check), DSQ_EIO, DSQ_ENOMEM; err says why. */
int dsq_pad_model_save(const dsq_pad_model_t *m, const char *path, char *err,
                       size_t err_len);

/* Default location of the fitted model for a backend:
 * $XDG_CACHE_HOME/dsq/padding-<backend>.json, else
 * $HOME/.cache/dsq/padding-<backend>.json. Returns 0; DSQ_ENOTFOUND when
 * neither variable is set (non-empty); DSQ_ERANGE when buf is too small. */
int dsq_pad_default_path(const char *backend, char *buf, size_t len);

/* Engine start-up: with path non-NULL, load it (any failure is an error:
 * the user asked for that file); with path NULL, load the backend's
 * default file when it exists (a malformed default file is logged as a
 * warning and ignored). Logs one line event=padding_model. *out receives
 * a malloc'd model or NULL when none was loaded; free it with
 * dsq_pad_model_destroy(). Returns 0; with an explicit path, the
 * dsq_pad_model_load error (DSQ_ENOTFOUND, DSQ_EIO, DSQ_EFORMAT) with err
 * "--padding-model PATH: reason"; DSQ_EINVAL (out or backend NULL);
 * DSQ_ENOMEM. */
int dsq_pad_model_open(const char *path, const char *backend, dsq_pad_model_t **out,
                       char *err, size_t err_len);
/* Free a model from dsq_pad_model_open. NULL is a no-op. */
void dsq_pad_model_destroy(dsq_pad_model_t *m);

#endif
