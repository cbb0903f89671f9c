/* Padding cost model: evaluation, bucket choice, least-squares fit and the
 * JSON file (see padding.h for the model and its source).
 *
 * The choice is an exact dynamic program over "rows still to place" rather
 * than a list of hand-picked candidates, so splits like 40 -> 32 + 8 or
 * 40 -> 16 + 16 + 8 are found whenever the model says they are cheaper.
 * The fit is closed-form (fixed-effects regression): no iterative solver,
 * nothing to converge. */
#include "padding.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "engine/common/error.h"
#include "engine/common/log.h"

#define REL_TIE 1e-9
#define MAX_FILE_BYTES (1 << 20)

static double curve_eval(const dsq_pad_point_t *p, int n, int b)
{
    if (n == 1 || b <= p[0].b)
        return p[0].us;
    int i = 1;
    while (i < n - 1 && p[i].b < b)
        i++;
    /* segment [i-1, i]; beyond the last point this extrapolates it */
    double x0 = p[i - 1].b, x1 = p[i].b;
    double v = p[i - 1].us + (p[i].us - p[i - 1].us) * ((double)b - x0) / (x1 - x0);
    return v > 0.0 ? v : 0.0;
}

double dsq_pad_base(const dsq_pad_model_t *m, int b)
{
    return curve_eval(m->base, m->n_base, b);
}

static double cost_of(const dsq_pad_model_t *m, int b, int bucket)
{
    double ratio = (double)(bucket - b) / (double)bucket;
    return dsq_pad_base(m, b) + m->k_us * (ratio > 0.0 ? pow(ratio, m->exponent) : 0.0);
}

int dsq_pad_cost(const dsq_pad_model_t *m, int b, int bucket, double *out_us)
{
    if (!m || !out_us || b < 1 || bucket < b || m->n_base < 1)
        return DSQ_EINVAL;
    *out_us = cost_of(m, b, bucket);
    return 0;
}

/* ------------------------------------------------------------ choice */

/* DP state for "r rows placed": total cost, launches and padding rows, and
 * the last launch (bucket, real rows) to walk the plan back. */
typedef struct cell {
    double cost;
    int launches;
    int padded;
    int bucket;
    int n_real;
} cell_t;

/* a better than b: lower cost (beyond the tie tolerance), then fewer
 * launches, then fewer padding rows. */
static bool better(double ca, int la, int pa, double cb, int lb, int pb)
{
    double tol = REL_TIE * fmax(fabs(ca), fabs(cb));
    if (ca < cb - tol)
        return true;
    if (ca > cb + tol)
        return false;
    if (la != lb)
        return la < lb;
    return pa < pb;
}

static int cmp_int_desc(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x < y) - (x > y);
}

static int cmp_launch(const void *a, const void *b)
{
    const dsq_pad_launch_t *x = a, *y = b;
    if (x->bucket != y->bucket)
        return (x->bucket < y->bucket) - (x->bucket > y->bucket);
    return (x->n_real < y->n_real) - (x->n_real > y->n_real);
}

int dsq_pad_choose(const dsq_pad_model_t *m, int b, const int *buckets, int n_buckets,
                   dsq_pad_plan_t *plan)
{
    if (!m || !buckets || !plan || b < 1 || n_buckets < 1 || m->n_base < 1)
        return DSQ_EINVAL;
    if (b > DSQ_PAD_MAX_BATCH)
        return DSQ_ERANGE;
    int bs[DSQ_PAD_MAX_BUCKETS];
    int n_bs = 0;
    for (int i = 0; i < n_buckets; i++) {
        if (buckets[i] < 1)
            return DSQ_EINVAL;
        bool dup = false;
        for (int j = 0; j < n_bs && !dup; j++)
            dup = bs[j] == buckets[i];
        if (dup)
            continue;
        if (n_bs == DSQ_PAD_MAX_BUCKETS)
            return DSQ_EINVAL;
        bs[n_bs++] = buckets[i];
    }
    qsort(bs, (size_t)n_bs, sizeof(bs[0]), cmp_int_desc);

    /* tab[off[j] + q - 1] = cost of q real rows in bucket bs[j], q <= min(B, b) */
    size_t off[DSQ_PAD_MAX_BUCKETS + 1];
    off[0] = 0;
    for (int j = 0; j < n_bs; j++)
        off[j + 1] = off[j] + (size_t)(bs[j] < b ? bs[j] : b);
    double *tab = malloc(off[n_bs] * sizeof(*tab));
    cell_t *dp = malloc((size_t)(b + 1) * sizeof(*dp));
    int rc = 0;
    if (!tab || !dp) {
        rc = DSQ_ENOMEM;
        goto undo_alloc;
    }
    for (int j = 0; j < n_bs; j++)
        for (size_t q = 1; q <= off[j + 1] - off[j]; q++)
            tab[off[j] + q - 1] = cost_of(m, (int)q, bs[j]);
    dp[0] = (cell_t){0.0, 0, 0, 0, 0};
    for (int r = 1; r <= b; r++) {
        cell_t best = {INFINITY, 0, 0, 0, 0};
        for (int j = 0; j < n_bs; j++) {
            int qmax = bs[j] < r ? bs[j] : r;
            for (int q = 1; q <= qmax; q++) {
                const cell_t *prev = &dp[r - q];
                double c = prev->cost + tab[off[j] + (size_t)q - 1];
                int l = prev->launches + 1, p = prev->padded + bs[j] - q;
                if (isinf(best.cost) || better(c, l, p, best.cost, best.launches, best.padded))
                    best = (cell_t){c, l, p, bs[j], q};
            }
        }
        dp[r] = best;
    }
    memset(plan, 0, sizeof(*plan));
    const cell_t *g = &dp[b];
    bool eager = false;
    if (m->n_eager > 0) {
        double ce = curve_eval(m->eager, m->n_eager, b);
        /* eager is one launch without padding: on a cost tie it wins over a
         * split or a padded bucket and loses to an exact single bucket */
        eager = better(ce, 1, 0, g->cost, g->launches, g->padded);
        if (eager) {
            plan->eager = true;
            plan->n_groups = 1;
            plan->groups[0] = (dsq_pad_launch_t){b, b, 1};
            plan->n_launches = 1;
            plan->cost_us = ce;
            goto undo_alloc;
        }
    }
    dsq_pad_launch_t tmp[DSQ_PAD_MAX_GROUPS];
    int n_tmp = 0;
    for (int r = b; r > 0; r -= dp[r].n_real) {
        int k;
        for (k = 0; k < n_tmp; k++)
            if (tmp[k].bucket == dp[r].bucket && tmp[k].n_real == dp[r].n_real)
                break;
        if (k == n_tmp) {
            if (n_tmp == DSQ_PAD_MAX_GROUPS) {
                rc = DSQ_ERANGE;
                goto undo_alloc;
            }
            tmp[n_tmp++] = (dsq_pad_launch_t){dp[r].bucket, dp[r].n_real, 0};
        }
        tmp[k].count++;
    }
    qsort(tmp, (size_t)n_tmp, sizeof(tmp[0]), cmp_launch);
    memcpy(plan->groups, tmp, (size_t)n_tmp * sizeof(tmp[0]));
    plan->n_groups = n_tmp;
    plan->n_launches = g->launches;
    plan->n_padded = g->padded;
    plan->cost_us = g->cost;
undo_alloc:
    free(tab);
    free(dp);
    return rc;
}

/* ------------------------------------------------------------ fit */

static int cmp_sample_b(const void *a, const void *b)
{
    const dsq_pad_sample_t *x = a, *y = b;
    return (x->b > y->b) - (x->b < y->b);
}

int dsq_pad_fit(const dsq_pad_sample_t *s, int n, dsq_pad_model_t *out, char *err,
                size_t err_len)
{
    char msg[160];
    if (!s || !out || n < 2) {
        dsq_error_set(err, err_len, "%s%s", "padding fit: need at least 2 samples", "");
        return DSQ_EINVAL;
    }
    for (int i = 0; i < n; i++) {
        if (s[i].b < 1 || s[i].bucket < s[i].b || !isfinite(s[i].us) || s[i].us < 0) {
            snprintf(msg, sizeof(msg), "sample %d (b=%d bucket=%d us=%g)", i, s[i].b,
                     s[i].bucket, s[i].us);
            dsq_error_set(err, err_len, "padding fit: bad %s: need 1 <= b <= bucket, time >= 0%s",
                    msg, "");
            return DSQ_EINVAL;
        }
    }
    dsq_pad_sample_t *v = malloc((size_t)n * sizeof(*v));
    double *x = malloc((size_t)n * sizeof(*x));
    if (!v || !x) {
        free(v);
        free(x);
        return DSQ_ENOMEM;
    }
    memcpy(v, s, (size_t)n * sizeof(*v));
    qsort(v, (size_t)n, sizeof(*v), cmp_sample_b);
    for (int i = 0; i < n; i++)
        x[i] = pow((double)(v[i].bucket - v[i].b) / (double)v[i].bucket, DSQ_PAD_EXPONENT);

    /* groups of equal b are contiguous; pass 1: means and the slope */
    int rc = 0, n_groups = 0;
    double mt[DSQ_PAD_MAX_POINTS], mx[DSQ_PAD_MAX_POINTS];
    int gb[DSQ_PAD_MAX_POINTS];
    double sxx = 0, sxy = 0, t_sum = 0;
    for (int i = 0; i < n;) {
        int j = i;
        double st = 0, sx = 0;
        while (j < n && v[j].b == v[i].b) {
            st += v[j].us;
            sx += x[j];
            j++;
        }
        if (n_groups == DSQ_PAD_MAX_POINTS) {
            dsq_error_set(err, err_len, "padding fit: more than %s distinct batch sizes%s", "64", "");
            rc = DSQ_EINVAL;
            goto undo_alloc;
        }
        mt[n_groups] = st / (j - i);
        mx[n_groups] = sx / (j - i);
        gb[n_groups] = v[i].b;
        for (int q = i; q < j; q++) {
            sxx += (x[q] - mx[n_groups]) * (x[q] - mx[n_groups]);
            sxy += (x[q] - mx[n_groups]) * (v[q].us - mt[n_groups]);
        }
        t_sum += st;
        n_groups++;
        i = j;
    }
    if (!(sxx > 1e-12)) {
        dsq_error_set(err, err_len, "padding fit: k is not identifiable: no batch size was measured "
                "in two buckets with different pad ratios%s%s", "", "");
        rc = DSQ_EINVAL;
        goto undo_alloc;
    }
    double k = sxy / sxx;
    /* pass 2: residuals */
    double ss_res = 0, ss_tot = 0, ss_within = 0, max_abs = 0, t_mean = t_sum / n;
    for (int i = 0, g = 0; i < n; i++) {
        while (gb[g] != v[i].b)
            g++;
        double e = v[i].us - (mt[g] - k * mx[g]) - k * x[i];
        ss_res += e * e;
        ss_tot += (v[i].us - t_mean) * (v[i].us - t_mean);
        ss_within += (v[i].us - mt[g]) * (v[i].us - mt[g]);
        max_abs = fmax(max_abs, fabs(e));
    }
    out->exponent = DSQ_PAD_EXPONENT;
    out->k_us = k;
    out->n_base = n_groups;
    int n_clamped = 0;
    for (int g = 0; g < n_groups; g++) {
        double base = mt[g] - k * mx[g];
        n_clamped += base < 0.0;
        out->base[g] = (dsq_pad_point_t){gb[g], base > 0.0 ? base : 0.0};
    }
    out->fit = (dsq_pad_fit_stats_t){
        .n_samples = n,
        .n_base_clamped = n_clamped,
        .r2 = ss_tot > 0 ? 1.0 - ss_res / ss_tot : 1.0,
        .r2_pad = ss_within > 0 ? 1.0 - ss_res / ss_within : 1.0,
        .rms_us = sqrt(ss_res / n),
        .max_abs_us = max_abs,
    };
undo_alloc:
    free(v);
    free(x);
    return rc;
}

/* ------------------------------------------------------------ checks, JSON */

static int check_curve(const char *name, const dsq_pad_point_t *p, int n, bool may_be_empty,
                       char *err, size_t err_len)
{
    if (n < (may_be_empty ? 0 : 1) || n > DSQ_PAD_MAX_POINTS) {
        dsq_error_set(err, err_len, "padding model: \"%s\" needs 1..64 points%s", name, "");
        return DSQ_EFORMAT;
    }
    for (int i = 0; i < n; i++) {
        if (p[i].b < 1 || !isfinite(p[i].us) || p[i].us < 0 || (i > 0 && p[i].b <= p[i - 1].b)) {
            dsq_error_set(err, err_len, "padding model: \"%s\" points need batch sizes >= 1 in "
                    "increasing order and finite times >= 0%s", name, "");
            return DSQ_EFORMAT;
        }
    }
    return 0;
}

int dsq_pad_model_check(const dsq_pad_model_t *m, char *err, size_t err_len)
{
    if (!m) {
        dsq_error_set(err, err_len, "padding model: NULL%s%s", "", "");
        return DSQ_EFORMAT;
    }
    if (!isfinite(m->k_us) || !isfinite(m->exponent) || m->exponent <= 0) {
        dsq_error_set(err, err_len, "padding model: \"k_us\" and \"exponent\" must be finite "
                "(exponent > 0)%s%s", "", "");
        return DSQ_EFORMAT;
    }
    int rc = check_curve("base", m->base, m->n_base, false, err, err_len);
    return rc ? rc : check_curve("eager", m->eager, m->n_eager, true, err, err_len);
}

static void put_curve(cJSON *o, const char *name, const dsq_pad_point_t *p, int n)
{
    cJSON *a = cJSON_AddArrayToObject(o, name);
    for (int i = 0; a && i < n; i++) {
        cJSON *pt = cJSON_CreateArray();
        cJSON_AddItemToArray(pt, cJSON_CreateNumber(p[i].b));
        cJSON_AddItemToArray(pt, cJSON_CreateNumber(p[i].us));
        cJSON_AddItemToArray(a, pt);
    }
}

char *dsq_pad_model_to_json(const dsq_pad_model_t *m)
{
    cJSON *o = m ? cJSON_CreateObject() : NULL;
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "format", "dsq-padding-model");
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddStringToObject(o, "backend", m->backend);
    cJSON_AddStringToObject(o, "machine", m->machine);
    cJSON_AddStringToObject(o, "date", m->date);
    cJSON_AddStringToObject(o, "model", m->model_name);
    cJSON_AddNumberToObject(o, "threads", m->threads);
    cJSON_AddNumberToObject(o, "context", m->context);
    cJSON_AddNumberToObject(o, "exponent", m->exponent);
    cJSON_AddNumberToObject(o, "k_us", m->k_us);
    put_curve(o, "base", m->base, m->n_base);
    if (m->n_eager > 0)
        put_curve(o, "eager", m->eager, m->n_eager);
    cJSON *f = cJSON_AddObjectToObject(o, "fit");
    if (f) {
        cJSON_AddNumberToObject(f, "n_samples", m->fit.n_samples);
        cJSON_AddNumberToObject(f, "n_base_clamped", m->fit.n_base_clamped);
        cJSON_AddNumberToObject(f, "r2", m->fit.r2);
        cJSON_AddNumberToObject(f, "r2_pad", m->fit.r2_pad);
        cJSON_AddNumberToObject(f, "rms_us", m->fit.rms_us);
        cJSON_AddNumberToObject(f, "max_abs_us", m->fit.max_abs_us);
    }
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    return s;
}

static int get_str(const cJSON *o, const char *key, char *dst, size_t cap, char *err,
                   size_t err_len)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it) {
        dst[0] = '\0';
        return 0;
    }
    if (!cJSON_IsString(it) || strlen(it->valuestring) >= cap) {
        dsq_error_set(err, err_len, "padding model: \"%s\" must be a string (%s)", key,
                "shorter than its field");
        return DSQ_EFORMAT;
    }
    strcpy(dst, it->valuestring);
    return 0;
}

static int get_num(const cJSON *o, const char *key, bool required, double *out, char *err,
                   size_t err_len)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!it && !required)
        return 0;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble)) {
        dsq_error_set(err, err_len, "padding model: \"%s\" %s", key,
                it ? "must be a finite number" : "is missing");
        return DSQ_EFORMAT;
    }
    *out = it->valuedouble;
    return 0;
}

static int get_int(const cJSON *o, const char *key, int *out, char *err, size_t err_len)
{
    double d = 0;
    int rc = get_num(o, key, false, &d, err, err_len);
    if (rc == 0 && (d != floor(d) || d < 0 || d > 1e9)) {
        dsq_error_set(err, err_len, "padding model: \"%s\" %s", key, "must be an integer >= 0");
        rc = DSQ_EFORMAT;
    }
    if (rc == 0)
        *out = (int)d;
    return rc;
}

static int get_curve(const cJSON *o, const char *key, bool required, dsq_pad_point_t *p,
                     int *n, char *err, size_t err_len)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, key);
    *n = 0;
    if (!a && !required)
        return 0;
    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > DSQ_PAD_MAX_POINTS) {
        dsq_error_set(err, err_len, "padding model: \"%s\" %s", key,
                a ? "must be an array of at most 64 [batch, us] pairs" : "is missing");
        return DSQ_EFORMAT;
    }
    const cJSON *pt;
    cJSON_ArrayForEach(pt, a) {
        const cJSON *b = cJSON_GetArrayItem(pt, 0), *us = cJSON_GetArrayItem(pt, 1);
        if (!cJSON_IsArray(pt) || cJSON_GetArraySize(pt) != 2 || !cJSON_IsNumber(b) ||
            !cJSON_IsNumber(us) || b->valuedouble != floor(b->valuedouble) ||
            b->valuedouble < 1 || b->valuedouble > 1e9) {
            dsq_error_set(err, err_len, "padding model: \"%s\" %s", key,
                    "entries must be [batch size (integer >= 1), microseconds]");
            return DSQ_EFORMAT;
        }
        p[*n] = (dsq_pad_point_t){(int)b->valuedouble, us->valuedouble};
        (*n)++;
    }
    return 0;
}

int dsq_pad_model_parse(dsq_pad_model_t *m, const char *text, size_t len, char *err,
                        size_t err_len)
{
    if (!m || !text) {
        dsq_error_set(err, err_len, "padding model: NULL argument%s%s", "", "");
        return DSQ_EINVAL;
    }
    cJSON *o = cJSON_ParseWithLength(text, len);
    dsq_pad_model_t t;
    memset(&t, 0, sizeof(t));
    int rc = 0;
    if (!cJSON_IsObject(o)) {
        dsq_error_set(err, err_len, "padding model: %s%s",
                o ? "top level must be a JSON object" : "not valid JSON", "");
        rc = DSQ_EFORMAT;
        goto undo_json;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(o, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(o, "version");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "dsq-padding-model") != 0 ||
        !cJSON_IsNumber(ver) || ver->valuedouble != 1) {
        dsq_error_set(err, err_len, "padding model: %s%s",
                "\"format\" must be \"dsq-padding-model\" and \"version\" 1", "");
        rc = DSQ_EFORMAT;
        goto undo_json;
    }
    double fit_n = 0, fit_clamped = 0;
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, "fit");
    if (f && !cJSON_IsObject(f)) {
        dsq_error_set(err, err_len, "padding model: \"%s\" %s", "fit", "must be an object");
        rc = DSQ_EFORMAT;
        goto undo_json;
    }
    t.exponent = DSQ_PAD_EXPONENT;
    if ((rc = get_str(o, "backend", t.backend, sizeof(t.backend), err, err_len)) ||
        (rc = get_str(o, "machine", t.machine, sizeof(t.machine), err, err_len)) ||
        (rc = get_str(o, "date", t.date, sizeof(t.date), err, err_len)) ||
        (rc = get_str(o, "model", t.model_name, sizeof(t.model_name), err, err_len)) ||
        (rc = get_int(o, "threads", &t.threads, err, err_len)) ||
        (rc = get_int(o, "context", &t.context, err, err_len)) ||
        (rc = get_num(o, "exponent", false, &t.exponent, err, err_len)) ||
        (rc = get_num(o, "k_us", true, &t.k_us, err, err_len)) ||
        (rc = get_curve(o, "base", true, t.base, &t.n_base, err, err_len)) ||
        (rc = get_curve(o, "eager", false, t.eager, &t.n_eager, err, err_len)))
        goto undo_json;
    if (f && ((rc = get_num(f, "n_samples", false, &fit_n, err, err_len)) ||
              (rc = get_num(f, "n_base_clamped", false, &fit_clamped, err, err_len)) ||
              (rc = get_num(f, "r2", false, &t.fit.r2, err, err_len)) ||
              (rc = get_num(f, "r2_pad", false, &t.fit.r2_pad, err, err_len)) ||
              (rc = get_num(f, "rms_us", false, &t.fit.rms_us, err, err_len)) ||
              (rc = get_num(f, "max_abs_us", false, &t.fit.max_abs_us, err, err_len))))
        goto undo_json;
    t.fit.n_samples = fit_n >= 0 && fit_n < 1e9 ? (int)fit_n : 0;
    t.fit.n_base_clamped = fit_clamped >= 0 && fit_clamped < 1e9 ? (int)fit_clamped : 0;
    if ((rc = dsq_pad_model_check(&t, err, err_len)) == 0)
        *m = t;
undo_json:
    cJSON_Delete(o);
    return rc;
}

/* ------------------------------------------------------------ files */

int dsq_pad_model_load(dsq_pad_model_t *m, const char *path, char *err, size_t err_len)
{
    if (!m || !path) {
        dsq_error_set(err, err_len, "padding model: NULL argument%s%s", "", "");
        return DSQ_EINVAL;
    }
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        int e = errno;
        dsq_error_set(err, err_len, "%.400s: %s", path, strerror(e));
        return e == ENOENT ? DSQ_ENOTFOUND : DSQ_EIO;
    }
    char *buf = malloc(MAX_FILE_BYTES + 1);
    int rc = 0;
    size_t n = buf ? fread(buf, 1, MAX_FILE_BYTES + 1, fp) : 0;
    if (!buf) {
        rc = DSQ_ENOMEM;
        dsq_error_set(err, err_len, "%.400s: %s", path, "out of memory");
    } else if (ferror(fp) || n > MAX_FILE_BYTES) {
        rc = DSQ_EIO;
        dsq_error_set(err, err_len, "%.400s: %s", path,
                ferror(fp) ? "read error" : "larger than 1 MiB");
    } else {
        char why[256] = "";
        rc = dsq_pad_model_parse(m, buf, n, why, sizeof(why));
        if (rc)
            dsq_error_set(err, err_len, "%.400s: %s", path, why);
    }
    free(buf);
    fclose(fp);
    return rc;
}

/* mkdir -p of path's directory part */
static int make_parents(const char *path)
{
    char *d = strdup(path);
    if (!d)
        return DSQ_ENOMEM;
    int rc = 0;
    for (char *p = d + 1; *p && rc == 0; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(d, 0755) != 0 && errno != EEXIST)
            rc = DSQ_EIO;
        *p = '/';
    }
    free(d);
    return rc;
}

/* json and a newline to fp, which is closed. Returns whether all of it was
 * written. */
static bool write_json(FILE *fp, const char *json)
{
    const size_t n = strlen(json);
    bool ok = fwrite(json, 1, n, fp) == n && fputc('\n', fp) != EOF;
    return (fclose(fp) == 0) && ok;
}

int dsq_pad_model_save(const dsq_pad_model_t *m, const char *path, char *err,
                       size_t err_len)
{
    int rc = dsq_pad_model_check(m, err, err_len);
    if (rc)
        return rc;
    if (!path) {
        dsq_error_set(err, err_len, "padding model: NULL path%s%s", "", "");
        return DSQ_EINVAL;
    }
    char *json = dsq_pad_model_to_json(m);
    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    if (!json || !tmp) {
        rc = DSQ_ENOMEM;
        dsq_error_set(err, err_len, "%.400s: %s", path, "out of memory");
        goto undo_alloc;
    }
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        /* /dev/null, a FIFO, a terminal: written in place, since renaming
         * over it would replace the node itself (as root, /dev/null) */
        FILE *fp = S_ISDIR(st.st_mode) ? NULL : fopen(path, "wb");
        if (!fp || !write_json(fp, json)) {
            rc = DSQ_EIO;
            dsq_error_set(err, err_len, "%.400s: %s", path,
                          S_ISDIR(st.st_mode) ? "is a directory" : fp ? "write failed"
                                                                     : strerror(errno));
        }
        goto undo_alloc;
    }
    snprintf(tmp, tl, "%s.tmp.%ld", path, (long)getpid());
    if (make_parents(path) != 0) {
        rc = DSQ_EIO;
        dsq_error_set(err, err_len, "%.400s: cannot create its directory: %s", path, strerror(errno));
        goto undo_alloc;
    }
    FILE *fp = fopen(tmp, "wb");
    if (!fp) {
        rc = DSQ_EIO;
        dsq_error_set(err, err_len, "%.400s: %s", tmp, strerror(errno));
        goto undo_alloc;
    }
    bool ok = write_json(fp, json);
    if (!ok || rename(tmp, path) != 0) {
        rc = DSQ_EIO;
        dsq_error_set(err, err_len, "%.400s: %s", path, ok ? strerror(errno) : "write failed");
        unlink(tmp);
    }
undo_alloc:
    free(json);
    free(tmp);
    return rc;
}

int dsq_pad_default_path(const char *backend, char *buf, size_t len)
{
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (!backend || !buf)
        return DSQ_EINVAL;
    if (xdg && *xdg)
        n = snprintf(buf, len, "%s/dsq/padding-%s.json", xdg, backend);
    else if (home && *home)
        n = snprintf(buf, len, "%s/.cache/dsq/padding-%s.json", home, backend);
    else
        return DSQ_ENOTFOUND;
    return n < 0 || (size_t)n >= len ? DSQ_ERANGE : 0;
}

int dsq_pad_model_open(const char *path, const char *backend, dsq_pad_model_t **out,
                       char *err, size_t err_len)
{
    char def[4096];
    if (!out || !backend) {
        dsq_error_set(err, err_len, "padding model: NULL argument%s%s", "", "");
        return DSQ_EINVAL;
    }
    *out = NULL;
    bool explicit_path = path != NULL;
    if (!path) {
        if (dsq_pad_default_path(backend, def, sizeof(def)) != 0)
            return 0;
        path = def;
    }
    dsq_pad_model_t *m = malloc(sizeof(*m));
    if (!m) {
        dsq_error_set(err, err_len, "padding model: %s%s", "out of memory", "");
        return DSQ_ENOMEM;
    }
    char why[512] = "";
    int rc = dsq_pad_model_load(m, path, why, sizeof(why));
    if (rc != 0) {
        free(m);
        if (explicit_path) {
            dsq_error_set(err, err_len, "--padding-model %s%s", why, "");
            return rc;
        }
        if (rc != DSQ_ENOTFOUND)
            dsq_log(DSQ_LOG_WARN, "event=padding_model_ignored reason=\"%s\"", why);
        return 0;
    }
    dsq_log(DSQ_LOG_INFO, "event=padding_model path=%s backend=%s machine=\"%s\" date=%s "
            "k_us=%.1f n_base=%d n_eager=%d r2=%.4f rms_us=%.1f use=%s", path, m->backend,
            m->machine, m->date, m->k_us, m->n_base, m->n_eager, m->fit.r2, m->fit.rms_us,
            strcmp(backend, "cpu") == 0 ? "informational_ragged_batches"
                                        : "graph_buckets");
    *out = m;
    return 0;
}

void dsq_pad_model_destroy(dsq_pad_model_t *m)
{
    free(m);
}
