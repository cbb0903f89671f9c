/* libFuzzer target for engine/io/safetensors.c: parse arbitrary bytes as a
 * safetensors file and touch the first and last byte of every tensor. */
#include <stddef.h>
#include <stdint.h>

#include "engine/io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    dsq_safetensors_t *s = dsq_safetensors_open_buffer(data, size, "fuzz", err,
                                                       sizeof(err));
    if (!s)
        return 0;
    volatile uint64_t sink = 0;
    for (int i = 0; i < dsq_safetensors_n_tensors(s); i++) {
        const dsq_tensor_t *t = dsq_safetensors_tensor(s, i);
        if (t->n_bytes)
            sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->n_bytes - 1];
        sink += (dsq_safetensors_find(s, t->name) == t);
    }
    (void)sink;
    dsq_safetensors_close(s);
    return 0;
}
