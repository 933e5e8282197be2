/* The gateway's status page: GET / (one self-contained HTML page) drawn from GET /v1/stats
 * (live totals, workers, and a ring of the last requests with their segment hits). */
#ifndef CG_SERVER_STATUS_H
#define CG_SERVER_STATUS_H

#include <stdint.h>
#include <jansson.h>
#include "base/http.h"

/* Requests the ring keeps for /v1/stats. */
#define CG_STATUS_RECENT 50

/* The ring of recent requests. Thread-safe. */
typedef struct cg_recent_ring cg_recent_ring;

/* One finished inference request, as the relay saw it. Every pointer is borrowed. */
typedef struct cg_recent_rec {
    const char *route;       /* "completions", "chat_completions" */
    const char *model;       /* the request's model, or NULL */
    int status;              /* HTTP status the client got (best knowledge of the relay) */
    long long cached_tokens; /* usage.prompt_tokens_details.cached_tokens forced, or -1 */
    double ttft_ms;          /* relay start to the first answer byte; < 0 when none */
    json_t *chunk_cache;     /* the answer's chunk_cache (segments, worker, fallback), or NULL */
} cg_recent_rec;

cg_recent_ring *cg_recent_ring_new(void);
/* NULL-safe; sets *r to NULL. */
void cg_recent_ring_free(cg_recent_ring **r);
/* Appends one request: its fields copied, its chunk_cache kept by reference (no prompt text,
 * only keys, roles, tokens, hits; it must not change afterwards). Oldest entries are dropped
 * beyond CG_STATUS_RECENT. r NULL is a no-op. */
void cg_recent_ring_add(cg_recent_ring *r, const cg_recent_rec *rec);
/* Requests added since start, and of those the ones answered with status >= 400. */
void cg_recent_ring_totals(cg_recent_ring *r, uint64_t *requests, uint64_t *errors);
/* The recent requests, newest first (new reference). */
json_t *cg_recent_ring_json(cg_recent_ring *r);

/* Route handlers (app is the cg_gateway). */
cg_http_handler_fn cg_gw_status_page;  /* GET /          text/html */
cg_http_handler_fn cg_gw_status_stats; /* GET /v1/stats  application/json */

#endif
