/* Whole-file read-only mapping for the model readers (see mapfile.h): one
 * place for open/fstat/mmap and their error messages. */
#include "mapfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/common/error.h"

int dsq__map_file(const char *path, size_t min_size, const char *too_short, void **map,
                  size_t *size, char *err, size_t err_len)
{
    struct stat st;
    int rc = DSQ_EIO;
    *map = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return rc;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "%s: not a regular file", path);
        goto undo_fd;
    }
    if ((size_t)st.st_size < min_size) {
        snprintf(err, err_len, "%s: %s (%lld bytes)", path, too_short, (long long)st.st_size);
        goto undo_fd;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
        snprintf(err, err_len, "%s: mmap failed: %s", path, strerror(errno));
        goto undo_fd;
    }
    *map = m;
    *size = (size_t)st.st_size;
    rc = DSQ_OK;
undo_fd:
    close(fd);
    return rc;
}
