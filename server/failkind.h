/* How a call to an upstream (a KV worker, or the --backend) failed, generated from one table:
 * the label of chunkgate_worker_errors_total{kind} and chunkgate_backend_errors_total{kind},
 * the reply the client gets when the failure ends its request, and whether it takes a
 * worker out of routing. The client-facing error itself (OpenAI type, code, message) is the
 * row of base/status.h that the kind names. */
#ifndef CG_FAILKIND_H
#define CG_FAILKIND_H

#include "base/status.h"

/* X(enum, label, http, status, down, worker):
 *   http, status: the reply to a request this failure ends before any answer was sent;
 *   down: 1 when a worker failing this way is marked down until a health probe answers;
 *   worker: 1 when a worker call can fail this way (a series of
 *     chunkgate_worker_errors_total); every kind is a series of chunkgate_backend_errors_total. */
#define CG_FAILKIND_TABLE(X)                                                                       \
    X(CG_FAIL_CONNECT, "connect", 502, CG_E_UNAVAILABLE, 1, 1)                                     \
    X(CG_FAIL_TIMEOUT, "timeout", 504, CG_E_TIMEOUT, 1, 1)                                         \
    X(CG_FAIL_STATUS, "status", 502, CG_E_BAD_GATEWAY, 0, 1)                                       \
    X(CG_FAIL_INVALID, "invalid", 502, CG_E_BAD_GATEWAY, 0, 1)                                     \
    X(CG_FAIL_TOO_LARGE, "too_large", 502, CG_E_BAD_GATEWAY, 0, 0)                                 \
    X(CG_FAIL_STREAM, "stream", 502, CG_E_BAD_GATEWAY, 0, 1)

typedef enum {
#define CG_FAILKIND_ENUM(e, label, http, status, down, worker) e,
    CG_FAILKIND_TABLE(CG_FAILKIND_ENUM)
#undef CG_FAILKIND_ENUM
        CG_FAILKIND_COUNT
} cg_failkind;

/* The metric label ("connect", "timeout", ...), or "unknown"; static storage. */
const char *cg_failkind_name(cg_failkind k);
/* The HTTP status and the status (its OpenAI error) of the reply to a request that k ends. */
int cg_failkind_http(cg_failkind k);
cg_status cg_failkind_status(cg_failkind k);
/* 1: a worker failing this way is marked down until a health probe answers. */
int cg_failkind_marks_down(cg_failkind k);
/* 1: a worker call can fail this way (it has a chunkgate_worker_errors_total series). */
int cg_failkind_of_worker(cg_failkind k);
/* The kind of a failed call's status: CG_E_TIMEOUT is a timeout, CG_E_UNAVAILABLE a failed
 * connection, any other status is otherwise. */
cg_failkind cg_failkind_of(cg_status st, cg_failkind otherwise);

#endif
