/* dsqd entry point (grows in issue 6). */
#include "dsq_config.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--version") == 0) {
            printf("dsqd %s\n", DSQ_VERSION);
            return 0;
        }
        if (strcmp(argv[i], "--help") == 0) {
            printf("usage: dsqd --model PATH [options]\n");
            return 0;
        }
    }
    return 2;
}
