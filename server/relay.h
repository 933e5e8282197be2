/* The gateway's upstream relay: forwards a request body to a backend or worker on the one curl
 * event loop and relays the answer (JSON or SSE) to the client, and GET /v1/models. */
#ifndef CG_GW_RELAY_H
#define CG_GW_RELAY_H

#include <jansson.h>
#include "base/http.h"
#include "server/gwstate.h"

/* Where a relay sends its request and what it does with the answer. */
typedef struct cg_gw_target {
    const char *route;       /* metrics/log label, e.g. "completions" */
    const char *model;       /* the request's model (borrowed for the call), for the status page */
    const char *base;        /* upstream base URL (borrowed for the call); NULL = --backend */
    const char *path;        /* "/v1/completions", "/v1/chat/completions" */
    int to_worker;           /* the upstream is a worker: its key, not the backend's */
    int to_chat;             /* the upstream speaks completions; answer in chat shape */
    long long cached_tokens; /* >= 0: usage.prompt_tokens_details.cached_tokens is this */
    int count_usage;         /* count usage.prompt_tokens - cached as computed tokens */
    cg_worker *worker;       /* taken over: released (in flight - 1) when the relay ends */
    const char *assembly_id; /* copied; the assembly on worker, released unless consumed */
    int backend_is_worker;   /* the upstream is worker itself (it consumes the assembly) */
    int strip_usage;         /* a stream's usage is counted but not relayed (not asked for) */
} cg_gw_target;

/* Upstream relay (relay.c). Takes over body (forwarded bytes), chunk_cache (a reference,
 * added to the answer; may be NULL) and t->worker. Ends the request: the reply comes from
 * the relay, possibly later and from another thread. */
void cg_gw_relay_to(cg_gateway *g, cg_http_req *req, const cg_gw_target *t, char *body,
                    size_t body_len, int stream, json_t *chunk_cache);

/* Upstream relay to --backend (a plain forward). */
void cg_gw_relay(cg_gateway *g, cg_http_req *req, const char *route, const char *path, char *body,
                 size_t body_len, int stream, json_t *chunk_cache);

/* Adds usage.prompt_tokens_details.cached_tokens (0) when absent, and counts the prompt
 * tokens the backend computed. */
void cg_gw_fix_usage(cg_gateway *g, json_t *obj);

/* GET /v1/models: the backend's or a healthy worker's list. */
cg_http_handler_fn cg_gw_models;

#endif
