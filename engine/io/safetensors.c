/* safetensors reader.
 *
 * The header is parsed once with cJSON (it is JSON by definition, and the
 * 100 MB cap keeps the parse bounded); each entry becomes a dsq_tensor_t
 * view into the read-only mapping with the shape reversed into GGUF order.
 * Names are copied (cJSON's tree is freed right after parsing) and indexed
 * by a sorted pointer array for lookups and duplicate detection.
 */
#include "safetensors.h"
#include "engine/common/error.h"
#include "mapfile.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER_BYTES (100u * 1000u * 1000u)

struct dsq_safetensors {
    char *path;
    const uint8_t *base;
    size_t size;
    bool mapped;
    int n_tensors;
    dsq_tensor_t *tensors;
    const dsq_tensor_t **sorted;
};

static const struct {
    const char *name;
    dsq_type_t type;
} dtypes[] = {
    {"F32", DSQ_TYPE_F32}, {"F16", DSQ_TYPE_F16}, {"BF16", DSQ_TYPE_BF16},
    {"I32", DSQ_TYPE_I32}, {"I16", DSQ_TYPE_I16}, {"I8", DSQ_TYPE_I8},
    {"U8", DSQ_TYPE_U8}, {"I64", DSQ_TYPE_I64}, {"F64", DSQ_TYPE_F64},
};

static int cmp_tensor(const void *a, const void *b)
{
    const dsq_tensor_t *x = *(const dsq_tensor_t *const *)a;
    const dsq_tensor_t *y = *(const dsq_tensor_t *const *)b;
    return strcmp(x->name, y->name);
}

/* A JSON number that is a non-negative integer exactly representable. */
static bool json_u64(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0
        || v->valuedouble > 9007199254740992.0
        || v->valuedouble != floor(v->valuedouble))
        return false;
    *out = (uint64_t)v->valuedouble;
    return true;
}

static int parse_entry(dsq_safetensors_t *s, const cJSON *e, dsq_tensor_t *t,
                       size_t buf_size, char *err, size_t err_len)
{
    const char *p = s->path, *n = t->name;
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsObject(e) || !cJSON_IsString(dt) || !cJSON_IsArray(shape)
        || !cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
        dsq_error_set(err, err_len, "%s: tensor '%s': needs dtype, shape and data_offsets [begin, end]", p, n);
        return DSQ_EFORMAT;
    }
    bool found = false;
    for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++) {
        if (strcmp(dt->valuestring, dtypes[i].name) == 0) {
            t->type = dtypes[i].type;
            found = true;
        }
    }
    if (!found) {
        dsq_error_set(err, err_len, "%s: tensor '%s': dtype '%s' not supported", p, n, dt->valuestring);
        return DSQ_EUNSUPPORTED;
    }
    int nd = cJSON_GetArraySize(shape);
    if (nd > 4) {
        dsq_error_set(err, err_len, "%s: tensor '%s': %d dims (at most 4)", p, n, nd);
        return DSQ_EUNSUPPORTED;
    }
    t->n_dims = nd == 0 ? 1 : nd;
    for (int d = 0; d < 4; d++)
        t->ne[d] = 1;
    int64_t n_elems = 1;
    for (int d = 0; d < nd; d++) {
        uint64_t v;
        if (!json_u64(cJSON_GetArrayItem(shape, d), &v)
            || __builtin_mul_overflow(n_elems, (int64_t)v, &n_elems)) {
            dsq_error_set(err, err_len, "%s: tensor '%s': bad or overflowing shape[%d]", p, n, d);
            return DSQ_EFORMAT;
        }
        t->ne[nd - 1 - d] = (int64_t)v;    /* JSON is outermost-first */
    }
    if (dsq_type_bytes(t->type, n_elems, &t->n_bytes) != DSQ_OK) {
        dsq_error_set(err, err_len, "%s: tensor '%s': byte size overflows", p, n);
        return DSQ_ERANGE;
    }
    uint64_t b, en;
    if (!json_u64(cJSON_GetArrayItem(offs, 0), &b)
        || !json_u64(cJSON_GetArrayItem(offs, 1), &en) || b > en) {
        dsq_error_set(err, err_len, "%s: tensor '%s': bad data_offsets", p, n);
        return DSQ_EFORMAT;
    }
    if (en > buf_size) {
        dsq_error_set(err, err_len, "%s: tensor '%s': data_offsets end %llu past end of file (buffer is %zu bytes)",
                p, n, (unsigned long long)en, buf_size);
        return DSQ_EFORMAT;
    }
    if (en - b != t->n_bytes) {
        dsq_error_set(err, err_len, "%s: tensor '%s': data_offsets span %llu bytes, shape x dtype needs %zu",
                p, n, (unsigned long long)(en - b), t->n_bytes);
        return DSQ_EFORMAT;
    }
    t->data = (const void *)(uintptr_t)b;  /* relative until placed */
    return DSQ_OK;
}

static int parse(dsq_safetensors_t *s, char *err, size_t err_len)
{
    const char *p = s->path;
    uint64_t hlen;
    int rc = DSQ_OK;
    if (s->size < 8) {
        dsq_error_set(err, err_len, "%s: not a safetensors file (shorter than 8 bytes)", p);
        return DSQ_EFORMAT;
    }
    memcpy(&hlen, s->base, 8);
    if (hlen > ST_MAX_HEADER_BYTES || hlen > s->size - 8) {
        dsq_error_set(err, err_len, "%s: header length %llu exceeds the file or the 100 MB limit",
                p, (unsigned long long)hlen);
        return DSQ_EFORMAT;
    }
    const uint8_t *buf = s->base + 8 + hlen;
    size_t buf_size = s->size - 8 - (size_t)hlen;
    cJSON *root = cJSON_ParseWithLength((const char *)s->base + 8, (size_t)hlen);
    if (!cJSON_IsObject(root)) {
        dsq_error_set(err, err_len, "%s: header is not a JSON object", p);
        rc = DSQ_EFORMAT;
        goto undo_json;
    }
    int n = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") != 0)
            n++;
    }
    s->tensors = calloc(n ? (size_t)n : 1, sizeof(*s->tensors));
    s->sorted = calloc(n ? (size_t)n : 1, sizeof(*s->sorted));
    if (!s->tensors || !s->sorted) {
        dsq_error_set(err, err_len, "%s: out of memory", p);
        rc = DSQ_ENOMEM;
        goto undo_json;
    }
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        dsq_tensor_t *t = &s->tensors[s->n_tensors];
        t->name = strdup(e->string);
        if (!t->name) {
            dsq_error_set(err, err_len, "%s: out of memory", p);
            rc = DSQ_ENOMEM;
            goto undo_json;
        }
        s->n_tensors++;
        rc = parse_entry(s, e, t, buf_size, err, err_len);
        if (rc != DSQ_OK)
            goto undo_json;
        t->data = buf + (size_t)(uintptr_t)t->data;
        s->sorted[s->n_tensors - 1] = t;
    }
    qsort(s->sorted, (size_t)s->n_tensors, sizeof(*s->sorted), cmp_tensor);
    for (int i = 1; i < s->n_tensors; i++) {
        if (strcmp(s->sorted[i - 1]->name, s->sorted[i]->name) == 0) {
            dsq_error_set(err, err_len, "%s: duplicate tensor name '%s'", p, s->sorted[i]->name);
            rc = DSQ_EFORMAT;
            goto undo_json;
        }
    }
    /* the reference reader (safetensors' Rust crate) wants the ranges to
     * tile the buffer; we allow gaps, never a byte in two tensors */
    const dsq_tensor_t *x, *y;
    rc = dsq_tensor_find_overlap(s->tensors, s->n_tensors, &x, &y);
    if (rc == DSQ_EFORMAT) {
        size_t bx = (size_t)((const uint8_t *)x->data - buf);
        size_t by = (size_t)((const uint8_t *)y->data - buf);
        dsq_error_set(err, err_len, "%s: tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap "
                "(data_offsets)", p, x->name, bx, bx + x->n_bytes, y->name, by,
                by + y->n_bytes);
    } else if (rc != DSQ_OK) {
        dsq_error_set(err, err_len, "%s: out of memory", p);
    }
undo_json:
    cJSON_Delete(root);
    return rc;
}

void dsq_safetensors_close(dsq_safetensors_t *s)
{
    if (!s)
        return;
    if (s->mapped)
        munmap((void *)s->base, s->size);
    for (int i = 0; i < s->n_tensors; i++)
        free((char *)s->tensors[i].name);
    free(s->tensors);
    free(s->sorted);
    free(s->path);
    free(s);
}

dsq_safetensors_t *dsq_safetensors_open_buffer(const void *buf, size_t size,
                                               const char *name, char *err,
                                               size_t err_len)
{
    dsq_safetensors_t *s = calloc(1, sizeof(*s));
    if (!s || !(s->path = strdup(name ? name : "(buffer)"))) {
        dsq_error_set(err, err_len, "%s: out of memory", name ? name : "(buffer)");
        free(s);
        return NULL;
    }
    s->base = buf;
    s->size = buf ? size : 0;
    if (parse(s, err, err_len) != DSQ_OK) {
        dsq_safetensors_close(s);
        s = NULL;
    }
    return s;
}

dsq_safetensors_t *dsq_safetensors_open(const char *path, char *err,
                                        size_t err_len)
{
    void *map;
    size_t size;
    if (dsq__map_file(path, 8, "not a safetensors file (shorter than 8 bytes)", &map, &size,
                      err, err_len) != DSQ_OK)
        return NULL;
    dsq_safetensors_t *s = dsq_safetensors_open_buffer(map, size, path, err, err_len);
    if (s)
        s->mapped = true;
    else
        munmap(map, size);
    return s;
}

const char *dsq_safetensors_path(const dsq_safetensors_t *s) { return s->path; }
int dsq_safetensors_n_tensors(const dsq_safetensors_t *s) { return s->n_tensors; }

const dsq_tensor_t *dsq_safetensors_tensor(const dsq_safetensors_t *s, int i)
{
    return (i >= 0 && i < s->n_tensors) ? &s->tensors[i] : NULL;
}

const dsq_tensor_t *dsq_safetensors_find(const dsq_safetensors_t *s,
                                         const char *name)
{
    if (!s || !name || s->n_tensors == 0)
        return NULL;
    dsq_tensor_t probe = {.name = name};
    const dsq_tensor_t *pp = &probe;
    const dsq_tensor_t **hit = bsearch(&pp, s->sorted, (size_t)s->n_tensors,
                                       sizeof(*s->sorted), cmp_tensor);
    return hit ? *hit : NULL;
}
