/* safetensors writer for dsq-quantize (format: huggingface/safetensors
 * README "Format"): tensors are copied into memory as they are added and
 * written in one pass; the JSON header is built with cJSON and padded with
 * spaces to a multiple of 8 bytes so every tensor is 8-byte aligned. */
#include "quantizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"

typedef struct st_entry {
    char *name;
    dsq_type_t type;
    int n_dims;
    int64_t shape[4];
    void *data;
    size_t n_bytes;
} st_entry_t;

struct dsq_st_writer {
    st_entry_t *e;
    int n, cap;
};

dsq_st_writer_t *dsq_st_writer_create(void)
{
    return calloc(1, sizeof(dsq_st_writer_t));
}

void dsq_st_writer_destroy(dsq_st_writer_t *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n; i++) {
        free(w->e[i].name);
        free(w->e[i].data);
    }
    free(w->e);
    free(w);
}

static const char *st_dtype(dsq_type_t t, size_t *elem)
{
    switch (t) {
    case DSQ_TYPE_F32: *elem = 4; return "F32";
    case DSQ_TYPE_F16: *elem = 2; return "F16";
    case DSQ_TYPE_BF16: *elem = 2; return "BF16";
    case DSQ_TYPE_I32: *elem = 4; return "I32";
    case DSQ_TYPE_I64: *elem = 8; return "I64";
    default: *elem = 0; return NULL;
    }
}

int dsq_st_writer_add(dsq_st_writer_t *w, const char *name, dsq_type_t type,
                      int n_dims, const int64_t *shape, const void *data,
                      size_t n_bytes)
{
    size_t elem;
    if (!w || !name || !shape || n_dims < 1 || n_dims > 4 || (!data && n_bytes) ||
        !st_dtype(type, &elem))
        return DSQ_EINVAL;
    size_t ne = 1;
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] < 0)
            return DSQ_EINVAL;
        ne *= (size_t)shape[i];
    }
    if (ne * elem != n_bytes)
        return DSQ_EINVAL;
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->e[i].name, name) == 0)
            return DSQ_EINVAL;
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        st_entry_t *e = realloc(w->e, (size_t)cap * sizeof(*e));
        if (!e)
            return DSQ_ENOMEM;
        w->e = e;
        w->cap = cap;
    }
    st_entry_t *e = &w->e[w->n];
    memset(e, 0, sizeof(*e));
    e->name = strdup(name);
    e->data = malloc(n_bytes ? n_bytes : 1);
    if (!e->name || !e->data) {
        free(e->name);
        free(e->data);
        return DSQ_ENOMEM;
    }
    if (n_bytes)
        memcpy(e->data, data, n_bytes);
    e->type = type;
    e->n_dims = n_dims;
    memcpy(e->shape, shape, (size_t)n_dims * sizeof(*shape));
    e->n_bytes = n_bytes;
    w->n++;
    return DSQ_OK;
}

int dsq_st_writer_save(const dsq_st_writer_t *w, const char *path,
                       const char *const *metadata, char *err, size_t err_len)
{
    int rc = DSQ_OK;
    char *hdr = NULL;
    FILE *fp = NULL;
    cJSON *root = cJSON_CreateObject();
    if (!w || !path || !root) {
        rc = w && path ? DSQ_ENOMEM : DSQ_EINVAL;
        goto undo;
    }
    if (metadata) {
        cJSON *md = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; md && metadata[i] && metadata[i + 1]; i += 2)
            cJSON_AddStringToObject(md, metadata[i], metadata[i + 1]);
    }
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const st_entry_t *e = &w->e[i];
        size_t elem;
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        cJSON *sh = t ? cJSON_AddArrayToObject(t, "shape") : NULL;
        cJSON *of = t ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;
        if (!t || !sh || !of || !cJSON_AddStringToObject(t, "dtype", st_dtype(e->type, &elem))) {
            rc = DSQ_ENOMEM;
            goto undo;
        }
        for (int d = 0; d < e->n_dims; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e->shape[d]));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + e->n_bytes)));
        off += e->n_bytes;
    }
    hdr = cJSON_PrintUnformatted(root);
    if (!hdr) {
        rc = DSQ_ENOMEM;
        goto undo;
    }
    size_t hl = strlen(hdr), pad = (8 - hl % 8) % 8;
    uint64_t n = hl + pad;
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(n >> (8 * i));
    fp = fopen(path, "wb");
    if (!fp) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        rc = DSQ_EIO;
        goto undo;
    }
    bool ok = fwrite(le, 1, 8, fp) == 8 && fwrite(hdr, 1, hl, fp) == hl;
    for (size_t i = 0; ok && i < pad; i++)
        ok = fputc(' ', fp) != EOF;
    for (int i = 0; ok && i < w->n; i++)
        ok = fwrite(w->e[i].data, 1, w->e[i].n_bytes, fp) == w->e[i].n_bytes;
    if (fclose(fp) != 0)
        ok = false;
    fp = NULL;
    if (!ok) {
        snprintf(err, err_len, "%s: write failed: %s", path, strerror(errno));
        rc = DSQ_EIO;
    }
undo:
    if (rc == DSQ_ENOMEM && err && err_len)
        snprintf(err, err_len, "safetensors writer: out of memory");
    free(hdr);
    cJSON_Delete(root);
    return rc;
}
