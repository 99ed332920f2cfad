/*
 * kvfile_mem.c — kvfiles in memory (the redis tier): the exact bytes
 * ks_kvfile_write writes, and their checked reader. See kvfile.h.
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "cache/kvfile.h"
#include "cache/kvfile_int.h"

uint64_t ks_kvfile_size_flags(int n, size_t len, uint32_t flags) {
    return (uint64_t)KS_KVFILE_HEADER_LEN + 4ull * (uint64_t)(n > 0 ? n : 0) + (uint64_t)len + tail_len(flags);
}

uint64_t ks_kvfile_size(int n, size_t len) { return ks_kvfile_size_flags(n, len, KS_KVFILE_FLAG_PIN); }

int ks_kvfile_encode(const ks_kvfile_meta *meta, const int32_t *tokens, int n, const uint8_t *payload, size_t len,
                     uint8_t **out, size_t *out_len) {
    if (!meta || !out || !out_len || n < 0 || (uint64_t)n > KS_KVFILE_MAX_TOKENS || (n && !tokens) ||
        (uint64_t)len > KS_KVFILE_MAX_PAYLOAD || (len && !payload))
        return KS_EINVAL;
    uint64_t total = ks_kvfile_size_flags(n, len, ks__kvfile_writer_flags(meta));
    if (total > SIZE_MAX) return KS_EINVAL;
    uint8_t *b = malloc((size_t)total);
    if (!b) return KS_ENOMEM;
    ks__kvfile_encode_header(b, meta, (uint32_t)n, (uint64_t)len);
    uint8_t *p = b + KS_KVFILE_HEADER_LEN;
    for (int i = 0; i < n; i++) put32(p + 4 * (size_t)i, (uint32_t)tokens[i]);
    p += 4 * (size_t)n;
    if (len) memcpy(p, payload, len);
    p += len;
    sink sk = {0};
    int rc = ks__kvfile_tail_begin(meta, &sk, p + 8);
    if (rc == 0) {
        ks__kvfile_feed(&sk, b, (size_t)(p - b));
        rc = ks__kvfile_tail_end(meta, &sk, p);
    }
    ks__kvfile_sink_free(&sk);
    if (rc != 0) {
        free(b);
        return rc;
    }
    *out = b;
    *out_len = (size_t)total;
    return 0;
}

int ks_kvfile_decode(const uint8_t *buf, size_t len, const ks_kvfile_expect *exp, ks_kvfile_meta *meta,
                     size_t *payload_off) {
    ks_kvfile_meta m;
    uint32_t hlen = 0;
    sink sk = {0};
    int rc;
    memset(&m, 0, sizeof m);
    m.file_size = len;
    if (!buf || len < 16 + 8) {
        rc = KS_ECORRUPT;
        goto done;
    }
    if ((rc = ks__kvfile_header_len(buf, len, &hlen)) != 0 ||
        (rc = ks__kvfile_parse_header(buf, hlen, len, &m)) != 0)
        goto done;
    if ((rc = ks__kvfile_check_expect_header(&m, exp)) != 0) goto done;
    size_t tok_bytes = (size_t)m.n_tokens * 4;
    size_t body = KS_KVFILE_HEADER_LEN + tok_bytes + (size_t)m.payload_len;
    size_t tlen = trailer_len(m.flags);
    ks__kvfile_decode_trailer(buf + len - tlen, tlen, &m);
    if ((rc = ks__kvfile_check_begin(&m, exp, buf + body, &sk)) != 0) goto done;
    ks__kvfile_feed(&sk, buf, body);
    if ((rc = ks__kvfile_check_end(&sk, buf + body)) != 0) goto done;
    if (exp && exp->tokens) {
        const uint8_t *t = buf + KS_KVFILE_HEADER_LEN;
        for (uint32_t i = 0; i < m.n_tokens; i++)
            if ((int32_t)get32(t + 4 * (size_t)i) != exp->tokens[i]) {
                rc = KS_EMISMATCH;
                goto done;
            }
    }
    if (payload_off) *payload_off = KS_KVFILE_HEADER_LEN + tok_bytes;
done:
    ks__kvfile_sink_free(&sk);
    if (meta) *meta = m;
    return rc;
}
