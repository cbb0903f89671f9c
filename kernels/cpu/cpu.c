/* CPU backend control: thread count and instruction-set dispatch level.
 *
 * The ISA level is read from CPUID once (GCC's __builtin_cpu_supports, which
 * also checks that the OS saves the AVX/AVX-512 register state; on AArch64
 * the kernel's HWCAP bits, getauxval(AT_HWCAP): NEON always, SDOT when
 * HWCAP_ASIMDDP) and may be lowered, never raised, by DSQ_CPU_ISA or
 * dsq_cpu_force_isa, so tests can run every path the machine has against
 * the scalar one; levels of the other architecture never run. The thread
 * count defaults to the number of physical cores (hyper-threads share the
 * FMA and load ports the kernels saturate); it sizes the pthread pool of
 * threadpool.c, so it holds no matter which thread calls the kernels.
 */
#include "cpu_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1UL << 20)   /* Linux arch/arm64 uapi hwcap.h */
#endif
#endif

#include "engine/common/error.h"

static int n_threads_set;          /* 0 = not decided yet */
static int isa_detected = -1;      /* -1 = not probed yet */
static int isa_forced = -1;        /* -1 = none */

static int count_physical_cores(void)
{
    /* Unique (package, core) pairs over online CPUs; falls back to the
     * online processor count when sysfs is unreadable. */
    long n_onln = sysconf(_SC_NPROCESSORS_ONLN);
    int n_cpu = n_onln > 0 ? (int)n_onln : 1;
    int n_found = 0;
    long seen[1024];
    int n_seen = 0;
    for (int c = 0; c < n_cpu && c < 1024; c++) {
        char path[128];
        long pkg = 0, core = 0;
        snprintf(path, sizeof(path),
                 "/sys/devices/system/cpu/cpu%d/topology/core_id", c);
        FILE *f = fopen(path, "r");
        if (!f)
            break;
        if (fscanf(f, "%ld", &core) != 1)
            core = c;
        fclose(f);
        snprintf(path, sizeof(path),
                 "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
        f = fopen(path, "r");
        if (f) {
            if (fscanf(f, "%ld", &pkg) != 1)
                pkg = 0;
            fclose(f);
        }
        long key = pkg * 65536 + core;
        int dup = 0;
        for (int i = 0; i < n_seen; i++)
            dup |= seen[i] == key;
        if (!dup)
            seen[n_seen++] = key;
        n_found++;
    }
    if (n_found == 0 || n_seen == 0)
        return n_cpu > 0 ? n_cpu : 1;
    return n_seen;
}

int dsq_cpu_set_threads(int n_threads)
{
    if (n_threads < 1)
        return DSQ_EINVAL;
    n_threads_set = n_threads;
    return DSQ_OK;
}

int dsq_cpu_get_threads(void)
{
    if (n_threads_set == 0)
        n_threads_set = count_physical_cores();
    return n_threads_set;
}

static int parse_isa(const char *name)
{
    if (!name)
        return -1;
    if (strcasecmp(name, "scalar") == 0)
        return DSQ__ISA_SCALAR;
    if (strcasecmp(name, "avx2") == 0)
        return DSQ__ISA_AVX2;
    if (strcasecmp(name, "avx512") == 0)
        return DSQ__ISA_AVX512;
    if (strcasecmp(name, "neon") == 0)
        return DSQ__ISA_NEON;
    if (strcasecmp(name, "neon_dotprod") == 0)
        return DSQ__ISA_NEON_DOTPROD;
    return -1;
}

/* Whether level lvl runs on a CPU whose best level is det: scalar always,
 * others only up to det and within det's architecture. */
static bool isa_runs(int lvl, int det)
{
    if (lvl == DSQ__ISA_SCALAR)
        return true;
    if ((lvl >= DSQ__ISA_NEON) != (det >= DSQ__ISA_NEON))
        return false;
    return lvl <= det;
}

static int detect_isa(void)
{
    int level = DSQ__ISA_SCALAR;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c")) {
        level = DSQ__ISA_AVX2;
        if (__builtin_cpu_supports("avx512f") &&
            __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") &&
            __builtin_cpu_supports("avx512vnni"))
            level = DSQ__ISA_AVX512;
    }
#elif defined(__aarch64__)
    level = DSQ__ISA_NEON;   /* Advanced SIMD is mandatory in AArch64 */
    if (getauxval(AT_HWCAP) & HWCAP_ASIMDDP)
        level = DSQ__ISA_NEON_DOTPROD;
#endif
    return level;
}

dsq__isa_t dsq__cpu_isa_level(void)
{
    if (isa_detected < 0) {
        int det = detect_isa();
        int env = parse_isa(getenv("DSQ_CPU_ISA"));
        if (env >= 0 && env != det && isa_runs(env, det) && isa_forced < 0)
            isa_forced = env;
        isa_detected = det;
    }
    if (isa_forced >= 0 && isa_forced != isa_detected)
        return (dsq__isa_t)isa_forced;
    return (dsq__isa_t)isa_detected;
}

const char *dsq_cpu_isa(void)
{
    static const char *names[] = {"scalar", "avx2", "avx512", "neon", "neon_dotprod"};
    return names[dsq__cpu_isa_level()];
}

int dsq_cpu_force_isa(const char *name)
{
    int rc = DSQ_OK;
    int lvl = parse_isa(name);
    (void)dsq__cpu_isa_level();
    if (lvl < 0)
        rc = DSQ_EINVAL;
    else if (!isa_runs(lvl, isa_detected))
        rc = DSQ_EUNSUPPORTED;
    else
        isa_forced = lvl;
    return rc;
}
