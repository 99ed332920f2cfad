/*
 * store_cfg.c — see store_cfg.h.
 */
#include "cache/store_cfg.h"

#include <stdio.h>
#include <string.h>

static const char *const k_reason_names[KS_REASON__N] = {"cold", "continued", "finish",     "evict",
                                                         "shutdown", "pin", "checkpoint", "unload"};
static const char *const k_tier_names[KS_TIER__N] = {"ram", "shm", "disk", "redis"};

const char *ks_reason_name(ks_reason r) {
    return (r >= 0 && r < KS_REASON__N) ? k_reason_names[r] : "?";
}

int ks_reason_parse(const char *s) {
    for (int i = 0; s && i < KS_REASON__N; i++)
        if (strcmp(s, k_reason_names[i]) == 0) return i;
    return -1;
}

const char *ks_tier_name(ks_tier_id t) {
    if (t == KS_TIER_NONE) return "none";
    return (t >= 0 && t < KS_TIER__N) ? k_tier_names[t] : "?";
}

int ks_tier_parse(const char *s) {
    if (!s) return -2;
    if (strcmp(s, "none") == 0) return KS_TIER_NONE;
    for (int i = 0; i < KS_TIER__N; i++)
        if (strcmp(s, k_tier_names[i]) == 0) return i;
    return -2;
}

void ks_store_cfg_defaults(ks_store_cfg *c) {
    /* memset, not assignment from a literal: padding bytes are zeroed too,
     * and configurations are compared with memcmp. */
    memset(c, 0, sizeof *c);
    c->stride = 256;
    c->continued_interval = 512;
    c->finish_save_delay_ms = 500;
    c->min_tokens = 256;
    c->shutdown_timeout_ms = 5000;
    c->tier_max_bytes[KS_TIER_RAM] = 2048LL << 20; /* --cache-ram's default */
    c->tier_max_bytes[KS_TIER_SHM] = 1LL << 30;
    c->tier_max_bytes[KS_TIER_DISK] = 10LL << 30;
    c->reason_tier[KS_REASON_COLD] = KS_TIER_DISK;
    c->reason_tier[KS_REASON_CONTINUED] = KS_TIER_SHM;
    c->reason_tier[KS_REASON_FINISH] = KS_TIER_SHM;
    c->reason_tier[KS_REASON_EVICT] = KS_TIER_DISK;
    c->reason_tier[KS_REASON_SHUTDOWN] = KS_TIER_DISK;
    /* A pin is a promise to a client that comes back: the disk tier also
     * serves other processes and restarts (the ram tier gets it too). */
    c->reason_tier[KS_REASON_PIN] = KS_TIER_DISK;
    /* Like finish: the next turn, on this host, soon. */
    c->reason_tier[KS_REASON_CHECKPOINT] = KS_TIER_SHM;
    /* A model unloaded for another (several models): back on this host,
     * perhaps in minutes; shm also outlives the process. */
    c->reason_tier[KS_REASON_UNLOAD] = KS_TIER_SHM;
    c->pin_share = 0.5f;
    c->tier_max_bytes[KS_TIER_REDIS] = 4LL << 30;
    snprintf(c->redis.key_prefix, sizeof c->redis.key_prefix, "kvstash");
    c->redis.chunk_bytes = 4LL << 20;
    c->redis.timeout_ms = 250;
    c->redis.breaker_errors = 3;
    c->redis.breaker_ms = 5000;
    c->redis.tls.verify = true;
    /* checkpoint: a hybrid model's prompt end, what the next turn restores on another host */
    c->redis.reasons = 1u << KS_REASON_FINISH | 1u << KS_REASON_EVICT | 1u << KS_REASON_SHUTDOWN |
                       1u << KS_REASON_CHECKPOINT | 1u << KS_REASON_UNLOAD;
}
