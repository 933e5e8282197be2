/* The gateway's application state, shared by its modules (handlers, dispatcher, relay, admin,
 * status page), and the few helpers on it that every module uses. Not a public interface. */
#ifndef CG_GWSTATE_H
#define CG_GWSTATE_H

#include <pthread.h>
#include <jansson.h>
#include "backends/upstream.h"
#include "cache/key.h"
#include "cache/split.h"
#include "server/fallback.h"
#include "server/gwconfig.h"
#include "base/http.h"
#include "base/metrics.h"
#include "server/workers.h"
#include "sql/index.h"

typedef struct cg_gateway cg_gateway; /* as server/gateway.h names it */

struct cg_gateway {
    const cg_gateway_config *cfg; /* borrowed */
    cg_mode default_mode;
    cg_index *index;
    cg_metrics *metrics;
    cg_upstream *client; /* the one curl event loop: backend, workers */
    int has_backend;     /* --backend is set (the client's default base URL) */
    /* What --backend is (cg_openai_backend_is_worker): 1 a chunkgate-worker, 0 another server,
     * -1 not known yet (asked at start, then by the health thread until it answers); atomic */
    int backend_is_worker;
    int backend_asking;        /* atomic: a question to it is in flight */
    uint64_t backend_asked_ms; /* health thread only: when it was last asked */
    cg_workers *workers;
    struct cg_eventsync *events; /* NULL without --events */
    cg_http_server *http;
    char *index_path;
    /* Tenant id (cg_key_tenant_id) of each API key, in cfg->api_keys order; NULL without
     * keys. An authenticated request's chunk keys are salted with its tenant id. */
    char (*tenants)[CG_KEY_HEX_LEN + 1];

    /* Series updated on every request, looked up once. */
    cg_metric *m_seg_system, *m_seg_chunk, *m_seg_question;
    cg_metric *m_empty, *m_hits, *m_misses, *m_reused, *m_computed;
    cg_metric *m_fallbacks, *m_passthrough, *m_disconnects, *m_fast_path;
    cg_metric *m_fallback[CG_FALLBACK_COUNT]; /* by reason; [CG_FALLBACK_NONE] is NULL */
    cg_metric *m_releases, *m_ttft, *m_assemble;
    cg_metric *m_busy; /* assembles a worker answered 429 */

    /* /readyz caches the backend probe briefly so a busy prober cannot load the backend. */
    pthread_mutex_t ready_mu;
    uint64_t ready_at_ms; /* monotonic time of the last probe; 0 = never */
    cg_status ready_st;
    char ready_msg[256];

    struct cg_recent_ring *recent; /* the status page's recent requests (status.c) */
};

/* ---- helpers every module uses (gwstate.c) ---- */
/* The tenant id of the API key the request presented, or NULL (borrowed from g). */
const char *cg_gw_tenant(cg_gateway *g, cg_http_req *req);

/* Replies with an error from a (status, param, message) triple; message may be "". */
void cg_gw_reply_error(cg_http_req *req, cg_status st, const char *param, const char *msg);

/* Counts an upstream failure in chunkgate_backend_errors_total{kind}. */
void cg_gw_backend_error(cg_gateway *g, cg_failkind kind);

/* The help line of chunkgate_backend_errors_total (gateway.c registers every kind's series). */
#define CG_GW_BACKEND_ERRORS_HELP                                                                  \
    "Backend failures: connect, timeout, status, invalid, too_large, stream."

#endif
