/* The numeric ops, as plain C launchers.
 *
 * Every op has a CPU implementation `dsq_cpu_<op>` (kernels/cpu/<op>.c) and,
 * where the CUDA backend implements it, a twin `dsq_cuda_<op>` with the same
 * arguments (kernels/cuda/<op>.cu) operating on device pointers. The CPU op
 * is the reference in tests. All matrices are row-major; activations are
 * fp32 on the CPU backend. Ops return 0 or a negative DSQ_E* code.
 *
 * CPU ops parallelise internally with OpenMP; the thread count is set once
 * with dsq_cpu_set_threads().
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
} dsq_wformat_t;

/* Zero-point convention of a DSQ_WFMT_INT4 weight, per group:
 *   SYM: w = (q - 8) * s                 zeros == NULL (GGUF Q4_0, GPTQ sym)
 *   INT: w = (q - z) * s                 z integer 0..15 stored as fp16 in
 *                                        zeros[] (AWQ, GPTQ asym)
 *   MIN: w = q * s + m                   m stored as fp16 in zeros[] (Q4_1)
 * Keeping all three lets Q4_0/Q4_1/AWQ/GPTQ repack exactly, with no
 * requantisation; kernels fold each into acc += s*dot(x,q) + c*sum(x). */
typedef enum dsq_zp_mode {
    DSQ_ZP_SYM = 0,
    DSQ_ZP_INT = 1,
    DSQ_ZP_MIN = 2,
} dsq_zp_mode_t;

/* A linear layer's weight, in one of the formats above.
 *
 * DSQ_WFMT_INT4 byte layout (the "dsq native" layout):
 *   - groups of group_size (32, 64 or 128) consecutive weights along k;
 *     k_pad = k rounded up to a multiple of 32, groups = ceil(k / group_size)
 *     (the last group may be partial; padded weights are q = 0 and must be
 *     ignored by the kernel, which only reads k activations).
 *   - qweight: n rows of k_pad/2 bytes. Each row is a run of 32-weight chunks
 *     of 16 bytes; in a chunk, byte j holds weight j in its low nibble and
 *     weight j+16 in its high nibble (the GGML Q4_0/Q4_1 nibble order).
 *   - scales: fp16 [n][groups]; zeros: fp16 [n][groups] (NULL for SYM).
 * Memory is owned by whoever built the dsq_weight_t (the model), never by the
 * kernel. bias (fp32 [n]) is optional for every format. */
typedef struct dsq_weight {
    dsq_wformat_t format;
    int64_t n;                 /* output features (rows of W)                  */
    int64_t k;                 /* input features (reduction dim)               */
    int group_size;            /* INT4: 32/64/128; Q8_0: 32; others: 0         */
    dsq_zp_mode_t zp_mode;     /* INT4 only                                    */
    const void *data;          /* qweight or plain matrix, see format           */
    const uint16_t *scales;    /* INT4: fp16 [n][groups]; INT8: fp16 [n]        */
    const uint16_t *zeros;     /* INT4 INT/MIN modes: fp16 [n][groups]          */
    const float *bias;         /* fp32 [n] or NULL                              */
} dsq_weight_t;

/* Bytes of the data / scales / zeros arrays of a weight with the given
 * format and shape (so the planner and the repackers agree). */
size_t dsq_weight_data_bytes(dsq_wformat_t f, int64_t n, int64_t k, int group_size);
size_t dsq_weight_scale_bytes(dsq_wformat_t f, int64_t n, int64_t k, int group_size);

/* ------------------------------------------------------------ CPU control */

/* Number of threads CPU ops may use (>= 1). Returns 0 or DSQ_EINVAL. */
int dsq_cpu_set_threads(int n_threads);
int dsq_cpu_get_threads(void);
/* Instruction-set level the CPU ops picked from CPUID at first use:
 * "avx512", "avx2", "neon" or "scalar". DSQ_CPU_ISA=scalar|avx2|avx512 in
 * the environment forces a lower level (tests compare fast paths with
 * scalar this way; dsq_cpu_force_isa does the same programmatically). */
const char *dsq_cpu_isa(void);
int dsq_cpu_force_isa(const char *name);

/* ------------------------------------------------------------------ ops */

/* y[m][n] = x[m][k] · W^T (+ bias). x, y fp32 host memory, row-major,
 * not aliased. Works for every dsq_wformat_t; m = 1..8 is the decode path,
 * larger m the prefill path. Returns 0 or DSQ_EINVAL (bad shape/format). */
int dsq_cpu_matmul(float *y, const float *x, int64_t m, const dsq_weight_t *w);

/* out[m][k] = row ids[i] of the embedding matrix emb (any format, n = vocab
 * rows, k = n_embd), dequantised to fp32. Returns DSQ_ERANGE for an id
 * outside [0, n). */
int dsq_cpu_embed(float *out, const dsq_weight_t *emb, const int32_t *ids, int64_t m);

/* RMSNorm: y[i] = x[i] / sqrt(mean(x[i]^2) + eps) * w, over rows of n.
 * y may alias x. (Zhang & Sennrich 2019.) */
int dsq_cpu_rmsnorm(float *y, const float *x, const float *w, int64_t m,
                    int64_t n, float eps);

/* RoPE parameters (Su et al. 2021; linear scaling: Chen et al. 2023; YaRN:
 * Peng et al. 2023, as implemented by transformers' _compute_yarn_parameters). */
typedef struct dsq_rope {
    int rot_dim;              /* dims rotated per head (<= head_dim), even    */
    bool neox;                /* pairs (i, i+rot_dim/2) vs (2i, 2i+1)         */
    float theta;              /* base                                         */
    float freq_scale;         /* 1/linear factor (1 = none)                   */
    /* YaRN (ext_factor 0 disables): */
    float ext_factor;
    float attn_factor;        /* multiplies cos/sin (mscale)                  */
    float beta_fast, beta_slow;
    int orig_ctx;
} dsq_rope_t;

/* Rotate x in place: x is [m][n_heads][head_dim] fp32, pos [m] positions. */
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
    DSQ_KV_F16 = 0,   /* fp16 values                                        */
    DSQ_KV_INT8 = 1,  /* int8 values; per group of 64 along head_dim one fp16
                         scale and one fp16 zero: v = (q - z) * s. head_dim
                         not a multiple of 64 uses one group per head.      */
} dsq_kv_dtype_t;

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

/* Write m tokens' keys and values ([m][n_kv_heads*head_dim] fp32) into the
 * slots slot[i] (quantising for INT8). Returns DSQ_ERANGE for a bad slot. */
int dsq_cpu_kv_write(const dsq_kv_layer_t *kv, const float *k, const float *v,
                     const int32_t *slot, int64_t m);

/* Causal attention of m query rows over the paged cache (GQA: query head h
 * reads kv head h / (n_heads / n_kv_heads)).
 *   q:     [m][n_heads*head_dim] fp32 (RoPE already applied)
 *   out:   [m][n_heads*head_dim] fp32
 *   row_seq[i]: which block table row i uses; row_pos[i]: its position, it
 *   attends to positions 0..row_pos[i] inclusive of that sequence.
 *   block_tables: [n_seqs][max_blocks] int32 block ids.
 * The KV for every attended position must already be written. */
int dsq_cpu_attention(float *out, const float *q, int64_t m, int n_heads,
                      const dsq_kv_layer_t *kv, const int32_t *row_seq,
                      const int32_t *row_pos, const int32_t *block_tables,
                      int max_blocks, float scale);

#endif
