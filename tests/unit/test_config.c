/* test_config.c — the YAML configuration (src/config/config.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "config/config.h"

/* Loads yaml over fresh defaults, expects failure, checks that the message
 * contains want and that the configuration did not change. */
static void expect_error(const char *yaml, const char *want) {
    ks_config c, before;
    ks_config_defaults(&c);
    before = c;
    char err[256] = "";
    int rc = ks_config_load_string(&c, yaml, err, sizeof err);
    if (rc != KS_EINVAL || !strstr(err, want))
        fail_msg("yaml:\n%s\nrc %d (%s), message \"%s\", wanted it to contain \"%s\"", yaml, rc,
                 ks_errname(rc), err, want);
    assert_memory_equal(&c, &before, sizeof c);
}

static void load_ok(ks_config *c, const char *yaml) {
    char err[256] = "";
    int rc = ks_config_load_string(c, yaml, err, sizeof err);
    if (rc != 0) fail_msg("yaml:\n%s\nrc %d: %s", yaml, rc, err);
}

/* media: the limits on images and audio, their defaults, ranges and key paths. */
static void test_media_limits(void **state) {
    (void)state;
    ks_config c;
    ks_config_defaults(&c);
    assert_int_equal(c.media.max_bytes, 10 << 20);
    assert_int_equal(c.media.max_items, 32);
    assert_int_equal(c.media.max_total_bytes, 32 << 20);
    assert_int_equal(c.media.max_pixels, 16 << 20);
    load_ok(&c, "media:\n  max_bytes: 2MiB\n  max_items: 4\n  max_total_bytes: 3MiB\n  max_pixels: 1000000\n");
    assert_int_equal(c.media.max_bytes, 2 << 20);
    assert_int_equal(c.media.max_items, 4);
    assert_int_equal(c.media.max_total_bytes, 3 << 20);
    assert_int_equal(c.media.max_pixels, 1000000);
    expect_error("media:\n  max_item: 4\n", "unknown key 'media.max_item' at line 2");
    expect_error("media:\n  max_items: 0\n", "'media.max_items' at line 2");
    expect_error("media:\n  max_bytes: 2GiB\n", "'media.max_bytes' at line 2");
    /* Images by URL: off by default. */
    ks_config_defaults(&c);
    assert_string_equal(c.media.path, "");
    assert_string_equal(c.media.fetch_hosts, "");
    assert_int_equal(c.media.fetch_timeout_ms, 10000);
    assert_int_equal(c.media.fetch_max_redirects, 3);
    load_ok(&c, "media:\n  path: /srv/images\n  fetch_hosts: \"cdn.example.com, 127.0.0.1\"\n"
                "  fetch_timeout_ms: 2500\n  fetch_max_redirects: 0\n");
    assert_string_equal(c.media.path, "/srv/images");
    assert_string_equal(c.media.fetch_hosts, "cdn.example.com, 127.0.0.1");
    assert_int_equal(c.media.fetch_timeout_ms, 2500);
    assert_int_equal(c.media.fetch_max_redirects, 0);
    expect_error("media:\n  fetch_timeout_ms: 50\n", "'media.fetch_timeout_ms' at line 2");
    expect_error("media:\n  fetch_max_redirects: 11\n", "'media.fetch_max_redirects' at line 2");
}

/* ------------------------------------------------------------ defaults */
static void test_defaults(void **state) {
    (void)state;
    setenv("HOME", "/home/tester", 1);
    unsetenv("XDG_CACHE_HOME");
    ks_config c;
    ks_config_defaults(&c);
    assert_string_equal(c.model, "");
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 8080);
    assert_int_equal(c.slots, 4);
    assert_int_equal(c.ctx, 4096);
    assert_int_equal(c.batch, 512);
    assert_int_equal(c.threads, 0);
    assert_true(c.cache_prompt);
    assert_true(c.exact);
    assert_true(c.affinity_min > 0.0499f && c.affinity_min < 0.0501f);
    assert_string_equal(c.api_key, "");
    assert_int_equal(c.max_queue, 64);
    assert_int_equal(c.max_body_bytes, 16777216);
    assert_string_equal(c.log, "info");
    assert_false(c.cache.system_prompt_cache);
    assert_false(c.cache.incremental_cache);
    assert_int_equal(c.cache.cache_min_tokens, 100);
    assert_int_equal(c.cache.slots, 0);
    assert_int_equal(c.cache.spc_max_bytes, 268435456);
    assert_false(c.store.enabled);
    assert_string_equal(c.store.cache_dir, "/home/tester/.cache/kvstash");
    char shm[64];
    snprintf(shm, sizeof shm, "/dev/shm/kvstash-%u", (unsigned)getuid());
    assert_string_equal(c.store.shm_dir, shm);
    assert_int_equal(c.store.stride, 256);
    assert_int_equal(c.store.continued_interval, 512);
    assert_int_equal(c.store.min_tokens, 256);
    assert_int_equal(c.store.shutdown_timeout_ms, 5000);
    assert_int_equal(c.store.tier_max_bytes[KS_TIER_RAM], 2147483648LL); /* --cache-ram 2048 */
    assert_int_equal(c.store.tier_max_bytes[KS_TIER_SHM], 1073741824LL);
    assert_int_equal(c.store.tier_max_bytes[KS_TIER_DISK], 10737418240LL);
    assert_int_equal(c.store.reason_tier[KS_REASON_COLD], KS_TIER_DISK);
    assert_int_equal(c.store.reason_tier[KS_REASON_CONTINUED], KS_TIER_SHM);
    assert_int_equal(c.store.reason_tier[KS_REASON_FINISH], KS_TIER_SHM);
    assert_int_equal(c.store.reason_tier[KS_REASON_EVICT], KS_TIER_DISK);
    assert_int_equal(c.store.reason_tier[KS_REASON_SHUTDOWN], KS_TIER_DISK);
    assert_int_equal(c.store.reason_tier[KS_REASON_PIN], KS_TIER_DISK);
    assert_true(c.store.pin_share == 0.5f);
    assert_string_equal(c.store.redis.url, "");
    assert_true(c.store.redis.tls.verify);
    assert_string_equal(c.store.redis.tls.ca_file, "");
    assert_string_equal(c.store.redis.tls.server_name, "");
    assert_int_equal(c.n_models, 0);

    setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
    ks_config_defaults(&c);
    assert_string_equal(c.store.cache_dir, "/tmp/xdg/kvstash");
    setenv("XDG_CACHE_HOME", "relative/dir", 1); /* invalid per the XDG spec: ignored */
    ks_config_defaults(&c);
    assert_string_equal(c.store.cache_dir, "/home/tester/.cache/kvstash");
    unsetenv("XDG_CACHE_HOME");
}

/* ------------------------------------------------------------ a full file */
static const char k_full_yaml[] =
    "# every key\n"
    "model: ~/models/qwen.gguf\n"
    "host: 0.0.0.0\n"
    "port: 9090\n"
    "slots: 8\n"
    "ctx: 8192\n"
    "batch: 1024\n"
    "threads: 6\n"
    "cache_prompt: false\n"
    "exact: false\n"
    "affinity_min: 0.25\n"
    "api_key: \"s3cret\"\n"
    "max_queue: 7\n"
    "max_body_bytes: 1MiB\n"
    "log: debug\n"
    "models:\n"
    "  default:\n"
    "    system_prompt_cache: true\n"
    "    cache_min_tokens: 50\n"
    "    spc_max_bytes: 64MiB\n"
    "  Qwen3-8B-Q8_0:\n"
    "    incremental_cache: true\n"
    "    cache_min_tokens: 200\n"
    "    slots: 3\n"
    "store:\n"
    "  cache_dir: $HOME/kv\n"
    "  shm_dir: /dev/shm/kv-${USER}\n"
    "  stride: 128\n"
    "  continued_interval: 1024\n"
    "  min_tokens: 64\n"
    "  shutdown_timeout_ms: 250\n"
    "  pin_share: 0.25\n"
    "  tiers:\n"
    "    ram:  { max_bytes: 512M }\n"
    "    shm:  { max_bytes: 2GiB }\n"
    "    disk: { max_bytes: 0 }\n"
    "  reasons: { cold: ram, continued: disk, finish: none, evict: shm, shutdown: disk, pin: shm }\n";

static void test_full_file(void **state) {
    (void)state;
    setenv("HOME", "/home/tester", 1);
    setenv("USER", "tester", 1);
    char dir[] = "/tmp/ks_test_config_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/kvstash.yaml", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(k_full_yaml, f);
    fclose(f);

    ks_config c;
    ks_config_defaults(&c);
    char err[256] = "";
    int rc = ks_config_load_file(&c, path, err, sizeof err);
    if (rc) fail_msg("load_file: %d %s", rc, err);
    assert_string_equal(c.model, "/home/tester/models/qwen.gguf");
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.port, 9090);
    assert_int_equal(c.slots, 8);
    assert_int_equal(c.ctx, 8192);
    assert_int_equal(c.batch, 1024);
    assert_int_equal(c.threads, 6);
    assert_false(c.cache_prompt);
    assert_false(c.exact);
    assert_true(c.affinity_min > 0.2499f && c.affinity_min < 0.2501f);
    assert_string_equal(c.api_key, "s3cret");
    assert_int_equal(c.max_queue, 7);
    assert_int_equal(c.max_body_bytes, 1048576);
    assert_string_equal(c.log, "debug");
    assert_int_equal(c.n_models, 2);
    assert_string_equal(c.model_keys[0], "default");
    assert_true(c.models[0].system_prompt_cache);
    assert_false(c.models[0].incremental_cache);
    assert_int_equal(c.models[0].cache_min_tokens, 50);
    assert_int_equal(c.models[0].spc_max_bytes, 64LL << 20);
    assert_false(c.model_has_slots[0]);
    assert_string_equal(c.model_keys[1], "Qwen3-8B-Q8_0");
    assert_true(c.models[1].incremental_cache);
    assert_int_equal(c.models[1].cache_min_tokens, 200);
    assert_int_equal(c.models[1].slots, 3);
    assert_int_equal(c.models[1].spc_max_bytes, 256LL << 20); /* untouched: default */
    assert_true(c.model_has_slots[1]);
    assert_true(c.store.enabled); /* store keys given, enabled not: on */
    assert_string_equal(c.store.cache_dir, "/home/tester/kv");
    assert_string_equal(c.store.shm_dir, "/dev/shm/kv-tester");
    assert_int_equal(c.store.stride, 128);
    assert_int_equal(c.store.continued_interval, 1024);
    assert_int_equal(c.store.min_tokens, 64);
    assert_int_equal(c.store.shutdown_timeout_ms, 250);
    assert_int_equal(c.store.tier_max_bytes[KS_TIER_RAM], 512LL << 20);
    assert_int_equal(c.store.tier_max_bytes[KS_TIER_SHM], 2LL << 30);
    assert_int_equal(c.store.tier_max_bytes[KS_TIER_DISK], 0);
    assert_int_equal(c.store.reason_tier[KS_REASON_COLD], KS_TIER_RAM);
    assert_int_equal(c.store.reason_tier[KS_REASON_CONTINUED], KS_TIER_DISK);
    assert_int_equal(c.store.reason_tier[KS_REASON_FINISH], KS_TIER_NONE);
    assert_int_equal(c.store.reason_tier[KS_REASON_EVICT], KS_TIER_SHM);
    assert_int_equal(c.store.reason_tier[KS_REASON_SHUTDOWN], KS_TIER_DISK);
    assert_int_equal(c.store.reason_tier[KS_REASON_PIN], KS_TIER_SHM);
    assert_true(c.store.pin_share == 0.25f);

    /* the same text from a string gives the same configuration */
    ks_config d;
    ks_config_defaults(&d);
    load_ok(&d, k_full_yaml);
    assert_memory_equal(&c, &d, sizeof c);

    /* an error in a file names the file, the line and the key */
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("port: 80\nstore:\n  tiers:\n    ram: { maxbytes: 1 }\n", f);
    fclose(f);
    rc = ks_config_load_file(&c, path, err, sizeof err);
    assert_int_equal(rc, KS_EINVAL);
    assert_non_null(strstr(err, path));
    assert_non_null(strstr(err, "unknown key 'store.tiers.ram.maxbytes' at line 4"));
    assert_int_equal(c.port, 9090); /* all or nothing */
    unlink(path);
    rmdir(dir);

    rc = ks_config_load_file(&c, path, err, sizeof err);
    assert_int_equal(rc, KS_ENOENT);
    assert_non_null(strstr(err, path));
}

/* store.tiers.redis.tls: a nested mapping of paths (expanded), a name and
 * verify; unknown keys and wrong types name the key path. Whether the
 * settings fit together (rediss://, files) is checked above this layer
 * (cmd_serve.c with ks_redis_cfg_prepare). */
static void test_redis_tls(void **state) {
    (void)state;
    setenv("HOME", "/home/tester", 1);
    ks_config c;
    ks_config_defaults(&c);
    load_ok(&c, "store:\n"
                "  tiers:\n"
                "    redis:\n"
                "      url: rediss://:pw@redis.internal:6380/2\n"
                "      tls:\n"
                "        ca_file: ~/tls/ca.pem\n"
                "        ca_dir: /etc/ssl/certs\n"
                "        cert_file: $HOME/tls/client.pem\n"
                "        key_file: /etc/kvstash/client.key\n"
                "        server_name: redis.example.org\n"
                "        verify: false\n");
    assert_string_equal(c.store.redis.url, "rediss://:pw@redis.internal:6380/2");
    assert_string_equal(c.store.redis.tls.ca_file, "/home/tester/tls/ca.pem");
    assert_string_equal(c.store.redis.tls.ca_dir, "/etc/ssl/certs");
    assert_string_equal(c.store.redis.tls.cert_file, "/home/tester/tls/client.pem");
    assert_string_equal(c.store.redis.tls.key_file, "/etc/kvstash/client.key");
    assert_string_equal(c.store.redis.tls.server_name, "redis.example.org");
    assert_false(c.store.redis.tls.verify);
    /* A later file changes only what it names. */
    load_ok(&c, "store: { tiers: { redis: { tls: { verify: true } } } }\n");
    assert_true(c.store.redis.tls.verify);
    assert_string_equal(c.store.redis.tls.ca_file, "/home/tester/tls/ca.pem");
    expect_error("store:\n  tiers:\n    redis:\n      tls: { cafile: x }\n", "unknown key 'store.tiers.redis.tls.cafile'");
    expect_error("store:\n  tiers:\n    redis:\n      tls: { verify: 2 }\n", "'store.tiers.redis.tls.verify' at line 4");
    expect_error("store:\n  tiers:\n    redis:\n      tls: { ca_file: \"\" }\n", "'store.tiers.redis.tls.ca_file'");
    expect_error("store:\n  tiers:\n    redis:\n      tls: [ca.pem]\n", "'store.tiers.redis.tls' at line 4");
}

static void test_empty_and_layered_loads(void **state) {
    (void)state;
    ks_config c, d;
    ks_config_defaults(&c);
    d = c;
    load_ok(&c, "");
    load_ok(&c, "# only a comment\n");
    assert_memory_equal(&c, &d, sizeof c);
    /* later loads apply over earlier ones */
    load_ok(&c, "port: 1234\nmodels:\n  m: { cache_min_tokens: 5 }\n");
    load_ok(&c, "slots: 2\nmodels:\n  m: { slots: 9 }\n");
    assert_int_equal(c.port, 1234);
    assert_int_equal(c.slots, 2);
    assert_int_equal(c.n_models, 1);
    assert_int_equal(c.models[0].cache_min_tokens, 5);
    assert_int_equal(c.models[0].slots, 9);
    assert_true(c.model_has_slots[0]);
    /* quoted numbers and YAML 1.1 booleans are read by their text */
    load_ok(&c, "port: \"8081\"\ncache_prompt: no\n");
    assert_int_equal(c.port, 8081);
    assert_false(c.cache_prompt);
    assert_true(c.exact); /* untouched by a layer that does not name it */
}

/* ------------------------------------------------------------ CORS */
static void test_cors_origins(void **state) {
    (void)state;
    ks_config c, d;
    ks_config_defaults(&c);
    assert_int_equal(c.n_cors_origins, 0); /* off by default */
    load_ok(&c, "cors_origins:\n  - http://localhost:5173\n  - \"*\"\n  - https://chat.example.com:8443\n");
    assert_int_equal(c.n_cors_origins, 3);
    assert_string_equal(c.cors_origins[0], "http://localhost:5173");
    assert_string_equal(c.cors_origins[1], "*");
    assert_string_equal(c.cors_origins[2], "https://chat.example.com:8443");
    /* a later file replaces the list whole; one origin may be a scalar */
    load_ok(&c, "cors_origins: http://127.0.0.1:3000\n");
    assert_int_equal(c.n_cors_origins, 1);
    assert_string_equal(c.cors_origins[0], "http://127.0.0.1:3000");
    assert_string_equal(c.cors_origins[1], "");
    /* the same list from another path compares equal byte for byte */
    ks_config_defaults(&d);
    load_ok(&d, "cors_origins: [http://127.0.0.1:3000]\n");
    assert_memory_equal(&c, &d, sizeof c);
    load_ok(&c, "cors_origins: []\n");
    assert_int_equal(c.n_cors_origins, 0);

    expect_error("cors_origins: [http://localhost:5173/]\n", "'cors_origins[0]' at line 1: 'http://localhost:5173/' is "
                                                             "not an origin");
    expect_error("cors_origins:\n  - http://a.example\n  - localhost:5173\n",
                 "'cors_origins[1]' at line 3: 'localhost:5173' is not an origin");
    expect_error("cors_origins: [\"null\"]\n", "'cors_origins[0]' at line 1: the 'null' origin is refused");
    expect_error("cors_origins: [\"\"]\n", "'cors_origins[0]' at line 1: an empty origin");
    expect_error("cors_origins: [[http://a.example]]\n", "'cors_origins[0]' at line 1: expected an origin");
    expect_error("cors_origins: { a: b }\n", "'cors_origins' at line 1: expected a list of origins, got a mapping");
    expect_error("cors_origins: [a://1, a://2, a://3, a://4, a://5, a://6, a://7, a://8, a://9, a://10, a://11, "
                 "a://12, a://13, a://14, a://15, a://16, a://17]\n",
                 "'cors_origins' at line 1: at most 16 origins");
}

static void test_check_origin(void **state) {
    (void)state;
    static const char *const ok[] = {"*", "http://localhost", "http://localhost:5173", "https://x.example.com",
                                     "http://127.0.0.1:8080", "http://[::1]:3000", "chrome-extension://abcdef",
                                     "HTTP://LOCALHOST:5173"};
    static const char *const bad[] = {"", "null", "NULL", "localhost", "http://", "http:/x", "http://x/",
                                      "http://x/path", "http://x?q", "http://x#f", "http://a b", "http://a,http://b",
                                      "1http://x", "**", "http://h\xc3\xa9.example"};
    char why[256];
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (ks_config_check_origin(ok[i], why, sizeof why)) fail_msg("'%s' refused: %s", ok[i], why);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (ks_config_check_origin(bad[i], why, sizeof why) != KS_EINVAL) fail_msg("'%s' accepted", bad[i]);
    char longest[300];
    memset(longest, 'a', sizeof longest);
    memcpy(longest, "http://", 7);
    longest[KS_CONFIG_ORIGIN_MAX - 1] = '\0'; /* 255 bytes: fits */
    assert_int_equal(ks_config_check_origin(longest, why, sizeof why), 0);
    longest[KS_CONFIG_ORIGIN_MAX - 1] = 'a';
    longest[KS_CONFIG_ORIGIN_MAX] = '\0';
    assert_int_equal(ks_config_check_origin(longest, why, sizeof why), KS_EINVAL);
    assert_non_null(strstr(why, "longer than 255 bytes"));
    assert_int_equal(ks_config_check_origin(NULL, why, sizeof why), KS_EINVAL);
}

/* ------------------------------------------------------------ errors */
static void test_unknown_keys(void **state) {
    (void)state;
    expect_error("port: 8080\nprot: 1\n", "unknown key 'prot' at line 2");
    expect_error("store:\n  enabled: true\n  tiers:\n    ram:\n      max_bytes: 1\n"
                 "      maxbytes: 2\n",
                 "unknown key 'store.tiers.ram.maxbytes' at line 6");
    expect_error("store:\n  tiers:\n    nvme: { max_bytes: 1 }\n",
                 "unknown key 'store.tiers.nvme' at line 3");
    expect_error("store:\n  reasons:\n    warm: disk\n", "unknown key 'store.reasons.warm' at line 3");
    expect_error("store:\n  cachedir: /x\n", "unknown key 'store.cachedir' at line 2");
    expect_error("models:\n  default:\n    cache_min_token: 5\n",
                 "unknown key 'models.default.cache_min_token' at line 3");
    expect_error("port: 1\nport: 2\n", "duplicate key 'port' at line 2");
}

static void test_wrong_types(void **state) {
    (void)state;
    expect_error("host: h\n\nport: abc\n", "'port' at line 3: expected an integer 0..65535, got 'abc'");
    expect_error("slots: 2.5\n", "'slots' at line 1: expected an integer 1..256, got '2.5'");
    expect_error("cache_prompt: maybe\n", "'cache_prompt' at line 1: expected true or false, got 'maybe'");
    expect_error("affinity_min: lots\n", "'affinity_min' at line 1: expected a number 0..1");
    expect_error("host: [a, b]\n", "'host' at line 1: expected a non-empty string, got a sequence");
    expect_error("host: ''\n", "'host' at line 1: expected a non-empty string, got ''");
    expect_error("port: { a: 1 }\n", "'port' at line 1: expected an integer 0..65535, got a mapping");
    expect_error("models: [a]\n", "'models' at line 1: expected a mapping, got a sequence");
    expect_error("models:\n  default: 3\n", "'models.default' at line 2: expected a mapping, got '3'");
    expect_error("store:\n  tiers:\n    ram: 5\n", "'store.tiers.ram' at line 3: expected a mapping");
    expect_error("models:\n  default:\n    incremental_cache: 1x\n",
                 "'models.default.incremental_cache' at line 3: expected true or false");
    expect_error("store:\n  cache_dir:\n", "'store.cache_dir' at line 2: expected a path");
    expect_error("- 1\n- 2\n", "top level at line 1: expected a mapping");
    expect_error("port: [1\n", "YAML syntax error at line");
    expect_error("a: 1\n---\nb: 2\n", "second YAML document");
}

static void test_out_of_range(void **state) {
    (void)state;
    expect_error("port: -1\n", "'port' at line 1: expected an integer 0..65535, got '-1'");
    expect_error("port: 65536\n", "'port' at line 1: expected an integer 0..65535, got '65536'");
    expect_error("slots: 257\n", "'slots' at line 1: expected an integer 1..256");
    expect_error("ctx: 63\n", "'ctx' at line 1: expected an integer 64..16777216");
    expect_error("ctx: 99999999999999999999\n", "'ctx' at line 1: expected an integer 64..16777216");
    expect_error("batch: 1048577\n", "'batch' at line 1: expected an integer 1..1048576");
    expect_error("threads: -1\n", "'threads' at line 1: expected an integer 0..4096");
    /* The scheduler used to turn max_queue <= 0 into 64 silently: refused here
     * as by --max-queue (one range, KS_CONFIG_MAX_QUEUE_MIN..MAX). */
    expect_error("max_queue: 0\n", "'max_queue' at line 1: expected an integer 1..1000000, got '0'");
    expect_error("max_queue: -5\n", "'max_queue' at line 1: expected an integer 1..1000000");
    expect_error("max_queue: 1000001\n", "'max_queue' at line 1: expected an integer 1..1000000");
    expect_error("affinity_min: 1.5\n", "'affinity_min' at line 1: expected a number 0..1, got '1.5'");
    expect_error("models:\n  x:\n    cache_min_tokens: 10000001\n",
                 "'models.x.cache_min_tokens' at line 3: expected an integer 0..10000000");
    expect_error("models:\n  x:\n    slots: 0\n", "'models.x.slots' at line 3: expected an integer 1..256");
    expect_error("store:\n  tiers:\n    disk: { max_bytes: -1 }\n",
                 "'store.tiers.disk.max_bytes' at line 3: expected a byte size 0..1024TiB");
    expect_error("log: verbose\n", "'log' at line 1: expected one of debug|info|warn|error|off, got 'verbose'");
    expect_error("store:\n  pin_share: 1.01\n", "'store.pin_share' at line 2: expected a number 0..1, got '1.01'");
    expect_error("store:\n  pin_share: -0.5\n", "'store.pin_share' at line 2: expected a number 0..1");
    expect_error("store:\n  reasons: { cold: tape }\n",
                 "'store.reasons.cold' at line 2: expected one of ram|shm|disk|none, got 'tape'");
    expect_error("store:\n  shm_dir: $KS_SURELY_UNDEFINED_VAR/x\n",
                 "'store.shm_dir' at line 2: undefined variable $KS_SURELY_UNDEFINED_VAR");
}

static void test_size_suffixes(void **state) {
    (void)state;
    static const struct { const char *text; int64_t want; } ok[] = {
        {"268435456", 268435456}, {"0", 0},          {"256MiB", 256LL << 20},
        {"1GiB", 1LL << 30},      {"512M", 512LL << 20}, {"512m", 512LL << 20},
        {"4k", 4096},             {"4KiB", 4096},     {"2Gi", 2LL << 30},
        {"10GB", 10000000000LL},  {"1.5GiB", 3LL << 29}, {"1 TiB", 1LL << 40},
        {"100B", 100},            {"5kb", 5000},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        ks_config c;
        ks_config_defaults(&c);
        char yaml[128];
        snprintf(yaml, sizeof yaml, "models:\n  default:\n    spc_max_bytes: %s\n", ok[i].text);
        load_ok(&c, yaml);
        if (c.models[0].spc_max_bytes != ok[i].want)
            fail_msg("'%s' parsed as %lld, want %lld", ok[i].text,
                     (long long)c.models[0].spc_max_bytes, (long long)ok[i].want);
    }
    static const char *bad[] = {"12XB", "-1", "1.5", "MiB", "1..5M", "1e9", "99999999999TiB", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char yaml[128];
        snprintf(yaml, sizeof yaml, "store:\n  tiers:\n    ram:\n      max_bytes: '%s'\n", bad[i]);
        expect_error(yaml, "'store.tiers.ram.max_bytes' at line 4: expected a byte size 0..1024TiB");
    }
    expect_error("max_body_bytes: 0\n", "'max_body_bytes' at line 1: expected a byte size 1KiB..1TiB");
}

/* Issue 13, findings 7 and 10: every numeric setting that is also a flag has
 * the flag's range (config.h, one constant for both; tests/cli/
 * test_serve_ranges.sh checks the flags), and a size has an upper bound, so
 * a huge max_body_bytes is a config error naming the key instead of an
 * overflow of the server's max_body * 2 + 1 MiB. */
static void test_ranges_match_flags(void **state) {
    (void)state;
    ks_config c;
    ks_config_defaults(&c);
    /* slots: --slots takes 1..256; the file used to stop at 64 */
    load_ok(&c, "slots: 256\nmodels:\n  m: { slots: 256 }\n");
    assert_int_equal(c.slots, 256);
    assert_int_equal(c.models[0].slots, 256);
    assert_int_equal(KS_CONFIG_SLOTS_MAX, 256);
    load_ok(&c, "ctx: 16777216\nbatch: 1048576\nthreads: 4096\nport: 65535\n");
    assert_int_equal(c.ctx, KS_CONFIG_CTX_MAX);
    assert_int_equal(c.batch, KS_CONFIG_BATCH_MAX);
    assert_int_equal(c.threads, KS_CONFIG_THREADS_MAX);
    assert_int_equal(c.port, KS_CONFIG_PORT_MAX);
    /* max_body_bytes: --max-body-bytes takes 1024..2^40 */
    load_ok(&c, "max_body_bytes: 1TiB\n");
    assert_int_equal(c.max_body_bytes, KS_CONFIG_MAX_BODY_MAX);
    load_ok(&c, "max_body_bytes: 1024\n");
    assert_int_equal(c.max_body_bytes, KS_CONFIG_MAX_BODY_MIN);
    expect_error("max_body_bytes: 1023\n",
                 "'max_body_bytes' at line 1: expected a byte size 1KiB..1TiB "
                 "(e.g. 268435456, 256MiB, 1GiB), got '1023'");
    expect_error("max_body_bytes: 1099511627777\n", "'max_body_bytes' at line 1: expected a byte size 1KiB..1TiB");
    expect_error("max_body_bytes: 9223372036854775807\n", "'max_body_bytes' at line 1: expected a byte size");
    expect_error("max_body_bytes: 8000000TiB\n", "'max_body_bytes' at line 1: expected a byte size");
    expect_error("max_body_bytes: 99999999999999999999999\n", "'max_body_bytes' at line 1: expected a byte size");
    /* byte budgets: 0..KS_STORE_BYTES_MAX (--cache-ram takes the same in MiB) */
    load_ok(&c, "store:\n  enabled: false\n  tiers: { ram: { max_bytes: 1024TiB } }\n");
    assert_int_equal(c.store.tier_max_bytes[KS_TIER_RAM], KS_STORE_BYTES_MAX);
    expect_error("store:\n  tiers:\n    ram: { max_bytes: 1025TiB }\n",
                 "'store.tiers.ram.max_bytes' at line 3: expected a byte size 0..1024TiB (e.g. 268435456, "
                 "256MiB, 1GiB), got '1025TiB'");
    expect_error("store:\n  tiers:\n    disk: { max_bytes: 9223372036854775807 }\n",
                 "'store.tiers.disk.max_bytes' at line 3: expected a byte size 0..1024TiB");
    expect_error("models:\n  x: { spc_max_bytes: 2048TiB }\n",
                 "'models.x.spc_max_bytes' at line 2: expected a byte size 0..1024TiB");
}

static void test_paths_expand(void **state) {
    (void)state;
    setenv("HOME", "/home/tester", 1);
    setenv("USER", "tester", 1);
    ks_config c;
    ks_config_defaults(&c);
    load_ok(&c, "store:\n  cache_dir: ~\n  shm_dir: /dev/shm/kvstash-$USER\nmodel: ${HOME}/m.gguf\n");
    assert_string_equal(c.store.cache_dir, "/home/tester");
    assert_string_equal(c.store.shm_dir, "/dev/shm/kvstash-tester");
    assert_string_equal(c.model, "/home/tester/m.gguf");
    load_ok(&c, "model: /a/$/b\n"); /* a lone $ stays */
    assert_string_equal(c.model, "/a/$/b");
    expect_error("model: ~root/m.gguf\n", "'model' at line 1: ~user is not supported");
    expect_error("model: ${HOME/m\n", "unterminated ${");
}

static void test_store_enabled_rule(void **state) {
    (void)state;
    ks_config c;
    ks_config_defaults(&c);
    load_ok(&c, "port: 1000\n");
    assert_false(c.store.enabled);
    load_ok(&c, "store:\n  stride: 64\n  enabled: false\n");
    assert_false(c.store.enabled);
    assert_int_equal(c.store.stride, 64);
    load_ok(&c, "store:\n  reasons: { cold: none }\n");
    assert_true(c.store.enabled);
    ks_config_defaults(&c);
    load_ok(&c, "store: { enabled: true }\n");
    assert_true(c.store.enabled);
    ks_config_defaults(&c);
    load_ok(&c, "store: {}\n");
    assert_false(c.store.enabled);
}

/* ------------------------------------------------------------ store mode */
/* The RAM-only plan: only the ram tier, no directory, reasons mapped to ram
 * (those set to none stay none), shutdown none, finish and continued none
 * unless the configuration names them (saves at eviction instead); everything
 * else as in c. */
static void assert_ram_only(const ks_config *c, const ks_store_cfg *o, int64_t ram) {
    assert_true(o->enabled);
    assert_string_equal(o->cache_dir, "");
    assert_string_equal(o->shm_dir, "");
    assert_int_equal(o->tier_max_bytes[KS_TIER_RAM], ram);
    assert_int_equal(o->tier_max_bytes[KS_TIER_SHM], 0);
    assert_int_equal(o->tier_max_bytes[KS_TIER_DISK], 0);
    for (int r = 0; r < KS_REASON__N; r++) {
        bool lazy = (r == KS_REASON_FINISH || r == KS_REASON_CONTINUED) && !(c->store.reasons_given & (1u << r));
        int want = (r == KS_REASON_SHUTDOWN || lazy || c->store.reason_tier[r] == KS_TIER_NONE) ? KS_TIER_NONE
                                                                                                : KS_TIER_RAM;
        if (o->reason_tier[r] != want)
            fail_msg("reason %s: tier %s, wanted %s", ks_reason_name((ks_reason)r),
                     ks_tier_name((ks_tier_id)o->reason_tier[r]), ks_tier_name((ks_tier_id)want));
    }
    assert_int_equal(o->stride, c->store.stride);
    assert_int_equal(o->min_tokens, c->store.min_tokens);
    assert_int_equal(o->continued_interval, c->store.continued_interval);
    assert_int_equal(o->shutdown_timeout_ms, c->store.shutdown_timeout_ms);
}

static void test_store_plan(void **state) {
    (void)state;
    ks_config c, before;
    ks_store_cfg o;
    /* defaults: the RAM-only store of 2 GiB */
    ks_config_defaults(&c);
    before = c;
    assert_int_equal(ks_config_store_plan(&c, &o), KS_STORE_RAM_ONLY);
    assert_ram_only(&c, &o, 2048LL << 20);
    assert_memory_equal(&c, &before, sizeof c); /* c is not changed */
    assert_string_equal(ks_store_mode_name(KS_STORE_RAM_ONLY), "ram-only");
    assert_string_equal(ks_store_mode_name(KS_STORE_FULL), "full");
    assert_string_equal(ks_store_mode_name(KS_STORE_OFF), "off");
    /* no prompt caching: no store at all */
    c.cache_prompt = false;
    assert_int_equal(ks_config_store_plan(&c, &o), KS_STORE_OFF);
    load_ok(&c, "cache_prompt: true\n");
    assert_int_equal(ks_config_store_plan(&c, &o), KS_STORE_RAM_ONLY);

    /* the budget of the RAM-only store is the ram tier's; enabled: false keeps
     * the full store off, and the other store settings apply */
    ks_config_defaults(&c);
    load_ok(&c, "store:\n  enabled: false\n  min_tokens: 32\n  stride: 16\n"
                "  tiers: { ram: { max_bytes: 64MiB }, disk: { max_bytes: 1GiB } }\n"
                "  reasons: { cold: none, finish: disk, shutdown: ram }\n");
    assert_false(c.store.enabled);
    assert_int_equal(ks_config_store_plan(&c, &o), KS_STORE_RAM_ONLY);
    assert_ram_only(&c, &o, 64LL << 20);
    assert_int_equal(o.min_tokens, 32);
    assert_int_equal(o.stride, 16);
    assert_int_equal(o.reason_tier[KS_REASON_COLD], KS_TIER_NONE);
    assert_int_equal(o.reason_tier[KS_REASON_FINISH], KS_TIER_RAM); /* named: kept */
    assert_int_equal(o.reason_tier[KS_REASON_CONTINUED], KS_TIER_NONE); /* not named: lazy */
    assert_int_equal(o.reason_tier[KS_REASON_EVICT], KS_TIER_RAM);
    assert_int_equal(o.reason_tier[KS_REASON_SHUTDOWN], KS_TIER_NONE);
    assert_int_equal(o.reason_tier[KS_REASON_PIN], KS_TIER_RAM); /* pinned saves: ram only */
    /* a ram budget of 0 turns it off */
    load_ok(&c, "store: { enabled: false, tiers: { ram: { max_bytes: 0 } } }\n");
    assert_int_equal(ks_config_store_plan(&c, &o), KS_STORE_OFF);

    /* the full store: its settings as given, also a ram budget of 0 */
    ks_config_defaults(&c);
    load_ok(&c, "store: { tiers: { ram: { max_bytes: 0 } } }\n");
    assert_true(c.store.enabled);
    assert_int_equal(ks_config_store_plan(&c, &o), KS_STORE_FULL);
    assert_memory_equal(&o, &c.store, sizeof o);
    ks_config_defaults(&c);
    load_ok(&c, "store: { enabled: true, cache_dir: /tmp/x }\n");
    assert_int_equal(ks_config_store_plan(&c, &o), KS_STORE_FULL);
    assert_memory_equal(&o, &c.store, sizeof o);
    assert_string_equal(o.cache_dir, "/tmp/x");
    assert_int_equal(o.reason_tier[KS_REASON_SHUTDOWN], KS_TIER_DISK);
    /* ... but not without prompt caching */
    load_ok(&c, "cache_prompt: false\n");
    assert_int_equal(ks_config_store_plan(&c, &o), KS_STORE_OFF);
}

/* ------------------------------------------------------------ per model */
static void test_resolve_model(void **state) {
    (void)state;
    ks_config c;
    ks_config_defaults(&c);
    ks_config_resolve_model(&c, "anything", "/m/x.gguf"); /* no entries: built-in */
    assert_false(c.cache.incremental_cache);
    assert_int_equal(c.cache.cache_min_tokens, 100);
    assert_int_equal(c.slots, 4);

    load_ok(&c, "slots: 4\n"
                "models:\n"
                "  default: { system_prompt_cache: true, cache_min_tokens: 50 }\n"
                "  Qwen3-8B-Q8_0: { incremental_cache: true, slots: 3 }\n"
                "  tiny.gguf: { cache_min_tokens: 7 }\n");
    ks_config d = c;
    /* by general.name */
    ks_config_resolve_model(&d, "Qwen3-8B-Q8_0", "/m/other.gguf");
    assert_true(d.cache.incremental_cache);
    assert_false(d.cache.system_prompt_cache);
    assert_int_equal(d.cache.cache_min_tokens, 100);
    assert_int_equal(d.slots, 3);
    /* by the file's base name without .gguf */
    d = c;
    ks_config_resolve_model(&d, "unnamed", "/models/Qwen3-8B-Q8_0.gguf");
    assert_true(d.cache.incremental_cache);
    assert_int_equal(d.slots, 3);
    /* by the file's base name with its extension */
    d = c;
    ks_config_resolve_model(&d, NULL, "tiny.gguf");
    assert_int_equal(d.cache.cache_min_tokens, 7);
    assert_int_equal(d.slots, 4);
    /* else "default", which leaves slots alone */
    d = c;
    ks_config_resolve_model(&d, "llama", "/m/llama.gguf");
    assert_true(d.cache.system_prompt_cache);
    assert_false(d.cache.incremental_cache);
    assert_int_equal(d.cache.cache_min_tokens, 50);
    assert_int_equal(d.slots, 4);
    /* names are exact */
    d = c;
    ks_config_resolve_model(&d, "qwen3-8b-q8_0", NULL);
    assert_false(d.cache.incremental_cache);
}

/* Issue 29: the projector, top-level and per model; an entry's wins once
 * resolved, and a model without one keeps the top-level path. */
static void test_mmproj(void **state) {
    (void)state;
    ks_config c;
    ks_config_defaults(&c);
    assert_string_equal(c.mmproj, "");
    load_ok(&c, "mmproj: /p/top-mmproj.gguf\n"
                "models:\n  vlm:\n    mmproj: /p/vlm-mmproj.gguf\n  other:\n    slots: 2\n");
    assert_string_equal(c.mmproj, "/p/top-mmproj.gguf");
    ks_config_resolve_model(&c, "vlm", NULL);
    assert_string_equal(c.cache.mmproj, "/p/vlm-mmproj.gguf");
    ks_config_resolve_model(&c, "other", NULL);
    assert_string_equal(c.cache.mmproj, "");
    expect_error("mmproj: [a, b]\n", "mmproj");
}

static void test_model_entry_limits(void **state) {
    (void)state;
    ks_buf b = {0};
    ks_buf_printf(&b, "models:\n");
    for (int i = 0; i < 17; i++) ks_buf_printf(&b, "  m%d: {}\n", i);
    expect_error(b.s, "'models.m16' at line 18: at most 16 model entries");
    ks_buf_free(&b);
    expect_error("models:\n  \"\": {}\n", "a model name must be 1..127 bytes");
}

/* Issue 37: the keys of several models, per entry and at the top level. */
static void test_several_models(void **state) {
    (void)state;
    ks_config c;
    ks_config_defaults(&c);
    assert_int_equal(c.models_max, 4);
    assert_int_equal(c.models_memory, -1);
    assert_true(c.models_autoload);
    assert_int_equal(c.sleep_idle_seconds, 0);
    load_ok(&c, "models:\n"
                "  big: { path: /m/big.gguf, aliases: [\"claude-*sonnet*\", gpt-5], pin: true, ctx: 8192, exact: false,\n"
                "         gpu_layers: all, cache_type_k: q8_0, ctx_checkpoints: 4 }\n"
                "  small: { path: /m/small.gguf, aliases: \"claude-*haiku*\", keep_alive: -1 }\n"
                "models_dir: /m/dir\nmodels_max: 2\nmodels_memory: 20GiB\nsleep_idle_seconds: 300\n"
                "models_autoload: false\ndefault_model: big\n");
    assert_int_equal(c.n_models, 2);
    assert_string_equal(c.models[0].path, "/m/big.gguf");
    assert_int_equal(c.models[0].n_aliases, 2);
    assert_string_equal(c.models[0].aliases[0], "claude-*sonnet*");
    assert_string_equal(c.models[0].aliases[1], "gpt-5");
    assert_true(c.models[0].pin);
    assert_int_equal(c.models[0].ctx, 8192);
    assert_int_equal(c.models[0].exact, 0);
    assert_string_equal(c.models[0].gpu_layers, "all");
    assert_string_equal(c.models[0].cache_type_k, "q8_0");
    assert_int_equal(c.models[0].ctx_checkpoints, 4);
    assert_int_equal(c.models[1].n_aliases, 1); /* one alias as a scalar */
    assert_string_equal(c.models[1].aliases[0], "claude-*haiku*");
    assert_int_equal(c.models[1].keep_alive, -1);
    assert_int_equal(c.models[1].exact, -1);           /* not given: the top level's */
    assert_int_equal(c.models[1].ctx_checkpoints, -1);
    assert_false(c.models[1].pin);
    assert_string_equal(c.models_dir, "/m/dir");
    assert_int_equal(c.models_max, 2);
    assert_int_equal(c.models_memory, 20LL << 30);
    assert_int_equal(c.sleep_idle_seconds, 300);
    assert_false(c.models_autoload);
    assert_string_equal(c.default_model, "big");
    /* the entry resolves like any models.<name> entry */
    ks_config d = c;
    ks_config_resolve_model(&d, "small", "/m/small.gguf");
    assert_int_equal(d.cache.keep_alive, -1);
    expect_error("models:\n  a: { aliases: { x: 1 } }\n", "aliases");
    expect_error("models:\n  a: { aliases: [a, b, c, d, e, f, g, h, i] }\n", "at most 8 aliases");
    expect_error("models:\n  a: { exact: maybe }\n", "exact");
    expect_error("models:\n  a: { keep_alive: -2 }\n", "keep_alive");
    expect_error("models_max: 65\n", "models_max");
    expect_error("models:\n  a: { ctx: 10 }\n", "ctx");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_several_models),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_full_file),
        cmocka_unit_test(test_redis_tls),
        cmocka_unit_test(test_empty_and_layered_loads),
        cmocka_unit_test(test_cors_origins),
        cmocka_unit_test(test_check_origin),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_out_of_range),
        cmocka_unit_test(test_size_suffixes),
        cmocka_unit_test(test_ranges_match_flags),
        cmocka_unit_test(test_media_limits),
        cmocka_unit_test(test_paths_expand),
        cmocka_unit_test(test_store_enabled_rule),
        cmocka_unit_test(test_store_plan),
        cmocka_unit_test(test_resolve_model),
        cmocka_unit_test(test_model_entry_limits),
        cmocka_unit_test(test_mmproj),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
