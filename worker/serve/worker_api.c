/* chunkgate-worker's HTTP API (openapi/worker.yaml): state, route table and the request
 * metrics. The handlers live in api_ops.c, api_assemble.c, api_complete.c, api_chat.c,
 * api_tokens.c and api_chunks.c. */
#include "worker/serve/worker_api.h"

#include <stdio.h>
#include <stdlib.h>

#include "worker/serve/api_assemble.h"
#include "worker/serve/api_chunks.h"
#include "worker/serve/api_common.h"
#include "worker/serve/api_complete.h"
#include "worker/serve/api_ops.h"
#include "worker/serve/api_tokens.h"

cg_worker_api_params cg_worker_api_default_params(void)
{
    return (cg_worker_api_params){
        .separator = CG_SPLIT_DEFAULT_SEPARATOR,
        .max_segments = 256,
        .default_max_tokens = 16,
        .tp = 1,
        .kv_timeout_ms = 5000,
        .kv_max_pulls = 4,
        .canary_rate = 0.01,
        .canary_tokens = 16,
        .canary_queue = 4,
        .stream_stall_ms = 30000,
    };
}

cg_worker_api *cg_worker_api_new(cg_worker_api_params p)
{
    cg_worker_api *a = cg_calloc(1, sizeof *a);
    a->p = p;
    if (!a->p.separator || !a->p.separator[0]) a->p.separator = CG_SPLIT_DEFAULT_SEPARATOR;
    if (!a->p.kv_sources) a->p.n_kv_sources = 0;
    if (a->p.tp < 1) a->p.tp = 1;
    if (a->p.kv_timeout_ms <= 0) a->p.kv_timeout_ms = 5000;
    if (a->p.kv_max_pulls < 1) a->p.kv_max_pulls = 1;
    if (a->p.remote_url && !a->p.remote_url[0]) a->p.remote_url = NULL;
    if (!a->p.remote_id || !a->p.remote_id[0]) a->p.remote_id = a->p.remote_url;
    a->e = p.engine;
    if (!(a->p.recompute_ratio >= 0 && a->p.recompute_ratio <= 1)) a->p.recompute_ratio = 0;
    a->metrics = cg_metrics_new();
    a->canary = cg_canary_new(a->e, a->metrics, a->p.canary_rate, a->p.canary_queue);
    /* queue time: prefill work waiting for its first piece, sequences waiting for a place */
    cg_sched_set_queue_histograms(
        cg_engine_sched(a->e),
        cg_metrics_histogram(a->metrics, P "queue_seconds",
                             "Time requests waited in the scheduler before computing, by phase",
                             "phase=\"prefill\"", cg_metrics_latency_buckets, cg_metrics_latency_n),
        cg_metrics_histogram(a->metrics, P "queue_seconds",
                             "Time requests waited in the scheduler before computing, by phase",
                             "phase=\"decode\"", cg_metrics_latency_buckets, cg_metrics_latency_n));
    if (a->p.instance_id && a->p.instance_id[0])
        snprintf(a->instance_id, sizeof a->instance_id, "%s", a->p.instance_id);
    else
        cg_api_random_hex(a->instance_id, 16);
    a->p.instance_id = NULL; /* borrowed for new only */
    a->started_ms = (int64_t)cg_wall_ms();
    return a;
}

void cg_worker_api_free(cg_worker_api **ap)
{
    cg_worker_api *a = *ap;
    if (!a) return;
    *ap = NULL;
    cg_canary_free(&a->canary); /* before the metrics it writes to */
    cg_metrics_free(&a->metrics);
    free(a);
}

void cg_worker_api_done(void *app, const char *route, int status, double seconds)
{
    cg_worker_api *a = app;
    char labels[160];
    snprintf(labels, sizeof labels, "route=\"%s\",code=\"%d\"", route, status);
    cg_metrics_inc(a->metrics, P "requests_total", "HTTP requests by route and status", labels, 1);
    snprintf(labels, sizeof labels, "route=\"%s\"", route);
    cg_metric_observe(cg_metrics_histogram(a->metrics, P "request_duration_seconds",
                                           "HTTP request duration by route", labels,
                                           cg_metrics_latency_buckets, cg_metrics_latency_n),
                      seconds);
}

/* ---- routes ---- */

#define KEY CG_ROUTE_ADMIN
static const cg_http_route routes[] = {
    {"GET", "/healthz", cg_api_health, CG_ROUTE_INLINE, "healthz"},
    /* Every route but /healthz is ADMIN: with --api-key (the server's admin token) it needs
     * that bearer token; without one it is open. */
    {"GET", "/metrics", cg_api_metrics, CG_ROUTE_INLINE | KEY, "metrics"},
    {"GET", "/v1/info", cg_api_info, CG_ROUTE_INLINE | KEY, "info"},
    {"GET", "/v1/models", cg_api_models, CG_ROUTE_INLINE | KEY, "models"},
    {"POST", "/v1/assemble", cg_api_assemble, KEY, "assemble"},
    {"DELETE", "/v1/assemblies/*", cg_api_assembly_delete, CG_ROUTE_INLINE | KEY,
     "assembly_delete"},
    {"GET", "/v1/assemblies/*/kv", cg_api_assembly_kv, KEY, "assembly_kv"},
    {"GET", "/v1/assemblies/*/logits", cg_api_assembly_logits, KEY, "assembly_logits"},
    {"POST", "/v1/completions", cg_api_completions, KEY, "completions"},
    {"POST", "/v1/chat/completions", cg_api_chat_completions, KEY, "chat_completions"},
    {"POST", "/tokenize", cg_api_tokenize, KEY, "tokenize"},
    {"POST", "/detokenize", cg_api_detokenize, KEY, "detokenize"},
    {"GET", "/v1/chunks", cg_api_chunks, CG_ROUTE_INLINE | KEY, "chunks"},
    {"GET", "/v1/chunks/*", cg_api_chunk_get, CG_ROUTE_INLINE | KEY, "chunk_get"},
    {"DELETE", "/v1/chunks/*", cg_api_chunk_delete, CG_ROUTE_INLINE | KEY, "chunk_delete"},
    {"GET", "/v1/chunks/*/kv", cg_api_chunk_kv, KEY, "chunk_kv"},
};
#undef KEY

const cg_http_route *cg_worker_api_routes(size_t *n_routes)
{
    *n_routes = CG_ARRAY_LEN(routes);
    return routes;
}
