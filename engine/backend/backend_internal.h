/* Shared by the backend files (backend.c: the public functions, memory
 * accounting and weight upload; backend_cpu.c: the CPU backend;
 * backend_cuda.c: the CUDA backend). Not an API: the model graphs see only
 * backend.h.
 *
 * A backend is an op table plus the backend's own state. Every public
 * dsq_backend_* op dispatches through the table; a NULL entry answers
 * DSQ_EUNSUPPORTED. Allocation goes through backend.c so that
 * dsq_backend_allocated_bytes counts every byte whichever backend it is. */
#ifndef DSQ_BACKEND_INTERNAL_H
#define DSQ_BACKEND_INTERNAL_H

#include <stdatomic.h>

#include "backend.h"

typedef struct dsq_backend_ops {
    const char *name;
    bool is_host;
    void (*destroy)(dsq_backend_t *be);
    void (*describe)(const dsq_backend_t *be, char *buf, size_t len);
    /* raw allocation; free returns the bytes the pointer held */
    void *(*alloc)(dsq_backend_t *be, size_t bytes);
    size_t (*free)(dsq_backend_t *be, void *p);
    int (*upload)(dsq_backend_t *be, void *dst, const void *src, size_t bytes);
    int (*download)(dsq_backend_t *be, void *dst, const void *src, size_t bytes);
    int (*copy)(dsq_backend_t *be, void *dst, const void *src, size_t bytes);
    int (*memset)(dsq_backend_t *be, void *dst, int value, size_t bytes);
    int (*sync)(dsq_backend_t *be);
    int (*mem_info)(dsq_backend_t *be, size_t *free_bytes, size_t *total_bytes);

    /* one slot per row of backend_ops.inc; NULL: DSQ_EUNSUPPORTED */
#define DSQ_BACKEND_OP(op, params, args, cpu, cuda) \
    int (*op)(dsq_backend_t *be, DSQ__BACKEND_UNPAREN params);
#include "backend_ops.inc"
} dsq_backend_ops_t;

/* Visible to every thread that shares the backend (the CPU singleton):
 * the counters are atomic, the rest is written once at creation. */
struct dsq_backend {
    const dsq_backend_ops_t *ops;
    dsq_backend_kind_t kind;
    bool is_singleton;         /* dsq_backend_cpu(): destroy is a no-op */
    atomic_size_t allocated;   /* bytes held now                        */
    atomic_size_t peak;        /* most bytes held at once               */
    void *impl;                /* the backend's own state               */
};

/* The CPU backend's op table (backend_cpu.c). */
extern const dsq_backend_ops_t dsq__backend_cpu_ops;

/* The CUDA backend (backend_cuda.c; only in CUDA builds): fills *be or
 * returns an error with a one-line reason in err. */
int dsq__backend_cuda_init(dsq_backend_t *be, char *err, size_t err_len);

/* A backend's table entries for the rows of backend_ops.inc, by the
 * row's cpu/cuda column: DSQ__BACKEND_ENTRY_<column>(prefix, op, params,
 * args, call) declares (OWN) or defines (TWIN) prefix_<op>, where a TWIN
 * calls the kernel function `call` with args after running the backend
 * file's BACKEND_BEFORE_OP(be) (the CUDA backend points launches at its
 * stream there); DSQ__BACKEND_SLOT_<column>(prefix, op) is the table's
 * initialiser for it. */
#define DSQ__BACKEND_ENTRY_TWIN(prefix, op, params, args, call)               \
    static int prefix##_##op(dsq_backend_t *be, DSQ__BACKEND_UNPAREN params) \
    {                                                                        \
        BACKEND_BEFORE_OP(be);                                               \
        return call args;                                                    \
    }
#define DSQ__BACKEND_ENTRY_OWN(prefix, op, params, args, call) \
    static int prefix##_##op(dsq_backend_t *be, DSQ__BACKEND_UNPAREN params);
#define DSQ__BACKEND_ENTRY_NONE(prefix, op, params, args, call)
#define DSQ__BACKEND_SLOT_TWIN(prefix, op) .op = prefix##_##op,
#define DSQ__BACKEND_SLOT_OWN(prefix, op) .op = prefix##_##op,
#define DSQ__BACKEND_SLOT_NONE(prefix, op)

#endif
