/* The gateway's configuration table and its checks (server/gwconfig.h). */
#include "server/gwconfig.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "base/base.h"
#include "cache/key.h"
#include "cache/split.h"

#define OPT(...) CG_OPT(cg_gateway_config, __VA_ARGS__)
#define OPT_ENUM(...) CG_OPT_ENUM(cg_gateway_config, __VA_ARGS__)

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
    OPT("worker-api-key", "CHUNKGATE_WORKER_API_KEY", CG_CFG_STR, worker_api_key, NULL, 0, 0,
        "bearer token sent on every call to a worker (the workers' --api-key); unset = none"),
    OPT("worker-api-key-file", "CHUNKGATE_WORKER_API_KEY_FILE", CG_CFG_STR, worker_api_key_file,
        NULL, 0, 0, "file holding --worker-api-key (its first line that is not blank or #)"),
    OPT("data-dir", "CHUNKGATE_DATA_DIR", CG_CFG_STR, data_dir, "./data", 0, 0,
        "directory for the chunk index (DIR/index.db); created if missing"),
    OPT("admin-token", "CHUNKGATE_ADMIN_TOKEN", CG_CFG_STR, admin_token, NULL, 0, 0,
        "bearer token required by the admin routes (/v1/chunks...); unset = open"),
    OPT("separator", "CHUNKGATE_SEPARATOR", CG_CFG_STR, separator, CG_SPLIT_DEFAULT_SEPARATOR, 0, 0,
        "prompt segment separator (literal); per request: chunk_separator"),
    OPT_ENUM("chunk-mode", "CHUNKGATE_CHUNK_MODE", chunk_mode, "strict", cg_mode_names,
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
        "SSE keep-alive comment interval on idle streams (detects gone clients); requests "
        "still waiting for their answer are checked at this interval, or every second when it "
        "is longer"),
    OPT("drain-ms", "CHUNKGATE_DRAIN_MS", CG_CFG_INT, drain_ms, "10000", 0, 600000,
        "on SIGTERM/SIGINT, how long in-flight answers may finish before being cut"),
    OPT_ENUM("log-level", "CHUNKGATE_LOG_LEVEL", log_level, "info", cg_log_level_names,
             "debug, info, warn or error"),
    OPT("worker-timeout-ms", "CHUNKGATE_WORKER_TIMEOUT_MS", CG_CFG_INT, worker_timeout_ms, "60000",
        50, 86400000,
        "longest wait for a worker's assemble answer; then the request falls back to the plain "
        "prompt"),
    OPT("health-interval-ms", "CHUNKGATE_HEALTH_INTERVAL_MS", CG_CFG_INT, health_interval_ms,
        "2000", 20, 3600000,
        "GET /healthz period per worker (a worker that is down: from 100 ms, doubling up to 500 "
        "ms or this, the shorter); also how long an upstream host name is cached before it is "
        "looked up again (whole seconds; under 1 s: not cached)"),
    OPT("health-timeout-ms", "CHUNKGATE_HEALTH_TIMEOUT_MS", CG_CFG_INT, health_timeout_ms, "1000",
        10, 600000,
        "limit of one health probe; a healthy worker that misses two in a row (or fails one "
        "otherwise) is taken out of routing"),
    OPT("sync-interval-ms", "CHUNKGATE_SYNC_INTERVAL_MS", CG_CFG_INT, sync_interval_ms, "60000", 0,
        86400000,
        "full inventory resync period per healthy worker (0 = only when a worker (re)appears or "
        "reports a miss where the index expected a hit)"),
    OPT("load-penalty-tokens", "CHUNKGATE_LOAD_PENALTY_TOKENS", CG_CFG_INT, load_penalty_tokens,
        "256", 0, 1LL << 40,
        "routing: each unit of a worker's load (the requests in flight on it from this gateway, "
        "plus the running + queued sequences it reported in /healthz beyond this gateway's own) "
        "costs this many cached tokens of its score"),
    OPT("remote-hit-percent", "CHUNKGATE_REMOTE_HIT_PERCENT", CG_CFG_INT, remote_hit_percent, "50",
        1, 99,
        "routing: a chunk token a worker can read from its shared remote tier (workers reporting "
        "the same remote_tier in /v1/info) scores this percent of a token it holds itself"),
    OPT("events", "CHUNKGATE_EVENTS", CG_CFG_STR, events, NULL, 0, 0,
        "the workers' chunk events (their --events): redis://HOST:PORT[/DB] or "
        "redis+cluster://HOST:PORT. The index follows every worker's evictions, spills and "
        "stores as they happen, and replicas reading the same stream keep the same view; unset "
        "= placements are learned from assemble answers and inventory syncs only"),
    OPT("events-stream", "CHUNKGATE_EVENTS_STREAM", CG_CFG_STR, events_stream, "chunkgate:events",
        0, 0, "Redis Stream key of the chunk events (the workers' --events-stream)"),
    OPT("events-password-file", "CHUNKGATE_EVENTS_PASSWORD_FILE", CG_CFG_STR, events_password_file,
        NULL, 0, 0,
        "file holding the Redis password of --events (one trailing newline is dropped); unset = "
        "no AUTH"),
    OPT("api-key", "CHUNKGATE_API_KEYS", CG_CFG_LIST, api_keys, NULL, 0, 0,
        "API key the inference routes accept as a bearer token; repeatable (env: "
        "comma-separated). Unset (and no --api-key-file) = inference routes open"),
    OPT("api-key-file", "CHUNKGATE_API_KEY_FILE", CG_CFG_STR, api_key_file, NULL, 0, 0,
        "file of API keys, one per line (blank lines and lines starting with # are skipped)"),
    OPT("max-header-bytes", "CHUNKGATE_MAX_HEADER_BYTES", CG_CFG_SIZE, max_header_bytes, "16K",
        1024, 1LL << 20, "largest sum of request header names and values; larger -> 431"),
    OPT("max-segment-bytes", "CHUNKGATE_MAX_SEGMENT_BYTES", CG_CFG_SIZE, max_segment_bytes, "1M", 0,
        1LL << 30, "largest prompt segment after trimming (0 = no limit); larger -> 400"),
    OPT("max-connections", "CHUNKGATE_MAX_CONNECTIONS", CG_CFG_INT, max_connections, "4096", 1,
        1000000, "open client connections; one more is closed at accept without a reply"),
    OPT("conn-timeout-s", "CHUNKGATE_CONN_TIMEOUT_S", CG_CFG_INT, conn_timeout_s, "60", 1, 86400,
        "a client connection idle this long, or not done sending its request (headers and "
        "body) this long after it began, is closed; answers and streams are not limited"),
    OPT("sndbuf", "CHUNKGATE_SNDBUF", CG_CFG_SIZE, sndbuf, "256K", 0, 1LL << 29,
        "kernel send buffer of each client connection (SO_SNDBUF; Linux grants twice this, at "
        "most twice net.core.wmem_max): bounds what a client that reads slowly or not at all "
        "holds queued in the kernel, so its stream is held back after about this much rather than "
        "megabytes; 0 = the kernel's autotuning (up to net.ipv4.tcp_wmem's max)"),
    OPT_ENUM("key-hash", "CHUNKGATE_KEY_HASH", key_hash, "xxhash", cg_key_hash_names,
             "chunk key hash: xxhash (XXH3-128) or sha256 (first 16 bytes of SHA-256, resists "
             "crafted collisions); every worker must use the same"),
    OPT("index-busy-timeout-ms", "CHUNKGATE_INDEX_BUSY_TIMEOUT_MS", CG_CFG_INT,
        index_busy_timeout_ms, "5000", 0, 600000,
        "how long an index write waits for a lock held by another process (3 tries, then the "
        "batch is dropped and counted)"),
    OPT("recompute-default", "CHUNKGATE_RECOMPUTE_DEFAULTS", CG_CFG_LIST, recompute_defaults, NULL,
        0, 0,
        "MODEL=RATIO[:PREFIX_TOKENS]: the recompute_ratio (and recompute_prefix_tokens) a "
        "request for MODEL gets when it sends none; MODEL * = any other model; repeatable"),
    OPT("max-json-values", "CHUNKGATE_MAX_JSON_VALUES", CG_CFG_INT, max_json_values, "100000", 16,
        100000000,
        "most JSON values (array elements and object members) in a request body; more -> 400"),
    OPT("max-json-depth", "CHUNKGATE_MAX_JSON_DEPTH", CG_CFG_INT, max_json_depth, "64", 4, 2048,
        "deepest nesting of arrays and objects in a request body; deeper -> 400"),
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
        while (a < b && (*a == ' ' || *a == '\t'))
            a++;
        while (b > a && (b[-1] == '\n' || b[-1] == '\r' || b[-1] == ' ' || b[-1] == '\t'))
            b--;
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

/* One --recompute-default entry: "MODEL=RATIO[:PREFIX_TOKENS]" (split at the last '='). */
static int parse_recompute(const char *s, size_t *model_len, cg_gw_recompute *out)
{
    const char *eq = strrchr(s, '=');
    if (!eq || eq == s) return -1;
    char *end;
    errno = 0;
    double r = strtod(eq + 1, &end);
    if (end == eq + 1 || errno || !(r >= 0 && r <= 1)) return -1;
    long long k = -1;
    if (*end == ':') {
        const char *p = end + 1;
        errno = 0;
        k = strtoll(p, &end, 10);
        if (end == p || errno || k < 0 || k > INT32_MAX) return -1;
    }
    if (*end) return -1;
    *model_len = (size_t)(eq - s);
    *out = (cg_gw_recompute){r, k};
    return 0;
}

int cg_gateway_recompute_default(const cg_gateway_config *cfg, const char *model,
                                 cg_gw_recompute *out)
{
    int found = 0;
    for (size_t i = 0; i < cfg->recompute_defaults.n; i++) {
        const char *e = cfg->recompute_defaults.v[i];
        size_t n;
        cg_gw_recompute d;
        if (parse_recompute(e, &n, &d) != 0) continue; /* refused at load */
        if (model && strlen(model) == n && !strncmp(e, model, n)) {
            *out = d;
            return 1;
        }
        if (!found && n == 1 && e[0] == '*') {
            *out = d;
            found = 1;
        }
    }
    return found;
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
    char **optional[] = {
        &cfg->backend,      &cfg->backend_api_key, &cfg->admin_token,        &cfg->model,
        &cfg->api_key_file, &cfg->worker_api_key,  &cfg->worker_api_key_file};
    for (size_t i = 0; i < CG_ARRAY_LEN(optional); i++)
        if (*optional[i] && !**optional[i]) cg_free(optional[i]);
    if (!valid_listen(cfg->listen)) {
        snprintf(err, errlen, "--listen: '%s' is not HOST:PORT", cfg->listen);
        return CG_E_VALUE;
    }
    if (!*cfg->separator) {
        snprintf(err, errlen, "--separator: must not be empty");
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
    if (cfg->api_key_file && *cfg->api_key_file &&
        read_key_file(cfg->api_key_file, &cfg->api_keys, err, errlen) != CG_OK)
        return CG_E_VALUE;
    if (cfg->worker_api_key_file) {
        if (cfg->worker_api_key) {
            snprintf(err, errlen, "--worker-api-key and --worker-api-key-file: give one");
            return CG_E_VALUE;
        }
        if (cg_config_read_key("--worker-api-key-file", cfg->worker_api_key_file,
                               &cfg->worker_api_key, err, errlen) != CG_OK)
            return CG_E_VALUE;
    }
    if (cfg->worker_api_key && !cg_config_key_valid(cfg->worker_api_key)) {
        snprintf(err, errlen, "--worker-api-key: contains whitespace or control bytes");
        return CG_E_VALUE;
    }
    for (size_t i = 0; i < cfg->recompute_defaults.n; i++) {
        size_t n;
        cg_gw_recompute d;
        if (parse_recompute(cfg->recompute_defaults.v[i], &n, &d) != 0) {
            snprintf(err, errlen,
                     "--recompute-default: '%.200s' is not MODEL=RATIO[:PREFIX_TOKENS] with a "
                     "ratio in [0, 1]",
                     cfg->recompute_defaults.v[i]);
            return CG_E_VALUE;
        }
    }
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
