/* dsq-quantize: offline INT4 (and, per recipe, INT8) quantisation of a model
 * into an AutoAWQ (or AutoGPTQ) Hugging Face directory that dsq — and
 * AWQ/GPTQ loaders — read.
 * Only argument parsing lives here; the pipeline is dsq_quantizer_run
 * (engine/quantizer/quantizer_run.c), the math engine/quantizer/quantizer.c. */
#include "dsq_config.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/common/error.h"
#include "kernels.h"
#include "engine/common/log.h"
#include "engine/quantizer/quantizer.h"

static void usage(FILE *f)
{
    fprintf(f,
"usage: dsq-quantize --model HF_DIR|GGUF|LLAMA2C_BIN [--tokenizer PATH] --out DIR\n"
"         [--method rtn|awq|gptq] [--format auto|awq|gptq] [--w-bit 4]\n"
"         [--group-size 32|64|128] [--sym]\n"
"         [--calib FILE] [--calib-samples N] [--calib-seq-len L]\n"
"         [--calib-epsilon E] [--calib-delta D] [--force] [--calib-rows R]\n"
"         [--recipe default|deepseek-moe] [--search] [--search-max-bpw B]\n"
"         [--bandwidth-gbs G] [--awq-grid N] [--clip-grid N] [--clip-min-ratio R]\n"
"         [--clip-kl-bound NATS] [--clip-quantile Q] [--clip-ratio R]\n"
"         [--damp F] [--desc-act] [--threads T] [--quiet] [--help] [--version]\n"
"\n"
"Writes DIR/model.safetensors (AWQ GEMM packing, or GPTQ v1 with --method gptq,\n"
"when the group size does not divide an input width, or when the recipe makes\n"
"8-bit per-channel modules (GPTQ bits=8, declared in GPTQModel's `dynamic`):\n"
"--format auto), DIR/config.json with quantization_config, and the tokenizer\n"
"files. DeepSeek-V2/V3 (deepseek2) HF sources: --method rtn only.\n"
"Calibration: n = ceil(2 ln(2/delta) / eps^2) samples (defaults eps 0.25,\n"
"delta 0.1: 96); fewer is refused unless --force. See docs/quantization.md.\n");
}

static int num(const char *flag, const char *v, double lo, double hi, double *out)
{
    char *end = NULL;
    double x = v ? strtod(v, &end) : 0;
    if (!v || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "dsq-quantize: %s needs a number in [%g, %g]\n", flag, lo, hi);
        return DSQ_EINVAL;
    }
    *out = x;
    return DSQ_OK;
}

int main(int argc, char **argv)
{
    dsq_qrun_opts_t o = {0};
    int rc = 0;
    for (int i = 1; i < argc && rc == 0; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double x = 0;
        if (strcmp(a, "--version") == 0) {
            printf("dsq-quantize %s\n", DSQ_VERSION);
            return 0;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--sym") == 0) {
            o.sym = true;
        } else if (strcmp(a, "--force") == 0) {
            o.force = true;
        } else if (strcmp(a, "--search") == 0) {
            o.search = true;
        } else if (strcmp(a, "--desc-act") == 0) {
            o.desc_act = true;
        } else if (strcmp(a, "--quiet") == 0) {
            o.quiet = true;
        } else if (!v) {
            fprintf(stderr, "dsq-quantize: unknown option or missing value: %s\n", a);
            rc = 2;
        } else {
            i++;
            if (strcmp(a, "--model") == 0) o.model = v;
            else if (strcmp(a, "--tokenizer") == 0) o.tokenizer = v;
            else if (strcmp(a, "--out") == 0) o.out_dir = v;
            else if (strcmp(a, "--method") == 0) o.method = v;
            else if (strcmp(a, "--format") == 0) o.format = v;
            else if (strcmp(a, "--calib") == 0) o.calib = v;
            else if (strcmp(a, "--recipe") == 0) {
                if (dsq_quantizer_recipe_parse(v, &o.recipe)) {
                    fprintf(stderr, "dsq-quantize: --recipe must be default or deepseek-moe\n");
                    rc = 2;
                }
            }
            else if (strcmp(a, "--w-bit") == 0) rc = num(a, v, 1, 8, &x), o.w_bit = (int)x;
            else if (strcmp(a, "--group-size") == 0) rc = num(a, v, 1, 4096, &x), o.group_size = (int)x;
            else if (strcmp(a, "--calib-samples") == 0) rc = num(a, v, 1, 1e7, &x), o.calib_samples = (int)x;
            else if (strcmp(a, "--calib-seq-len") == 0) rc = num(a, v, 2, 1e6, &x), o.calib_seq_len = (int)x;
            else if (strcmp(a, "--calib-rows") == 0) rc = num(a, v, 1, 1e7, &x), o.calib_rows = (int)x;
            else if (strcmp(a, "--calib-epsilon") == 0) rc = num(a, v, 1e-9, 1, &o.calib_eps);
            else if (strcmp(a, "--calib-delta") == 0) rc = num(a, v, 1e-12, 1, &o.calib_delta);
            else if (strcmp(a, "--search-max-bpw") == 0) rc = num(a, v, 1, 32, &o.search_max_bpw);
            else if (strcmp(a, "--bandwidth-gbs") == 0) rc = num(a, v, 1e-3, 1e6, &o.bw_gbs);
            else if (strcmp(a, "--awq-grid") == 0) rc = num(a, v, 1, 1000, &x), o.awq_grid = (int)x;
            else if (strcmp(a, "--clip-grid") == 0) rc = num(a, v, 1, 1000, &x), o.q.clip_grid = (int)x;
            else if (strcmp(a, "--clip-min-ratio") == 0) rc = num(a, v, 0.01, 1, &x), o.q.clip_min_ratio = (float)x;
            else if (strcmp(a, "--clip-kl-bound") == 0) rc = num(a, v, 0, 100, &o.q.clip_kl_bound);
            else if (strcmp(a, "--clip-quantile") == 0) rc = num(a, v, 0, 1, &o.q.clip_quantile);
            else if (strcmp(a, "--clip-ratio") == 0) rc = num(a, v, 0, 1000, &o.q.clip_ratio);
            else if (strcmp(a, "--damp") == 0) rc = num(a, v, 0, 10, &o.gptq_damp);
            else if (strcmp(a, "--threads") == 0) {
                rc = num(a, v, 1, 4096, &x);
                if (!rc)
                    omp_set_num_threads((int)x), dsq_cpu_set_threads((int)x);
            } else {
                fprintf(stderr, "dsq-quantize: unknown option %s (see --help)\n", a);
                rc = 2;
            }
            if (rc < 0)
                rc = 2;
        }
    }
    if (rc)
        return rc;
    if (!o.model || !o.out_dir) {
        usage(stderr);
        return 2;
    }
    dsq_log_set_level(getenv("DSQ_LOG_LEVEL") ? getenv("DSQ_LOG_LEVEL") : "warn");
    char err[1024] = "";
    rc = dsq_quantizer_run(&o, err, sizeof(err));
    if (rc) {
        fprintf(stderr, "dsq-quantize: %s\n", err);
        return 1;
    }
    return 0;
}
