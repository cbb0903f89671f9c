/* safetensors reader (one file; the loader handles sharded checkpoints).
 *
 * Format (huggingface/safetensors README, "Format"): u64 little-endian N,
 * then N bytes of UTF-8 JSON {"name": {"dtype": "F16", "shape": [..],
 * "data_offsets": [begin, end]}, ..., "__metadata__": {...}}, then the byte
 * buffer; offsets are relative to the first byte after the JSON. The file is
 * mmapped read-only and tensors are views into the mapping.
 *
 * Tensor views keep the file's own names ("model.layers.0.self_attn.q_proj.
 * weight"); the shape is reversed into GGUF order, so a JSON shape
 * [out, in] gives ne[0] = in, ne[1] = out. Data may be unaligned.
 * dtypes: F32, F16, BF16, I32, I16, I8, U8, I64, F64; anything else (BOOL,
 * F8_*) is rejected naming the tensor.
 */
#ifndef DSQ_SAFETENSORS_H
#define DSQ_SAFETENSORS_H

#include <stddef.h>

#include "tensor.h"

typedef struct dsq_safetensors dsq_safetensors_t;

/* Open and validate: header length <= 100 MB and inside the file, valid
 * JSON object, every tensor with a known dtype, 1..4 dims (a scalar [] is
 * one element), non-negative dims, data_offsets inside the buffer and
 * end - begin == elements x dtype size, no two tensors' data_offsets
 * ranges overlapping (gaps are allowed); duplicate names rejected;
 * "__metadata__" ignored. NULL on failure with one line in err naming the
 * file and the tensor/field (both tensors for an overlap). */
dsq_safetensors_t *dsq_safetensors_open(const char *path, char *err,
                                        size_t err_len);
/* Same on a caller buffer (not copied; must outlive the reader). name is
 * used in messages (NULL: "(buffer)"). */
dsq_safetensors_t *dsq_safetensors_open_buffer(const void *buf, size_t size,
                                               const char *name, char *err,
                                               size_t err_len);
void dsq_safetensors_close(dsq_safetensors_t *s);  /* NULL is a no-op */

const char *dsq_safetensors_path(const dsq_safetensors_t *s);
/* Tensors in header order (the JSON reader keeps the file's order). */
int dsq_safetensors_n_tensors(const dsq_safetensors_t *s);
const dsq_tensor_t *dsq_safetensors_tensor(const dsq_safetensors_t *s, int i);
/* By file name (exact); NULL if absent. */
const dsq_tensor_t *dsq_safetensors_find(const dsq_safetensors_t *s,
                                         const char *name);

#endif
