/* Tensor type table, byte-size arithmetic and fp16/bf16 conversions.
 *
 * One static table indexed by dsq_type_t keeps names, block sizes and block
 * byte counts together (values from the GGML block structs described in the
 * GGUF spec), so every loader computes sizes the same way. Byte sizes are
 * computed with explicit overflow checks because the element counts come from
 * untrusted files. The float conversions are bit-exact IEEE 754 with
 * round-to-nearest-even, written out so results do not depend on compiler
 * flags or on F16C being present.
 */
#include "tensor.h"
#include "engine/common/error.h"

#include <stdlib.h>
#include <string.h>

typedef struct type_info {
    const char *name;
    int block_elems;
    size_t block_bytes;
} type_info_t;

static const type_info_t type_table[DSQ_TYPE_COUNT_] = {
    [DSQ_TYPE_F32]  = {"F32", 1, 4},
    [DSQ_TYPE_F16]  = {"F16", 1, 2},
    [DSQ_TYPE_Q4_0] = {"Q4_0", 32, 2 + 16},
    [DSQ_TYPE_Q4_1] = {"Q4_1", 32, 2 + 2 + 16},
    [DSQ_TYPE_Q5_0] = {"Q5_0", 32, 2 + 4 + 16},
    [DSQ_TYPE_Q5_1] = {"Q5_1", 32, 2 + 2 + 4 + 16},
    [DSQ_TYPE_Q8_0] = {"Q8_0", 32, 2 + 32},
    [DSQ_TYPE_Q8_1] = {"Q8_1", 32, 2 + 2 + 32},
    [DSQ_TYPE_Q2_K] = {"Q2_K", 256, 16 + 64 + 2 + 2},
    [DSQ_TYPE_Q3_K] = {"Q3_K", 256, 32 + 64 + 12 + 2},
    [DSQ_TYPE_Q4_K] = {"Q4_K", 256, 2 + 2 + 12 + 128},
    [DSQ_TYPE_Q5_K] = {"Q5_K", 256, 2 + 2 + 12 + 32 + 128},
    [DSQ_TYPE_Q6_K] = {"Q6_K", 256, 128 + 64 + 16 + 2},
    [DSQ_TYPE_Q8_K] = {"Q8_K", 256, 4 + 256 + 32},
    /* sizes of the IQ / TQ / MXFP4 blocks (ggml-common.h), so files holding
     * them parse and the loader can name the type it refuses */
    [DSQ_TYPE_IQ2_XXS] = {"IQ2_XXS", 256, 2 + 64},
    [DSQ_TYPE_IQ2_XS] = {"IQ2_XS", 256, 2 + 64 + 8},
    [DSQ_TYPE_IQ3_XXS] = {"IQ3_XXS", 256, 2 + 96},
    [DSQ_TYPE_IQ1_S] = {"IQ1_S", 256, 2 + 32 + 16},
    [DSQ_TYPE_IQ4_NL] = {"IQ4_NL", 32, 2 + 16},
    [DSQ_TYPE_IQ3_S] = {"IQ3_S", 256, 2 + 64 + 8 + 32 + 4},
    [DSQ_TYPE_IQ2_S] = {"IQ2_S", 256, 2 + 64 + 8 + 8},
    [DSQ_TYPE_IQ4_XS] = {"IQ4_XS", 256, 2 + 2 + 4 + 128},
    [DSQ_TYPE_IQ1_M] = {"IQ1_M", 256, 32 + 16 + 8},
    [DSQ_TYPE_TQ1_0] = {"TQ1_0", 256, 48 + 4 + 2},
    [DSQ_TYPE_TQ2_0] = {"TQ2_0", 256, 64 + 2},
    [DSQ_TYPE_MXFP4] = {"MXFP4", 32, 1 + 16},
    [DSQ_TYPE_I8]   = {"I8", 1, 1},
    [DSQ_TYPE_I16]  = {"I16", 1, 2},
    [DSQ_TYPE_I32]  = {"I32", 1, 4},
    [DSQ_TYPE_I64]  = {"I64", 1, 8},
    [DSQ_TYPE_F64]  = {"F64", 1, 8},
    [DSQ_TYPE_BF16] = {"BF16", 1, 2},
    [DSQ_TYPE_U8]   = {"U8", 1, 1},
};

static const type_info_t *type_info(dsq_type_t type)
{
    if ((int)type < 0 || (int)type >= DSQ_TYPE_COUNT_)
        return NULL;
    const type_info_t *t = &type_table[type];
    return t->name ? t : NULL;
}

const char *dsq_type_name(dsq_type_t type)
{
    const type_info_t *t = type_info(type);
    return t ? t->name : "?";
}

int dsq_type_block_elems(dsq_type_t type)
{
    const type_info_t *t = type_info(type);
    return t ? t->block_elems : 0;
}

size_t dsq_type_block_bytes(dsq_type_t type)
{
    const type_info_t *t = type_info(type);
    return t ? t->block_bytes : 0;
}

int dsq_type_bytes(dsq_type_t type, int64_t n_elems, size_t *out)
{
    int rc = DSQ_OK;
    const type_info_t *t = type_info(type);
    if (!t || !out || n_elems < 0 || n_elems % t->block_elems != 0) {
        rc = DSQ_EINVAL;
    } else {
        uint64_t n_blocks = (uint64_t)n_elems / (uint64_t)t->block_elems;
        size_t bytes;
        if (__builtin_mul_overflow(n_blocks, t->block_bytes, &bytes))
            rc = DSQ_ERANGE;
        else
            *out = bytes;
    }
    return rc;
}

/* data pointer order; ties by position in the caller's array */
static int cmp_data(const void *a, const void *b)
{
    const dsq_tensor_t *x = *(const dsq_tensor_t *const *)a;
    const dsq_tensor_t *y = *(const dsq_tensor_t *const *)b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    if (px != py)
        return px < py ? -1 : 1;
    return x < y ? -1 : x > y;
}

int dsq_tensor_find_overlap(const dsq_tensor_t *t, int n,
                            const dsq_tensor_t **first,
                            const dsq_tensor_t **second)
{
    int rc = DSQ_OK, m = 0;
    const dsq_tensor_t **by_data = malloc((n > 0 ? (size_t)n : 1) * sizeof(*by_data));
    if (!by_data)
        return DSQ_ENOMEM;
    for (int i = 0; i < n; i++)
        if (t[i].n_bytes > 0)
            by_data[m++] = &t[i];
    qsort(by_data, (size_t)m, sizeof(*by_data), cmp_data);
    /* sorted by start, two ranges overlap only if some neighbours do: if
     * i and k > i overlap, i + 1 starts no later than k, so inside i */
    for (int i = 0; i + 1 < m && rc == DSQ_OK; i++) {
        uintptr_t end = (uintptr_t)by_data[i]->data + by_data[i]->n_bytes;
        if (end > (uintptr_t)by_data[i + 1]->data) {
            *first = by_data[i];
            *second = by_data[i + 1];
            rc = DSQ_EFORMAT;
        }
    }
    free(by_data);
    return rc;
}

float dsq_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {                      /* inf / nan */
        bits = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {                  /* normal */
        bits = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {                 /* signed zero */
        bits = sign;
    } else {                                /* subnormal: normalise */
        uint32_t e = 113;                   /* 127 - 15 + 1 */
        while ((mant & 0x400u) == 0) {
            mant <<= 1;
            e--;
        }
        bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

uint16_t dsq_fp32_to_fp16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    uint32_t h;
    if (absx > 0x7f800000u) {               /* nan: keep it quiet and non-zero */
        h = 0x7c00u | 0x200u | ((absx >> 13) & 0x3ffu);
    } else if (absx >= 0x477ff000u) {       /* >= 65520 rounds to inf (or is inf) */
        h = 0x7c00u;
    } else if (absx >= 0x38800000u) {       /* normal half (>= 2^-14) */
        h = (absx - 0x38000000u) >> 13;     /* rebias exponent 127 -> 15 */
        uint32_t rem = absx & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++;                            /* carry may roll into exponent: fine */
    } else {                                /* half subnormal or zero */
        uint32_t e = absx >> 23;
        if (e < 102) {                      /* < 2^-25: rounds to zero */
            h = 0;
        } else {
            uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
            uint32_t shift = 126u - e;      /* 14..24 */
            h = mant >> shift;
            uint32_t rem = mant & ((1u << shift) - 1u);
            uint32_t half = 1u << (shift - 1u);
            if (rem > half || (rem == half && (h & 1u)))
                h++;
        }
    }
    return (uint16_t)(sign | h);
}

float dsq_bf16_to_fp32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

uint16_t dsq_fp32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint16_t r;
    if ((x & 0x7fffffffu) > 0x7f800000u)    /* nan: force quiet */
        r = (uint16_t)((x >> 16) | 0x40u);
    else
        r = (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
    return r;
}
