/* The numeric ops, as plain C launchers.
 *
 * Every op has a CPU implementation `dsq_cpu_<op>` (kernels/cpu/<op>.c) and,
 * where the CUDA backend implements it, a twin `dsq_cuda_<op>` with the same
 * arguments plus the element type of each activation array ("CUDA twins"
 * below; kernels/cuda/<op>.cu) operating on device pointers. The CPU op is
 * the reference in tests. All matrices are row-major; activations are fp32
 * on the CPU backend, fp32, fp16 or bf16 on CUDA. Ops return 0 or a negative DSQ_E* code.
 *
 * CPU ops parallelise internally on a persistent pthread pool
 * (kernels/cpu/threadpool.c; small ops run inline on the calling thread);
 * the thread count is set once with dsq_cpu_set_threads().
 */
#ifndef DSQ_KERNELS_H
#define DSQ_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- weights */

/* Storage format of a linear layer's weight W [n, k] (n outputs, k inputs). */
typedef enum dsq_wformat {
    DSQ_WFMT_F32 = 0,   /* data: float [n][k]                                  */
    DSQ_WFMT_F16,       /* data: uint16 fp16 [n][k]                            */
    DSQ_WFMT_BF16,      /* data: uint16 bf16 [n][k]                            */
    DSQ_WFMT_Q8_0,      /* data: GGML block_q8_0 rows: per 32 weights, fp16 d
                           then 32 int8 q; w = q*d. k % 32 == 0.               */
    DSQ_WFMT_INT4,      /* dsq native INT4, see below                          */
    DSQ_WFMT_INT8,      /* data: int8 [n][k], scales: fp16 [n] per output
                           channel, symmetric; w = q*s                          */
    DSQ_WFMT_INT8G,     /* dsq native group-wise 8-bit, see below (GGUF Q5_0,
                           Q5_1, Q5_K, Q6_K)                                   */
    DSQ_WFMT_INT4_X8,   /* INT4 with rows interleaved in tiles of 8: the CPU
                           products' layout (see below); made from an INT4
                           weight in place by dsq_weight_interleave_x8
                           (fp16 scales) or dsq_weight_pack_x8 (SUPER)    */
    DSQ_WFMT_INT6_X8,   /* 6-bit q in tiles of 8 rows, GGUF Q6_K's bits (see
                           below); made from INT8G by dsq_weight_pack_x8    */
    DSQ_WFMT_Q8_0_X8,   /* Q8_0 blocks in tiles of 8 rows (see below); made
                           from Q8_0 by dsq_weight_pack_x8                 */
    DSQ_WFMT_INT5_X8,   /* 5-bit q in tiles of 8 rows, GGUF Q5_0/Q5_1/Q5_K's
                           bits (see below); made from INT8G by
                           dsq_weight_pack_x8                              */
    DSQ_WFMT_INT2_X8,   /* 2-bit q in tiles of 8 rows, GGUF Q2_K's bits (see
                           below); made from INT4 by dsq_weight_pack_x8    */
    DSQ_WFMT_INT3_X8,   /* 3-bit q in tiles of 8 rows, GGUF Q3_K's bits (see
                           below); made from INT4 by dsq_weight_pack_x8    */
} dsq_wformat_t;

/* Number of dsq_wformat_t values (size of per-format tables). */
#define DSQ_WFMT_COUNT 13

/* Zero-point convention of a DSQ_WFMT_INT4 / INT8G weight, per group with
 * scale s (see dsq_scale_mode_t for where s and z/m are stored):
 *   SYM: INT4  w = (q - 8) * s           no zeros (GGUF Q4_0, GPTQ sym)
 *        INT8G w = q * s, q signed int8  no zeros (GGUF Q5_0 q-16, Q6_K q-32)
 *   INT: w = (q - z) * s                 z integer per group
 *                                        (AWQ: 0..15; GPTQ v1: stored+1, 1..16;
 *                                        GGUF Q3_K: z = 4). INT4 only.
 *   MIN: w = q * s + m                   m per group (Q4_1, Q5_1, Q2_K,
 *                                        Q4_K, Q5_K: m = -dmin*min)
 *   LUT: w = dsq_iq4nl_values[q] * s     INT4 only: GGUF IQ4_NL / IQ4_XS's
 *                                        fixed non-linear codebook
 * Keeping all of them lets every GGUF type, AWQ and GPTQ repack exactly,
 * with no requantisation; kernels fold each into
 * acc += s*dot(x, v(q)) + c*sum(x) with v(q) = q (LUT: the codebook value)
 * and c = -8s / 0 (SYM), -z*s (INT), m (MIN), 0 (LUT). */
typedef enum dsq_zp_mode {
    DSQ_ZP_SYM = 0,
    DSQ_ZP_INT = 1,
    DSQ_ZP_MIN = 2,
    DSQ_ZP_LUT = 3,
} dsq_zp_mode_t;

/* The IQ4_NL codebook (ggml-common.h kvalues_iq4nl; GGUF IQ4_NL, IQ4_XS):
 * nibble q stands for the integer dsq_iq4nl_values[q]. */
extern const int8_t dsq_iq4nl_values[16];

/* Functions the CPU and the CUDA kernels both call (nvcc compiles them for
 * the device too). */
#ifdef __CUDACC__
#define DSQ_HOST_DEVICE __host__ __device__
#else
#define DSQ_HOST_DEVICE
#endif

/* Sub-scale a (-32..31) of group g (< 8) of one row super-block of an
 * INT4 SUPER LUT weight (IQ4_XS), p its 6 bytes (layout below). */
static inline DSQ_HOST_DEVICE int dsq_iq4xs_sub(const uint8_t *p, int g)
{
    const int hi = (p[0] | p[1] << 8) >> (2 * g) & 3;
    return ((p[2 + g / 2] >> (4 * (g % 2)) & 15) | hi << 4) - 32;
}

/* Where an INT4 / INT8G weight keeps its per-group scale s and zero z / m
 * (the X8 formats regroup these arrays, see their layouts):
 *   F16:   scales fp16 [n][groups] = s; zeros fp16 [n][groups] = z (INT) or
 *          m (MIN), NULL for SYM/LUT. (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, AWQ,
 *          GPTQ: their scales are fp16 already, so this is exact.)
 *   SUPER: the two-level scales of GGML's k-quants (ggml-quants.c,
 *          "k-quants" by Kawrakow, llama.cpp PR 1684): per super-block of
 *          256 weights along k an fp16 pair super[n][k/256][2] = (d, dm),
 *          per group int8 sub_scales[n][groups] = a and (INT/MIN)
 *          sub_zeros[n][groups] = b:  s = d*a,  z = b (INT),  m = dm*b (MIN).
 *          Both products are exact in fp32 (11-bit x 8-bit significands), so
 *          Q2_K..Q6_K and IQ4_XS repack with no rounding at all, in about
 *          the file's own bytes. k % 256 == 0; group_size 16 or 32.
 *          With zp_mode LUT (INT4, group 32: IQ4_XS) the sub-scales keep
 *          IQ4_XS's own 6-bit packing and super holds d alone, so the
 *          weight is the file's 136 bytes per 256: sub_scales 6 bytes per
 *          row and super-block at (row * k/256 + b) * 6, bytes 0-1 the
 *          little-endian u16 of the groups' top 2 bits (group g at bits
 *          2g), bytes 2-5 their low 4 bits (group g at byte 2 + g/2, bits
 *          4(g%2)); a = that 6-bit value - 32 (dsq_iq4xs_sub); super fp16
 *          [n][k/256] = d.
 * scales/zeros are NULL in SUPER mode and sub_scales/sub_zeros/super NULL
 * in F16 mode. */
typedef enum dsq_scale_mode {
    DSQ_SCALE_F16 = 0,
    DSQ_SCALE_SUPER = 1,
} dsq_scale_mode_t;

/* Activation precision dsq_cpu_matmul uses with a quantised weight (INT4,
 * Q8_0, INT8; F32/F16/BF16 weights always take fp32 activations):
 *   INT8: activations are quantised to int8 per 32-block and multiplied by
 *         integer dot products (llama.cpp's Q8_0/Q8_1 scheme; fastest);
 *   F32:  weights are dequantised to fp32 in registers by the format's
 *         formula and FMA'd with the fp32 activations, so y = W·x up to
 *         fp32 rounding (kernels/cpu/matmul_f32act.c; slower, see
 *         docs/benchmarks.md). The engine option is --activation-dtype. */
typedef enum dsq_act_dtype {
    DSQ_ACT_INT8 = 0,
    DSQ_ACT_F32 = 1,
} dsq_act_dtype_t;

/* Element type of an activation array the CUDA ops read or write
 * (kernels.h "CUDA twins"): IEEE binary32, IEEE binary16, or bfloat16 (the
 * top 16 bits of a binary32). A narrow element is widened exactly on load
 * and every sum is fp32; stores round to nearest even. The CPU ops take
 * fp32 only. */
typedef enum dsq_ftype {
    DSQ_FT_F32 = 0,
    DSQ_FT_F16 = 1,
    DSQ_FT_BF16 = 2,
} dsq_ftype_t;

/* Bytes per element of t (4 or 2); 0 for a value outside the enum. */
static inline size_t dsq_ftype_size(dsq_ftype_t t)
{
    return t == DSQ_FT_F32 ? 4 : t == DSQ_FT_F16 || t == DSQ_FT_BF16 ? 2 : 0;
}

/* "f32", "f16" or "bf16" (static string; "?" outside the enum). */
static inline const char *dsq_ftype_name(dsq_ftype_t t)
{
    return t == DSQ_FT_F32 ? "f32" : t == DSQ_FT_F16 ? "f16" : t == DSQ_FT_BF16 ? "bf16" : "?";
}

/* A linear layer's weight, in one of the formats above.
 *
 * DSQ_WFMT_INT4 byte layout (the "dsq native" layout):
 *   - groups of group_size (16, 32, 64 or 128; SUPER: 16 or 32) consecutive
 *     weights along k; k_pad = k rounded up to a multiple of 32, groups =
 *     ceil(k / group_size) (the last group may be partial; padded weights
 *     are q = 0 and must be ignored by the kernel, which only reads k
 *     activations).
 *   - qweight: n rows of k_pad/2 bytes. Each row is a run of 32-weight chunks
 *     of 16 bytes; in a chunk, byte j holds weight j in its low nibble and
 *     weight j+16 in its high nibble (the GGML Q4_0/Q4_1/IQ4_NL nibble
 *     order). With group_size 16 a chunk's low nibbles are one group and
 *     its high nibbles the next.
 *   - scales/zeros or sub_scales/sub_zeros/super per dsq_scale_mode_t.
 * DSQ_WFMT_INT4_X8 byte layout: the same nibbles, scales and zeros as
 * DSQ_WFMT_INT4 in the F16 scale mode (group_size 32, 64 or 128; any
 * zp_mode; the same number of bytes) or the SUPER one (group_size 32,
 * zp_mode MIN: Q4_K; sub-scales in 6 bits, fewer bytes), with the rows
 * taken 8 at a time (n % 8 == 0): for tile
 * t (rows 8t..8t+7) and 32-weight chunk c, 128 bytes of qweight at
 * (t * k_pad/32 + c) * 128, where byte 32p + 4r + i (p < 4, r < 8, i < 4)
 * is byte 4p + i of row 8t + r's native chunk c (so its low nibble is
 * weight 4p + i of the chunk, its high nibble weight 16 + 4p + i); scales
 * and zeros fp16 [n/8][groups][8], entry (t, g, r) for row 8t + r; SUPER
 * (zp_mode MIN only: Q4_K) keeps a and b in 6 bits as the file does, in
 * sub_scales (sub_zeros NULL): 96 bytes per tile and super-block at
 * (t * k/256 + b) * 96 holding the 128 values v[8g + r] = a and
 * v[64 + 8g + r] = b of group 8b + g of row 8t + r (g, r < 8): byte j
 * (j < 64) = v[j] & 15 | (v[64 + j] & 15) << 4, byte 64 + j (j < 32) =
 * v[j] >> 4 | v[32 + j] >> 4 << 2 | v[64 + j] >> 4 << 4 | v[96 + j] >> 4
 * << 6 (so four 32-byte operations unpack a super-block's 128 values in
 * the order one 8-lane load per group wants); super fp16
 * [n/8][k/256][2][8], entry (t, b, 0, r) = d and (t, b, 1, r) = dm of row
 * 8t + r's super-block b: 144 bytes per 256 weights of a row, Q4_K's
 * own. One 32-byte load then holds 4 weights of each
 * of 8 rows, so a SIMD product keeps one row per 32-bit lane and needs no
 * horizontal sum (the idea of llama.cpp's Q4_0_8x8 repacking), and the 8
 * rows' scales of a group are one 8-lane load.
 * DSQ_WFMT_INT6_X8 byte layout (GGUF Q6_K on the CPU: 6 bits a weight
 * where INT8G spends 8): q in 0..63, w = (q - 32) * s, SUPER scales with
 * group_size 16 (zp_mode SYM, k % 256 == 0, n % 8 == 0). Tile t, chunk c:
 * 192 bytes at (t * k_pad/32 + c) * 192; the first 128 are INT4_X8's
 * nibbles of q's low 4 bits; byte 128 + 32h + 4r + i (h < 2, r < 8,
 * i < 4) holds the top 2 bits of four weights of row 8t + r: bits 0-1 of
 * weight 8h + i, bits 2-3 of 16 + 8h + i, bits 4-5 of 8h + 4 + i, bits
 * 6-7 of 20 + 8h + i (the weights of nibble loads p = 2h and 2h + 1, low
 * then high). sub_scales int8 [n/8][groups][8] and super fp16
 * [n/8][k/256][8] = d alone (SYM has no dm): 210 bytes per 256 weights
 * of a row, Q6_K's own.
 * DSQ_WFMT_INT5_X8 byte layout (GGUF Q5_0, Q5_1, Q5_K on the CPU): q in
 * 0..31, group_size 32, zp_mode SYM (w = (q - 16) * s) or MIN (w = q*s +
 * m), scales and zeros exactly as INT4_X8's (F16 or SUPER mode; n % 8 ==
 * 0). Tile t, chunk c: 160 bytes at (t * k_pad/32 + c) * 160: INT4_X8's
 * 128 bytes of q's low 4 bits, then 32 bytes of top bits: byte 128 +
 * 4r + i (r < 8, i < 4), bit 2p (p < 4) = bit 4 of weight 4p + i of row
 * 8t + r, bit 2p + 1 = of weight 16 + 4p + i. 20 bytes per 32 weights of
 * a row besides the scales (SUPER: INT4_X8's 6-bit ones): Q5_0, Q5_1 and
 * Q5_K's own sizes.
 * DSQ_WFMT_INT2_X8 / DSQ_WFMT_INT3_X8 byte layouts (GGUF Q2_K / Q3_K on
 * the CPU: 2 or 3 bits a weight where INT4 spends 4): SUPER scales, group
 * 16, k % 256 == 0, n % 8 == 0. Tile t, chunk c: 64 (INT2) or 96 (INT3)
 * bytes at (t * k/32 + c) * 64 (96): byte 32h + 4r + i (h < 2, r < 8,
 * i < 4) holds in bits 2j..2j+1 (j < 4) the low 2 bits of q of weight
 * 16h + 4j + i of row 8t + r (so load h is one group, and shift j of it
 * 4 weights of each of the 8 rows); INT3: then byte 64 + 4r + i, bit
 * 4h + j = bit 2 of the same weight's q.
 *   INT2_X8: q in 0..3, zp_mode MIN, w = q * d*a + dm*b (Q2_K's a and b
 *   in 0..15): sub_scales 128 bytes per tile and super-block at
 *   (t * k/256 + s) * 128, byte 8g + r = a | b << 4 of group 16s + g
 *   (g < 16) of row 8t + r; super fp16 [n/8][k/256][2][8] (d, dm) as
 *   INT4_X8's: 84 bytes per 256 weights of a row, Q2_K's own.
 *   INT3_X8: q in 0..7, zp_mode SYM, w = (q - 4) * d*a (Q3_K's a in
 *   -32..31): sub_scales 96 bytes per tile and super-block, the 128
 *   values v[8g + r] = a + 32 of group 16s + g of row 8t + r in INT4_X8's
 *   6-bit packing; super fp16 [n/8][k/256][8] = d alone: 110 bytes per
 *   256 weights of a row, Q3_K's own.
 * DSQ_WFMT_Q8_0_X8 byte layout: Q8_0's bytes with the rows taken 8 at a
 * time (n % 8 == 0, k % 32 == 0): tile t, 32-block c: 272 bytes at
 * (t * k/32 + c) * 272, the 8 rows' fp16 d first (row 8t + r at 2r), then
 * byte 16 + 32p + 4r + i (p < 8, i < 4) = q of weight 4p + i of row
 * 8t + r's block c. w = q * d.
 * DSQ_WFMT_INT8G byte layout: data int8 [n][k_pad] (padding 0), groups of
 * group_size 16 or 32 along k, zp_mode SYM or MIN, scales as for INT4.
 * GGUF sources: Q5_0 -> SYM q-16, F16 s = d; Q5_1 -> MIN, F16 (d, m);
 * Q5_K -> MIN, SUPER g32; Q6_K -> SYM q-32, SUPER g16 (engine/model/quant.h).
 * Memory is owned by whoever built the dsq_weight_t (the model), never by the
 * kernel. bias (fp32 [n]) is optional for every format. */
typedef struct dsq_weight {
    dsq_wformat_t format;
    int64_t n;                 /* output features (rows of W)                  */
    int64_t k;                 /* input features (reduction dim)               */
    int group_size;            /* INT4: 16/32/64/128; INT8G: 16/32; Q8_0: 32;
                                  others: 0                                    */
    dsq_zp_mode_t zp_mode;     /* INT4 / INT8G only                            */
    dsq_scale_mode_t scale_mode; /* INT4 / INT8G only (others: F16 = 0)        */
    const void *data;          /* qweight or plain matrix, see format           */
    const uint16_t *scales;    /* F16 mode: fp16 [n][groups]; INT8: fp16 [n]    */
    const uint16_t *zeros;     /* F16 mode INT/MIN: fp16 [n][groups]            */
    const int8_t *sub_scales;  /* SUPER: int8 [n][groups] (LUT: 6 bytes per
                                  row and super-block); INT4_X8 / INT5_X8:
                                  the 6-bit a and b; INT2_X8 / INT3_X8: their
                                  own packing (layouts above)                */
    const int8_t *sub_zeros;   /* SUPER INT/MIN: int8 [n][groups]; NULL in
                                  the X8 formats (b, where there is one, is
                                  in sub_scales)                            */
    const uint16_t *super;     /* SUPER: fp16 [n][k/256][2] (d, dm; LUT: d
                                  alone, [n][k/256]); the X8
                                  formats regroup it (INT3_X8, INT6_X8: d
                                  alone; layouts above)                     */
    const float *bias;         /* fp32 [n] or NULL                              */
    dsq_act_dtype_t act;       /* quantised formats: activation precision of
                                  dsq_cpu_matmul (0 = INT8, the default)       */
} dsq_weight_t;

/* Byte sizes of a weight's arrays (see the layouts above). */
typedef struct dsq_weight_bytes {
    size_t data;               /* data / qweight                               */
    size_t scales;             /* scales (F16 mode, INT8) or sub_scales (SUPER) */
    size_t zeros;              /* zeros or sub_zeros (0 when the mode has none) */
    size_t super;              /* super (SUPER mode), else 0                    */
    size_t total;              /* the sum                                       */
} dsq_weight_bytes_t;

/* Checks that w's format, shape, group_size, zp_mode and scale_mode form a
 * valid layout (pointers are not looked at) and fills *b with its array
 * sizes. Returns 0 or DSQ_EINVAL. */
int dsq_weight_layout(const dsq_weight_t *w, dsq_weight_bytes_t *b);

/* dsq_weight_layout plus the pointers that layout needs are non-NULL.
 * Returns 0 or DSQ_EINVAL. */
int dsq_weight_check(const dsq_weight_t *w);

/* Rows [r0, r0 + n) of w as a weight of its own, sharing w's memory (every
 * format keeps whole rows contiguous in every array). Returns 0 or
 * DSQ_EINVAL (rows outside w, invalid w). */
int dsq_weight_rows(const dsq_weight_t *w, int64_t r0, int64_t n, dsq_weight_t *out);

/* Bytes of the data / scales / zeros arrays of a weight with the given
 * format and shape, in the F16 scale mode (so the planner and the
 * repackers agree). */
size_t dsq_weight_data_bytes(dsq_wformat_t f, int64_t n, int64_t k, int group_size);
size_t dsq_weight_scale_bytes(dsq_wformat_t f, int64_t n, int64_t k, int group_size);
/* (F16 INT/MIN modes: zeros take the same bytes as scales.) These two only
 * describe the F16 scale mode; dsq_weight_layout describes every layout. */

/* Turn a DSQ_WFMT_INT4 weight (F16 scale mode with group_size 32/64/128;
 * n % 8 == 0) into DSQ_WFMT_INT4_X8 in place (SUPER weights shrink:
 * dsq_weight_pack_x8):
 * its data and scale arrays are rewritten (they must be writable memory
 * the caller owns, not a file mapping) and w->format changes; sizes and
 * pointers stay. Tile by tile, with a 8-row scratch of its own (no
 * allocation beyond it).
 * Returns 0, DSQ_EINVAL (another format or layout, n % 8 != 0: w is left
 * as it was) or DSQ_ENOMEM. */
int dsq_weight_interleave_x8(dsq_weight_t *w);

/* A copy of src in the interleaved layout of its format, in one new
 * 64-byte aligned block (data | sub_scales | super) that the caller owns
 * through *storage (free()); src is not changed:
 *   - INT4 with SUPER scales, group 32, zp_mode MIN and every sub-scale
 *     and sub-zero in [0, 63] (GGUF Q4_K) -> DSQ_WFMT_INT4_X8;
 *   - INT8G with SUPER scales, group 16, zp_mode SYM and every q in
 *     [-32, 31] (GGUF Q6_K) -> DSQ_WFMT_INT6_X8;
 *   - INT8G with group 32, zp_mode SYM (q in [-16, 15]) or MIN (q in
 *     [0, 31]) (GGUF Q5_0, Q5_1, Q5_K; SUPER: sub-scales and sub-zeros in [0, 63])
 *     -> DSQ_WFMT_INT5_X8;
 *   - INT4 with SUPER scales, group 16, zp_mode MIN, every q in [0, 3]
 *     and every sub-scale and sub-zero in [0, 15] (GGUF Q2_K) ->
 *     DSQ_WFMT_INT2_X8;
 *   - INT4 with SUPER scales, group 16, zp_mode INT, every q in [0, 7],
 *     every sub-zero 4 and every sub-scale in [-32, 31] (GGUF Q3_K) ->
 *     DSQ_WFMT_INT3_X8 (zp_mode SYM: its offset 4 is the format's);
 *   - Q8_0 -> DSQ_WFMT_Q8_0_X8.
 * n % 8 == 0 for all. Returns 0, DSQ_EINVAL (another format or layout,
 * a value out of range: *dst and *storage untouched) or DSQ_ENOMEM. (INT4
 * weights with fp16 scales are interleaved in place:
 * dsq_weight_interleave_x8.) */
int dsq_weight_pack_x8(const dsq_weight_t *src, dsq_weight_t *dst, void **storage);

/* The interleaved twin of w's layout: *out = *w with the format
 * dsq_weight_interleave_x8 / dsq_weight_pack_x8 would give it (INT4 ->
 * INT4_X8, or with group-16 SUPER scales INT2_X8 (MIN) or INT3_X8 (INT,
 * then zp_mode SYM); INT8G -> INT6_X8 or INT5_X8, Q8_0 -> Q8_0_X8;
 * pointers are not touched, so only its layout means anything; whether
 * the values fit is pack's check). Returns 0, or
 * DSQ_EINVAL where w has none (other formats, n % 8 != 0, ...). */
int dsq_weight_x8_twin(const dsq_weight_t *w, dsq_weight_t *out);

/* Whether dsq_cpu_matmul on this CPU runs w faster in an interleaved
 * layout: int8 activations (w->act), an ISA level with the interleaved
 * kernels (x86 AVX2 and AVX-512 + VNNI; see docs/benchmarks.md), and
 * a valid weight with an interleaved twin (dsq_weight_x8_twin) and a
 * codebook-free zp_mode. */
bool dsq_cpu_weight_prefers_x8(const dsq_weight_t *w);

/* The CPU half of dsq_cpu_weight_prefers_x8: whether this CPU has the
 * interleaved kernels and uses them for activations of dtype act (so
 * every weight of the layouts above takes them; the memory planner's
 * question). */
bool dsq_cpu_has_x8(dsq_act_dtype_t act);

/* Dequantise row `row` (0 <= row < n) of w into out[k] fp32 (caller-owned),
 * with the format's reference formula above (INT4/INT8G: per zp_mode, with
 * s = d*a computed first in SUPER mode, so each weight is the same fp32
 * number ggml's dequantize_row_* gives; Q8_0: q*d; INT8: q*s[row]).
 * Returns 0 or DSQ_EINVAL (bad row/shape/format). */
int dsq_weight_dequant_row(const dsq_weight_t *w, int64_t row, float *out);

/* ------------------------------------------------------------ CPU control */

/* Number of threads CPU ops may use (>= 1; default: physical cores, from
 * sysfs topology), the calling thread included: it sizes the ops' thread
 * pool, so it applies whichever thread calls the op. Call it while no CPU
 * op runs. Idle pool threads spin for DSQ_CPU_SPIN_US microseconds (env,
 * default 200) after a job, then sleep on a futex. Returns 0 or
 * DSQ_EINVAL. */
int dsq_cpu_set_threads(int n_threads);
int dsq_cpu_get_threads(void);
/* Instruction-set level the CPU ops picked at first use (x86-64: CPUID;
 * AArch64: getauxval(AT_HWCAP)): "avx512", "avx2", "neon_dotprod" (NEON +
 * SDOT), "neon" or "scalar". DSQ_CPU_ISA=scalar|avx2|avx512|neon|
 * neon_dotprod in the environment forces a lower level of the same
 * architecture (tests compare fast paths with scalar this way;
 * dsq_cpu_force_isa does the same programmatically). */
const char *dsq_cpu_isa(void);
/* Returns 0, DSQ_EINVAL (unknown name) or DSQ_EUNSUPPORTED (the CPU lacks
 * that level, e.g. any x86 level on AArch64 and vice versa). Forcing the detected level undoes an earlier force. Not
 * thread-safe: call it while no CPU op runs. */
int dsq_cpu_force_isa(const char *name);

/* ------------------------------------------------------------------ ops */

/* y[m][n] = x[m][k] · W^T (+ bias). x, y fp32 host memory, row-major,
 * not aliased. Works for every dsq_wformat_t; m = 1..8 is the decode path,
 * larger m the prefill path. Any k >= 1 (Q8_0: k % 32 == 0).
 * Accuracy: F32/F16/BF16 are fp32 dot products, and so are INT4, Q8_0 and
 * INT8 when w->act == DSQ_ACT_F32 (weights dequantised to fp32 in
 * registers: y = W·x up to fp32 rounding). With w->act == DSQ_ACT_INT8
 * (default) INT4, Q8_0 and INT8
 * quantise each row of x to int8 per 32-block once per call (d = amax/127,
 * round to nearest even, as llama.cpp's Q8_0/Q8_1 activations) and use
 * integer dot products, so y = W·x^ up to fp32 rounding with
 * |x - x^| <= amax_block/254 per element. Every ISA path gives the same
 * integer dots; results differ between paths only by fp32 summation order.
 * Returns 0, DSQ_EINVAL (bad shape/format/act/NULL) or DSQ_ENOMEM. */
int dsq_cpu_matmul(float *y, const float *x, int64_t m, const dsq_weight_t *w);

/* n independent products y[i][m[i]][w[i]->n] = x[i][m[i]][k] W_i^T, each as
 * dsq_cpu_matmul computes it (bit for bit), in one dispatch over the thread
 * pool: their tiles are split as one list, so a layer of small products
 * (a MoE layer's experts at decode, gate beside up) pays one barrier, not
 * one per product. Products over the same x that read it the same way
 * (pointer, m, k, group size, and the same kernel family: panel or row)
 * quantise it once. y, x, m, w: host arrays of n entries; no y[i] may
 * overlap another y[j] or any x[j]. n == 0 does nothing. Returns 0,
 * DSQ_EINVAL (n < 0, a NULL array, or any product dsq_cpu_matmul refuses;
 * then no y is written) or DSQ_ENOMEM. */
int dsq_cpu_matmul_many(int n, float *const *y, const float *const *x, const int64_t *m,
                        const dsq_weight_t *const *w);

/* dsq_cpu_matmul with fp16 activations: x [m][k] and y [m][n] IEEE binary16
 * (uint16 bits). x is widened to fp32, the product is the DSQ_ACT_F32 path
 * whatever w->act says (exact dequantisation, fp32 accumulation) and y is
 * rounded to nearest even. The reference of dsq_cuda_matmul with fp16 x
 * and y; not a fast path. Returns 0, DSQ_EINVAL or DSQ_ENOMEM. */
int dsq_cpu_matmul_f16(uint16_t *y, const uint16_t *x, int64_t m, const dsq_weight_t *w);

/* dst[i][0..width) = src[rows[i]][0..width) for i < m (the rows of a step
 * whose logits are wanted). src has n_src rows; dst must not overlap src.
 * Returns 0, DSQ_EINVAL or DSQ_ERANGE (a row outside [0, n_src)). */
int dsq_cpu_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t m,
                        int64_t width, int64_t n_src);

/* dst[t][j] = src[t][perm[j]] for t < m, j < k: the input of a GPTQ
 * act-order weight, whose k order is permuted so that groups are
 * contiguous (engine/model/quant.h). dst != src. Returns 0, DSQ_EINVAL or
 * DSQ_ERANGE (perm[j] outside [0, k)). */
int dsq_cpu_gather_cols(float *dst, const float *src, const int32_t *perm, int64_t m,
                        int64_t k);

/* out[m][k] = row ids[i] of the embedding matrix emb (any format, n = vocab
 * rows, k = n_embd), dequantised to fp32. Returns DSQ_ERANGE for an id
 * outside [0, n). */
int dsq_cpu_embed(float *out, const dsq_weight_t *emb, const int32_t *ids, int64_t m);

/* RMSNorm: y[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w, over rows of n.
 * y may alias x. (Zhang & Sennrich 2019.) */
int dsq_cpu_rmsnorm(float *y, const float *x, const float *w, int64_t m,
                    int64_t n, float eps);

/* RoPE parameters (Su et al. 2021; linear scaling: Chen et al. 2023; YaRN:
 * Peng et al. 2023, as implemented by transformers' _compute_yarn_parameters
 * and DeepSeek-V2's DeepseekV2YarnRotaryEmbedding).
 *
 * Pair i (0 <= i < rot_dim/2) of every head is rotated by the angle
 *   pos * inv_freq[i],  inv_freq[i] = mix of
 *     extrapolated  e_i = theta^(-2i/rot_dim)
 *     interpolated  f_i = freq_scale * e_i
 *   ext_factor == 0: inv_freq[i] = f_i (plain or linear-scaled RoPE);
 *   ext_factor  > 0 (YaRN): with [low, high] the correction range of
 *     dsq_rope_corr_dims() and ramp_i = clamp((i - low)/(high - low), 0, 1)
 *     (high += 0.001 when high == low), the extrapolation weight is
 *     w_i = (1 - ramp_i) * ext_factor and inv_freq[i] = f_i (1-w_i) + e_i w_i.
 * cos and sin are multiplied by attn_factor (YaRN mscale). Zero-initialised
 * freq_scale or attn_factor mean 1; zero beta_fast/beta_slow mean 32/1.
 * Dims rot_dim..head_dim-1 of each head are left untouched. */
typedef struct dsq_rope {
    int rot_dim;              /* dims rotated per head (<= head_dim), even    */
    bool neox;                /* pairs (i, i+rot_dim/2) vs (2i, 2i+1)         */
    float theta;              /* base                                         */
    float freq_scale;         /* 1/linear factor (1 = none)                   */
    /* YaRN (ext_factor 0 disables): */
    float ext_factor;         /* 1 for YaRN as in transformers               */
    float attn_factor;        /* multiplies cos/sin (mscale)                  */
    float beta_fast, beta_slow;
    int orig_ctx;             /* original_max_position_embeddings             */
} dsq_rope_t;

/* Fill *p from a model config's numbers. scaling uses the numbers of
 * dsq_rope_scaling_t (engine/io/model_config.h): 0 none, 1 linear (freq_scale
 * = 1/factor), 3 YaRN (freq_scale = 1/factor, ext_factor = 1, beta_fast /
 * beta_slow (<= 0 means 32 / 1), orig_ctx, and attn_factor =
 * dsq_rope_yarn_mscale(factor, mscale) / dsq_rope_yarn_mscale(factor,
 * mscale_all_dim) when both mscales are > 0, else
 * dsq_rope_yarn_mscale(factor, 1)). Note DeepSeek-V2 additionally multiplies
 * the softmax scale by dsq_rope_yarn_mscale(factor, mscale_all_dim)^2; that
 * is the caller's job (the scale argument of dsq_cpu_attention).
 * Returns 0, DSQ_EINVAL (rot_dim odd or <= 0, theta <= 0, factor <= 0, YaRN
 * orig_ctx <= 0) or DSQ_EUNSUPPORTED (scaling 2 = dynamic NTK, or unknown). */
int dsq_rope_init(dsq_rope_t *p, int rot_dim, bool neox, double theta,
                  int scaling, double factor, int orig_ctx, double beta_fast,
                  double beta_slow, double mscale, double mscale_all_dim);

/* YaRN magnitude scale: 0.1 * mscale * ln(factor) + 1, or 1 if factor <= 1
 * (yarn_get_mscale in transformers / DeepSeek-V2). */
double dsq_rope_yarn_mscale(double factor, double mscale);

/* YaRN correction range in pair units: dims[0] = max(floor(low), 0),
 * dims[1] = min(ceil(high), rot_dim - 1) with
 *   corr(r) = rot_dim * ln(orig_ctx / (2 pi r)) / (2 ln theta),
 *   low = corr(beta_fast), high = corr(beta_slow). */
void dsq_rope_corr_dims(const dsq_rope_t *p, double dims[2]);

/* inv_freq[rot_dim/2] in fp64 as described above (the table both the CPU
 * and the CUDA op use). */
void dsq_rope_inv_freq(const dsq_rope_t *p, double *inv_freq);

/* Rotate x in place: x is [m][n_heads][head_dim] fp32, pos [m] positions.
 * Angles are formed in fp64 (pos * inv_freq), so large positions keep
 * their precision. Returns 0 or DSQ_EINVAL (rot_dim odd, <= 0 or >
 * head_dim, n_heads < 1, m < 0). */
int dsq_cpu_rope(float *x, int64_t m, int n_heads, int head_dim,
                 const int32_t *pos, const dsq_rope_t *p);

/* out[m][n] = silu(gate) * up. out may alias gate. */
int dsq_cpu_swiglu(float *out, const float *gate, const float *up, int64_t m,
                   int64_t n);

/* y[i] += x[i] for n elements. */
int dsq_cpu_add(float *y, const float *x, int64_t n);

/* In-place softmax of each of m rows of n fp32 values. */
int dsq_cpu_softmax(float *x, int64_t m, int64_t n);

/* ------------------------------------------------------------ KV cache */

typedef enum dsq_kv_dtype {
    DSQ_KV_F16 = 0,   /* fp16 values (IEEE binary16, rounded to nearest even) */
    DSQ_KV_INT8 = 1,  /* signed int8 q in [-128, 127]; per group of 64 along
                         head_dim one fp16 scale s and one fp16 zero z:
                         v = (q - z) * s. head_dim not a multiple of 64 uses
                         one group per head (dsq_kv_n_groups).           */
    DSQ_KV_F32 = 2,   /* fp32 values, exact (CPU kv_write/attention and the
                         MLA ops). The engine picks it for "auto" when the
                         model's weights are FP32: fp16 rounding of cached
                         values moves tiny FP32 models' logits by ~2e-3
                         relative, more than a reference comparison allows.
                         The CUDA ops support F16 and INT8 only.          */
} dsq_kv_dtype_t;

/* Groups per head of an INT8 KV cache: head_dim / 64 when head_dim is a
 * multiple of 64, else 1. */
int dsq_kv_n_groups(int head_dim);

/* One layer's paged KV storage. Token slot t = block * block_size + offset.
 * k, v: [n_blocks][block_size][n_kv_heads][head_dim] elements of dtype.
 * k_scale/k_zero/v_scale/v_zero (INT8 only): fp16
 * [n_blocks][block_size][n_kv_heads][n_groups]. Memory is owned by the KV
 * cache; ops only read/write it. */
typedef struct dsq_kv_layer {
    dsq_kv_dtype_t dtype;
    int block_size;          /* tokens per block                               */
    int n_kv_heads;
    int head_dim;
    int64_t n_blocks;
    void *k, *v;
    uint16_t *k_scale, *k_zero, *v_scale, *v_zero;
} dsq_kv_layer_t;

/* Write m tokens' keys and values ([m][n_kv_heads*head_dim] fp32, host)
 * into the slots slot[i] (quantising for INT8). Every slot is checked before
 * anything is written. Distinct i must use distinct slots.
 * INT8 quantisation of a group with minimum lo and maximum hi (asymmetric,
 * min/max, cf. the KIVI / group-wise KV quantisation literature):
 *   s = max((hi - lo) / 254, max(|lo|, |hi|) / 1000),  z = -(lo + hi) / (2 s)
 * both rounded to fp16, then q = clamp(round(v / s + z), -128, 127). The
 * 254 (not 255) leaves room for the fp16 rounding of s and z, and the
 * amax/1000 floor keeps |z| < 1024 where fp16 holds z to 0.25, so no value
 * clips: |v - (q - z) s| <= s/2 (+ fp32 rounding). An all-zero group gets
 * s = 0, z = 0, q = 0.
 * Returns 0, DSQ_EINVAL (NULL pointers, bad layer shape, m < 0) or
 * DSQ_ERANGE (a slot outside [0, n_blocks * block_size)). */
int dsq_cpu_kv_write(const dsq_kv_layer_t *kv, const float *k, const float *v,
                     const int32_t *slot, int64_t m);

/* Causal attention of m query rows over the paged cache (GQA: query head h
 * reads kv head h / (n_heads / n_kv_heads)).
 *   q:     [m][n_heads*head_dim] fp32 (RoPE already applied)
 *   out:   [m][n_heads*head_dim] fp32, must not alias q
 *   row_seq[i]: which block table row i uses; row_pos[i]: its position, it
 *   attends to positions 0..row_pos[i] inclusive of that sequence (position
 *   p lives in block block_tables[row_seq[i]][p / block_size], offset
 *   p % block_size).
 *   block_tables: [n_seqs][max_blocks] int32 block ids.
 *   scale: multiplies q.k (normally 1/sqrt(head_dim)).
 * Rows may mix sequences, and a prefill chunk (several rows of one sequence
 * with increasing positions) may sit next to decode rows. Online softmax
 * (running max and sum, as in FlashAttention, Dao et al. 2022), so memory
 * is O(head_dim * n_heads/n_kv_heads + block_size) per thread whatever the
 * context length; FP16/INT8 KV is dequantised on the fly.
 * The KV for every attended position must already be written.
 * Returns 0, DSQ_EINVAL (NULL pointers, n_heads not a multiple of
 * n_kv_heads, head_dim/block_size < 1, row_seq[i] < 0), DSQ_ERANGE
 * (row_pos[i] < 0 or >= max_blocks * block_size, or an attended block id
 * outside [0, n_blocks)) or DSQ_ENOMEM. */
int dsq_cpu_attention(float *out, const float *q, int64_t m, int n_heads,
                      const dsq_kv_layer_t *kv, const int32_t *row_seq,
                      const int32_t *row_pos, const int32_t *block_tables,
                      int max_blocks, float scale);
/* As dsq_cpu_attention, with seq_decode (NULL, or one flag per sequence
 * index row_seq takes): the rows of a flagged sequence are attended as
 * single decode rows even where they form a run (a decoding sequence's
 * pending token and speculative drafts), not as a prefill tile. A decode
 * row's bits depend on its position and the thread count only (a long
 * context is split across threads at positions fixed by those two,
 * kernels/cpu/attention.c row_parts), never on the rows beside it, so a
 * verified draft row gets the bits plain decoding gives at its position.
 * A tile walks each row's context whole; the two agree bitwise while a
 * row is not split (short contexts, one thread) and within ~1e-7
 * relative otherwise. */
int dsq_cpu_attention_ex(float *out, const float *q, int64_t m, int n_heads,
                         const dsq_kv_layer_t *kv, const int32_t *row_seq,
                         const int32_t *row_pos, const int32_t *block_tables,
                         int max_blocks, float scale, const uint8_t *seq_decode);

/* ------------------------------------------ DeepSeek-V2 MLA and MoE (ds2) */

/* Multi-head latent attention in the absorbed form (DeepSeek-V2 paper,
 * arXiv:2405.04434, section 2.1; kernels/cpu/mla_attention.c).
 * The cache layer kv holds one vector per token (n_kv_heads == 1, no V
 * pool needed: kv->v is ignored): head_dim D = kv_lora_rank + rope dims,
 * the normalised latent c followed by the RoPE'd shared key k_pe.
 *   q:   [m][n_heads][D] fp32: per head [W_UK_h^T q_nope_h, rope(q_pe_h)]
 *   out: [m][n_heads][kv_lora_rank] fp32, must not alias q:
 *        sum_t softmax_t(scale * q_h . cache_t) * c_t (the caller applies
 *        W_UV_h, then o_proj).
 * row_seq/row_pos/block_tables/max_blocks and the causal rule are as in
 * dsq_cpu_attention (a row attends to positions 0..row_pos of its
 * sequence). FP16, INT8 or F32 cache, dequantised on the fly; online softmax.
 * Returns 0, DSQ_EINVAL (NULL pointers, n_kv_heads != 1, kv_lora_rank
 * outside [1, D], bad shapes, row_seq < 0), DSQ_ERANGE (row_pos out of the
 * table, attended block id outside [0, n_blocks)) or DSQ_ENOMEM. */
int dsq_cpu_mla_attention(float *out, const float *q, int64_t m, int n_heads,
                          int kv_lora_rank, const dsq_kv_layer_t *kv,
                          const int32_t *row_seq, const int32_t *row_pos,
                          const int32_t *block_tables, int max_blocks, float scale);

/* Write m latent rows ([m][D] fp32, D = kv->head_dim, n_kv_heads == 1)
 * into slots slot[i] of an MLA cache layer (no V pool). Same rounding and
 * INT8 scheme as dsq_cpu_kv_write (it is that writer applied to K only);
 * DSQ_KV_F32 stores the values exactly.
 * Returns 0, DSQ_EINVAL or DSQ_ERANGE (slot outside the cache). */
int dsq_cpu_mla_kv_write(const dsq_kv_layer_t *kv, const float *latent,
                         const int32_t *slot, int64_t m);

/* Read m cached latent vectors (slots slot[i]) back as fp32 out[m][D]
 * (dequantised). Returns 0, DSQ_EINVAL or DSQ_ERANGE. */
int dsq_cpu_mla_kv_read(const dsq_kv_layer_t *kv, const int32_t *slot, int64_t m,
                        float *out);

/* MLA in the expanded (prefill) form, for m rows of ONE sequence over a
 * dense context of n_ctx positions whose per-head keys/values the caller
 * expanded from the cached latents (kv = latent · kv_b_proj^T):
 *   q:    [m][n_heads][qk_nope_dim + qk_rope_dim] fp32 (rope part RoPE'd)
 *   kv:   [n_ctx][n_heads][qk_nope_dim + v_dim] fp32 (k_nope then v)
 *   k_pe: [n_ctx][qk_rope_dim] fp32, the shared RoPE'd key
 *   out:  [m][n_heads][v_dim] fp32
 * Row i attends to positions 0..row_pos[i] (causal); scores
 * scale * (q_nope . k_nope + q_pe . k_pe), softmax in fp32. Mathematically
 * equal to dsq_cpu_mla_attention followed by W_UV (DeepSeek-V2 section
 * 2.1.2); cheaper when many rows share a long context.
 * Returns 0, DSQ_EINVAL, DSQ_ERANGE (row_pos outside [0, n_ctx)) or
 * DSQ_ENOMEM. */
int dsq_cpu_mla_attention_dense(float *out, const float *q, int64_t m, int n_heads,
                                const int32_t *row_pos, const float *kv,
                                const float *k_pe, int64_t n_ctx, int qk_nope_dim,
                                int qk_rope_dim, int v_dim, float scale);

typedef enum dsq_moe_topk {
    DSQ_MOE_TOPK_GREEDY = 0,         /* top-k over all experts                */
    DSQ_MOE_TOPK_GROUP_LIMITED = 1,  /* groups ranked by their max score       */
    DSQ_MOE_TOPK_NOAUX_TC = 2,       /* groups ranked by sum of their top-2    */
} dsq_moe_topk_t;

typedef enum dsq_moe_score {
    DSQ_MOE_SCORE_SOFTMAX = 0,
    DSQ_MOE_SCORE_SIGMOID = 1,
} dsq_moe_score_t;

/* Router configuration (DeepSeek-V2/V3 config.json names in brackets). */
typedef struct dsq_moe_route {
    int n_experts;                 /* [n_routed_experts], 1..4096             */
    int top_k;                     /* [num_experts_per_tok], <= n_experts     */
    int n_group, topk_group;       /* [n_group], [topk_group]; n_group divides
                                      n_experts; 1..n_group groups kept       */
    dsq_moe_topk_t method;         /* [topk_method]                           */
    dsq_moe_score_t scoring;       /* [scoring_func]                          */
    bool norm_topk_prob;           /* w /= sum(w) + 1e-20 before scaling      */
    float routed_scaling_factor;   /* [routed_scaling_factor]                 */
    const float *bias;             /* [e_score_correction_bias] fp32
                                      [n_experts], added for selection only;
                                      NULL = none                             */
} dsq_moe_route_t;

/* Route m tokens: logits [m][n_experts] fp32 (the gate's output) ->
 * ids [m][top_k] (in selection order: best first; ties -> lower id) and
 * weights [m][top_k] fp32 = score (softmax/sigmoid, unbiased) of the expert,
 * optionally normalised over the k chosen, times routed_scaling_factor.
 * Group-limited methods mask the experts of dropped groups with 0 (as
 * transformers' DeepseekV2Moe/DeepseekV3 do). Caller-owned arrays.
 * Returns 0 or DSQ_EINVAL (NULL pointers, inconsistent parameters). */
int dsq_cpu_moe_route(int32_t *ids, float *weights, const float *logits, int64_t m,
                      const dsq_moe_route_t *p);

/* Group the m*top_k (token, expert) pairs of dsq_cpu_moe_route by expert
 * (stable counting sort): expert e's pairs are entries offsets[e] ..
 * offsets[e+1]-1 of rows (token row) and row_weights (its weight).
 *   offsets: [n_experts + 1] int32; rows, row_weights: [m * top_k].
 * Returns 0, DSQ_EINVAL, DSQ_ERANGE (an id outside [0, n_experts)) or
 * DSQ_ENOMEM. */
int dsq_cpu_moe_group(int32_t *offsets, int32_t *rows, float *row_weights,
                      const int32_t *ids, const float *weights, int64_t m,
                      int top_k, int n_experts);

/* ------------------------------------------------------------ CUDA twins
 *
 * Same meaning as the dsq_cpu_* op of the same name, but every array is
 * device memory (dsq_weight_t, dsq_kv_layer_t and dsq_rope_t themselves are
 * host structs whose array pointers are device memory), and activation
 * arrays carry their element type (dsq_ftype_t) in the argument after
 * them: `void *y, dsq_ftype_t yt`, or one type for several arrays (swiglu's
 * out, gate and up; kv_write's k and v; attention's out and q). Arrays
 * typed float stay fp32 whatever the step's activation type: the residual
 * stream (embed's output, rmsnorm's input, add's accumulator, gather_rows),
 * norm weights and softmax rows. Loads widen to fp32, every sum and every
 * element-wise formula is the CPU op's in fp32, and stores round to nearest
 * even; so with DSQ_FT_F32 everywhere an op matches the CPU op up to fp32
 * summation order, and with a narrow type it matches the CPU op run on the
 * same (widened) inputs up to that and one rounding of each output.
 *
 * They run asynchronously on the calling thread's stream
 * (dsq_cuda_set_stream): a return of 0 means the launch succeeded. Returns
 * DSQ_EINVAL for bad shapes or an ftype outside the enum (as the CPU op;
 * also rot_dim > 512 for rope, head_dim > 1024 for kv_write/attention,
 * m > 65535 for dsq_cuda_attention and for dsq_cuda_attention_prefill with
 * head_dim > 256, m > 65535 * 64 for the products), DSQ_EUNSUPPORTED for a
 * DSQ_KV_F32 cache (CUDA supports F16 and INT8 KV) or a product's type pair
 * other than (t, t) and (F32 out, F16/BF16 in), and DSQ_ECUDA when a launch
 * fails (the CUDA reason is logged: "cuda op=... error=..."). Index arrays
 * (ids, pos, slot, rows, perm, row_seq, row_pos, block_tables) live on the
 * device and are not validated on the host: embed, gather_rows and
 * gather_cols give zeros for an index out of range, kv_write skips a slot
 * outside the cache, and attention writes zeros for a row whose position or
 * blocks are out of range, instead of DSQ_ERANGE.
 *
 * Products (dsq_cuda_matmul) dequantise weights by the kernels.h formulas
 * and multiply the widened activations with fp32 accumulation: they match
 * dsq_cpu_matmul with DSQ_ACT_F32 up to summation order (and, narrow, the
 * output's rounding: dsq_cpu_matmul_f16 is the F16 reference), and ignore
 * w->act. m <= 16 takes the decode kernel (each weight byte read once for
 * all m rows), larger m the prefill (tiled) kernel. The (F32 out, narrow
 * in) pair is the output head's: logits leave in fp32.
 *
 * dsq_cuda_attention is a decode kernel (one block per row and head, any
 * rows); dsq_cuda_attention_prefill computes the same op but shares each
 * K/V tile among 16 consecutive (row, head) queries of one KV head, which
 * pays off for runs of rows of one sequence (prefill chunks) and for GQA
 * groups. Both are twins of dsq_cpu_attention; they may differ from each
 * other in the last bits (fp32 summation order).
 * Only built when meson's cuda feature is enabled. */

/* A CUDA stream (a cudaStream_t), opaque to C code. */
typedef struct dsq_cuda_stream dsq_cuda_stream_t;
/* Stream of the calling thread's launches (NULL: the legacy default
 * stream, the initial value of every thread). */
void dsq_cuda_set_stream(dsq_cuda_stream_t *s);
dsq_cuda_stream_t *dsq_cuda_get_stream(void);

int dsq_cuda_matmul(void *y, dsq_ftype_t yt, const void *x, dsq_ftype_t xt, int64_t m,
                    const dsq_weight_t *w);
int dsq_cuda_embed(float *out, const dsq_weight_t *emb, const int32_t *ids, int64_t m);
int dsq_cuda_gather_rows(float *dst, const float *src, const int32_t *rows, int64_t m,
                         int64_t width, int64_t n_src);
int dsq_cuda_gather_cols(void *dst, const void *src, dsq_ftype_t t, const int32_t *perm,
                         int64_t m, int64_t k);
int dsq_cuda_rmsnorm(void *y, dsq_ftype_t yt, const float *x, const float *w, int64_t m,
                     int64_t n, float eps);
int dsq_cuda_rope(void *x, dsq_ftype_t t, int64_t m, int n_heads, int head_dim,
                  const int32_t *pos, const dsq_rope_t *p);
int dsq_cuda_swiglu(void *out, const void *gate, const void *up, dsq_ftype_t t, int64_t m,
                    int64_t n);
int dsq_cuda_add(float *y, const void *x, dsq_ftype_t xt, int64_t n);
int dsq_cuda_softmax(float *x, int64_t m, int64_t n);
int dsq_cuda_kv_write(const dsq_kv_layer_t *kv, const void *k, const void *v,
                      dsq_ftype_t t, const int32_t *slot, int64_t m);
int dsq_cuda_attention(void *out, const void *q, dsq_ftype_t t, int64_t m, int n_heads,
                       const dsq_kv_layer_t *kv, const int32_t *row_seq,
                       const int32_t *row_pos, const int32_t *block_tables,
                       int max_blocks, float scale);
int dsq_cuda_attention_prefill(void *out, const void *q, dsq_ftype_t t, int64_t m,
                               int n_heads, const dsq_kv_layer_t *kv,
                               const int32_t *row_seq, const int32_t *row_pos,
                               const int32_t *block_tables, int max_blocks, float scale);

#endif
