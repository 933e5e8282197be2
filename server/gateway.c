/* The gateway's configuration table, lifetime, route table, and operations routes
 * (/healthz, /readyz, /metrics). */
#include "server/gateway_impl.h"
#include "server/statuspage.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OPT(name, env, type, field, def, min, max, help)                                           \
    {                                                                                              \
        name, env, type, offsetof(cg_gateway_config, field), def, min, max, help                   \
    }

const cg_cfg_opt cg_gateway_options[] = {
    OPT("listen", "CHUNKGATE_LISTEN", CG_CFG_STR, listen, "127.0.0.1:8080", 0, 0,
        "address to listen on, HOST:PORT (port 0 picks a free port; the log says which)"),
    OPT("backend", "CHUNKGATE_BACKEND", CG_CFG_STR, backend, NULL, 0, 0,
        "base URL of the OpenAI-compatible inference backend, e.g. http://127.0.0.1:8000"),
    OPT("backend-api-key", "CHUNKGATE_BACKEND_API_KEY", CG_CFG_STR, backend_api_key, NULL, 0, 0,
        "bearer token sent to the backend"),
    OPT("worker", "CHUNKGATE_WORKERS", CG_CFG_LIST, workers, NULL, 0, 0,
        "KV worker base URL; repeatable (env: comma-separated). Without --backend the chosen "
        "worker also answers the completion"),
    OPT("data-dir", "CHUNKGATE_DATA_DIR", CG_CFG_STR, data_dir, "./data", 0, 0,
        "directory for the chunk index (DIR/index.db); created if missing"),
    OPT("admin-token", "CHUNKGATE_ADMIN_TOKEN", CG_CFG_STR, admin_token, NULL, 0, 0,
        "bearer token required by the admin routes (/v1/chunks...); unset = open"),
    OPT("separator", "CHUNKGATE_SEPARATOR", CG_CFG_STR, separator, CG_SPLIT_DEFAULT_SEPARATOR, 0, 0,
        "prompt segment separator (literal); per request: chunk_separator"),
    OPT("chunk-mode", "CHUNKGATE_CHUNK_MODE", CG_CFG_STR, chunk_mode, "strict", 0, 0,
        "isolation mode for keys, strict or sys; per request: chunk_mode"),
    OPT("max-body-bytes", "CHUNKGATE_MAX_BODY_BYTES", CG_CFG_SIZE, max_body_bytes, "8M", 1024,
        1LL << 30, "largest request body; larger -> 413"),
    OPT("max-segments", "CHUNKGATE_MAX_SEGMENTS", CG_CFG_INT, max_segments, "256", 2, 65536,
        "most non-empty prompt segments; more -> 400"),
    OPT("max-upstream-bytes", "CHUNKGATE_MAX_UPSTREAM_BYTES", CG_CFG_SIZE, max_upstream_bytes,
        "64M", 1024, 4LL << 30, "largest non-streamed backend answer; larger -> 502"),
    OPT("model", "CHUNKGATE_MODEL", CG_CFG_STR, model, NULL, 0, 0,
        "model id /v1/models lists when the backend's list cannot be fetched; when set, every "
        "worker must serve it"),
    OPT("backend-timeout-ms", "CHUNKGATE_BACKEND_TIMEOUT_MS", CG_CFG_INT, backend_timeout_ms,
        "300000", 100, 86400000,
        "longest silence from the backend (before the first byte or between bytes) -> 504"),
    OPT("connect-timeout-ms", "CHUNKGATE_CONNECT_TIMEOUT_MS", CG_CFG_INT, connect_timeout_ms,
        "3000", 10, 600000, "TCP/TLS connect timeout towards the backend -> 504"),
    OPT("io-threads", "CHUNKGATE_IO_THREADS", CG_CFG_INT, io_threads, "2", 1, 64,
        "HTTP epoll threads (they only move bytes)"),
    OPT("job-threads", "CHUNKGATE_JOB_THREADS", CG_CFG_INT, job_threads, "8", 1, 256,
        "threads that parse, split and key requests and serve admin routes"),
    OPT("heartbeat-ms", "CHUNKGATE_HEARTBEAT_MS", CG_CFG_INT, heartbeat_ms, "5000", 50, 600000,
        "SSE keep-alive comment interval on idle streams (detects gone clients)"),
    OPT("drain-ms", "CHUNKGATE_DRAIN_MS", CG_CFG_INT, drain_ms, "10000", 0, 600000,
        "on SIGTERM/SIGINT, how long in-flight answers may finish before being cut"),
    OPT("log-level", "CHUNKGATE_LOG_LEVEL", CG_CFG_STR, log_level, "info", 0, 0,
        "debug, info, warn or error"),
    OPT("worker-timeout-ms", "CHUNKGATE_WORKER_TIMEOUT_MS", CG_CFG_INT, worker_timeout_ms,
        "60000", 50, 86400000,
        "longest wait for a worker's assemble answer; then the request falls back to the plain "
        "prompt"),
    OPT("health-interval-ms", "CHUNKGATE_HEALTH_INTERVAL_MS", CG_CFG_INT, health_interval_ms,
        "2000", 20, 3600000, "GET /healthz period per worker"),
    OPT("health-timeout-ms", "CHUNKGATE_HEALTH_TIMEOUT_MS", CG_CFG_INT, health_timeout_ms, "1000",
        10, 600000, "limit of one health probe; a worker that misses it is taken out of routing"),
    OPT("sync-interval-ms", "CHUNKGATE_SYNC_INTERVAL_MS", CG_CFG_INT, sync_interval_ms, "60000",
        0, 86400000,
        "full inventory resync period per healthy worker (0 = only when a worker (re)appears or "
        "reports a miss where the index expected a hit)"),
    OPT("load-penalty-tokens", "CHUNKGATE_LOAD_PENALTY_TOKENS", CG_CFG_INT, load_penalty_tokens,
        "256", 0, 1LL << 40,
        "routing: each request in flight on a worker costs this many cached tokens of its score"),
    OPT("api-key", "CHUNKGATE_API_KEYS", CG_CFG_LIST, api_keys, NULL, 0, 0,
        "API key the inference routes accept as a bearer token; repeatable (env: "
        "comma-separated). Unset (and no --api-key-file) = inference routes open"),
    OPT("api-key-file", "CHUNKGATE_API_KEY_FILE", CG_CFG_STR, api_key_file, NULL, 0, 0,
        "file of API keys, one per line (blank lines and lines starting with # are skipped)"),
    OPT("max-header-bytes", "CHUNKGATE_MAX_HEADER_BYTES", CG_CFG_SIZE, max_header_bytes, "16K",
        1024, 1LL << 20, "largest sum of request header names and values; larger -> 431"),
    OPT("max-segment-bytes", "CHUNKGATE_MAX_SEGMENT_BYTES", CG_CFG_SIZE, max_segment_bytes, "1M",
        0, 1LL << 30, "largest prompt segment after trimming (0 = no limit); larger -> 400"),
    OPT("max-connections", "CHUNKGATE_MAX_CONNECTIONS", CG_CFG_INT, max_connections, "4096", 1,
        1000000, "open client connections; one more is closed at accept without a reply"),
    OPT("conn-timeout-s", "CHUNKGATE_CONN_TIMEOUT_S", CG_CFG_INT, conn_timeout_s, "60", 1, 86400,
        "a client connection idle this long, or not done sending its request (headers and "
        "body) this long after it began, is closed; answers and streams are not limited"),
    OPT("key-hash", "CHUNKGATE_KEY_HASH", CG_CFG_STR, key_hash, "xxhash", 0, 0,
        "chunk key hash: xxhash (XXH3-128) or sha256 (first 16 bytes of SHA-256, resists "
        "crafted collisions); every worker must use the same"),
    OPT("index-busy-timeout-ms", "CHUNKGATE_INDEX_BUSY_TIMEOUT_MS", CG_CFG_INT,
        index_busy_timeout_ms, "5000", 0, 600000,
        "how long an index write waits for a lock held by another process (3 tries, then the "
        "batch is dropped and counted)"),
};
const size_t cg_gateway_n_options = CG_ARRAY_LEN(cg_gateway_options);

/* ---------------------------------------------------------------- configuration */

/* A key is sent as "Authorization: Bearer <key>": printable ASCII without spaces. */
static int valid_key(const char *k)
{
    if (!*k) return 0;
    for (; *k; k++)
        if ((unsigned char)*k <= 0x20 || (unsigned char)*k >= 0x7f) return 0;
    return 1;
}

/* Appends the keys of path (one per line; surrounding whitespace and CR trimmed; blank lines
 * and "#" comments skipped) to keys. */
static cg_status read_key_file(const char *path, cg_strlist *keys, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--api-key-file: cannot read %s: %s", path, strerror(errno));
        return CG_E_VALUE;
    }
    char line[4096];
    size_t n = 0, lineno = 0;
    cg_status st = CG_OK;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            snprintf(err, errlen, "--api-key-file: %s line %zu is longer than %zu bytes", path,
                     lineno, sizeof line - 2);
            st = CG_E_VALUE;
            break;
        }
        char *a = line, *b = line + len;
        while (a < b && (*a == ' ' || *a == '\t')) a++;
        while (b > a && (b[-1] == '\n' || b[-1] == '\r' || b[-1] == ' ' || b[-1] == '\t')) b--;
        if (a == b || *a == '#') continue;
        keys->v = cg_realloc(keys->v, (keys->n + 2) * sizeof *keys->v);
        keys->v[keys->n++] = cg_strndup(a, (size_t)(b - a));
        keys->v[keys->n] = NULL;
        n++;
    }
    fclose(f);
    if (st == CG_OK && !n) {
        snprintf(err, errlen, "--api-key-file: %s holds no key", path);
        st = CG_E_VALUE;
    }
    explicit_bzero(line, sizeof line);
    return st;
}

static int valid_listen(const char *s)
{
    const char *colon = strrchr(s, ':');
    if (!colon || !colon[1]) return 0;
    char *end;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    return !*end && !errno && port >= 0 && port <= 65535;
}

cg_status cg_gateway_config_load(cg_gateway_config *cfg, int argc, char **argv, int *want_help,
                                 char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    cg_status st = cg_config_parse(cg_gateway_options, cg_gateway_n_options, cfg, argc, argv,
                                   want_help, err, errlen);
    if (st != CG_OK || *want_help) return st;
    /* An empty environment variable means unset for the optional strings. */
    char **optional[] = {&cfg->backend, &cfg->backend_api_key, &cfg->admin_token, &cfg->model,
                         &cfg->api_key_file};
    for (size_t i = 0; i < CG_ARRAY_LEN(optional); i++)
        if (*optional[i] && !**optional[i]) cg_free(optional[i]);
    cg_mode mode;
    if (!valid_listen(cfg->listen)) {
        snprintf(err, errlen, "--listen: '%s' is not HOST:PORT", cfg->listen);
        return CG_E_VALUE;
    }
    if (!*cfg->separator) {
        snprintf(err, errlen, "--separator: must not be empty");
        return CG_E_VALUE;
    }
    if (cg_mode_parse(cfg->chunk_mode, &mode) != 0) {
        snprintf(err, errlen, "--chunk-mode: '%s' is not strict or sys", cfg->chunk_mode);
        return CG_E_VALUE;
    }
    const char *levels[] = {"debug", "info", "warn", "error"};
    int ok = 0;
    for (size_t i = 0; i < CG_ARRAY_LEN(levels); i++)
        ok |= !strcmp(cfg->log_level, levels[i]);
    if (!ok) {
        snprintf(err, errlen, "--log-level: '%s' is not debug, info, warn or error",
                 cfg->log_level);
        return CG_E_VALUE;
    }
    if (cfg->backend && strncmp(cfg->backend, "http://", 7) &&
        strncmp(cfg->backend, "https://", 8)) {
        snprintf(err, errlen, "--backend: '%s' is not an http:// or https:// URL", cfg->backend);
        return CG_E_VALUE;
    }
    if (!*cfg->data_dir) {
        snprintf(err, errlen, "--data-dir: must not be empty");
        return CG_E_VALUE;
    }
    cg_key_hash kh;
    if (cg_key_hash_parse(cfg->key_hash, &kh) != 0) {
        snprintf(err, errlen, "--key-hash: '%s' is not xxhash or sha256", cfg->key_hash);
        return CG_E_VALUE;
    }
    if (cfg->api_key_file && *cfg->api_key_file &&
        read_key_file(cfg->api_key_file, &cfg->api_keys, err, errlen) != CG_OK)
        return CG_E_VALUE;
    for (size_t i = 0; i < cfg->api_keys.n; i++)
        if (!valid_key(cfg->api_keys.v[i])) {
            /* Never echo a key: the message names its position only. */
            snprintf(err, errlen,
                     "--api-key: key %zu is empty or contains whitespace or control bytes", i + 1);
            return CG_E_VALUE;
        }
    return CG_OK;
}

void cg_gateway_config_free(cg_gateway_config *cfg)
{
    cg_config_free(cg_gateway_options, cg_gateway_n_options, cfg);
}

/* ---------------------------------------------------------------- operations routes */

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
    cg_buf_init(&out, 0);
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
    size_t in_flight = cg_openai_in_flight(g->client);
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
        "chunkgate_http_headers_too_large_total %llu\n",
        hs.connections, (unsigned long long)hs.refused, (unsigned long long)hs.timed_out,
        (unsigned long long)hs.headers_too_large);
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

void cg_gw_backend_error(cg_gateway *g, const char *kind)
{
    char labels[64];
    snprintf(labels, sizeof labels, "kind=\"%s\"", kind);
    cg_metrics_inc(g->metrics, "chunkgate_backend_errors_total",
                   "Backend failures: connect, timeout, status, invalid, too_large, stream.",
                   labels, 1);
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
    const char *fb = "Requests with cacheable segments served without KV reuse, by reason: "
                     "no_worker (none registered or healthy), worker_error (assemble failed), "
                     "model (the request names another model than the workers serve).";
    g->m_fallback_no_worker = cg_metrics_counter(m, "chunkgate_fallback_reasons_total", fb,
                                                 "reason=\"no_worker\"");
    g->m_fallback_worker_error = cg_metrics_counter(m, "chunkgate_fallback_reasons_total", fb,
                                                    "reason=\"worker_error\"");
    g->m_fallback_model =
        cg_metrics_counter(m, "chunkgate_fallback_reasons_total", fb, "reason=\"model\"");
    g->m_releases = cg_metrics_counter(
        m, "chunkgate_assembly_releases_total",
        "Assemblies released on their worker because no completion consumed them (client left, "
        "backend failed).",
        NULL);
    g->m_assemble = cg_metrics_histogram(m, "chunkgate_assemble_seconds",
                                         "Time from routing to the worker's assemble answer.",
                                         NULL, cg_metrics_latency_buckets, cg_metrics_latency_n);
    g->m_disconnects =
        cg_metrics_counter(m, "chunkgate_client_disconnects_total",
                           "Streams whose client left early (upstream cancelled).", NULL);
    const char *kinds[] = {"connect", "timeout", "status", "invalid", "too_large", "stream"};
    for (size_t i = 0; i < CG_ARRAY_LEN(kinds); i++) {
        char labels[64];
        snprintf(labels, sizeof labels, "kind=\"%s\"", kinds[i]);
        cg_metrics_counter(
            m, "chunkgate_backend_errors_total",
            "Backend failures: connect, timeout, status, invalid, too_large, stream.", labels);
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
 * comes back is synced at registration anyway. */
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
        if (registered) continue;
        cg_log(CG_LOG_INFO, "forgetting worker %s from an earlier run (not in --worker)",
               ws[i].url);
        if (cg_index_worker_delete(g->index, ws[i].id) != CG_OK)
            cg_log(CG_LOG_WARN, "could not forget worker %s", ws[i].url);
    }
    json_decref(live);
    cg_index_workers_free(&ws, n);
}

cg_status cg_gateway_open(const cg_gateway_config *cfg, cg_gateway **out)
{
    *out = NULL;
    cg_status st;
    cg_gateway *g = cg_calloc(1, sizeof *g);
    g->cfg = cfg;
    pthread_mutex_init(&g->ready_mu, NULL);
    if (cg_mode_parse(cfg->chunk_mode, &g->default_mode) != 0) g->default_mode = CG_MODE_STRICT;
    g->metrics = cg_metrics_new();
    metrics_setup(g);
    g->recent = cg_status_ring_new();

    cg_key_hash kh = CG_KEY_HASH_XXH3;
    if (cg_key_hash_parse(cfg->key_hash, &kh) != 0) kh = CG_KEY_HASH_XXH3; /* validated at load */
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
    cg_openai_params op = cg_openai_default_params();
    op.base_url = cfg->backend; /* NULL: every request names its upstream (a worker) */
    op.api_key = cfg->backend_api_key;
    op.connect_timeout_ms = (long)cfg->connect_timeout_ms;
    op.idle_timeout_ms = (long)cfg->backend_timeout_ms;
    if ((st = cg_openai_open(&op, &g->client)) != CG_OK) goto fail;
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
    if ((st = cg_workers_open(&wp, &g->workers)) != CG_OK) goto fail;
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
    if (!cfg->backend && !cfg->workers.n)
        cg_log(CG_LOG_WARN, "no --backend and no --worker configured: inference routes answer "
                            "503 until a worker is added (POST /v1/workers)");

    cg_http_params hp = cg_http_default_params();
    hp.listen = cfg->listen;
    hp.io_threads = (unsigned)cfg->io_threads;
    hp.job_threads = (unsigned)cfg->job_threads;
    hp.max_body_bytes = cfg->max_body_bytes;
    hp.max_header_bytes = cfg->max_header_bytes;
    hp.max_connections = (unsigned)cfg->max_connections;
    hp.conn_timeout_s = (unsigned)cfg->conn_timeout_s;
    hp.heartbeat_ms = (unsigned)cfg->heartbeat_ms;
    hp.admin_token = cfg->admin_token;
    hp.api_keys = cfg->api_keys.n ? (const char *const *)cfg->api_keys.v : NULL;
    if (cfg->api_keys.n && !cfg->admin_token)
        cg_log(CG_LOG_WARN, "API keys are configured and no --admin-token: the admin routes "
                            "are closed");
    hp.routes = routes;
    hp.n_routes = CG_ARRAY_LEN(routes);
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
        size_t left = cg_openai_drain(g->client, (uint64_t)g->cfg->drain_ms);
        if (left) cg_log(CG_LOG_WARN, "stopping with %zu upstream transfers still running", left);
        /* Ends what is left (their clients get an error reply or an error event) and makes
         * later submits fail fast, so the HTTP server can then stop with nothing suspended. */
        cg_openai_shutdown(g->client);
    }
    cg_http_close(&g->http);
    cg_workers_close(&g->workers);
    cg_openai_close(&g->client);
    if (g->index) {
        if (cg_index_flush(g->index) != CG_OK) cg_log(CG_LOG_WARN, "index flush reported errors");
        cg_index_close(&g->index);
    }
    cg_metrics_free(&g->metrics);
    cg_status_ring_free(&g->recent);
    pthread_mutex_destroy(&g->ready_mu);
    free(g->index_path);
    free(g->tenants);
    free(g);
}
