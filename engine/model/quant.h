/* Repacking of model weights into the kernels' formats (kernels/kernels.h):
 * GGUF block formats, AutoAWQ GEMM and AutoGPTQ tensors, and round-to-nearest
 * (RTN) quantisation of float weights to INT4 / INT8.
 *
 * Every function fills a dsq_weight_t (format, n, k, group_size, zp_mode,
 * data, scales, zeros; bias is left NULL for the caller) and sets *storage to
 * ONE malloc'd block holding the arrays the weight points into, or to NULL
 * when the weight is a zero-copy view of the source tensor (then the source
 * mapping must outlive the weight). The caller frees *storage with free().
 * On failure *storage is NULL, the weight is zeroed and err holds a one-line
 * reason.
 *
 * Shapes: a linear weight W has n outputs and k inputs. GGUF stores it with
 * ne[0] = k (contiguous) and ne[1] = n; extra dims ne[2], ne[3] (stacked MoE
 * experts) are folded into n, so expert e's rows are [e*ne[1], (e+1)*ne[1]).
 */
#ifndef DSQ_QUANT_H
#define DSQ_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "engine/io/tensor.h"

/* Repack a GGUF tensor view (ggml block formats: ggml-common.h structs,
 * ggml-quants.c dequantize_row_*), always exactly: each weight the kernels
 * see is the fp32 number ggml's dequantisation gives (kernels.h layouts).
 *   Q4_0   -> INT4 SYM, F16, group 32: nibbles copied, scale = d.
 *   Q4_1   -> INT4 MIN, F16, group 32: scale = d, zeros = m.
 *   IQ4_NL -> INT4 LUT, F16, group 32: nibbles copied, scale = d.
 *   Q4_K   -> INT4 MIN, SUPER, group 32: (d, -dmin), a = 6-bit sc, b = 6-bit m.
 *   Q2_K   -> INT4 MIN, SUPER, group 16: (d, -dmin), a = sc & 15, b = sc >> 4.
 *   Q3_K   -> INT4 INT, SUPER, group 16: nibble = low2 + 4*hbit, z = 4,
 *             a = 6-bit sc - 32.
 *   IQ4_XS -> INT4 LUT, SUPER, group 32: a = 6-bit ls - 32.
 *   Q5_0   -> INT8G SYM, F16, group 32: q - 16, scale = d.
 *   Q5_1   -> INT8G MIN, F16, group 32: q, scale = d, zeros = m.
 *   Q5_K   -> INT8G MIN, SUPER, group 32: as Q4_K with 5-bit q.
 *   Q6_K   -> INT8G SYM, SUPER, group 16: q - 32, a = int8 sc.
 *   Q8_0, F32, F16, BF16 -> the matching format as a zero-copy view
 *           (copied into storage only if the data is misaligned for its
 *           element type).
 * Rows are repacked in parallel (OpenMP) for big tensors.
 * Returns 0, DSQ_EINVAL (NULL args, bad dims), DSQ_EFORMAT (a block of a
 * repacked type whose fp16 scale or min is inf/NaN: err names the tensor
 * and the block), DSQ_EUNSUPPORTED (the IQ1/
 * IQ2/IQ3, TQ, MXFP4, Q8_1/Q8_K and integer types; err names the tensor and
 * its type), DSQ_ENOMEM. */
int dsq_quant_from_gguf(const dsq_tensor_t *t, dsq_weight_t *w, void **storage,
                        char *err, size_t err_len);

/* Whether dsq_quant_from_gguf reads tensors of this GGUF type. */
bool dsq_quant_gguf_readable(dsq_type_t type);

/* Bytes dsq_quant_from_gguf allocates for an [n, k] tensor of this type
 * (data + scales + zeros + super of its native layout; for the types kept
 * as zero-copy views, the bytes of the view), so the memory planner counts
 * exactly what the load allocates. Returns 0, DSQ_EINVAL (NULL, shape not
 * whole blocks) or DSQ_EUNSUPPORTED (type not read). */
int dsq_quant_gguf_bytes(dsq_type_t type, int64_t n, int64_t k, size_t *bytes);

/* The native layout dsq_quant_from_gguf gives an [n, k] tensor of this
 * type: *w's format, n, k, group_size, zp_mode and scale_mode (pointers
 * NULL), for dsq_weight_layout / dsq_weight_x8_twin. Returns 0,
 * DSQ_EINVAL or DSQ_EUNSUPPORTED as dsq_quant_gguf_bytes. */
int dsq_quant_gguf_layout(dsq_type_t type, int64_t n, int64_t k, dsq_weight_t *w);

/* AutoAWQ "GEMM" packing (AutoAWQ WQLinear_GEMM; dequant as in vLLM's
 * awq_dequantize): W[c][r] = (q - z) * s, 4-bit, group g along k.
 *   qweight: int32 [k][n/8]; int32 j of row r packs columns 8j..8j+7, column
 *            8j+i in bits 4*p..4*p+3 with p = {0,4,1,5,2,6,3,7}[i] (the
 *            inverse of AWQ_ORDER {0,2,4,6,1,3,5,7}).
 *   qzeros:  int32 [k/g][n/8], same packing; z is used as stored (no offset).
 *   scales:  fp16 [k/g][n].
 * Result: INT4 ZP_INT with group_size g (32, 64 or 128), transposed into the
 * native [n][k] layout. Exact. k % g == 0, n % 8 == 0.
 * Returns 0, DSQ_EINVAL, DSQ_EUNSUPPORTED (other g), DSQ_ENOMEM. */
int dsq_quant_from_awq(const int32_t *qweight, const int32_t *qzeros,
                       const uint16_t *scales, int64_t k, int64_t n,
                       int group_size, dsq_weight_t *w, void **storage,
                       char *err, size_t err_len);

/* AutoGPTQ v1 packing (as read by AutoGPTQ/ExLlama/vLLM gptq kernels):
 *   qweight: int32 [k/8][n]; int32 (j, c) packs input rows 8j..8j+7 of
 *            column c, row 8j+i in bits 4i..4i+3 (low bits first).
 *   qzeros:  int32 [groups][n/8]; column 8j+i in bits 4i.., stored value is
 *            z - 1 (the historical v1 offset), so z = stored + 1 (1..16).
 *   scales:  fp16 [groups][n].
 *   g_idx:   int32 [k] group of each input row, or NULL for row / g.
 * W[c][r] = (q - z) * s with s, z of group g_idx[r]. Result: INT4 ZP_INT
 * (exact; z = 16 is representable in fp16 and the kernels take any z).
 *
 * Act-order (desc_act = true): when g_idx is not r / g, the k dimension is
 * permuted so groups become contiguous: row j of the result is input row
 * perm[j] (a stable sort of rows by g_idx). *perm is then a malloc'd int32
 * [k] the caller owns and MUST apply to activations: x'[j] = x[perm[j]],
 * y = matmul(x', W'). When no permutation is needed *perm is NULL. Every
 * group must then hold exactly g rows (the last one k - (groups-1)*g), which
 * is what GPTQ act-order produces; otherwise DSQ_EUNSUPPORTED.
 * Requirements: k % 8 == 0, n % 8 == 0, g in {32, 64, 128}.
 * Returns 0, DSQ_EINVAL, DSQ_EUNSUPPORTED, DSQ_ENOMEM. */
int dsq_quant_from_gptq(const int32_t *qweight, const int32_t *qzeros,
                        const uint16_t *scales, const int32_t *g_idx,
                        int64_t k, int64_t n, int group_size,
                        dsq_weight_t *w, void **storage, int32_t **perm,
                        char *err, size_t err_len);

/* AutoGPTQ v1 packing at bits = 8 (AutoGPTQ's QuantLinear.pack / the
 * GPTQModel and vLLM gptq dequant: `bits` wide fields, 32/bits per int32,
 * low bits first; z stored minus 1):
 *   qweight: int32 [k/4][n]; int32 (j, c) packs input rows 4j..4j+3 of
 *            column c, row 4j+i in bits 8i..8i+7 (unsigned q 0..255).
 *   qzeros:  int32 [n_groups][n/4]; column 4j+i in bits 8i..8i+7, stored
 *            value z - 1 (symmetric: z = 128, stored 127).
 *   scales:  fp16 [n_groups][n].  g_idx: int32 [k] (all 0) or NULL.
 * W[c][r] = (q - z) * s. Only per-channel checkpoints (group_size -1, so
 * n_groups == 1) are accepted; the result is DSQ_WFMT_INT8 with int8
 * q - z and s per output channel, exact whenever every q - z fits in
 * [-128, 127] (always for symmetric z = 128).
 * Requirements: k % 4 == 0, n % 4 == 0.
 * Returns 0, DSQ_EINVAL (NULL, shape, g_idx not 0), DSQ_EUNSUPPORTED
 * (n_groups != 1, q - z outside int8), DSQ_ENOMEM. */
int dsq_quant_from_gptq8(const int32_t *qweight, const int32_t *qzeros,
                         const uint16_t *scales, const int32_t *g_idx, int64_t k,
                         int64_t n, int64_t n_groups, dsq_weight_t *w, void **storage,
                         char *err, size_t err_len);

/* A GPTQ v1 linear from its safetensors views (qweight, qzeros, scales,
 * optional g_idx; PyTorch shapes, ne[0] innermost): checks types (I32, I32,
 * F16, I32) and shapes, takes the bit width from qweight's shape (rows k/8:
 * 4-bit -> dsq_quant_from_gptq with group_size, the checkpoint's global or
 * per-module value; rows k/4: 8-bit -> dsq_quant_from_gptq8, the number of
 * groups read from scales), so mixed 4/8-bit checkpoints (GPTQModel's
 * `dynamic` per-module overrides) load tensor by tensor. perm as
 * dsq_quant_from_gptq (always NULL for 8-bit).
 * Returns 0, DSQ_EINVAL, DSQ_EFORMAT (types, shapes, neither 4 nor 8 bits),
 * DSQ_EUNSUPPORTED, DSQ_ENOMEM. */
int dsq_quant_from_gptq_tensors(const dsq_tensor_t *qweight, const dsq_tensor_t *qzeros,
                                const dsq_tensor_t *scales, const dsq_tensor_t *g_idx,
                                int64_t k, int64_t n, int group_size, dsq_weight_t *w,
                                void **storage, int32_t **perm, char *err,
                                size_t err_len);

/* Round-to-nearest INT4 quantisation of an F32/F16/BF16/Q8_0 tensor, group
 * group_size (32/64/128) along k; k need not be a multiple of 32 or of the
 * group (the last group is partial, padding nibbles are 0).
 *   sym = false: ZP_INT asymmetric min/max: range [min(x,0), max(x,0)],
 *                s = range/15, z = round(-min/s) in 0..15,
 *                q = clamp(round(x/s) + z, 0, 15).
 *   sym = true:  ZP_SYM absmax: s = amax/7, q = clamp(round(x/s), -8, 7) + 8.
 * s is rounded UP to the next fp16 so the range still fits: every element's
 * error is <= s/2 (s = the stored fp16 scale).
 * Returns 0, DSQ_EINVAL, DSQ_EUNSUPPORTED (type), DSQ_ERANGE (scale
 * overflows fp16), DSQ_ENOMEM. */
int dsq_quant_rtn_int4(const dsq_tensor_t *t, int group_size, bool sym,
                       dsq_weight_t *w, void **storage, char *err,
                       size_t err_len);

/* INT8 per-output-channel symmetric quantisation of an F32/F16/BF16 (or
 * Q8_0) tensor: s[c] = amax(row c)/127 rounded up to fp16,
 * q = clamp(round(x/s), -127, 127); error <= s/2 per element.
 * Returns 0, DSQ_EINVAL, DSQ_EUNSUPPORTED, DSQ_ERANGE, DSQ_ENOMEM. */
int dsq_quant_int8_channel(const dsq_tensor_t *t, dsq_weight_t *w,
                           void **storage, char *err, size_t err_len);

/* dsq_weight_dequant_row (declared in kernels.h) dequantises one row of any
 * format produced here. */

#endif
