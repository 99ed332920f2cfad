/*
 * refusals.h — the server log's record of refused requests (4xx).
 *
 * A client that a server refuses is invisible unless the refusal is in the
 * log, yet one misbehaving client can send thousands of identical requests.
 * So every refusal is written at the default level (warn) the first time its
 * cause is seen — route, status, error code and field, with the field's array
 * indices folded ("messages.1.role" and "messages.7.role" are one cause) — and
 * again, with the count, when that cause reaches 10, 100, 1000, ...
 * occurrences. Every other occurrence goes to the debug level.
 *
 * At most KS_REFUSALS_MAX distinct causes are remembered; a cause beyond them
 * is logged at warn every time its hash is not remembered, so nothing is
 * hidden, only repetition is.
 *
 * Thread model: one ks_refusals per server; ks_refusals_note may be called
 * from any number of HTTP threads at once (a mutex guards the table).
 */
#ifndef KS_REFUSALS_H
#define KS_REFUSALS_H

#include <stdint.h>

#define KS_REFUSALS_MAX 256

typedef struct ks_refusals ks_refusals;

/* NULL on ENOMEM. free(NULL) is a no-op. */
ks_refusals *ks_refusals_create(void);
void ks_refusals_free(ks_refusals *r);

/* Records one refusal and logs it as described above. method and path name
 * the route ("POST", "/v1/messages"); code and param may be NULL or "";
 * message is the error message sent to the client. r NULL: nothing. Returns
 * how many times this cause has been seen, this one included (0: r NULL). */
uint64_t ks_refusals_note(ks_refusals *r, const char *method, const char *path, int status, const char *code,
                          const char *param, const char *message);

/* The same for what a request carried and the server went on without (an
 * unknown field ignored, a hosted tool dropped: api.h, ks_api_notes): logged
 * at warn once per (route, field, what) with the same repetition rule. */
uint64_t ks_refusals_ignored(ks_refusals *r, const char *method, const char *path, const char *field,
                             const char *what);

#endif
