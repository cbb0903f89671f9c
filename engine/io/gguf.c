/* GGUF v2/v3 reader.
 *
 * Format: ggml repository docs/gguf.md. The whole file is mmapped read-only
 * and parsed once, front to back, with a bounds-checked cursor; afterwards
 * every metadata value and tensor is a view into the mapping. Only the key
 * and tensor names are copied (they need a NUL), plus an offset table per
 * string array so dsq_gguf_arr_str() is O(1) (the tokenizer reads 100k+
 * strings). Every count read from the file is bounded by the bytes that are
 * left before anything is allocated for it, so a hostile count can never
 * trigger a huge allocation. Keys and tensors are also indexed by name
 * (sorted pointer arrays), which is how duplicates are found.
 */
#include "gguf.h"
#include "engine/common/error.h"
#include "mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NEST 8

typedef struct gguf_kv {
    char *key;
    dsq_gguf_vtype_t type;
    const uint8_t *val;          /* scalar payload / string bytes / first elem */
    uint64_t str_len;            /* DSQ_GGUF_STRING */
    dsq_gguf_vtype_t elem_type;  /* DSQ_GGUF_ARRAY */
    uint64_t n;                  /* DSQ_GGUF_ARRAY element count */
    uint64_t *str_off;           /* string arrays: offset of each length field */
} gguf_kv_t;

struct dsq_gguf {
    char *path;
    const uint8_t *base;
    size_t size;
    bool mapped;                 /* base came from mmap (else caller buffer) */
    uint32_t version;
    size_t alignment;
    size_t data_offset;
    int n_kv;
    gguf_kv_t *kv;
    gguf_kv_t **kv_sorted;
    int n_tensors;
    dsq_tensor_t *tensors;
    const dsq_tensor_t **t_sorted;
};

typedef struct cursor {
    const uint8_t *base;
    size_t size;
    size_t pos;
} cursor_t;

static size_t remaining(const cursor_t *c)
{
    return c->size - c->pos;
}

static int rd_u32(cursor_t *c, uint32_t *v)
{
    if (remaining(c) < 4)
        return DSQ_EFORMAT;
    memcpy(v, c->base + c->pos, 4);
    c->pos += 4;
    return DSQ_OK;
}

static int rd_u64(cursor_t *c, uint64_t *v)
{
    if (remaining(c) < 8)
        return DSQ_EFORMAT;
    memcpy(v, c->base + c->pos, 8);
    c->pos += 8;
    return DSQ_OK;
}

/* GGUF string: u64 length + bytes. *s points into the mapping. */
static int rd_str(cursor_t *c, const uint8_t **s, uint64_t *len)
{
    if (rd_u64(c, len) != DSQ_OK || *len > remaining(c))
        return DSQ_EFORMAT;
    *s = c->base + c->pos;
    c->pos += (size_t)*len;
    return DSQ_OK;
}

/* Size of a fixed-size scalar type; 0 for string/array/unknown. */
static size_t scalar_size(uint32_t t)
{
    switch (t) {
    case DSQ_GGUF_U8: case DSQ_GGUF_I8: case DSQ_GGUF_BOOL: return 1;
    case DSQ_GGUF_U16: case DSQ_GGUF_I16: return 2;
    case DSQ_GGUF_U32: case DSQ_GGUF_I32: case DSQ_GGUF_F32: return 4;
    case DSQ_GGUF_U64: case DSQ_GGUF_I64: case DSQ_GGUF_F64: return 8;
    default: return 0;
    }
}

static const char *vtype_name(uint32_t t)
{
    static const char *const names[] = {"u8", "i8", "u16", "i16", "u32",
        "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
    return t <= DSQ_GGUF_F64 ? names[t] : "?";
}

/* Skip one value of type t (recursing into nested arrays). */
static int skip_value(cursor_t *c, uint32_t t, int depth, const char **why)
{
    size_t sz = scalar_size(t);
    if (sz) {
        if (remaining(c) < sz) {
            *why = "truncated value";
            return DSQ_EFORMAT;
        }
        c->pos += sz;
        return DSQ_OK;
    }
    if (t == DSQ_GGUF_STRING) {
        const uint8_t *s;
        uint64_t len;
        if (rd_str(c, &s, &len) != DSQ_OK) {
            *why = "string length past end of file";
            return DSQ_EFORMAT;
        }
        return DSQ_OK;
    }
    if (t != DSQ_GGUF_ARRAY) {
        *why = "unknown value type";
        return DSQ_EFORMAT;
    }
    if (depth >= GGUF_MAX_NEST) {
        *why = "arrays nested too deeply";
        return DSQ_EFORMAT;
    }
    uint32_t et;
    uint64_t n;
    if (rd_u32(c, &et) != DSQ_OK || rd_u64(c, &n) != DSQ_OK) {
        *why = "truncated array header";
        return DSQ_EFORMAT;
    }
    size_t esz = scalar_size(et);
    if (esz) {
        if (n > remaining(c) / esz) {
            *why = "array length past end of file";
            return DSQ_EFORMAT;
        }
        c->pos += (size_t)n * esz;
        return DSQ_OK;
    }
    if (et != DSQ_GGUF_STRING && et != DSQ_GGUF_ARRAY) {
        *why = "unknown array element type";
        return DSQ_EFORMAT;
    }
    /* strings need >= 8 bytes each, arrays >= 12 */
    if (n > remaining(c) / 8) {
        *why = "array length past end of file";
        return DSQ_EFORMAT;
    }
    for (uint64_t i = 0; i < n; i++) {
        int rc = skip_value(c, et, depth + 1, why);
        if (rc != DSQ_OK)
            return rc;
    }
    return DSQ_OK;
}

static int cmp_kv(const void *a, const void *b)
{
    const gguf_kv_t *x = *(const gguf_kv_t *const *)a;
    const gguf_kv_t *y = *(const gguf_kv_t *const *)b;
    return strcmp(x->key, y->key);
}

static int cmp_tensor(const void *a, const void *b)
{
    const dsq_tensor_t *x = *(const dsq_tensor_t *const *)a;
    const dsq_tensor_t *y = *(const dsq_tensor_t *const *)b;
    return strcmp(x->name, y->name);
}

/* Copy a file string into a NUL-terminated heap string; rejects embedded
 * NULs (they would make name lookups ambiguous). */
static char *dup_name(const uint8_t *s, uint64_t len)
{
    if (memchr(s, 0, (size_t)len))
        return NULL;
    char *r = malloc((size_t)len + 1);
    if (r) {
        memcpy(r, s, (size_t)len);
        r[len] = '\0';
    }
    return r;
}

static int parse_kv(dsq_gguf_t *g, cursor_t *c, char *err, size_t err_len)
{
    const char *p = g->path;
    for (int i = 0; i < g->n_kv; i++) {
        gguf_kv_t *kv = &g->kv[i];
        const uint8_t *ks;
        uint64_t klen;
        uint32_t t;
        if (rd_str(c, &ks, &klen) != DSQ_OK) {
            dsq_error_set(err, err_len, "%s: metadata key %d: truncated or length past end of file", p, i);
            return DSQ_EFORMAT;
        }
        kv->key = dup_name(ks, klen);
        if (!kv->key) {
            dsq_error_set(err, err_len, "%s: metadata key %d: embedded NUL or out of memory", p, i);
            return DSQ_EFORMAT;
        }
        if (rd_u32(c, &t) != DSQ_OK) {
            dsq_error_set(err, err_len, "%s: metadata '%s': truncated value type", p, kv->key);
            return DSQ_EFORMAT;
        }
        if (t > DSQ_GGUF_F64) {
            dsq_error_set(err, err_len, "%s: metadata '%s': unknown value type %u", p, kv->key, t);
            return DSQ_EFORMAT;
        }
        kv->type = (dsq_gguf_vtype_t)t;
        const char *why = NULL;
        if (t == DSQ_GGUF_STRING) {
            if (rd_str(c, &kv->val, &kv->str_len) != DSQ_OK) {
                dsq_error_set(err, err_len, "%s: metadata '%s': string length past end of file", p, kv->key);
                return DSQ_EFORMAT;
            }
        } else if (t == DSQ_GGUF_ARRAY) {
            uint32_t et;
            if (rd_u32(c, &et) != DSQ_OK || rd_u64(c, &kv->n) != DSQ_OK) {
                dsq_error_set(err, err_len, "%s: metadata '%s': truncated array header", p, kv->key);
                return DSQ_EFORMAT;
            }
            if (et > DSQ_GGUF_F64) {
                dsq_error_set(err, err_len, "%s: metadata '%s': unknown array element type %u", p, kv->key, et);
                return DSQ_EFORMAT;
            }
            kv->elem_type = (dsq_gguf_vtype_t)et;
            kv->val = c->base + c->pos;
            size_t esz = scalar_size(et);
            if (esz) {
                if (kv->n > remaining(c) / esz) {
                    dsq_error_set(err, err_len, "%s: metadata '%s': array of %llu %s past end of file",
                            p, kv->key, (unsigned long long)kv->n, vtype_name(et));
                    return DSQ_EFORMAT;
                }
                c->pos += (size_t)kv->n * esz;
            } else {
                if (kv->n > remaining(c) / 8) {
                    dsq_error_set(err, err_len, "%s: metadata '%s': array of %llu %s past end of file",
                            p, kv->key, (unsigned long long)kv->n, vtype_name(et));
                    return DSQ_EFORMAT;
                }
                if (et == DSQ_GGUF_STRING && kv->n > 0) {
                    kv->str_off = malloc((size_t)kv->n * sizeof(*kv->str_off));
                    if (!kv->str_off) {
                        dsq_error_set(err, err_len, "%s: metadata '%s': out of memory", p, kv->key);
                        return DSQ_ENOMEM;
                    }
                }
                for (uint64_t j = 0; j < kv->n; j++) {
                    if (kv->str_off)
                        kv->str_off[j] = c->pos;
                    if (skip_value(c, et, 1, &why) != DSQ_OK) {
                        dsq_error_set(err, err_len, "%s: metadata '%s': element %llu: %s",
                                p, kv->key, (unsigned long long)j, why);
                        return DSQ_EFORMAT;
                    }
                }
            }
        } else {
            kv->val = c->base + c->pos;
            if (skip_value(c, t, 0, &why) != DSQ_OK) {
                dsq_error_set(err, err_len, "%s: metadata '%s': %s", p, kv->key, why);
                return DSQ_EFORMAT;
            }
        }
    }
    return DSQ_OK;
}

static int parse_tensor_infos(dsq_gguf_t *g, cursor_t *c, char *err,
                              size_t err_len)
{
    const char *p = g->path;
    for (int i = 0; i < g->n_tensors; i++) {
        dsq_tensor_t *t = &g->tensors[i];
        const uint8_t *ns;
        uint64_t nlen;
        uint32_t n_dims, type;
        if (rd_str(c, &ns, &nlen) != DSQ_OK) {
            dsq_error_set(err, err_len, "%s: tensor %d: name truncated or length past end of file", p, i);
            return DSQ_EFORMAT;
        }
        char *name = dup_name(ns, nlen);
        if (!name) {
            dsq_error_set(err, err_len, "%s: tensor %d: embedded NUL in name or out of memory", p, i);
            return DSQ_EFORMAT;
        }
        t->name = name;
        if (rd_u32(c, &n_dims) != DSQ_OK) {
            dsq_error_set(err, err_len, "%s: tensor '%s': truncated n_dims", p, name);
            return DSQ_EFORMAT;
        }
        if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
            dsq_error_set(err, err_len, "%s: tensor '%s': n_dims %u not in 1..%d", p, name, n_dims, GGUF_MAX_DIMS);
            return DSQ_EFORMAT;
        }
        t->n_dims = (int)n_dims;
        int64_t n_elems = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++)
            t->ne[d] = 1;
        for (uint32_t d = 0; d < n_dims; d++) {
            uint64_t ne;
            if (rd_u64(c, &ne) != DSQ_OK) {
                dsq_error_set(err, err_len, "%s: tensor '%s': truncated shape", p, name);
                return DSQ_EFORMAT;
            }
            if (ne > (uint64_t)INT64_MAX
                || __builtin_mul_overflow(n_elems, (int64_t)ne, &n_elems)) {
                dsq_error_set(err, err_len, "%s: tensor '%s': element count overflows", p, name);
                return DSQ_ERANGE;
            }
            t->ne[d] = (int64_t)ne;
        }
        if (rd_u32(c, &type) != DSQ_OK) {
            dsq_error_set(err, err_len, "%s: tensor '%s': truncated type", p, name);
            return DSQ_EFORMAT;
        }
        int be = dsq_type_block_elems((dsq_type_t)type);
        if (be == 0 || type >= DSQ_TYPE_U8) {
            dsq_error_set(err, err_len, "%s: tensor '%s': unknown or unsupported type %u", p, name, type);
            return DSQ_EUNSUPPORTED;
        }
        t->type = (dsq_type_t)type;
        if (t->ne[0] % be != 0) {
            dsq_error_set(err, err_len, "%s: tensor '%s': ne[0]=%lld not a multiple of the %s block size %d",
                    p, name, (long long)t->ne[0], dsq_type_name(t->type), be);
            return DSQ_EFORMAT;
        }
        int rc = dsq_type_bytes(t->type, n_elems, &t->n_bytes);
        if (rc != DSQ_OK) {
            dsq_error_set(err, err_len, "%s: tensor '%s': byte size overflows", p, name);
            return rc;
        }
        uint64_t off;
        if (rd_u64(c, &off) != DSQ_OK) {
            dsq_error_set(err, err_len, "%s: tensor '%s': truncated offset", p, name);
            return DSQ_EFORMAT;
        }
        /* stash the relative offset in data until the data section is known */
        t->data = (const void *)(uintptr_t)off;
        if (off > SIZE_MAX) {
            dsq_error_set(err, err_len, "%s: tensor '%s': offset too large", p, name);
            return DSQ_EFORMAT;
        }
    }
    return DSQ_OK;
}

static int read_alignment(dsq_gguf_t *g, char *err, size_t err_len)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int i = dsq_gguf_find_key(g, "general.alignment");
    if (i < 0)
        return DSQ_OK;
    const gguf_kv_t *kv = &g->kv[i];
    uint32_t a = 0;
    if (kv->type == DSQ_GGUF_U32) {
        memcpy(&a, kv->val, 4);
    } else if (kv->type == DSQ_GGUF_U64 || kv->type == DSQ_GGUF_I64) {
        uint64_t a64;
        memcpy(&a64, kv->val, 8);
        a = a64 > (1u << 30) ? 0 : (uint32_t)a64;
    } else if (kv->type == DSQ_GGUF_I32) {
        int32_t a32;
        memcpy(&a32, kv->val, 4);
        a = a32 > 0 ? (uint32_t)a32 : 0;
    }
    if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30)) {
        dsq_error_set(err, err_len, "%s: general.alignment: must be a power of two (u32), got %u (type %s)",
                g->path, a, vtype_name(kv->type));
        return DSQ_EFORMAT;
    }
    g->alignment = a;
    return DSQ_OK;
}

static int place_tensors(dsq_gguf_t *g, size_t info_end, char *err,
                         size_t err_len)
{
    size_t a = g->alignment;
    size_t data_off = (info_end + a - 1) / a * a;
    g->data_offset = data_off;
    if (g->n_tensors == 0)
        return DSQ_OK;
    if (data_off > g->size) {
        dsq_error_set(err, err_len, "%s: data section starts at %zu, past end of file (%zu bytes)",
                g->path, data_off, g->size);
        return DSQ_EFORMAT;
    }
    size_t data_size = g->size - data_off;
    for (int i = 0; i < g->n_tensors; i++) {
        dsq_tensor_t *t = &g->tensors[i];
        size_t off = (size_t)(uintptr_t)t->data;
        if (off % a != 0) {
            dsq_error_set(err, err_len, "%s: tensor '%s': offset %zu not aligned to %zu",
                    g->path, t->name, off, a);
            return DSQ_EFORMAT;
        }
        if (off > data_size || t->n_bytes > data_size - off) {
            dsq_error_set(err, err_len, "%s: tensor '%s': data [%zu, +%zu) past end of file (data section is %zu bytes)",
                    g->path, t->name, off, t->n_bytes, data_size);
            return DSQ_EFORMAT;
        }
        t->data = g->base + data_off + off;
    }
    /* ggml's reader wants each tensor at the running sum of the ones
     * before; we take any order and padding, but no byte in two tensors */
    const dsq_tensor_t *x, *y;
    int rc = dsq_tensor_find_overlap(g->tensors, g->n_tensors, &x, &y);
    if (rc == DSQ_EFORMAT)
        dsq_error_set(err, err_len, "%s: tensors '%s' [%zu, +%zu) and '%s' [%zu, +%zu) overlap",
                g->path, x->name, (size_t)((const uint8_t *)x->data - g->base - data_off),
                x->n_bytes, y->name, (size_t)((const uint8_t *)y->data - g->base - data_off),
                y->n_bytes);
    else if (rc != DSQ_OK)
        dsq_error_set(err, err_len, "%s: out of memory", g->path);
    return rc;
}

static int parse(dsq_gguf_t *g, char *err, size_t err_len)
{
    cursor_t c = {g->base, g->size, 0};
    const char *p = g->path;
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    int rc;

    if (rd_u32(&c, &magic) != DSQ_OK || memcmp(g->base, "GGUF", 4) != 0) {
        dsq_error_set(err, err_len, "%s: not a GGUF file (bad magic)", p);
        return DSQ_EFORMAT;
    }
    (void)magic;
    if (rd_u32(&c, &version) != DSQ_OK) {
        dsq_error_set(err, err_len, "%s: truncated header (version)", p);
        return DSQ_EFORMAT;
    }
    if (version != 2 && version != 3) {
        dsq_error_set(err, err_len, "%s: GGUF version %u not supported (need 2 or 3)", p, version);
        return DSQ_EUNSUPPORTED;
    }
    g->version = version;
    if (rd_u64(&c, &n_tensors) != DSQ_OK || rd_u64(&c, &n_kv) != DSQ_OK) {
        dsq_error_set(err, err_len, "%s: truncated header (tensor_count/kv_count)", p);
        return DSQ_EFORMAT;
    }
    /* a kv pair needs >= 8+4+1 bytes, a tensor info >= 8+4+8+4+8 */
    if (n_kv > remaining(&c) / 13 || n_kv > INT32_MAX) {
        dsq_error_set(err, err_len, "%s: kv_count %llu does not fit in the file", p, (unsigned long long)n_kv);
        return DSQ_EFORMAT;
    }
    if (n_tensors > remaining(&c) / 32 || n_tensors > INT32_MAX) {
        dsq_error_set(err, err_len, "%s: tensor_count %llu does not fit in the file", p,
                (unsigned long long)n_tensors);
        return DSQ_EFORMAT;
    }
    g->n_kv = (int)n_kv;
    g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof(*g->kv));
    g->kv_sorted = calloc(n_kv ? (size_t)n_kv : 1, sizeof(*g->kv_sorted));
    if (!g->kv || !g->kv_sorted) {
        dsq_error_set(err, err_len, "%s: out of memory", p);
        return DSQ_ENOMEM;
    }
    rc = parse_kv(g, &c, err, err_len);
    if (rc != DSQ_OK)
        return rc;
    for (int i = 0; i < g->n_kv; i++)
        g->kv_sorted[i] = &g->kv[i];
    qsort(g->kv_sorted, (size_t)g->n_kv, sizeof(*g->kv_sorted), cmp_kv);
    for (int i = 1; i < g->n_kv; i++) {
        if (strcmp(g->kv_sorted[i - 1]->key, g->kv_sorted[i]->key) == 0) {
            dsq_error_set(err, err_len, "%s: duplicate metadata key '%s'", p, g->kv_sorted[i]->key);
            return DSQ_EFORMAT;
        }
    }
    rc = read_alignment(g, err, err_len);
    if (rc != DSQ_OK)
        return rc;

    g->n_tensors = (int)n_tensors;
    g->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof(*g->tensors));
    g->t_sorted = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof(*g->t_sorted));
    if (!g->tensors || !g->t_sorted) {
        dsq_error_set(err, err_len, "%s: out of memory", p);
        return DSQ_ENOMEM;
    }
    /* names are set one by one; a failure leaves later names NULL */
    rc = parse_tensor_infos(g, &c, err, err_len);
    if (rc != DSQ_OK)
        return rc;
    for (int i = 0; i < g->n_tensors; i++)
        g->t_sorted[i] = &g->tensors[i];
    qsort(g->t_sorted, (size_t)g->n_tensors, sizeof(*g->t_sorted), cmp_tensor);
    for (int i = 1; i < g->n_tensors; i++) {
        if (strcmp(g->t_sorted[i - 1]->name, g->t_sorted[i]->name) == 0) {
            dsq_error_set(err, err_len, "%s: duplicate tensor name '%s'", p, g->t_sorted[i]->name);
            return DSQ_EFORMAT;
        }
    }
    return place_tensors(g, c.pos, err, err_len);
}

static void free_parts(dsq_gguf_t *g)
{
    if (g->kv) {
        for (int i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
            free(g->kv[i].str_off);
        }
    }
    if (g->tensors) {
        for (int i = 0; i < g->n_tensors; i++)
            free((char *)g->tensors[i].name);
    }
    free(g->kv);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->t_sorted);
    free(g->path);
}

void dsq_gguf_close(dsq_gguf_t *g)
{
    if (!g)
        return;
    if (g->mapped && g->base)
        munmap((void *)g->base, g->size);
    free_parts(g);
    free(g);
}

dsq_gguf_t *dsq_gguf_open_buffer(const void *buf, size_t size,
                                 const char *name, char *err, size_t err_len)
{
    dsq_gguf_t *g = calloc(1, sizeof(*g));
    if (!g) {
        dsq_error_set(err, err_len, "%s: out of memory", name ? name : "(buffer)");
        return NULL;
    }
    g->path = strdup(name ? name : "(buffer)");
    g->base = buf;
    g->size = size;
    if (!g->path) {
        dsq_error_set(err, err_len, "(buffer): out of memory");
        goto undo_g;
    }
    if (!buf || size < 4) {
        dsq_error_set(err, err_len, "%s: not a GGUF file (too short: %zu bytes)", g->path, size);
        goto undo_g;
    }
    if (parse(g, err, err_len) != DSQ_OK)
        goto undo_g;
    return g;
undo_g:
    dsq_gguf_close(g);
    return NULL;
}

dsq_gguf_t *dsq_gguf_open(const char *path, char *err, size_t err_len)
{
    void *map;
    size_t size;
    if (dsq__map_file(path, 4, "not a GGUF file (too short)", &map, &size, err,
                      err_len) != DSQ_OK)
        return NULL;
    dsq_gguf_t *g = dsq_gguf_open_buffer(map, size, path, err, err_len);
    if (g)
        g->mapped = true;
    else
        munmap(map, size);
    return g;
}

uint32_t dsq_gguf_version(const dsq_gguf_t *g) { return g->version; }
size_t dsq_gguf_alignment(const dsq_gguf_t *g) { return g->alignment; }
const char *dsq_gguf_path(const dsq_gguf_t *g) { return g->path; }
size_t dsq_gguf_data_offset(const dsq_gguf_t *g) { return g->data_offset; }
size_t dsq_gguf_file_size(const dsq_gguf_t *g) { return g->size; }
int dsq_gguf_n_kv(const dsq_gguf_t *g) { return g->n_kv; }

int dsq_gguf_find_key(const dsq_gguf_t *g, const char *key)
{
    if (!g || !key || g->n_kv == 0)
        return -1;
    gguf_kv_t probe = {.key = (char *)key};
    gguf_kv_t *pp = &probe;
    gguf_kv_t **hit = bsearch(&pp, g->kv_sorted, (size_t)g->n_kv,
                              sizeof(*g->kv_sorted), cmp_kv);
    return hit ? (int)(*hit - g->kv) : -1;
}

const char *dsq_gguf_key(const dsq_gguf_t *g, int i)
{
    return (i >= 0 && i < g->n_kv) ? g->kv[i].key : NULL;
}

dsq_gguf_vtype_t dsq_gguf_kv_type(const dsq_gguf_t *g, int i)
{
    return (i >= 0 && i < g->n_kv) ? g->kv[i].type : (dsq_gguf_vtype_t)-1;
}

static const gguf_kv_t *find_kv(const dsq_gguf_t *g, const char *key)
{
    int i = dsq_gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

/* Decode a scalar as integer/double. Returns false for non-numeric kv. */
static bool scalar_value(const gguf_kv_t *kv, int64_t *iv, double *dv)
{
    const uint8_t *v = kv->val;
    switch (kv->type) {
    case DSQ_GGUF_U8:   *iv = v[0]; *dv = (double)*iv; return true;
    case DSQ_GGUF_BOOL: *iv = v[0] != 0; *dv = (double)*iv; return true;
    case DSQ_GGUF_I8:   { int8_t x; memcpy(&x, v, 1); *iv = x; *dv = x; return true; }
    case DSQ_GGUF_U16:  { uint16_t x; memcpy(&x, v, 2); *iv = x; *dv = x; return true; }
    case DSQ_GGUF_I16:  { int16_t x; memcpy(&x, v, 2); *iv = x; *dv = x; return true; }
    case DSQ_GGUF_U32:  { uint32_t x; memcpy(&x, v, 4); *iv = x; *dv = x; return true; }
    case DSQ_GGUF_I32:  { int32_t x; memcpy(&x, v, 4); *iv = x; *dv = x; return true; }
    case DSQ_GGUF_U64:  {
        uint64_t x; memcpy(&x, v, 8);
        *iv = x > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)x;
        *dv = (double)x;
        return true;
    }
    case DSQ_GGUF_I64:  { int64_t x; memcpy(&x, v, 8); *iv = x; *dv = (double)x; return true; }
    case DSQ_GGUF_F32:  {
        float x; memcpy(&x, v, 4); *dv = x;
        *iv = (x >= -9.2e18f && x <= 9.2e18f) ? (int64_t)x : 0;
        return true;
    }
    case DSQ_GGUF_F64:  {
        double x; memcpy(&x, v, 8); *dv = x;
        *iv = (x >= -9.2e18 && x <= 9.2e18) ? (int64_t)x : 0;
        return true;
    }
    default: return false;
    }
}

int64_t dsq_gguf_get_int(const dsq_gguf_t *g, const char *key, int64_t def)
{
    const gguf_kv_t *kv = find_kv(g, key);
    int64_t iv;
    double dv;
    return (kv && scalar_value(kv, &iv, &dv)) ? iv : def;
}

double dsq_gguf_get_float(const dsq_gguf_t *g, const char *key, double def)
{
    const gguf_kv_t *kv = find_kv(g, key);
    int64_t iv;
    double dv;
    return (kv && scalar_value(kv, &iv, &dv)) ? dv : def;
}

bool dsq_gguf_get_bool(const dsq_gguf_t *g, const char *key, bool def)
{
    const gguf_kv_t *kv = find_kv(g, key);
    int64_t iv;
    double dv;
    return (kv && scalar_value(kv, &iv, &dv)) ? dv != 0.0 : def;
}

const char *dsq_gguf_get_str(const dsq_gguf_t *g, const char *key, size_t *len)
{
    const gguf_kv_t *kv = find_kv(g, key);
    if (!kv || kv->type != DSQ_GGUF_STRING)
        return NULL;
    if (len)
        *len = (size_t)kv->str_len;
    return (const char *)kv->val;
}

int64_t dsq_gguf_arr_n(const dsq_gguf_t *g, const char *key,
                       dsq_gguf_vtype_t *elem_type)
{
    const gguf_kv_t *kv = find_kv(g, key);
    if (!kv || kv->type != DSQ_GGUF_ARRAY)
        return -1;
    if (elem_type)
        *elem_type = kv->elem_type;
    return (int64_t)kv->n;
}

const void *dsq_gguf_arr_data(const dsq_gguf_t *g, const char *key)
{
    const gguf_kv_t *kv = find_kv(g, key);
    if (!kv || kv->type != DSQ_GGUF_ARRAY || scalar_size(kv->elem_type) == 0)
        return NULL;
    return kv->val;
}

const char *dsq_gguf_arr_str(const dsq_gguf_t *g, const char *key, int64_t i,
                             size_t *len)
{
    const gguf_kv_t *kv = find_kv(g, key);
    if (!kv || kv->type != DSQ_GGUF_ARRAY || kv->elem_type != DSQ_GGUF_STRING
        || i < 0 || (uint64_t)i >= kv->n)
        return NULL;
    uint64_t slen;
    size_t off = (size_t)kv->str_off[i];
    memcpy(&slen, g->base + off, 8);   /* validated at open */
    if (len)
        *len = (size_t)slen;
    return (const char *)g->base + off + 8;
}

int dsq_gguf_n_tensors(const dsq_gguf_t *g) { return g->n_tensors; }

const dsq_tensor_t *dsq_gguf_tensor(const dsq_gguf_t *g, int i)
{
    return (i >= 0 && i < g->n_tensors) ? &g->tensors[i] : NULL;
}

const dsq_tensor_t *dsq_gguf_find_tensor(const dsq_gguf_t *g, const char *name)
{
    if (!g || !name || g->n_tensors == 0)
        return NULL;
    dsq_tensor_t probe = {.name = name};
    const dsq_tensor_t *pp = &probe;
    const dsq_tensor_t **hit = bsearch(&pp, g->t_sorted, (size_t)g->n_tensors,
                                       sizeof(*g->t_sorted), cmp_tensor);
    return hit ? *hit : NULL;
}
