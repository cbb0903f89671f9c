/* dsq-bench: placeholder entry point; the real program grows in its issue.
 * Until then it answers --help and --version and refuses everything else. */
#include "dsq_config.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            printf("dsq-bench %s\n", DSQ_VERSION);
            return 0;
        }
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: dsq-bench [--help] [--version]\n");
            return 0;
        }
    }
    fprintf(stderr, "dsq-bench: not implemented yet (see --help)\n");
    return 2;
}
