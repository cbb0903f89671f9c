/* dsq error codes.
 *
 * Every function that does something returns int: 0 on success or one of the
 * negative DSQ_E* codes below. The HTTP edge (server/error.c) maps these codes
 * to OpenAI-style error objects; nothing else should invent new codes. */
#ifndef DSQ_ERROR_H
#define DSQ_ERROR_H

#include <stddef.h>

#define DSQ_OK            0
#define DSQ_EINVAL       (-1)  /* invalid argument or request field          */
#define DSQ_ENOMEM       (-2)  /* allocation failed                           */
#define DSQ_EIO          (-3)  /* read/write/mmap failed                      */
#define DSQ_EFORMAT      (-4)  /* malformed model / tokenizer / config file   */
#define DSQ_EUNSUPPORTED (-5)  /* well-formed but not supported (yet)         */
#define DSQ_ERANGE       (-6)  /* value out of range, e.g. context too long   */
#define DSQ_EFULL        (-7)  /* queue or KV cache full                      */
#define DSQ_ENOTFOUND    (-8)  /* named key, tensor, model or route missing   */
#define DSQ_ECUDA        (-9)  /* a CUDA runtime or cuBLAS call failed        */
#define DSQ_ECANCELLED  (-10)  /* request cancelled (client gone, timeout)    */
#define DSQ_ESTATE      (-11)  /* call not valid in the object's state        */

/* Short, static, human-readable name of a DSQ_E* code ("invalid argument").
 * Never returns NULL; unknown codes give "unknown error". */
const char *dsq_strerror(int err);

/* Write a printf-formatted one-line reason into the caller's buffer err
 * (err_len bytes, always NUL-terminated, truncated to fit). err NULL or
 * err_len 0: nothing is written. engine/common/error.c. */
void dsq_error_set(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
