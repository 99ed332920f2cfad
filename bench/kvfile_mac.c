/* bench/kvfile_mac.c — what authenticating stored states costs (issue 28):
 * ks_kvfile_write and ks_kvfile_read_buf of one state of MB mebibytes in a
 * directory (default: a fresh one under /dev/shm, the shm tier's medium),
 * without and with the cache secret's Poly1305 tag, best of REPS runs each.
 *
 *   build/bench_kvfile_mac [MB=512] [REPS=5] [DIR]
 *
 * The write includes the fsync and the link, as the store's writer does; the
 * read is a page-cached file into a reused buffer, as a restore from shm. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cache/kvfile.h"
#include "cache/kvmac.h"
#include "cache/store_cfg.h"

int main(int argc, char **argv) {
    size_t mb = argc > 1 ? (size_t)atol(argv[1]) : 512;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    char dir[PATH_MAX];
    if (argc > 3) snprintf(dir, sizeof dir, "%s", argv[3]);
    else {
        snprintf(dir, sizeof dir, "/dev/shm/ks-bench-mac-XXXXXX");
        if (!mkdtemp(dir)) return 1;
    }
    size_t len = mb << 20;
    uint8_t *payload = malloc(len), *buf = NULL;
    size_t cap = 0;
    if (!payload) return 1;
    for (size_t i = 0; i < len; i++) payload[i] = (uint8_t)(i * 131 + (i >> 12));
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = i * 7;
    ks_kvmac_key key;
    if (ks_kvmac_key_from_secret("a deployment secret for the bench", 33, &key) != 0) return 1;
    printf("state %zu MiB, best of %d, dir %s\n", mb, reps, dir);
    printf("%-8s %10s %10s %10s %10s\n", "mac", "write ms", "write GB/s", "read ms", "read GB/s");
    for (int with = 0; with < 2; with++) {
        double bw = 1e30, br = 1e30;
        for (int r = 0; r < reps; r++) {
            ks_kvfile_meta m;
            memset(&m, 0, sizeof m);
            m.reason = KS_REASON_FINISH;
            m.created_us = 1;
            m.key.b[0] = (uint8_t)r;
            m.key.b[1] = (uint8_t)with;
            m.mac = with ? &key : NULL;
            char path[PATH_MAX];
            ks_kvfile_path(dir, &m.key, path, sizeof path);
            double t0 = ks_now_ms();
            if (ks_kvfile_write(dir, &m, toks, 64, payload, len, NULL, NULL, NULL) != 0) return 1;
            double t1 = ks_now_ms();
            ks_kvfile_expect e = {.key = &m.key, .mac = with ? &key : NULL};
            if (ks_kvfile_read_buf(path, &e, NULL, &buf, &cap) != 0) return 1;
            double t2 = ks_now_ms();
            unlink(path);
            if (t1 - t0 < bw) bw = t1 - t0;
            if (t2 - t1 < br) br = t2 - t1;
        }
        printf("%-8s %10.1f %10.2f %10.1f %10.2f\n", with ? "poly1305" : "none", bw, (double)len / bw / 1e6, br,
               (double)len / br / 1e6);
    }
    if (argc <= 3) rmdir(dir);
    free(payload);
    free(buf);
    return 0;
}
