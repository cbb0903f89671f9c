/* AVX-512 (F/BW/VL + VNNI) tile kernels for dsq_cpu_matmul: the AVX2
 * kernels' structure on 256-bit vectors, with vpdpbusd doing the u8 x s8
 * dot product into int32 in one instruction (no int16 intermediate). The
 * 256-bit width avoids the AVX-512 frequency penalty on older Xeons and
 * keeps one chunk of 32 weights per vector. */
#include "cpu_internal.h"

#if defined(__x86_64__)
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#include <immintrin.h>

static inline __attribute__((always_inline)) __m256i dot_u8s8_vnni(__m256i a, __m256i b)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
}

#define DOT_U8S8(a, b) dot_u8s8_vnni((a), (b))
#define TAB_FN dsq__mm_avx512
#include "matmul_x86.inc"

#else
void dsq__mm_avx512(dsq__mm_tile_fn tab[6]) { (void)tab; }
#endif
