/* AVX2 + FMA + F16C tile kernels for dsq_cpu_matmul. Compiled for that
 * target by the pragma below so the rest of the build stays portable; only
 * called after CPUID says the CPU has it (kernels/cpu/cpu.c). The u8 x s8
 * dot product is maddubs (pairs to int16, cannot saturate: 2*15*127 and
 * 2*128*127 < 32768) then madd with ones to int32. */
#include "cpu_internal.h"

#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

static inline __attribute__((always_inline)) __m256i dot_u8s8_avx2(__m256i a, __m256i b)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
}

#define DOT_U8S8(a, b) dot_u8s8_avx2((a), (b))
#define TAB_FN dsq__mm_avx2
#include "matmul_x86.inc"

#else
void dsq__mm_avx2(dsq__mm_tile_fn tab[DSQ__MM_SLOTS]) { (void)tab; }
#endif
