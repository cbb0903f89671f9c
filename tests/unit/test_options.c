/* tests for server/options.c: defaults, the precedence flags > env >
 * config file > defaults, every value type, bounds, and the errors for
 * unknown or malformed options. The environment is a fake lookup table. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "server/options.h"

static const char *const *fake_env;

static const char *env_lookup(const char *name)
{
    for (const char *const *e = fake_env; e && e[0]; e += 2)
        if (!strcmp(e[0], name))
            return e[1];
    return NULL;
}

static char cfg_path[64];

static void write_config(const char *json)
{
    int fd;
    snprintf(cfg_path, sizeof(cfg_path), "/tmp/dsq_test_options_XXXXXX");
    fd = mkstemp(cfg_path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
}

static int load(dsq_options_t *o, char **argv, int argc, char *err)
{
    return dsq_options_load(o, argc, argv, env_lookup, err, 256);
}

static void test_defaults(void **state)
{
    dsq_options_t o;
    char err[256];
    char *argv[] = {"dsqd"};
    (void)state;
    fake_env = NULL;
    assert_int_equal(load(&o, argv, 1, err), 0);
    assert_string_equal(o.host, "127.0.0.1");
    assert_int_equal(o.port, 8000);
    assert_null(o.model);
    assert_null(o.api_key);
    assert_int_equal(o.max_request_bytes, 1048576);   /* 1 MiB */
    assert_int_equal(o.block_size, 16);
    assert_string_equal(o.kv_cache_dtype, "auto");
    assert_string_equal(o.dtype, "auto");
    assert_string_equal(o.device, "auto");
    assert_false(o.enable_prefix_caching);
    assert_false(o.plan);
    dsq_options_deinit(&o);
}

static void test_precedence(void **state)
{
    dsq_options_t o;
    char err[256];
    const char *env[] = {"DSQ_PORT", "9001", "DSQ_API_KEY", "envkey",
                         "DSQ_BLOCK_SIZE", "32", NULL};
    (void)state;
    write_config("{\"port\": 9000, \"block-size\": 8, \"max_num_seqs\": 7,"
                 " \"enable-prefix-caching\": true, \"model\": \"cfg.gguf\","
                 " \"host\": \"0.0.0.0\", \"memory-limit\": \"2GiB\"}");
    fake_env = env;
    {
        /* config only < env < flags, each key set at a different level */
        char *argv[] = {"dsqd", "--config", cfg_path, "--block-size", "64",
                        "--model=flag.gguf"};
        assert_int_equal(load(&o, argv, 6, err), 0);
        assert_int_equal(o.port, 9001);              /* env beats config  */
        assert_int_equal(o.block_size, 64);          /* flag beats env    */
        assert_int_equal(o.max_num_seqs, 7);         /* config beats default */
        assert_true(o.enable_prefix_caching);
        assert_string_equal(o.model, "flag.gguf");   /* flag beats config */
        assert_string_equal(o.host, "0.0.0.0");
        assert_string_equal(o.api_key, "envkey");
        assert_int_equal(o.memory_limit, 2147483648LL);
        assert_string_equal(o.config, cfg_path);
        dsq_options_deinit(&o);
    }
    {
        /* DSQ_CONFIG names the file when no flag does */
        const char *env2[] = {"DSQ_CONFIG", cfg_path, NULL};
        char *argv[] = {"dsqd"};
        fake_env = env2;
        assert_int_equal(load(&o, argv, 1, err), 0);
        assert_int_equal(o.port, 9000);
        dsq_options_deinit(&o);
    }
    unlink(cfg_path);
    fake_env = NULL;
}

static void test_types(void **state)
{
    dsq_options_t o;
    char err[256];
    char *argv[] = {"dsqd", "--enable-prefix-caching", "--plan=false",
                    "--gpu-memory-utilization", "0.5", "--kv-cache-dtype",
                    "INT8", "--max-request-bytes", "64KiB", "--shutdown-timeout",
                    "2.5", "--allowed-origins", "*", "--served_model_name", "x",
                    "--dtype", "BFloat16"};
    (void)state;
    fake_env = NULL;
    assert_int_equal(load(&o, argv, 17, err), 0);
    assert_string_equal(o.dtype, "bfloat16");
    assert_true(o.enable_prefix_caching);
    assert_false(o.plan);
    assert_true(o.gpu_memory_utilization == 0.5);
    assert_string_equal(o.kv_cache_dtype, "int8");
    assert_int_equal(o.max_request_bytes, 65536);
    assert_true(o.shutdown_timeout == 2.5);
    assert_string_equal(o.allowed_origins, "*");
    assert_string_equal(o.served_model_name, "x");
    dsq_options_deinit(&o);
}

static void expect_fail(char **argv, int argc, const char *const *env,
                        const char *needle)
{
    dsq_options_t o;
    char err[256] = "";
    fake_env = env;
    assert_int_equal(load(&o, argv, argc, err), DSQ_EINVAL);
    if (!strstr(err, needle))
        fail_msg("error '%s' does not mention '%s'", err, needle);
    dsq_options_deinit(&o);
    fake_env = NULL;
}

static void test_errors(void **state)
{
    (void)state;
    {
        char *a[] = {"dsqd", "--bogus"};
        expect_fail(a, 2, NULL, "--bogus");
    }
    {
        char *a[] = {"dsqd", "--port"};
        expect_fail(a, 2, NULL, "--port");
    }
    {
        char *a[] = {"dsqd", "--dtype", "fp8"};
        expect_fail(a, 3, NULL, "auto|float16|half|bfloat16|float32|float");
    }
    {
        char *a[] = {"dsqd", "--port", "70000"};
        expect_fail(a, 3, NULL, "range");
        expect_fail(a, 3, NULL, "[0, 65535]");   /* the range itself */
    }
    {
        /* contradictory n-gram sizes are refused at parse time */
        char *a[] = {"dsqd", "--speculative-ngram-min", "5", "--speculative-ngram-max", "3"};
        expect_fail(a, 5, NULL, "--speculative-ngram-min 5 is above --speculative-ngram-max 3");
        char *b[] = {"dsqd", "--speculative-ngram-min", "5"};   /* max 4 by default */
        expect_fail(b, 3, NULL, "above --speculative-ngram-max 4");
        /* one proposer at a time; an empty draft path is none */
        char *c[] = {"dsqd", "--draft-model", "d.gguf", "--speculative-ngram", "3"};
        expect_fail(c, 5, NULL, "two proposers");
        char *d[] = {"dsqd", "--speculative-mtp", "--draft-model", "d.gguf"};
        expect_fail(d, 4, NULL, "--speculative-mtp and --draft-model are two proposers");
        char *e[] = {"dsqd", "--speculative-mtp", "--speculative-ngram", "2"};
        expect_fail(e, 4, NULL, "--speculative-mtp and --speculative-ngram");
        dsq_options_t o;
        char err[256];
        char *f[] = {"dsqd", "--draft-model", "", "--speculative-ngram", "3"};
        assert_int_equal(load(&o, f, 5, err), DSQ_OK);
        dsq_options_deinit(&o);
    }
    {
        /* an origin as a browser sends it: no path, no trailing slash */
        char *a[] = {"dsqd", "--allowed-origins", "http://a.example, http://b.example/"};
        expect_fail(a, 3, NULL, "'http://b.example/' is not an origin");
        char *b[] = {"dsqd", "--allowed-origins", "localhost:3000"};
        expect_fail(b, 3, NULL, "'localhost:3000' is not an origin");
        char *c[] = {"dsqd", "--allowed-origins", "http://a.example/ui"};
        expect_fail(c, 3, NULL, "no path");
    }
    {
        dsq_options_t o;
        char err[256];
        char *a[] = {"dsqd", "--allowed-origins", " http://a.example ,https://b.example:3000,*"};
        assert_int_equal(load(&o, a, 3, err), 0);
        dsq_options_deinit(&o);
    }
    {
        /* K is 1000: the message says how many bytes that was, and the range */
        char *a[] = {"dsqd", "--max-undelivered-bytes", "4K"};
        expect_fail(a, 3, NULL, "4K (4000 bytes) out of range [4096, 1073741824] bytes");
    }
    {
        char *a[] = {"dsqd", "--port", "80x"};
        expect_fail(a, 3, NULL, "integer");
    }
    {
        char *a[] = {"dsqd", "--device", "tpu"};
        expect_fail(a, 3, NULL, "auto|cpu|cuda");
    }
    {
        char *a[] = {"dsqd", "--gpu-memory-utilization", "1.5"};
        expect_fail(a, 3, NULL, "range");
    }
    {
        char *a[] = {"dsqd", "--enable-prefix-caching=maybe"};
        expect_fail(a, 2, NULL, "true or false");
    }
    {
        char *a[] = {"dsqd", "--memory-limit", "12 parsecs"};
        expect_fail(a, 3, NULL, "byte size");
    }
    {
        /* one positional MODEL; a second word is an error */
        char *a[] = {"dsqd", "m.gguf", "stray"};
        expect_fail(a, 3, NULL, "stray");
    }
    {
        char *a[] = {"dsqd", "m.gguf", "--model", "n.gguf"};
        expect_fail(a, 4, NULL, "twice");
    }
    {
        /* either order: a word after --model's value is a second model */
        char *a[] = {"dsqd", "-m", "m.gguf", "n.gguf", "--plan"};
        expect_fail(a, 5, NULL, "n.gguf and --model");
    }
    {
        char *a[] = {"dsqd", "-x"};
        expect_fail(a, 2, NULL, "-x");
    }
    {
        char *a[] = {"dsqd", "--seed", "-2"};
        expect_fail(a, 3, NULL, "--seed");
    }
    {
        const char *env[] = {"DSQ_PORT", "http", NULL};
        char *a[] = {"dsqd"};
        expect_fail(a, 1, env, "DSQ_PORT");
    }
    {
        /* --quantize reads DSQ_QUANTIZE, as every option DSQ_<NAME> */
        const char *env[] = {"DSQ_QUANTIZE", "int3", NULL};
        char *a[] = {"dsqd"};
        expect_fail(a, 1, env, "DSQ_QUANTIZE");
    }
    {
        char *a[] = {"dsqd", "--config", "/nonexistent/dsqd.json"};
        expect_fail(a, 3, NULL, "/nonexistent/dsqd.json");
    }
    {
        char *a[] = {"dsqd", "--config", cfg_path};
        write_config("{\"prot\": 1}");
        expect_fail(a, 3, NULL, "prot");
        unlink(cfg_path);
        write_config("{\"port\": \"eighty\"}");
        expect_fail(a, 3, NULL, "port");
        unlink(cfg_path);
        write_config("{\"model\": 5}");
        expect_fail(a, 3, NULL, "model");
        unlink(cfg_path);
        write_config("[1]");
        expect_fail(a, 3, NULL, "object");
        unlink(cfg_path);
        /* the config file is strict JSON too (RFC 8259), and a
         * key set twice is an error, not "the first one wins"; the one
         * line names the key and where (byte 0-based, line:column) */
        write_config("{\"port\": 9000,\n \"port\": 9001}");
        expect_fail(a, 3, NULL, "duplicate key \"port\" at byte 16 (line 2, column 2)");
        unlink(cfg_path);
        write_config("{\"port\": 09000}");
        expect_fail(a, 3, NULL, "at byte 10 (line 1, column 11)");
        unlink(cfg_path);
        write_config("{\"port\": 9000,}");
        expect_fail(a, 3, NULL, "at byte 15 (line 1, column 16)");
        unlink(cfg_path);
    }
}

/* users: the llama-server / vLLM spellings: positional MODEL, -m, -c,
 * --ctx-size, -t, --seed (and its -1 default) */
static void test_aliases(void **state)
{
    dsq_options_t o;
    char err[256];
    (void)state;
    fake_env = NULL;
    {
        char *argv[] = {"dsqd", "model.gguf", "-c", "4096", "-t", "3", "--seed", "42"};
        assert_int_equal(load(&o, argv, 8, err), 0);
        assert_string_equal(o.model, "model.gguf");
        assert_int_equal(o.max_model_len, 4096);
        assert_int_equal(o.threads, 3);
        assert_int_equal(o.seed, 42);
        dsq_options_deinit(&o);
    }
    {
        char *argv[] = {"dsqd", "--port", "9", "-m", "x.gguf", "--ctx-size=2048"};
        assert_int_equal(load(&o, argv, 6, err), 0);
        assert_string_equal(o.model, "x.gguf");
        assert_int_equal(o.max_model_len, 2048);
        assert_int_equal(o.seed, -1);
        assert_int_equal(o.port, 9);
        dsq_options_deinit(&o);
    }
    {
        /* `--bool false` is the flag's value, not a positional MODEL */
        char *argv[] = {"dsqd", "--enable-prefix-caching", "false", "--model", "m.gguf",
                        "--plan", "yes"};
        assert_int_equal(load(&o, argv, 7, err), 0);
        assert_false(o.enable_prefix_caching);
        assert_true(o.plan);
        assert_string_equal(o.model, "m.gguf");
        dsq_options_deinit(&o);
    }
    {
        /* a value that looks like a word after a flag is the flag's, not MODEL */
        char *argv[] = {"dsqd", "--served-model-name", "smol", "m.gguf"};
        assert_int_equal(load(&o, argv, 4, err), 0);
        assert_string_equal(o.served_model_name, "smol");
        assert_string_equal(o.model, "m.gguf");
        dsq_options_deinit(&o);
    }
}

static void test_bytes(void **state)
{
    int64_t v = -1;
    (void)state;
    assert_int_equal(dsq_options_parse_bytes("0", &v), 0);
    assert_int_equal(v, 0);
    assert_int_equal(dsq_options_parse_bytes("1MiB", &v), 0);
    assert_int_equal(v, 1048576);
    assert_int_equal(dsq_options_parse_bytes("1M", &v), 0);
    assert_int_equal(v, 1000000);
    assert_int_equal(dsq_options_parse_bytes("1.5gib", &v), 0);
    assert_int_equal(v, 1610612736LL);
    assert_int_equal(dsq_options_parse_bytes("3T", &v), 0);
    assert_int_equal(v, 3000000000000LL);
    assert_int_equal(dsq_options_parse_bytes("-1", &v), DSQ_EINVAL);
    assert_int_equal(dsq_options_parse_bytes("1X", &v), DSQ_EINVAL);
    assert_int_equal(dsq_options_parse_bytes("", &v), DSQ_EINVAL);
    assert_int_equal(dsq_options_parse_bytes("0.5", &v), DSQ_EINVAL);
}

static void test_help(void **state)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    (void)state;
    dsq_options_help(f);
    fclose(f);
    /* every option the spec lists appears, with its env name */
    static const char *names[] = {
        "--host", "--port", "--model", "--tokenizer", "--served-model-name",
        "--max-model-len", "--max-num-seqs", "--max-num-batched-tokens",
        "--gpu-memory-utilization", "--api-key", "--kv-cache-dtype",
        "--block-size", "--enable-prefix-caching", "--max-request-bytes",
        "--max-waiting-requests", "--shutdown-timeout", "--request-timeout",
        "--timeout-keep-alive", "--max-seqs-per-request",   /* api */
        "--header-timeout", "--body-timeout", "--max-connections",  /* hardening */
        "--max-connections-per-client", "--http-threads",
        "--threads", "--device", "--quantize", "--group-size", "--activation-dtype", "--dtype",
        "--memory-limit", "--kv-cache-memory", "--log-level",
        "--ssl-certfile", "--ssl-keyfile", "--allowed-origins",
        "--chat-template", "--config", "--plan", "--help", "--version",
        "DSQ_API_KEY", "DSQ_MAX_REQUEST_BYTES", "DSQ_QUANTIZE", "DSQ_SEED",
        "-m, --model", "-c, --ctx-size, --max-model-len", "-t, --threads", "--seed"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strstr(buf, names[i]))
            fail_msg("--help lacks %s", names[i]);
    free(buf);
}

/* The example config in config/ must stay loadable. */
static void test_example_config(void **state)
{
    dsq_options_t o;
    char err[256] = "", path[4096];
    const char *root = getenv("DSQ_SOURCE_ROOT");
    (void)state;
    if (!root)
        fail_msg("DSQ_SOURCE_ROOT is not set (run through meson test)");
    snprintf(path, sizeof(path), "%s/config/dsqd.json", root);
    {
        char *argv[] = {"dsqd", "--config", path};
        fake_env = NULL;
        if (load(&o, argv, 3, err))
            fail_msg("%s: %s", path, err);
    }
    assert_int_equal(o.port, 8000);
    assert_int_equal(o.max_request_bytes, 1048576);
    dsq_options_deinit(&o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_aliases),
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_help),
        cmocka_unit_test(test_example_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
