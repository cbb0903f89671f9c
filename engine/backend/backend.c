/* The backend layer's public functions (backend.h): creation, the byte
 * accounting every backend shares, weight upload, and one dispatching
 * wrapper per op of backend_ops.inc. The backends themselves live in
 * backend_cpu.c and backend_cuda.c.
 *
 * Dispatch costs one indirect call per op; the CPU ops themselves take
 * microseconds or more, so the graphs pay nothing measurable for it
 * (docs/benchmarks.md, "backend layer"). */
#include "backend_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsq_config.h"
#include "engine/common/error.h"

/* ------------------------------------------------------- create/destroy */

dsq_backend_t *dsq_backend_create(dsq_backend_kind_t kind, char *err, size_t err_len)
{
    dsq_backend_t *be = calloc(1, sizeof(*be));
    if (!be) {
        snprintf(err, err_len, "backend: out of memory");
        return NULL;
    }
    be->kind = kind;
    switch (kind) {
    case DSQ_BACKEND_CPU:
        be->ops = &dsq__backend_cpu_ops;
        return be;
    case DSQ_BACKEND_CUDA:
#if DSQ_HAVE_CUDA
        if (dsq__backend_cuda_init(be, err, err_len) == DSQ_OK)
            return be;
#else
        snprintf(err, err_len,
                 "backend: this dsq was built without CUDA (meson setup -Dcuda=enabled "
                 "on a machine with the CUDA toolkit)");
#endif
        break;
    default:
        snprintf(err, err_len, "backend: unknown backend kind %d", (int)kind);
        break;
    }
    free(be);
    return NULL;
}

void dsq_backend_destroy(dsq_backend_t *be)
{
    if (!be || be->is_singleton)
        return;
    if (be->ops->destroy)
        be->ops->destroy(be);
    free(be);
}

dsq_backend_kind_t dsq_backend_kind(const dsq_backend_t *be) { return be->kind; }
const char *dsq_backend_name(const dsq_backend_t *be) { return be->ops->name; }
bool dsq_backend_is_host(const dsq_backend_t *be) { return be->ops->is_host; }

void dsq_backend_describe(const dsq_backend_t *be, char *buf, size_t len)
{
    if (!buf || len == 0)
        return;
    buf[0] = '\0';
    be->ops->describe(be, buf, len);
}

/* ------------------------------------------------------------- memory */

void *dsq_backend_alloc(dsq_backend_t *be, size_t bytes)
{
    if (bytes == 0)
        return NULL;
    void *p = be->ops->alloc(be, bytes);
    if (!p)
        return NULL;
    size_t now = atomic_fetch_add(&be->allocated, bytes) + bytes;
    size_t peak = atomic_load(&be->peak);
    while (now > peak && !atomic_compare_exchange_weak(&be->peak, &peak, now))
        ;
    return p;
}

void dsq_backend_free(dsq_backend_t *be, void *p)
{
    if (!p)
        return;
    atomic_fetch_sub(&be->allocated, be->ops->free(be, p));
}

size_t dsq_backend_allocated_bytes(const dsq_backend_t *be)
{
    return atomic_load(&((dsq_backend_t *)be)->allocated);
}

size_t dsq_backend_peak_bytes(const dsq_backend_t *be)
{
    return atomic_load(&((dsq_backend_t *)be)->peak);
}

int dsq_backend_upload(dsq_backend_t *be, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return DSQ_OK;
    if (!dst || !src)
        return DSQ_EINVAL;
    return be->ops->upload(be, dst, src, bytes);
}

int dsq_backend_download(dsq_backend_t *be, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return DSQ_OK;
    if (!dst || !src)
        return DSQ_EINVAL;
    return be->ops->download(be, dst, src, bytes);
}

int dsq_backend_copy(dsq_backend_t *be, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return DSQ_OK;
    if (!dst || !src)
        return DSQ_EINVAL;
    return be->ops->copy(be, dst, src, bytes);
}

int dsq_backend_memset(dsq_backend_t *be, void *dst, int value, size_t bytes)
{
    if (bytes == 0)
        return DSQ_OK;
    if (!dst)
        return DSQ_EINVAL;
    return be->ops->memset(be, dst, value, bytes);
}

int dsq_backend_sync(dsq_backend_t *be) { return be->ops->sync(be); }

int dsq_backend_mem_info(dsq_backend_t *be, size_t *free_bytes, size_t *total_bytes)
{
    return be->ops->mem_info ? be->ops->mem_info(be, free_bytes, total_bytes)
                             : DSQ_EUNSUPPORTED;
}

/* ------------------------------------------------------------- weights */

static int upload_part(dsq_backend_t *be, const void *src, size_t bytes, void **out,
                       size_t *total)
{
    *out = NULL;
    if (!src || bytes == 0)
        return DSQ_OK;
    *out = dsq_backend_alloc(be, bytes);
    if (!*out)
        return DSQ_ENOMEM;
    *total += bytes;
    return dsq_backend_upload(be, *out, src, bytes);
}

int dsq_backend_weight_upload(dsq_backend_t *be, const dsq_weight_t *w,
                              dsq_weight_t *out, size_t *bytes)
{
    if (bytes)
        *bytes = 0;
    dsq_weight_bytes_t lb;
    if (!w || !out || dsq_weight_check(w) != DSQ_OK || dsq_weight_layout(w, &lb) != DSQ_OK)
        return DSQ_EINVAL;
    if (be->ops->is_host) {
        *out = *w;
        return DSQ_OK;
    }
    dsq_weight_t d = *w;
    size_t total = 0;
    void *data = NULL, *scales = NULL, *zeros = NULL, *bias = NULL;
    void *sub_s = NULL, *sub_z = NULL, *sup = NULL;
    int rc = upload_part(be, w->data, lb.data, &data, &total);
    if (!rc)
        rc = upload_part(be, w->scales, lb.scales, &scales, &total);
    if (!rc)
        rc = upload_part(be, w->zeros, lb.zeros, &zeros, &total);
    if (!rc)
        rc = upload_part(be, w->sub_scales, lb.scales, &sub_s, &total);
    if (!rc)
        rc = upload_part(be, w->sub_zeros, lb.zeros, &sub_z, &total);
    if (!rc)
        rc = upload_part(be, w->super, lb.super, &sup, &total);
    if (!rc)
        rc = upload_part(be, w->bias, (size_t)w->n * sizeof(float), &bias, &total);
    if (rc) {
        void *all[] = {data, scales, zeros, sub_s, sub_z, sup, bias};
        for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
            dsq_backend_free(be, all[i]);
        return rc;
    }
    d.data = data;
    d.scales = scales;
    d.zeros = zeros;
    d.sub_scales = sub_s;
    d.sub_zeros = sub_z;
    d.super = sup;
    d.bias = bias;
    *out = d;
    if (bytes)
        *bytes = total;
    return DSQ_OK;
}

void dsq_backend_weight_free(dsq_backend_t *be, dsq_weight_t *w)
{
    if (!w)
        return;
    if (!be->ops->is_host) {
        dsq_backend_free(be, (void *)w->data);
        dsq_backend_free(be, (void *)w->scales);
        dsq_backend_free(be, (void *)w->zeros);
        dsq_backend_free(be, (void *)w->sub_scales);
        dsq_backend_free(be, (void *)w->sub_zeros);
        dsq_backend_free(be, (void *)w->super);
        dsq_backend_free(be, (void *)w->bias);
    }
    memset(w, 0, sizeof(*w));
}

/* -------------------------------------------------------- host threads */

int dsq_backend_set_host_threads(int n_threads) { return dsq_cpu_set_threads(n_threads); }
int dsq_backend_host_threads(void) { return dsq_cpu_get_threads(); }
const char *dsq_backend_host_isa(void) { return dsq_cpu_isa(); }

/* ----------------------------------------------------------------- ops */

#define DSQ_BACKEND_OP(op, params, args, on_cpu, on_cuda)                          \
    int dsq_backend_##op(dsq_backend_t *be, DSQ__BACKEND_UNPAREN params)           \
    {                                                                            \
        return be->ops->op ? be->ops->op(be, DSQ__BACKEND_UNPAREN args)            \
                           : DSQ_EUNSUPPORTED;                                   \
    }
#include "backend_ops.inc"

static const char *const op_names[] = {
#define DSQ_BACKEND_OP(op, params, args, on_cpu, on_cuda) #op,
#include "backend_ops.inc"
};

const char *dsq_backend_op_name(int i)
{
    return i >= 0 && i < (int)(sizeof(op_names) / sizeof(op_names[0])) ? op_names[i] : NULL;
}

bool dsq_backend_has_op(const dsq_backend_t *be, const char *name)
{
    if (!be || !name)
        return false;
#define DSQ_BACKEND_OP(op, params, args, on_cpu, on_cuda) \
    if (strcmp(name, #op) == 0)                         \
        return be->ops->op != NULL;
#include "backend_ops.inc"
    return false;
}
