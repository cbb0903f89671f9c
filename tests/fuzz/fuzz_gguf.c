/* libFuzzer target for engine/io/gguf.c: parse arbitrary bytes as GGUF and, if
 * they parse, touch every metadata value and tensor the way loaders do, so
 * ASan sees any read the validation let through. Seeds: the real GGUFs
 * (tests/fuzz/run and the meson `fuzz` suite pass them in). */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/io/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    dsq_gguf_t *g = dsq_gguf_open_buffer(data, size, "fuzz", err, sizeof(err));
    if (!g)
        return 0;
    volatile uint64_t sink = 0;
    for (int i = 0; i < dsq_gguf_n_kv(g); i++) {
        const char *k = dsq_gguf_key(g, i);
        size_t len = 0;
        sink += (uint64_t)dsq_gguf_get_int(g, k, 0);
        double dv = dsq_gguf_get_float(g, k, 0.0);
        sink += (dv > -1e18 && dv < 1e18) ? (uint64_t)(int64_t)dv : 1u;
        const char *s = dsq_gguf_get_str(g, k, &len);
        if (s && len)
            sink += (uint8_t)s[len - 1];
        dsq_gguf_vtype_t et;
        int64_t n = dsq_gguf_arr_n(g, k, &et);
        for (int64_t j = 0; j < n && j < 64; j++) {
            s = dsq_gguf_arr_str(g, k, j, &len);
            if (s && len)
                sink += (uint8_t)s[len - 1];
        }
        const uint8_t *a = dsq_gguf_arr_data(g, k);
        if (a && n > 0)
            sink += a[0];
    }
    for (int i = 0; i < dsq_gguf_n_tensors(g); i++) {
        const dsq_tensor_t *t = dsq_gguf_tensor(g, i);
        if (t->n_bytes)
            sink += ((const uint8_t *)t->data)[0] + ((const uint8_t *)t->data)[t->n_bytes - 1];
        sink += (dsq_gguf_find_tensor(g, t->name) == t);
    }
    (void)sink;
    dsq_gguf_close(g);
    return 0;
}
