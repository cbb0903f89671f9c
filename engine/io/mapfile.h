/* Read-only mapping of a whole model file, shared by the GGUF,
 * safetensors and llama2.c readers. Internal to engine/. */
#ifndef DSQ_MAPFILE_H
#define DSQ_MAPFILE_H

#include <stddef.h>

/* Map the regular file at path (PROT_READ, MAP_PRIVATE) into *map, its
 * size in bytes into *size; release with munmap(*map, *size). Files
 * shorter than min_size bytes are refused with "<path>: <too_short> (N
 * bytes)". Returns 0, or DSQ_EIO with a one-line reason in err naming the
 * path ("cannot open: ...", "not a regular file", the too_short text,
 * "mmap failed: ..."). */
int dsq__map_file(const char *path, size_t min_size, const char *too_short, void **map,
                  size_t *size, char *err, size_t err_len);

#endif
