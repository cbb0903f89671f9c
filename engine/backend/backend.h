/* The backend layer: where the model graphs' memory lives and who runs
 * their ops.
 *
 * A backend owns a device (the host CPU, or one CUDA GPU), its memory and
 * one in-order queue of work (a CUDA stream; the CPU backend runs each op
 * before returning). The model graphs (engine/model/) allocate their
 * activation workspace, weights and index arrays through it and call only
 * the ops below; the ops are the kernels of kernels/kernels.h behind an op
 * table, so the graph never names a CPU or CUDA function.
 *
 * Memory: "backend memory" below is what dsq_backend_alloc returns. On a
 * host backend (dsq_backend_is_host: the CPU backend) it is ordinary host
 * memory and host pointers (mmapped weights, caller arrays) may be passed
 * to the ops directly; on the CUDA backend it is device memory, and host
 * data must go through dsq_backend_upload first.
 *
 * Ordering and errors: ops are queued in call order. A return of 0 means
 * the op was accepted (CPU: done); an error that only shows when the queue
 * runs (a CUDA kernel fault) is returned by the next dsq_backend_sync.
 * dsq_backend_download waits for the queue. The engine calls
 * dsq_backend_sync once per step (the model's forward pass ends with it).
 *
 * Threads: one backend is used by one thread at a time (the engine
 * thread); dsq_backend_cpu's singleton may be shared because the CPU ops
 * are reentrant per call, but its threadpool runs one op at a time.
 *
 * Ops differ from their kernels.h twins only where the device forces it:
 * the CUDA backend reads index arrays (ids, positions, slots, block tables)
 * in device memory without host validation (kernels.h, "CUDA twins"), so
 * the graphs validate indices on the host before uploading them; and the
 * activation arrays between products carry an element type
 * (dsq_ftype_t, backend_ops.inc): the CPU backend takes fp32 only, the
 * CUDA backend fp32, fp16 or bf16 (the model's choice, dsq_model_act).
 * CUDA products dequantise exactly and sum in fp32 (dsq_weight_t.act is a
 * CPU choice), so with fp32 activations CUDA results match the CPU
 * backend's DSQ_ACT_F32 path up to fp32 summation order, and with narrow
 * ones up to that and the rounding of each stored activation.
 */
#ifndef DSQ_BACKEND_H
#define DSQ_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

typedef struct dsq_backend dsq_backend_t;

typedef enum dsq_backend_kind {
    DSQ_BACKEND_CPU = 0,
    DSQ_BACKEND_CUDA = 1,
} dsq_backend_kind_t;

/* Create a backend of the given kind. CUDA: device 0 of the process, a
 * stream of its own; fails with a one-line reason in err (no CUDA build,
 * no device, out of memory) and NULL. CPU: a new handle on the shared CPU
 * ops (the same as dsq_backend_cpu, but owned by the caller).
 * Destroy with dsq_backend_destroy. */
dsq_backend_t *dsq_backend_create(dsq_backend_kind_t kind, char *err, size_t err_len);
/* Frees the backend's own state. Memory allocated from it must be freed
 * first (dsq_backend_allocated_bytes tells what is left; CUDA frees and
 * logs leftovers). NULL: no-op. The dsq_backend_cpu singleton is never
 * destroyed (no-op). CUDA: the calling thread's launch stream is reset if
 * it was this backend's; other threads must not launch dsq_cuda_* ops on
 * it afterwards (the backend's own ops set the stream each time). */
void dsq_backend_destroy(dsq_backend_t *be);

/* The process-wide CPU backend (never NULL, never destroyed). */
dsq_backend_t *dsq_backend_cpu(void);

dsq_backend_kind_t dsq_backend_kind(const dsq_backend_t *be);
/* "cpu" or "cuda" (static string). */
const char *dsq_backend_name(const dsq_backend_t *be);
/* True when backend memory is host memory (host pointers are valid op
 * arguments and the graph may read results without a download). */
bool dsq_backend_is_host(const dsq_backend_t *be);
/* Device description for logs, key=value where it can be: "cpu avx512 2
 * threads" or "cuda device=0 name=\"NVIDIA H200\" sm_90
 * memory_bytes=150..."; written into buf (always NUL-terminated). */
void dsq_backend_describe(const dsq_backend_t *be, char *buf, size_t len);

/* ------------------------------------------------------------- memory */

/* bytes of backend memory, 256-byte aligned, contents undefined; NULL when
 * out of memory (or bytes == 0). */
void *dsq_backend_alloc(dsq_backend_t *be, size_t bytes);
/* Free what dsq_backend_alloc returned (NULL: no-op). The CUDA backend
 * waits for queued work first, so a buffer is never freed under a kernel. */
void dsq_backend_free(dsq_backend_t *be, void *p);
/* Device memory as the device reports it now (CUDA: cudaMemGetInfo, after
 * this process's context is created, so the context is already counted as
 * used). Returns 0, or DSQ_EUNSUPPORTED on a host backend (host memory is
 * planned from the RAM size, engine/serve/planner.h). */
int dsq_backend_mem_info(dsq_backend_t *be, size_t *free_bytes, size_t *total_bytes);
/* Bytes currently allocated through this backend, and the peak since
 * creation (what the memory planner's prediction is checked against). */
size_t dsq_backend_allocated_bytes(const dsq_backend_t *be);
size_t dsq_backend_peak_bytes(const dsq_backend_t *be);

/* Copies of bytes bytes: host -> backend memory (queued after earlier
 * work; returns once it is done, so src may be reused), backend -> host
 * (waits for queued work, so dst holds the result), backend -> backend
 * (queued). memset fills backend memory with
 * the byte value (queued). Returns 0, DSQ_EINVAL (NULL with bytes > 0) or
 * DSQ_ECUDA (the copy failed; the reason is logged). */
int dsq_backend_upload(dsq_backend_t *be, void *dst, const void *src, size_t bytes);
int dsq_backend_download(dsq_backend_t *be, void *dst, const void *src, size_t bytes);
int dsq_backend_copy(dsq_backend_t *be, void *dst, const void *src, size_t bytes);
int dsq_backend_memset(dsq_backend_t *be, void *dst, int value, size_t bytes);
/* Wait until every queued op has run. Returns 0 or the first asynchronous
 * error (DSQ_ECUDA, logged with the CUDA error string). */
int dsq_backend_sync(dsq_backend_t *be);

/* A weight in backend memory. Host backend: *out = *w (a view; nothing is
 * allocated or copied). CUDA: every array of its layout (data, scales,
 * zeros, sub_scales, sub_zeros, super: the bytes dsq_weight_layout gives)
 * and n floats of bias are copied into device memory, and *out points at
 * them. *bytes (may be NULL) receives the bytes allocated. Free with
 * dsq_backend_weight_free.
 * Returns 0, DSQ_EINVAL (dsq_weight_check fails: bad layout or an array
 * the layout needs missing), DSQ_ENOMEM or DSQ_ECUDA. */
int dsq_backend_weight_upload(dsq_backend_t *be, const dsq_weight_t *w,
                              dsq_weight_t *out, size_t *bytes);
/* Free what dsq_backend_weight_upload allocated for w (host backend:
 * nothing) and zero *w. NULL: no-op. */
void dsq_backend_weight_free(dsq_backend_t *be, dsq_weight_t *w);

/* ------------------------------------------------------ host CPU threads
 *
 * The host CPU ops (the CPU backend's, and whatever host work another
 * backend leaves on the CPU) share one process-wide thread pool. */

/* Threads the host CPU ops may use, the calling thread included (>= 1;
 * default: physical cores). Call it while no op runs. Returns 0 or
 * DSQ_EINVAL. */
int dsq_backend_set_host_threads(int n_threads);
int dsq_backend_host_threads(void);
/* Instruction-set level of the host CPU ops ("avx512", "avx2",
 * "neon_dotprod", "neon" or "scalar"; static string). */
const char *dsq_backend_host_isa(void);

/* ---------------------------------------------------------------- ops
 *
 * One wrapper per row of backend_ops.inc, which gives each op's parameters
 * and contract: int dsq_backend_<op>(dsq_backend_t *be, <params>), the
 * arguments and results of the kernels.h op of the same name, with every
 * array in backend memory (dsq_weight_t, dsq_kv_layer_t, dsq_rope_t and
 * dsq_moe_route_t are host structs whose array pointers are backend
 * memory). Each returns 0 or a DSQ_E* code: DSQ_EINVAL for bad shapes,
 * DSQ_EUNSUPPORTED when the backend lacks the op or the format (the CUDA
 * backend has no DeepSeek-V2 MLA/MoE ops yet), DSQ_ECUDA when a launch
 * fails. */

/* Name of op i of backend_ops.inc in table order ("matmul", ...), NULL
 * past the last (static strings). */
const char *dsq_backend_op_name(int i);
/* True when be provides the op called name (false for a name that is not
 * a row of backend_ops.inc); a missing op answers DSQ_EUNSUPPORTED. */
bool dsq_backend_has_op(const dsq_backend_t *be, const char *name);

/* (params) -> params, for the rows of backend_ops.inc */
#define DSQ__BACKEND_UNPAREN(...) __VA_ARGS__

#define DSQ_BACKEND_OP(op, params, args, cpu, cuda) \
    int dsq_backend_##op(dsq_backend_t *be, DSQ__BACKEND_UNPAREN params);
#include "backend_ops.inc"

#endif
