/*
 * media.cpp — llama.cpp's mtmd behind the C interface of media.h (see its
 * design notes). The only file that includes mtmd.h. C++ only because mtmd's
 * helpers are; no exception crosses the C interface (mtmd's C API catches its
 * own, and every allocation here is nothrow).
 */
#include "engine/media.h"

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "llama.h"
#include "mtmd-helper.h"
#include "mtmd.h"
#include "xxhash.h"

extern "C" {
#include "engine/engine.h"
struct llama_context *ks__engine_ctx(const ks_engine *e);
const struct llama_model *ks__engine_model(const ks_engine *e);
}

#define MOD "media"

struct ks_media {
    mtmd_context *ctx;
    uint64_t proj_hash;
    bool vision, audio;
    int n_embd;
    int n_batch; /* the engine's n_batch = n_ubatch: the largest non-causal run (note 2a) */
    bool mrope;  /* the text model takes 4 positions a row (M-RoPE): note 2 */
    ks_media_stats st; /* inference thread */
};

namespace {

struct run {
    int pos, n;
    int n_pos;                     /* KV positions it takes (< n: M-RoPE images, media.h note 2) */
    const mtmd_input_chunk *chunk; /* borrowed from the set's chunks */
    float *embd;                   /* n * n_embd, once encoded; malloc'd */
    bool whole;                    /* decoded all at once, never cut (media.h note 2a) */
    bool non_causal;               /* ... in one call with causal attention off (note 2a) */
};

} // namespace

struct ks_media_set {
    std::atomic<int> refs{1};
    ks_media *m = nullptr;
    mtmd_input_chunks *chunks = nullptr;
    std::vector<run> runs;
    std::vector<uint64_t> items;
    std::vector<int32_t> toks; /* the pseudo-tokens of every run, in order (ks_media_set_covers) */
};

/* ---------------------------------------------------------------- logging */
/* mtmd logs its reasons (a file it cannot read, a mismatch with the text
 * model) at error level; while a thread opens or tokenizes, they go to its
 * buffer, to be the caller's reason; the rest goes to kvstash's log at debug
 * level (mtmd is chatty at info level). */
static thread_local char *t_reason;
static thread_local size_t t_reason_cap;

static void media_log(enum ggml_log_level level, const char *text, void *ud) {
    (void)ud;
    size_t n = strlen(text);
    while (n && (text[n - 1] == '\n')) n--;
    if (!n) return;
    if (level == GGML_LOG_LEVEL_ERROR && t_reason && t_reason_cap && !t_reason[0])
        snprintf(t_reason, t_reason_cap, "%.*s", (int)n, text);
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN)
        KS_DEBUG(MOD, "mtmd: %.*s", (int)n, text);
    else if (ks_log_get_level() <= KS_LOG_DEBUG && getenv("KS_LLAMA_VERBOSE"))
        fprintf(stderr, "%.*s\n", (int)n, text);
}

struct reason_scope {
    char buf[256];
    reason_scope() {
        buf[0] = '\0';
        t_reason = buf;
        t_reason_cap = sizeof buf;
    }
    ~reason_scope() {
        t_reason = nullptr;
        t_reason_cap = 0;
    }
};

/* ------------------------------------------------------------------ hashes */
static uint64_t mix64(uint64_t x) { /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Pseudo-token i of a chunk with hash h (media.h note 1). */
static int32_t pseudo_token(uint64_t h, int i) {
    uint32_t bits;
    if (i == 0) bits = (uint32_t)(h & 0x7fffffffu);
    else if (i == 1) bits = (uint32_t)((h >> 31) & 0x7fffffffu);
    else bits = (uint32_t)(mix64(h ^ (uint64_t)i) & 0x7fffffffu);
    return (int32_t)(0x80000000u | bits);
}

static int file_hash(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return errno == ENOENT ? KS_ENOENT : KS_EIO;
    XXH3_state_t *st = XXH3_createState();
    std::vector<unsigned char> buf;
    int rc = 0;
    if (!st) rc = KS_ENOMEM;
    else {
        try {
            buf.resize(1 << 20);
        } catch (...) {
            rc = KS_ENOMEM;
        }
    }
    if (!rc) {
        XXH3_64bits_reset(st);
        size_t n;
        while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) XXH3_64bits_update(st, buf.data(), n);
        if (ferror(f)) rc = KS_EIO;
        *out = XXH3_64bits_digest(st);
    }
    if (st) XXH3_freeState(st);
    fclose(f);
    return rc;
}

/* --------------------------------------------------------------- open/close */
extern "C" int ks__media_open(ks_engine *e, const char *path, int n_threads, bool gpu, ks_media **out, char *err,
                              size_t errlen) {
    *out = nullptr;
    static std::atomic<bool> log_set{false};
    if (!log_set.exchange(true)) mtmd_helper_log_set(media_log, nullptr);
    uint64_t h = 0;
    int rc = file_hash(path, &h);
    if (rc) {
        ks_set_err(err, errlen, "projector file '%s': %s", path, rc == KS_ENOENT ? "no such file" : ks_strerror(rc));
        return rc;
    }
    ks_media *m = new (std::nothrow) ks_media();
    if (!m) return KS_ENOMEM;
    m->proj_hash = h;
    mtmd_context_params mp = mtmd_context_params_default();
    mp.use_gpu = gpu;
    mp.print_timings = false;
    mp.n_threads = n_threads > 0 ? n_threads : 1;
    mp.warmup = true;
    /* The projector's own attention: flash attention off, ggml's plain
     * kernels; the encode is one graph per chunk either way (note 4). */
    mp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    {
        reason_scope rs;
        m->ctx = mtmd_init_from_file(path, ks__engine_model(e), mp);
        if (!m->ctx) {
            ks_set_err(err, errlen, "projector file '%s' could not be loaded%s%s", path, rs.buf[0] ? ": " : "",
                       rs.buf[0] ? rs.buf : " (not an mmproj GGUF, or made for another text model)");
            delete m;
            return KS_EMODEL;
        }
    }
    m->mrope = mtmd_decode_use_mrope(m->ctx);
    if (m->mrope && ks_engine_n_swa(e) > 0) {
        /* kvstash's sliding-window rules (ks_engine_state_restorable, the
         * window a cut must keep) count the window in tokens, and llama.cpp
         * cannot shift M-RoPE positions: no M-RoPE model has a window yet. */
        ks_set_err(err, errlen,
                   "projector file '%s' is for an M-RoPE model with a sliding window: its media take fewer KV "
                   "positions than tokens, which kvstash's window rules do not support", path);
        mtmd_free(m->ctx);
        delete m;
        return KS_EMODEL;
    }
    m->vision = mtmd_support_vision(m->ctx);
    m->audio = mtmd_support_audio(m->ctx);
    m->n_embd = llama_model_n_embd_inp(ks__engine_model(e));
    m->n_batch = ks_engine_n_batch(e);
    KS_DEBUG(MOD, "projector %s: vision=%d audio=%d n_embd=%d non-causal=%d mrope=%d", path, (int)m->vision,
             (int)m->audio, m->n_embd, (int)mtmd_decode_use_non_causal(m->ctx, nullptr), (int)m->mrope);
    *out = m;
    return 0;
}

extern "C" void ks__media_close(ks_media *m) {
    if (!m) return;
    mtmd_free(m->ctx);
    delete m;
}

extern "C" const char *ks_media_marker(void) { return mtmd_default_marker(); }
extern "C" bool ks_media_vision(const ks_media *m) { return m && m->vision; }
extern "C" bool ks_media_audio(const ks_media *m) { return m && m->audio; }
extern "C" uint64_t ks_media_proj_hash(const ks_media *m) { return m ? m->proj_hash : 0; }
extern "C" bool ks_media_mrope(const ks_media *m) { return m && m->mrope; }

/* ---------------------------------------------------------------- tokenize */
static void set_free(ks_media_set *s) {
    for (run &r : s->runs) free(r.embd);
    if (s->chunks) mtmd_input_chunks_free(s->chunks);
    delete s;
}

extern "C" ks_media_set *ks_media_set_ref(ks_media_set *set) {
    if (set) set->refs.fetch_add(1, std::memory_order_relaxed);
    return set;
}

extern "C" void ks_media_set_unref(ks_media_set *set) {
    if (set && set->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) set_free(set);
}

static int count_markers(const char *text, size_t len) {
    const char *mk = mtmd_default_marker();
    size_t ml = strlen(mk);
    int n = 0;
    for (size_t i = 0; i + ml <= len;) {
        if (!memcmp(text + i, mk, ml)) {
            n++;
            i += ml;
        } else i++;
    }
    return n;
}

/* The item's hash (note 1): the projector, the kind, the size, the decoded bytes. */
static uint64_t bitmap_hash(const ks_media *m, const mtmd_bitmap *bm) {
    XXH3_state_t *st = XXH3_createState();
    if (!st) return 0;
    XXH3_64bits_reset(st);
    uint64_t hdr[4] = {m->proj_hash, mtmd_bitmap_is_audio(bm) ? 2u : 1u, mtmd_bitmap_get_nx(bm),
                       mtmd_bitmap_get_ny(bm)};
    XXH3_64bits_update(st, hdr, sizeof hdr);
    XXH3_64bits_update(st, mtmd_bitmap_get_data(bm), mtmd_bitmap_get_n_bytes(bm));
    uint64_t h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}

/* Decodes the items into bitmaps (their ids: the items' hashes in hex). */
static int decode_items(ks_media *m, const ks_media_item *items, int n_items, std::vector<mtmd_bitmap *> &bms,
                        std::vector<uint64_t> &hashes, char *err, size_t errlen) {
    for (int i = 0; i < n_items; i++) {
        if (!items[i].data || items[i].len == 0) {
            ks_set_err(err, errlen, "media item %d is empty", i);
            return KS_EINVAL;
        }
        reason_scope rs;
        mtmd_helper_bitmap_wrapper w =
            mtmd_helper_bitmap_init_from_buf(m->ctx, items[i].data, items[i].len, false, mtmd_helper_init_opt_default());
        /* Video is off in this build (setup_mtmd.sh): no video context comes back. */
        if (!w.bitmap) {
            ks_set_err(err, errlen, "media item %d could not be decoded: not an image (PNG, JPEG, GIF, BMP...) or "
                       "audio file (WAV, MP3, FLAC) this build reads%s%s", i, rs.buf[0] ? ": " : "", rs.buf);
            return KS_EINVAL;
        }
        bms.push_back(w.bitmap);
        bool audio = mtmd_bitmap_is_audio(w.bitmap);
        if (audio ? !m->audio : !m->vision) {
            ks_set_err(err, errlen, "media item %d is %s, and the projector has no %s encoder", i,
                       audio ? "audio" : "an image", audio ? "audio" : "vision");
            return KS_EINVAL;
        }
        uint64_t h = bitmap_hash(m, w.bitmap);
        if (!h) return KS_ENOMEM;
        char id[24];
        snprintf(id, sizeof id, "%016llx", (unsigned long long)h);
        mtmd_bitmap_set_id(w.bitmap, id);
        hashes.push_back(h);
    }
    return 0;
}

/* The chunks into tokens and runs. */
static int take_chunks(ks_media *m, ks_media_set *s, ks_tokens *out, char *err, size_t errlen) {
    size_t n_chunks = mtmd_input_chunks_size(s->chunks);
    uint64_t last_item = 0;
    int ordinal = 0;
    for (size_t c = 0; c < n_chunks; c++) {
        const mtmd_input_chunk *ch = mtmd_input_chunks_get(s->chunks, c);
        if (mtmd_input_chunk_get_type(ch) == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t n = 0;
            const llama_token *t = mtmd_input_chunk_get_tokens_text(ch, &n);
            if (n && ks_tokens_append(out, t, (int)n)) return KS_ENOMEM;
            continue;
        }
        int n = (int)mtmd_input_chunk_get_n_tokens(ch);
        if (n <= 0) continue;
        int n_pos = (int)mtmd_input_chunk_get_n_pos(ch);
        if (n_pos <= 0 || n_pos > n || (n_pos != n && (!m->mrope || mtmd_input_chunk_get_type(ch) !=
                                                                         MTMD_INPUT_CHUNK_TYPE_IMAGE))) {
            ks_set_err(err, errlen, "this projector's media take %d KV positions for %d tokens: not supported",
                       n_pos, n);
            return KS_EINVAL;
        }
        /* Non-causal (Gemma 3): one llama_decode of the whole chunk, which
         * llama.cpp allows only within one micro-batch (it asserts
         * n_ubatch >= n_tokens: an abort, so refused here, note 2a). */
        bool non_causal = mtmd_decode_use_non_causal(m->ctx, ch);
        /* M-RoPE images (note 2): every row's KV cell has the run's first
         * position, so no cache may end inside the run (a cut removes by
         * position), which is what a whole run is. */
        bool whole = non_causal || n_pos != n;
        if (non_causal && n > m->n_batch) {
            ks_set_err(err, errlen, "this projector's media are decoded with non-causal attention, each item in one "
                       "batch: an item of %d tokens needs a batch of at least %d (the engine's is %d: raise "
                       "--batch)", n, n, m->n_batch);
            return KS_EINVAL;
        }
        const char *id = mtmd_input_chunk_get_id(ch);
        uint64_t item = id ? strtoull(id, nullptr, 16) : 0;
        ordinal = item == last_item ? ordinal + 1 : 0;
        last_item = item;
        uint64_t hdr[3] = {item, (uint64_t)ordinal, (uint64_t)n};
        uint64_t h = XXH3_64bits(hdr, sizeof hdr);
        run r = {out->n, n, n_pos, ch, nullptr, whole, non_causal};
        for (int i = 0; i < n; i++) {
            int32_t t = pseudo_token(h, i);
            if (ks_tokens_push(out, t)) return KS_ENOMEM;
            s->toks.push_back(t);
        }
        s->runs.push_back(r);
    }
    return 0;
}

extern "C" int ks_media_tokenize(ks_media *m, const char *text, size_t len, bool add_special, bool parse_special,
                                 const ks_media_item *items, int n_items, ks_tokens *out, ks_media_set **set,
                                 char *err, size_t errlen) {
    *set = nullptr;
    if (!m || !text || n_items < 0 || (n_items > 0 && !items)) {
        ks_set_err(err, errlen, "bad arguments");
        return KS_EINVAL;
    }
    int n_markers = count_markers(text, len);
    if (n_markers != n_items) {
        ks_set_err(err, errlen, "the prompt has %d media markers for %d media items", n_markers, n_items);
        return KS_EINVAL;
    }
    int n0 = out->n;
    ks_media_set *s = new (std::nothrow) ks_media_set();
    if (!s) return KS_ENOMEM;
    s->m = m;
    std::vector<mtmd_bitmap *> bms;
    int rc = 0;
    try {
        rc = decode_items(m, items, n_items, bms, s->items, err, errlen);
        if (!rc) {
            s->chunks = mtmd_input_chunks_init();
            if (!s->chunks) rc = KS_ENOMEM;
        }
        if (!rc) {
            mtmd_input_text it = {text, len, add_special, parse_special};
            reason_scope rs;
            int32_t r = mtmd_tokenize(m->ctx, s->chunks, &it, (const mtmd_bitmap **)bms.data(), bms.size());
            if (r != 0) {
                ks_set_err(err, errlen, "the media could not be tokenized (%s)%s%s",
                           r == 1 ? "markers and items differ" : "preprocessing failed", rs.buf[0] ? ": " : "",
                           rs.buf);
                rc = KS_EINVAL;
            }
        }
        if (!rc) rc = take_chunks(m, s, out, err, errlen);
    } catch (const std::bad_alloc &) {
        rc = KS_ENOMEM;
    }
    for (mtmd_bitmap *b : bms) mtmd_bitmap_free(b);
    if (rc) {
        ks_tokens_truncate(out, n0);
        set_free(s);
        return rc;
    }
    if (n_items == 0) set_free(s);
    else *set = s;
    return 0;
}

/* ------------------------------------------------------------ set accessors */
extern "C" int ks_media_set_n_items(const ks_media_set *set) { return set ? (int)set->items.size() : 0; }
extern "C" uint64_t ks_media_set_item_hash(const ks_media_set *set, int i) {
    return set && i >= 0 && i < (int)set->items.size() ? set->items[(size_t)i] : 0;
}
extern "C" int ks_media_set_n_runs(const ks_media_set *set) { return set ? (int)set->runs.size() : 0; }
extern "C" void ks_media_set_run(const ks_media_set *set, int k, int *pos, int *n) {
    *pos = set->runs[(size_t)k].pos;
    *n = set->runs[(size_t)k].n;
}

extern "C" int ks_media_set_find(const ks_media_set *set, int p) {
    if (!set) return -1;
    /* Binary search: runs are ascending and disjoint. */
    int lo = 0, hi = (int)set->runs.size() - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        const run &r = set->runs[(size_t)mid];
        if (p < r.pos) hi = mid - 1;
        else if (p >= r.pos + r.n) lo = mid + 1;
        else return mid;
    }
    return -1;
}

extern "C" bool ks_media_set_run_whole(const ks_media_set *set, int k) {
    return set && k >= 0 && k < (int)set->runs.size() && set->runs[(size_t)k].whole;
}

extern "C" int ks_media_set_kv_pos(const ks_media_set *set, int i) {
    if (!set) return i;
    int shift = 0; /* tokens beyond positions of the runs before i */
    for (const run &r : set->runs) {
        if (r.pos + r.n <= i) shift += r.n - r.n_pos;
        else {
            if (r.pos <= i && r.n_pos != r.n) return r.pos - shift;
            break;
        }
    }
    return i - shift;
}

extern "C" bool ks_media_set_shifts(const ks_media_set *set) {
    if (set)
        for (const run &r : set->runs)
            if (r.n_pos != r.n) return true;
    return false;
}

extern "C" int ks_media_set_cut(const ks_media_set *set, int n) {
    int k = ks_media_set_find(set, n);
    if (k < 0) return n;
    const run &r = set->runs[(size_t)k];
    return r.whole && r.pos < n ? r.pos : n;
}

extern "C" bool ks_media_set_covers(const ks_media_set *set, const int32_t *toks, int n) {
    /* Every run that starts before n is all there: a run cut by text would
     * have text rows decoded as media rows (and a whole run, note 2a, could
     * not be decoded at all). */
    if (set)
        for (const run &r : set->runs)
            if (r.pos < n && r.pos + r.n > n) return false;
    size_t j = 0; /* index into set->toks, run by run */
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (!ks_token_is_media(toks[i])) continue;
        if (!set) return false;
        while (k < (int)set->runs.size() && i >= set->runs[(size_t)k].pos + set->runs[(size_t)k].n) {
            j += (size_t)set->runs[(size_t)k].n;
            k++;
        }
        if (k >= (int)set->runs.size() || i < set->runs[(size_t)k].pos) return false;
        if (set->toks[j + (size_t)(i - set->runs[(size_t)k].pos)] != toks[i]) return false;
    }
    /* ... and no text token inside a run. */
    if (set)
        for (const run &r : set->runs)
            for (int i = r.pos; i < r.pos + r.n && i < n; i++)
                if (!ks_token_is_media(toks[i])) return false;
    return true;
}

/* ------------------------------------------------------------------ decode */
static int encode_run(ks_media *m, run &r) {
    double t0 = ks_now_ms();
    if (mtmd_encode_chunk(m->ctx, r.chunk) != 0) {
        KS_ERROR(MOD, "the projector failed to encode a media chunk of %d tokens", r.n);
        return KS_EDECODE;
    }
    const float *src = mtmd_get_output_embd(m->ctx);
    size_t n = (size_t)r.n * (size_t)m->n_embd;
    r.embd = (float *)malloc(n * sizeof(float));
    if (!r.embd) return KS_ENOMEM;
    memcpy(r.embd, src, n * sizeof(float));
    double ms = ks_now_ms() - t0;
    m->st.encodes++;
    m->st.encoded_tokens += (uint64_t)r.n;
    m->st.encode_ms_total += ms;
    KS_DEBUG(MOD, "encoded a media chunk of %d tokens in %.1f ms", r.n, ms);
    return 0;
}

/* One decode call of rows [i, i + take) of r, with a throwaway copy of a
 * lone row at the next position when pad. kv0: the KV position of the run's
 * first row (ks_media_set_kv_pos). pos: room for 4 (take + 1) positions when
 * the text model takes 4 a row (M-RoPE), in llama_batch's layout: section s
 * of row j at s * n_tokens + j. */
static int decode_rows(ks_media *m, struct llama_context *lctx, llama_batch &b, llama_pos *pos, const run &r, int kv0,
                       int i, int take, int seq, bool pad) {
    int n_embd = m->n_embd;
    int n = take + (pad ? 1 : 0);
    const mtmd_image_tokens *img = m->mrope ? mtmd_input_chunk_get_tokens_image(r.chunk) : nullptr;
    b.n_tokens = 0;
    b.pos = pos;
    for (int j = 0; j < n; j++) {
        int row = i + (j < take ? j : take - 1) - r.pos;
        memcpy(b.embd + (size_t)j * (size_t)n_embd, r.embd + (size_t)row * (size_t)n_embd,
               sizeof(float) * (size_t)n_embd);
        /* Rows one position each (the pad: the next one); an M-RoPE image's
         * rows as mtmd-helper's mtmd_helper_decode_image_chunk gives them
         * (t, y, x, z: set_position_mrope_2d's order). */
        int p = kv0 + row + (j < take ? 0 : 1);
        if (!m->mrope) pos[j] = p;
        else if (img) {
            mtmd_decoder_pos dp = mtmd_image_tokens_get_decoder_pos(img, kv0, (size_t)row);
            pos[j] = (llama_pos)dp.t;
            pos[j + n] = (llama_pos)dp.y;
            pos[j + 2 * n] = (llama_pos)dp.x;
            pos[j + 3 * n] = (llama_pos)dp.z;
        } else
            for (int s = 0; s < 4; s++) pos[j + s * n] = p;
        b.n_seq_id[j] = 1;
        b.seq_id[j][0] = seq;
        b.logits[j] = 0;
        b.n_tokens++;
    }
    int ret = llama_decode(lctx, b);
    /* A memory that cannot drop the copy (recurrent, hybrid) never decodes in
     * pairs (engine.h): the sequence would hold a row too many. Never for a
     * run of fewer positions than rows: whole runs take no pad. */
    if (pad && !llama_memory_seq_rm(llama_get_memory(lctx), seq, kv0 + (i + take - r.pos), -1) && ret == 0)
        return KS_EINVAL;
    if (ret == 0) return 0;
    if (ret == 1) return KS_EFULL;
    if (ret == 2) return KS_ECANCELED;
    KS_ERROR(MOD, "llama_decode failed (%d) on %d media rows", ret, take);
    return KS_EDECODE;
}

extern "C" int ks_media_decode(ks_engine *e, ks_media_set *set, int k, int p0, int p1, int seq, bool pairs,
                               bool *encoded) {
    if (encoded) *encoded = false;
    ks_media *m = ks_engine_media(e);
    if (!m || !set || set->m != m || k < 0 || k >= (int)set->runs.size()) return KS_EINVAL;
    run &r = set->runs[(size_t)k];
    if (p0 < r.pos || p1 > r.pos + r.n || p0 >= p1) return KS_EINVAL;
    int n_batch = ks_engine_n_batch(e);
    /* A whole run (note 2a): all of it or nothing, a non-causal one in one call. */
    if (r.whole && (p0 != r.pos || p1 != r.pos + r.n || (r.non_causal && r.n > n_batch))) return KS_EINVAL;
    if (!r.embd) {
        int rc = encode_run(m, r);
        if (rc) return rc;
        if (encoded) *encoded = true;
    }
    struct llama_context *lctx = ks__engine_ctx(e);
    llama_batch b = llama_batch_init(n_batch + 1, m->n_embd, 1);
    if (!b.embd) return KS_ENOMEM;
    /* Positions: the batch's own array has one a row; M-RoPE takes 4. */
    llama_pos *pos_own = b.pos;
    llama_pos *pos = (llama_pos *)malloc(sizeof(llama_pos) * 4 * (size_t)(n_batch + 1));
    if (!pos) {
        llama_batch_free(b);
        return KS_ENOMEM;
    }
    int kv0 = ks_media_set_kv_pos(set, r.pos);
    int rc = 0;
    if (r.non_causal) {
        /* A whole non-causal run: its rows see each other both ways, and
         * only them beyond the sequence before p0 (the caller's duty): one
         * call, no throwaway row, which the run's rows would see. The context
         * goes back to causal at once: every other decode is causal. */
        llama_set_causal_attn(lctx, false);
        rc = decode_rows(m, lctx, b, pos, r, kv0, p0, p1 - p0, seq, false);
        llama_set_causal_attn(lctx, true);
        if (!rc) m->st.decoded_tokens += (uint64_t)(p1 - p0);
    } else {
        /* Calls of n_batch rows, never leaving a lone row for the last one
         * (n_batch >= 4): with pairs, a lone row gets a throwaway companion.
         * An M-RoPE image (whole, note 2: causal, the mask orders its rows,
         * which share one position, by their (y, x)) is decoded from its
         * first row in the same calls every time and takes no throwaway row
         * (it would take a position inside the run's), so cached or not the
         * calls are the same. */
        bool pad = pairs && !r.whole;
        for (int i = p0; i < p1 && !rc;) {
            int take = p1 - i < n_batch ? p1 - i : n_batch;
            if ((pairs || r.whole) && p1 - (i + take) == 1 && take > 2) take--;
            rc = decode_rows(m, lctx, b, pos, r, kv0, i, take, seq, pad && take == 1);
            if (!rc) m->st.decoded_tokens += (uint64_t)take;
            i += take;
        }
    }
    b.pos = pos_own;
    free(pos);
    llama_batch_free(b);
    return rc;
}

extern "C" void ks_media_stats_get(const ks_engine *e, ks_media_stats *out) {
    const ks_media *m = ks_engine_media(e);
    if (m) *out = m->st;
    else memset(out, 0, sizeof *out);
}
