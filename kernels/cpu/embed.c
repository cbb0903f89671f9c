/* dsq_cpu_embed: token embedding lookup = gather rows of the embedding
 * matrix and dequantise them with each format's reference formula
 * (dsq_weight_dequant_row), so the embedding and a tied lm_head read the
 * same weights. Rows are independent: the thread pool splits the ids when
 * there are many. */
#include "kernels.h"

#include <stdatomic.h>

#include "cpu_internal.h"
#include "engine/common/error.h"

struct embed_ctx {
    float *out;
    const dsq_weight_t *emb;
    const int32_t *ids;
    _Atomic int bad;
};

static void embed_range(void *p, int64_t i0, int64_t i1)
{
    struct embed_ctx *c = p;
    for (int64_t i = i0; i < i1; i++)
        if (dsq_weight_dequant_row(c->emb, c->ids[i], c->out + i * c->emb->k) != DSQ_OK)
            atomic_store(&c->bad, 1);
}

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
    struct embed_ctx c = {.out = out, .emb = emb, .ids = ids};
    atomic_init(&c.bad, 0);
    dsq__parallel_for(m, 32, embed_range, &c);
    return atomic_load(&c.bad) ? DSQ_EINVAL : DSQ_OK;
}
