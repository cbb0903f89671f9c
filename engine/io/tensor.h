/* Tensor element types and the read-only tensor view every loader returns.
 *
 * Type numbers follow GGML's `ggml_type` enum (GGUF spec, "GGML tensor
 * types"), so a GGUF tensor's type field maps 1:1. Types that only occur in
 * safetensors files and have no GGML number (U8) get numbers >= 100.
 *
 * Dimension order follows GGUF/GGML: ne[0] is the innermost, contiguous
 * dimension. A PyTorch weight of shape [out_features, in_features] therefore
 * has ne[0] = in_features (K) and ne[1] = out_features (N). Unused dims are 1.
 */
#ifndef DSQ_TENSOR_H
#define DSQ_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum dsq_type {
    DSQ_TYPE_F32  = 0,
    DSQ_TYPE_F16  = 1,
    DSQ_TYPE_Q4_0 = 2,   /* block 32: fp16 d, 16 bytes of nibbles; w = (q-8)*d        */
    DSQ_TYPE_Q4_1 = 3,   /* block 32: fp16 d, fp16 m, 16 bytes; w = q*d + m            */
    DSQ_TYPE_Q5_0 = 6,
    DSQ_TYPE_Q5_1 = 7,
    DSQ_TYPE_Q8_0 = 8,   /* block 32: fp16 d, 32 int8; w = q*d                         */
    DSQ_TYPE_Q8_1 = 9,
    DSQ_TYPE_Q2_K = 10,
    DSQ_TYPE_Q3_K = 11,
    DSQ_TYPE_Q4_K = 12,  /* super-block 256: fp16 d, dmin, 12 bytes scales, 128 bytes */
    DSQ_TYPE_Q5_K = 13,
    DSQ_TYPE_Q6_K = 14,
    DSQ_TYPE_Q8_K = 15,
    DSQ_TYPE_IQ2_XXS = 16, /* the IQ/TQ types: sizes known, not read (quant.h) */
    DSQ_TYPE_IQ2_XS = 17,
    DSQ_TYPE_IQ3_XXS = 18,
    DSQ_TYPE_IQ1_S = 19,
    DSQ_TYPE_IQ4_NL = 20, /* block 32: fp16 d, 16 bytes of codebook nibbles   */
    DSQ_TYPE_IQ3_S = 21,
    DSQ_TYPE_IQ2_S = 22,
    DSQ_TYPE_IQ4_XS = 23, /* super-block 256: fp16 d, 6-bit scales, 128 bytes */
    DSQ_TYPE_I8   = 24,
    DSQ_TYPE_I16  = 25,
    DSQ_TYPE_I32  = 26,
    DSQ_TYPE_I64  = 27,
    DSQ_TYPE_F64  = 28,
    DSQ_TYPE_IQ1_M = 29,
    DSQ_TYPE_BF16 = 30,
    DSQ_TYPE_TQ1_0 = 34,
    DSQ_TYPE_TQ2_0 = 35,
    DSQ_TYPE_MXFP4 = 39,
    DSQ_TYPE_U8   = 100, /* safetensors only */
    DSQ_TYPE_COUNT_ = 101
} dsq_type_t;

/* Read-only view of one tensor inside a mapped model file.
 * name and data are owned by the reader that produced the view and stay valid
 * until that reader is closed. data is at least 1-byte aligned only (GGUF
 * guarantees general.alignment; safetensors offsets may be unaligned). */
typedef struct dsq_tensor {
    const char *name;    /* canonical (GGUF-style) name, NUL-terminated */
    dsq_type_t type;
    int n_dims;          /* 1..4 */
    int64_t ne[4];       /* ne[0] innermost; unused dims are 1 */
    const void *data;    /* first byte of the tensor in the mapping */
    size_t n_bytes;      /* exact byte size of the data */
} dsq_tensor_t;

/* Short name of a type ("F32", "Q4_1", ...); "?" for an unknown number. */
const char *dsq_type_name(dsq_type_t type);

/* Elements per block (1 for plain types, 32 for Q4_0/Q4_1/Q8_0, 256 for *_K)
 * and bytes per block. Both return 0 for unknown or unsupported types. */
int dsq_type_block_elems(dsq_type_t type);
size_t dsq_type_block_bytes(dsq_type_t type);

/* Bytes needed for n_elems elements of type, with overflow checks.
 * Returns 0 and sets *out, or DSQ_EINVAL (unknown type or n_elems not a
 * multiple of the block size) or DSQ_ERANGE (overflow). */
int dsq_type_bytes(dsq_type_t type, int64_t n_elems, size_t *out);

/* Find two of the n views in t whose bytes [data, data + n_bytes) overlap
 * (views into one mapping; a 0-byte tensor occupies nothing). Sorts a
 * temporary index by data, so O(n log n). Returns 0 when none overlap,
 * DSQ_EFORMAT with *first (the one starting first, or listed first on a
 * tie) and *second set, or DSQ_ENOMEM. GGUF and safetensors readers call
 * it at open: a tensor whose bytes are also another's is a malformed
 * file, as both formats' reference readers hold. */
int dsq_tensor_find_overlap(const dsq_tensor_t *t, int n,
                            const dsq_tensor_t **first,
                            const dsq_tensor_t **second);

/* IEEE half and bfloat16 conversions (round to nearest even). */
float dsq_fp16_to_fp32(uint16_t h);
uint16_t dsq_fp32_to_fp16(float f);
float dsq_bf16_to_fp32(uint16_t h);
uint16_t dsq_fp32_to_bf16(float f);

#endif
