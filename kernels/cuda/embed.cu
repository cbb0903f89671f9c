// CUDA twin of kernels/cpu/embed.c: out[i][:] = row ids[i] of the embedding
// matrix, dequantised by the format's formula (any dsq_wformat_t). One block
// per row, threads along k. ids live on the device: an id outside [0, n)
// gives a row of zeros (the CPU op returns DSQ_ERANGE; see kernels.h).
#include "cuda_internal.cuh"

static __global__ void embed_kernel(float *out, dsq_weight_t emb, const int32_t *ids)
{
    const int64_t i = blockIdx.x, k = emb.k;
    const int32_t id = ids[i];
    const bool ok = id >= 0 && id < emb.n;
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x)
        out[i * k + j] = ok ? dsq__weight_at(emb, id, j) : 0.0f;
}

extern "C" int dsq_cuda_embed(float *out, const dsq_weight_t *emb, const int32_t *ids,
                              int64_t m)
{
    if (!out || !ids || m < 0 || m > 0x7fffffff || !dsq__cuda_weight_ok(emb))
        return DSQ_EINVAL;
    if (m == 0)
        return DSQ_OK;
    embed_kernel<<<(unsigned)m, 256, 0, dsq__cuda_stream()>>>(out, *emb, ids);
    return dsq__cuda_launched("embed");
}
