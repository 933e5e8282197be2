/* The gateway's configuration table, lifetime, route table, and operations routes
 * (/healthz, /readyz, /metrics). */
#include "server/gateway.h"

#include "server/gwstate.h"
#include "server/admin.h"
#include "server/eventsync.h"
#include "server/fastpath.h"
#include "server/infer.h"
#include "server/relay.h"
#include "server/statuspage.h"
#include "backends/openai.h"
#include "base/remote.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- operations routes */

/* Records what --backend is (kind as cg_openai_backend_is_worker; -1 changes nothing). */
static void backend_kind_known(cg_gateway *g, int kind)
{
    if (kind < 0) return;
    if (kind)
        cg_log(CG_LOG_INFO,
               "--backend %s is a chunkgate-worker: plain prompts that fall back to it keep the "
               "tenant's cache_salt, chunk_mode and chunk_separator",
               g->cfg->backend);
    __atomic_store_n(&g->backend_is_worker, kind, __ATOMIC_RELEASE);
}

static void backend_answered(void *arg, int kind)
{
    cg_gateway *g = arg;
    backend_kind_known(g, kind);
    __atomic_store_n(&g->backend_asking, 0, __ATOMIC_RELEASE);
}

/* Until it is known, asks what --backend is, once a health interval, without blocking the
 * health thread: a chunkgate-worker splits a "# #" prompt itself, so a plain prompt that falls
 * back to it must carry the tenant's salt (server/orchestrate.c). */
static void ask_backend(void *ud, uint64_t now_ms)
{
    cg_gateway *g = ud;
    if (__atomic_load_n(&g->backend_is_worker, __ATOMIC_ACQUIRE) >= 0 ||
        __atomic_load_n(&g->backend_asking, __ATOMIC_ACQUIRE))
        return;
    if (now_ms - g->backend_asked_ms < (uint64_t)g->cfg->health_interval_ms) return;
    g->backend_asked_ms = now_ms;
    __atomic_store_n(&g->backend_asking, 1, __ATOMIC_RELEASE);
    if (cg_openai_ask_backend_kind(g->client, (long)g->cfg->health_timeout_ms, backend_answered,
                                   g) != CG_OK)
        __atomic_store_n(&g->backend_asking, 0, __ATOMIC_RELEASE);
}

static void h_healthz(cg_http_req *req, void *app)
{
    cg_http_reply_json(req, 200, json_pack("{s:s}", "status", "ok"));
}

/* Readiness: the index answers and the backend is reachable. The probe result is kept for
 * READY_CACHE_MS so readiness checks never add load proportional to their rate. */
#define READY_CACHE_MS 2000
#define READY_PROBE_MS 1000

static void h_readyz(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    cg_index_stats stats;
    if (cg_index_stats_get(g->index, &stats) != CG_OK) {
        cg_http_reply_error_status(req, 503, CG_E_IO, NULL, "the chunk index cannot be read");
        return;
    }
    if (!g->has_backend) {
        /* Without --backend the workers answer completions: ready with one healthy worker. */
        if (!cg_workers_healthy(g->workers)) {
            cg_http_reply_error_status(req, 503, CG_E_UNAVAILABLE, NULL,
                                       cg_workers_count(g->workers)
                                           ? "no backend is configured and no worker is healthy"
                                           : "no backend (--backend) or worker (--worker) is "
                                             "configured");
            return;
        }
        cg_http_reply_json(req, 200,
                           json_pack("{s:s, s:{s:s, s:s}}", "status", "ready", "checks", "index",
                                     "ok", "workers", "ok"));
        return;
    }
    uint64_t now = cg_now_ms();
    pthread_mutex_lock(&g->ready_mu);
    if (!g->ready_at_ms || now - g->ready_at_ms >= READY_CACHE_MS) {
        /* Probing under the lock makes concurrent checks share one probe. */
        long http = 0;
        g->ready_st =
            cg_openai_probe(g->client, READY_PROBE_MS, &http, g->ready_msg, sizeof g->ready_msg);
        g->ready_at_ms = cg_now_ms();
    }
    cg_status st = g->ready_st;
    char msg[sizeof g->ready_msg + 32];
    snprintf(msg, sizeof msg, "backend unreachable: %s", g->ready_msg);
    pthread_mutex_unlock(&g->ready_mu);
    if (st != CG_OK) {
        cg_http_reply_error_status(req, 503, CG_E_UNAVAILABLE, NULL, msg);
        return;
    }
    cg_http_reply_json(req, 200,
                       json_pack("{s:s, s:{s:s, s:s}}", "status", "ready", "checks", "index", "ok",
                                 "backend", "ok"));
}

static void h_metrics(cg_http_req *req, void *app)
{
    cg_gateway *g = app;
    cg_buf out;
    cg_buf_init_unbounded(&out); /* the process's own series: fixed names, labels and workers */
    cg_metrics_render(g->metrics, &out);
    cg_index_stats s;
    if (cg_index_stats_get(g->index, &s) == CG_OK) {
        /* Read from the index at scrape time: they are the index's own totals. */
        cg_status st = cg_buf_printf(
            &out,
            "# HELP chunkgate_index_chunks Chunks in the index.\n"
            "# TYPE chunkgate_index_chunks gauge\nchunkgate_index_chunks %lld\n"
            "# HELP chunkgate_index_bytes Segment text bytes of the indexed chunks.\n"
            "# TYPE chunkgate_index_bytes gauge\nchunkgate_index_bytes %lld\n"
            "# HELP chunkgate_index_placements Chunk placements on workers.\n"
            "# TYPE chunkgate_index_placements gauge\nchunkgate_index_placements %lld\n"
            "# HELP chunkgate_index_file_bytes Size of the index database file.\n"
            "# TYPE chunkgate_index_file_bytes gauge\nchunkgate_index_file_bytes %lld\n"
            "# HELP chunkgate_index_writer_batches_total Write transactions committed.\n"
            "# TYPE chunkgate_index_writer_batches_total counter\n"
            "chunkgate_index_writer_batches_total %llu\n"
            "# HELP chunkgate_index_writer_ops_applied_total Index updates committed.\n"
            "# TYPE chunkgate_index_writer_ops_applied_total counter\n"
            "chunkgate_index_writer_ops_applied_total %llu\n"
            "# HELP chunkgate_index_writer_ops_failed_total Index updates that failed.\n"
            "# TYPE chunkgate_index_writer_ops_failed_total counter\n"
            "chunkgate_index_writer_ops_failed_total %llu\n"
            "# HELP chunkgate_index_writer_ops_dropped_total Index updates dropped (queue full).\n"
            "# TYPE chunkgate_index_writer_ops_dropped_total counter\n"
            "chunkgate_index_writer_ops_dropped_total %llu\n"
            "# HELP chunkgate_index_writer_queue_depth Index updates waiting for the writer.\n"
            "# TYPE chunkgate_index_writer_queue_depth gauge\n"
            "chunkgate_index_writer_queue_depth %llu\n",
            (long long)s.chunks, (long long)s.bytes, (long long)s.placements,
            (long long)s.file_bytes, (unsigned long long)s.batches,
            (unsigned long long)s.ops_applied, (unsigned long long)s.ops_failed,
            (unsigned long long)s.ops_dropped, (unsigned long long)s.queue_depth);
        (void)st;
    }
    cg_http_stats hs;
    cg_http_get_stats(g->http, &hs);
    size_t in_flight = cg_upstream_in_flight(g->client);
    cg_status cst = cg_buf_printf(
        &out,
        "# HELP chunkgate_http_connections Open client connections.\n"
        "# TYPE chunkgate_http_connections gauge\nchunkgate_http_connections %zu\n"
        "# HELP chunkgate_http_connections_refused_total Connections closed at accept because "
        "--max-connections were open.\n"
        "# TYPE chunkgate_http_connections_refused_total counter\n"
        "chunkgate_http_connections_refused_total %llu\n"
        "# HELP chunkgate_http_connections_timed_out_total Connections closed because they did "
        "not send a complete request within --conn-timeout-s.\n"
        "# TYPE chunkgate_http_connections_timed_out_total counter\n"
        "chunkgate_http_connections_timed_out_total %llu\n"
        "# HELP chunkgate_http_headers_too_large_total Requests refused with 431.\n"
        "# TYPE chunkgate_http_headers_too_large_total counter\n"
        "chunkgate_http_headers_too_large_total %llu\n"
        "# HELP chunkgate_http_malformed_total Requests refused by the raw framing check "
        "(400, 413, 414, 501, 505) before routing.\n"
        "# TYPE chunkgate_http_malformed_total counter\n"
        "chunkgate_http_malformed_total %llu\n"
        "# HELP chunkgate_http_lingering_closes_total Connections read to the end (bounded) "
        "before being closed, so a client still sending sees the answer.\n"
        "# TYPE chunkgate_http_lingering_closes_total counter\n"
        "chunkgate_http_lingering_closes_total %llu\n",
        hs.connections, (unsigned long long)hs.refused, (unsigned long long)hs.timed_out,
        (unsigned long long)hs.headers_too_large, (unsigned long long)hs.malformed,
        (unsigned long long)hs.lingered);
    (void)cst;
    cg_status st = cg_buf_printf(
        &out,
        "# HELP chunkgate_upstream_in_flight Backend and worker transfers in flight.\n"
        "# TYPE chunkgate_upstream_in_flight gauge\n"
        "chunkgate_upstream_in_flight %zu\n"
        "# HELP chunkgate_workers Registered workers.\n"
        "# TYPE chunkgate_workers gauge\nchunkgate_workers %zu\n"
        "# HELP chunkgate_workers_healthy Registered workers passing their health checks.\n"
        "# TYPE chunkgate_workers_healthy gauge\nchunkgate_workers_healthy %zu\n",
        in_flight, cg_workers_count(g->workers), cg_workers_healthy(g->workers));
    (void)st;
    cg_http_reply_raw(req, 200, "text/plain; version=0.0.4; charset=utf-8",
                      out.data ? out.data : "", out.len);
    cg_buf_free(&out);
}

/* ---------------------------------------------------------------- routes, metrics */

static const cg_http_route routes[] = {
    {"POST", "/v1/completions", cg_gw_completions, CG_ROUTE_AUTH, "completions"},
    {"POST", "/v1/chat/completions", cg_gw_chat_completions, CG_ROUTE_AUTH, "chat_completions"},
    {"GET", "/v1/models", cg_gw_models, CG_ROUTE_AUTH, "models"},
    {"POST", "/tokenize", cg_gw_tokenize, CG_ROUTE_AUTH, "tokenize"},
    {"POST", "/detokenize", cg_gw_detokenize, CG_ROUTE_AUTH, "detokenize"},
    {"GET", "/healthz", h_healthz, CG_ROUTE_INLINE, "healthz"},
    {"GET", "/readyz", h_readyz, 0, "readyz"},
    {"GET", "/metrics", h_metrics, 0, "metrics"},
    /* The page is static and holds no data; /v1/stats (worker URLs, recent requests) is admin. */
    {"GET", "/", cg_gw_status_page, CG_ROUTE_INLINE, "status_page"},
    {"GET", "/v1/stats", cg_gw_status_stats, CG_ROUTE_ADMIN, "stats"},
    {"GET", "/v1/chunks", cg_gw_chunks_list, CG_ROUTE_ADMIN, "chunks_list"},
    /* Also open to API keys, scoped to the caller's tenant (admin.c). */
    {"POST", "/v1/chunks/lookup", cg_gw_chunks_lookup, CG_ROUTE_ADMIN | CG_ROUTE_AUTH,
     "chunks_lookup"},
    {"GET", "/v1/chunks/*", cg_gw_chunk_get, CG_ROUTE_ADMIN, "chunk_get"},
    {"DELETE", "/v1/chunks/*", cg_gw_chunk_delete, CG_ROUTE_ADMIN, "chunk_delete"},
    {"POST", "/v1/chunks/*/pin", cg_gw_chunk_pin, CG_ROUTE_ADMIN, "chunk_pin"},
    {"POST", "/v1/chunks/*/unpin", cg_gw_chunk_unpin, CG_ROUTE_ADMIN, "chunk_unpin"},
    {"GET", "/v1/workers", cg_gw_workers_list, CG_ROUTE_ADMIN, "workers_list"},
    {"POST", "/v1/workers", cg_gw_workers_add, CG_ROUTE_ADMIN, "workers_add"},
    {"DELETE", "/v1/workers", cg_gw_workers_delete, CG_ROUTE_ADMIN, "workers_delete"},
    {"GET", "/v1/workers/*", cg_gw_worker_get, CG_ROUTE_ADMIN, "worker_get"},
    {"DELETE", "/v1/workers/*", cg_gw_worker_delete, CG_ROUTE_ADMIN, "worker_delete"},
    {"POST", "/v1/workers/*/sync", cg_gw_worker_sync, CG_ROUTE_ADMIN, "worker_sync"},
};
/* Fast handlers (server/fastpath.h), by index into routes: routes[0] is completions. */
static const cg_http_fast_handler fast_handlers[CG_ARRAY_LEN(routes)] = {
    [0] = cg_gw_completions_fast};

static void on_done(void *app, const char *route, int status, double seconds)
{
    cg_gateway *g = app;
    char labels[128];
    snprintf(labels, sizeof labels, "route=\"%s\",code=\"%d\"", route, status);
    cg_metrics_inc(g->metrics, "chunkgate_requests_total", "HTTP requests by route and status.",
                   labels, 1);
    snprintf(labels, sizeof labels, "route=\"%s\"", route);
    cg_metric_observe(cg_metrics_histogram(g->metrics, "chunkgate_request_duration_seconds",
                                           "Time from request to the end of the reply.", labels,
                                           cg_metrics_latency_buckets, cg_metrics_latency_n),
                      seconds);
}

/* Creates every fixed series up front, so a scrape shows them at 0 before any traffic. */
static void metrics_setup(cg_gateway *g)
{
    cg_metrics *m = g->metrics;
    const char *seg = "Prompt segments seen, by role.";
    g->m_seg_system = cg_metrics_counter(m, "chunkgate_segments_total", seg, "role=\"system\"");
    g->m_seg_chunk = cg_metrics_counter(m, "chunkgate_segments_total", seg, "role=\"chunk\"");
    g->m_seg_question = cg_metrics_counter(m, "chunkgate_segments_total", seg, "role=\"question\"");
    g->m_empty =
        cg_metrics_counter(m, "chunkgate_empty_segments_total",
                           "Segments skipped because they were empty after trimming.", NULL);
    g->m_hits = cg_metrics_counter(m, "chunkgate_chunk_hits_total",
                                   "Cacheable segments served from cached KV.", NULL);
    g->m_misses = cg_metrics_counter(m, "chunkgate_chunk_misses_total",
                                     "Cacheable segments whose KV was not reused.", NULL);
    g->m_reused = cg_metrics_counter(m, "chunkgate_tokens_reused_total",
                                     "Prompt tokens whose KV was reused.", NULL);
    g->m_computed = cg_metrics_counter(m, "chunkgate_tokens_computed_total",
                                       "Prompt tokens the backend computed (from usage).", NULL);
    g->m_fallbacks = cg_metrics_counter(
        m, "chunkgate_fallbacks_total",
        "Requests with cacheable segments served without KV reuse (pass-through).", NULL);
    g->m_passthrough =
        cg_metrics_counter(m, "chunkgate_passthrough_total",
                           "Requests without a separator, forwarded unchanged.", NULL);
    g->m_fast_path = cg_metrics_counter(
        m, "chunkgate_fast_path_total",
        "Pass-through requests forwarded by the fast path: their bytes as they came, no parse.",
        NULL);
    cg_fallback_metrics(m, g->m_fallback);
    g->m_busy = cg_metrics_counter(
        m, "chunkgate_worker_busy_total",
        "Assembles a worker answered 429 (at its --max-running + --max-queue): routed to "
        "another worker, or the 429 passed on when every worker was busy",
        NULL);
    g->m_releases = cg_metrics_counter(
        m, "chunkgate_assembly_releases_total",
        "Assemblies released on their worker because no completion consumed them (client left, "
        "backend failed).",
        NULL);
    g->m_assemble = cg_metrics_histogram(m, "chunkgate_assemble_seconds",
                                         "Time from routing to the worker's assemble answer.", NULL,
                                         cg_metrics_latency_buckets, cg_metrics_latency_n);
    g->m_disconnects = cg_metrics_counter(
        m, "chunkgate_client_disconnects_total",
        "Requests whose client left before the answer ended (upstream cancelled).", NULL);
    for (int k = 0; k < CG_FAILKIND_COUNT; k++) {
        char labels[64];
        snprintf(labels, sizeof labels, "kind=\"%s\"", cg_failkind_name((cg_failkind)k));
        cg_metrics_counter(m, "chunkgate_backend_errors_total", CG_GW_BACKEND_ERRORS_HELP, labels);
    }
    g->m_ttft = cg_metrics_histogram(m, "chunkgate_ttft_seconds",
                                     "Time from request to the first answer byte sent (streams: "
                                     "the first event).",
                                     NULL, cg_metrics_latency_buckets, cg_metrics_latency_n);
}

/* ---------------------------------------------------------------- lifetime */

static cg_status mkdir_p(const char *dir)
{
    char *p = cg_strdup(dir);
    cg_status st = CG_OK;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s) continue;
        char c = *s;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            cg_log(CG_LOG_ERROR, "cannot create directory %s: %s", p, strerror(errno));
            st = CG_E_IO;
            break;
        }
        *s = c;
        if (!c) break;
    }
    free(p);
    return st;
}

/* Workers the index remembers from an earlier run but that are not registered now: their
 * placements would only inflate the index (routing never considers them), and a worker that
 * comes back is synced at registration anyway. The rows of shared remote tiers stay: what they
 * record is in Redis, not in a worker, and workers that report the tier use it again. */
static void forget_old_workers(cg_gateway *g)
{
    cg_index_worker *ws = NULL;
    size_t n = 0;
    if (cg_index_workers_list(g->index, &ws, &n) != CG_OK) return;
    json_t *live = cg_workers_list_json(g->workers);
    for (size_t i = 0; i < n; i++) {
        int registered = 0;
        size_t k;
        json_t *w;
        json_array_foreach(json_object_get(live, "data"), k, w)
        {
            registered |= json_integer_value(json_object_get(w, "id")) == ws[i].id;
        }
        if (registered ||
            !strncmp(ws[i].url, CG_INDEX_TIER_ROW_PREFIX, strlen(CG_INDEX_TIER_ROW_PREFIX)))
            continue;
        cg_log(CG_LOG_INFO, "forgetting worker %s from an earlier run (not in --worker)",
               ws[i].url);
        if (cg_index_worker_delete(g->index, ws[i].id) != CG_OK)
            cg_log(CG_LOG_WARN, "could not forget worker %s", ws[i].url);
    }
    json_decref(live);
    cg_index_workers_free(&ws, n);
}

/* The reader of the workers' chunk events (--events), when configured. */
static cg_status open_events(cg_gateway *g)
{
    const cg_gateway_config *cfg = g->cfg;
    if (!cfg->events || !cfg->events[0]) return CG_OK;
    char err[512], *password = NULL;
    cg_status st = CG_OK;
    if (cfg->events_password_file &&
        (st = cg_remote_load_password(cfg->events_password_file, &password, err, sizeof err)) !=
            CG_OK) {
        cg_log(CG_LOG_ERROR, "--events-password-file: %s", err);
        return st;
    }
    cg_eventsync_params p = cg_eventsync_default_params();
    p.url = cfg->events;
    p.password = password;
    p.stream = cfg->events_stream;
    p.index = g->index;
    p.workers = g->workers;
    p.metrics = g->metrics;
    st = cg_eventsync_open(&p, &g->events, err, sizeof err);
    cg_remote_free_password(password);
    if (st != CG_OK) cg_log(CG_LOG_ERROR, "--events %s: %s", cfg->events, err);
    return st;
}

cg_status cg_gateway_open(const cg_gateway_config *cfg, cg_gateway **out)
{
    *out = NULL;
    cg_status st;
    cg_gateway *g = cg_calloc(1, sizeof *g);
    g->cfg = cfg;
    pthread_mutex_init(&g->ready_mu, NULL);
    g->default_mode = (cg_mode)cfg->chunk_mode;
    g->metrics = cg_metrics_new();
    metrics_setup(g);
    g->recent = cg_recent_ring_new();

    cg_key_hash kh = (cg_key_hash)cfg->key_hash;
    cg_key_set_hash(kh);
    if (cfg->api_keys.n) {
        g->tenants = cg_calloc(cfg->api_keys.n, sizeof *g->tenants);
        for (size_t i = 0; i < cfg->api_keys.n; i++)
            cg_key_tenant_id(cfg->api_keys.v[i], strlen(cfg->api_keys.v[i]), g->tenants[i]);
    }

    if ((st = mkdir_p(cfg->data_dir)) != CG_OK) goto fail;
    /* Say what is wrong with the directory instead of SQLite's "unable to open database". */
    if (access(cfg->data_dir, R_OK | W_OK | X_OK) != 0) {
        cg_log(CG_LOG_ERROR, "data dir %s is not readable and writable by this process: %s",
               cfg->data_dir, strerror(errno));
        st = CG_E_IO;
        goto fail;
    }
    size_t n = strlen(cfg->data_dir) + 16;
    g->index_path = cg_malloc(n);
    snprintf(g->index_path, n, "%s/index.db", cfg->data_dir);
    cg_index_params ip = cg_index_default_params();
    ip.busy_timeout_ms = (int)cfg->index_busy_timeout_ms;
    if ((st = cg_index_open(g->index_path, ip, &g->index)) != CG_OK) {
        cg_log(CG_LOG_ERROR, "cannot open the chunk index %s", g->index_path);
        goto fail;
    }
    cg_upstream_params op = cg_upstream_default_params();
    op.base_url = cfg->backend; /* NULL: every request names its upstream (a worker) */
    op.api_key = cfg->backend_api_key;
    op.worker_api_key = cfg->worker_api_key;
    op.connect_timeout_ms = (long)cfg->connect_timeout_ms;
    op.idle_timeout_ms = (long)cfg->backend_timeout_ms;
    /* A worker that comes back on a new address (a restarted container, a moved service
     * name) is found by the next probe after its name is looked up again: cache names for at
     * most one health interval (under 1 s: not at all). DESIGN §20. */
    op.dns_cache_s = (long)(cfg->health_interval_ms / 1000);
    if ((st = cg_upstream_open(&op, &g->client)) != CG_OK) goto fail;
    g->has_backend = cfg->backend != NULL;

    cg_workers_params wp = cg_workers_default_params();
    wp.client = g->client;
    wp.index = g->index;
    wp.metrics = g->metrics;
    wp.model = cfg->model;
    wp.health_interval_ms = (long)cfg->health_interval_ms;
    wp.health_timeout_ms = (long)cfg->health_timeout_ms;
    wp.sync_interval_ms = (long)cfg->sync_interval_ms;
    wp.load_penalty_tokens = cfg->load_penalty_tokens;
    wp.remote_hit_percent = (int)cfg->remote_hit_percent;
    g->backend_is_worker = -1;
    if (g->has_backend) {
        wp.tick = ask_backend;
        wp.tick_ud = g;
        /* asked once before serving, as the workers are: the first fallback may come at once */
        backend_kind_known(g,
                           cg_openai_backend_is_worker(g->client, (long)g->cfg->health_timeout_ms));
        g->backend_asked_ms = cg_now_ms();
    }
    if ((st = cg_workers_open(&wp, &g->workers)) != CG_OK) goto fail;
    /* Before the workers' inventories are read: no event after them may be missed. */
    if ((st = open_events(g)) != CG_OK) goto fail;
    for (size_t i = 0; i < cfg->workers.n; i++) {
        char err[512];
        int created;
        if ((st = cg_workers_add(g->workers, cfg->workers.v[i], 0, &created, NULL, err,
                                 sizeof err)) != CG_OK) {
            cg_log(CG_LOG_ERROR, "--worker %s: %s", cfg->workers.v[i], err);
            goto fail;
        }
    }
    forget_old_workers(g);
    if ((st = cg_workers_health_start(g->workers)) != CG_OK) goto fail;
    if (g->events && (st = cg_eventsync_start(g->events)) != CG_OK) goto fail;
    if (!cfg->backend && !cfg->workers.n)
        cg_log(CG_LOG_WARN, "no --backend and no --worker configured: inference routes answer "
                            "503 until a worker is added (POST /v1/workers)");

    cg_http_params hp = cg_http_default_params();
    hp.listen = cfg->listen;
    hp.io_threads = (unsigned)cfg->io_threads;
    hp.job_threads = (unsigned)cfg->job_threads;
    hp.max_body_bytes = cfg->max_body_bytes;
    hp.max_header_bytes = cfg->max_header_bytes;
    hp.max_json_values = (size_t)cfg->max_json_values;
    hp.max_json_depth = (unsigned)cfg->max_json_depth;
    hp.max_connections = (unsigned)cfg->max_connections;
    hp.conn_timeout_s = (unsigned)cfg->conn_timeout_s;
    hp.heartbeat_ms = (unsigned)cfg->heartbeat_ms;
    hp.sndbuf_bytes = cfg->sndbuf;
    hp.admin_token = cfg->admin_token;
    hp.api_keys = cfg->api_keys.n ? (const char *const *)cfg->api_keys.v : NULL;
    if (cfg->api_keys.n && !cfg->admin_token)
        cg_log(CG_LOG_WARN, "API keys are configured and no --admin-token: the admin routes "
                            "are closed");
    hp.routes = routes;
    hp.n_routes = CG_ARRAY_LEN(routes);
    hp.fast = fast_handlers;
    hp.app = g;
    hp.done = on_done;
    if ((st = cg_http_open(&hp, &g->http)) != CG_OK) goto fail;
    *out = g;
    return CG_OK;
fail:
    cg_gateway_close(&g);
    return st;
}

uint16_t cg_gateway_port(const cg_gateway *g)
{
    return cg_http_port(g->http);
}

void cg_gateway_close(cg_gateway **gp)
{
    cg_gateway *g = *gp;
    if (!g) return;
    *gp = NULL;
    if (g->http) cg_http_quiesce(g->http);
    /* The health thread blocks on the upstream client: stop it before the client. */
    cg_workers_health_stop(g->workers);
    if (g->client) {
        size_t left = cg_upstream_drain(g->client, (uint64_t)g->cfg->drain_ms);
        if (left) cg_log(CG_LOG_WARN, "stopping with %zu upstream transfers still running", left);
        /* Ends what is left (their clients get an error reply or an error event) and makes
         * later submits fail fast, so the HTTP server can then stop with nothing suspended. */
        cg_upstream_shutdown(g->client);
    }
    cg_http_close(&g->http);
    cg_eventsync_close(&g->events); /* it asks the registry for resyncs */
    cg_workers_close(&g->workers);
    cg_upstream_close(&g->client);
    if (g->index) {
        if (cg_index_flush(g->index) != CG_OK) cg_log(CG_LOG_WARN, "index flush reported errors");
        cg_index_close(&g->index);
    }
    cg_metrics_free(&g->metrics);
    cg_recent_ring_free(&g->recent);
    pthread_mutex_destroy(&g->ready_mu);
    free(g->index_path);
    free(g->tenants);
    free(g);
}
