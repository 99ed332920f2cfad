/* test_base.c — the errno mapping, the random bytes and KS_ASSERT shared by every layer
 * (src/base/base.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/base.h"
#include "base/offload.h"

/* Regression: ks_kvfile_errno (kvfile.c) mapped ENOTDIR to KS_EIO while
 * errno_to_ks (mkmodel.c) mapped it to KS_ENOENT. Both use ks_errno_map now,
 * and a path through a file is "not found" everywhere. */
static void test_errno_map(void **state) {
    (void)state;
    static const struct {
        int e, want;
    } cases[] = {
        {ENOSPC, KS_ENOSPC},
#ifdef EDQUOT
        {EDQUOT, KS_ENOSPC},
#endif
        {ENOMEM, KS_ENOMEM},
        {ENOENT, KS_ENOENT},
        {ENOTDIR, KS_ENOENT},
        {EACCES, KS_EIO},
        {EPERM, KS_EIO},
        {EIO, KS_EIO},
        {EISDIR, KS_EIO},
        {0, KS_EIO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = ks_errno_map(cases[i].e);
        if (got != cases[i].want)
            fail_msg("errno %d: got %s, wanted %s", cases[i].e, ks_errname(got),
                     ks_errname(cases[i].want));
    }
}

/* The offload settings' parsers (issue 26): what -ngl, --split-mode,
 * --tensor-split and --device take and refuse, the same for flags and YAML. */
static void test_offload_parsers(void **state) {
    (void)state;
    char why[256];
    int n = 123;
    assert_int_equal(ks_offload_parse_layers("auto", &n, why, sizeof why), 0);
    assert_int_equal(n, KS_NGL_AUTO);
    assert_int_equal(ks_offload_parse_layers("all", &n, why, sizeof why), 0);
    assert_int_equal(n, KS_NGL_ALL);
    assert_int_equal(ks_offload_parse_layers("0", &n, why, sizeof why), 0);
    assert_int_equal(n, 0);
    assert_int_equal(ks_offload_parse_layers("99", &n, why, sizeof why), 0);
    assert_int_equal(n, 99);
    static const char *const bad_layers[] = {"", "-1", "-2", "1x", "ALL", "2147483648"};
    for (size_t i = 0; i < sizeof bad_layers / sizeof bad_layers[0]; i++) {
        n = 7;
        if (ks_offload_parse_layers(bad_layers[i], &n, why, sizeof why) != KS_EINVAL || n != 7)
            fail_msg("-ngl '%s' accepted (%d)", bad_layers[i], n);
    }
    assert_int_equal(ks_offload_parse_split_mode("row", &n, why, sizeof why), 0);
    assert_int_equal(n, KS_SPLIT_ROW);
    assert_int_equal(ks_offload_parse_split_mode("tensor", &n, why, sizeof why), KS_EINVAL);

    float ts[KS_OFFLOAD_DEVICES_MAX];
    int k = 0;
    assert_int_equal(ks_offload_parse_tensor_split("3,1", ts, &k, why, sizeof why), 0);
    assert_int_equal(k, 2);
    assert_true(ts[0] == 3.0f && ts[1] == 1.0f);
    assert_int_equal(ks_offload_parse_tensor_split("0.5/0/0.5", ts, &k, why, sizeof why), 0);
    assert_int_equal(k, 3);
    static const char *const bad_ts[] = {"", "0", "0,0", "1,-1", "1,", ",1", "1,,1", "nan", "inf,1", "1;2",
                                         "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", " 1"};
    for (size_t i = 0; i < sizeof bad_ts / sizeof bad_ts[0]; i++)
        if (ks_offload_parse_tensor_split(bad_ts[i], ts, &k, why, sizeof why) != KS_EINVAL)
            fail_msg("--tensor-split '%s' accepted", bad_ts[i]);

    assert_int_equal(ks_offload_check_devices("none", why, sizeof why), 0);
    assert_int_equal(ks_offload_check_devices("CUDA0,CUDA1", why, sizeof why), 0);
    assert_int_equal(ks_offload_check_devices("Vulkan0", why, sizeof why), 0);
    static const char *const bad_dev[] = {"", ",", "CUDA0,", ",CUDA0", "CUDA 0", "a;b"};
    for (size_t i = 0; i < sizeof bad_dev / sizeof bad_dev[0]; i++)
        if (ks_offload_check_devices(bad_dev[i], why, sizeof why) != KS_EINVAL)
            fail_msg("--device '%s' accepted", bad_dev[i]);

    ks_offload o;
    ks_offload_defaults(&o);
    assert_int_equal(o.n_gpu_layers, KS_NGL_AUTO);
    assert_int_equal(o.split_mode, KS_SPLIT_LAYER);
    assert_true(o.kv_offload && o.op_offload);
    assert_string_equal(o.devices, "");
}

/* One source of random bytes (it replaced four copies of getrandom with
 * four fallbacks): every length filled, no two draws alike. */
static void test_random(void **state) {
    (void)state;
    uint64_t seen[64];
    for (int i = 0; i < 64; i++) {
        seen[i] = ks_random_u64();
        for (int j = 0; j < i; j++) assert_true(seen[i] != seen[j]);
    }
    unsigned char a[9] = {0}, b[9] = {0};
    ks_random_bytes(a, sizeof a);
    ks_random_bytes(b, sizeof b);
    assert_true(memcmp(a, b, sizeof a) != 0);
    ks_random_bytes(a, 0); /* nothing to fill */
}

/* KS_ASSERT aborts with the condition named where asserts are on (the Debug
 * test builds, KS_ASSERTS), and evaluates nothing where they are off. */
static void test_assert(void **state) {
    (void)state;
    int evaluated = 0;
    KS_ASSERT(++evaluated == 1);
    assert_int_equal(evaluated, KS_ASSERTS_ON ? 1 : 0);
    if (!KS_ASSERTS_ON) return;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        KS_ASSERT(evaluated == 2);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errno_map),
        cmocka_unit_test(test_offload_parsers),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_assert),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
