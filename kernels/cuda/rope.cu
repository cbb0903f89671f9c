// CUDA twin of kernels/cpu/rope.c. The frequency table comes from
// dsq_rope_inv_freq's fp64 formula on the host (one source of truth for the
// YaRN mix) and travels as a kernel parameter; angles are formed in fp64
// like on the CPU, so large positions keep their precision. One thread per
// (row, head, pair); x in the step's activation type, rotated in fp32.
#include <math.h>
#include <stdlib.h>

#include "cuda_internal.cuh"

#define ROPE_MAX_HALF 256

struct rope_tab {
    double inv[ROPE_MAX_HALF];
};

template <typename T>
static __global__ void rope_kernel(T *x, int64_t total, int n_heads,
                                   int head_dim, int half, bool neox,
                                   float mscale, const int32_t *pos,
                                   rope_tab tab)
{
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(t % half);
        const int64_t rh = t / half;            // row * n_heads + head
        const int64_t r = rh / n_heads;
        T *v = x + rh * head_dim;
        double s, c;
        sincos((double)pos[r] * tab.inv[i], &s, &c);
        const float cf = (float)(c * mscale), sf = (float)(s * mscale);
        T *a = neox ? v + i : v + 2 * i;
        T *b = neox ? a + half : a + 1;
        const float x0 = dsq__ld(a, 0), x1 = dsq__ld(b, 0);
        dsq__st(a, 0, x0 * cf - x1 * sf);
        dsq__st(b, 0, x0 * sf + x1 * cf);
    }
}

extern "C" int dsq_cuda_rope(void *x, dsq_ftype_t t, int64_t m, int n_heads, int head_dim,
                             const int32_t *pos, const dsq_rope_t *p)
{
    if (!x || !dsq__ft_ok(t) || !pos || !p || m < 0 || n_heads < 1 || p->rot_dim <= 0 ||
        p->rot_dim % 2 || p->rot_dim > head_dim || p->rot_dim / 2 > ROPE_MAX_HALF)
        return DSQ_EINVAL;
    if (m == 0)
        return DSQ_OK;
    rope_tab tab;
    const int half = p->rot_dim / 2;
    dsq_rope_inv_freq(p, tab.inv);
    const float mscale = p->attn_factor != 0.0f ? p->attn_factor : 1.0f;
    const int64_t total = m * n_heads * half;
    DSQ__FT_DISPATCH(t, T, rope_kernel<T><<<dsq__cuda_grid(total, 128), 128, 0,
                                            dsq__cuda_stream()>>>(
                               (T *)x, total, n_heads, head_dim, half, p->neox, mscale, pos,
                               tab));
    return dsq__cuda_launched("rope");
}
