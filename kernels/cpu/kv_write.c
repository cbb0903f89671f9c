/* KV-cache write: store m tokens' K and V rows into their paged slots, as
 * fp16 or as group-wise INT8 (scheme and error bound in kernels.h).
 *
 * All slots are validated before the first write so a bad batch leaves the
 * cache untouched. The fp32 -> fp16 conversion rounds to nearest even in
 * both the scalar and the F16C path, so the two paths store identical bits;
 * INT8 quantisation stays scalar (a min/max pass and a rounding pass per
 * group of 64, cheap next to the matmuls that produced the rows). */
#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KV_X86 1
#endif

#include "cpu_internal.h"
#include "engine/common/error.h"
#include "kernels.h"

int dsq_kv_n_groups(int head_dim)
{
    return (head_dim > 0 && head_dim % 64 == 0) ? head_dim / 64 : 1;
}

static void f2h_row_scalar(uint16_t *dst, const float *src, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] = dsq__f2h(src[i]);
}

#ifdef KV_X86
__attribute__((target("avx2,fma,f16c")))
static void f2h_row_f16c(uint16_t *dst, const float *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(void *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = dsq__f2h(src[i]);
}
#endif

static void quant_group(int8_t *q, uint16_t *s_out, uint16_t *z_out,
                        const float *v, int n)
{
    float lo = v[0], hi = v[0];
    for (int i = 1; i < n; i++) {
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    float amax = fabsf(lo) > fabsf(hi) ? fabsf(lo) : fabsf(hi);
    float s = (hi - lo) / 254.0f;
    if (s < amax / 1000.0f)
        s = amax / 1000.0f;
    if (s > 65504.0f)
        s = 65504.0f;
    uint16_t sh = dsq__f2h(s);
    float sf = dsq__h2f(sh);
    if (!(sf > 0.0f)) {                     /* all zero, or s underflows  */
        *s_out = 0;
        *z_out = 0;
        memset(q, 0, (size_t)n);
        return;
    }
    uint16_t zh = dsq__f2h(-(lo + hi) / (2.0f * sf));
    float zf = dsq__h2f(zh);
    float inv = 1.0f / sf;
    for (int i = 0; i < n; i++) {
        float t = nearbyintf(v[i] * inv + zf);
        t = t < -128.0f ? -128.0f : t > 127.0f ? 127.0f : t;
        q[i] = (int8_t)t;
    }
    *s_out = sh;
    *z_out = zh;
}

static void quant_row(int8_t *q, uint16_t *s, uint16_t *z, const float *v,
                      int n, int n_groups)
{
    int gs = n / n_groups;
    for (int g = 0; g < n_groups; g++)
        quant_group(q + g * gs, s + g, z + g, v + g * gs, gs);
}

struct kvw_ctx {
    const dsq_kv_layer_t *kv;
    const float *k, *v;
    const int32_t *slot;
    int row, n_groups;
    void (*cvt)(uint16_t *, const float *, int);
};

static void kvw_rows(void *p, int64_t i0, int64_t i1)
{
    const struct kvw_ctx *c = p;
    const dsq_kv_layer_t *kv = c->kv;
    const int row = c->row, n_groups = c->n_groups;
    for (int64_t i = i0; i < i1; i++) {
        const int64_t t = c->slot[i];
        const float *ks = c->k + i * row, *vs = c->v + i * row;
        if (kv->dtype == DSQ_KV_F16) {
            c->cvt((uint16_t *)kv->k + t * row, ks, row);
            c->cvt((uint16_t *)kv->v + t * row, vs, row);
        } else if (kv->dtype == DSQ_KV_F32) {
            memcpy((float *)kv->k + t * row, ks, (size_t)row * sizeof(float));
            memcpy((float *)kv->v + t * row, vs, (size_t)row * sizeof(float));
        } else {
            for (int h = 0; h < kv->n_kv_heads; h++) {
                int64_t e = t * row + (int64_t)h * kv->head_dim;
                int64_t g = (t * kv->n_kv_heads + h) * n_groups;
                quant_row((int8_t *)kv->k + e, kv->k_scale + g, kv->k_zero + g,
                          ks + h * kv->head_dim, kv->head_dim, n_groups);
                quant_row((int8_t *)kv->v + e, kv->v_scale + g, kv->v_zero + g,
                          vs + h * kv->head_dim, kv->head_dim, n_groups);
            }
        }
    }
}

int dsq_cpu_kv_write(const dsq_kv_layer_t *kv, const float *k, const float *v,
                     const int32_t *slot, int64_t m)
{
    if (!kv || !k || !v || !slot || m < 0 || kv->block_size < 1 ||
        kv->n_kv_heads < 1 || kv->head_dim < 1 || kv->n_blocks < 0 ||
        !kv->k || !kv->v)
        return DSQ_EINVAL;
    if (kv->dtype == DSQ_KV_INT8 &&
        (!kv->k_scale || !kv->k_zero || !kv->v_scale || !kv->v_zero))
        return DSQ_EINVAL;
    if (kv->dtype != DSQ_KV_F16 && kv->dtype != DSQ_KV_INT8 && kv->dtype != DSQ_KV_F32)
        return DSQ_EINVAL;
    const int64_t n_slots = kv->n_blocks * kv->block_size;
    for (int64_t i = 0; i < m; i++)
        if (slot[i] < 0 || slot[i] >= n_slots)
            return DSQ_ERANGE;

    const int row = kv->n_kv_heads * kv->head_dim;
    const int n_groups = dsq_kv_n_groups(kv->head_dim);
    void (*cvt)(uint16_t *, const float *, int) = f2h_row_scalar;
#ifdef KV_X86
    if (dsq__cpu_isa_level() >= DSQ__ISA_AVX2)
        cvt = f2h_row_f16c;
#endif

    struct kvw_ctx c = {kv, k, v, slot, row, n_groups, cvt};
    dsq__parallel_for(m, 32768 / row + 1, kvw_rows, &c);
    return DSQ_OK;
}
