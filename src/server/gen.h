/*
 * gen.h — the live generation (gen.c): a planned request's choices on the
 * scheduler, and the connection thread's side of their reply.
 *
 * The design notes and invariants H1-H4 are at the top of gen.c.
 *
 * Thread model: create, submit and reply on the request's connection
 * thread; the scheduler's callbacks on the inference thread;
 * ks__gen_request_done on MHD's request-completed callback.
 */
#ifndef KS_GEN_H
#define KS_GEN_H

#include "server/fmt.h"
#include "server/plan.h"
#include "server/server_int.h"

/* A generation of rq's choices on model m (held until the generation is freed) (n per prompt), replied in fmt's format
 * with its state st (stolen, also on failure). Takes from pl what the
 * output needs after the plan is gone (the parse options, the preserved
 * tokens); pl's stops are copied. NULL on ENOMEM. */
ks_gen *ks__gen_create(ks_server *s, ks_smodel *m, const ks_fmt *fmt, void *st, const ks_api_request *rq, ks_plan *pl);
/* "chatcmpl-...": the reply's id (borrowed for g's life). */
const char *ks__gen_id(const ks_gen *g);
/* Makes g the generation of request cn (its HTTP reference: the request
 * ends it, ks__gen_request_done) and queues every choice: for each prompt,
 * choice 0 first, then the others sharing its prefill. On failure fills e
 * (and *retry for a full queue) and cancels what was queued; the caller
 * replies with e. */
int ks__gen_submit(ks_gen *g, struct MHD_Connection *c, conn *cn, const ks_api_request *rq, const ks_plan *pl,
                   ks_api_error *e, bool *retry);
/* The reply of a submitted generation: a stream (MHD's content reader),
 * or the whole reply once every choice is done. */
enum MHD_Result ks__gen_reply(ks_gen *g, struct MHD_Connection *c, conn *cn);
/* The request ended (completed_ok: as it should): cancels an abandoned
 * generation and drops the HTTP reference. */
void ks__gen_request_done(ks_gen *g, bool completed_ok);

#endif
