/* dsq_cpu_embed: token embedding lookup = gather rows of the embedding
 * matrix and dequantise them with each format's reference formula
 * (dsq_weight_dequant_row), so the embedding and a tied lm_head read the
 * same weights. Rows are independent: OpenMP over ids when there are many. */
#include "kernels.h"

#include "error.h"

int dsq_cpu_embed(float *out, const dsq_weight_t *emb, const int32_t *ids, int64_t m)
{
    if (!out || !emb || (!ids && m > 0) || m < 0 || emb->k <= 0)
        return DSQ_EINVAL;
    int rc = DSQ_OK;
    for (int64_t i = 0; i < m; i++)
        if (ids[i] < 0 || ids[i] >= emb->n)
            rc = DSQ_ERANGE;
    if (rc != DSQ_OK)
        return rc;
    int bad = 0;
    const int nthr = dsq_cpu_get_threads();
#pragma omp parallel for num_threads(nthr) if (m >= 64 && nthr > 1) reduction(|:bad)
    for (int64_t i = 0; i < m; i++)
        bad |= dsq_weight_dequant_row(emb, ids[i], out + i * emb->k) != DSQ_OK;
    return bad ? DSQ_EINVAL : DSQ_OK;
}
