/*
 * serve_models.h — what `kvstash serve` loads for one model: its engine (and
 * projector, draft model), its System Prompt Cache, its KV store and its
 * scheduler, from the model's settings (a ks_config: the top level with its
 * models.<name> entry applied). The server's table of models (server.h
 * "several models") calls ks_serve_model_load / _unload through its loader;
 * with one model (-m), cmd_serve.c opens it before the server starts, as it
 * always did, and the table's first load takes it over.
 *
 * A model's store is opened at its first load and stays open until the
 * process ends (ks_serve_model_final): an unloaded model's conversations
 * (its slots, saved with reason "unload") stay in its RAM tier, shm and disk,
 * where its next load finds them.
 *
 * Thread model: a model's calls run one at a time (the table's loading
 * thread, or the main thread before the server starts and after it stops).
 */
#ifndef KS_CLI_SERVE_MODELS_H
#define KS_CLI_SERVE_MODELS_H

#include <pthread.h>
#include <stdbool.h>

#include "cache/spc.h"
#include "cache/store.h"
#include "cli/serve_flags.h"
#include "cli/serve_store.h"
#include "config/config.h"
#include "engine/engine.h"
#include "sched/draft_model.h"
#include "sched/draft_ngram.h"
#include "sched/sched.h"
#include "server/server.h"

typedef struct ks_serve_model {
    char name[256];             /* the id clients use */
    ks_config *cfg;             /* the model's settings (owned) */
    int flash_attn;             /* KS_FA_* (--flash-attn) */
    const ks_serve_secret *secret; /* the store's key (borrowed) */
    bool quiet_start;           /* several models: no "listening" details per model */
    /* made by a load, freed by an unload */
    ks_engine *e, *draft_e;
    ks_draft_model_cfg dmc;     /* the drafters and /metrics read it while loaded */
    ks_ngram_params ngram;
    const ks_drafter_ops *drafter;
    ks_spc *spc;
    ks_sched *sched;
    ks_metrics *metrics;        /* this model's /metrics sources */
    char *tmpl_text;            /* --chat-template's source, NULL: the GGUF's */
    char model_id[KS_MAX_PATH + 1024];
    const char *spec_name;      /* what drafts, by llama-server's names */
    bool loaded;
    /* kept from the first load to the end */
    ks_store *store;
    ks_store_mode store_mode;
    ks_store_cfg store_cfg;
    bool store_opened;
    ks_store *draft_store;      /* the draft model's states (draft_model.h), beside store */
    bool draft_store_opened;
    /* The store's model fingerprint (every byte of the weights hashed: tens
     * of ms per 100 MB) is computed by a thread of its own while the engine
     * loads, before the store's first open (ks_serve_model_engine starts it,
     * ks_serve_model_rest or a failed load joins it). */
    pthread_t fp_thread;
    bool fp_running;
    int fp_rc;                  /* 0: fp holds it (else the store's open computes it again,
                                   saying why it fails) */
    uint8_t fp[32];
} ks_serve_model;

/* Opens the engine of sm->cfg (the model, its context, slots, KV types,
 * offload) and logs what the probe found. 0, KS_EINVAL (a setting the
 * engine or the flags refuse: a usage error) or another error; err says. */
int ks_serve_model_engine(ks_serve_model *sm, char *err, size_t errlen);
/* The rest, after the engine: projector (mmproj: --mmproj over the entry's
 * and the top level's), draft model, SPC, store (first time), scheduler.
 * On failure everything of this load is freed but the engine; err says. */
int ks_serve_model_rest(ks_serve_model *sm, const char *mmproj_flag, const char *chat_template_file, char *err,
                        size_t errlen);
/* The parts the server needs of a loaded model. */
void ks_serve_model_parts(ks_serve_model *sm, ks_server_model_parts *out);
/* Stops the scheduler alone (the server stops: its slots to the store with
 * KS_REASON_SHUTDOWN); the engine stays for ks_serve_model_unload. */
void ks_serve_model_stop(ks_serve_model *sm);
/* Frees what a load made: the scheduler first (its slots to the store with
 * KS_REASON_UNLOAD, or KS_REASON_SHUTDOWN), then SPC, draft model, engine,
 * metrics. The store stays. Idempotent. */
void ks_serve_model_unload(ks_serve_model *sm, bool shutdown);
/* Closes the store (writing what is queued) and frees sm's settings. */
void ks_serve_model_final(ks_serve_model *sm);

/* The KV cache's types of c by name: 0 and *k, *v (-1: the default), or 2
 * (said on stderr, naming the flag) for an unknown name or a quantized V
 * without flash attention. */
int ks_serve_kv_types(const ks_config *c, int flash_attn, int *k, int *v);
/* The speculative decoding setup of c->spec: *ops NULL for "none"; 2 (said)
 * for an unknown type or a bad setting. */
int ks_serve_spec_setup(const ks_config *c, ks_ngram_params *np, const ks_drafter_ops **ops);

/* The models of a several-model configuration (c's models: entries with a
 * path, and models_dir's GGUFs): each model's settings (owned by *out,
 * ks_serve_models_free) and the table's entries (cfgs, names borrowed from
 * models). 0 and *n (0: c is a one-model configuration), or 2 (said). */
int ks_serve_models_plan(const ks_config *c, const ks_serve_flags *f, ks_serve_model **out, int *n);
void ks_serve_models_free(ks_serve_model *v, int n);

#endif
