/* Which graph serves which architecture: the one place that names them.
 * A new architecture is a file defining its dsq_model_arch_t
 * (model_internal.h) and a row here. The config readers (engine/io)
 * refuse architectures without a graph, so only a hand-made config can
 * miss every row; it gets the first row, whose create refuses it by
 * name and whose config queries (KV shape, tensors for the planner)
 * treat it as llama, the plain transformer. */
#include "model_internal.h"

static const struct {
    dsq_arch_t arch;
    const dsq_model_arch_t *graph;
} rows[] = {
    {DSQ_ARCH_LLAMA, &dsq__model_arch_llama},
    {DSQ_ARCH_QWEN2, &dsq__model_arch_llama},       /* llama + q/k/v biases */
    {DSQ_ARCH_DEEPSEEK2, &dsq__model_arch_deepseek2},
};

const dsq_model_arch_t *dsq__model_arch_find(dsq_arch_t arch)
{
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
        if (rows[i].arch == arch)
            return rows[i].graph;
    return rows[0].graph;
}
