/* GGUF reader (v2 and v3).
 *
 * Format: GGUF spec, ggml repository docs/gguf.md. The file is mmapped
 * read-only; metadata strings, arrays and tensor data are views into the
 * mapping and live as long as the dsq_gguf_t. Every length and offset read
 * from the file is bounds-checked against the file size before use, so a
 * truncated or hostile file gives an error, never a crash or a huge
 * allocation.
 */
#ifndef DSQ_GGUF_H
#define DSQ_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

/* Metadata value types, numbered as in the GGUF spec. */
typedef enum dsq_gguf_vtype {
    DSQ_GGUF_U8 = 0, DSQ_GGUF_I8 = 1, DSQ_GGUF_U16 = 2, DSQ_GGUF_I16 = 3,
    DSQ_GGUF_U32 = 4, DSQ_GGUF_I32 = 5, DSQ_GGUF_F32 = 6, DSQ_GGUF_BOOL = 7,
    DSQ_GGUF_STRING = 8, DSQ_GGUF_ARRAY = 9, DSQ_GGUF_U64 = 10,
    DSQ_GGUF_I64 = 11, DSQ_GGUF_F64 = 12,
} dsq_gguf_vtype_t;

typedef struct dsq_gguf dsq_gguf_t;

/* Open and validate a GGUF file (header, all metadata, all tensor infos,
 * alignment, tensor bounds: every tensor's bytes inside the data section
 * and no byte in two tensors). On failure returns NULL and writes a
 * one-line reason naming the file and the offending field/tensor (for an
 * overlap both tensors and their [offset, +bytes) ranges) into err. */
dsq_gguf_t *dsq_gguf_open(const char *path, char *err, size_t err_len);
/* Parse a GGUF image already in memory (fuzzing, tests). buf is NOT copied
 * and must outlive the returned reader; name is used in error messages and
 * as dsq_gguf_path() (NULL: "(buffer)"). Same validation and errors as
 * dsq_gguf_open. */
dsq_gguf_t *dsq_gguf_open_buffer(const void *buf, size_t size,
                                 const char *name, char *err, size_t err_len);
/* Unmap and free. NULL is a no-op. */
void dsq_gguf_close(dsq_gguf_t *g);

uint32_t dsq_gguf_version(const dsq_gguf_t *g);
size_t dsq_gguf_alignment(const dsq_gguf_t *g);
/* Path the file was opened from (owned by g). */
const char *dsq_gguf_path(const dsq_gguf_t *g);
/* Byte offset of the (aligned) tensor data section, and the file size. */
size_t dsq_gguf_data_offset(const dsq_gguf_t *g);
size_t dsq_gguf_file_size(const dsq_gguf_t *g);

/* Metadata. Keys are looked up by exact name; index -1 means missing. */
int dsq_gguf_n_kv(const dsq_gguf_t *g);
int dsq_gguf_find_key(const dsq_gguf_t *g, const char *key);
const char *dsq_gguf_key(const dsq_gguf_t *g, int i);
dsq_gguf_vtype_t dsq_gguf_kv_type(const dsq_gguf_t *g, int i);

/* Scalar getters: convert any integer/float/bool scalar type to the asked
 * type; return def when the key is missing or is not a scalar number. */
int64_t dsq_gguf_get_int(const dsq_gguf_t *g, const char *key, int64_t def);
double dsq_gguf_get_float(const dsq_gguf_t *g, const char *key, double def);
bool dsq_gguf_get_bool(const dsq_gguf_t *g, const char *key, bool def);
/* String value (not NUL-terminated in the file: use *len). Returns NULL when
 * missing or not a string. */
const char *dsq_gguf_get_str(const dsq_gguf_t *g, const char *key, size_t *len);

/* Arrays: element type and count. Returns -1 when missing/not an array. */
int64_t dsq_gguf_arr_n(const dsq_gguf_t *g, const char *key,
                       dsq_gguf_vtype_t *elem_type);
/* Raw pointer to a numeric array's packed little-endian elements (NULL for
 * string/array elements or missing). */
const void *dsq_gguf_arr_data(const dsq_gguf_t *g, const char *key);
/* i-th string of a string array (NULL if out of range / wrong type). */
const char *dsq_gguf_arr_str(const dsq_gguf_t *g, const char *key, int64_t i,
                             size_t *len);

/* Tensors, in file order. */
int dsq_gguf_n_tensors(const dsq_gguf_t *g);
const dsq_tensor_t *dsq_gguf_tensor(const dsq_gguf_t *g, int i);
const dsq_tensor_t *dsq_gguf_find_tensor(const dsq_gguf_t *g, const char *name);

#endif
