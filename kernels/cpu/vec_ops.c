/* Small fp32 vector helpers shared by the attention kernels (MHA/GQA in
 * attention.c, MLA in mla_attention.c): dot product, axpy, and the two KV
 * element decoders (fp16, int8 with scale and offset). One scalar, one
 * AVX2/FMA/F16C and one AArch64 NEON version each; dsq__vec_ops() picks by
 * the ISA level in force at the call (so dsq_cpu_force_isa reaches them
 * too). */
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define VEC_X86 1
#elif defined(__aarch64__)
#include <arm_neon.h>
#define VEC_NEON 1
#endif

#include "cpu_internal.h"

/* ---------------------------------------------------------------- scalar */

static float dot_scalar(const float *a, const float *b, int n)
{
    float acc[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int l = 0; l < 4; l++)
            acc[l] += a[i + l] * b[i + l];
    for (; i < n; i++)
        acc[0] += a[i] * b[i];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

static void axpy_scalar(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++)
        y[i] += a * x[i];
}

static void f16_scalar(float *dst, const uint16_t *src, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] = dsq__h2f(src[i]);
}

/* v = (q - z) * s = q * s + c with c = -z * s */
static void i8_scalar(float *dst, const int8_t *q, float s, float c, int n)
{
    for (int i = 0; i < n; i++)
        dst[i] = (float)q[i] * s + c;
}

/* ------------------------------------------------------------------ AVX2 */

#ifdef VEC_X86
#define VEC_TARGET __attribute__((target("avx2,fma,f16c")))

VEC_TARGET static float hsum256(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

VEC_TARGET static float dot_avx2(const float *a, const float *b, int n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float r = hsum256(_mm256_add_ps(s0, s1));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

VEC_TARGET static void axpy_avx2(float *y, float a, const float *x, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i),
                                                _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

VEC_TARGET static void f16_avx2(float *dst, const uint16_t *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)(const void *)(src + i))));
    for (; i < n; i++)
        dst[i] = dsq__h2f(src[i]);
}

VEC_TARGET static void i8_avx2(float *dst, const int8_t *q, float s, float c, int n)
{
    __m256 vs = _mm256_set1_ps(s), vc = _mm256_set1_ps(c);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(q + i));
        __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        _mm256_storeu_ps(dst + i, _mm256_fmadd_ps(f, vs, vc));
    }
    for (; i < n; i++)
        dst[i] = (float)q[i] * s + c;
}
#endif

/* ------------------------------------------------------------------ NEON */

#ifdef VEC_NEON
static float dot_neon(const float *a, const float *b, int n)
{
    float32x4_t s0 = vdupq_n_f32(0.0f), s1 = s0, s2 = s0, s3 = s0;
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4)
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    float r = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

static void axpy_neon(float *y, float a, const float *x, int n)
{
    int i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), a));
    for (; i < n; i++)
        y[i] += a * x[i];
}

static void f16_neon(float *dst, const uint16_t *src, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src + i));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i++)
        dst[i] = dsq__h2f(src[i]);
}

static void i8_neon(float *dst, const int8_t *q, float s, float c, int n)
{
    const float32x4_t vc = vdupq_n_f32(c);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        int16x8_t w = vmovl_s8(vld1_s8(q + i));
        float32x4_t lo = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
        float32x4_t hi = vcvtq_f32_s32(vmovl_high_s16(w));
        vst1q_f32(dst + i, vfmaq_n_f32(vc, lo, s));
        vst1q_f32(dst + i + 4, vfmaq_n_f32(vc, hi, s));
    }
    for (; i < n; i++)
        dst[i] = (float)q[i] * s + c;
}
#endif

const dsq__vec_ops_t *dsq__vec_ops(void)
{
    static const dsq__vec_ops_t scalar = {dot_scalar, axpy_scalar, f16_scalar, i8_scalar};
#ifdef VEC_X86
    static const dsq__vec_ops_t avx2 = {dot_avx2, axpy_avx2, f16_avx2, i8_avx2};
    if (dsq__cpu_isa_level() >= DSQ__ISA_AVX2)
        return &avx2;
#endif
#ifdef VEC_NEON
    static const dsq__vec_ops_t neon = {dot_neon, axpy_neon, f16_neon, i8_neon};
    if (dsq__cpu_isa_level() >= DSQ__ISA_NEON)
        return &neon;
#endif
    return &scalar;
}
