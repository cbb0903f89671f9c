/* The Ampere warp-level PTX dsq's tensor-core kernels are built from --
 * mma.sync m16n8k16 / m16n8k8 (f16, bf16; f32 and f16 accumulators, as
 * ptxas takes them: .dtype = .ctype),
 * m16n8k32 (s8 / u8, s32, with and without .satfinite), ldmatrix
 * .x1/.x2/.x4 with and without .trans, cp.async .ca/.cg with a src-size,
 * lop3 -- executed one warp at a time against the per-lane registers the
 * PTX ISA's fragment tables give (tests/golden/warp_fragments.txt, written
 * by tests/ref/make_warp_fragments.py from those tables with numpy; for
 * mma the FP64 product rounded once to the destination type). Under the
 * GPU simulator (tests/gpu/cudasim-8-ampere-warp.patch teaches it these
 * instructions) every register must match bit for bit; on a GPU the
 * integer, ldmatrix, cp.async and lop3 cases must match exactly and the
 * floating-point products within 4 ulp of the destination type (the
 * tensor cores round inside their accumulation; not yet run on one).
 *
 * Built for compute_80 PTX (sm_80 SASS as well on a GPU build): the
 * simulator then reports compute capability 8.0 (tests/gpu/cudasim).
 * Output is TAP; without a device the test skips, unless
 * DSQ_REQUIRE_GPU=1. Argument / env: the golden file (default
 * $DSQ_SOURCE_ROOT/tests/golden/warp_fragments.txt). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAXW 16

struct lane_io {
    uint32_t in[MAXW];
    uint32_t out[MAXW];
};

/* ---- kernels: one warp, lane l reads in[l], writes out[l] ---- */

#define LD4(p) p[0], p[1], p[2], p[3]

template <int V>
__global__ void k_mma(const lane_io *io, lane_io *res)
{
    const int l = threadIdx.x;
    const uint32_t *a = io[l].in;
    uint32_t *d = res[l].out;
#if __CUDA_ARCH__ >= 800
/* m16n8k16 with f32 C and D: f16 or bf16 inputs */
#define MMA_K16_F32(TYPES)                                                                   \
    {                                                                                        \
        float c0 = __uint_as_float(a[6]), c1 = __uint_as_float(a[7]),                       \
              c2 = __uint_as_float(a[8]), c3 = __uint_as_float(a[9]), d0, d1, d2, d3;        \
        asm volatile("mma.sync.aligned.m16n8k16.row.col" TYPES " {%0,%1,%2,%3}, "            \
                     "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"                             \
                     : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)                                \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]),     \
                       "f"(c0), "f"(c1), "f"(c2), "f"(c3));                                  \
        d[0] = __float_as_uint(d0); d[1] = __float_as_uint(d1);                              \
        d[2] = __float_as_uint(d2); d[3] = __float_as_uint(d3);                              \
    }
    if (V == 0)
        MMA_K16_F32(".f32.f16.f16.f32")
    else if (V == 8)
        MMA_K16_F32(".f32.bf16.bf16.f32")
    else if (V == 1) { /* m16n8k8 f32.f16.f16.f32 */
        float c0 = __uint_as_float(a[3]), c1 = __uint_as_float(a[4]),
              c2 = __uint_as_float(a[5]), c3 = __uint_as_float(a[6]), d0, d1, d2, d3;
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5}, {%6}, {%7,%8,%9,%10};"
                     : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
        d[0] = __float_as_uint(d0); d[1] = __float_as_uint(d1);
        d[2] = __float_as_uint(d2); d[3] = __float_as_uint(d3);
    } else if (V == 6) { /* m16n8k16 f16.f16.f16.f16 */
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, "
                     "{%2,%3,%4,%5}, {%6,%7}, {%8,%9};"
                     : "=r"(d[0]), "=r"(d[1])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]),
                       "r"(a[6]), "r"(a[7]));
    } else if (V == 7) { /* m16n8k8 f16.f16.f16.f16 */
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16 {%0,%1}, "
                     "{%2,%3}, {%4}, {%5,%6};"
                     : "=r"(d[0]), "=r"(d[1])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]));
    }
#define MMA_INT(VV, TYPES)                                                                   \
    else if (V == VV) {                                                                      \
        asm volatile("mma.sync.aligned.m16n8k32.row.col" TYPES " {%0,%1,%2,%3}, "            \
                     "{%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};"                             \
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])                        \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]),     \
                       "r"(a[6]), "r"(a[7]), "r"(a[8]), "r"(a[9]));                          \
    }
    MMA_INT(9, ".s32.s8.s8.s32")
    MMA_INT(10, ".s32.s8.u8.s32")
    MMA_INT(11, ".s32.u8.s8.s32")
    MMA_INT(12, ".s32.u8.u8.s32")
    MMA_INT(13, ".satfinite.s32.s8.s8.s32")
    MMA_INT(14, ".satfinite.s32.u8.u8.s32")
#endif
}

/* shared image of 32 slots x 16 bytes from mem; lane l points at slot in[0] */
template <int NUM, bool TRANS>
__global__ void k_ldmatrix(const uint32_t *mem, const lane_io *io, lane_io *res)
{
    __shared__ __align__(16) uint32_t sm[128];
    const int l = threadIdx.x;
    for (int i = l; i < 128; i += 32)
        sm[i] = mem[i];
    __syncwarp();
#if __CUDA_ARCH__ >= 800
    const uint32_t addr = (uint32_t)__cvta_generic_to_shared(sm + 4 * io[l].in[0]);
    uint32_t *d = res[l].out;
    if (NUM == 1 && !TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(d[0]) : "r"(addr));
    if (NUM == 1 && TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(d[0]) : "r"(addr));
    if (NUM == 2 && !TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];"
                     : "=r"(d[0]), "=r"(d[1]) : "r"(addr));
    if (NUM == 2 && TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];"
                     : "=r"(d[0]), "=r"(d[1]) : "r"(addr));
    if (NUM == 4 && !TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(addr));
    if (NUM == 4 && TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3]) : "r"(addr));
#endif
}

/* lane l copies SIZE bytes (src-size in[1]) of global slot in[0] into its
 * shared slot l, pre-filled with 0xA5, then the slot comes back */
template <int SIZE, bool CG>
__global__ void k_cp_async(const uint32_t *mem, const lane_io *io, lane_io *res)
{
    __shared__ __align__(16) uint32_t sm[128];
    const int l = threadIdx.x;
    for (int i = 0; i < 4; i++)
        sm[4 * l + i] = 0xA5A5A5A5u;
    __syncwarp();
#if __CUDA_ARCH__ >= 800
    const uint32_t dst = (uint32_t)__cvta_generic_to_shared(sm + 4 * l);
    const uint32_t *src = mem + 4 * io[l].in[0];
    const uint32_t ss = io[l].in[1];
    if (CG)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ss));
    else if (SIZE == 4)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(dst), "l"(src), "r"(ss));
    else if (SIZE == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" :: "r"(dst), "l"(src), "r"(ss));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(ss));
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;");
    asm volatile("cp.async.wait_all;");
#endif
    __syncwarp();
    for (int i = 0; i < 4; i++)
        res[l].out[i] = sm[4 * l + i];
}

template <int LUT>
__global__ void k_lop3(const lane_io *io, lane_io *res)
{
    const int l = threadIdx.x;
    uint32_t d = 0;
#if __CUDA_ARCH__ >= 800
    asm volatile("lop3.b32 %0, %1, %2, %3, %4;"
                 : "=r"(d) : "r"(io[l].in[0]), "r"(io[l].in[1]), "r"(io[l].in[2]), "n"(LUT));
#endif
    res[l].out[0] = d;
}

/* ---- host ---- */

static int n_test, n_fail;

struct gcase {
    char name[96];
    int nin, nout;          /* words a lane reads / writes */
    bool has_mem;
    uint32_t mem[128];
    lane_io lanes[32];
};

static bool read_case(FILE *f, gcase *c)
{
    char line[4096];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "case ", 5) != 0)
            continue;
        memset(c, 0, sizeof(*c));
        int na = 0, nb = 0, nc = 0, nd = 0;
        const int got = sscanf(line + 5, "%95s %d %d %d %d", c->name, &na, &nb, &nc, &nd);
        c->has_mem = !strncmp(c->name, "ldmatrix", 8) || !strncmp(c->name, "cp.async", 8);
        if (c->has_mem) {
            if (!fgets(line, sizeof(line), f) || strncmp(line, "mem ", 4) != 0)
                return false;
            char *p = line + 4;
            for (int i = 0; i < 128; i++)
                c->mem[i] = (uint32_t)strtoul(p, &p, 16);
        }
        for (int l = 0; l < 32; l++) {
            if (!fgets(line, sizeof(line), f))
                return false;
            char *bar = strchr(line, '|');
            if (!bar)
                return false;
            *bar = 0;
            char *p = line;
            int n = 0;
            for (char *e; n < MAXW; n++) {
                const uint32_t v = (uint32_t)strtoul(p, &e, 16);
                if (e == p)
                    break;
                c->lanes[l].in[n] = v;
                p = e;
            }
            c->nin = n;
            p = bar + 1;
            n = 0;
            for (char *e; n < MAXW; n++) {
                const uint32_t v = (uint32_t)strtoul(p, &e, 16);
                if (e == p)
                    break;
                c->lanes[l].out[n] = v;
                p = e;
            }
            c->nout = n;
        }
        (void)got;
        return true;
    }
    return false;
}

/* exact match, or (on a GPU, fp mma only) within tol ulp of the type */
static double ulp_diff(uint32_t got, uint32_t want, bool f16)
{
    if (got == want)
        return 0.0;
    if (f16) {
        const int a = (int)(int16_t)got, b = (int)(int16_t)want;
        const int ia = a < 0 ? -(a & 0x7fff) : a, ib = b < 0 ? -(b & 0x7fff) : b;
        return fabs((double)(ia - ib));
    }
    const int64_t a = (int32_t)got, b = (int32_t)want;
    const int64_t ia = a < 0 ? -(a & 0x7fffffff) : a, ib = b < 0 ? -(b & 0x7fffffff) : b;
    return fabs((double)(ia - ib));
}

static void run_case(const gcase *c, bool exact_only)
{
    lane_io *dio, *dres;
    uint32_t *dmem;
    cudaMalloc(&dio, sizeof(c->lanes));
    cudaMalloc(&dres, sizeof(c->lanes));
    cudaMalloc(&dmem, sizeof(c->mem));
    cudaMemcpy(dio, c->lanes, sizeof(c->lanes), cudaMemcpyHostToDevice);
    cudaMemcpy(dmem, c->mem, sizeof(c->mem), cudaMemcpyHostToDevice);
    cudaMemset(dres, 0xFF, sizeof(c->lanes));
    const char *n = c->name;
    bool known = true, fp = false, f16_out = false;
    if (!strcmp(n, "mma.m16n8k16.f32.f16.f16.f32")) { k_mma<0><<<1, 32>>>(dio, dres); fp = true; }
    else if (!strcmp(n, "mma.m16n8k8.f32.f16.f16.f32")) { k_mma<1><<<1, 32>>>(dio, dres); fp = true; }
    else if (!strcmp(n, "mma.m16n8k16.f16.f16.f16.f16")) { k_mma<6><<<1, 32>>>(dio, dres); fp = f16_out = true; }
    else if (!strcmp(n, "mma.m16n8k8.f16.f16.f16.f16")) { k_mma<7><<<1, 32>>>(dio, dres); fp = f16_out = true; }
    else if (!strcmp(n, "mma.m16n8k16.f32.bf16.bf16.f32")) { k_mma<8><<<1, 32>>>(dio, dres); fp = true; }
    else if (!strcmp(n, "mma.m16n8k32.s32.s8.s8.s32")) k_mma<9><<<1, 32>>>(dio, dres);
    else if (!strcmp(n, "mma.m16n8k32.s32.s8.u8.s32")) k_mma<10><<<1, 32>>>(dio, dres);
    else if (!strcmp(n, "mma.m16n8k32.s32.u8.s8.s32")) k_mma<11><<<1, 32>>>(dio, dres);
    else if (!strcmp(n, "mma.m16n8k32.s32.u8.u8.s32")) k_mma<12><<<1, 32>>>(dio, dres);
    else if (!strcmp(n, "mma.m16n8k32.satfinite.s32.s8.s8.s32")) k_mma<13><<<1, 32>>>(dio, dres);
    else if (!strcmp(n, "mma.m16n8k32.satfinite.s32.u8.u8.s32")) k_mma<14><<<1, 32>>>(dio, dres);
    else if (!strcmp(n, "ldmatrix.x1")) k_ldmatrix<1, false><<<1, 32>>>(dmem, dio, dres);
    else if (!strcmp(n, "ldmatrix.x1.trans")) k_ldmatrix<1, true><<<1, 32>>>(dmem, dio, dres);
    else if (!strcmp(n, "ldmatrix.x2")) k_ldmatrix<2, false><<<1, 32>>>(dmem, dio, dres);
    else if (!strcmp(n, "ldmatrix.x2.trans")) k_ldmatrix<2, true><<<1, 32>>>(dmem, dio, dres);
    else if (!strcmp(n, "ldmatrix.x4")) k_ldmatrix<4, false><<<1, 32>>>(dmem, dio, dres);
    else if (!strcmp(n, "ldmatrix.x4.trans")) k_ldmatrix<4, true><<<1, 32>>>(dmem, dio, dres);
    else if (!strcmp(n, "cp.async.ca.4")) k_cp_async<4, false><<<1, 32>>>(dmem, dio, dres);
    else if (!strcmp(n, "cp.async.ca.8")) k_cp_async<8, false><<<1, 32>>>(dmem, dio, dres);
    else if (!strcmp(n, "cp.async.ca.16")) k_cp_async<16, false><<<1, 32>>>(dmem, dio, dres);
    else if (!strcmp(n, "cp.async.cg.16")) k_cp_async<16, true><<<1, 32>>>(dmem, dio, dres);
#define LOP(L) else if (!strcmp(n, "lop3." #L)) k_lop3<0x##L><<<1, 32>>>(dio, dres);
    LOP(f0) LOP(cc) LOP(aa) LOP(96) LOP(e8) LOP(f8) LOP(6a) LOP(1e) LOP(00) LOP(ff)
    else known = false;
    lane_io got[32];
    const cudaError_t err = cudaDeviceSynchronize();
    cudaMemcpy(got, dres, sizeof(got), cudaMemcpyDeviceToHost);
    cudaFree(dio);
    cudaFree(dres);
    cudaFree(dmem);
    n_test++;
    if (!known || err != cudaSuccess) {
        n_fail++;
        printf("not ok %d - %s: %s\n", n_test, n, known ? cudaGetErrorString(err) : "no kernel for it");
        return;
    }
    /* a GPU's fp accumulation is not the FP64 product rounded once: allow
     * a few ulp there; the simulator and every other case are exact */
    const double tol = fp && !exact_only ? 4.0 : 0.0;
    int bad = 0;
    double worst = 0.0;
    for (int l = 0; l < 32; l++)
        for (int w = 0; w < c->nout; w++) {
            const uint32_t g = got[l].out[w], e = c->lanes[l].out[w];
            double d = 0.0;
            if (f16_out)
                d = fmax(ulp_diff(g & 0xffff, e & 0xffff, true), ulp_diff(g >> 16, e >> 16, true));
            else if (g != e)
                d = fp ? ulp_diff(g, e, false) : INFINITY;
            worst = fmax(worst, d);
            if (d > tol && bad++ < 4)
                printf("# %s lane %d word %d: got %08x, want %08x\n", n, l, w, g, e);
        }
    if (bad)
        n_fail++;
    printf("%s %d - %s (%d words a lane, worst %.0f ulp)\n", bad ? "not ok" : "ok", n_test, n,
           c->nout, worst);
}

int main(int argc, char **argv)
{
    char path[4096];
    const char *root = getenv("DSQ_SOURCE_ROOT");
    if (argc > 1)
        snprintf(path, sizeof(path), "%s", argv[1]);
    else
        snprintf(path, sizeof(path), "%s/tests/golden/warp_fragments.txt", root ? root : ".");
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        const char *req = getenv("DSQ_REQUIRE_GPU");
        if (req && !strcmp(req, "1")) {
            printf("1..1\nnot ok 1 - no CUDA device but DSQ_REQUIRE_GPU=1\n");
            return 1;
        }
        printf("1..0 # SKIP no CUDA device\n");
        return 0;
    }
    cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    /* the simulator (GPGPU-Sim) must match exactly; a GPU within its
     * accumulation rounding */
    const bool sim = strstr(prop.name, "GPGPU-Sim") != NULL;
    if (prop.major < 8) {
        /* the simulator must offer 8.0 (tests/gpu/cudasim); a Turing GPU
         * has none of these instructions */
        if (sim) {
            printf("1..1\nnot ok 1 - the simulator reports compute capability %d.%d, not 8.0\n",
                   prop.major, prop.minor);
            return 1;
        }
        printf("1..0 # SKIP compute capability %d.%d: these instructions need 8.0\n", prop.major,
               prop.minor);
        return 0;
    }
    FILE *f = fopen(path, "r");
    if (!f) {
        printf("1..1\nnot ok 1 - cannot open %s (tests/ref/make_warp_fragments.py writes it)\n",
               path);
        return 1;
    }
    static gcase cases[64];
    int nc = 0;
    while (nc < 64 && read_case(f, &cases[nc]))
        nc++;
    fclose(f);
    printf("1..%d\n# %s, compute capability %d.%d, %s\n", nc, prop.name, prop.major, prop.minor,
           sim ? "bit-exact" : "fp mma within 4 ulp");
    for (int i = 0; i < nc; i++)
        run_case(&cases[i], sim);
    return n_fail ? 1 : 0;
}
