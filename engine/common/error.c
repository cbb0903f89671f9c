/* Error codes' names and the one way a detail line reaches a caller's
 * buffer. Every module reports failures as a DSQ_E* code plus, where the
 * caller passed one, a one-line reason in its own buffer; both live here so
 * no module grows its own copy. */
#include "error.h"

#include <stdarg.h>
#include <stdio.h>

void dsq_error_set(char *err, size_t err_len, const char *fmt, ...)
{
    if (!err || err_len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

const char *dsq_strerror(int err)
{
    switch (err) {
    case DSQ_OK: return "ok";
    case DSQ_EINVAL: return "invalid argument";
    case DSQ_ENOMEM: return "out of memory";
    case DSQ_EIO: return "input/output error";
    case DSQ_EFORMAT: return "malformed file";
    case DSQ_EUNSUPPORTED: return "not supported";
    case DSQ_ERANGE: return "out of range";
    case DSQ_EFULL: return "full";
    case DSQ_ENOTFOUND: return "not found";
    case DSQ_ECUDA: return "CUDA error";
    case DSQ_ECANCELLED: return "cancelled";
    case DSQ_ESTATE: return "invalid state";
    default: return "unknown error";
    }
}
